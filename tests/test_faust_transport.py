"""The ``streamassign://`` Faust transport without a broker: which protocols its consumer offers,
and that it fetches no stream partition before Faust has emptied the agents' queues."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

faust = pytest.importorskip("faust")

from faust.types import TP  # noqa: E402

from streamassign.faust.transport import SWITCH_ENV  # noqa: E402

SOURCE = TP("orders", 0)


def table_app(tmp_path: Path) -> faust.App:
    app = faust.App(
        "orders-app",
        broker="streamassign://localhost:1",
        datadir=str(tmp_path),
        PartitionAssignor="streamassign.faust:PartitionAssignor",
    )
    app.Table("totals", default=int)
    return app


def test_a_stream_partition_resumes_only_with_the_flow(tmp_path: Path) -> None:
    """Faust resumes the stream partitions, seeks them, empties the agents' queues and resumes
    the flow, in that order: records fetched before the queues are emptied would be dropped
    unprocessed (docs/faust.md, "Exactness"). Changelog partitions resume at once."""
    app = table_app(tmp_path)
    consumer = app.consumer
    changelog = TP("orders-app-totals-changelog", 0)
    consumer.pause_partitions({changelog, SOURCE})
    assert consumer._get_active_partitions() == set()

    consumer.resume_partitions({changelog, SOURCE})
    assert consumer._get_active_partitions() == {changelog}  # the source is held

    consumer.resume_flow()  # Faust calls this right after emptying the queues
    assert consumer._get_active_partitions() == {changelog, SOURCE}


def test_a_pause_cancels_a_held_resume(tmp_path: Path) -> None:
    """A rebalance that revokes a held partition before the flow resumes: it stays paused."""
    consumer = table_app(tmp_path).consumer
    consumer.pause_partitions({SOURCE})
    consumer.resume_partitions({SOURCE})
    consumer.pause_partitions({SOURCE})
    consumer.resume_flow()
    assert SOURCE not in consumer._get_active_partitions()


@pytest.mark.parametrize(("switch", "offered"), [(None, ["streamassign-faust"]), ("1", None)])
def test_faust_s_protocol_is_offered_only_while_switching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, switch: str | None, offered: list[str] | None
) -> None:
    """aiokafka (<= 0.14) sends one JoinGroup per offered protocol, which can keep a group
    rebalancing: the second protocol only with STREAMASSIGN_FAUST_SWITCH=1."""
    if switch is None:
        monkeypatch.delenv(SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(SWITCH_ENV, switch)
    app = table_app(tmp_path)

    async def strategy() -> list[str]:
        consumer = app.consumer._thread._create_worker_consumer(app.transport)
        try:
            return [a.name for a in consumer._partition_assignment_strategy]
        finally:
            await consumer.stop()

    assert asyncio.run(strategy()) == (offered or ["streamassign-faust", "faust"])
