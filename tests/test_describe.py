"""`streamassign describe`'s decoding and summaries, on bytes built by each protocol's own encoders
(no broker; the live groups are in tests/integration/test_describe_live.py)."""

from __future__ import annotations

import asyncio
import importlib
import io
import itertools
import json
import os
import re
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TextIO

import attrs
import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from streamassign import TaskId, TopicPartition
from streamassign.aiokafka.describe import (
    FAUST_CAPACITY_TAG,
    FAUST_OWN_PROTOCOL_NAME,
    FAUST_PROTOCOL_NAME,
    Connection,
    Family,
    GroupView,
    MemberView,
    RawMember,
    describe_bytes,
    fetch_group,
    quality,
    to_json,
)
from streamassign.aiokafka.streams import PROTOCOL_NAME
from streamassign.aiokafka.wire import encode_assignment
from streamassign.cli import main
from streamassign.cli.describe import WatchClock
from streamassign.consumer.userdata import AssignmentData, MemberData
from streamassign.errors import ErrorCode, GroupDescribeError
from streamassign.explain import Reason, explain, load_saved, load_snapshot
from streamassign.protocol import LATEST_OFFSET, AssignmentInfo, SubscriptionInfo

from .tables import assert_whole_tables

T = TaskId.parse
P1, P2 = uuid.UUID(int=1), uuid.UUID(int=2)
TOPICS = {0: {"orders": 4, "customers": 4}, 1: {"returns": 2}}


def meta(topics: list[str], user_data: bytes) -> bytes:
    encoded: bytes = ConsumerProtocolMemberMetadata(0, topics, user_data).encode()
    return encoded


def streams_member(
    member: str,
    process: uuid.UUID,
    active: str,
    standby: str = "",
    sums: dict[str, int] | None = None,
    version: int = 2,
    error: ErrorCode = ErrorCode.NONE,
    rack: str | None = None,
    warmup: str = "",
    dictionary: bool = True,
    previous: str = "",
    endpoint: str | None = None,
) -> RawMember:
    act = frozenset(T(t) for t in active.split())
    sub = SubscriptionInfo(
        process,
        endpoint=endpoint or f"{process.int}:80",
        offset_sums={T(t): s for t, s in (sums or {}).items()},
        previous_active=frozenset(T(t) for t in previous.split()),
        version=version,
        latest_supported_version=2,  # a group of protocol 2 members
        rack=rack,
    )
    info = AssignmentInfo(
        act,
        frozenset(T(t) for t in standby.split()),
        warmup=frozenset(T(t) for t in warmup.split()),
        topics=TOPICS if dictionary else {},
        error_code=error,
        version=version,
        common_version=version,
    )
    partitions = [TopicPartition(tp, t.partition) for t in act for tp in TOPICS[t.subtopology]]
    return RawMember(
        member,
        "client",
        "/10.0.0.1",
        meta(["customers", "orders", "returns"], sub.encode()),
        encode_assignment(partitions, info.encode()),
    )


def streams_group() -> list[RawMember]:
    return [
        streams_member("m1", P1, "0_0 0_1 1_0", "0_3", {"0_3": 120, "0_0": LATEST_OFFSET}),
        streams_member("m2", P1, "0_2"),
        streams_member("m3", P2, "0_3 1_1", "0_0 0_1 0_2", version=1),
    ]


def test_streams_members_grouped_by_process_with_tasks_and_partitions() -> None:
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    assert view.family == Family.STREAMS
    processes = view.processes()
    assert set(processes) == {str(P1), str(P2)}
    one = processes[str(P1)]
    assert one.capacity == 2  # two consumers
    assert one.assignment.active == {T("0_0"), T("0_1"), T("0_2"), T("1_0")}
    assert one.assignment.standby == {T("0_3")}
    assert view.tasks[T("0_3")] == {TopicPartition("orders", 3), TopicPartition("customers", 3)}
    assert len(view.tasks) == 6
    m1 = next(m for m in view.members if m.member_id == "m1")
    assert m1.offset_sums == {T("0_3"): 120, T("0_0"): LATEST_OFFSET}
    assert TopicPartition("returns", 0) in m1.partitions
    assert m1.versions == "sub v2/2 asg v2/2" and m1.endpoint == "1:80"
    m3 = next(m for m in view.members if m.member_id == "m3")
    assert m3.versions == "sub v1/2 asg v1/1"
    assert m3.generation is None  # the streams protocol does not carry one


def test_a_process_runs_a_task_one_of_its_members_reported_running() -> None:
    """Two members of one process id (a copied state directory), one running 0_0 and one with
    a checkpoint of it: the process ran 0_0 whichever member comes last, for explain's local
    state and the offset sums table alike (the leaders merge them so)."""
    from rich.console import Console

    from streamassign.cli.describe_tables import _print_group

    for running, checkpoint in (("m1", "m2"), ("m2", "m1")):
        members = [
            streams_member(running, P1, "0_0 0_1", sums={"0_0": LATEST_OFFSET}),
            streams_member(checkpoint, P1, "0_2", sums={"0_0": 500, "0_3": 90}),
            streams_member("m3", P2, "0_3 1_0 1_1"),
        ]
        view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, members)
        assert view.local_state()[str(P1)] == {T("0_0"): LATEST_OFFSET, T("0_3"): 90}
        console = Console(width=80, record=True)
        _print_group(console, view, quality(view))
        assert "0_0=running, 0_3=90" in console.export_text(), running


def test_json_carries_the_previous_actives_a_member_declared() -> None:
    # A restarted process's subscription names the actives it ran before it stopped (from its
    # state directory); explain --last needs them, so describe --json keeps them.
    members = [
        streams_member("m1", P1, "0_0 0_1", sums={"0_0": 500, "0_1": 480}, previous="0_1 0_0"),
        streams_member("m2", P2, "0_2 0_3", sums={"0_2": LATEST_OFFSET}),
    ]
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, members)
    by_id = {m["member_id"]: m for m in to_json(view, quality(view))["members"]}
    assert by_id["m1"]["previous_active"] == ["0_0", "0_1"]
    assert by_id["m2"]["previous_active"] == []


def test_quality_per_subtopology_and_standby_coverage() -> None:
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    score = quality(view)
    assert score.num_standby_replicas == 1
    assert score.stateful == {T(f"0_{p}") for p in range(4)}  # standbys only in subtopology 0
    # P1 has 2 threads of 3: shares 8/3 (0_*: 4 tasks) and 2*2/3 of 1_*.
    by_sub = {b.subtopology: b for b in score.per_subtopology}
    assert by_sub[0].tasks == 4 and (by_sub[0].fewest, by_sub[0].most) == (1, 3)
    assert by_sub[0].balanced and by_sub[1].balanced  # 3 <= ceil(8/3); 1_*: 1 and 1 of 2
    assert score.metrics.standbys_placed == 4 and score.metrics.standby_coverage == 1.0
    assert not score.problems  # every task active once, one standby each, on another process


def test_imbalance_per_subtopology_behind_balanced_totals() -> None:
    raw = [streams_member("m1", P1, "0_0 0_1 0_2 0_3"), streams_member("m2", P2, "1_0 1_1")]
    score = quality(describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw))
    assert [b.balanced for b in score.per_subtopology] == [False, False]
    assert not score.metrics.active_balanced  # 4 vs 2 of 6 on equal capacities


def test_missing_and_duplicated_actives_are_problems() -> None:
    raw = [streams_member("m1", P1, "0_0 0_1"), streams_member("m2", P2, "0_1")]
    score = quality(describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw))
    text = "\n".join(score.problems)
    assert "task 0_1 has 2 actives" in text and "task 0_2 has 0 actives" in text


def test_error_codes_shown() -> None:
    raw = [streams_member("m1", P1, "", error=ErrorCode.ASSIGNMENT_ERROR)]
    (member,) = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw).members
    assert member.error == "ASSIGNMENT_ERROR"


def test_faust_with_our_assignor_reads_its_capacity_tag() -> None:
    sub = SubscriptionInfo(P1, client_tags={FAUST_CAPACITY_TAG: "3", "streamassign.changelogs": ""})
    info = AssignmentInfo(frozenset({T("0_0")}), topics={0: {"words": 1}})
    raw = RawMember(
        "w1", "faust", "h", meta(["words"], sub.encode()), encode_assignment([], info.encode())
    )
    view = describe_bytes("g", "Stable", "consumer", FAUST_PROTOCOL_NAME, [raw])
    assert view.processes()[str(P1)].capacity == 3


def test_protocol_names_match_the_faust_integration() -> None:
    from streamassign.aiokafka import describe as describe_module
    from streamassign.faust import PROTOCOL_NAME as FAUST_NAME
    from streamassign.faust import leader

    assert (FAUST_PROTOCOL_NAME, FAUST_CAPACITY_TAG) == (FAUST_NAME, leader.CAPACITY_TAG)
    assert (
        describe_module.FAUST_CHANGELOGS_TAG,
        describe_module.FAUST_GLOBAL_CHANGELOGS_TAG,
    ) == (leader.CHANGELOGS_TAG, leader.GLOBAL_CHANGELOGS_TAG)


def _faust_dropin_view(topics: dict[int, dict[str, int]]) -> GroupView:
    """A Faust drop-in group of one worker whose app has tables ``app-counts-changelog`` and
    (global) ``app-glob-changelog``, and whose tasks are one of each subtopology of
    ``topics`` (its topic dictionary)."""
    tags = {
        FAUST_CAPACITY_TAG: "1",
        "streamassign.changelogs": "app-counts-changelog,app-glob-changelog",
        "streamassign.global-changelogs": "app-glob-changelog",
    }
    sub = SubscriptionInfo(P1, client_tags=tags)
    info = AssignmentInfo(frozenset(T(f"{s}_0") for s in topics), topics=topics)
    subscribed = sorted({t for ts in topics.values() for t in ts})
    raw = RawMember(
        "w1", "faust", "h", meta(subscribed, sub.encode()), encode_assignment([], info.encode())
    )
    return describe_bytes("g", "Stable", "consumer", FAUST_PROTOCOL_NAME, [raw])


