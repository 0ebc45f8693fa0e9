"""A counting app on the secured broker of ``secured_kafka``, for the secured tests: its topics
(created by the super user), the ACLs docs/runtime.md lists for it, its committed output, and
waiting for the failure that stops it.

Not in ``secured.py``: the conftest imports that one, also for runs without the runtime's
dependencies, which this module imports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

from streamassign.runtime import App

from .conftest import _create_topic, _unique_name
from .secured import PREFIXED, Acl, SecuredKafka
from .test_runtime import _read_topic
from .test_runtime_clients import DEADLINE, counts_sending_to, produce

KEYS = [b"k%d" % i for i in range(10)]
#: What each app's source topic holds: every key three times.
RECORDS = KEYS * 3


def topic(kafka: SecuredKafka, base: str, partitions: int = 1) -> str:
    """A new topic on the secured broker (created by the super user)."""
    name = _unique_name(base)
    asyncio.run(_create_topic(kafka.admin_bootstrap, name, partitions, {}))
    return name


@contextmanager
def app_topics(kafka: SecuredKafka, base: str) -> Iterator[tuple[str, str, str]]:
    """An application id named after ``base``, its source topic (holding ``RECORDS``) and its
    output topic, where the ``Counts`` of ``make_app`` writes within."""
    app = _unique_name(base)
    source = topic(kafka, f"{base}-in")
    output = topic(kafka, f"{base}-out")
    asyncio.run(produce(kafka.admin_bootstrap, source, RECORDS))
    with counts_sending_to(output):
        yield app, source, output


def app_acls(app: str, source: str, output: str) -> list[Acl]:
    """The ACLs docs/runtime.md lists for an at-least-once app writing ``output``."""
    return [
        Acl.topic(source, "READ"),
        *(Acl.topic(f"{app}-", op, PREFIXED) for op in ("READ", "WRITE", "CREATE")),
        Acl.topic(output, "WRITE"),
        Acl.group(app, "READ"),
    ]


def outputs(kafka: SecuredKafka, output: str) -> list[bytes]:
    """The committed values of ``output`` once it holds one per record (read again until
    then: a transaction's commit returns before its markers let read_committed see it)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        written = asyncio.run(_read_topic(kafka.admin_bootstrap, output, "read_committed", 1))
        if len(written) >= len(RECORDS) or time.monotonic() >= deadline:
            return written
        time.sleep(0.2)


async def stopped_by_failure(app: App) -> None:
    """Wait until a failure stops ``app`` (``app.failure``), within ``DEADLINE``."""
    deadline = time.monotonic() + DEADLINE
    while app.failure is None:
        assert time.monotonic() < deadline, f"the app did not stop within {DEADLINE} s"
        await asyncio.sleep(0.1)
