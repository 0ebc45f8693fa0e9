"""The topology model: what an application reads (source topics), keeps (stores) and re-keys.

A :class:`Topology` is a pure description, independent of any cluster: it says which topics each
subtopology reads, which repartition topics it writes, which topics must be co-partitioned, and
which repartition topics have a fixed partition count. Partition counts of external topics are
deployment facts and are passed to the grouper separately (see ``streamassign.grouper``); a TOML
file may carry defaults for them in a ``[partitions]`` table, which :func:`load_topology_file`
returns next to the topology instead of inside it. The file format is documented in
``docs/topology.md``.

Validation follows Kafka Streams: a topic is the source of at most one subtopology, a store
belongs to one subtopology, and co-partitioned topics are read by one subtopology (they are
co-partitioned because one task joins them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import attrs

from ._ids import TaskId, TopicPartition
from .errors import NoTasksError, NotInTopologyError, TopologyError, TopologyTypeError
from .files import read_toml

__all__ = [
    "Subtopology",
    "Topology",
    "TopologyFile",
    "changelog_topic_name",
    "load_topology_file",
    "read_topology_file",
]

# Kafka's rule for topic names (also used for store and application names, which become part of
# changelog topic names): letters, digits, '.', '_', '-'; at most 249 characters; not '.' or '..'.
_LEGAL_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_MAX_TOPIC_LENGTH = 249

#: Subtopology ids and partition counts stay in Kafka's int32 range (``< 2**31``), as Kafka
#: Streams' task ids do: a larger id would pass the leader and fail every member's decode.
_INT32_LIMIT = 1 << 31


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TopologyTypeError(f"{what} must be a str, got {type(value).__name__} {value!r}")
    if not _LEGAL_NAME.fullmatch(value) or value in (".", ".."):
        raise TopologyError(
            f"illegal {what} {value!r}: use 1-249 characters from [A-Za-z0-9._-] "
            "(Kafka's topic name rule)"
        )
    return value


def _name_tuple(value: Iterable[str], what: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)):
        raise TopologyTypeError(
            f"{what}s must be an iterable of names, not a single {type(value).__name__} "
            f"{value!r} (write [{value!r}])"
        )
    try:
        items = list(value)
    except TypeError:
        raise TopologyTypeError(
            f"{what}s must be an iterable of names, got {type(value).__name__} {value!r}"
        ) from None
    return tuple(sorted({_check_name(item, what) for item in items}))


def _topics(value: Iterable[str]) -> tuple[str, ...]:
    return _name_tuple(value, "topic")


def _stores(value: Iterable[str]) -> tuple[str, ...]:
    return _name_tuple(value, "store")


def _check_int(value: object, low: int, what: str, expected: str) -> int:
    """``value`` if it is an int in ``[low, 2**31)``, else a ``TopologyError`` saying ``what``
    must be ``expected`` (or below 2**31)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise TopologyError(f"{what} must be {expected}, got {value!r}")
    if value >= _INT32_LIMIT:
        raise TopologyError(f"{what} must be < 2**31 (Kafka's int32 range), got {value!r}")
    return value


def _subtopology_id(instance: Subtopology, attribute: Any, value: int) -> None:
    _check_int(value, 0, "subtopology id", "an int >= 0")


def _non_empty_sources(instance: Subtopology, attribute: Any, value: tuple[str, ...]) -> None:
    if not value:
        raise TopologyError(f"subtopology {instance.id}: source_topics must not be empty")


def changelog_topic_name(application: str, store: str) -> str:
    """Changelog topic of ``store``: ``<app>-<store>-changelog``, as Kafka Streams and Faust."""
    return f"{application}-{store}-changelog"


@attrs.frozen
class Subtopology:
    """A connected piece of the processing graph; its tasks are numbered by partition.

    ``source_topics`` are the topics it reads (external or repartition topics), ``stores`` its
    state stores (each backed by a changelog topic), ``sink_topics`` the topics it writes; only the
    sinks declared as repartition topics of the :class:`Topology` matter for grouping (they make
    the count of a computed repartition topic depend on this subtopology's sources). Name
    collections are stored as sorted, de-duplicated tuples, so order does not matter.
    """

    id: int = attrs.field(validator=_subtopology_id)
    source_topics: tuple[str, ...] = attrs.field(converter=_topics, validator=_non_empty_sources)
    stores: tuple[str, ...] = attrs.field(default=(), converter=_stores)
    sink_topics: tuple[str, ...] = attrs.field(default=(), converter=_topics)

    @property
    def stateful(self) -> bool:
        """Whether the subtopology keeps state (has at least one store)."""
        return bool(self.stores)


