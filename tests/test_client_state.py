"""ClientState checks its fields at the API edge: a typed error naming the field and key."""

from __future__ import annotations

from typing import Any

import pytest

from streamassign import ClientState, TaskId
from streamassign.errors import InvalidClientError, StreamAssignError


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"process_id": 7}, "process_id must be a str"),
        ({"capacity": 0}, "capacity must be an int >= 1"),
        ({"lags": 0}, r"lags must be a mapping of task id -> int, got 0"),
        ({"lags": {"0_1": 1.5}}, "lags: lag of task 0_1 must be an int >= 0, got 1.5"),
        ({"lags": {(0, 1, 2): 1}}, r"lags: "),
        ({"tags": {"zone": [1]}}, r"tags\['zone'\] must be a str, got \[1\]"),
        ({"tags": {1: "a"}}, r"tags: keys must be str, got 1"),
        ({"tags": ["zone"]}, "tags must be a mapping of str -> str"),
        ({"rack": 3}, "rack must be a str or None, got 3"),
        ({"rack": ["a"]}, "rack must be a str or None"),
        ({"prev_active": 5}, "prev_active: expected a collection of task ids, got 5"),
        ({"prev_standby": "0_1"}, "prev_standby: expected a collection of task ids"),
        ({"prev_standby": ["zz"]}, "prev_standby: not a task id"),
    ],
)
def test_bad_fields_raise_a_typed_error_naming_the_field(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidClientError, match=message) as info:
        ClientState(**{"process_id": "a", **fields})
    # what plain Python raised here before stays catchable
    assert isinstance(info.value, StreamAssignError)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)


def test_good_fields_are_converted() -> None:
    client = ClientState(
        "a", 2, prev_active=["0_1"], lags={(0, 2): 3}, rack="r1", tags={"zone": "z"}
    )
    assert client.prev_active == {TaskId(0, 1)}
    assert client.lags == {TaskId(0, 2): 3}
    assert client.tags == {"zone": "z"} and client.rack == "r1"
    assert ClientState("b", rack=None).rack is None
