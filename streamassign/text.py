"""Wording shared by the CLI, the core's comparisons and the pipeline's messages and reports
(nothing imported but for annotations: loading it costs nothing at CLI start)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the module loads nothing
    from collections.abc import Iterable, Sequence


def counted(n: float, noun: str, plural: str = "") -> str:
    """``1 task``, ``2 tasks``, ``1.5 tasks``, ``1,234,567 tasks`` (``plural``: when not
    ``noun + "s"``)."""
    whole = isinstance(n, int) or float(n).is_integer()
    amount = f"{int(n):,}" if whole else f"{n:,g}"
    return f"{amount} {noun if n == 1 else plural or noun + 's'}"


def exact_number(value: float) -> str:
    """``value`` as a command-line word that parses back to it exactly (``1234567``,
    ``60.25``): ``:g`` keeps 6 digits (1234567 becomes 1.23457e+06, another value). Used
    wherever an option's value is shown, so that what a line says is what a command takes.
    Whole numbers past 1e16 (where floats stop holding every integer) as ``repr`` (``1e+300``,
    not 301 digits), which parses back exactly too."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def listed(items: Sequence[object], limit: int = 12, separator: str = ", ") -> str:
    """The first ``limit`` items, then how many more: ``0_1, 0_2, … (+3)``."""
    shown = separator.join(str(item) for item in items[:limit])
    return shown + (f"{separator}… (+{len(items) - limit})" if len(items) > limit else "")


def partitions_by_topic(partitions: Iterable[tuple[str, int]]) -> str:
    """Topic partitions (``TopicPartition``s) grouped by topic: ``a[0,2], b[1]``."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return ", ".join(f"{topic}[{','.join(map(str, ps))}]" for topic, ps in by_topic.items())
