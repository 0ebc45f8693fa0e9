"""What a user sees on a secured cluster: a broker of this module's own with SASL listeners
(SCRAM-SHA-512; SASL_PLAINTEXT, and SASL_SSL with a test CA) and Kafka's StandardAuthorizer,
the app user granted exactly the ACLs each test names. Every line is compared exactly with
the one docs/operations.md, docs/runtime.md and docs/faust.md "Secured clusters" show.

``describe``'s one line for a wrong password, a mechanism the broker does not enable, PLAINTEXT
asked of the SASL port, a CA the client lacks, and a group it may not describe. The runtime
``App``'s for a wrong password, PLAINTEXT asked of the SASL port and a CA it lacks, and for an
ACL of docs/runtime.md's list taken away: READ on the source topic, READ on the group, CREATE
on the internal topics, WRITE on the output, exactly once WRITE on the transactional ids (after
the last two, the right granted, a restart writes every record once); with exactly that list
it counts every record, and stops when READ on its group is taken away. A Faust worker on the
drop-in without READ on its group logs so, and reads every record once READ is granted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError
from click.testing import CliRunner

from streamassign.cli import main
from streamassign.errors import (
    GroupNotAuthorizedError,
    InternalTopicNotAuthorizedError,
    MissingTopicsError,
    OutputNotAuthorizedError,
    ProducerStartError,
    SourceTopicsNotAuthorizedError,
    TransactionalIdNotAuthorizedError,
)
from streamassign.runtime import App

from .conftest import KAFKA_SCRIPT, _unique_name, kafka_script
from .procs import JsonLinesProcess
from .secured import (
    APP_USER,
    MECHANISM,
    PREFIXED,
    Acl,
    SecuredKafka,
    grant,
    refused_verification,
    revoke,
)
from .secured_apps import KEYS, RECORDS, app_acls, app_topics, outputs, stopped_by_failure
from .test_runtime_clients import make_app, run_app, table, until

#: What ``Counts`` writes for ``RECORDS`` on one partition, each once, sorted.
ONE_OUTPUT_PER_RECORD = sorted(b"0:%d" % offset for offset in range(len(RECORDS)))
#: OpenSSL's X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN: the broker's chain ends at a CA the client
#: does not hold.
SELF_SIGNED_CERT_IN_CHAIN = 19


def without(acls: list[Acl], *taken: Acl) -> list[Acl]:
    return [acl for acl in acls if acl not in taken]


@pytest.fixture
def names(secured_kafka: SecuredKafka) -> Iterator[tuple[str, str, str]]:
    """An application id, its source topic (holding ``RECORDS``) and its output topic."""
    with app_topics(secured_kafka, "secured") as names:
        yield names


def describe(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["describe", *args, "--timeout", "20"])
    return result.exit_code, result.output


def sasl_args(
    kafka: SecuredKafka, password: str = APP_USER[1], mechanism: str = MECHANISM
) -> list[str]:
    return [
        "-b",
        kafka.sasl_bootstrap,
        "--security-protocol",
        "SASL_PLAINTEXT",
        "--sasl-mechanism",
        mechanism,
        "--sasl-username",
        APP_USER[0],
        "--sasl-password",
        password,
    ]


def test_only_a_secured_brokers_state_has_the_security_keys(tmp_path: Path) -> None:
    """``scripts/kafka.py status`` (and ``start --json``) of a plain broker shows no empty
    SASL/TLS keys; a state file without them still loads."""
    script = kafka_script()
    plain = script.BrokerInfo(
        "4.3.1", 1, "127.0.0.1:1", "127.0.0.1:2", "id", "/data", True, "/log", 0.0, 1.0
    )
    state = tmp_path / "broker.json"
    plain.save(state)
    status = subprocess.run(
        [sys.executable, str(KAFKA_SCRIPT), "status", "--state-file", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    shown = json.loads(status.stdout)
    assert (status.returncode, shown) == (1, {**plain.as_dict(), "running": False})
    assert set(script.SECURITY_FIELDS).isdisjoint(shown)
    assert script.BrokerInfo.load(state) == plain
    secured = dataclasses.replace(plain, sasl_bootstrap="127.0.0.1:3")
    keys = set(secured.as_dict()) & set(script.SECURITY_FIELDS)
    assert keys == {"sasl_bootstrap"}


def untrusted_ca_text(kafka: SecuredKafka) -> str:
    """The product's words for the SASL_SSL listener's certificate refused by a client without
    the test CA: its own around OpenSSL's wording of the failure, taken from a handshake of
    the test's (OpenSSL versions word it differently), whose class is checked."""
    refused = refused_verification(kafka.sasl_ssl_bootstrap)
    assert refused.verify_code == SELF_SIGNED_CERT_IN_CHAIN, refused
    return f"TLS: certificate verify failed: {refused.verify_message}"


