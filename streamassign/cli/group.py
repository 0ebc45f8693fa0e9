"""The command group ``main``, which each command's module adds its commands to. Here too:
plan-standbys' exit status for a missed target, which the group turns into 1 when stdout could
not be written."""

from __future__ import annotations

import sys
from typing import Any

import click

from .console import _ReaderGone
from .help import _Command, _HelpContext

#: plan-standbys' exit status when no candidate reaches an explicit --target (the plan is
#: printed and written all the same); 1 and 2 are click's errors and usage errors.
TARGET_MISSED_EXIT = 3


class _Commands(click.Group):
    """The command group: a closed stdout does not end a command (``_ReaderGone``); its
    commands' help keeps each option's extra on one line (:class:`_HelpFormatter`)."""

    context_class = _HelpContext
    command_class = _Command

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run the command line; if stdout could not be written (``--help`` and ``--version``
        included), say why in one line after whatever else the command said. A status that
        claims the output is there (0; ``TARGET_MISSED_EXIT``, "printed and written anyway")
        becomes 1; an error's own status stands."""
        stdout = sys.stdout
        sys.stdout = reader = _ReaderGone(stdout)
        try:
            return super().main(*args, **kwargs)
        except SystemExit as ended:
            reader.flush()  # what the command left buffered
            if reader.failure is None:
                raise
            reason = reader.failure.strerror or reader.failure
            click.echo(f"Error: cannot write to standard output: {reason}", err=True)
            status = 1 if ended.code in (None, 0, TARGET_MISSED_EXIT) else ended.code
            raise SystemExit(status) from reader.failure
        finally:
            sys.stdout = stdout


@click.group(cls=_Commands)
@click.version_option(package_name="streamassign")
def main() -> None:
    """Task and partition assignment for Python stream processors."""
