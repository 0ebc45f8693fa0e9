"""The scenario model and churn-trace generation (pure Python: no Spark, no I/O).

A *trace* is what happens to one deployment of a topology over time: an initial assignment, then
a sequence of rebalances caused by events — scale out, scale in, a crash and the recovery that
follows, the steps of a rolling restart, a partition expansion, the loss of a whole rack. Events
arrive as a Poisson process whose rates, together with the fleet (size, thread counts, racks) and
the durations of outages, make up the :class:`ScenarioModel`; ``docs/pipeline.md`` documents every
parameter. A trace is a plain value, generated from ``random.Random`` seeded by (seed, scenario)
only, so the same seed gives the same trace on the driver, on any executor, on any machine.

Traces say *who is in the group and why*; they know nothing of assignors. The simulation
(``streamassign.pipeline.simulate``) replays one trace through each assignor.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from .. import TaskId
from ..errors import PipelineError, StreamAssignError, TopologyError
from ..files import load_toml
from ..grouper import resolve_partition_counts
from ..topology import Topology, read_topology_file

__all__ = [
    "EVENTS",
    "MAX_REPLICAS",
    "MAX_SCENARIOS",
    "MAX_STEPS",
    "SEED_RANGE",
    "Layout",
    "Member",
    "PipelineError",
    "Return",
    "ScenarioModel",
    "Step",
    "Trace",
    "Workload",
    "generate_trace",
    "trace_seed",
]

#: Event types, in the order the report lists them. ``initial`` is the first assignment.
EVENTS: Final = (
    "initial",
    "scale_out",
    "scale_in",
    "crash",
    "recover",
    "rolling_restart",
    "partition_expansion",
    "rack_loss",
)

_HOUR: Final = 3600.0


# -- the scenario model ----------------------------------------------------------------------------


#: An attrs validator of an int field.
IntValidator = Callable[[object, "attrs.Attribute[int]", int], None]


#: Traces of one run (``--scenarios``): a bound on one run's size, not on simulate's memory (its
#: scenario numbers go to Spark as a range). A million traces of 30 steps are 31 M rebalances
#: per assignor: about 37 hours at the 234/s two cores make, 45 minutes on 100 cores;
#: plan-standbys holds its (scenario, candidate) items on the driver (277 MiB for a million x
#: 4 candidates). More traces: more runs, each with its own seed (docs/pipeline.md, Limits).
MAX_SCENARIOS: Final = 1_000_000
#: Rebalances of one trace (``steps``): a trace is generated and simulated on one core, where
#: 100,000 steps take about 6 minutes per assignor (294 rebalances/s on ``local[1]``,
#: docs/pipeline.md); the ``step`` column is a 32-bit int.
MAX_STEPS: Final = 100_000
#: Standby and warmup replicas (``--standbys``, ``--warmups``): a task has at most one replica
#: per other client, and clients are at most 100,000 (``preflight.MAX_CLIENTS``); the columns
#: holding them are 32-bit ints, which larger values would wrap.
MAX_REPLICAS: Final = 100_000
#: ``--seed`` is stored in a 64-bit ``seed`` column.
SEED_RANGE: Final = (-(2**63), 2**63 - 1)


def int_at_least(low: int, context: str = "", high: int | None = None) -> IntValidator:
    """An attrs validator: an integer (not a bool) ``>= low`` (and ``<= high`` if given), else a
    :class:`PipelineError` naming the field after ``context``. Shared by the pipeline's jobs
    and models."""

    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise PipelineError(
                f"{context}{attribute.name} must be an integer >= {low}, got {value!r}"
            )
        if high is not None and value > high:
            raise PipelineError(
                f"{context}{attribute.name} must be at most {high:,}, got {value:,}"
            )

    return check


def seed_in_range(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    """An attrs validator: an integer in :data:`SEED_RANGE` (a 64-bit ``seed`` column)."""
    low, high = SEED_RANGE
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise PipelineError(
            f"{attribute.name} must be an integer from -2**63 to 2**63 - 1 (it is stored as a "
            f"64-bit number), got {value!r}"
        )


def _int_at_least(low: int) -> IntValidator:
    return int_at_least(low, "scenario model: ")


def _number_at_least(low: float) -> Any:
    def check(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < low:
            raise PipelineError(
                f"scenario model: {attribute.name} must be a finite number >= {low:g}, "
                f"got {value!r}"
            )

    return check


def _probability(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not 0.0 <= value <= 1.0:
        raise PipelineError(
            f"scenario model: {attribute.name} must be a probability in [0, 1], got {value!r}"
        )


def _thread_choices(value: Iterable[int] | int) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,)
    return tuple(value)


def _check_threads(
    instance: object, attribute: attrs.Attribute[Any], value: tuple[int, ...]
) -> None:
    if not value or any(not isinstance(t, int) or isinstance(t, bool) or t < 1 for t in value):
        raise PipelineError(
            f"scenario model: threads must be a non-empty list of integers >= 1 (the thread "
            f"counts a new client picks from), got {list(value)!r}"
        )


@attrs.frozen(kw_only=True)
class ScenarioModel:
    """How a deployment churns: fleet, event rates, outage durations and the state model.

    Rates are per hour of simulated time (the crash rate per client per hour); durations are in
    seconds; record counts are changelog records. Every parameter is documented, with what each
    event does, in ``docs/pipeline.md``. Construction validates each value and raises
    :class:`PipelineError` naming the parameter.
    """

    #: Rebalances per trace after the initial assignment (a trace may end earlier when no event
    #: is possible, e.g. every rate is for an event the fleet bounds forbid).
    steps: int = attrs.field(default=30, validator=int_at_least(0, "scenario model: ", MAX_STEPS))
    #: Initial fleet size, uniform in [min_initial_clients, max_initial_clients].
    min_initial_clients: int = attrs.field(default=3, validator=_int_at_least(1))
    max_initial_clients: int = attrs.field(default=6, validator=_int_at_least(1))
    #: Scale-in never goes below min_clients; scale-out never above max_clients (counting
    #: crashed clients that will come back). Crashes and rack losses keep at least one client.
    min_clients: int = attrs.field(default=2, validator=_int_at_least(1))
    max_clients: int = attrs.field(default=10, validator=_int_at_least(1))
    #: Thread counts a client picks from, uniformly (its capacity).
    threads: tuple[int, ...] = attrs.field(
        default=(1, 2, 4), converter=_thread_choices, validator=_check_threads
    )
    #: Racks clients are spread over, round robin in order of creation.
    racks: int = attrs.field(default=3, validator=_int_at_least(1))
    #: A scale event adds or removes 1..max_scale_step clients (uniform).
    max_scale_step: int = attrs.field(default=2, validator=_int_at_least(1))
    scale_out_per_hour: float = attrs.field(default=0.5, validator=_number_at_least(0))
    scale_in_per_hour: float = attrs.field(default=0.5, validator=_number_at_least(0))
    #: Per client: a fleet of n clients crashes at n times this rate.
    crash_per_client_hour: float = attrs.field(default=0.05, validator=_number_at_least(0))
    rolling_restart_per_hour: float = attrs.field(default=0.1, validator=_number_at_least(0))
    expansion_per_hour: float = attrs.field(default=0.02, validator=_number_at_least(0))
    rack_loss_per_hour: float = attrs.field(default=0.01, validator=_number_at_least(0))
    #: How long one client of a rolling restart is down before it rejoins.
    restart_downtime_s: float = attrs.field(default=60.0, validator=_number_at_least(0))
    #: How long a crashed client stays away before it rejoins (one ``recover`` rebalance).
    crash_downtime_s: float = attrs.field(default=600.0, validator=_number_at_least(0))
    #: How long a lost rack stays away before all its clients rejoin together.
    rack_downtime_s: float = attrs.field(default=1800.0, validator=_number_at_least(0))
    #: Chance that a crashed client comes back without its local state (disk or node replaced).
    disk_loss_probability: float = attrs.field(default=0.25, validator=_probability)
    #: A partition expansion multiplies the partition count of one co-partitioned set of
    #: external topics by this factor ...
    expansion_factor: int = attrs.field(default=2, validator=_int_at_least(2))
    #: ... as long as no topic grows beyond this multiple of its initial count.
    expansion_limit: int = attrs.field(default=4, validator=_int_at_least(1))
    #: Mean changelog size of a stateful task at the start of a trace, in records.
    changelog_records: int = attrs.field(default=1_000_000, validator=_int_at_least(0))
    #: Mean rate at which a stateful task's changelog grows, records per second.
    write_rate: float = attrs.field(default=50.0, validator=_number_at_least(0))
    #: Log-normal sigma of the per-task weight (mean 1) scaling both size and write rate: hot
    #: partitions are bigger and busier. 0 makes every task the same.
    size_skew: float = attrs.field(default=1.0, validator=_number_at_least(0))
    #: How far behind the changelog end a running standby is, in records.
    standby_lag_records: int = attrs.field(default=1_000, validator=_int_at_least(0))

    def __attrs_post_init__(self) -> None:
        if not self.min_clients <= self.min_initial_clients <= self.max_initial_clients:
            raise PipelineError(
                "scenario model: need min_clients <= min_initial_clients <= max_initial_clients, "
                f"got {self.min_clients}, {self.min_initial_clients}, {self.max_initial_clients}"
            )
        if self.max_initial_clients > self.max_clients:
            raise PipelineError(
                f"scenario model: max_initial_clients ({self.max_initial_clients}) exceeds "
                f"max_clients ({self.max_clients})"
            )
        if self.steps and not any(self.rates().values()):
            raise PipelineError(
                "scenario model: every event rate is 0, so no rebalance can happen after the "
                "initial one; set a rate > 0 or steps = 0"
            )

    def rates(self) -> dict[str, float]:
        """Configured rate of each random event type (crash: per client), per hour."""
        return {
            "scale_out": self.scale_out_per_hour,
            "scale_in": self.scale_in_per_hour,
            "crash": self.crash_per_client_hour,
            "rolling_restart": self.rolling_restart_per_hour,
            "partition_expansion": self.expansion_per_hour,
            "rack_loss": self.rack_loss_per_hour,
        }

    @classmethod
    def parameter_names(cls) -> tuple[str, ...]:
        """Every parameter, in declaration order."""
        return tuple(a.name for a in attrs.fields(cls))

    def evolve(self, params: Mapping[str, object]) -> ScenarioModel:
        """A copy with ``params`` changed; values may be strings (``"1,2,4"``, ``"0.5"``), as
        given on a command line or in a TOML file. Unknown names raise :class:`PipelineError`."""
        fields = {a.name: a for a in attrs.fields(ScenarioModel)}
        changes: dict[str, Any] = {}
        for name, raw in params.items():
            field = fields.get(name)
            if field is None:
                raise PipelineError(
                    f"scenario model: unknown parameter {name!r}; known: " + ", ".join(fields)
                )
            changes[name] = _parse_value(name, field.default, raw)
        return attrs.evolve(self, **changes)

    @classmethod
    def load(cls, path: str | Path, params: Mapping[str, object] | None = None) -> ScenarioModel:
        """A model from a TOML file of ``parameter = value`` lines, then ``params`` on top."""
        data = load_toml(path, PipelineError, "scenario model")
        try:
            return cls().evolve({**data, **(params or {})})
        except PipelineError as exc:
            raise PipelineError(f"{path}: {exc}") from exc


def _parse_value(name: str, default: object, raw: object) -> object:
    """``raw`` (a TOML value or a command-line string) as the type of ``default``."""
    if not isinstance(raw, str):
        if isinstance(default, tuple) and isinstance(raw, list):
            return tuple(raw)
        if isinstance(default, float) and isinstance(raw, int) and not isinstance(raw, bool):
            return float(raw)
        return raw
    text = raw.strip()
    try:
        if isinstance(default, tuple):
            return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
        if isinstance(default, int) and not isinstance(default, bool):
            return int(text.replace("_", ""))
        if not isinstance(default, bool):  # a flag is never given as text
            return float(text.replace("_", ""))
    except ValueError:
        pass
    kind = (
        "a list of integers such as 1,2,4"
        if isinstance(default, tuple)
        else ("an integer" if isinstance(default, int) else "a number")
    )
    raise PipelineError(f"scenario model: {name} must be {kind}, got {raw!r}")


# -- the workload: a topology and how its partition counts may grow --------------------------------


@attrs.frozen
class Layout:
    """Tasks and source partitions for one set of partition counts (changes on expansion).

    ``version`` counts expansions (0 = the initial counts). ``topics`` lists every source topic
    (external and repartition) as ``(topic, subtopology, partitions)``, sorted by topic.
    """

    version: int
    counts: tuple[tuple[str, int], ...]
    task_counts: tuple[tuple[int, int], ...]
    topics: tuple[tuple[str, int, int], ...]
    stateful_subtopologies: frozenset[int]

    def tasks(self) -> list[TaskId]:
        """Every task, sorted."""
        return [TaskId(s, p) for s, n in self.task_counts for p in range(n)]

    def stateful_tasks(self) -> list[TaskId]:
        """Tasks of subtopologies with a store, sorted."""
        return [
            TaskId(s, p)
            for s, n in self.task_counts
            if s in self.stateful_subtopologies
            for p in range(n)
        ]

    @property
    def partitions(self) -> int:
        """Source partitions (what a consumer-level assignor assigns)."""
        return sum(n for _, _, n in self.topics)


@attrs.frozen
class Workload:
    """A topology, its initial external partition counts and the units that can expand.

    ``units`` are sets of external topics whose counts change together: a co-partition group's
    external topics, or a single external topic. Built (and validated) on the driver by
    :meth:`from_topology` / :meth:`from_file`; shipped to executors as a plain value.
    """

    topology: Topology
    counts: tuple[tuple[str, int], ...]
    units: tuple[tuple[str, ...], ...]
    name: str
    #: SHA-256 (hex) of the topology file's bytes that were parsed (:meth:`from_file`), for
    #: the run's manifest: hashing the file again later could hash an edited one.
    file_sha256: str = ""

    @classmethod
    def from_topology(
        cls, topology: Topology, counts: Mapping[str, int], name: str = "", source: str = ""
    ) -> Workload:
        """Validate that ``counts`` group ``topology`` into at least one task (``plan`` checks
        its input with this too). Errors start with ``source`` (a file name) when given."""
        where = f"{source}: " if source else ""
        try:
            topology.check_has_tasks(source, name)
        except TopologyError as exc:
            raise PipelineError(str(exc)) from exc
        externals = sorted(topology.external_source_topics)
        missing = [t for t in externals if t not in counts]
        if missing:
            raise PipelineError(
                f"{where}topology {name or topology.name or '?'}: no partition count for "
                f"external topics {', '.join(missing)} (add them to the file's [partitions] "
                "table or pass --partitions TOPIC=N)"
            )
        initial = tuple((t, counts[t]) for t in externals)
        grouped: set[str] = set()
        units: list[tuple[str, ...]] = []
        for group in topology.copartition_groups:
            members = tuple(t for t in group if t in topology.external_source_topics)
            if members:
                units.append(members)
                grouped.update(members)
        units.extend((t,) for t in externals if t not in grouped)
        workload = cls(topology, initial, tuple(sorted(units)), name or topology.name)
        try:
            workload.layout(dict(initial), 0)  # only whether the counts group
        except (StreamAssignError, ValueError) as exc:
            raise PipelineError(
                f"{where}topology {workload.name or '?'} fails grouping: {exc}"
            ) from exc
        return workload

    @classmethod
    def from_file(cls, path: str | Path, overrides: Mapping[str, int] | None = None) -> Workload:
        """Read a topology TOML file; ``overrides`` replace counts of its ``[partitions]``."""
        try:
            loaded, sha256 = read_topology_file(path)
        except OSError as exc:
            raise PipelineError(f"{path}: cannot read the topology: {exc}") from exc
        except TopologyError as exc:
            raise PipelineError(str(exc)) from exc
        counts = {**loaded.partitions, **(overrides or {})}
        unknown = sorted(set(overrides or {}) - loaded.topology.external_source_topics)
        if unknown:
            raise PipelineError(
                f"{path}: --partitions names topics that are not external source topics of the "
                f"topology: {', '.join(unknown)}"
            )
        name = loaded.topology.name or Path(path).stem
        workload = cls.from_topology(loaded.topology, counts, name, str(path))
        return attrs.evolve(workload, file_sha256=sha256)

    def layout(self, counts: Mapping[str, int], version: int) -> Layout:
        """Tasks and partitions for these external counts (raises like the grouper)."""
        resolved = resolve_partition_counts(self.topology, counts)
        topo = self.topology
        task_counts = tuple(
            (sub.id, max(resolved[t] for t in sub.source_topics)) for sub in topo.subtopologies
        )
        topics = tuple(sorted((t, topo.subtopology_of(t), n) for t, n in resolved.items()))
        return Layout(
            version,
            tuple(sorted(counts.items())),
            task_counts,
            topics,
            topo.stateful_subtopologies,
        )

    def initial_layout(self) -> Layout:
        return self.layout(dict(self.counts), 0)


# -- traces ----------------------------------------------------------------------------------------


@attrs.frozen
class Member:
    """A client (process) in the group: its id, thread count and rack."""

    pid: str
    threads: int
    rack: str


@attrs.frozen
class Return:
    """A client rejoining after an outage that began at ``down_since_s``.

    ``disk_kept``: it still has the local state it had then (otherwise it comes back empty).
    A rolling restart's client was in the group before this step; a recovering one was not.
    """

    pid: str
    down_since_s: float
    disk_kept: bool


@attrs.frozen
class Step:
    """One rebalance: the group after ``event`` at ``time_s`` seconds, and how it got there.

    ``members`` are sorted by process id. ``joined`` are new clients (never seen before),
    ``left`` left for good (their state is discarded), ``crashed`` are gone for now (their state
    stays on disk until they return), ``returning`` rejoin after an outage.
    """

    index: int
    time_s: float
    event: str
    members: tuple[Member, ...]
    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    crashed: tuple[str, ...] = ()
    returning: tuple[Return, ...] = ()
    layout: Layout | None = None  # None: unchanged since the previous step

    @property
    def clients(self) -> int:
        return len(self.members)

    @property
    def threads(self) -> int:
        return sum(m.threads for m in self.members)


@attrs.frozen
class Trace:
    """One scenario: its id, the seed that generated it, and its rebalances in order.

    ``state_seed`` seeds the per-task state weights (changelog size and write rate).
    """

    scenario: int
    seed: int
    state_seed: int
    steps: tuple[Step, ...]

    def layouts(self) -> list[Layout]:
        """The layout in force at each step."""
        out: list[Layout] = []
        for step in self.steps:
            out.append(step.layout if step.layout is not None else out[-1])
        return out


def trace_seed(seed: int, scenario: int) -> str:
    """The string ``random.Random`` is seeded with for one scenario (SHA-512 hashed: stable
    across processes, platforms and ``PYTHONHASHSEED``)."""
    return f"streamassign-pipeline/{seed}/{scenario}"


class _Fleet:
    """Mutable state of one trace being generated (local to :func:`generate_trace`)."""

    def __init__(self, model: ScenarioModel, rng: random.Random) -> None:
        self.model = model
        self.rng = rng
        self.present: dict[str, Member] = {}
        self.down: dict[str, Member] = {}
        self.created = 0

    def new_member(self) -> Member:
        n = self.created
        self.created += 1
        threads = self.rng.choice(self.model.threads)
        return Member(f"p{n:04d}", threads, f"rack-{n % self.model.racks}")

    def members(self) -> tuple[Member, ...]:
        return tuple(sorted(self.present.values(), key=lambda m: m.pid))


def _possible_rates(
    model: ScenarioModel,
    fleet: _Fleet,
    restart_running: bool,
    expandable: list[tuple[str, ...]],
) -> list[tuple[str, float]]:
    """Events possible now with their current rates (per hour), in a fixed order."""
    n = len(fleet.present)
    out: list[tuple[str, float]] = []
    if n + len(fleet.down) < model.max_clients:
        out.append(("scale_out", model.scale_out_per_hour))
    if n > model.min_clients:
        out.append(("scale_in", model.scale_in_per_hour))
    if n >= 2:
        out.append(("crash", model.crash_per_client_hour * n))
        racks = {m.rack for m in fleet.present.values()}
        if len(racks) >= 2:
            out.append(("rack_loss", model.rack_loss_per_hour))
    if not restart_running:
        out.append(("rolling_restart", model.rolling_restart_per_hour))
    if expandable:
        out.append(("partition_expansion", model.expansion_per_hour))
    return [(e, r) for e, r in out if r > 0]


def generate_trace(model: ScenarioModel, workload: Workload, scenario: int, seed: int = 0) -> Trace:
    """The trace of one scenario: deterministic for (model, workload, scenario, seed).

    A discrete-event simulation: random events arrive at exponential intervals with the total
    rate of the events possible at that moment (see :func:`_possible_rates`); scheduled events
    (recoveries, the next client of a rolling restart) fire at their time. Each event that
    changes the group is one rebalance (:class:`Step`).
    """
    rng = random.Random(trace_seed(seed, scenario))
    state_seed = rng.getrandbits(63)
    trace = _TraceBuilder(model, workload, rng)
    while len(trace.steps) <= model.steps:
        possible = _possible_rates(model, trace.fleet, bool(trace.restarting), trace.expandable)
        total = sum(r for _, r in possible)
        random_at = trace.now + rng.expovariate(total / _HOUR) if total > 0 else math.inf
        if trace.pending and trace.pending[0][0] <= random_at:
            trace.fire_scheduled()
            continue
        if total <= 0:
            break  # nothing can happen any more
        trace.now = random_at
        pick = rng.uniform(0, total)
        event = possible[-1][0]
        for name, rate in possible:
            if pick < rate:
                event = name
                break
            pick -= rate
        trace.fire_random(event)
    return Trace(scenario, seed, state_seed, tuple(trace.steps))


class _TraceBuilder:
    """``generate_trace``'s state: the fleet, the topic counts, the steps so far and the
    scheduled events; one method per kind of event (each draws from ``rng`` in a fixed order,
    so a trace is deterministic)."""

    def __init__(self, model: ScenarioModel, workload: Workload, rng: random.Random) -> None:
        self.model, self.workload, self.rng = model, workload, rng
        self.fleet = fleet = _Fleet(model, rng)
        for _ in range(rng.randint(model.min_initial_clients, model.max_initial_clients)):
            member = fleet.new_member()
            fleet.present[member.pid] = member
        layout = workload.initial_layout()
        self.counts = dict(workload.counts)
        self.initial = dict(workload.counts)
        self.layouts: dict[tuple[tuple[str, int], ...], Layout] = {layout.counts: layout}
        self.steps = [
            Step(0, 0.0, "initial", fleet.members(), joined=tuple(fleet.present), layout=layout)
        ]
        # Scheduled events: (time, sequence, kind, pids, down_since).
        self.pending: list[tuple[float, int, str, tuple[str, ...], float]] = []
        self.sequence = 0
        self.restarting: set[str] = set()  # clients a rolling restart has yet to restart
        self.now = 0.0
        self.expandable = self.expansions()

    def expansions(self) -> list[tuple[str, ...]]:
        """The units of topics whose counts can still grow (within the limit, resolvable)."""
        model, counts = self.model, self.counts
        ok = []
        for unit in self.workload.units:
            grown = {t: counts[t] * model.expansion_factor for t in unit}
            if any(n > self.initial[t] * model.expansion_limit for t, n in grown.items()):
                continue
            try:
                resolve_partition_counts(self.workload.topology, {**counts, **grown})
            except (StreamAssignError, ValueError):
                continue
            ok.append(unit)
        return ok

    def fire_scheduled(self) -> None:
        """The next scheduled event (a recovery, a rolling restart's next client)."""
        at, _, kind, pids, down_since = heapq.heappop(self.pending)
        self.now = at
        step = _scheduled(
            self.fleet, kind, pids, down_since, self.restarting, self.rng, len(self.steps), at
        )
        if step is not None:
            self.steps.append(step)

    def _schedule(self, at: float, kind: str, pids: tuple[str, ...], down_since: float) -> None:
        self.sequence += 1
        heapq.heappush(self.pending, (at, self.sequence, kind, pids, down_since))

    def fire_random(self, event: str) -> None:
        """A random event at ``now``."""
        if event == "scale_out":
            self._scale_out()
        elif event == "scale_in":
            self._scale_in()
        elif event in ("crash", "rack_loss"):
            self._crash(event)
        elif event == "rolling_restart":
            self._rolling_restart()
        else:  # partition_expansion
            self._expand()

    def _scale_out(self) -> None:
        model, fleet, rng = self.model, self.fleet, self.rng
        room = model.max_clients - len(fleet.present) - len(fleet.down)
        added = [fleet.new_member() for _ in range(min(room, rng.randint(1, model.max_scale_step)))]
        for m in added:
            fleet.present[m.pid] = m
        joined = tuple(m.pid for m in added)
        self.steps.append(
            Step(len(self.steps), self.now, "scale_out", fleet.members(), joined=joined)
        )

    def _scale_in(self) -> None:
        model, fleet, rng = self.model, self.fleet, self.rng
        k = min(len(fleet.present) - model.min_clients, rng.randint(1, model.max_scale_step))
        gone = sorted(rng.sample(sorted(fleet.present), k))
        for pid in gone:
            del fleet.present[pid]
            self.restarting.discard(pid)
        left = tuple(gone)
        self.steps.append(Step(len(self.steps), self.now, "scale_in", fleet.members(), left=left))

    def _crash(self, event: str) -> None:
        """A crash of one client, or of a whole rack; each recovers after its downtime."""
        model, fleet, rng = self.model, self.fleet, self.rng
        if event == "crash":
            gone = [rng.choice(sorted(fleet.present))]
            downtime = model.crash_downtime_s
        else:
            racks = sorted({m.rack for m in fleet.present.values()})
            rack = rng.choice(racks)
            gone = sorted(p for p, m in fleet.present.items() if m.rack == rack)
            downtime = model.rack_downtime_s
        for pid in gone:
            fleet.down[pid] = fleet.present.pop(pid)
            self.restarting.discard(pid)
        now = self.now
        self._schedule(now + downtime, "recover", tuple(gone), now)
        crashed = tuple(gone)
        self.steps.append(Step(len(self.steps), now, event, fleet.members(), crashed=crashed))

    def _rolling_restart(self) -> None:
        """Schedule a restart of every present client, one after the other."""
        model = self.model
        order = sorted(self.fleet.present)
        self.restarting.update(order)
        gap = max(model.restart_downtime_s, 1.0)
        for k, pid in enumerate(order, start=1):
            at = self.now + k * gap
            self._schedule(at, "restart", (pid,), at - model.restart_downtime_s)

    def _expand(self) -> None:
        """Multiply the partition counts of one expandable unit of topics."""
        unit = self.rng.choice(self.expandable)
        for t in unit:
            self.counts[t] *= self.model.expansion_factor
        key = tuple(sorted(self.counts.items()))
        layout = self.layouts.get(key) or self.workload.layout(self.counts, len(self.layouts))
        self.layouts[key] = layout
        self.expandable = self.expansions()
        members = self.fleet.members()
        self.steps.append(
            Step(len(self.steps), self.now, "partition_expansion", members, layout=layout)
        )


def _scheduled(
    fleet: _Fleet,
    kind: str,
    pids: tuple[str, ...],
    down_since: float,
    restarting: set[str],
    rng: random.Random,
    index: int,
    now: float,
) -> Step | None:
    """Apply a scheduled event; None when it no longer applies (its clients are gone)."""
    if kind == "restart":
        (pid,) = pids
        if pid not in restarting:
            return None  # left or crashed since the restart began
        restarting.discard(pid)
        return Step(
            index,
            now,
            "rolling_restart",
            fleet.members(),
            returning=(Return(pid, down_since, True),),
        )
    back = [pid for pid in pids if pid in fleet.down]
    returns = []
    for pid in back:
        fleet.present[pid] = fleet.down.pop(pid)
        kept = rng.random() >= fleet.model.disk_loss_probability
        returns.append(Return(pid, down_since, kept))
    if not returns:
        return None
    return Step(index, now, "recover", fleet.members(), returning=tuple(returns))