def test_describe_says_why_it_cannot_reach_a_secured_broker(secured_kafka: SecuredKafka) -> None:
    kafka = secured_kafka
    sasl, tls = kafka.sasl_bootstrap, kafka.sasl_ssl_bootstrap
    cases = {
        "wrong password": (
            sasl_args(kafka, password="wrong"),
            f"Error: cannot reach {sasl}: authentication failed (SCRAM-SHA-512): "
            "invalid credentials",
        ),
        "mechanism not enabled": (
            sasl_args(kafka, mechanism="SCRAM-SHA-256"),
            f"Error: cannot reach {sasl}: the broker does not enable SASL mechanism "
            "SCRAM-SHA-256 (--sasl-mechanism)",
        ),
        "PLAINTEXT to the SASL port": (
            ["-b", sasl],
            f"Error: cannot reach {sasl}: the broker closed the connection "
            "(a TLS or SASL port asked with PLAINTEXT?)",
        ),
        "no CA for the test CA": (
            [*sasl_args(kafka), "--security-protocol", "SASL_SSL", "-b", tls],
            f"Error: cannot reach {tls}: {untrusted_ca_text(kafka)} (no --ssl-cafile: the "
            "system's CAs do not trust it)",
        ),
    }
    seen = {what: describe("no-such-group", *args) for what, (args, _) in cases.items()}
    assert seen == {what: (1, line + "\n") for what, (_, line) in cases.items()}


def test_describe_names_the_describe_acl_it_lacks(secured_kafka: SecuredKafka) -> None:
    group = _unique_name("undescribed")
    line = (
        f"Error: cannot describe group {group!r}: not authorized "
        f"(GroupAuthorizationFailedError): the principal needs the DESCRIBE ACL on group {group!r}"
    )
    assert describe(group, *sasl_args(secured_kafka)) == (1, line + "\n")
    # Over TLS, with the CA: the same answer (the connection itself is fine).
    tls = [*sasl_args(secured_kafka), "--security-protocol", "SASL_SSL"]
    tls += ["-b", secured_kafka.sasl_ssl_bootstrap, "--ssl-cafile", secured_kafka.ca_file]
    assert describe(group, *tls) == (1, line + "\n")


async def start_refused(app: App) -> BaseException:
    """What ``app.start()`` raises (it must), the app stopped after."""
    try:
        await app.start()
    except Exception as exc:
        return exc
    finally:
        await app.stop()
    raise AssertionError("the app started")


def start_without(
    kafka: SecuredKafka, names: tuple[str, str, str], tmp_path: Path, missing: Acl
) -> BaseException:
    """What the app's start raises with every ACL the docs list but ``missing``."""
    group, source, output = names
    grant(kafka, *without(app_acls(group, source, output), missing))
    config = kafka.client_config()
    app = make_app(kafka.sasl_bootstrap, group, source, tmp_path, consumer_config=config)
    return asyncio.run(start_refused(app))


@pytest.mark.parametrize(
    ("mistake", "reason"),
    [
        ("wrong password", "authentication failed (SCRAM-SHA-512): invalid credentials"),
        (
            "PLAINTEXT to the SASL port",
            "the broker closed the connection (is security_protocol the listener's, in "
            "consumer_config and producer_config?)",
        ),
        ("no CA for the test CA", "{untrusted} (is the CA of ssl_context the broker's?)"),
    ],
    ids=["wrong-password", "plaintext-to-sasl", "untrusted-ca"],
)
def test_an_app_that_cannot_connect_says_why(
    secured_kafka: SecuredKafka,
    names: tuple[str, str, str],
    tmp_path: Path,
    mistake: str,
    reason: str,
) -> None:
    kafka = secured_kafka
    group, source, _ = names
    bootstrap, config = kafka.sasl_bootstrap, kafka.client_config()
    if mistake == "wrong password":
        config = kafka.client_config(password="wrong")
    elif mistake == "PLAINTEXT to the SASL port":
        config = {}
    else:
        bootstrap, config = kafka.sasl_ssl_bootstrap, kafka.client_config(tls=True)
        config["ssl_context"] = ssl.create_default_context()  # the system's CAs only
        reason = reason.format(untrusted=untrusted_ca_text(kafka))
    app = make_app(bootstrap, group, source, tmp_path, consumer_config=config)
    refused = asyncio.run(start_refused(app))
    assert isinstance(refused, KafkaConnectionError)
    expected = rf"KafkaConnectionError: Unable to bootstrap from \[.*\]: {re.escape(reason)}"
    assert re.fullmatch(expected, str(refused)), str(refused)