def test_a_table_changelog_alone_in_its_task_group_is_a_problem() -> None:
    """Seen live: after src grew from 6 to 8 partitions on a running fleet, the leader put
    src (8) and its table's changelog (6) in different task groups, so a table partition's
    updates came from source partitions run elsewhere; describe called the group balanced,
    with no problem."""

    def lone(topics: dict[int, dict[str, int]]) -> list[str]:
        # The one worker is assigned one task of each group: the rest read unassigned.
        problems = quality(_faust_dropin_view(topics)).problems
        return [p for p in problems if p.startswith("table changelog")]

    assert lone({8: {"src": 8}, 6: {"app-counts-changelog": 6}}) == [
        "table changelog app-counts-changelog is in a task group with no source topic "
        "(subtopology 6; no source topic has its 6 partitions: a source topic grew, or the "
        "table is written by key (use_partitioner) or outside a stream?)"
    ]
    # A rolling deploy adding the table: its source, of the same count, is grouped apart
    # because not every member reads the changelog yet.
    assert lone({6: {"src": 6}, 7: {"app-counts-changelog": 6}}) == [
        "table changelog app-counts-changelog is in a task group with no source topic "
        "(subtopology 7; a topic of its 6 partitions is in another group: members subscribe "
        "differently, a rolling deploy adding or dropping the table?)"
    ]
    assert lone({1: {"src": 6, "app-counts-changelog": 6}}) == []
    # A global table's changelog is read whole by every worker, in a group of its own.
    assert lone({1: {"src": 6}, 2: {"app-glob-changelog": 1}}) == []
    assert lone({6: {"src": 6, "app-glob-changelog": 6}}) == []
    assert lone({6: {"src": 6, "app-counts-changelog": 6, "app-glob-changelog": 6}}) == []
    # Faust-style grouping puts a global changelog of the table's count beside it: still no
    # source topic there (and the global one is no source elsewhere either).
    no_source = (
        "table changelog app-counts-changelog is in a task group with no source topic "
        "(subtopology 6; no source topic has its 6 partitions: a source topic grew, or the "
        "table is written by key (use_partitioner) or outside a stream?)"
    )
    assert lone({8: {"src": 8}, 6: {"app-counts-changelog": 6, "app-glob-changelog": 6}}) == [
        no_source
    ]
    assert lone({8: {"src": 8}, 6: {"app-counts-changelog": 6}, 7: {"app-glob-changelog": 6}}) == [
        no_source
    ]


def test_faust_metadata_is_decoded_without_importing_faust() -> None:
    code = "import sys; import streamassign.aiokafka.describe as d; print('faust' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def faust_member(
    member: str, url: str, actives: dict[str, list[int]], standbys: dict[str, list[int]]
) -> RawMember:
    from faust.assignor.client_assignment import ClientAssignment, ClientMetadata

    groups = {"words": 0, "app-counts-changelog": 0}
    sub = ClientMetadata(
        assignment=ClientAssignment(actives={}, standbys={}), url=url, changelog_distribution={}
    )
    asg = ClientMetadata(
        assignment=ClientAssignment(actives=actives, standbys=standbys),
        url=url,
        changelog_distribution={},
        topic_groups=groups,
    )
    partitions = [TopicPartition(t, p) for t, ps in actives.items() for p in ps]
    return RawMember(
        member,
        "faust",
        "h",
        meta(["app-counts-changelog", "words"], sub.dumps()),
        encode_assignment(partitions, zlib.compress(asg.dumps())),
    )


def test_faust_own_assignor_json() -> None:
    cl = "app-counts-changelog"
    raw = [
        faust_member("w1", "http://a:6066", {"words": [0, 1], cl: [0, 1]}, {cl: [2]}),
        faust_member("w2", "http://b:6066", {"words": [2], cl: [2]}, {cl: [0, 1]}),
    ]
    view = describe_bytes("g", "Stable", "consumer", FAUST_OWN_PROTOCOL_NAME, raw)
    assert view.family == Family.FAUST
    a = view.processes()["http://a:6066"].assignment
    assert a.active == {T("0_0"), T("0_1")} and a.standby == {T("0_2")}
    assert view.tasks[T("0_2")] == {TopicPartition("words", 2), TopicPartition(cl, 2)}
    assert not quality(view).problems


def test_consumer_group_assignor_user_data() -> None:
    def member(name: str, parts: list[int], weight: int) -> RawMember:
        data = AssignmentData(generation=7).encode()
        tps = [TopicPartition("b", p) for p in parts]
        return RawMember(
            name, "c", "h", meta(["a", "b"], MemberData(weight=weight).encode()),
            encode_assignment(tps, data),
        )  # fmt: skip

    view = describe_bytes(
        "g",
        "Stable",
        "consumer",
        "streamassign-weighted",
        [member("x", [0, 1], 2), member("y", [2], 1)],
    )
    assert view.family == Family.CONSUMER
    assert view.tasks[T("1_2")] == {TopicPartition("b", 2)}  # topic "b" is the second subscribed
    x = view.processes()["x"]
    assert x.capacity == 2 and x.assignment.active == {T("1_0"), T("1_1")}
    assert {m.generation for m in view.members} == {7}
    assert quality(view).per_subtopology[0].balanced


def test_plain_aiokafka_protocol_reads_partitions_only() -> None:
    raw = RawMember(
        "x", "c", "h", meta(["a"], b""), encode_assignment([TopicPartition("a", 0)], b"")
    )
    (member,) = describe_bytes("g", "Stable", "consumer", "roundrobin", [raw]).members
    assert member.undecodable is None and member.active == {T("0_0")}


def test_garbage_is_undecodable_never_an_exception() -> None:
    good = streams_group()[0]
    cases = {
        "outer": RawMember("a", metadata=b"\xff\x00garbage"),
        "user data": RawMember("b", metadata=meta(["x"], b"\xff\x00garbage")),
        "assignment": RawMember("c", metadata=good.metadata, assignment=good.assignment[:-3]),
    }
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, cases.values())
    reasons = {m.member_id: m.undecodable for m in view.members}
    assert all(reasons.values()), reasons
    assert reasons["b"].startswith("subscription:") and reasons["c"].startswith("assignment:")
    assert view.processes() == {}  # undecodable members hold no tasks
    for protocol in (FAUST_OWN_PROTOCOL_NAME, "streamassign-sticky"):
        (m,) = describe_bytes("g", "Stable", "consumer", protocol, [cases["user data"]]).members
        assert m.undecodable and m.undecodable.startswith("subscription:")


@given(
    st.binary(max_size=64),
    st.binary(max_size=64),
    st.sampled_from([PROTOCOL_NAME, "faust", "streamassign-sticky", "range"]),
)
def test_any_bytes_decode_or_are_undecodable(
    metadata: bytes, assignment: bytes, protocol: str
) -> None:
    for raw in (
        RawMember("m", metadata=metadata, assignment=assignment),
        RawMember("m", metadata=meta(["t"], metadata), assignment=assignment),
    ):
        view = describe_bytes("g", "Stable", "consumer", protocol, [raw])
        quality(view)
        json.dumps(to_json(view, quality(view)))


#: A topic name as aiokafka decodes one: a string (some rich would read as markup) or null.
_NAMES = st.sampled_from(["a", "b", "t[/]", None])


@given(
    st.one_of(st.none(), st.lists(_NAMES, max_size=3)),
    st.one_of(
        st.none(),
        st.lists(
            st.tuples(_NAMES, st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=2))),
            max_size=3,
        ),
    ),
    st.binary(max_size=16),
    st.sampled_from([PROTOCOL_NAME, "faust", "streamassign-sticky", "range"]),
)
def test_any_consumer_protocol_names_decode_or_are_undecodable(
    topics: list[str | None] | None,
    assignment: list[tuple[str | None, list[int] | None]] | None,
    user_data: bytes,
    protocol: str,
) -> None:
    """The outer ConsumerProtocol arrays, null names and lists included: describe, quality,
    the JSON and the tables never raise."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

    raw = RawMember(
        "m",
        metadata=ConsumerProtocolMemberMetadata(0, topics, user_data).encode(),
        assignment=ConsumerProtocolMemberAssignment(0, assignment, b"").encode(),
    )
    view = describe_bytes("g", "Stable", "consumer", protocol, [raw, *streams_group()[:1]])
    json.dumps(to_json(view, quality(view)))
    printed(view)


def test_json_is_a_saved_assignment_that_explain_reads() -> None:
    before = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    after_raw = [
        streams_member("m1", P1, "0_0 0_1 0_2 1_0", "0_3"),
        streams_member("m2", P1, "0_3 1_1", "0_0"),
    ]  # P2 left
    after = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, after_raw)
    old = load_saved(json.loads(json.dumps(to_json(before, quality(before)))), "before")
    new = load_saved(json.loads(json.dumps(to_json(after, quality(after)))), "after")
    assert old == before.processes() and new == after.processes()
    moves = {m.task: m for m in explain(old, new).actives}
    assert set(moves) == {T("0_3"), T("1_1")}
    assert all(m.reason == Reason.CLIENT_GONE and m.source == str(P2) for m in moves.values())


def test_unreachable_broker_is_one_line_and_a_failure() -> None:
    result = CliRunner().invoke(
        main, ["describe", "g", "-b", "127.0.0.1:1", "--timeout", "2"], catch_exceptions=False
    )
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot reach 127.0.0.1:1: ")
    assert result.output.count("\n") == 1


#: A self-signed test certificate and its key (EC P-256, valid to 2126): for the checks of
#: describe's TLS options, which load them as the client would. Not a secret.
TEST_CERT = """-----BEGIN CERTIFICATE-----
MIIBkDCCATWgAwIBAgIULVz5WZzCInVFvNSOGZQH4qfl2PowCgYIKoZIzj0EAwIw
HDEaMBgGA1UEAwwRc3RyZWFtYXNzaWduLXRlc3QwIBcNMjYxMTI3MDEzNzM4WhgP
MjEyNjExMDMwMTM3MzhaMBwxGjAYBgNVBAMMEXN0cmVhbWFzc2lnbi10ZXN0MFkw
EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEcqh3laGpJHymr4xMaFzERPV5QPRUEGUG
4fHuRrjYdJ48Lj0eE+G+Lfx7FOp1BB8qMNRM5LOcvLH0/3Iyh5ZZzaNTMFEwHQYD
VR0OBBYEFB91vAJ2vE3z4zFtS6k6sCWDYZkxMB8GA1UdIwQYMBaAFB91vAJ2vE3z
4zFtS6k6sCWDYZkxMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIh
AMPw7Y/+kLbcVGDZIgRMOuAN/6IzJBiAjlTN861LEu+LAiEAtS2oJYrjmB1/ruF1
UK6KQRnLNalZ92wFgfdvnhjpC7c=
-----END CERTIFICATE-----
"""
TEST_KEY = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgeQtzEsNrs5zGTnIk
G7KDV1HFE6aCvpgnnU63G4A2zdyhRANCAARyqHeVoakkfKavjExoXMRE9XlA9FQQ
ZQbh8e5GuNh0njwuPR4T4b4t/HsU6nUEHyow1Ezks5y8sfT/cjKHllnN
-----END PRIVATE KEY-----
"""


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, str]:
    files = {"cert": TEST_CERT, "key": TEST_KEY, "both": TEST_CERT + TEST_KEY, "text": "hello\n"}
    for name, text in files.items():
        (tmp_path / f"{name}.pem").write_text(text)
    return {name: str(tmp_path / f"{name}.pem") for name in files}


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["--security-protocol", "SASL_SSL"],
            {},
            "--security-protocol SASL_SSL needs --sasl-username (or $STREAMASSIGN_SASL_USERNAME)",
        ),
        (
            ["--security-protocol", "SASL_PLAINTEXT", "--sasl-username", "u"],
            {},
            "needs --sasl-password (or $STREAMASSIGN_SASL_PASSWORD)",
        ),
        (
            ["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "SCRAM-SHA-512"],
            {"STREAMASSIGN_SASL_USERNAME": "u"},
            "needs --sasl-password",
        ),
        (
            ["--security-protocol", "SSL", "--ssl-cafile", "{text}"],
            {},
            "'--ssl-cafile': {text}: not a PEM certificate file (NO_CERTIFICATE_OR_CRL_FOUND)",
        ),
        (
            ["--security-protocol", "SASL_SSL", "--ssl-certfile", "{text}"],
            {"STREAMASSIGN_SASL_USERNAME": "u", "STREAMASSIGN_SASL_PASSWORD": "p"},
            "'--ssl-certfile': {text}: not a PEM certificate file",
        ),
        (
            ["--security-protocol", "SSL", "--ssl-certfile", "{cert}"],
            {},
            "{cert}: holds no private key matching its certificate; give the key with "
            "--ssl-keyfile",
        ),
        (
            ["--security-protocol", "SSL", "--ssl-certfile", "{cert}", "--ssl-keyfile", "{text}"],
            {},
            "'--ssl-keyfile': {text}: not the PEM private key of the certificate in {cert}",
        ),
        (
            ["--security-protocol", "SSL", "--ssl-keyfile", "{key}"],
            {},
            "--ssl-keyfile needs --ssl-certfile",
        ),
        (
            ["--ssl-cafile", "{cert}"],
            {},
            "--ssl-cafile needs --security-protocol SSL or SASL_SSL (it is PLAINTEXT",
        ),
        (
            ["--security-protocol", "SASL_PLAINTEXT", "--ssl-cafile", "{cert}"],
            {"STREAMASSIGN_SASL_USERNAME": "u", "STREAMASSIGN_SASL_PASSWORD": "p"},
            "--ssl-cafile needs --security-protocol SSL or SASL_SSL (it is SASL_PLAINTEXT",
        ),
        (
            ["--sasl-mechanism", "SCRAM-SHA-256"],
            {},
            "--sasl-mechanism needs --security-protocol SASL_PLAINTEXT or SASL_SSL (it is PLAIN",
        ),
        (
            ["--security-protocol", "SSL", "--sasl-username", "u"],
            {},
            "--sasl-username needs --security-protocol SASL_PLAINTEXT or SASL_SSL (it is SSL",
        ),
    ],
)
def test_security_mistakes_are_one_error_line_before_any_connection(
    tls_files: dict[str, str], args: list[str], env: dict[str, str], message: str
) -> None:
    args = [a.format(**tls_files) for a in args]
    result = CliRunner().invoke(
        main,
        ["describe", "g", "-b", "127.0.0.1:1", "--timeout", "2", *args],
        env={"STREAMASSIGN_SASL_USERNAME": None, "STREAMASSIGN_SASL_PASSWORD": None, **env},
        catch_exceptions=False,
    )
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and message.format(**tls_files) in errors[0], result.output
    assert "cannot reach" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["--security-protocol", "SSL", "--ssl-cafile", "{cert}"],
        ["--security-protocol", "SSL", "--ssl-certfile", "{both}"],
        ["--security-protocol", "SSL", "--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}"],
        ["--security-protocol", "SASL_PLAINTEXT"],  # credentials from the environment
        [],  # the environment's SASL credentials do not matter without SASL
        ["--sasl-mechanism", "PLAIN"],  # restating a default changes nothing: no conflict
    ],
)
def test_usable_security_options_go_on_to_the_broker(
    tls_files: dict[str, str], args: list[str]
) -> None:
    result = CliRunner().invoke(
        main,
        ["describe", "g", "-b", "127.0.0.1:1", "--timeout", "2"]
        + [a.format(**tls_files) for a in args],
        env={"STREAMASSIGN_SASL_USERNAME": "u", "STREAMASSIGN_SASL_PASSWORD": "p"},
        catch_exceptions=False,
    )
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot reach 127.0.0.1:1: ")
    assert result.output.count("\n") == 1