class _FrozenMap(Mapping[str, "int | None"]):
    """An immutable, hashable, name-sorted mapping (``Topology.repartition_topics``)."""

    __slots__ = ("_data",)

    def __init__(self, items: Iterable[tuple[str, int | None]]) -> None:
        self._data: dict[str, int | None] = dict(sorted(items))

    def __getitem__(self, key: str) -> int | None:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._data.items()))

    def __repr__(self) -> str:
        return repr(self._data)


def _repartition_map(value: Mapping[str, int | None]) -> Mapping[str, int | None]:
    if not isinstance(value, Mapping):
        raise TopologyTypeError(
            "repartition_topics must be a mapping of topic name to partition count "
            f"(None = computed), got {type(value).__name__}"
        )
    items: list[tuple[str, int | None]] = []
    for topic, count in value.items():
        _check_name(topic, "repartition topic name")
        if count is not None:
            _check_int(
                count,
                1,
                f"repartition topic {topic!r}: partition count",
                "an int >= 1 or None (computed)",
            )
        items.append((topic, count))
    return _FrozenMap(items)


def _groups(value: Iterable[Iterable[str]]) -> tuple[tuple[str, ...], ...]:
    if isinstance(value, (str, bytes)):
        raise TopologyTypeError(
            f"copartition_groups must be an iterable of topic lists, got {value!r}"
        )
    return tuple(sorted({_name_tuple(group, "topic") for group in value}))


def _subtopologies(value: Iterable[Subtopology]) -> tuple[Subtopology, ...]:
    items = list(value)
    for item in items:
        if not isinstance(item, Subtopology):
            raise TopologyTypeError(f"subtopologies must be Subtopology instances, got {item!r}")
    return tuple(sorted(items, key=lambda s: s.id))


def _check_application_name(instance: Topology, attribute: Any, value: str) -> None:
    if value != "":
        _check_name(value, "topology name")


def _merge_groups(groups: Iterable[tuple[str, ...]]) -> tuple[tuple[str, ...], ...]:
    """Union overlapping groups (co-partitioning is transitive) and drop single-topic groups."""
    parent: dict[str, str] = {}

    def find(topic: str) -> str:
        root = topic
        while parent[root] != root:
            root = parent[root]
        while parent[topic] != root:  # path compression
            parent[topic], topic = root, parent[topic]
        return root

    for group in groups:
        for topic in group:
            parent.setdefault(topic, topic)
        for topic in group[1:]:
            a, b = find(group[0]), find(topic)
            if a != b:
                parent[max(a, b)] = min(a, b)
    merged: dict[str, list[str]] = {}
    for topic in parent:
        merged.setdefault(find(topic), []).append(topic)
    return tuple(sorted(tuple(sorted(g)) for g in merged.values() if len(g) > 1))


def _join(names: Iterable[object]) -> str:
    return ", ".join(repr(n) for n in names)


def _index_by_id(subtopologies: Iterable[Subtopology]) -> dict[int, Subtopology]:
    """Subtopologies by id; ``TopologyError`` naming every id used twice."""
    by_id: dict[int, Subtopology] = {}
    duplicates: set[int] = set()
    for sub in subtopologies:
        if sub.id in by_id:
            duplicates.add(sub.id)
        by_id[sub.id] = sub
    if duplicates:
        raise TopologyError("duplicate subtopology ids: " + ", ".join(map(str, sorted(duplicates))))
    return by_id


def _check_single_owners(
    owners: Mapping[str, list[int]], store_owners: Mapping[str, list[int]]
) -> None:
    """A source topic, and a store, belongs to one subtopology only."""
    if listed := _listed_shared(owners):
        raise TopologyError(
            "a topic may be the source of only one subtopology (as in Kafka Streams; merge "
            f"subtopologies that read the same topic): {listed}"
        )
    if listed := _listed_shared(store_owners):
        raise TopologyError(f"a store may belong to only one subtopology: {listed}")


