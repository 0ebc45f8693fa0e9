"""The Metadata request that never creates a topic, on either shape of aiokafka's
``MetadataRequest``: one builder class (0.13 on) or a list of versioned classes (0.11 and
0.12, which the ``aiokafka`` extra allows: describe crashed there with
``TypeError: 'list' object is not callable``). The list is made of the same versioned
classes 0.14 still ships, so both shapes run here on the installed aiokafka."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from aiokafka.errors import IncompatibleBrokerVersion
from aiokafka.protocol import metadata as aiokafka_metadata

from streamassign import TopicPartition
from streamassign.aiokafka import describe as describe_module
from streamassign.aiokafka import metadata
from streamassign.aiokafka.describe import quality
from streamassign.aiokafka.wire import encode_assignment

from .describe_polls import followed_views

#: aiokafka 0.11 / 0.12's ``MetadataRequest``: the versioned classes, v0 to v5.
LIST_SHAPE = [getattr(aiokafka_metadata, f"MetadataRequest_v{v}") for v in range(6)]
METADATA_KEY = 3


class ListShapeAdmin:
    """An aiokafka 0.12 admin client's version matching (``_matching_api_version``: the
    lower of the library's and the broker's highest version) on a broker answering Metadata
    up to ``broker_max``; records what it sends, built as aiokafka 0.13 on builds a request
    of the builder class on sending (``prepare`` with the connection's versions)."""

    def __init__(self, broker_max: int, topics: list[dict[str, Any]] | None = None) -> None:
        self.broker_max = broker_max
        self.sent: list[Any] = []
        self.topics = topics or []

    def _matching_api_version(self, operation: list[Any]) -> int:
        return min(len(operation) - 1, self.broker_max)

    async def _send_request(self, request: Any) -> Any:
        if hasattr(request, "prepare"):
            request = request.prepare({METADATA_KEY: (0, self.broker_max)})
        self.sent.append(request)
        return SimpleNamespace(to_object=lambda: {"topics": self.topics})


def test_the_installed_aiokafka_s_request_is_never_sent_below_the_version_with_the_flag() -> None:
    """Whichever shape the installed aiokafka has (one builder class, built per connection
    when sent, from 0.13; versioned classes in 0.11 / 0.12): the request sent has the flag off
    at version 4 or above, and a broker below 4 (where aiokafka's ``build`` silently leaves
    the flag out, and the broker would create the topics) gets no request at all."""
    for broker_max in (4, 5, 12):
        admin = ListShapeAdmin(broker_max)
        asyncio.run(metadata.topic_metadata(admin, ["b", "a"]))
        [sent] = admin.sent
        assert sent.API_VERSION >= 4
        assert sent.to_object() == {"topics": ["b", "a"], "allow_auto_topic_creation": False}
    for broker_max in (1, 3):
        admin = ListShapeAdmin(broker_max)
        with pytest.raises(IncompatibleBrokerVersion, match="cannot ask without creating"):
            asyncio.run(metadata.topic_metadata(admin, ["a"]))
        assert admin.sent == []


def test_the_versioned_list_is_asked_at_the_matching_version_with_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aiokafka 0.11 / 0.12: the request is the versioned class the broker and the library
    both take (5 here), flag off; a broker below 4 gets no request at all."""
    monkeypatch.setattr(metadata, "MetadataRequest", LIST_SHAPE)
    built = metadata.no_create_request(ListShapeAdmin(12), ["b", "a"])
    assert built.API_VERSION == 5
    assert built.to_object() == {"topics": ["b", "a"], "allow_auto_topic_creation": False}
    assert metadata.no_create_request(ListShapeAdmin(4), ["a"]).API_VERSION == 4
    with pytest.raises(IncompatibleBrokerVersion, match="cannot ask without creating"):
        metadata.no_create_request(ListShapeAdmin(3), ["a"])


class GroupAdmin(ListShapeAdmin):
    """A client for ``_Admin.describe``: a stable group of two members subscribed to clicks
    and nosuch, each assigned a partition of clicks only."""

    async def describe_consumer_groups(self, groups: list[str]) -> list[Any]:
        metadata_bytes = ConsumerProtocolMemberMetadata(0, ["clicks", "nosuch"], b"").encode()
        members = [
            {
                "member_id": f"m{k}",
                "client_id": "c",
                "client_host": "h",
                "member_metadata": metadata_bytes,
                "member_assignment": encode_assignment([TopicPartition("clicks", k)], b""),
            }
            for k in range(2)
        ]
        entry = {
            "error_code": 0,
            "group": groups[0],
            "state": "Stable",
            "protocol_type": "consumer",
            "protocol": "range",
            "members": members,
        }
        return [SimpleNamespace(to_object=lambda: {"groups": [entry]})]


def described(client: GroupAdmin) -> tuple[str, ...]:
    admin = describe_module._Admin(describe_module.Connection("x:1"))
    admin.client = client
    view = asyncio.run(admin.describe("app"))
    return quality(view).problems


@pytest.mark.parametrize("shape", ["class", "list"])
def test_describe_words_an_unassigned_topic_on_either_shape(
    monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """The lookup runs on both shapes and the line says what the cluster answered; a broker
    that cannot take the flag is not asked (no request sent) and the line asks, as before
    the lookup existed: no crash."""
    if shape == "list":
        monkeypatch.setattr(metadata, "MetadataRequest", LIST_SHAPE)
    unknown = [{"topic": "nosuch", "error_code": 3, "partitions": []}]
    asked = GroupAdmin(12, unknown)
    assert described(asked) == (
        "1 subscribed topic missing from the cluster (no member is assigned a partition of "
        "it): nosuch",
    )
    (request,) = asked.sent
    assert request.API_VERSION == 5
    assert request.to_object() == {"topics": ["nosuch"], "allow_auto_topic_creation": False}
    too_old = GroupAdmin(3, unknown)
    assert described(too_old) == (
        "1 subscribed topic without a partition assigned to any member (missing from the "
        "cluster?): nosuch",
    )
    assert too_old.sent == []


def test_a_topic_without_a_partition_leader_yet_is_not_called_0_partitions() -> None:
    """LEADER_NOT_AVAILABLE (being created, or its brokers down) lists no partitions: the
    topic exists, its count is not known (it read "(0 partitions)")."""
    electing = [{"topic": "nosuch", "error_code": 5, "partitions": []}]
    (line,) = described(GroupAdmin(12, electing))
    assert line.endswith(
        "though the cluster has it (created since the last rebalance?): nosuch (no partition "
        "leader yet)"
    )
    assert "0 partitions" not in line
    described_partitions = [
        {"topic": "nosuch", "error_code": 0, "partitions": [{"partition": 0}, {"partition": 1}]}
    ]
    assert described(GroupAdmin(12, described_partitions))[0].endswith("nosuch (2 partitions)")


def test_watch_reprints_when_only_the_topic_metadata_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``--watch`` the missing topic created while the old leader still
    assigns none of it changed only the metadata, and the view saying it missing stayed on
    screen. A metadata change is shown; a failed lookup (None) is not a change."""
    admin = describe_module._Admin(describe_module.Connection("x:1"))
    admin.client = GroupAdmin(12, [{"topic": "nosuch", "error_code": 3, "partitions": []}])
    missing = asyncio.run(admin.describe("app"))
    assert missing.cluster_partitions == {}
    created = attrs.evolve(missing, cluster_partitions={"nosuch": 2})
    failed = attrs.evolve(missing, cluster_partitions=None)
    polls = [missing, missing, failed, created, failed, created]

    assert followed_views(monkeypatch, polls) == [missing, created]
    assert quality(created).problems[0].endswith("nosuch (2 partitions)")