def test_an_app_without_read_on_its_source_topic_does_not_start(
    secured_kafka: SecuredKafka, names: tuple[str, str, str], tmp_path: Path
) -> None:
    source = names[1]
    refused = start_without(secured_kafka, names, tmp_path, Acl.topic(source, "READ"))
    assert isinstance(refused, SourceTopicsNotAuthorizedError)
    assert isinstance(refused, MissingTopicsError)
    assert refused.topics == (source,)
    assert str(refused) == (
        f"source topics not authorized for User:app: {source}: grant READ on each (it "
        "implies the DESCRIBE the metadata request needs; the broker answers so whether a "
        "topic exists or not)"
    )


def test_an_app_without_read_on_its_group_does_not_start(
    secured_kafka: SecuredKafka, names: tuple[str, str, str], tmp_path: Path
) -> None:
    group = names[0]
    refused = start_without(secured_kafka, names, tmp_path, Acl.group(group, "READ"))
    assert isinstance(refused, GroupNotAuthorizedError)
    assert str(refused) == (
        f"consumer group {group!r} not authorized for User:app: grant READ on group "
        f"{group!r} (joining, heartbeats and offset commits need it)"
    )


def test_an_app_without_create_on_its_internal_topics_says_how_to_create_them(
    secured_kafka: SecuredKafka, names: tuple[str, str, str], tmp_path: Path
) -> None:
    group = names[0]
    refused = start_without(
        secured_kafka, names, tmp_path, Acl.topic(f"{group}-", "CREATE", PREFIXED)
    )
    assert isinstance(refused, InternalTopicNotAuthorizedError)
    changelog = f"{group}-counts-changelog"
    assert str(refused) == (
        f"creating internal topic {changelog!r} not authorized for User:app: grant CREATE on "
        "it (a PREFIXED ACL on '<application id>-' covers every internal topic), or create "
        "it beforehand: 1 partition(s), the broker's default replication factor, "
        "cleanup.policy=compact"
    )


def test_an_app_counts_with_its_acls_and_stops_when_read_on_its_group_is_taken_away(
    secured_kafka: SecuredKafka, names: tuple[str, str, str], tmp_path: Path
) -> None:
    kafka = secured_kafka
    group, source, output = names
    grant(kafka, *app_acls(group, source, output))
    config = kafka.client_config()
    app = make_app(kafka.sasl_bootstrap, group, source, tmp_path, consumer_config=config)

    async def scenario() -> None:
        await app.start()
        try:
            await until("every record counted", lambda: table(app) == dict.fromkeys(KEYS, 3), app)
            await asyncio.to_thread(revoke, kafka, Acl.group(group, "READ"))
            await stopped_by_failure(app)
        finally:
            await app.stop()

    asyncio.run(scenario())
    assert isinstance(app.failure, GroupNotAuthorizedError)
    assert str(app.failure) == (
        f"consumer group {group!r} not authorized for User:app: grant READ on group "
        f"{group!r} (joining, heartbeats and offset commits need it)"
    )
    assert sorted(outputs(kafka, output)) == ONE_OUTPUT_PER_RECORD


def test_an_exactly_once_app_without_write_on_its_transactional_ids_stops(
    secured_kafka: SecuredKafka, names: tuple[str, str, str], tmp_path: Path
) -> None:
    """Then, that WRITE granted, a restart counts every record and writes each output once."""
    kafka = secured_kafka
    group, source, output = names
    grant(kafka, *app_acls(group, source, output))
    config = kafka.client_config()
    options = {"consumer_config": config, "processing_guarantee": "exactly_once"}
    app = make_app(kafka.sasl_bootstrap, group, source, tmp_path, **options)
    asyncio.run(until_failed(app))
    assert isinstance(app.failure, TransactionalIdNotAuthorizedError)
    assert isinstance(app.failure, ProducerStartError)
    assert str(app.failure) == (
        f"task 0_0: its transactional producer cannot start: transactional id "
        f"'{group}-0_0' not authorized for User:app: grant WRITE on transactional id "
        f"'{group}-0_0' (a PREFIXED ACL on '{group}-' covers every task's producer)"
    )
    grant(kafka, Acl.transactional_ids(f"{group}-"))
    again = make_app(kafka.sasl_bootstrap, group, source, tmp_path, **options)

    async def counted() -> None:
        await until("every record counted", lambda: table(again) == dict.fromkeys(KEYS, 3), again)

    asyncio.run(run_app(again, counted))
    assert again.failure is None, again.failure
    assert sorted(outputs(kafka, output)) == ONE_OUTPUT_PER_RECORD