def _listed_shared(owners: Mapping[str, list[int]]) -> str:
    """The names owned by more than one subtopology, with their owners ("": none)."""
    return "; ".join(
        f"{name!r} in subtopologies {', '.join(map(str, ids))}"
        for name, ids in sorted(owners.items())
        if len(ids) > 1
    )


def _checked_copartition_groups(
    groups: tuple[tuple[str, ...], ...], owners: Mapping[str, list[int]]
) -> tuple[tuple[str, ...], ...]:
    """``groups`` merged; each must name source topics read by one subtopology."""
    for group in groups:
        unknown = [t for t in group if t not in owners]
        if unknown:
            raise TopologyError(
                f"co-partition group [{_join(group)}] names topics that are not source "
                f"topics of any subtopology: {_join(unknown)}"
            )
    merged = _merge_groups(groups)
    for group in merged:
        readers = {t: owners[t][0] for t in group}
        if len(set(readers.values())) > 1:
            listed = ", ".join(f"{t!r} (subtopology {s})" for t, s in readers.items())
            raise TopologyError(
                "co-partitioned topics must be read by one subtopology (the one that joins "
                f"them): {listed}"
            )
    return merged


def _check_changelog_names(name: str, stores: Iterable[str]) -> None:
    """Every store's changelog topic name fits Kafka's limit."""
    for store in stores:
        topic = changelog_topic_name(name, store)
        if len(topic) > _MAX_TOPIC_LENGTH:
            raise TopologyError(
                f"changelog topic of store {store!r} would be {len(topic)} characters "
                f"long (Kafka allows {_MAX_TOPIC_LENGTH}): {topic!r}"
            )


