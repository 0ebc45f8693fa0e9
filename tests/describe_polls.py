"""``describe --watch`` without a broker: ``follow`` over a scripted sequence of polls."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from streamassign.aiokafka import describe as describe_module


def followed_views(
    monkeypatch: pytest.MonkeyPatch, polls: Sequence[describe_module.GroupView]
) -> list[describe_module.GroupView]:
    """The views ``describe.follow`` yields when its admin client's polls return ``polls`` in
    turn (the poll after the last raises, which ends the watch)."""

    class ScriptedAdmin:
        def __init__(self, _: object) -> None:
            self.polls = iter(polls)

        async def __aenter__(self) -> ScriptedAdmin:
            return self

        async def __aexit__(self, *_: object) -> None:
            pass

        async def describe(self, *_: object) -> describe_module.GroupView:
            view = next(self.polls, None)
            if view is None:
                raise RuntimeError("no more polls")
            return view

    async def followed() -> list[describe_module.GroupView]:
        out = []
        with pytest.raises(RuntimeError, match="no more polls"):
            async for view in describe_module.follow(describe_module.Connection("x:1"), "g", 0):
                out.append(view)
        return out

    monkeypatch.setattr(describe_module, "_Admin", ScriptedAdmin)
    return asyncio.run(followed())
