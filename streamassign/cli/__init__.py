"""Command line: ``streamassign plan`` shows the tasks, the assignment and its quality;
``simulate``, ``report`` and ``plan-standbys`` run the Spark pipeline (docs/pipeline.md).

A thin layer over the core: ``plan`` reads a topology file and a clients file, runs the grouper,
the sticky task assignor and the thread distribution, and prints tables (rich) or JSON. The
pipeline commands validate every input, then hand over to ``streamassign.pipeline.spark``.

One module per command or family of commands, each adding its commands to the group ``main``
(``group``) when imported here: ``plan``; ``explain``; ``diff``; ``describe``; ``simulate``,
``report`` and ``plan_standbys``. The modules they share: ``options``, ``console`` and ``help``
(stdout and help formatting), ``inputs`` (topology and clients files), ``views``, ``labels``
and ``snapshots`` (what plan, explain, diff and describe print and read), ``connection`` and
``describe_tables`` (describe's), ``extras``, ``jobs``, ``failures``, ``run_folders`` and
``kept_runs`` (the pipeline commands'), ``standby_runs`` (plan-standbys' next simulation).
"""

# Imported for what importing them does: each adds its commands to ``main``.
from . import describe, diff, explain, plan, plan_standbys, report, simulate  # noqa: F401
from .group import TARGET_MISSED_EXIT, main
from .inputs import load_clients, parse_partitions
from .run_folders import REPORT_ID

__all__ = ["REPORT_ID", "TARGET_MISSED_EXIT", "load_clients", "main", "parse_partitions"]
