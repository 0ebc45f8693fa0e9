"""Whether a group's coordinator lists a member (``streamassign.aiokafka.listed``): the
DescribeGroups request on either shape of aiokafka's ``DescribeGroupsRequest`` (one builder
class from 0.13 on, a list of versioned classes in 0.11 and 0.12: the list is made of the
versioned classes 0.14 still ships), and what an answer says. The stall hold's use of it is
in test_faust_stallhold.py; the live check in docs/faust.md."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol import admin as aiokafka_admin

from streamassign.aiokafka import listed
from streamassign.aiokafka.listed import LISTED, NOT_YET, UNTOLD, listing_of, member_listed

#: aiokafka 0.11 / 0.12's ``DescribeGroupsRequest``: the versioned classes, v0 to v3.
LIST_SHAPE = [getattr(aiokafka_admin, f"DescribeGroupsRequest_v{v}") for v in range(4)]
DESCRIBE_GROUPS_KEY = 15


def answer(error: int = 0, members: tuple[str, ...] = (), state: str = "Stable") -> Any:
    entry = {
        "error_code": error,
        "group": "g",
        "state": state,
        "members": [{"member_id": m} for m in members],
    }
    return {"groups": [entry]}


def test_the_builder_class_takes_the_highest_version_the_broker_takes() -> None:
    """aiokafka 0.13 on: Kafka 4.3 takes DescribeGroups 0-6; aiokafka knows up to 3."""
    if not isinstance(listed.DescribeGroupsRequest, type):
        pytest.skip("aiokafka < 0.13 has no builder class: its versioned list is tested below")
    request = listed.describe_groups_request(None, "g")
    built = request.prepare({DESCRIBE_GROUPS_KEY: (0, 6)})
    assert built.API_VERSION == 3 and built.to_object()["groups"] == ["g"]


def test_the_versioned_list_is_asked_at_1_from_kafka_0_11(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listed, "DescribeGroupsRequest", LIST_SHAPE)
    built = listed.describe_groups_request(SimpleNamespace(api_version=(4, 0, 0)), "g")
    assert built.API_VERSION == 1 and built.to_object() == {"groups": ["g"]}
    old = listed.describe_groups_request(SimpleNamespace(api_version=(0, 10, 2)), "g")
    assert old.API_VERSION == 0


def test_only_a_group_without_error_listing_the_member_lists_it() -> None:
    assert listing_of(answer(members=("m-1", "m-2")), "g", "m-1").outcome == LISTED
    absent = listing_of(answer(members=("m-2",)), "g", "m-1")
    assert absent.outcome == NOT_YET and "not listed (group Stable, 1 member(s))" in absent.why
    assert listing_of(answer(state="Dead"), "g", "m-1").outcome == NOT_YET
    # While it loads the group (the heartbeat is then answered blindly), or moved away.
    for retriable in (14, 15, 16):
        assert listing_of(answer(error=retriable, members=("m-1",)), "g", "m-1").outcome == NOT_YET
    refused = listing_of(answer(error=30), "g", "m-1")  # GROUP_AUTHORIZATION_FAILED
    assert refused == listed.Listing(UNTOLD, "GroupAuthorizationFailedError")
    assert listing_of({"groups": []}, "g", "m-1").outcome == UNTOLD


class Client:
    """The consumer's client: ``send`` answers ``reply`` or raises it."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.sent: list[tuple[int, Any]] = []
        self.api_version = (4, 0)

    async def send(self, node: int, request: Any, **_: Any) -> Any:
        self.sent.append((node, request))
        if isinstance(self.reply, BaseException):
            raise self.reply
        if self.reply is None:
            await asyncio.sleep(60)
        return SimpleNamespace(to_object=lambda: self.reply)


def ask(reply: Any, node: int | None = 7) -> tuple[listed.Listing, Client]:
    client = Client(reply)
    coordinator = SimpleNamespace(coordinator_id=node, group_id="g", _client=client)
    return asyncio.run(member_listed(coordinator, "m-1", 0.05)), client


def test_the_member_is_asked_of_the_group_s_coordinator() -> None:
    listing, client = ask(answer(members=("m-1",)))
    assert listing.outcome == LISTED
    assert [node for node, _ in client.sent] == [7]


def test_failures_asking_again_may_mend_are_not_yet_and_others_untold() -> None:
    assert ask(answer(), node=None)[0] == listed.Listing(NOT_YET, "no coordinator known")
    assert ask(None)[0] == listed.Listing(NOT_YET, "no answer within 0.05 s")
    assert ask(KafkaConnectionError("gone"))[0].outcome == NOT_YET
    assert ask(RuntimeError("odd"))[0].outcome == UNTOLD
    assert ask({"other": 1})[0].outcome == UNTOLD  # an answer of another shape


def test_a_cancel_that_lands_as_the_answer_does_is_not_swallowed() -> None:
    """aiokafka stops its heartbeat routine by cancelling it, then awaits it: a cancel that
    lands in the same loop iteration as the answer must still end the listing (on Python 3.11
    ``asyncio.wait_for`` returned the answer and dropped the cancel)."""

    async def cancelled_as_answered() -> bool:
        answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        class Waiting(Client):
            async def send(self, node: int, request: Any, **_: Any) -> Any:
                return await answered

        coordinator = SimpleNamespace(coordinator_id=7, group_id="g", _client=Waiting(None))
        listing = asyncio.ensure_future(member_listed(coordinator, "m-1", 5.0))
        for _ in range(3):  # the request is sent, its answer awaited
            await asyncio.sleep(0)
        answered.set_result(SimpleNamespace(to_object=lambda: answer(members=("m-1",))))
        listing.cancel()
        try:
            await listing
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(cancelled_as_answered())
