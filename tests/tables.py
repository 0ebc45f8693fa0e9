"""Checks of rich tables as a console of a given width prints them."""

from __future__ import annotations

from collections.abc import Iterable

#: The first and last character of each line of a rich table (heavy head, light body).
_LEFT, _RIGHT = "┏┃┡│└", "┓┃┩│┘"


def assert_whole_tables(text: str, headers: Iterable[str] = ()) -> None:
    """Every table of ``text`` (a recorded console's export) has all its columns: rich crops a
    table wider than the console, so no line is ever wider than the console (a width check
    cannot fail) but the right-hand columns are gone, and with them each line's right border.
    ``headers``: column headers that must be there (a header may wrap over lines)."""
    for line in text.splitlines():
        if line and line[0] in _LEFT:
            assert line.rstrip()[-1] in _RIGHT, f"a cropped table line: {line!r}"
    head = " ".join(
        cell.strip()
        for line in text.splitlines()
        if line.startswith("┃")
        for cell in line.split("┃")
    )
    for header in headers:
        assert header in head, f"no column {header!r} in {text}"
