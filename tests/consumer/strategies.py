"""Hypothesis strategies for consumer-assignor inputs, and the reference oracles the tests use.

The oracles are written from the semantics (Kafka's range and round robin, KIP-54's balance
definition, KIP-341's generation rule, the quota lower bound of DESIGN.md §3) and never call
streamassign's own helpers, so a bug in the library's shared plumbing cannot hide itself.
"""

from __future__ import annotations

import contextlib
import logging
import random
import signal
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import attrs
from hypothesis import strategies as st

from streamassign import TopicPartition
from streamassign.consumer import MemberData, Subscription

Assignment = Mapping[str, Sequence[TopicPartition]]

# Names chosen so that lexicographic order differs from "natural" order (t10 < t2, b < b0).
TOPICS = ("a", "b", "b0", "c", "orders", "t1", "t10", "t2")
MISSING_TOPICS = ("ghost", "zz-deleted")  # subscribed to, never in the metadata
HISTORY_KINDS = ("none", "previous", "dealt", "arbitrary")


def int_field_offset(name: str) -> int:
    """Byte offset of MemberData's int32 field ``name`` in its encoding, found by encoding two
    values (so the garbage below follows the wire format wherever the field sits)."""
    one = MemberData(**{name: 1}).encode()
    two = MemberData(**{name: 2}).encode()
    first = next(i for i, (x, y) in enumerate(zip(one, two, strict=True)) if x != y)
    return first - 3


def patched(data: bytes, offset: int, value: int) -> bytes:
    return data[:offset] + struct.pack(">i", value) + data[offset + 4 :]


_NINE = MemberData(priority=9, weight=9, owned_partitions=[("topic", 0)], generation=3).encode()

# User data that must decode to the defaults. All but the first two carry priority 9 and weight 9
# where a sloppy reader would take them from, so using them by mistake is visible.
GARBAGE_USER_DATA = (
    b"\x00",
    b"not member data",
    _NINE[:-1],  # truncated in the partition runs
    _NINE[: _NINE.index(b"topic") + 2],  # truncated in the topic name
    patched(_NINE, 0, 0),  # version 0
    patched(_NINE, 0, -1),  # version -1
    patched(_NINE, int_field_offset("weight"), 0),  # weight 0
    _NINE + b"trailing",  # version 1 with trailing bytes
)