@attrs.frozen
class Topology:
    """An application's subtopologies, co-partition groups and repartition topics.

    ``repartition_topics`` maps each repartition topic (an internal topic the application both
    writes and reads) to its fixed partition count, or ``None`` when the count is computed from the
    subtopologies that write it. ``copartition_groups`` are sets of source topics that must have
    equal partition counts because one subtopology joins them; overlapping groups are merged and
    single-topic groups dropped. ``name`` is the application id, the prefix of changelog topics.

    Construction validates the structure and raises :class:`~streamassign.errors.TopologyError`
    (a ``ValueError``) naming what is wrong; whether counts can be resolved (cycles, repartition
    topics nobody writes) depends on the grouper and is checked there.
    """

    subtopologies: tuple[Subtopology, ...] = attrs.field(converter=_subtopologies)
    copartition_groups: tuple[tuple[str, ...], ...] = attrs.field(default=(), converter=_groups)
    repartition_topics: Mapping[str, int | None] = attrs.field(
        default=_FrozenMap(()), converter=_repartition_map
    )
    name: str = attrs.field(default="", validator=_check_application_name)
    # Indexes derived from the fields above (not part of equality or hashing).
    _by_id: dict[int, Subtopology] = attrs.field(
        init=False, factory=dict, eq=False, hash=False, repr=False
    )
    _owner: dict[str, int] = attrs.field(init=False, factory=dict, eq=False, hash=False, repr=False)
    _writers: dict[str, tuple[int, ...]] = attrs.field(
        init=False, factory=dict, eq=False, hash=False, repr=False
    )
    _store_owner: dict[str, int] = attrs.field(
        init=False, factory=dict, eq=False, hash=False, repr=False
    )

    def __attrs_post_init__(self) -> None:
        by_id = _index_by_id(self.subtopologies)
        owners: dict[str, list[int]] = {}
        store_owners: dict[str, list[int]] = {}
        for sub in self.subtopologies:
            for topic in sub.source_topics:
                owners.setdefault(topic, []).append(sub.id)
            for store in sub.stores:
                store_owners.setdefault(store, []).append(sub.id)
        _check_single_owners(owners, store_owners)
        unread = sorted(t for t in self.repartition_topics if t not in owners)
        if unread:
            raise TopologyError(
                f"repartition topics not read by any subtopology (not a source topic): "
                f"{_join(unread)}"
            )
        merged = _checked_copartition_groups(self.copartition_groups, owners)
        object.__setattr__(self, "copartition_groups", merged)
        if self.name:
            _check_changelog_names(self.name, store_owners)
        writers: dict[str, list[int]] = {}
        for sub in self.subtopologies:
            for topic in sub.sink_topics:
                if topic in self.repartition_topics:
                    writers.setdefault(topic, []).append(sub.id)
        object.__setattr__(self, "_by_id", by_id)
        object.__setattr__(self, "_owner", {t: ids[0] for t, ids in owners.items()})
        object.__setattr__(self, "_writers", {t: tuple(ids) for t, ids in writers.items()})
        object.__setattr__(self, "_store_owner", {s: ids[0] for s, ids in store_owners.items()})

    def check_has_tasks(self, source: str = "", name: str = "") -> None:
        """Raise ``NoTasksError`` when the topology has no subtopology: it reads no topic, so it
        has no task to assign or run (an empty or half-written file). The one check of this that
        ``plan``, ``simulate`` and the runtime ``App`` make, so they say it alike. ``source`` (a
        file) starts the message; ``name`` stands for the topology's own (the CLI names an
        unnamed one after its file)."""
        if self.subtopologies:
            return
        where = f"{source}: " if source else ""
        shown = name or self.name
        raise NoTasksError(
            f"{where}topology {shown + ' ' if shown else ''}has no tasks (no subtopology)"
        )

    # -- queries ---------------------------------------------------------------------------------

    def subtopology(self, subtopology_id: int) -> Subtopology:
        """The subtopology with this id; ``KeyError`` naming the known ids when there is none."""
        try:
            return self._by_id[subtopology_id]
        except KeyError:
            raise NotInTopologyError(
                f"no subtopology {subtopology_id!r} (known: {sorted(self._by_id)})"
            ) from None

    @property
    def subtopology_ids(self) -> tuple[int, ...]:
        """All subtopology ids, ascending."""
        return tuple(sub.id for sub in self.subtopologies)

    @property
    def source_topics(self) -> frozenset[str]:
        """Every topic some subtopology reads (external and repartition topics)."""
        return frozenset(self._owner)

    @property
    def external_source_topics(self) -> frozenset[str]:
        """Source topics that are not repartition topics: their counts come from the cluster."""
        return frozenset(t for t in self._owner if t not in self.repartition_topics)

    @property
    def stateful_subtopologies(self) -> frozenset[int]:
        """Ids of the subtopologies with at least one store (their tasks are stateful)."""
        return frozenset(sub.id for sub in self.subtopologies if sub.stores)

    @property
    def stores(self) -> frozenset[str]:
        """Every store of every subtopology."""
        return frozenset(self._store_owner)

    def subtopology_of_store(self, store: str) -> int:
        """Id of the subtopology that owns ``store``; ``KeyError`` if no subtopology has it."""
        try:
            return self._store_owner[store]
        except KeyError:
            raise NotInTopologyError(f"{store!r} is not a store of the topology") from None

    def subtopology_of(self, topic: str) -> int:
        """Id of the subtopology that reads ``topic``; ``KeyError`` if no subtopology reads it."""
        try:
            return self._owner[topic]
        except KeyError:
            raise NotInTopologyError(f"{topic!r} is not a source topic of the topology") from None

    def task_of(self, partition: TopicPartition) -> TaskId:
        """The task that owns a source partition: ``TaskId(subtopology_of(topic), partition)``."""
        return TaskId(self.subtopology_of(partition.topic), partition.partition)

    def writers(self, repartition_topic: str) -> tuple[int, ...]:
        """Ids of the subtopologies that write ``repartition_topic`` (possibly none)."""
        if repartition_topic not in self.repartition_topics:
            raise NotInTopologyError(
                f"{repartition_topic!r} is not a repartition topic of the topology"
            )
        return self._writers.get(repartition_topic, ())

    def copartition_group_of(self, topic: str) -> tuple[str, ...] | None:
        """The (merged) co-partition group containing ``topic``, or ``None``."""
        for group in self.copartition_groups:
            if topic in group:
                return group
        return None

    def changelog_topic(self, store: str) -> str:
        """Changelog topic of one of the topology's stores: ``<name>-<store>-changelog``.

        Raises ``TopologyError`` when the topology has no name (changelog names need the
        application id) and ``KeyError`` when ``store`` is not one of its stores.
        """
        if not self.name:
            raise TopologyError(
                f"the topology has no name, so the changelog topic of store {store!r} is unknown "
                "(changelog topics are named '<name>-<store>-changelog'; set Topology(name=...) "
                "to the application id)"
            )
        self.subtopology_of_store(store)
        return changelog_topic_name(self.name, store)

    def changelog_topics(self, subtopology_id: int) -> tuple[str, ...]:
        """Changelog topics of one subtopology's stores, sorted (empty if it is stateless)."""
        return tuple(self.changelog_topic(s) for s in self.subtopology(subtopology_id).stores)

    # -- (de)serialisation -------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> Topology:
        """Build from the TOML document structure (see ``docs/topology.md``).

        An optional ``partitions`` table is validated but not kept (it is a deployment default;
        use :meth:`TopologyFile.from_dict` to get it). ``source`` prefixes error messages.
        """
        return TopologyFile.from_dict(data, source).topology

    @classmethod
    def load(cls, path: str | Path) -> Topology:
        """Read a topology TOML file (:func:`load_topology_file` also gives ``[partitions]``)."""
        return load_topology_file(path).topology

    def to_dict(self) -> dict[str, Any]:
        """The TOML document structure of this topology (``from_dict(t.to_dict()) == t``)."""
        doc: dict[str, Any] = {}
        if self.name:
            doc["name"] = self.name
        if self.copartition_groups:
            doc["copartition_groups"] = [list(g) for g in self.copartition_groups]
        doc["subtopology"] = [
            {
                "id": sub.id,
                "source_topics": list(sub.source_topics),
                "stores": list(sub.stores),
                "sink_topics": list(sub.sink_topics),
            }
            for sub in self.subtopologies
        ]
        if self.repartition_topics:
            doc["repartition_topic"] = [
                {"name": t} if n is None else {"name": t, "partitions": n}
                for t, n in self.repartition_topics.items()
            ]
        return doc


