"""The input files of ``plan``: a clients file, ``--partitions`` counts and the checks of
them against the topology."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import click

from ..assignment import ClientState
from ..errors import ClientsFileError
from ..files import load_toml
from ..grouper import resolve_partition_counts
from ..topology import Topology

_PARTITIONS = "'--partitions'"


_CLIENT_KEYS = ("process_id", "capacity", "prev_active", "prev_standby", "lags", "rack", "tags")


def load_clients(path: str | Path) -> list[ClientState]:
    """Read ``[[client]]`` tables from a TOML file into ``ClientState``s.

    Keys: ``process_id`` (required), ``capacity``, ``prev_active``, ``prev_standby`` (task ids
    such as ``"0_3"``), ``lags`` (table: task id -> int), ``rack`` (string), ``tags`` (table:
    string -> string). Any problem raises ``ClientsFileError`` (a ``ValueError``) naming the file,
    the client and the key.
    """
    where = str(path)
    data = load_toml(path, ClientsFileError, "clients file")
    unknown = sorted(set(data) - {"client"})
    if unknown:
        raise ClientsFileError(
            f"{where}: unknown top-level keys {unknown} (expected [[client]] tables)"
        )
    tables = data.get("client", [])
    if not isinstance(tables, list) or not tables:
        raise ClientsFileError(f"{where}: no [[client]] tables")
    clients = [_client(table, f"{where}: client #{n}") for n, table in enumerate(tables, 1)]
    first: dict[str, int] = {}
    for n, client in enumerate(clients, 1):
        earlier = first.setdefault(client.process_id, n)
        if earlier != n:
            raise ClientsFileError(
                f"{where}: clients #{earlier} and #{n} have the same process_id "
                f"{client.process_id!r} (each process of a group has its own)"
            )
    return clients


def _client(table: object, label: str) -> ClientState:
    """One ``[[client]]`` table as a ``ClientState``; ``ClientsFileError`` starting with
    ``label`` (and the process id once known) otherwise."""
    if not isinstance(table, dict):
        raise ClientsFileError(f"{label}: expected a [[client]] table, got {table!r}")
    bad = sorted(set(table) - set(_CLIENT_KEYS))
    if bad:
        raise ClientsFileError(f"{label}: unknown keys {bad}; allowed: {list(_CLIENT_KEYS)}")
    if "process_id" not in table:
        raise ClientsFileError(f"{label}: process_id is required")
    if type(table["process_id"]) is int:  # `process_id = 1` in TOML: read as text
        table = {**table, "process_id": str(table["process_id"])}
    try:
        return ClientState(**table)
    except (TypeError, ValueError) as exc:
        pid = table["process_id"]
        reason = str(exc).removeprefix(f"client {pid!r}: ")  # named in the label already
        raise ClientsFileError(f"{label} ({pid!r}): {reason}") from exc


def parse_partitions(values: Sequence[str]) -> dict[str, int]:
    """``["orders=12", "customers=12"]`` -> counts; a clear error for any other form, or for a
    count past Kafka's (``preflight.MAX_PARTITIONS``)."""
    from ..pipeline.preflight import MAX_PARTITIONS

    counts: dict[str, int] = {}
    for value in values:
        for item in filter(None, (v.strip() for v in value.split(","))):
            topic, sep, count = item.rpartition("=")
            if not sep or not topic or not count.isdigit() or int(count) < 1:
                raise click.BadParameter(
                    f"expected TOPIC=COUNT with COUNT >= 1, got {item!r}", param_hint=_PARTITIONS
                )
            if int(count) > MAX_PARTITIONS:
                raise click.BadParameter(
                    f"{item!r}: at most {MAX_PARTITIONS:,} partitions (2**31 - 1: Kafka's "
                    "partition numbers are 32-bit)",
                    param_hint=_PARTITIONS,
                )
            if counts.get(topic, int(count)) != int(count):
                raise click.BadParameter(
                    f"{topic} given twice, as {counts[topic]} and {count}", param_hint=_PARTITIONS
                )
            counts[topic] = int(count)
    return counts


def _check_partition_topics(topology: Topology, counts: Mapping[str, int]) -> None:
    """Reject ``--partitions`` entries the topology takes no count for.

    The grouper ignores counts of other topics (a live cluster reports every topic it has), but
    here the topology is declared, so such an entry is a typo or the wrong file: the same rule
    as the file's ``[partitions]`` table and ``simulate``'s ``--partitions``.
    """
    externals = topology.external_source_topics
    unknown = sorted(set(counts) - externals)
    if not unknown:
        return
    repartition = [t for t in unknown if t in topology.repartition_topics]
    others = [t for t in unknown if t not in topology.repartition_topics]
    name = topology.name or "the topology"
    parts = []
    if others:
        parts.append(f"unknown topic(s) {', '.join(others)}")
    if repartition:
        parts.append(
            f"repartition topic(s) {', '.join(repartition)} (their counts are fixed in the file "
            "or computed)"
        )
    raise click.BadParameter(
        f"{'; '.join(parts)}: {name} takes counts for its external source topics only: "
        f"{', '.join(sorted(externals))}",
        param_hint="'--partitions'",
    )


def _check_task_count(topology: Topology, counts: Mapping[str, int]) -> None:
    """Refuse more than ``preflight.MAX_TASKS`` tasks before the grouper builds them one by
    one (``plan -p orders=2147483647`` would build 2**31 of them)."""
    from ..pipeline.preflight import MAX_TASKS

    resolved = resolve_partition_counts(topology, counts)
    tasks = sum(
        max((resolved.get(t, 0) for t in sub.source_topics), default=0)
        for sub in topology.subtopologies
    )
    if tasks > MAX_TASKS:
        raise click.ClickException(
            f"{topology.name or 'the topology'} has {tasks:,} tasks with these partition counts: "
            f"the limit is {MAX_TASKS:,} (one assignment of 50,000 tasks takes about 3 s)"
        )
