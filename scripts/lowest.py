"""Check that the lower ends of pyproject.toml's ranges work: fresh venvs, every declared
dependency at the lowest version its range allows, and the tests that exercise each extra.

Not part of .ci/run (CI's time is full): run it after changing a range or a dependency's use.

    python scripts/lowest.py             # every profile, no broker
    python scripts/lowest.py --broker    # also tests/integration/test_faust_app.py (Kafka)

Three profiles, because one venv with every extra would raise aiokafka and aiohttp to the dev
extra's floors:

- ``faust``: ``.[faust,aiokafka]`` (aiokafka 0.11, faust-streaming 0.12, click 8.1, ...): the
  Faust and aiokafka unit tests;
- ``runtime``: ``.[runtime]`` (aiokafka 0.14, rocksdict, aiohttp 3.9): the runtime's store and
  query tests;
- ``full``: ``.[dev,runtime,spark]`` (pyspark, plotly, jinja2, and the dev extra's floors): the
  CLI, progress, report and runtime tests; ``--broker`` adds the Faust app on a real broker here
  (Faust needs aiokafka >= 0.13 on a Kafka 4 broker: docs/faust.md).

A dependency's floor is its ``>=`` bound; where extras of one profile declare it twice, the
higher bound (pip could not install the lower one). Test tools outside ``dev`` (pytest,
hypothesis, ...) are pinned at the dev extra's floors. Only the direct
dependencies are pinned: pip resolves the rest. Every requirement must have a ``>=`` bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]

#: ``name[extras]>=floor,<cap``: the form every requirement in pyproject.toml has.
_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(\[[^]]*\])?\s*(?P<spec>.*)$")
_FLOOR = re.compile(r">=\s*(?P<version>[0-9][0-9A-Za-z.]*)")


# dataclasses, not attrs: like scripts/kafka.py, this runs before anything is installed.
@dataclasses.dataclass(frozen=True)
class Profile:
    """One venv: the ``extras`` installed, the dev extra's ``test_tools`` added at their
    floors (when ``dev`` is not among the extras), and the ``tests`` run there."""

    extras: tuple[str, ...]
    test_tools: tuple[str, ...]
    tests: tuple[str, ...]


_RUNTIME_TESTS = (
    "tests/test_runtime_rocksdb_memory.py",
    "tests/test_runtime_damaged_store.py",
    "tests/test_runtime_restore.py",
    "tests/test_runtime_changelog.py",
    "tests/test_runtime_checkpoint_versions.py",
    "tests/test_runtime_cleanup.py",
    "tests/test_runtime_queries.py",
    "tests/test_localstate.py",
    "tests/test_localstate_unreadable.py",
    "tests/test_localstate_versions.py",
)
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
            "tests/test_aiokafka_adapter.py",
            "tests/test_aiokafka_metadata.py",
            "tests/test_describe.py",
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
    lowest: dict[str, str] = {}
    for requirement in requirements:
        parsed = _REQUIREMENT.match(requirement)
        bound = _FLOOR.search(parsed["spec"]) if parsed else None
        if parsed is None or bound is None:
            sys.exit(f"lowest.py: {requirement!r} has no >= bound: declare the floor it needs")
        name = _normalized(parsed["name"])
        version = bound["version"]
        if name not in lowest or _key(version) > _key(lowest[name]):
            lowest[name] = version
    return lowest


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def profile_floors(meta: dict[str, Any], profile: Profile) -> dict[str, str]:
    """The pins of ``profile`` (``meta``: pyproject's ``[project]``)."""
    extras: dict[str, list[str]] = meta["optional-dependencies"]
    pins = floors(meta["dependencies"] + [r for extra in profile.extras for r in extras[extra]])
    dev = floors(extras["dev"])
    pins.update({name: dev[name] for name in profile.test_tools})
    return pins


def run(command: list[str], stdout: IO[str] | None = None) -> int:
    print("+", " ".join(command), flush=True)
    return subprocess.call(command, cwd=ROOT, stdout=stdout)


def check_profile(name: str, workdir: Path, broker: bool) -> int:
    """Build the profile's venv afresh, install at the floors, run its tests: pytest's code."""
    profile = PROFILES[name]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = profile_floors(project["project"], profile)
    target = f".[{','.join(profile.extras)}]"
    venv = workdir / name
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    constraints = workdir / f"{name}-constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
    # Pinned explicitly too: a constraint alone does not install the dev tools' floors.
    pinned = [f"{name}=={version}" for name, version in pins.items()]
    install = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if run([*install, "-c", str(constraints), "-e", target, *pinned]) != 0:
        return 1
    with open(venv / "versions.txt", "w") as versions:
        run([python, "-m", "pip", "list", "--format=freeze"], stdout=versions)
    tests = profile.tests + (_BROKER_TESTS if broker and name == "full" else ())
    return run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=[*PROFILES, "all"], default="all")
    parser.add_argument("--broker", action="store_true", help="add the Faust app broker test")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/streamassign-lowest"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    profiles = list(PROFILES) if args.profile == "all" else [args.profile]
    failed = []
    for profile in profiles:
        started = time.monotonic()
        code = check_profile(profile, args.workdir, args.broker)
        verdict = "ok" if code == 0 else "FAILED"
        print(f"== {profile}: {verdict} in {time.monotonic() - started:.0f} s", flush=True)
        if code != 0:
            failed.append(profile)
    print(f"versions: {args.workdir}/<profile>/versions.txt")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