async def until_failed(app: App) -> None:
    """Start ``app`` and wait until a failure stops it; stop it."""
    await app.start()
    try:
        await stopped_by_failure(app)
    finally:
        await app.stop()


def test_an_app_without_write_on_its_output_stops_and_runs_exactly_once_granted(
    secured_kafka: SecuredKafka, names: tuple[str, str, str], tmp_path: Path
) -> None:
    """Over SASL_SSL: the first send stops the app with nothing committed; WRITE granted, a
    restart counts and writes every record once."""
    kafka = secured_kafka
    group, source, output = names
    acls = app_acls(group, source, output)
    grant(kafka, *without(acls, Acl.topic(output, "WRITE")))
    config = kafka.client_config(tls=True)

    app = make_app(kafka.sasl_ssl_bootstrap, group, source, tmp_path, consumer_config=config)
    asyncio.run(until_failed(app))
    assert isinstance(app.failure, OutputNotAuthorizedError)
    assert re.fullmatch(
        rf"task 0_0: writing to topic '{output}' not authorized for User:app: grant WRITE "
        rf"on topic '{output}' \(.*\); nothing committed, stopping \(it would be refused again\)",
        str(app.failure),
    ), str(app.failure)

    grant(kafka, Acl.topic(output, "WRITE"))
    again = make_app(kafka.sasl_ssl_bootstrap, group, source, tmp_path, consumer_config=config)

    async def counted() -> None:
        await until("every record counted", lambda: table(again) == dict.fromkeys(KEYS, 3), again)

    asyncio.run(run_app(again, counted))
    assert again.failure is None, again.failure
    assert sorted(outputs(kafka, output)) == ONE_OUTPUT_PER_RECORD


FAUST_WORKER = Path(__file__).with_name("secured_faust_worker.py")
#: What the Faust drop-in logs while its group is not authorized (docs/faust.md).
GROUP_REFUSED = (
    "not authorized to the group {group!r} (GroupAuthorizationFailedError): grant the app's "
    "principal READ on the group; trying again"
)
FAUST_DEADLINE = 90.0


def test_a_faust_worker_without_read_on_its_group_says_so_and_joins_once_granted(
    secured_kafka: SecuredKafka, names: tuple[str, str, str], tmp_path: Path
) -> None:
    """SASL_SSL through ``broker_credentials``; the ACLs of docs/faust.md but the group's."""
    kafka = secured_kafka
    group, source, _ = names
    grant(
        kafka,
        Acl.topic(source, "READ"),
        *(Acl.topic(f"{group}-", op, PREFIXED) for op in ("READ", "WRITE", "CREATE")),
    )
    log = tmp_path / "worker.log"
    log.touch()
    args = {
        "bootstrap": kafka.sasl_ssl_bootstrap,
        "cafile": kafka.ca_file,
        "user": APP_USER[0],
        "password": APP_USER[1],
        "app": group,
        "topic": source,
        "datadir": str(tmp_path / "data"),
        "log": str(log),
    }
    stderr = tmp_path / "worker.stderr"
    worker = JsonLinesProcess(FAUST_WORKER, [f"--{k}={v}" for k, v in args.items()], stderr)
    worker_files = (stderr, log)
    try:
        line = GROUP_REFUSED.format(group=group)
        in_log = f"{line!r} in {log}"
        wait_for(lambda: line in log.read_text(), FAUST_DEADLINE, in_log, worker, worker_files)
        grant(kafka, Acl.group(group, "READ"))

        def every_record_read() -> bool:
            worker.drain()
            return len(worker.lines) >= len(RECORDS)

        wait_for(every_record_read, FAUST_DEADLINE, "every record read", worker, worker_files)
        offsets = sorted(line["offset"] for line in worker.lines)
        assert offsets == list(range(len(RECORDS))), offsets
    finally:
        worker.stop()


def wait_for(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    worker: JsonLinesProcess,
    files: Sequence[Path],
) -> None:
    """Wait until ``condition``; else fail with the end of each of the worker's ``files``
    (its stderr: a traceback before its logging started, say; its log)."""
    deadline = time.monotonic() + timeout
    while not condition():
        code = worker.proc.poll()
        assert code is None, f"the worker exited ({code}) before {what}\n{tails(files)}"
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}\n{tails(files)}"
        time.sleep(0.2)


def tails(paths: Sequence[Path], lines: int = 40) -> str:
    """The last ``lines`` of each of ``paths``, under its name."""
    shown = []
    for path in paths:
        text = path.read_text(errors="replace") if path.exists() else "(none)"
        shown.append(f"--- {path}:\n" + "\n".join(text.splitlines()[-lines:]))
    return "\n".join(shown)
