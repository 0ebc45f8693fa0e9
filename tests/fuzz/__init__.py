"""Fuzz tests: damaged bytes into every decoder, leader, file loader and the state directory,
in the normal suite.

- ``damage.py``: the shared tools. ``damaged(seeds)`` turns valid encodings into random,
  mutated, truncated, spliced, extended and version-rewritten bytes; ``bounded()`` measures an
  example's tracemalloc peak and CPU time (``within_cpu()`` the CPU time alone); ``FUZZ`` is
  the settings every fuzz test shares.
- ``test_decoders.py``: wire decoders (streams subscription and assignment, consumer user data).
- ``test_leaders.py``: group leaders (streams, consumer).
- ``test_faust_leader.py``: the Faust leader (a real Faust app's ``PartitionAssignor``).
- ``test_files.py``: topology and clients TOML files (damaged bytes and damaged structure),
  and the sticky assignor on every clients file that loads.
- ``test_local_state.py``: state directories holding random damaged trees.
- ``test_json_decoders.py``: JSON from outside (``files.loads_json``, describe's Faust JSON,
  commit markers, the Faust assignor's state file) holding any value, ``1e999``, ``NaN``.

A new area gets its own module with its own seeds, reusing ``damage.py``. The number of
examples comes from the hypothesis profile, capped at 400: 200 in ``dev``, 400 in ``ci``;
``HYPOTHESIS_PROFILE=fuzz`` hunts longer locally (see docs/testing.md).
"""
