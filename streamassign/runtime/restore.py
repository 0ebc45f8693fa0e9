"""Reading the changelogs of active tasks: restores, end offsets, the keys a range holds.

One plain consumer (no group) serves them all, one at a time (``lock``): a restore brings
stores from their position to the changelog's end as found when it starts (``StoreState``
applies only what a commit marker closed); end offsets tell commits and resumes whether
another writer wrote a changelog; ``keys_written`` reads what another writer wrote.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiokafka import TopicPartition as KafkaTopicPartition

from .._ids import TopicPartition
from ._clients import Clients
from .changelog import COMMIT_KEY, StoreState

log = logging.getLogger("streamassign.runtime")

#: Seconds a changelog end offset lookup may take (at commits and resumes).
ENDS_TIMEOUT = 5.0


class Restorer:
    """Active restores and changelog lookups through ``clients.restorer``."""

    def __init__(self, clients: Clients) -> None:
        self.clients = clients
        self.lock = asyncio.Lock()

    async def ends(self, states: Sequence[StoreState]) -> dict[TopicPartition, int]:
        """Changelog end offsets of ``states`` (bounded by ``ENDS_TIMEOUT``; raises
        ``KafkaError`` or ``TimeoutError``)."""
        reader = self.clients.restorer
        assert reader is not None
        tps = [KafkaTopicPartition(*s.changelog) for s in states]
        ends = await asyncio.wait_for(reader.end_offsets(tps), ENDS_TIMEOUT)
        return {TopicPartition(*tp): end for tp, end in ends.items()}

    async def restore(self, states: Sequence[StoreState]) -> dict[int, int]:
        """Bring ``states`` to their changelog's end; records read per state (by ``id``)."""
        reader = self.clients.restorer
        if not states or reader is None:
            return {}
        before = {id(s): s.restored for s in states}
        by_tp = {KafkaTopicPartition(*s.changelog): s for s in states}
        async with self.lock:
            reader.assign(list(by_tp))
            ends = await reader.end_offsets(list(by_tp))
            todo = set()
            for tp, state in by_tp.items():
                state.drop_unclosed()
                if state.position > ends[tp]:
                    log.warning(
                        "%s: local position %d is past the changelog end %d (topic recreated?); "
                        "restoring from the start",
                        tp,
                        state.position,
                        ends[tp],
                    )
                    state.store.write({k: None for k, _ in state.store.items()}, {})
                    state.position, state.applied = 0, {}
                reader.seek(tp, state.position)
                if state.position < ends[tp]:
                    todo.add(tp)
            while todo:
                batch = await reader.getmany(*todo, timeout_ms=200)
                for tp, records in batch.items():
                    state, end = by_tp[tp], ends[tp]
                    for r in records:
                        if r.offset < end:
                            state.restore(r.offset, r.key, r.value)
                for tp in list(todo):
                    if await reader.position(tp) >= ends[tp]:
                        todo.discard(tp)
            reader.assign([])
        for tp, state in by_tp.items():
            state.end = ends[tp]  # the active's records land from here on
        return {id(s): s.restored - before[id(s)] for s in states}

    async def keys_written(self, tp: TopicPartition, first: int, end: int) -> list[bytes]:
        """Data keys of changelog partition ``tp`` at offsets ``[first, end)``."""
        reader = self.clients.restorer
        assert reader is not None
        ktp = KafkaTopicPartition(*tp)
        keys: set[bytes] = set()
        async with self.lock:
            reader.assign([ktp])
            reader.seek(ktp, first)
            while await reader.position(ktp) < end:
                for records in (await reader.getmany(ktp, timeout_ms=200)).values():
                    keys.update(
                        r.key
                        for r in records
                        if r.offset < end and r.key is not None and r.key != COMMIT_KEY
                    )
            reader.assign([])
        return sorted(keys)
