"""Help formatting: each option's extra (``[default: ...; x>=0.1]``) kept on one line while
click wraps the help text."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from typing import Final

import click

#: An option's help extra click appends (``  [default: 1.0; x>=0.1]``): its last bracket.
_HELP_EXTRA: Final = re.compile(r"(?:^|(?<=  ))\[[^\[\]]*\]$")


#: A default's label and the word after it, in any bracket (one in an option's own text).
_DEFAULT_LABEL: Final = re.compile(r"\[default: \S+")


#: Joins an extra's words while click wraps it; a space again once wrapped.
_NO_BREAK: Final = "\u00a0"


class _HelpFormatter(click.HelpFormatter):
    """click's help, with each option's ``[default: ...; x>=0]`` whole on one line: wrapped
    as words, it broke as ``[default:`` at a line's end and ``1.0; x>=0.1]`` under it at 80
    columns, in every command. Kept whole, it moves to the next line when
    it does not fit. One wider than the text column wraps between its words (kept whole, click
    would cut it inside one; it still cuts a single word wider than the column), with
    ``[default:`` beside the word after it unless the two alone are wider than the column
    (``[default: PLAINTEXT`` at click's least width, 50: a 16-column text). An option's
    name and value wider than the help (``--security-protocol [PLAINTEXT|...|SASL_SSL]``,
    61 columns) go on lines of their own, broken between words, as wide options' text goes
    under them: click writes them whole, past the help's width."""

    def write_dl(
        self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2
    ) -> None:
        term_width = self.width - self.current_indent
        rows = [row for term, text in rows for row in _fitting_term(term, text, term_width)]
        # click's own column arithmetic (HelpFormatter.write_dl), to know what fits.
        terms = max((len(click.unstyle(term)) for term, _ in rows), default=0)
        text_width = max(self.width - min(terms, col_max) - col_spacing - 2, 10)
        start = len(self.buffer)
        super().write_dl(
            [(term, _unbroken_extra(text, text_width)) for term, text in rows],
            col_max,
            col_spacing,
        )
        self.buffer[start:] = [text.replace(_NO_BREAK, " ") for text in self.buffer[start:]]


def _fitting_term(term: str, text: str, width: int) -> list[tuple[str, str]]:
    """A help row whose ``term`` (an option's names and value) is wider than ``width`` as
    rows of its lines (broken between words, each after the first indented by two), its
    ``text`` with the last; the row itself when it fits or has no space to break at."""
    if len(click.unstyle(term)) <= width:
        return [(term, text)]
    *lines, last = textwrap.wrap(
        term, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    )
    return [*((line, "") for line in lines), (last, text)]


def _unbroken_extra(help_text: str, width: int) -> str:
    """``help_text`` with its trailing extra's spaces made unbreakable, and else each
    ``[default:`` joined to the word after it, where that fits ``width``."""

    def unbroken(match: re.Match[str]) -> str:
        text = match.group()
        return text if len(text) > width else text.replace(" ", _NO_BREAK)

    return _DEFAULT_LABEL.sub(unbroken, _HELP_EXTRA.sub(unbroken, help_text))


class _HelpContext(click.Context):
    """A command's context, formatting its help with :class:`_HelpFormatter`."""

    formatter_class = _HelpFormatter


class _Command(click.Command):
    """Every subcommand: its help formatted with :class:`_HelpFormatter`."""

    context_class = _HelpContext
