"""Damaged bytes from valid seeds, and the bounds every fuzz example is held to."""

from __future__ import annotations

import contextlib
import os
import time
import tracemalloc
from collections.abc import Iterator

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from ..strategies import varint

#: Per-example bounds on the CPU time the code under test takes in the test's thread
#: (``bounded()``, ``within_cpu()``): far above what an example takes (decoders well under 10 ms,
#: leaders of these small groups tens of ms, the biggest hostile announcer 0.7 s under
#: tracemalloc, 1.1 s beside two CPU hogs), far below a stall (the audit's hostile member cost
#: the streams leader seconds). CPU time, not the wall clock: beside two CPU hogs that example's
#: wall time grew 17-fold, its CPU time up to 1.7-fold.
#: The normal suite (CI included) draws a few hundred examples per fuzz test, new ones on every
#: commit; ``HYPOTHESIS_PROFILE=fuzz`` is the long local hunt (its profile's count applies).
EXAMPLE_CPU_SECONDS = 1.0
LEADER_CPU_SECONDS = 3.0
EXAMPLES = settings.default.max_examples
if os.environ.get("HYPOTHESIS_PROFILE") != "fuzz":
    EXAMPLES = min(EXAMPLES, 400)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

#: Numbers whose varints sit at the decoders' edges: counts just past the budget, int32 and
#: int64 limits, the 64-bit varint limit.
EDGES = (0, 1, 127, 128, 2**20 - 1, 2**20, 2**20 + 1, 2**31 - 1, 2**31, 2**63 - 1, 2**64 - 1)
#: Byte values a mutation favours: continuation bits, sign bits, zero.
EDGE_BYTES = st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, 0xFE])
#: int32 values a version rewrite writes into a header.
VERSIONS = st.sampled_from([-1, 0, 1, 2, 3, 2**31 - 1, -(2**31)])


@st.composite
def damaged(draw: st.DrawFn, seeds: st.SearchStrategy[bytes], max_random: int = 300) -> bytes:
    """Bytes near valid ones: random, a seed truncated, mutated (overwrites, inserts,
    deletes), spliced with another seed, extended, given a varint at the edges, or with its
    int32 header rewritten."""
    kind = draw(
        st.sampled_from(
            ["random", "truncated", "mutated", "spliced", "extended", "varint", "version"]
        )
    )
    if kind == "random":
        return draw(st.binary(max_size=max_random))
    seed = draw(seeds)
    if kind == "truncated":
        return seed[: draw(st.integers(0, max(len(seed) - 1, 0)))]
    if kind == "mutated":
        return _mutated(draw, seed)
    if kind == "spliced":
        other = draw(seeds)
        return seed[: draw(st.integers(0, len(seed)))] + other[draw(st.integers(0, len(other))) :]
    if kind == "extended":
        return seed + draw(st.binary(min_size=1, max_size=40))
    if kind == "varint":
        at = draw(st.integers(0, len(seed)))
        cut = draw(st.integers(0, 3))  # replace what was there, or insert
        return seed[:at] + varint(draw(st.sampled_from(EDGES))) + seed[at + cut :]
    head = draw(VERSIONS).to_bytes(4, "big", signed=True)
    return head + seed[4:] if draw(st.booleans()) else seed[:4] + head + seed[8:]


def _mutated(draw: st.DrawFn, seed: bytes) -> bytes:
    raw = bytearray(seed)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["set", "insert", "delete"]))
        at = draw(st.integers(0, len(raw)))
        value = draw(st.one_of(EDGE_BYTES, st.integers(0, 255)))
        if op == "insert":
            raw.insert(at, value)
        elif raw and at < len(raw):
            if op == "set":
                raw[at] = value
            else:
                del raw[at]
    return bytes(raw)


class Peak:
    """tracemalloc's peak of a ``bounded()`` block, in bytes (set when the block ends)."""

    def __init__(self) -> None:
        self.used = 0


@contextlib.contextmanager
def within_cpu(seconds: float) -> Iterator[None]:
    """Fail if the block uses more than ``seconds`` of its thread's CPU time, whether it
    returns or raises."""
    start = time.thread_time()
    try:
        yield
    finally:  # also when the block raises: a stall may end in the error the test expects
        used = time.thread_time() - start
        assert used <= seconds, f"{used:.2f} s of CPU time > bound {seconds} s"


@contextlib.contextmanager
def bounded(limit: int, cpu_seconds: float = EXAMPLE_CPU_SECONDS) -> Iterator[Peak]:
    """Trace the block's allocations; fail if their peak passes ``limit`` bytes or the block
    uses more than ``cpu_seconds`` of CPU time."""
    peak = Peak()
    tracemalloc.start()
    try:
        with within_cpu(cpu_seconds):
            yield peak
        peak.used = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak.used <= limit, f"peak {peak.used} bytes > bound {limit}"