def test_a_client_aiokafka_refuses_is_one_line_not_a_trace() -> None:
    """Library use skips the CLI's checks: aiokafka's own refusal becomes GroupDescribeError."""
    connection = Connection("127.0.0.1:1", security_protocol="SASL_SSL", timeout_s=1)
    refused = r"cannot set up a client for 127\.0\.0\.1:1: .*PLAIN"
    with pytest.raises(GroupDescribeError, match=refused):
        asyncio.run(fetch_group(connection, "g"))


def test_python_m_streamassign_runs_the_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "streamassign", "describe", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    for option in ("--bootstrap", "--sasl-password", "--ssl-cafile", "--watch", "--json"):
        assert option in out.stdout


def test_rack_spread_counts_standbys_beside_their_active() -> None:
    p3 = uuid.UUID(int=3)
    raw = [
        streams_member("m1", P1, "0_0 0_1", "0_2 0_3", rack="r1"),
        streams_member("m2", P2, "0_2 0_3", "0_0", rack="r1"),
        streams_member("m3", p3, "1_0 1_1", "0_1", rack="r2"),
    ]
    score = quality(describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw))
    assert score.standbys_on_active_rack == 3  # 0_2, 0_3 and 0_0 share r1 with their active
    plain = quality(describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group()))
    assert plain.standbys_on_active_rack is None


def test_members_without_metadata_name_no_process() -> None:
    """A group that is not stable: DescribeGroups sends members without their bytes."""
    raw = [RawMember("m1", "c", "h"), RawMember("m2", "c", "h")]
    view = describe_bytes("g", "PreparingRebalance", "consumer", "", raw)
    assert view.processes() == {} and len(view.members) == 2
    assert "assignment" not in to_json(view, quality(view))


def test_cache_reuses_unchanged_members_and_forgets_departed_ones() -> None:
    cache: dict[tuple[str, RawMember], MemberView] = {}
    raw = streams_group()
    first = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw, cache)
    again = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw[:2], cache)
    assert again.members[0] is first.members[0] and len(cache) == 2


def test_faust_json_without_its_keys_or_nested_deeply_is_undecodable() -> None:
    for data, reason in (
        (b'{"assignment": {}}', "subscription: no 'url' in the JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "subscription: JSON nested too deeply"),
        (b'"just a string"', "subscription: metadata is str, not a JSON object"),
    ):
        raw = RawMember("w", metadata=meta(["t"], data))
        (m,) = describe_bytes("g", "Stable", "consumer", FAUST_OWN_PROTOCOL_NAME, [raw]).members
        assert m.undecodable == reason


@pytest.mark.parametrize(
    ("number", "reason"),
    [
        ("Infinity", "Infinity, not a finite number"),
        ("-Infinity", "-Infinity, not a finite number"),
        ("NaN", "NaN, not a finite number"),
        ("1e999", "1e999, a number beyond a float's range"),
    ],
)
@pytest.mark.parametrize("where", ["partition", "group", "url"])
def test_faust_json_with_a_non_finite_number_is_undecodable(
    number: str, reason: str, where: str
) -> None:
    """Faust never writes these, but Python's JSON reads them (OverflowError from ``int()``
    escaped describe's "never raises" decoder before: a traceback, ``--watch`` ended)."""
    url = number if where == "url" else '"http://w1:6066"'
    body = {
        "partition": f'{{"actives": {{"words": [{number}]}}, "standbys": {{}}}}',
        "group": '{"actives": {"words": [1]}, "standbys": {}}',
        "url": '{"actives": {}, "standbys": {}}',
    }[where]
    group = number if where == "group" else "0"
    asg = f'{{"assignment": {body}, "topic_groups": {{"words": {group}}}}}'
    raw = RawMember(
        "w1",
        metadata=meta(["words"], f'{{"url": {url}}}'.encode()),
        assignment=encode_assignment([TopicPartition("words", 1)], zlib.compress(asg.encode())),
    )
    (m,) = describe_bytes("g", "Stable", "consumer", FAUST_OWN_PROTOCOL_NAME, [raw]).members
    what = "subscription" if where == "url" else "assignment"
    assert m.undecodable == f"{what}: JSON holds {reason}"


@pytest.mark.parametrize(
    ("number", "shown"),
    [
        ("-3", "-3"),
        ("true", "True"),
        ("2.5", "2.5"),
        ('"7"', "'7'"),
        ("1e300", "1e+300"),
        ("2147483648", "2147483648"),
        ("9" * 50, "9" * 18 + "..." + "9" * 19),
    ],
)
@pytest.mark.parametrize("where", ["partition", "group"])
def test_faust_json_with_a_number_no_task_has_is_undecodable(
    number: str, shown: str, where: str
) -> None:
    """``int()`` took these: ``2.5`` and ``true`` were shown as tasks ``0_2`` and ``0_1``,
    ``-3`` as ``0_-3`` (which ``explain`` then refused in the saved file)."""
    partition, group = (number, "0") if where == "partition" else ("1", number)
    body = f'{{"actives": {{"words": [{partition}]}}, "standbys": {{}}}}'
    asg = f'{{"assignment": {body}, "topic_groups": {{"words": {group}}}}}'
    raw = RawMember(
        "w1",
        metadata=meta(["words"], b'{"url": "http://w1:6066"}'),
        assignment=encode_assignment([TopicPartition("words", 1)], zlib.compress(asg.encode())),
    )
    (m,) = describe_bytes("g", "Stable", "consumer", FAUST_OWN_PROTOCOL_NAME, [raw]).members
    assert m.undecodable == (f"assignment: {where} of 'words' is {shown}, not an int in [0, 2**31)")
    assert not m.active


def test_tables_fit_80_columns_and_name_undecodable_members() -> None:
    from rich.console import Console

    from streamassign.cli.describe_tables import _print_group

    raw = [*streams_group(), RawMember("broken-member", "c", "h", b"\xff\x00garbage")]
    view = describe_bytes("orders", "Stable", "consumer", PROTOCOL_NAME, raw)
    console = Console(width=80, record=True)
    _print_group(console, view, quality(view))
    text = console.export_text()
    assert_whole_tables(text, MEMBERS_COLUMNS)
    assert "member broken-member: undecodable: subscription: not ConsumerProtocol" in text
    assert "subtopology 0: actives per process (of 4)" in text
    rebalancing = describe_bytes("orders", "PreparingRebalance", "consumer", "", [])
    console = Console(width=80, record=True)
    _print_group(console, rebalancing, quality(rebalancing))
    assert "(rebalancing: the assignment is not readable until it is Stable)" in " ".join(
        console.export_text().split()
    )


def _watch_with(
    monkeypatch: pytest.MonkeyPatch,
    views: list[GroupView],
    stdout: TextIO,
    forever: bool,
    as_json: bool = True,
    clock: WatchClock | None = None,
) -> float:
    """``describe --watch``'s loop on ``views`` (then polling for ever, if ``forever``) with
    ``stdout`` as the CLI wraps it (``--json`` unless not ``as_json``; ``clock``: its clocks,
    None: the real ones); the seconds it ran."""
    from streamassign.aiokafka import describe as describe_module
    from streamassign.cli import console, describe

    async def follow(*_: object, **__: object) -> AsyncIterator[GroupView]:
        for view in views:
            yield view
        while forever:  # a quiet group: nothing new to print
            await asyncio.sleep(0.05)

    monkeypatch.setattr(describe_module, "follow", follow)
    monkeypatch.setattr(sys, "stdout", console._ReaderGone(stdout))
    start = time.monotonic()
    watch = describe._watch(None, "g", 1.0, None, as_json, clock=clock)
    asyncio.run(asyncio.wait_for(watch, 20))
    return time.monotonic() - start


def test_watch_ends_once_its_reader_is_gone_without_waiting_for_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``describe --watch | grep -q Stable``: grep exits after the first view; the group then
    stays quiet (nothing to write that would fail), and the watch must still end."""
    read_end, write_end = os.pipe()
    stable = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    with os.fdopen(write_end, "w") as stdout:
        os.close(read_end)  # the reader is gone before anything is printed
        took = _watch_with(monkeypatch, [stable], stdout, forever=True)
    assert took < 5


def test_watch_goes_on_while_read_and_ends_with_its_views(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A file (or a terminal) never reads as gone: every view is printed."""
    stable = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    rebalancing = describe_bytes("g", "PreparingRebalance", "consumer", "", [])
    with (tmp_path / "out.jsonl").open("w") as stdout:
        _watch_with(monkeypatch, [stable, rebalancing, stable], stdout, forever=False)
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["state"] for line in lines] == ["Stable", "PreparingRebalance", "Stable"]
    assert lines[2]["moves"] == []


