"""Whether a group's coordinator lists a member: what makes a heartbeat the broker accepted
proof that the membership survived (``rejoin.watch_heartbeats``).

Kafka's group coordinator answers a Heartbeat with NONE without looking while it loads the
group (``GroupCoordinatorService.heartbeat`` maps COORDINATOR_LOAD_IN_PROGRESS to NONE; the old
Scala coordinator did the same), and it loads the group after every coordinator move (a broker
restart, a rolling restart of a cluster). DescribeGroups is never answered so: while loading it
says COORDINATOR_LOAD_IN_PROGRESS, elsewhere NOT_COORDINATOR. A member it lists has not been
removed (a member id, once removed, never comes back), so no generation without it can have
formed: under the eager protocol its partitions are no one else's yet.

It is sent through the consumer's own client, on the connection its coordinator's requests use
(the heartbeat's: Kafka answers one connection's requests in order, so the listing is of after
the heartbeat). aiokafka 0.11 and 0.12 export ``DescribeGroupsRequest`` as a list of versioned
request classes, 0.13 on as one class that picks the version per connection; Kafka 4.3 takes
versions 0-6 (KIP-896 removed none of them), the answers of 0-3 have the same fields here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import attrs
from aiokafka.client import ConnectionGroup
from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.admin import DescribeGroupsRequest

#: The outcomes: the member is listed; not yet (the next heartbeat asks again); cannot be
#: told at all (an error that asking again will not change: the heartbeat counts alone).
LISTED = "listed"
NOT_YET = "not yet"
UNTOLD = "untold"


@attrs.frozen
class Listing:
    outcome: str
    #: Why not LISTED, for a log line.
    why: str = ""


def describe_groups_request(client: Any, group: str) -> Any:
    """A DescribeGroups request for ``group`` that ``client`` (an ``AIOKafkaClient``) sends."""
    if isinstance(DescribeGroupsRequest, type):  # aiokafka 0.13 on: one builder class
        return DescribeGroupsRequest([group])
    # aiokafka 0.11 / 0.12: versioned classes; version 1 (Kafka 0.11 on) adds only a throttle.
    version = 1 if tuple(client.api_version) >= (0, 11) else 0
    return DescribeGroupsRequest[version]([group])


def listing_of(answer: Mapping[str, Any], group: str, member: str) -> Listing:
    """What a DescribeGroups answer (``to_object()``) says of ``member`` in ``group``."""
    entries = [g for g in answer["groups"] if g["group"] == group]
    if len(entries) != 1:
        return Listing(UNTOLD, f"{len(entries)} entries for the group in the answer")
    (entry,) = entries
    if entry["error_code"]:
        error = for_code(entry["error_code"])
        return Listing(NOT_YET if error.retriable else UNTOLD, error.__name__)
    if any(m["member_id"] == member for m in entry["members"]):
        return Listing(LISTED)
    return Listing(
        NOT_YET, f"not listed (group {entry['state']}, {len(entry['members'])} member(s))"
    )


async def member_listed(coordinator: Any, member: str, timeout: float) -> Listing:
    """Whether ``coordinator`` (aiokafka's ``GroupCoordinator``) is told by its group's
    coordinator that ``member`` is in the group. Never raises but CancelledError: a failure
    that asking again may mend (a timeout, a connection, a coordinator moving) is NOT_YET,
    any other UNTOLD."""
    try:
        node = coordinator.coordinator_id
        if node is None:
            return Listing(NOT_YET, "no coordinator known")
        client = coordinator._client
        request = describe_groups_request(client, coordinator.group_id)
        # Not asyncio.wait_for: on Python 3.11 it drops a cancel that lands as the answer
        # does, and aiokafka cancels the heartbeat routine this runs in, then awaits it.
        async with asyncio.timeout(timeout):
            response = await client.send(node, request, group=ConnectionGroup.COORDINATION)
        return listing_of(response.to_object(), coordinator.group_id, member)
    except TimeoutError:
        return Listing(NOT_YET, f"no answer within {timeout:g} s")
    except KafkaError as exc:
        return Listing(NOT_YET if exc.retriable else UNTOLD, repr(exc))
    except Exception as exc:  # an answer of another shape: asking again will not mend it
        return Listing(UNTOLD, repr(exc))
