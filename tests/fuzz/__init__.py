"""Fuzz tests: damaged bytes into every decoder and leader, in the normal suite.

- ``damage.py``: the shared tools. ``damaged(seeds)`` turns valid encodings into random,
  mutated, truncated, spliced, extended and version-rewritten bytes; ``bounded()`` measures an
  example's tracemalloc peak; ``FUZZ`` and ``FUZZ_LEADER`` are the per-example deadlines.
- ``test_decoders.py``: wire decoders (streams subscription and assignment, consumer user data).
- ``test_leaders.py``: group leaders (streams, consumer).

Add a module per area (topology and clients files, local state directories, the Faust leader)
with its own seeds, reusing ``damage.py``. The number of examples comes from the hypothesis
profile: 200 in ``dev``, 2000 in ``ci``; ``HYPOTHESIS_PROFILE=fuzz`` hunts longer locally
(see docs/testing.md).
"""