def _p1_alone(original: str) -> GroupView:
    """P1 (member ``original`` at w0:80) runs 0_0 0_1 0_2 alone; P2 runs 0_3."""
    return describe_bytes(
        "g",
        "Stable",
        "consumer",
        PROTOCOL_NAME,
        [
            streams_member(original, P1, "0_0 0_1 0_2", endpoint="w0:80"),
            streams_member("m3", P2, "0_3", endpoint="w1:80"),
        ],
    )


def _p1_with_a_copy(original: str) -> GroupView:
    """A copy of P1's state directory (m2 at w2:80) runs 0_2 beside the original."""
    return describe_bytes(
        "g",
        "Stable",
        "consumer",
        PROTOCOL_NAME,
        [
            streams_member(original, P1, "0_0 0_1", endpoint="w0:80"),
            streams_member("m2", P1, "0_2", endpoint="w2:80"),
            streams_member("m3", P2, "0_3", endpoint="w1:80"),
        ],
    )


def test_watch_and_explain_show_no_moves_for_the_original_when_a_clash_starts_or_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A copy of P1's state directory joins at w2:80, then leaves: the original (m1, w0:80) is
    keyed P1, then P1#w0:80, then P1 again. Only 0_2 moved (to the copy and back); the tasks m1
    kept are no moves, whatever the key. A restart of the original (a new member id) while
    a clash starts or ends is found by its endpoint. ``describe --watch`` and ``explain``
    of the same views saved with ``describe --json`` give the same moves (one rule:
    ``explain.named_as_after``)."""
    views = [
        _p1_alone("m1"),
        _p1_with_a_copy("m1"),
        _p1_alone("m1"),
        _p1_with_a_copy("m1-restarted"),
        _p1_alone("m1-again"),
    ]
    saved = []
    for n, view in enumerate(views):
        saved.append(tmp_path / f"{n}.json")
        saved[-1].write_text(json.dumps(to_json(view, quality(view))))
        # what the rename reads is the same from a live view and its saved file
        snapshot = load_snapshot(json.loads(saved[-1].read_text()), "saved")
        assert snapshot.process_members == view.process_members()
    explained = []
    for before, after in itertools.pairwise(saved):
        result = CliRunner().invoke(main, ["explain", str(before), str(after), "--json"])
        assert result.exit_code == 0, result.output
        explained.append(json.loads(result.output)["moves"])
    # the watch last: it leaves sys.stdout wrapped around its closed file
    with (tmp_path / "out.jsonl").open("w") as stdout:
        _watch_with(monkeypatch, views, stdout, forever=False)
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    watched = [line["moves"] for line in lines[1:]]
    original, copy = f"{P1}#w0:80", f"{P1}#w2:80"
    expected = [
        [("0_2", original, copy, "balance quota")],
        [("0_2", copy, str(P1), "client gone")],
        [("0_2", original, copy, "balance quota")],
        [("0_2", copy, str(P1), "client gone")],
    ]
    assert [[(m["task"], m["from"], m["to"], m["reason"]) for m in ms] for ms in watched] == (
        expected
    )
    assert explained == watched


def test_explain_last_of_a_clash_starting_or_ending_names_one_generation(tmp_path: Path) -> None:
    """``explain --last`` needs no renaming: BEFORE comes from the members' reports at their
    last join, keyed as that generation keys them. A copy of P1's directory joining takes 0_2
    from the original; its leaving gives it back: 0_2 is the only move either way."""
    start = [
        streams_member(
            "m1",
            P1,
            "0_0 0_1",
            sums=dict.fromkeys(["0_0", "0_1", "0_2"], LATEST_OFFSET),
            endpoint="w0:80",
        ),
        streams_member(
            "m2",
            P1,
            "0_2",
            sums=dict.fromkeys(["0_0", "0_1", "0_2"], 90),
            endpoint="w2:80",
            previous="0_0 0_1 0_2",
        ),
        streams_member("m3", P2, "0_3", sums={"0_3": LATEST_OFFSET}, endpoint="w1:80"),
    ]
    end = [
        streams_member(
            "m1",
            P1,
            "0_0 0_1 0_2",
            sums={"0_0": LATEST_OFFSET, "0_1": LATEST_OFFSET},
            endpoint="w0:80",
        ),
        streams_member("m3", P2, "0_3", sums={"0_3": LATEST_OFFSET}, endpoint="w1:80"),
    ]
    moved = []
    for members in (start, end):
        view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, members)
        (tmp_path / "now.json").write_text(json.dumps(to_json(view, quality(view))))
        result = CliRunner().invoke(
            main, ["explain", "--last", str(tmp_path / "now.json"), "--json"]
        )
        assert result.exit_code == 0, result.output
        moved.append([(m["task"], m["from"], m["to"]) for m in json.loads(result.output)["moves"]])
    assert moved == [[("0_2", f"{P1}#w0:80", f"{P1}#w2:80")], [("0_2", None, str(P1))]]


def recorded(state: str) -> GroupView:
    """A DescribeGroups answer Kafka 4.3.1 gave (tests/data), decoded."""
    path = Path(__file__).parent / "data" / "describe_groups_kafka_4_3_1.json"
    entry = json.loads(path.read_text())[state]
    members = [
        RawMember(
            m["member_id"],
            m["client_id"],
            m["client_host"],
            bytes.fromhex(m["metadata"]),
            bytes.fromhex(m["assignment"]),
        )
        for m in entry["members"]
    ]
    return describe_bytes(
        "recapp", entry["state"], entry["protocol_type"], entry["protocol"], members
    )


def test_recorded_stable_answer_decodes_as_the_streams_group() -> None:
    view = recorded("stable")
    assert view.readable and view.family == Family.STREAMS and len(view.processes()) == 2
    assert {t for v in view.processes().values() for t in v.assignment.active} == {
        TaskId(0, p) for p in range(6)
    }
    assert quality(view).problems == ()


def test_rebalancing_answer_names_members_and_reads_no_assignment() -> None:
    """Kafka 4.3.1 answers a group in PreparingRebalance with protocol "" and each member's
    previous assignment bytes: read as a consumer group they made streams bytes into partitions
    (garbage task ids, every task a problem). Outside Stable nothing is decoded."""
    view = recorded("rebalancing")
    assert view.state == "PreparingRebalance" and not view.readable
    data = to_json(view, quality(view))
    assert set(data) == {"group", "state", "protocol_type", "members"}
    assert [sorted(m) for m in data["members"]] == [["client_host", "client_id", "member_id"]] * 3
    assert quality(view).problems == () and view.processes() == {} and view.tasks == {}
    from rich.console import Console

    from streamassign.cli.describe_tables import _print_group

    console = Console(width=80, record=True)
    _print_group(console, view, quality(view))
    text = " ".join(console.export_text().split())
    assert "not readable until it is Stable), 3 member(s)" in text
    for m in view.members:  # by the id's tail, as the Members table shows it
        assert f"…{m.member_id[-8:]} aiokafka-0.14.0@127.0.0.1" in text
    assert "problem" not in text and "Tasks" not in text


def test_empty_group_answer_is_its_state_and_no_members() -> None:
    view = recorded("empty")
    assert to_json(view, quality(view)) == {
        "group": "recapp",
        "state": "Empty",
        "protocol_type": "consumer",
        "members": [],
    }


def test_dead_group_listed_by_list_groups_is_named_by_its_protocol() -> None:
    from streamassign.aiokafka.describe import missing_group

    assert missing_group("g", []) == "group 'g' does not exist"
    assert missing_group("g", ["consumer"]).startswith(
        "group 'g' uses the new consumer protocol (KIP-848), not the classic protocol: "
        "describe reads classic groups only"
    )
    assert "share group (KIP-932)" in missing_group("g", ["share"])
    assert "kafka-streams-groups.sh" in missing_group("g", ["streams"])
    assert "listed with protocol type 'odd'" in missing_group("g", ["odd"])


#: The Members table's columns (rich crops a table wider than the console: the last go first).
MEMBERS_COLUMNS = ("member", "client@host", "process", "a+s+w", "versions")


def printed(view: GroupView) -> str:
    """``describe``'s tables of ``view`` as the command prints them (its console)."""
    from streamassign.cli.console import _Stdout
    from streamassign.cli.describe_tables import _print_group

    console = _Stdout(width=80, record=True)
    _print_group(console, view, quality(view))
    return console.export_text()