# -- TOML files ------------------------------------------------------------------------------------

_TOP_KEYS = ("name", "copartition_groups", "subtopology", "repartition_topic", "partitions")
_SUBTOPOLOGY_KEYS = ("id", "source_topics", "stores", "sink_topics")
_REPARTITION_KEYS = ("name", "partitions")


class TopologyFile(NamedTuple):
    """A topology file's content: the topology and its default external partition counts.

    ``partitions`` holds the ``[partitions]`` table (topic -> count), used by the CLI and examples
    when no live counts are given; it is kept apart because it describes a deployment, not the
    application.
    """

    topology: Topology
    partitions: Mapping[str, int]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> TopologyFile:
        """Validate the document structure and build both parts; errors start with ``source``."""
        return _parse_document(data, source)


def load_topology_file(path: str | Path) -> TopologyFile:
    """Read a topology TOML file: the topology and its ``[partitions]`` defaults (may be empty).

    Every way the file can be bad (unreadable, not UTF-8, invalid TOML, nested too deep, larger
    than ``MAX_TOML_BYTES``, wrong structure) raises ``TopologyError`` naming the file."""
    return read_topology_file(path)[0]


def read_topology_file(path: str | Path) -> tuple[TopologyFile, str]:
    """``load_topology_file``'s content and the SHA-256 (hex) of the bytes it was parsed from."""
    document, sha256 = read_toml(path, TopologyError, "topology file")
    return _parse_document(document, str(path)), sha256


def _check_keys(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = [k for k in table if k not in allowed]
    if unknown:
        raise TopologyError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {_join(unknown)} "
            f"(allowed: {', '.join(allowed)})"
        )


