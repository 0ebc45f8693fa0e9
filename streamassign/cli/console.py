"""Standard output: a reader that goes away (``head``, a closed pipe) does not end a command
with a trace, and rich's console writes to whatever ``sys.stdout`` is now."""

from __future__ import annotations

import contextlib
import io
import os
import select
import shutil
import sys
import textwrap
from typing import Any, TextIO

import click
from rich.console import Console


def _quiet_stdout() -> None:
    """Send what is left for stdout to /dev/null: its reader is gone (``| head``), and the
    interpreter's last flush would otherwise fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


class _ReaderGone(io.TextIOBase):
    """``sys.stdout`` while a command runs: once its reader is gone (``| head -1``, ``| grep
    -q``), what is left goes nowhere and the command goes on as if it had been read, so files
    it writes are written and its exit status is its own (a broken pipe used to end commands
    early: ``plan-standbys --out`` wrote nothing and a missed ``--target`` exited 0). Any other
    write failure (``> file`` on a full disk, ``> /dev/full``) is kept as ``failure``: the
    command goes on the same way, then ends with one line saying why (``_Commands.main``)
    rather than a trace of where the print was."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gone = False
        #: Why writing failed, other than a broken pipe.
        self.failure: OSError | None = None

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._give_up(exc)
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except OSError as exc:
                self._give_up(exc)

    def _give_up(self, exc: OSError) -> None:
        """Write nothing more (the interpreter's last flush included)."""
        self._gone = True
        _quiet_stdout()
        if not isinstance(exc, BrokenPipeError):
            self.failure = exc

    def reader_gone(self) -> bool:
        """Whether stdout's reader is gone, asked without writing: a command that prints only
        now and then (``describe --watch``) must not poll for hours to learn it. A pipe or
        socket whose far end closed polls as an error or a hang-up; a file or a terminal
        never does (nor does a platform without ``poll``: then only a write can tell)."""
        if not self._gone:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                poller = select.poll()
                poller.register(self._stream.fileno(), 0)  # errors and hang-ups only
                if any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0)):
                    self._gone = True
                    _quiet_stdout()
        return self._gone

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._stream.encoding


class _Stdout(Console):
    """rich's console on stdout (``_ReaderGone`` makes a closed stdout quiet; rich's own
    handling would exit 1). Markup is off: table cells and titles hold client ids, endpoints,
    topic and file names, which rich would read as tags (``etl[/]`` raised MarkupError, an
    IPv6 ``[fd00::1]:8080`` lost its host); a styled line asks for it (``markup=True``) and
    escapes what it quotes. Emoji codes are off too (a client id ``etl:fire:x`` printed a
    flame)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"markup": False, "emoji": False, **kwargs})

    def on_broken_pipe(self) -> None:
        self.quiet = True
        _quiet_stdout()


def _say(line: str | None) -> None:
    """``line`` (a warning or a note) on stderr, when there is one."""
    if line is not None:
        click.echo(line, err=True)


def _say_wrapped(line: str | None) -> None:
    """:func:`_say`, wrapped to the terminal's width (what follows the first line indented):
    a note naming protocols and counts is a line of 200 characters."""
    if line is not None:
        width = shutil.get_terminal_size().columns
        _say(
            textwrap.fill(
                line, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
            )
        )