@pytest.mark.parametrize("width", [80, 160])
@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "fd00::1",
        "2001:db8:85a3::8a2e:370:7334",
        "2a02:8070:a1b2:3c00:1234:5678:9abc:def0",
    ],
)
def test_a_members_host_is_never_folded(width: int, host: str) -> None:
    """An audit: at 80 columns client@host folded mid-address (``aiokafka-0.14.0@127.0.0`` /
    ``.1``, and an IPv6 address after the fix for IPv4). Narrow, the host goes below its
    client id, whole, or, where that column cannot be as wide as the host beside the others
    (a long IPv6 address at 80 columns), on a line per member below the table; wide, client
    and host on one line."""
    from streamassign.cli.console import _Stdout
    from streamassign.cli.describe_tables import _print_group

    pids = ("93eca1d0-0000-4000-8000-000000000001", "bbb0d247-0000-4000-8000-000000000002")
    raw = [
        RawMember(
            f"aiokafka-0.14.0-{uuid.UUID(int=k)}",
            "aiokafka-0.14.0",
            f"/{host}",
            meta(["orders"], SubscriptionInfo(uuid.UUID(pid)).encode()),
            encode_assignment([], AssignmentInfo(frozenset()).encode()),
        )
        for k, pid in enumerate(pids)
    ]
    view = describe_bytes("orders", "Stable", "consumer", PROTOCOL_NAME, raw)
    console = _Stdout(width=width, record=True)
    _print_group(console, view, quality(view))
    text = console.export_text()
    assert_whole_tables(text, MEMBERS_COLUMNS)
    lines = text.splitlines()
    cells = [line.split("│")[2].strip() for line in lines if "│ aiokafka" in line]
    below = [line.split("│")[2].strip() for line in lines if "│ @" in line]
    after = [line for line in lines if line.startswith("member …")]
    # At 80 columns a short host fits beside its client id (no generation column to make
    # room for: the streams protocol carries none).
    if width == 160 or len(host) <= len("127.0.0.1"):
        assert (cells, below, after) == ([f"aiokafka-0.14.0@{host}"] * 2, [], [])
    elif len(host) <= len("255.255.255.255"):
        assert (cells, below, after) == (["aiokafka-0.14.0"] * 2, [f"@{host}"] * 2, [])
    else:
        assert (cells, below, after) == (
            ["aiokafka-0.14.0"] * 2,
            [],
            [f"member …0000000{k}: aiokafka-0.14.0 @{host}" for k in (0, 1)],
        )


def one_member_view(host: str, client: str = "aiokafka-0.14.0") -> GroupView:
    """A Stable consumer group of one aiokafka member of ``client`` on ``host``."""
    raw = RawMember(
        f"{client}-{uuid.UUID(int=0)}",
        client,
        f"/{host}",
        meta(["orders"], SubscriptionInfo(uuid.UUID(int=1)).encode()),
        encode_assignment([], AssignmentInfo(frozenset()).encode()),
    )
    return describe_bytes("orders", "Stable", "consumer", PROTOCOL_NAME, [raw])


@pytest.mark.parametrize(
    ("host", "client"),
    [
        ("192.168.100.200", "aiokafka-0.14.0"),
        ("fd00:10:244:1::a", "aiokafka-0.14.0"),
        ("2a02:8070:a1b2:3c00:1234:5678:9abc:def0", "aiokafka-0.14.0"),
        ("orders-worker-7f9c6d5b8-x2kqz.orders.svc.cluster.local", "aiokafka-0.14.0"),
        ("10.0.0.1", "orders-service-worker-producer-client-7"),
    ],
)
def test_the_members_table_is_whole_and_its_client_and_host_uncut_at_every_width(
    host: str, client: str
) -> None:
    """The layout was chosen by rich's measured minimum, which a table can exceed once
    rendered (a column squeezed below its least width is widened back), so at some widths
    (72-74 for an IPv4 host, 96-100 for a long IPv6 one, 111-115 for a DNS name) the table
    lost its gen column and right border; a long client id folded below its host. From 68
    columns (below, the columns' least widths cannot fit whatever the host) the table has
    every column a wide console shows, and the client id and host are each whole on some
    line. Every second width: each band that lost a column was 3-5 wide, and a sweep of
    every width is twice the time."""
    from streamassign.cli.console import _Stdout
    from streamassign.cli.describe_tables import _print_members

    view = one_member_view(host, client)
    labels = {view.members[0].member_id: "…00000000", view.members[0].process: "00000000"}

    def members_at(width: int) -> str:
        console = _Stdout(width=width, record=True, file=io.StringIO())
        _print_members(console, view.members, labels)
        return console.export_text()

    assert f"{client}@{host}" in members_at(400)
    for width in range(68, 141, 2):
        lines = members_at(width)
        assert_whole_tables(lines, MEMBERS_COLUMNS)
        for whole in (client, host):
            assert any(whole in line for line in lines.splitlines()), (width, lines)


def test_member_error_codes_are_a_line_each_and_a_quality_problem() -> None:
    """A co-partitioning mistake: the leader sends every member an empty assignment with
    INCOMPLETE_SOURCE_TOPIC_METADATA and no topic dictionary (0 tasks): balanced over nothing
    must not read as healthy, and the long code must not fold the Members table."""
    error = ErrorCode.INCOMPLETE_SOURCE_TOPIC_METADATA
    raw = [
        RawMember(
            f"aiokafka-0.14.0-{k}",
            "aiokafka-0.14.0",
            "/10.0.0.1",
            meta(["customers", "orders"], SubscriptionInfo(pid).encode()),
            encode_assignment([], AssignmentInfo(frozenset(), error_code=error).encode()),
        )
        for k, pid in enumerate(uuid.UUID(f"{d * 8}-0000-0000-0000-000000000000") for d in "ab")
    ]
    view = describe_bytes("orders", "Stable", "consumer", PROTOCOL_NAME, raw)
    score = quality(view)
    assert view.tasks == {} and score.metrics.active_balanced  # nothing to balance...
    (problem,) = score.problems  # ... but the reason is said
    assert problem.startswith("INCOMPLETE_SOURCE_TOPIC_METADATA reported by 2 processes (")
    text = printed(view)
    lines = text.splitlines()
    assert_whole_tables(text, MEMBERS_COLUMNS)
    top = next(k for k, x in enumerate(lines) if x.strip() == "Members")
    bottom = next(k for k, x in enumerate(lines) if k > top and x.startswith("└"))
    assert bottom - top <= 4 + 2 * 2  # title, borders, header; at most two lines a member
    assert "member …0.14.0-0 (process aaaaaaaa): error INCOMPLETE_SOURCE_TOPIC_METADATA" in text
    assert "problem: INCOMPLETE_SOURCE_TOPIC_METADATA reported by 2 processes" in text


def test_subscribed_topics_nobody_is_assigned_are_a_problem() -> None:
    """An assignor that does not check (Faust's own, aiokafka's range) leaves a missing
    source topic out without a word."""
    group = [
        RawMember(
            f"m{k}",
            "c",
            "h",
            meta(["clicks", "nosuch"], b""),
            encode_assignment([TopicPartition("clicks", k)], b""),
        )
        for k in range(2)
    ]
    view = describe_bytes("app", "Stable", "consumer", "range", group)
    assert quality(view).problems == (
        "1 subscribed topic without a partition assigned to any member (missing from the "
        "cluster?): nosuch",
    )
    # The cluster's metadata read (fetch_group looks the topic up): said, not asked.
    missing = attrs.evolve(view, cluster_partitions={})
    assert quality(missing).problems == (
        "1 subscribed topic missing from the cluster (no member is assigned a partition of "
        "it): nosuch",
    )
    created = attrs.evolve(view, cluster_partitions={"nosuch": 3})
    assert quality(created).problems == (
        "1 subscribed topic without a partition assigned to any member though the cluster has "
        "it (created since the last rebalance?): nosuch (3 partitions)",
    )


def test_an_inferred_standby_count_says_so_and_how_to_give_it() -> None:
    """An app configured for one standby whose standbys are all gone (the group lost them in
    a rebalance): the inferred count is 0 and '0 / 0' would look fine."""
    raw = [
        streams_member("m1", P1, "0_0 0_1 1_0", sums={"0_2": 7}),
        streams_member("m2", P2, "0_2 0_3 1_1"),
    ]
    view = describe_bytes("orders", "Stable", "consumer", PROTOCOL_NAME, raw)
    text = " ".join(printed(view).split())
    assert "standbys placed / required (0 per stateful task, inferred)" in text
    assert "--standbys R checks against the app's num_standby_replicas" in text
    quality_json = to_json(view, quality(view))["quality"]
    assert quality_json["num_standby_replicas_inferred"] is True
    given = quality(view, 1)
    assert not given.standbys_inferred and given.problems  # ... 0_0 has 0 standbys


def test_warmups_in_flight_say_imbalance_is_expected_until_probing() -> None:
    raw = [
        streams_member("m1", P1, "0_0 0_1 0_2 0_3 1_0", "", sums={"0_0": 5}),
        streams_member("m2", P2, "1_1", "", warmup="0_2 0_3"),
    ]
    view = describe_bytes("orders", "Stable", "consumer", PROTOCOL_NAME, raw)
    assert quality(view).warmups == 2
    assert "2 warmups in flight" in printed(view)
    assert "next probing rebalance is expected" in " ".join(printed(view).split())
    assert "in flight" not in printed(
        describe_bytes("o", "Stable", "consumer", PROTOCOL_NAME, raw[:1])
    )


def test_consumer_groups_get_no_standby_row() -> None:
    group = [
        RawMember(
            "m0",
            "c",
            "h",
            meta(["clicks"], b""),
            encode_assignment([TopicPartition("clicks", 0)], b""),
        )
    ]
    text = printed(describe_bytes("app", "Stable", "consumer", "range", group))
    assert "standbys placed" not in text and "inferred" not in text


def test_task_partitions_without_a_topic_dictionary_come_from_the_assignments() -> None:
    """A ProcessHost leader sends the topic dictionary only when some process has an
    endpoint; the members' partitions (their actives' source partitions) still tell."""
    full = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    for layout in (
        [("m1", P1, "0_0 0_1 1_0"), ("m2", P1, "0_2"), ("m3", P2, "0_3 1_1")],
        [("m1", P1, "0_0 0_1 0_2 0_3 1_0 1_1")],  # one process: only the counts tell
    ):
        raw = [streams_member(m, pid, active, dictionary=False) for m, pid, active in layout]
        view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw)
        assert all(not m.topic_dictionary for m in view.members)
        assert view.tasks == full.tasks
    # Two subtopologies over the same partition numbers on every process: left out, not
    # guessed.
    raw = [streams_member("m1", P1, "0_0 0_1 1_0 1_1", dictionary=False)]
    tasks = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw).tasks
    assert set(tasks) == {T(t) for t in ("0_0", "0_1", "1_0", "1_1")}
    assert set(tasks.values()) == {frozenset()}


def test_processes_show_their_endpoint_and_dashes_for_no_tasks() -> None:
    raw = [
        streams_member("m1", P1, "0_0 0_1 0_2 0_3 1_0 1_1", sums={"0_0": LATEST_OFFSET}),
        streams_member("m2", P2, ""),
    ]
    text = printed(describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw))
    assert "(1:80)" in text and "(2:80)" in text  # streams_member's endpoints
    # m2's row: no actives "0", no standbys and no warmups "-" alike
    assert re.search(r"│ 1\s+│ 0\s+│ -\s+│ -\s+│", text)
    assert "none reported" in text  # m2 reported no offset sums


