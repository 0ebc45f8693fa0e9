"""Shared test configuration: hypothesis profiles (CI runs thousands of cases per property).

CI draws new examples on every commit, reproducibly: the seed is taken from the commit hash
(``HYPOTHESIS_SEED`` overrides it, in any profile), printed in the session header, and
hypothesis prints each failing example's reproduction blob. To rerun a CI failure locally:
``HYPOTHESIS_SEED=<seed from the header> HYPOTHESIS_PROFILE=ci pytest tests/...``.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# 500 examples per property in CI (tests scale theirs from it): at 800 a fresh clone's .ci/run
# took 47 minutes on an idle 2-core machine, past CI's 45-minute budget; each commit draws new
# examples (the seed follows the commit), so the search adds up. Long searches use "deep".
settings.register_profile(
    "ci",
    max_examples=500,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=200, deadline=None)
# A long random search for rare counterexamples: HYPOTHESIS_PROFILE=deep pytest tests/test_sticky.py
settings.register_profile(
    "deep",
    max_examples=50_000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Hunting with the fuzz tests (tests/fuzz: damaged bytes into decoders and leaders), each
# example still under the deadline those tests set: HYPOTHESIS_PROFILE=fuzz pytest tests/fuzz
settings.register_profile(
    "fuzz",
    max_examples=20_000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)


def _commit_seed() -> tuple[int, str]:
    """The seed of this run and where it came from: ``HYPOTHESIS_SEED``, else the checked-out
    commit (new examples per commit, the same ones on a rerun), else a random one."""
    given = os.environ.get("HYPOTHESIS_SEED")
    if given:
        return int(given), "HYPOTHESIS_SEED"
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        return int(head[:12], 16), f"commit {head[:12]}"
    except (OSError, ValueError, subprocess.SubprocessError):
        return secrets.randbits(48), "random (no git commit found)"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Seed hypothesis in CI (or when ``HYPOTHESIS_SEED`` is set) unless ``--hypothesis-seed``
    was given; runs before hypothesis' own plugin reads that option."""
    if config.getoption("hypothesis_seed", None) is not None:
        return
    if PROFILE == "ci" or os.environ.get("HYPOTHESIS_SEED"):
        seed, source = _commit_seed()
        config.option.hypothesis_seed = str(seed)
        config.stash[_SEED_SOURCE] = f"{seed} ({source})"


_SEED_SOURCE = pytest.StashKey[str]()


def pytest_report_header(config: pytest.Config) -> str:
    seed = config.getoption("hypothesis_seed", None)
    if seed is None:
        return f"hypothesis profile {PROFILE}: random seed per test (set HYPOTHESIS_SEED to fix)"
    source = config.stash.get(_SEED_SOURCE, f"{seed} (--hypothesis-seed)")
    return (
        f"hypothesis profile {PROFILE}: seed {source}; "
        f"rerun with HYPOTHESIS_PROFILE={PROFILE} HYPOTHESIS_SEED={seed}"
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` (scripts/test.sh): the scopes of ``tests/xdist_scopes.py``, which keep
    the tests sharing the broker, or the Spark session, in one process."""
    if config.getoption("dist") != "loadscope":
        return None
    from .xdist_scopes import SharedFixtureScheduling  # imports xdist: only under xdist

    return SharedFixtureScheduling(config, log)


def _faust_unit_test_file(path: Path) -> bool:
    """tests/test_faust_*.py: Faust apps built in this process, never started (the broker
    tests in tests/integration run their apps in worker processes)."""
    return path.parent == Path(__file__).parent and path.name.startswith("test_faust_")


@pytest.fixture(autouse=True)
def _faust_apps_closed(request: pytest.FixtureRequest) -> Iterator[list[Any]]:
    """Every Faust app a Faust test builds is closed after it (tests/faust_apps.py says why):
    the list of them so far."""
    if not _faust_unit_test_file(request.path):
        yield []
        return
    from .faust_apps import apps_closed_after  # imports faust: only where a test uses it

    with apps_closed_after() as built:
        yield built


#: Faust's loggers, the process's, which the Faust drop-in filters for a while (a cut
#: producer stop's release): a filter left on would act on every later app of the process.
FAUST_LOGGERS = ("faust.topics", "faust.transport.producer")


@pytest.fixture(autouse=True)
def _faust_loggers_left_unfiltered(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a Faust test that leaves a filter added on a Faust logger."""
    if not _faust_unit_test_file(request.path):
        yield
        return
    before = {name: list(logging.getLogger(name).filters) for name in FAUST_LOGGERS}
    yield
    left = {
        name: [f for f in logging.getLogger(name).filters if f not in before[name]]
        for name in FAUST_LOGGERS
    }
    if any(left.values()):
        pytest.fail(f"filters left on Faust's loggers: {left}")


@pytest.fixture
def built_faust_apps(_faust_apps_closed: list[Any]) -> list[Any]:
    """The Faust apps this test has built, each to be closed after it: a test that closes one
    itself and needs it garbage-collected takes it out (the list holds it)."""
    return _faust_apps_closed


@pytest.fixture(scope="module", autouse=True)
def _faust_test_file_leaves_no_descriptors(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a Faust test file that leaves descriptors open: they add up over a run (one test
    process ran past 1024, the limit of ``select.select``)."""
    if not _faust_unit_test_file(request.path):
        yield
        return
    from .faust_apps import SPARE_DESCRIPTORS, descriptors_left, open_descriptors

    before = open_descriptors()
    yield
    left = descriptors_left(before)
    if left is not None and left > SPARE_DESCRIPTORS:
        pytest.fail(
            f"{request.path.name} left {left} descriptors open (at most {SPARE_DESCRIPTORS}): "
            "close what its tests open (tests/faust_apps.py closes the apps they build)"
        )
