"""The assignors the pipeline compares: names, levels, and whether a peer is installed.

Two levels. *Task* assignors place tasks (and standbys) on processes: the project's
``StickyTaskAssignor`` and ``HighAvailabilityTaskAssignor`` and, as a peer, faust-streaming's
``CopartitionedAssignor``. *Consumer* assignors place source partitions on consumer threads, as
a plain consumer group would: the project's ``streamassign.consumer`` assignors and aiokafka's
built-ins. Both levels replay the same traces; rows say which level produced them.

Names are resolved on the driver, before Spark starts: an unknown name is an error; a peer whose
package is missing is skipped with a note saying how to install it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from typing import Final

import attrs

from .scenarios import PipelineError

__all__ = [
    "GROUPS",
    "SPECS",
    "AssignorSpec",
    "Resolved",
    "is_default_group",
    "peer_distributions",
    "resolve",
    "spec",
]


@attrs.frozen
class AssignorSpec:
    """One assignor: registry name, level (``task`` / ``consumer``), what it is, and for a peer
    the module it needs and how to install it."""

    name: str
    level: str
    summary: str
    module: str | None = None
    install: str = ""

    def missing(self) -> str | None:
        """Why the assignor cannot run here (its package is not installed), or None."""
        if self.module is None or self.module in sys.modules:
            return None  # imported already (faust then sets its __spec__ to None)
        try:
            found = importlib.util.find_spec(self.module)
        except ValueError:  # a module that replaced itself in sys.modules: it is installed
            return None
        if found is not None:
            return None
        return f"{self.name} skipped: {self.module} is not installed ({self.install})"


SPECS: Final[tuple[AssignorSpec, ...]] = (
    AssignorSpec(
        "task:sticky",
        "task",
        "streamassign.StickyTaskAssignor: capacity-proportional, minimal moves, standbys",
    ),
    AssignorSpec(
        "task:ha",
        "task",
        "streamassign.HighAvailabilityTaskAssignor: actives move only onto caught-up state; "
        "warmups and probing rebalances between events",
    ),
    AssignorSpec(
        "faust:copartitioned",
        "task",
        "faust-streaming's CopartitionedAssignor, one per group of equal task counts",
        "faust",
        "pip install 'streamassign[faust]'",
    ),
    AssignorSpec("consumer:range", "consumer", "streamassign.consumer.RangeAssignor"),
    AssignorSpec("consumer:roundrobin", "consumer", "streamassign.consumer.RoundRobinAssignor"),
    AssignorSpec("consumer:sticky", "consumer", "streamassign.consumer.StickyAssignor"),
    AssignorSpec(
        "consumer:cooperative-sticky",
        "consumer",
        "streamassign.consumer.CooperativeStickyAssignor: timed plan(); scored on the target "
        "the follow-up rebalance completes",
    ),
    AssignorSpec("consumer:shuffled", "consumer", "streamassign.consumer.ShuffledAssignor"),
    AssignorSpec(
        "aiokafka:range",
        "consumer",
        "aiokafka's RangePartitionAssignor",
        "aiokafka",
        "pip install 'streamassign[aiokafka]'",
    ),
    AssignorSpec(
        "aiokafka:roundrobin",
        "consumer",
        "aiokafka's RoundRobinPartitionAssignor",
        "aiokafka",
        "pip install 'streamassign[aiokafka]'",
    ),
    AssignorSpec(
        "aiokafka:sticky",
        "consumer",
        "aiokafka's StickyPartitionAssignor (class state isolated per member and round)",
        "aiokafka",
        "pip install 'streamassign[aiokafka]'",
    ),
)

_BY_NAME: Final = {s.name: s for s in SPECS}

#: Names that stand for several assignors.
GROUPS: Final[dict[str, tuple[str, ...]]] = {
    "default": (
        "task:sticky",
        "faust:copartitioned",
        "consumer:range",
        "consumer:sticky",
        "aiokafka:sticky",
    ),
    "all": tuple(s.name for s in SPECS),
    "task": tuple(s.name for s in SPECS if s.level == "task"),
    "consumer": tuple(s.name for s in SPECS if s.name.startswith("consumer:")),
    "aiokafka": tuple(s.name for s in SPECS if s.name.startswith("aiokafka:")),
    "peers": tuple(s.name for s in SPECS if s.module is not None),
}


def spec(name: str) -> AssignorSpec:
    """The assignor called ``name``; :class:`PipelineError` listing the known names if none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise PipelineError(
            f"unknown assignor {name!r}; known: {', '.join(_BY_NAME)} (groups: {', '.join(GROUPS)})"
        ) from None


def is_default_group(names: object) -> bool:
    """Whether ``names`` (a run's resolved assignors, as its manifest records them) are what
    simulate's default group resolves to: its members in order, peers not installed left out
    (the manifest keeps the resolved names, not the words given)."""
    if not isinstance(names, list) or not names:
        return False
    default = GROUPS["default"]
    expected = [n for n in default if _BY_NAME[n].module is None or n in names]
    return names == expected


#: The distribution each peer's module comes from (its version names the peer's code).
_DISTRIBUTIONS: Final = {"faust": "faust-streaming", "aiokafka": "aiokafka"}


def peer_distributions(names: Iterable[object]) -> list[str]:
    """The distributions whose code the assignors ``names`` run (peers only), sorted: their
    versions, like streamassign's code, decide a run's rows. Unknown names are left out."""
    modules = {_BY_NAME[n].module for n in names if isinstance(n, str) and n in _BY_NAME}
    return sorted(_DISTRIBUTIONS.get(m, m) for m in modules if m is not None)


@attrs.frozen
class Resolved:
    """Assignors to run, in order, and notes about the ones skipped."""

    names: tuple[str, ...]
    notes: tuple[str, ...]


def resolve(names: Iterable[str]) -> Resolved:
    """Expand groups, drop duplicates (first wins), check names, skip peers not installed.

    Raises :class:`PipelineError` for an unknown name, or when nothing is left to run.
    """
    wanted: list[str] = []
    for raw in names:
        for name in filter(None, (n.strip() for n in raw.split(","))):
            for item in GROUPS.get(name, (name,)):
                spec(item)
                if item not in wanted:
                    wanted.append(item)
    if not wanted:
        raise PipelineError("no assignor given (e.g. --assignors task:sticky,consumer:range)")
    run: list[str] = []
    notes: list[str] = []
    for name in wanted:
        why = spec(name).missing()
        if why is None:
            run.append(name)
        else:
            notes.append(why)
    if not run:
        raise PipelineError("no assignor left to run: " + "; ".join(notes))
    return Resolved(tuple(run), tuple(notes))