def test_tables_at_80_columns_name_processes_by_unique_prefixes_unfolded() -> None:
    """A process UUID folded over two lines of the 80-column table (it is 36 characters): each
    table names a process by its shortest prefix of at least 8 digits no other process shares
    (as git names a commit), a member by its unique tail; --json keeps the full ids."""
    near = uuid.UUID("3f2a9c1e-7b44-4d2a-9e0c-5a1b2c3d4e5f")
    twin = uuid.UUID("3f2a9c1e-0000-4d2a-9e0c-5a1b2c3d4e60")  # the same first 8 digits
    other = uuid.UUID("bbb0d247-4e44-4a7c-8aee-caababc63138")
    members = {  # aiokafka's member ids: the client id, then a UUID
        f"aiokafka-0.14.0-{uuid.UUID(int=i)}": pid
        for i, pid in enumerate((near, near, twin, other), start=1)
    }
    raw = [
        streams_member(m, pid, active)
        for (m, pid), active in zip(
            members.items(), ("0_0 0_1", "0_2", "0_3 1_0", "1_1"), strict=True
        )
    ]
    view = describe_bytes("orders", "Stable", "consumer", PROTOCOL_NAME, raw)
    text = printed(view)
    assert_whole_tables(text, MEMBERS_COLUMNS)
    processes = text.split("Members")[0]
    for label in ("3f2a9c1e-7", "3f2a9c1e-0", "bbb0d247"):
        assert re.search(rf"│ {label}\s+│", processes), label  # whole, on one line
    assert str(near) not in text and "3f2a9c1e-7b" not in text
    assert re.search(r"│ …00000001 │ [^│]+│ 3f2a9c1e-7 │ 2\+0\+0 │", text)
    assignment = to_json(view, quality(view))["assignment"]
    assert set(assignment) == {str(near), str(twin), str(other)}
    assert f"aiokafka-0.14.0-{uuid.UUID(int=1)}" in assignment[str(near)]["members"]


def test_process_labels_stay_unique_whatever_the_ids() -> None:
    from streamassign.cli.labels import _member_labels, _process_labels

    a, b = (
        "http://orders-0.orders.default.svc.cluster.local:6066",
        "http://orders-1.orders.default.svc.cluster.local:6066",
    )
    labels = _process_labels([a, b, "http://b:6066/", str(P1), str(P2)])
    # Kubernetes hosts share long tails: each by its host's unique prefix (whole DNS labels).
    assert (labels[a], labels[b]) == ("orders-0…:6066", "orders-1…:6066")
    assert labels["http://b:6066/"] == "b:6066"
    tens = [f"http://orders-{n}.orders:6066" for n in (1, 10)]
    assert [_process_labels(tens)[url] for url in tens] == ["orders-1…:6066", "orders-10…:6066"]
    assert _process_labels(["http://10.0.0.12:6066"]) == {"http://10.0.0.12:6066": "10.0.0.12:6066"}
    # One host and port under two schemes: labelled whole, never alike.
    schemes = _process_labels(["http://a:6066", "https://a:6066", "http://a:6067"])
    assert schemes == {
        "http://a:6066": "http://a:6066",
        "https://a:6066": "https://a:6066",
        "http://a:6067": "a:6067",
    }
    assert labels[str(P1)] == "00000000-0000-0000-0000-000000000001"  # only the last digit differs
    # Unique across kinds too (a review: a plan's plain id and a UUID starting with it both
    # read "3f2a9c1e": a task seemed to move to the process it came from).
    near, twin, other = (
        "3f2a9c1e-0b7d-4c55-9a0e-1d2b3c4d5e61",
        "3f2a9c1e-77aa-4c55-9a0e-1d2b3c4d5e62",
        "8b1d0e44-0b7d-4c55-9a0e-1d2b3c4d5e63",
    )
    for plain, uuids in (("3f2a9c1e", [near, other]), ("3f2a9c1e-0", [near, twin, other])):
        mixed = _process_labels([plain, *uuids])
        assert len(set(mixed.values())) == len(mixed), mixed
        assert (mixed[plain], mixed[near], mixed[other]) == (plain, near, "8b1d0e44")
    assert _member_labels(["c-1234567890ab", "d-1234567890ab", "short"]) == {
        "c-1234567890ab": "…c-1234567890ab",
        "d-1234567890ab": "…d-1234567890ab",
        "short": "short",
    }


def test_faust_workers_on_kubernetes_fit_80_columns_with_every_column() -> None:
    """A StatefulSet's hosts (``orders-N.orders.default.svc.cluster.local``) share their last
    20 characters, so their labels fell back to the whole 46-character host: the Members table
    lost a+s+w, versions and gen at 80 columns (rich crops it) and the other tables folded each
    host. Each now reads by its host's unique prefix and its port."""
    changelog = "app-counts-changelog"
    hosts = [f"http://orders-{i}.orders.default.svc.cluster.local:6066" for i in range(2)]
    raw = [
        attrs.evolve(
            faust_member(
                f"faust-0.11.3-9a1b2c3d-0000-4000-8000-00000000000{i}",
                host,
                {"words": [i], changelog: [i]},
                {changelog: [1 - i]},
            ),
            client_id="faust-0.11.3",
            client_host=f"/10.244.1.{17 + i}",
        )
        for i, host in enumerate(hosts)
    ]
    text = printed(describe_bytes("g", "Stable", "consumer", FAUST_OWN_PROTOCOL_NAME, raw))
    assert_whole_tables(text, MEMBERS_COLUMNS)
    assert_whole_tables(text, ("process (endpoint)", "warmup", "active on", "partitions"))
    for i in range(2):
        assert re.search(rf"│ orders-{i}…:6066\s+│ 1\s+│", text)  # Processes, on one line
        assert re.search(rf"│ …0000000{i} │ [^│]+│ orders-{i}…:6066 │ 1\+1\+0 │", text)
        assert re.search(rf"│ 0_{i}\s+│ orders-{i}…:6066 │ orders-{1 - i}…:6066 │", text)
    assert "cluster.local" not in text


#: Processes of the hand-back views: two share their first 8 digits, as in the describe tables.
NEAR = uuid.UUID("3f2a9c1e-7b44-4d2a-9e0c-5a1b2c3d4e5f")
TWIN = uuid.UUID("3f2a9c1e-0000-4d2a-9e0c-5a1b2c3d4e60")


def handed_back_views() -> list[GroupView]:
    """NEAR ran 0_1 and restarted; TWIN ran it meanwhile (the first view). NEAR came back with
    its checkpoint of 0_1 and its previous actives; the leader handed 0_1 back (the second)."""
    running = {"0_0": LATEST_OFFSET, "0_1": LATEST_OFFSET, "0_2": LATEST_OFFSET}
    interim = [streams_member("m2", TWIN, "0_0 0_1 0_2", sums=running)]
    back = [
        streams_member("m1", NEAR, "0_1", sums={"0_1": 500}, previous="0_1"),
        streams_member("m2", TWIN, "0_0 0_2", sums=running),
    ]
    return [
        describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw) for raw in (interim, back)
    ]


def test_watch_names_a_hand_back_to_a_restarted_previous_owner(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The leader hands a restarted process the actives it declared it ran before, where its
    checkpoint is caught up; --watch read that as a balance move off the interim owner, as
    explain --last did before (the same rule now, from the members' previous actives)."""
    assert handed_back_views()[1].previous_active() == {str(NEAR): {T("0_1")}, str(TWIN): set()}
    with (tmp_path / "out.jsonl").open("w") as stdout:
        _watch_with(monkeypatch, handed_back_views(), stdout, forever=False)
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert lines[1]["moves"] == [
        {
            "task": "0_1",
            "from": str(TWIN),
            "to": str(NEAR),
            "reason": "handed back to previous owner",
            "landing": "local state",
        }
    ]


@pytest.mark.parametrize(
    ("protocol", "reason"),
    [(FAUST_PROTOCOL_NAME, "handed back to previous owner"), (PROTOCOL_NAME, "balance quota")],
)
def test_watch_names_the_faust_leaders_hand_back_of_a_task_without_state(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, protocol: str, reason: str
) -> None:
    """The Faust leader hands a restarted worker that runs nothing the tasks it ran that it has
    no offset sum of (a stateless task, an in-memory table); ProcessHost's leader does not."""
    running = {"0_0": LATEST_OFFSET, "0_1": LATEST_OFFSET, "0_2": LATEST_OFFSET}
    interim = [streams_member("m2", TWIN, "0_0 0_1 0_2", sums=running)]
    back = [
        streams_member("m1", NEAR, "0_1", previous="0_1"),
        streams_member("m2", TWIN, "0_0 0_2", sums=running),
    ]
    views = [describe_bytes("g", "Stable", "consumer", protocol, raw) for raw in (interim, back)]
    with (tmp_path / "out.jsonl").open("w") as stdout:
        _watch_with(monkeypatch, views, stdout, forever=False)
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(m["task"], m["reason"]) for m in lines[1]["moves"]] == [("0_1", reason)]


def test_watch_moves_table_names_processes_as_the_describe_tables_at_80_columns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The moves table showed full process ids, cut or folded at 80 columns: it names them
    as the describe tables above it do (unique prefixes), one naming for both."""
    monkeypatch.setenv("COLUMNS", "80")
    with (tmp_path / "out.txt").open("w") as stdout:
        _watch_with(monkeypatch, handed_back_views(), stdout, forever=False, as_json=False)
    text = (tmp_path / "out.txt").read_text()
    assert_whole_tables(text, (*MEMBERS_COLUMNS, "from", "to", "why", "state there"))
    assert str(NEAR)[:11] not in text and str(TWIN)[:11] not in text  # no full id, cut or not
    moves = text.split("Active tasks that moved")[1]
    assert re.search(r"│ 0_1\s+│ 3f2a9c1e-0\s+│ 3f2a9c1e-7\s+│ handed back to", moves)
    assert "0 of 1 taken off a process still in the group" in moves
    processes = text.split("Processes")[-1].split("Members")[0]
    assert re.search(r"│ 3f2a9c1e-7\s+│", processes) and re.search(r"│ 3f2a9c1e-0\s+│", processes)


def test_a_process_id_announced_with_two_endpoints_is_a_problem_and_two_processes() -> None:
    """A copied state directory: two live processes announce one process id with their own
    endpoints. The leader assigns them as two processes; describe shows them so (a standby
    on the copy of its active's id is no violation) and names the clash with its remedy."""
    raw = [
        streams_member("m1", P1, "0_0 0_1 1_0", "0_2 0_3", endpoint="w0:80"),
        streams_member("m2", P1, "0_2 0_3 1_1", "0_0 0_1", endpoint="w2:80", previous="0_0"),
    ]
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw)
    assert set(view.processes()) == {f"{P1}#w0:80", f"{P1}#w2:80"}
    assert view.endpoints() == {f"{P1}#w0:80": "w0:80", f"{P1}#w2:80": "w2:80"}
    # copied claims: the leader hands nothing back
    assert view.previous_active() == {f"{P1}#w0:80": frozenset(), f"{P1}#w2:80": frozenset()}
    (problem,) = quality(view).problems
    assert problem.startswith(f"process id {P1} is announced with 2 endpoints (w0:80, w2:80)")
    assert "delete process.id" in problem
    assert "problem: process id" in printed(view)


def test_a_saved_snapshot_ignores_copied_claims_as_describe_and_the_leaders_do() -> None:
    """A copy (P1 at w2:80) runs 0_2 and declares the original's 0_0 0_1 (its copied state
    directory) with caught-up checkpoints. The leaders ignore those claims, and so does live
    ``describe``; ``explain`` of the same group saved with ``describe --json`` must too, or it
    reports hand-backs to the copy that never happened. A file saved before
    ``shared_process_ids`` was written still loads (and honours every claim, as then)."""
    from streamassign.cli.describe import _returned
    from streamassign.explain import load_snapshot

    raw = [
        streams_member("m1", P1, "0_0 0_1", "", endpoint="w0:80"),
        streams_member(
            "m2", P1, "0_2", "", sums={"0_0": 100, "0_1": 100}, endpoint="w2:80", previous="0_0 0_1"
        ),
        streams_member("m3", P2, "0_3", "", endpoint="w1:80", previous="0_3"),
    ]
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw)
    data = json.loads(json.dumps(to_json(view, quality(view))))
    assert data["shared_process_ids"] == [
        {"process_id": str(P1), "endpoints": ["w0:80", "w2:80"], "members": ["m1", "m2"]}
    ]
    snapshot = load_snapshot(data, "saved.json")
    assert snapshot.previous_active == view.previous_active()
    assert snapshot.previous_active[str(P2)] == {T("0_3")}  # no clash: its claim counts
    assert snapshot.handed_back() == _returned(view, 10_000) == {}
    assert T("0_0") not in snapshot.running()[f"{P1}#w2:80"]
    del data["shared_process_ids"]
    assert load_snapshot(data, "old.json").handed_back() == {
        T("0_0"): f"{P1}#w2:80",
        T("0_1"): f"{P1}#w2:80",
    }


