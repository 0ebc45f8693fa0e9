"""Shared test configuration: hypothesis profiles (CI runs thousands of cases per property)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# CI is deterministic (a fixed example sequence), so a landing never depends on which random
# examples one run happened to draw; local runs stay random and keep exploring.
settings.register_profile(
    "ci",
    max_examples=2000,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=200, deadline=None)
# A long random search for rare counterexamples: HYPOTHESIS_PROFILE=deep pytest tests/test_sticky.py
settings.register_profile(
    "deep",
    max_examples=50_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Hunting with the fuzz tests (tests/fuzz: damaged bytes into decoders and leaders), each
# example still under the deadline those tests set: HYPOTHESIS_PROFILE=fuzz pytest tests/fuzz
settings.register_profile(
    "fuzz",
    max_examples=20_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
