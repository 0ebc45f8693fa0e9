"""Check that the lower ends of pyproject.toml's ranges work: fresh venvs, every declared
dependency at the lowest version its range allows, and the tests that exercise each extra.

Not part of .ci/run (CI's time is full): run it after changing a range or a dependency's use.

    python scripts/lowest.py             # every profile, no broker
    python scripts/lowest.py --broker    # also tests/integration/test_faust_app.py (Kafka)
    python scripts/lowest.py --keep      # keep the venvs that pass too

Each profile's venv is removed once its tests pass; a failed one stays for inspection (the
summary says where). The installed versions stay in ``<workdir>/<profile>-versions.txt``.

Three profiles, because one venv with every extra would raise aiokafka and aiohttp to the dev
extra's floors:

- ``faust``: ``.[faust,aiokafka]`` (aiokafka 0.11, faust-streaming 0.12, click 8.1, ...): the
  Faust unit tests and those of the aiokafka extra (consumer adapter, process host);
- ``runtime``: ``.[runtime]`` (aiokafka 0.14, rocksdict, aiohttp 3.9): every runtime unit test;
- ``full``: ``.[dev,runtime,spark]`` (pyspark, plotly, jinja2, and the dev extra's floors): the
  CLI, progress, report and runtime tests; ``--broker`` adds the Faust app on a real broker here
  (Faust needs aiokafka >= 0.13 on a Kafka 4 broker: docs/faust.md).

A dependency's floor is its ``>=`` (or ``==``, ``~=``) bound; where extras of one profile
declare it twice, the higher bound (pip could not install the lower one). Test tools outside
``dev`` (pytest, hypothesis, ...) are pinned at the dev extra's floors. Only the direct
dependencies are pinned: pip resolves the rest. A requirement without such a bound, or with a
marker or ``!=`` (whose floor this script would install regardless), is an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import IO, Any

# packaging: pytest's own dependency, so present wherever the test tools are.
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]

#: The operators of a floor clause, and of a cap: pyproject.toml keeps to ``name>=floor,<cap``.
_FLOOR_OPERATORS = frozenset({">=", "==", "~="})
_CAP_OPERATORS = frozenset({"<", "<="})


# dataclasses, not attrs: beside the standard library this needs only packaging (pytest's).
@dataclasses.dataclass(frozen=True)
class Profile:
    """One venv: the ``extras`` installed, the dev extra's ``test_tools`` added at their
    floors (when ``dev`` is not among the extras), and the ``tests`` run there."""

    extras: tuple[str, ...]
    test_tools: tuple[str, ...]
    tests: tuple[str, ...]


#: Test paths are globs (relative to the repository), so a new test file of an area is run.
_RUNTIME_TESTS = ("tests/test_runtime_*.py", "tests/test_localstate*.py")
PROFILES = {
    "faust": Profile(
        extras=("faust", "aiokafka"),
        test_tools=("pytest", "hypothesis", "rocksdict"),  # the Faust tests open RocksDB
        tests=(
            "tests/test_faust_assignor.py",
            "tests/test_faust_damaged.py",
            "tests/test_faust_flowstop.py",
            "tests/test_faust_leader.py",
            "tests/test_faust_proven.py",
            "tests/test_faust_rejoin.py",
            "tests/test_faust_settables.py",
            "tests/test_faust_stallhold.py",
            "tests/test_faust_topology.py",
            "tests/test_faust_transport.py",
            "tests/test_faust_watch.py",
            # The aiokafka extra's own tests, at its floor (0.11):
            "tests/consumer",
            "tests/test_aiokafka_*.py",
            "tests/test_process_host*.py",
            "tests/test_leader_budget.py",
            "tests/test_rolling_topics.py",
            "tests/test_streams_null_topic.py",
            "tests/test_streams_shared_ids.py",
            "tests/test_describe*.py",
        ),
    ),
    "runtime": Profile(
        extras=("runtime",), test_tools=("pytest", "hypothesis"), tests=_RUNTIME_TESTS
    ),
    "full": Profile(
        extras=("dev", "runtime", "spark"),
        test_tools=(),
        tests=(
            "tests/test_cli.py",  # some of its tests need pyspark
            "tests/test_explain.py",
            "tests/pipeline/test_cli.py",
            "tests/pipeline/test_progress.py",
            "tests/pipeline/test_report.py",
            *_RUNTIME_TESTS,
        ),
    ),
}
_BROKER_TESTS = ("tests/integration/test_faust_app.py",)


def floors(requirements: list[str]) -> dict[str, str]:
    """Each requirement's lowest allowed version, by normalized name (the highest of the
    bounds when a name comes twice)."""
    lowest: dict[str, Version] = {}
    for text in requirements:
        floor = _floor(text)
        if floor is None:
            sys.exit(
                f"lowest.py: {text!r}: expected name[extras]>=floor,<cap "
                "(>=, == or ~= for the floor, < or <= for a cap; no markers, no !=)"
            )
        name, version = floor
        if name not in lowest or version > lowest[name]:
            lowest[name] = version
    return {name: str(version) for name, version in lowest.items()}


def _floor(text: str) -> tuple[str, Version] | None:
    """The normalized name and the one floor of requirement ``text``; None when it has a
    marker, no floor or two, a pre-release floor, or a clause of another kind."""
    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        return None
    clauses = list(requirement.specifier)
    if requirement.marker is not None or any(
        c.operator not in _FLOOR_OPERATORS | _CAP_OPERATORS or "*" in c.version for c in clauses
    ):
        return None
    bounds = [Version(c.version) for c in clauses if c.operator in _FLOOR_OPERATORS]
    if len(bounds) != 1 or bounds[0].is_prerelease:
        return None
    return canonicalize_name(requirement.name), bounds[0]


def profile_floors(meta: dict[str, Any], profile: Profile) -> dict[str, str]:
    """The pins of ``profile`` (``meta``: pyproject's ``[project]``)."""
    extras: dict[str, list[str]] = meta["optional-dependencies"]
    pins = floors(meta["dependencies"] + [r for extra in profile.extras for r in extras[extra]])
    dev = floors(extras["dev"])
    pins.update({tool: dev[tool] for tool in profile.test_tools})
    return pins


def test_paths(patterns: tuple[str, ...]) -> list[str]:
    """The files and directories ``patterns`` match, in order, relative to the repository."""
    return [str(path.relative_to(ROOT)) for p in patterns for path in sorted(ROOT.glob(p))]


def run(
    command: list[str], stdout: IO[str] | None = None, env: dict[str, str] | None = None
) -> int:
    print("+", " ".join(command), flush=True)
    return subprocess.call(command, cwd=ROOT, stdout=stdout, env=env)


def check_profile(profile_name: str, venv: Path, broker: bool) -> int:
    """Build the profile's venv at ``venv``, install at the floors, run its tests: 0 when
    everything passed."""
    profile = PROFILES[profile_name]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = profile_floors(project["project"], profile)
    target = f".[{','.join(profile.extras)}]"
    shutil.rmtree(venv, ignore_errors=True)
    if run([sys.executable, "-m", "venv", str(venv)]) != 0:
        return 1
    python = str(venv / "bin" / "python")
    # The pins beside the package: pip installs exactly these, the dev tools' floors included.
    pinned = [f"{package}=={version}" for package, version in pins.items()]
    install = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if run([*install, "-e", target, *pinned]) != 0:
        return 1
    with open(venv.with_name(f"{profile_name}-versions.txt"), "w") as versions:
        run([python, "-m", "pip", "list", "--format=freeze"], stdout=versions)
    tests = profile.tests + (_BROKER_TESTS if broker and profile_name == "full" else ())
    # Without CI: under it, tests fail where an extra's guard refuses the installed version (CI
    # must never skip them), and these venvs hold versions below some guards on purpose (the
    # faust profile's aiokafka 0.11 under the runtime's 0.14): here those tests skip.
    env = {name: value for name, value in os.environ.items() if name != "CI"}
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *test_paths(tests)]
    return run(pytest, env=env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=[*PROFILES, "all"], default="all")
    parser.add_argument("--broker", action="store_true", help="add the Faust app broker test")
    parser.add_argument("--keep", action="store_true", help="keep the venvs that pass too")
    # A fresh directory per run by default: two runs at once must not remove each other's venvs.
    parser.add_argument("--workdir", type=Path, help="default: a new /tmp/streamassign-lowest-*")
    args = parser.parse_args()
    workdir: Path = args.workdir or Path(tempfile.mkdtemp(prefix="streamassign-lowest-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"workdir: {workdir}", flush=True)
    profiles = list(PROFILES) if args.profile == "all" else [args.profile]
    failed = []
    for profile_name in profiles:
        started = time.monotonic()
        venv = workdir / profile_name
        passed = check_profile(profile_name, venv, args.broker) == 0
        if passed and not args.keep:
            shutil.rmtree(venv, ignore_errors=True)
        if not passed:
            failed.append(profile_name)
        verdict = "ok" if passed else f"FAILED (venv kept: {venv})"
        print(f"== {profile_name}: {verdict} in {time.monotonic() - started:.0f} s", flush=True)
    print(f"versions: {workdir}/<profile>-versions.txt")
    passed_count = len(profiles) - len(failed)
    print(
        f"lowest.py: {passed_count} of {len(profiles)} profiles passed; failed: "
        f"{', '.join(failed) or 'none'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