def test_one_process_id_with_one_endpoint_is_no_clash() -> None:
    """A process's consumers share its endpoint: threads, not a copy."""
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    assert view.shared_process_ids == ()


#: Member-chosen text that rich would read as markup: a closing tag with nothing to close
#: (MarkupError), a style tag, and an IPv6 host whose brackets read as a tag.
MARKUP_CLIENT = "etl[/]"
MARKUP_ENDPOINT = "[fd00::1]:8080"
MARKUP_TOPIC = "t[red]x"


def _markup_group() -> list[RawMember]:
    consumer = RawMember(
        f"{MARKUP_CLIENT}-1b2c",
        MARKUP_CLIENT,
        "/10.0.0.1",
        meta([MARKUP_TOPIC], b""),
        encode_assignment([TopicPartition(MARKUP_TOPIC, 0)], b""),
    )
    return [consumer]


def test_describe_prints_member_text_verbatim_never_as_markup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Client ids, endpoints, topics, group and protocol names come from members or the
    operator: ``etl[/]`` ended describe with MarkupError, ``[fd00::1]:8080`` lost its host."""
    from streamassign.aiokafka import describe as describe_module

    streams = streams_member("s1", P1, "0_0", endpoint=MARKUP_ENDPOINT)
    views = {
        "g[/]": describe_bytes("g[/]", "Stable", "consumer", "range", _markup_group()),
        "s[b]": describe_bytes("s[b]", "Stable", "consumer", PROTOCOL_NAME, [streams]),
    }

    async def fetch(connection: Connection, group: str) -> GroupView:
        return views[group]

    monkeypatch.setattr(describe_module, "fetch_group", fetch)
    consumer = CliRunner().invoke(main, ["describe", "g[/]", "--bootstrap", "x:1"])
    assert consumer.exit_code == 0, consumer.output
    for text in ("g[/]: Stable", f"{MARKUP_CLIENT}@10.0.0.1", MARKUP_TOPIC):
        assert text in consumer.output
    result = CliRunner().invoke(main, ["describe", "s[b]", "--bootstrap", "x:1"])
    assert result.exit_code == 0, result.output
    assert f"({MARKUP_ENDPOINT})" in result.output and "s[b]: Stable" in result.output


def test_watch_prints_member_text_verbatim(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    view = describe_bytes("g", "Stable", "consumer", "range", _markup_group())
    with (tmp_path / "out.txt").open("w") as stdout:
        _watch_with(monkeypatch, [view, view], stdout, forever=False, as_json=False)
    text = (tmp_path / "out.txt").read_text()
    assert f"{MARKUP_CLIENT}@10.0.0.1" in text and MARKUP_TOPIC in text


@pytest.mark.parametrize(
    ("subscription", "assignment", "reason"),
    [
        (["a", None], [("a", [0])], "subscription: a null topic name"),
        ([None], [("a", [0])], "subscription: a null topic name"),
        (None, [("a", [0])], "subscription: a null topic list"),
        (["a"], [(None, [0])], "assignment: a null topic name or partition list"),
        (["a"], [("a", None)], "assignment: a null topic name or partition list"),
        (["a"], None, "assignment: a null topic list"),
    ],
)
def test_a_null_topic_name_makes_the_member_undecodable(
    subscription: list[str | None] | None,
    assignment: list[tuple[str | None, list[int] | None]] | None,
    reason: str,
) -> None:
    """aiokafka reads a length -1 topic name or array as ``None``; sorting it with the other
    names raised TypeError out of describe and ``--watch``."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

    bad = RawMember(
        "bad",
        "c",
        "/h",
        ConsumerProtocolMemberMetadata(0, subscription, b"").encode(),
        ConsumerProtocolMemberAssignment(0, assignment, b"").encode(),
    )
    good = RawMember("good", "c", "/h", meta(["a"], b""), encode_assignment([], b""))
    for protocol in ("range", PROTOCOL_NAME, FAUST_OWN_PROTOCOL_NAME):
        view = describe_bytes("g", "Stable", "consumer", protocol, [bad, good])
        undecodable = {m.member_id: m.undecodable for m in view.members}
        assert undecodable == {"bad": reason, "good": undecodable["good"]}, protocol
        json.dumps(to_json(view, quality(view)))
        assert f"member bad: undecodable: {reason}" in printed(view)


def _asked(times: int) -> GroupDescribeError:
    """The long-lived client's failure while the broker is down, as seen in a live outage:
    its text counts the asks."""
    return GroupDescribeError(
        "cannot describe group 'g': NodeNotReadyError: Attempt to send a request to node which "
        f"is not ready (node id 1). (asked {times} times over 10.{times} s: the group's "
        "coordinator restarting or moving, or its address unreachable?)"
    )


def test_follow_says_an_outage_once_with_a_fresh_clients_plain_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen in a broker outage: every poll yielded a view, as the failure's text counts the
    asks, and named aiokafka's NodeNotReadyError where a one-shot describe said "connection
    refused". One view for the outage, its reason a fresh client's, and one when it ends."""
    from .describe_polls import followed_views

    stable = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    refused = GroupDescribeError(
        "cannot reach x:1: connection refused (no broker listening there?)"
    )
    shown = followed_views(
        monkeypatch, [stable, _asked(12), _asked(13), _asked(14), stable], fresh_start=refused
    )
    assert [(v.state, v.error) for v in shown] == [
        ("Stable", None),
        ("unavailable", "cannot reach x:1: connection refused (no broker listening there?)"),
        ("Stable", None),
    ]


def test_follow_keeps_the_failures_own_reason_when_a_fresh_client_reaches_the_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from .describe_polls import followed_views

    stable = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    shown = followed_views(monkeypatch, [stable, _asked(3)])
    assert shown[1].error == str(_asked(3))


