"""``describe --watch`` without a broker: ``follow`` over a scripted sequence of polls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import pytest

from streamassign.aiokafka import describe as describe_module


def followed_views(
    monkeypatch: pytest.MonkeyPatch,
    polls: Sequence[describe_module.GroupView | Exception],
    *,
    fresh_start: Exception | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[describe_module.GroupView]:
    """The views ``describe.follow`` yields when its admin client's polls return ``polls`` in
    turn, an exception among them raised by its poll (the poll after the last raises, which
    ends the watch); a client started afresh after the first fails with ``fresh_start``
    (None: it starts); ``clock``: ``follow``'s."""
    started = []

    class ScriptedAdmin:
        def __init__(self, _: object) -> None:
            self.polls = iter(polls)

        async def __aenter__(self) -> ScriptedAdmin:
            started.append(self)
            if len(started) > 1 and fresh_start is not None:
                raise fresh_start
            return self

        async def __aexit__(self, *_: object) -> None:
            pass

        async def describe(self, *_: object) -> describe_module.GroupView:
            view = next(self.polls, None)
            if view is None:
                raise RuntimeError("no more polls")
            if isinstance(view, Exception):
                raise view
            return view

    async def followed() -> list[describe_module.GroupView]:
        out = []
        with pytest.raises(RuntimeError, match="no more polls"):
            following = describe_module.follow(
                describe_module.Connection("x:1"), "g", 0, clock=clock
            )
            async for view in following:
                out.append(view)
        return out

    monkeypatch.setattr(describe_module, "_Admin", ScriptedAdmin)
    return asyncio.run(followed())