def _tables(data: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise TopologyError(f"{where}: '{key}' must be an array of tables, written [[{key}]]")
    return value


def _str_list(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TopologyError(f"{where} must be a list of strings, got {value!r}")
    return value


def _positive_int(value: object, where: str) -> int:
    """A partition count: an int in ``[1, 2**31)``."""
    return _check_int(value, 1, where, "an integer >= 1")


def _parse_document(data: Mapping[str, Any], source: str) -> TopologyFile:
    if not isinstance(data, Mapping):
        raise TopologyError(f"{source}: a topology document must be a table, got {data!r}")
    _check_keys(data, _TOP_KEYS, f"{source}: top level")
    name = data.get("name", "")
    if not isinstance(name, str):
        raise TopologyError(f"{source}: 'name' must be a string, got {name!r}")
    groups_value = data.get("copartition_groups", [])
    if not isinstance(groups_value, list):
        raise TopologyError(
            f"{source}: 'copartition_groups' must be a list of topic lists, got {groups_value!r}"
        )
    groups = [
        _str_list(g, f"{source}: copartition_groups[{i}]") for i, g in enumerate(groups_value)
    ]
    subtopologies = _parse_subtopologies(data, source)
    repartition = _parse_repartition_topics(data, source)
    try:
        topology = Topology(subtopologies, groups, repartition, name)
    except (TypeError, ValueError) as exc:
        raise TopologyError(f"{source}: {exc}") from exc
    return TopologyFile(topology, _parse_partitions(data, source, topology))


def _parse_subtopologies(data: Mapping[str, Any], source: str) -> list[Subtopology]:
    """The document's ``[[subtopology]]`` tables."""
    subtopologies: list[Subtopology] = []
    for i, table in enumerate(_tables(data, "subtopology", source), start=1):
        where = f"{source}: [[subtopology]] #{i}"
        _check_keys(table, _SUBTOPOLOGY_KEYS, where)
        for required in ("id", "source_topics"):
            if required not in table:
                raise TopologyError(f"{where}: missing required key {required!r}")
        sub_id = table["id"]
        _check_int(sub_id, 0, f"{where}: 'id'", "an integer >= 0")
        where = f"{source}: subtopology {sub_id}"
        # Outside the try: these errors already start with ``where``.
        sources = _str_list(table["source_topics"], f"{where}: 'source_topics'")
        stores = _str_list(table.get("stores", []), f"{where}: 'stores'")
        sinks = _str_list(table.get("sink_topics", []), f"{where}: 'sink_topics'")
        try:
            subtopologies.append(Subtopology(sub_id, sources, stores, sinks))
        except (TypeError, ValueError) as exc:  # TopologyError too: the message names the file
            reason = str(exc).removeprefix(f"subtopology {sub_id}: ")  # ``where`` names it
            raise TopologyError(f"{where}: {reason}") from exc
    return subtopologies


def _parse_repartition_topics(data: Mapping[str, Any], source: str) -> dict[str, int | None]:
    """The document's ``[[repartition_topic]]`` tables: name -> fixed count (None: computed)."""
    repartition: dict[str, int | None] = {}
    for i, table in enumerate(_tables(data, "repartition_topic", source), start=1):
        where = f"{source}: [[repartition_topic]] #{i}"
        _check_keys(table, _REPARTITION_KEYS, where)
        if "name" not in table:
            raise TopologyError(f"{where}: missing required key 'name'")
        topic = table["name"]
        if not isinstance(topic, str):
            raise TopologyError(f"{where}: 'name' must be a string, got {topic!r}")
        if topic in repartition:
            raise TopologyError(f"{where}: repartition topic {topic!r} is declared twice")
        count = table.get("partitions")
        repartition[topic] = (
            None if count is None else _positive_int(count, f"{where} ({topic!r}): 'partitions'")
        )
    return repartition


def _parse_partitions(data: Mapping[str, Any], source: str, topology: Topology) -> dict[str, int]:
    """The document's ``[partitions]`` table: counts of external source topics."""
    partitions_value = data.get("partitions", {})
    if not isinstance(partitions_value, Mapping):
        raise TopologyError(
            f"{source}: 'partitions' must be a table of topic = count, got {partitions_value!r}"
        )
    partitions: dict[str, int] = {}
    externals = topology.external_source_topics
    for topic, count in sorted(partitions_value.items()):
        where = f"{source}: [partitions] {topic!r}"
        if topic in topology.repartition_topics:
            raise TopologyError(
                f"{where} is a repartition topic; its count is fixed in [[repartition_topic]] "
                "'partitions' or computed, not given in [partitions]"
            )
        if topic not in externals:
            raise TopologyError(f"{where} is not a source topic of any subtopology")
        partitions[topic] = _positive_int(count, where)
    return partitions
