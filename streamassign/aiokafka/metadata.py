"""Topic metadata asked without creating a topic, on every aiokafka version the extras allow.

aiokafka's ``describe_topics`` asks with ``allow_auto_topic_creation`` on, and a broker with
``auto.create.topics.enable=true`` (Kafka's default) then creates every missing topic asked
about (one partition, not compacted). The flag exists from Metadata request version 4
(KIP-204, Kafka 1.0); a lower version cannot carry it, so a request is only ever sent at 4 or
above. How a request is built differs by aiokafka version: 0.11 and 0.12 export
``MetadataRequest`` as a list of versioned request classes, 0.13 on as one class that picks
the version per connection when sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka.errors import IncompatibleBrokerVersion
from aiokafka.protocol.metadata import MetadataRequest

#: Metadata error codes: a topic that does not exist, and one that exists whose partitions
#: have no leader yet (being created, or a broker down).
UNKNOWN_TOPIC = 3
LEADER_NOT_AVAILABLE = 5
#: The lowest Metadata request version that carries ``allow_auto_topic_creation``.
NO_CREATE_VERSION = 4


class _NoCreateRequest:
    """A request of aiokafka 0.13 on (``Request``, built per connection by ``prepare``) that
    refuses to be built below ``NO_CREATE_VERSION``: aiokafka's ``MetadataRequest.build``
    silently leaves the flag out there, and the broker would create the topics."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.API_KEY = request.API_KEY

    def prepare(self, versions: dict[int, tuple[int, int]]) -> Any:
        built = self.request.prepare(versions)
        _refuse_below_no_create(built.API_VERSION)
        return built


def no_create_request(admin: Any, topics: Sequence[str]) -> Any:
    """A Metadata request for ``topics`` that ``admin`` (a started ``AIOKafkaAdminClient``)
    can send with its ``_send_request`` and that never creates a topic. Raises
    ``IncompatibleBrokerVersion`` (when building, or from aiokafka 0.13 on when sending) if
    the broker cannot take the version that carries the flag: no lower version is ever
    sent."""
    if isinstance(MetadataRequest, type):  # aiokafka 0.13 on: one builder class
        return _NoCreateRequest(MetadataRequest(list(topics), allow_auto_topic_creation=False))
    # aiokafka 0.11 / 0.12: versioned classes; the admin client knows the broker's range.
    version = admin._matching_api_version(MetadataRequest)
    _refuse_below_no_create(version)
    return MetadataRequest[version](list(topics), False)


async def topic_metadata(admin: Any, topics: Sequence[str]) -> list[dict[str, Any]]:
    """The Metadata answer's topic entries (``topic``, ``error_code``, ``partitions``) for
    ``topics``, asked with :func:`no_create_request` through ``admin``'s ``_send_request``
    (aiokafka has no public way to ask so). Raises what building or sending raises."""
    response = await admin._send_request(no_create_request(admin, topics))
    listed: list[dict[str, Any]] = response.to_object()["topics"]
    return listed


def _refuse_below_no_create(version: int) -> None:
    """``IncompatibleBrokerVersion`` (aiokafka's own convention for a request the negotiated
    version cannot carry) when Metadata ``version`` cannot carry the no-create flag."""
    if version < NO_CREATE_VERSION:
        raise IncompatibleBrokerVersion(
            f"the broker answers Metadata up to version {version}, which cannot ask without "
            f"creating topics (version {NO_CREATE_VERSION} on can)"
        )
