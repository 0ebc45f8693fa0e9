"""``spark-submit`` entry point for the pipeline's commands.

    spark-submit --master spark://host:7077 "$(python -m streamassign.pipeline.submit --path)" \
        simulate topology/orders-join.toml --scenarios 10000 --out hdfs:///runs/orders

runs the same ``streamassign simulate | report | plan-standbys`` commands as the CLI, with the
master (and every other setting) that ``spark-submit`` was given. ``--path`` prints this file's
path, for the command above.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """Run one ``streamassign`` command with ``argv`` (default: the process arguments)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--path"]:
        print(os.path.abspath(__file__))
        return
    # spark-submit puts this file's directory first on sys.path; its modules (report, spark, ...)
    # must not shadow top-level names, so drop it.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    from streamassign.cli import main as cli

    cli.main(args=args, prog_name="streamassign")


if __name__ == "__main__":
    main()
