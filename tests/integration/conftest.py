"""Fixtures for integration tests against a real Apache Kafka broker.

``kafka_bootstrap`` starts one single-node KRaft broker per test session through
``scripts/kafka.py`` (assembling Kafka from Maven Central on first use) and stops it at the end,
also on failures and Ctrl-C; on Linux the JVM is additionally tied to this process so a killed
pytest cannot leak it. Set ``STREAMASSIGN_KAFKA_BOOTSTRAP=host:port`` to use an existing cluster
instead. A broker that cannot be started fails the tests with the reason; it never skips them.
See docs/testing.md.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import os
import re
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from .secured import APP_USER, SecuredKafka

BOOTSTRAP_ENV = "STREAMASSIGN_KAFKA_BOOTSTRAP"
#: ``STREAMASSIGN_CPU_HOG=N``: N busy processes run beside the broker tests for the whole
#: session (the loaded-machine mode of docs/testing.md; not part of the default CI run).
CPU_HOG_ENV = "STREAMASSIGN_CPU_HOG"
KAFKA_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kafka.py"
TOPIC_READY_TIMEOUT = 30.0
EXTERNAL_PROBE_TIMEOUT = 15.0

TopicFactory = Callable[..., str]
GroupIdFactory = Callable[..., str]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "kafka: needs a real Kafka broker (started automatically, or "
        f"${BOOTSTRAP_ENV}); see docs/testing.md",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a broker, so ``-m "not kafka"`` deselects them all."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "kafka_bootstrap" in fixtures or "secured_kafka" in fixtures:
            item.add_marker(pytest.mark.kafka)


def cpu_hog_count() -> int:
    """``$STREAMASSIGN_CPU_HOG`` as a count of busy processes (0 when unset); anything but a
    whole number from 0 to 64 fails the session with one line."""
    raw = os.environ.get(CPU_HOG_ENV, "").strip() or "0"
    if not raw.isdigit() or int(raw) > 64:
        pytest.fail(f"{CPU_HOG_ENV}={raw!r}: expected a whole number from 0 to 64", pytrace=False)
    return int(raw)


@pytest.fixture(scope="session", autouse=True)
def cpu_hog() -> Iterator[int]:
    """Runs ``$STREAMASSIGN_CPU_HOG`` busy Python processes (each spinning one core) for the
    whole session, so the broker tests run on a loaded machine; stops them at the end."""
    count = cpu_hog_count()
    # Spins, and looks up now and then whether pytest is still its parent (a killed pytest
    # must not leave hogs behind).
    spin = (
        "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
        "    for _ in range(10**6): pass\n"
    )
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]
    try:
        yield count
    finally:
        for hog in hogs:
            hog.terminate()
        for hog in hogs:
            try:
                hog.wait(timeout=10)
            except subprocess.TimeoutExpired:
                hog.kill()


def kafka_script() -> ModuleType:
    """Import scripts/kafka.py (not a package) once, under a private module name."""
    name = "_streamassign_kafka_script"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, KAFKA_SCRIPT)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {KAFKA_SCRIPT}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
        spec.loader.exec_module(module)
    return module


def _check_external(bootstrap: str) -> None:
    """Fail fast and clearly if ``$STREAMASSIGN_KAFKA_BOOTSTRAP`` does not answer."""
    probe = kafka_script().live_broker_count
    deadline = time.monotonic() + EXTERNAL_PROBE_TIMEOUT
    errors: list[str] = []
    while True:
        for server in bootstrap.split(","):
            host, _, port = server.strip().rpartition(":")
            try:
                if probe(host.strip("[]") or "127.0.0.1", int(port)) >= 1:
                    return
                errors.append(f"{server}: no live brokers in metadata")
            except Exception as exc:  # refused, timeout, bad address, unexpected reply...
                errors.append(f"{server}: {type(exc).__name__}: {exc}")
        if time.monotonic() >= deadline:
            pytest.fail(
                f"{BOOTSTRAP_ENV}={bootstrap!r} is not a reachable Kafka cluster "
                f"after {EXTERNAL_PROBE_TIMEOUT:g}s (last error: {errors[-1]})",
                pytrace=False,
            )
        time.sleep(0.5)


def _live_log(config: pytest.Config) -> Callable[[str], None]:
    """Logger that bypasses output capture, so a slow first install is visible as it runs."""
    capture = config.pluginmanager.getplugin("capturemanager")

    def log(message: str) -> None:
        context = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
        with context:
            sys.stderr.write(f"\n[kafka.py] {message}\n")
            sys.stderr.flush()

    return log


@pytest.fixture(scope="session")
def kafka_bootstrap(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[str]:
    """Bootstrap address ("host:port") of a running Kafka 4 broker for this test session.

    Broker data and logs live in pytest's temp dir (kept for the last few runs), so
    ``<basetemp>/kafka0/logs/server.log`` is there to inspect after a failure.
    """
    external = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if external:
        _check_external(external)
        yield external
        return

    script = kafka_script()
    data_dir = tmp_path_factory.mktemp("kafka")
    broker, error = None, ""
    try:
        broker = script.start_broker(
            data_dir=data_dir, die_with_parent=True, log=_live_log(pytestconfig)
        )
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    if broker is None:  # fail outside `except` so the report is not a chained traceback
        pytest.fail(
            f"Could not start the Kafka test broker.\n{error}\n\n"
            f"Needs Java 17+ and Maven (see docs/testing.md), or set {BOOTSTRAP_ENV}=host:port "
            "to use an existing cluster.",
            pytrace=False,
        )
    atexit.register(broker.stop)  # backstop if the session is torn down abnormally
    try:
        yield broker.bootstrap
    finally:
        broker.stop()
        atexit.unregister(broker.stop)


@pytest.fixture(scope="module")
def secured_kafka(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[SecuredKafka]:
    """A broker of the module's own with SASL listeners (SCRAM-SHA-512; SASL_PLAINTEXT and
    SASL_SSL with a test CA) and ACLs (``scripts/kafka.py start --sasl --tls``); the app
    user of ``secured.APP_USER`` starts with no ACL. Always started here, even with
    ``$STREAMASSIGN_KAFKA_BOOTSTRAP``; its log is ``<basetemp>/kafka-secured*/logs/``."""
    script = kafka_script()
    broker, error = None, ""
    try:
        broker = script.start_broker(
            data_dir=tmp_path_factory.mktemp("kafka-secured"),
            die_with_parent=True,
            security=script.Security(users=(APP_USER,), tls=True),
            log=_live_log(pytestconfig),
        )
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    if broker is None:
        pytest.fail(f"Could not start the secured Kafka test broker.\n{error}", pytrace=False)
    atexit.register(broker.stop)
    try:
        yield SecuredKafka(
            admin_bootstrap=broker.bootstrap,
            sasl_bootstrap=broker.info.sasl_bootstrap,
            sasl_ssl_bootstrap=broker.info.sasl_ssl_bootstrap,
            ca_file=broker.info.ca_file,
            log_file=broker.info.log_file,
        )
    finally:
        broker.stop()
        atexit.unregister(broker.stop)


def _unique_name(base: str) -> str:
    """``base`` made safe for Kafka topic/group names, plus a random suffix."""
    clean = re.sub(r"[^a-zA-Z0-9._-]+", "-", base).strip("-.")[:80] or "it"
    return f"{clean}-{uuid.uuid4().hex[:8]}"


async def _create_topic(bootstrap: str, name: str, partitions: int, config: dict[str, str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config)])
        for topic_error in response.topic_errors:
            _topic, code = topic_error[0], topic_error[1]
            if code != 0:
                raise RuntimeError(f"creating topic {name!r} failed: {topic_error}")
        # Creation is acknowledged by the controller before every partition has a leader on
        # the broker; wait so producers/consumers see the full topic immediately.
        deadline = time.monotonic() + TOPIC_READY_TIMEOUT
        while True:
            (topic,) = await admin.describe_topics([name])
            leaders = [p["leader"] for p in topic["partitions"]]
            if topic["error_code"] == 0 and len(leaders) == partitions and min(leaders) >= 0:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"topic {name!r} has no leaders after creation: {topic}")
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


async def _delete_topics(bootstrap: str, names: list[str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        await admin.delete_topics(names)
    finally:
        await admin.close()


@pytest.fixture
def kafka_topic_factory(
    kafka_bootstrap: str, request: pytest.FixtureRequest
) -> Iterator[TopicFactory]:
    """Create uniquely named topics (deleted after the test).

    ``kafka_topic_factory(partitions=1, *, prefix=None, config=None, name=None) -> topic name``;
    returns once every partition has a leader. Replication factor is 1 (single-node broker).
    ``name`` (unique already, e.g. from ``kafka_group_id_factory``) is for a topic a test names
    before it exists.
    """
    created: list[str] = []

    def create(
        partitions: int = 1,
        *,
        prefix: str | None = None,
        config: dict[str, str] | None = None,
        name: str | None = None,
    ) -> str:
        name = name or _unique_name(prefix or request.node.name)
        asyncio.run(_create_topic(kafka_bootstrap, name, partitions, dict(config or {})))
        created.append(name)
        return name

    yield create
    if created:
        try:
            asyncio.run(_delete_topics(kafka_bootstrap, created))
        except Exception as exc:  # cleanup only: a leftover topic must not fail a test
            warnings.warn(f"could not delete test topics {created}: {exc!r}", stacklevel=1)


@pytest.fixture
def kafka_group_id_factory(request: pytest.FixtureRequest) -> GroupIdFactory:
    """Make unique consumer group ids: ``kafka_group_id_factory(prefix=None) -> str``."""

    def make(prefix: str | None = None) -> str:
        return _unique_name(prefix or f"group-{request.node.name}")

    return make
