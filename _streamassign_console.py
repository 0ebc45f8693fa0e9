"""The ``streamassign`` console script's entry point, outside the package on purpose.

A console script imports its entry point's module before anything of ours runs: for
``streamassign.cli:main`` that is the whole package and the CLI (up to a second or two on a
loaded machine), and Ctrl-C meanwhile printed a ``KeyboardInterrupt`` trace. Importing this
module loads nothing of streamassign, so the heavy import happens inside ``main``, where an
interrupt ends the command as the shell ends an interrupted one: status 130, no trace.
"""

from __future__ import annotations


def main() -> None:
    """Load the CLI and run it; Ctrl-C while it loads exits with status 130."""
    try:
        from streamassign.cli import main as cli
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    cli()