# Member ids whose sort order is easy to get wrong: numeric-looking, prefixes, punctuation, case.
MEMBER_IDS = (
    "1", "10", "11", "111", "2", "9", "-", "A", "B", "a", "a-1", "a-10", "a-2", "b", "b0",
    "consumer-1-4f2a", "consumer-1-9c01", "consumer-10-0b7e", "z", "é",
)  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One assignor input plus the member parameters its user data encodes."""

    counts: dict[str, int]
    subs: dict[str, Subscription]
    weights: dict[str, int]  # effective weight (1 for empty or garbage user data)
    priorities: dict[str, int]  # effective failover priority (0 for empty or garbage)
    garbage: frozenset[str]  # members whose user data is garbage

    @property
    def missing(self) -> frozenset[str]:
        """Subscribed topics absent from the metadata."""
        wanted = frozenset().union(*(s.topics for s in self.subs.values()))
        return frozenset(wanted - self.counts.keys())


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    uniform: bool | None = None,
    history: Sequence[str] = HISTORY_KINDS,
    min_members: int = 1,
    max_members: int = 8,
    max_topics: int = 8,
    max_partitions: int = 12,
    weight_values: Sequence[int] = (1, 2, 3, 5, 6, 7, 10, 900),
    user_data: bool = True,
) -> Case:
    """Random input: topics, members, subscriptions, history and member parameters.

    ``uniform``: True — every member subscribes to the same existing topics (members may add
    missing ones); False — each member draws its own; None — either. History kinds: "none";
    "previous" — one consistent assignment at one generation over an older membership (members
    left and joined) and older partition counts, random owners, unowned partitions allowed;
    "dealt" — the same but balanced (shuffled partitions dealt round robin); "arbitrary" —
    random claims, duplicates, invalid topics/partitions, random generations.

    The shape (partition counts, member count, subscriptions, history kind) is drawn from
    hypothesis so that it shrinks; names, history and user data come from a seeded generator,
    which keeps each example cheap enough for the 2000-example CI profile. Failures print the
    whole ``Case``, so they reproduce without the seed.

    Weights are drawn from ``weight_values``, which mixes small ones that tie (3 and 6, 5 and
    10) with a 900 that dwarfs the rest: the weighted assignor's exact (rational) load keys
    must end its improving moves for any of them.
    """
    sizes = draw(st.lists(st.integers(0, max_partitions), min_size=1, max_size=max_topics))
    n_members = draw(st.integers(min_members, max_members))
    if uniform is None:
        uniform = draw(st.booleans())
    full = (1 << len(sizes)) - 1
    masks = draw(
        st.lists(
            st.integers(1 if uniform else 0, full),
            min_size=1 if uniform else n_members,
            max_size=1 if uniform else n_members,
        )
    )
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    names = rnd.sample(TOPICS, len(sizes))
    counts = dict(zip(names, sizes, strict=True))
    members = rnd.sample(MEMBER_IDS, n_members)
    topics = {
        m: {t for i, t in enumerate(names) if masks[0 if uniform else k] >> i & 1}
        for k, m in enumerate(members)
    }
    if rnd.random() < 0.5:
        for m in members:
            if rnd.random() < 0.3:
                topics[m].add(rnd.choice(MISSING_TOPICS))

    kind = draw(st.sampled_from(history))
    owned: dict[str, list[tuple[str, int]]] = {m: [] for m in members}
    generation = dict.fromkeys(members, -1)
    if kind in ("previous", "dealt"):
        old_counts = dict(counts)
        for t in sorted(names):  # some topics had other partition counts before
            if rnd.random() < 0.2:
                old_counts[t] = rnd.randint(0, max_partitions)
        if rnd.random() < 0.3:
            old_counts[rnd.choice(MISSING_TOPICS)] = rnd.randint(1, 4)
        stayed = [m for m in members if rnd.random() < 0.7]
        old_members = stayed + [f"gone{i}" for i in range(rnd.randint(0, 3))]
        old_owner: dict[tuple[str, int], str] = {}
        tps = [(t, p) for t in sorted(old_counts) for p in range(old_counts[t])]
        if old_members and kind == "previous":
            free = rnd.random()
            for tp in tps:
                if rnd.random() >= free:
                    old_owner[tp] = rnd.choice(old_members)
        elif old_members:
            rnd.shuffle(tps)
            for i, tp in enumerate(tps):
                old_owner[tp] = old_members[i % len(old_members)]
        gen = rnd.randint(0, 5)
        for tp, m in old_owner.items():
            if m in owned:
                owned[m].append(tp)
        for m in stayed:
            generation[m] = gen
    elif kind == "arbitrary":
        for m in members:
            if rnd.random() < 0.7:
                generation[m] = rnd.randint(-1, 4)
                for _ in range(rnd.randint(0, 12)):
                    topic = rnd.choice(sorted(names) + list(MISSING_TOPICS))
                    owned[m].append((topic, rnd.randint(-1, max_partitions + 1)))

    weights = dict.fromkeys(members, 1)
    priorities = dict.fromkeys(members, 0)
    garbage: set[str] = set()
    data = dict.fromkeys(members, b"")
    if user_data:
        for m in members:
            choice = rnd.random()
            if choice < 0.6:
                weights[m] = rnd.choice(weight_values)
                priorities[m] = rnd.randint(-2, 2)
                data[m] = MemberData(priority=priorities[m], weight=weights[m]).encode()
            elif choice < 0.75:
                data[m] = rnd.choice(GARBAGE_USER_DATA)
                garbage.add(m)
    subs = {
        m: Subscription(frozenset(topics[m]), tuple(owned[m]), generation[m], user_data=data[m])
        for m in members
    }
    return Case(counts, subs, weights, priorities, frozenset(garbage))


def shuffled(
    counts: Mapping[str, int], subs: Mapping[str, Subscription], rnd: random.Random
) -> tuple[dict[str, int], dict[str, Subscription]]:
    """The same input built in another order: dict orders, topic sets and owned lists."""
    counts2 = dict(rnd.sample(list(counts.items()), len(counts)))
    subs2: dict[str, Subscription] = {}
    for m in rnd.sample(list(subs), len(subs)):
        s = subs[m]
        topics = list(s.topics)
        rnd.shuffle(topics)
        owned = list(s.owned_partitions)
        rnd.shuffle(owned)
        subs2[m] = Subscription(topics, owned, s.generation, s.rack, s.user_data)
    return counts2, subs2


def with_history(
    subs: Mapping[str, Subscription], assignment: Assignment, generation: int
) -> dict[str, Subscription]:
    """Members report ``assignment`` as owned at ``generation`` (the next rebalance's input)."""
    return {
        m: Subscription(s.topics, assignment.get(m, ()), generation, s.rack, s.user_data)
        for m, s in subs.items()
    }


# --------------------------------------------------------------------------- reference oracles


def existing_topics(counts: Mapping[str, int], sub: Subscription) -> frozenset[str]:
    return frozenset(t for t in sub.topics if t in counts)


def assignable(counts: Mapping[str, int], subs: Mapping[str, Subscription]) -> set[TopicPartition]:
    """Every partition of every existing topic with at least one subscriber."""
    wanted = set().union(*(s.topics for s in subs.values())) if subs else set()
    return {TopicPartition(t, p) for t, n in counts.items() if t in wanted for p in range(n)}


def owners(assignment: Assignment) -> dict[TopicPartition, str]:
    """Partition -> member; fails when a partition is given twice."""
    out: dict[TopicPartition, str] = {}
    for m, tps in assignment.items():
        for tp in tps:
            assert tp not in out, f"{tp} given to both {out[tp]!r} and {m!r}"
            out[tp] = m
    return out


def resolved_previous(
    counts: Mapping[str, int], subs: Mapping[str, Subscription]
) -> dict[TopicPartition, str]:
    """Previous owner of each partition per KIP-341: valid claims only (subscribed topic that
    exists, partition in range); the highest generation wins, ties to the smallest member id."""
    best: dict[TopicPartition, tuple[int, str]] = {}
    for m, s in subs.items():
        mine = existing_topics(counts, s)
        for topic, p in s.owned_partitions:
            if topic not in mine or not 0 <= p < counts[topic]:
                continue
            tp = TopicPartition(topic, p)
            key = (-s.generation, m)
            if tp not in best or key < best[tp]:
                best[tp] = key
    return {tp: m for tp, (_, m) in best.items()}


def check_contract(
    counts: Mapping[str, int],
    subs: Mapping[str, Subscription],
    assignment: Assignment,
    may_withhold: set[TopicPartition] | None = None,
) -> None:
    """What every assignor guarantees (DESIGN.md §2): every member present, nothing foreign,
    every assignable partition exactly once (partitions in ``may_withhold`` at most once), lists
    in (topic, partition) order."""
    assert set(assignment) == set(subs), "members in the result differ from the group"
    given = owners(assignment)
    for m, tps in assignment.items():
        allowed = existing_topics(counts, subs[m])
        for tp in tps:
            assert tp.topic in allowed, f"{m!r} got {tp} of a topic it does not subscribe to"
            assert 0 <= tp.partition < counts[tp.topic], f"{tp} does not exist"
        assert list(tps) == sorted(tps), f"{m!r}'s partitions are not in (topic, partition) order"
        assert all(type(tp) is TopicPartition for tp in tps)
    expected = assignable(counts, subs)
    missing = expected - set(given) - (may_withhold or set())
    extra = set(given) - expected
    assert not missing and not extra, f"missing {sorted(missing)}, extra {sorted(extra)}"


def improving_moves(
    counts: Mapping[str, int],
    subs: Mapping[str, Subscription],
    assignment: Assignment,
    weights: Mapping[str, int] | None = None,
) -> list[tuple[str, str, TopicPartition]]:
    """Brute force over every (from, to, partition): moves that make the assignment fairer.

    With unit weights this is KIP-54's balance definition: a partition of A can go to B (who
    subscribes to its topic) while A has 2+ more partitions than B. With weights, moving from A
    to B lowers sum(c^2 / w) exactly when (2 c_B + 1) / w_B < (2 c_A - 1) / w_A.
    """
    w = weights or dict.fromkeys(subs, 1)
    load = {m: len(tps) for m, tps in assignment.items()}
    out = []
    for a, tps in assignment.items():
        for b in subs:
            if b == a:
                continue
            # Integer form of (2 c_b + 1) / w_b < (2 c_a - 1) / w_a.
            if (2 * load[b] + 1) * w[a] >= (2 * load[a] - 1) * w[b]:
                continue
            mine = existing_topics(counts, subs[b])
            out.extend((a, b, tp) for tp in tps if tp.topic in mine)
    return out


def quotas_for_bound(
    total: int, weights: Mapping[str, int], owned: Mapping[str, int]
) -> dict[str, int]:
    """Floor or ceiling of each member's share ``total * w / sum(w)``; the ceilings go to the
    members with a fractional share and the largest ``owned - floor``."""
    whole = sum(weights.values())
    floor = {m: total * w // whole for m, w in weights.items()}
    fractional = [m for m, w in weights.items() if total * w % whole]
    ceilings = total - sum(floor.values())
    fractional.sort(key=lambda m: floor[m] - owned.get(m, 0))
    quota = dict(floor)
    for m in fractional[:ceilings]:
        quota[m] += 1
    return quota


def move_lower_bound(total: int, weights: Mapping[str, int], owned: Mapping[str, int]) -> int:
    """sum_c max(0, K_c - q_c): partitions that must leave an owner, whatever balanced result."""
    quota = quotas_for_bound(total, weights, owned)
    return sum(max(0, owned.get(m, 0) - q) for m, q in quota.items())


def needless_moves(
    counts: Mapping[str, int],
    subs: Mapping[str, Subscription],
    assignment: Assignment,
    weights: Mapping[str, int] | None = None,
) -> list[tuple[TopicPartition, str, str]]:
    """Partitions taken from a member still in the group that could go back at no cost in
    balance: moving one back from B to its previous owner A lowers or keeps sum(c^2 / w), i.e.
    (2 c_A + 1) / w_A <= (2 c_B - 1) / w_B, and leaves no improving move (brute force). A
    sticky assignor moves none of these, for any subscriptions. Each as (partition, previous
    owner, owner now)."""
    w = weights or dict.fromkeys(subs, 1)
    load = {m: len(tps) for m, tps in assignment.items()}
    now = owners(assignment)
    out = []
    for tp, a in sorted(resolved_previous(counts, subs).items()):
        b = now.get(tp)
        if a not in assignment or b is None or b == a:
            continue
        if (2 * load[a] + 1) * w[b] <= (2 * load[b] - 1) * w[a]:
            back = {m: [x for x in tps if x != tp] for m, tps in assignment.items()}
            back[a].append(tp)
            if not improving_moves(counts, subs, back, weights):
                out.append((tp, a, b))
    return out


def count_moves(previous: Mapping[TopicPartition, str], assignment: Assignment) -> int:
    """Partitions whose previous owner is still in the group but no longer has them."""
    now = owners(assignment)
    return sum(1 for tp, m in previous.items() if m in assignment and now.get(tp) != m)


def owned_counts(previous: Mapping[TopicPartition, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in previous.values():
        out[m] = out.get(m, 0) + 1
    return out


def reference_range(counts: Mapping[str, int], subs: Mapping[str, Subscription]) -> dict:
    """Kafka's RangeAssignor, as in its source: per topic, consumers sorted; consumer i takes
    ``n * i + min(i, extra)`` onwards, ``n + 1`` partitions for the first ``extra``."""
    out: dict[str, list[TopicPartition]] = {m: [] for m in subs}
    for topic in sorted(counts):
        consumers = sorted(m for m, s in subs.items() if topic in s.topics)
        if not consumers:
            continue
        n, extra = divmod(counts[topic], len(consumers))
        for i, m in enumerate(consumers):
            start = n * i + min(i, extra)
            length = n + (0 if i + 1 > extra else 1)
            out[m].extend(TopicPartition(topic, p) for p in range(start, start + length))
    return out


def reference_roundrobin(counts: Mapping[str, int], subs: Mapping[str, Subscription]) -> dict:
    """Kafka's RoundRobinAssignor: a circular iterator over sorted consumers; for each partition
    in (topic, partition) order, skip consumers not subscribed to its topic, then take next."""
    consumers = sorted(subs)
    out: dict[str, list[TopicPartition]] = {m: [] for m in consumers}
    wanted = set().union(*(s.topics for s in subs.values())) if subs else set()
    partitions = [
        TopicPartition(t, p) for t in sorted(counts) if t in wanted for p in range(counts[t])
    ]
    it = 0
    for tp in partitions:
        while tp.topic not in subs[consumers[it]].topics:  # peek
            it = (it + 1) % len(consumers)
        out[consumers[it]].append(tp)  # next
        it = (it + 1) % len(consumers)
    return out


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in the block after ``seconds`` of the process's CPU time (SIGPROF:
    Unix, main thread), so an assignor stuck in a loop fails its test instead of hanging the
    suite. CPU time, not the wall clock: other processes loading the machine do not count."""

    def _expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"did not finish within {seconds} s of CPU time")

    previous = signal.signal(signal.SIGPROF, _expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


@contextlib.contextmanager
def captured_warnings(name: str = "streamassign") -> Iterator[list[logging.LogRecord]]:
    """Warnings logged under ``name`` while inside (usable inside hypothesis tests, unlike
    pytest's function-scoped caplog)."""
    records: list[logging.LogRecord] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = _Keep(logging.WARNING)
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


# -- user data ---------------------------------------------------------------------------------

INT32 = st.integers(-(2**31), 2**31 - 1)
HAS_EPOCH = "join_epoch" in attrs.fields_dict(MemberData)


@st.composite
def partition_sets(draw: st.DrawFn) -> set[int]:
    """Arbitrary sets: scattered, dense runs, and partitions near the int32 limit."""
    out = set(draw(st.sets(st.integers(0, 100), max_size=20)))
    for _ in range(draw(st.integers(0, 2))):
        start = draw(st.integers(0, 2**31 - 50))
        out.update(range(start, start + draw(st.integers(1, 40))))
    if draw(st.booleans()):
        out.add(2**31 - 1)
    return out


@st.composite
def member_data(draw: st.DrawFn) -> MemberData:
    owned = draw(st.dictionaries(st.text(max_size=8), partition_sets(), max_size=3))
    extra = {"join_epoch": draw(INT32)} if HAS_EPOCH else {}
    return MemberData(
        priority=draw(INT32),
        weight=draw(st.integers(1, 2**31 - 1)),
        owned_partitions=[(t, p) for t, ps in owned.items() for p in ps],
        generation=draw(INT32),
        **extra,
    )