def test_watch_prints_an_outage_once_and_its_end(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The table watch says the outage in one line and how long it lasted when the group
    answers again, counted from its last answer (a live outage of 97 s read 87 s counted from
    the failed poll, which noticed it a timeout late); --json gives a state scripts can match
    exactly and the reason apart."""
    stable = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    away = attrs.evolve(
        describe_bytes("g", "unavailable", "", "", []),
        error="cannot reach x:1: refused",
        answered_at=1000.0,  # on the monotonic clock, 42 s before it reads 1042
    )
    # Fixed clocks: the line must not depend on how long the rendering took.
    clock = WatchClock(monotonic=lambda: 1042.0, wall=lambda: 1_700_000_042.0)
    with (tmp_path / "out.txt").open("w") as stdout:
        _watch_with(
            monkeypatch, [stable, away, stable], stdout, forever=False, as_json=False, clock=clock
        )
    text = (tmp_path / "out.txt").read_text()
    said = re.findall(r"\d\d:\d\d:\d\d UTC (g: [^│┃]*?)\n(?=\d\d:|─|$)", text)
    assert [" ".join(line.split()) for line in said] == [
        "g: unavailable: cannot reach x:1: refused; asking again until it answers",
        "g: available again, 42 s after its last answer (at 22:13:20 UTC)",
    ]
    with (tmp_path / "out.jsonl").open("w") as stdout:
        _watch_with(monkeypatch, [stable, away, stable], stdout, forever=False)
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert lines[1] == {"group": "g", "state": "unavailable", "error": "cannot reach x:1: refused"}


def test_a_stable_groups_heading_says_what_describe_groups_cannot_tell() -> None:
    """Seen in incidents: a worker killed 4 s before still showed running its tasks in a
    Stable group, and a task restoring for 11 s showed simply active; nothing in the output
    said either could be so. A line under the heading says it, pointing at the docs."""
    view = describe_bytes("orders", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    text = " ".join(printed(view).split())
    heading, _, rest = text.partition(" process(es) ")
    assert heading.startswith("orders: Stable")
    assert rest.partition(" Processes ")[0] == (
        "as of the last rebalance: a dead member shows until its session expires; a "
        "restoring task reads as active (docs/operations.md, What it shows)"
    )


def test_watch_names_each_rebalancing_members_process_and_tasks_and_the_newcomer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Seen in a 26 s PreparingRebalance after a kill -9: five member ids, all one
    client@host, and nothing said which was which or what the group waited for. The watch
    knows each known member's process and tasks from the last Stable view."""
    stable = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    rebalancing = describe_bytes(
        "g",
        "PreparingRebalance",
        "consumer",
        "",
        [RawMember("m1", "client", "/10.0.0.1"), RawMember("m9", "client", "/10.0.0.2")],
    )
    with (tmp_path / "out.txt").open("w") as stdout:
        _watch_with(monkeypatch, [stable, rebalancing], stdout, forever=False, as_json=False)
    text = (tmp_path / "out.txt").read_text()
    said = " ".join(text[text.index("PreparingRebalance") :].split())
    assert said.endswith(
        f"m1 client@10.0.0.1 process {P1}, ran 0_0, 0_1, 1_0 "
        "m9 client@10.0.0.2 joining (not in the last Stable view) "
        "the group waits until each member rejoins or is dropped, when its session expires or "
        "at the latest at the rebalance timeout (2 members of the last Stable view gone)"
    )


def test_ctrl_c_ends_a_watch_with_the_status_of_an_interrupt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A script must tell Ctrl-C (130, as the shell gives) from a watch whose reader went
    away (0); both end without a trace."""
    from streamassign.cli import describe as describe_cli

    async def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(describe_cli, "_watch", interrupted)
    result = CliRunner().invoke(main, ["describe", "g", "-b", "127.0.0.1:1", "--watch"])
    assert (result.exit_code, result.output) == (130, "")


def test_members_table_fits_60_columns_without_an_empty_generation_column() -> None:
    """At 60 columns the Members table lost its right-hand columns and border: a ``gen``
    column of ``-`` (the streams protocol carries no generation) and versions that would not
    wrap. It is whole now; a consumer assignor's generation keeps its column."""
    from rich.console import Console

    from streamassign.cli.describe_tables import _print_group

    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    console = Console(width=60, record=True)
    _print_group(console, view, quality(view))
    text = console.export_text()
    members = text[text.index("Members") : text.index("Tasks (")]
    assert_whole_tables(members, MEMBERS_COLUMNS)
    assert "gen" not in members


@pytest.mark.parametrize(
    ("module", "step"),
    [
        ("streamassign.cli.describe", "_require"),
        ("streamassign.cli.describe", "_connection"),
        ("streamassign.aiokafka.describe", "quality"),
    ],
    ids=["loading aiokafka", "connecting", "printing"],
)
def test_ctrl_c_ends_every_step_of_describe_with_the_status_of_an_interrupt(
    monkeypatch: pytest.MonkeyPatch, module: str, step: str
) -> None:
    """Only the broker calls gave 130: an interrupt while aiokafka loaded, while connecting
    or while printing a one-shot view was click's "Aborted!" with status 1."""

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    async def fetched(*_: object) -> None:
        return None

    monkeypatch.setattr(importlib.import_module(module), step, interrupted)
    monkeypatch.setattr("streamassign.aiokafka.describe.fetch_group", fetched)
    result = CliRunner().invoke(main, ["describe", "g", "-b", "127.0.0.1:1"])
    assert (result.exit_code, result.output) == (130, "")


def test_watch_json_gives_each_rebalancing_member_the_fields_the_table_watch_prints(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The table watch names each rebalancing member's process and tasks and the newcomer;
    its --json lines carried only the group and state, so a script saw none of it. The
    fields carried over from the last Stable view say so by name; a member that view could
    not read has no process there (it read as a process named by its member id)."""
    broken = RawMember("broken-member", "c", "/10.0.0.3", b"\xff\x00garbage")
    stable = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, [*streams_group(), broken])
    rebalancing = describe_bytes(
        "g",
        "PreparingRebalance",
        "consumer",
        "",
        [
            RawMember("m1", "client", "/10.0.0.1"),
            RawMember("m9", "client", "/10.0.0.2"),
            attrs.evolve(broken, metadata=b""),
        ],
    )
    with (tmp_path / "out.jsonl").open("w") as stdout:
        _watch_with(monkeypatch, [rebalancing, stable, rebalancing], stdout, forever=False)
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    unknown = {"last_stable_process": None, "last_stable_active": None, "joining": None}
    assert lines[0] == _between_line(
        [
            _between_member("broken-member", "/10.0.0.3", "c", **unknown),
            _between_member("m1", "/10.0.0.1", **unknown),
            _between_member("m9", "/10.0.0.2", **unknown),
        ],
        gone=None,
    )
    assert lines[2]["members"] == [
        _between_member(
            "broken-member",
            "/10.0.0.3",
            "c",
            last_stable_process=None,
            last_stable_active=None,
            joining=False,
        ),
        _between_member(
            "m1",
            "/10.0.0.1",
            last_stable_process=str(P1),
            last_stable_active=["0_0", "0_1", "1_0"],
            joining=False,
        ),
        _between_member(
            "m9", "/10.0.0.2", last_stable_process=None, last_stable_active=None, joining=True
        ),
    ]
    assert lines[2]["members_gone"] == 2


def _between_member(
    member_id: str, host: str, client: str = "client", **known: object
) -> dict[str, object]:
    """A member of a ``--json`` line between assignments."""
    return {"member_id": member_id, "client_id": client, "client_host": host} | known


def _between_line(members: list[dict[str, object]], gone: int | None) -> dict[str, object]:
    """A ``--json`` line of group ``g`` in PreparingRebalance."""
    return {
        "group": "g",
        "state": "PreparingRebalance",
        "protocol_type": "consumer",
        "members": members,
        "members_gone": gone,
    }


def test_one_describe_json_of_a_rebalancing_group_has_the_watchs_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A one-shot ``describe --json`` of a rebalancing group gave each member 3 keys where
    the watch's line gives 6 and ``members_gone``: one shape for scripts, null where no
    Stable view was seen."""
    rebalancing = describe_bytes(
        "g", "PreparingRebalance", "consumer", "", [RawMember("m1", "client", "/10.0.0.1")]
    )

    async def fetched(*_: object) -> GroupView:
        return rebalancing

    monkeypatch.setattr("streamassign.aiokafka.describe.fetch_group", fetched)
    result = CliRunner().invoke(main, ["describe", "g", "-b", "127.0.0.1:1", "--json"])
    assert result.exit_code == 0, result.output
    unknown = {"last_stable_process": None, "last_stable_active": None, "joining": None}
    member = _between_member("m1", "/10.0.0.1", **unknown)
    assert json.loads(result.stdout) == _between_line([member], gone=None)


def test_a_watch_started_during_a_rebalance_does_not_say_use_watch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A watch's first view, taken during a rebalance, said "or use --watch (it names them
    from the last Stable view)": it is the watch, and it has no such view yet."""
    rebalancing = describe_bytes(
        "g", "PreparingRebalance", "consumer", "", [RawMember("m1", "client", "/10.0.0.1")]
    )
    with (tmp_path / "out.txt").open("w") as stdout:
        _watch_with(monkeypatch, [rebalancing], stdout, forever=False, as_json=False)
    text = " ".join((tmp_path / "out.txt").read_text().split())
    assert "use --watch" not in text
    assert (
        "processes not known: Kafka returns no subscriptions while a group rebalances, and "
        "the watch started during one: it names them from its next Stable view on" in text
    )


def test_one_describe_of_a_rebalancing_group_says_why_it_names_no_process() -> None:
    """Kafka returns no subscriptions while a group rebalances, so one describe cannot name
    the members' processes: the blanks beside them were unexplained."""
    rebalancing = describe_bytes(
        "g", "CompletingRebalance", "consumer", "", [RawMember("m1", "client", "/10.0.0.1")]
    )
    text = " ".join(printed(rebalancing).split())
    assert text.endswith(
        "1 member(s) m1 client@10.0.0.1 processes not known: Kafka returns no subscriptions "
        "while a group rebalances; run describe again once it is Stable, or use --watch (it "
        "names them from the last Stable view)"
    )
    empty = describe_bytes("g", "Empty", "consumer", "", [])
    assert "processes not known" not in printed(empty)


def test_load_imbalance_says_what_it_measures_and_when_thread_counts_alone_set_it() -> None:
    """Seen live: a 2-thread and a 1-thread process, 6 tasks and 1 standby each, read "load
    imbalance 3.00" with nothing to say it is forced: each process holds all 6 tasks, 6/2 =
    3.00 per thread against 6/1 = 6.00."""
    p1 = "20ccc6ba-0000-4000-8000-000000000001"
    p2 = "92dfdd4c-0000-4000-8000-000000000002"
    raw = [
        streams_member("m1", uuid.UUID(p1), "0_0 0_1", "0_4"),
        streams_member("m2", uuid.UUID(p1), "0_2 0_3", "0_5"),
        streams_member("m3", uuid.UUID(p2), "0_4 0_5", "0_0 0_1 0_2 0_3"),
    ]
    view = describe_bytes("rtapp", "Stable", "consumer", PROTOCOL_NAME, raw)
    text = " ".join(printed(view).split())
    assert "load imbalance (per thread, max - min) │ 3.00" in text
    assert text.endswith(
        "load imbalance: tasks held (active, standby, warmup) per thread, most 6/1 = 6.00 on "
        "92dfdd4c, fewest 6/2 = 3.00 on 20ccc6ba; every process holds every task (an active or "
        "a standby copy), so the thread counts alone set it: no assignment with these standbys "
        "evens it"
    )


def _members_at(width: int, client_ids: Sequence[str]) -> str:
    """The Members table, and the lines below it, of a two-process group whose members have
    ``client_ids``, printed at ``width`` columns."""
    from rich.console import Console

    from streamassign.cli.describe_tables import _print_group

    pids = ("20ccc6ba-0000-4000-8000-000000000001", "92dfdd4c-0000-4000-8000-000000000002")
    raw = [
        attrs.evolve(
            streams_member(f"m{k}", uuid.UUID(pid), f"0_{k}"),
            client_id=client_id,
            client_host="/127.0.0.1",
        )
        for k, (pid, client_id) in enumerate(zip(pids, client_ids, strict=True))
    ]
    view = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, raw)
    console = Console(width=width, record=True, file=io.StringIO())
    _print_group(console, view, quality(view))
    text = console.export_text()
    members = text[text.index("Members") : text.index("Tasks (")]
    assert_whole_tables(members, MEMBERS_COLUMNS)
    return members


def test_members_table_cuts_client_ids_to_save_lines_rather_than_fold_them() -> None:
    """Seen live at 60 columns: ``faust-0.15.`` / ``3`` in every row. Where a cut saves
    lines each id is cut to fit (no two different ids cut alike) and printed whole below the
    table; where the row folds anyway (its versions cell) the id is left whole, as a cut
    would only hide part of it."""
    ids = ["faust-0.15.3-worker-a", "faust-0.15.3-worker-b"]
    members = _members_at(64, ids)
    cells = [line.split("│")[2].strip() for line in members.splitlines() if "│ m" in line]
    # Cut alike at the head, apart by their tails; a row each, no line folded.
    assert cells == ["faust-0.15…a", "faust-0.15…b"]
    assert len([line for line in members.splitlines() if line.startswith("│")]) == 2
    assert "member m0: faust-0.15.3-worker-a @127.0.0.1" in members
    # At 60 columns the versions cell folds each row to 2 lines whatever the id's length.
    members = _members_at(60, ids)
    rows = [line.split("│")[2].strip() for line in members.splitlines() if line.startswith("│")]
    assert rows == ["faust-0.15.3-", "worker-a", "faust-0.15.3-", "worker-b"]


def test_follow_dates_an_outage_from_the_groups_last_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The outage began after the last poll the group answered, which follow does not yield
    when nothing changed: the unavailable view carries when that was."""
    from .describe_polls import followed_views

    clock = iter([100.0, 200.0, 300.0])
    stable = describe_bytes("g", "Stable", "consumer", PROTOCOL_NAME, streams_group())
    shown = followed_views(monkeypatch, [stable, stable, _asked(3)], clock=lambda: next(clock))
    assert [(v.state, v.answered_at) for v in shown] == [("Stable", None), ("unavailable", 200.0)]
