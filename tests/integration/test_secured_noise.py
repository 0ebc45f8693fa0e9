"""An exactly-once app whose WRITE on its transactional ids is taken away while it runs stops
with its one line and nothing else: no "Future exception was never retrieved" trace of the
futures its dead producer failed, once they are collected (on the secured broker of
``secured_kafka``, SASL and Kafka's StandardAuthorizer)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamassign.errors import OutputNotAuthorizedError, TransactionalIdNotAuthorizedError
from streamassign.runtime import App

from .secured import Acl, SecuredKafka, grant, revoke
from .secured_apps import KEYS, RECORDS, app_acls, app_topics, outputs, stopped_by_failure
from .test_runtime_clients import make_app, produce, table, until


@pytest.fixture
def names(secured_kafka: SecuredKafka) -> Iterator[tuple[str, str, str]]:
    """An application id, its source topic (holding ``RECORDS``) and its output topic."""
    with app_topics(secured_kafka, "noise") as names:
        yield names


def test_transactional_ids_taken_away_while_running_stop_the_app_with_one_line(
    secured_kafka: SecuredKafka,
    names: tuple[str, str, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kafka = secured_kafka
    group, source, output = names
    ids = Acl.transactional_ids(f"{group}-")
    grant(kafka, *app_acls(group, source, output), ids)
    options = {"consumer_config": kafka.client_config(), "processing_guarantee": "exactly_once"}
    app = make_app(kafka.sasl_bootstrap, group, source, tmp_path, **options)

    unretrieved: list[str] = []

    async def scenario(app: App) -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: unretrieved.append(context["message"])
        )
        await app.start()
        try:
            await until("every record counted", lambda: table(app) == dict.fromkeys(KEYS, 3), app)
            committed = await asyncio.to_thread(outputs, kafka, output)
            assert len(committed) == len(RECORDS)  # taken away between two transactions
            await asyncio.to_thread(revoke, kafka, ids)
            await produce(kafka.admin_bootstrap, source, KEYS)
            await stopped_by_failure(app)
        finally:
            await app.stop()

    asyncio.run(scenario(app))
    failure = app.failure
    assert isinstance(failure, OutputNotAuthorizedError | TransactionalIdNotAuthorizedError)
    assert f"transactional id '{group}-0_0' not authorized for User:app" in str(failure)
    del app, failure
    gc.collect()
    # Futures still held (by the failure's trace, the logged records) are printed when
    # collected, at the latest at exit: a failure nobody retrieved is one asyncio prints.
    assert [m for m in unretrieved if "never retrieved" in m] == []
    assert unretrieved_failures() == []


def unretrieved_failures() -> list[str]:
    """The live futures whose failure nobody retrieved (each one asyncio would print as
    "Future exception was never retrieved" when collected)."""
    futures = [o for o in gc.get_objects() if isinstance(o, asyncio.Future)]
    return [repr(f) for f in futures if f.done() and getattr(f, "_log_traceback", False)]
