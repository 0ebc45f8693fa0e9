"""Why a client could not reach the cluster, in one line (describe's, and the runtime's start):
aiokafka's "Unable to bootstrap" says the same for every cause; the reason is the error it logs
for the failed connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    IllegalSaslStateError,
    KafkaConnectionError,
    NodeNotReadyError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from click.testing import CliRunner

from streamassign import TopicPartition
from streamassign.aiokafka import bootstrap
from streamassign.aiokafka import describe as describe_module
from streamassign.aiokafka.bootstrap import ConnectFailures, connect_failure
from streamassign.aiokafka.describe import (
    Connection,
    RawMember,
    _Admin,
    describe_bytes,
    quality,
)
from streamassign.aiokafka.wire import encode_assignment
from streamassign.cli import main
from streamassign.errors import GroupDescribeError

from .test_describe import TEST_CERT, TEST_KEY, meta

#: aiokafka's line for a failed connection (aiokafka/client.py, ``bootstrap``).
UNABLE_CONNECT = 'Unable connect to "%s:%s": %s'


def log_failed_connection(error: BaseException) -> None:
    """What aiokafka logs when a bootstrap connection fails: the error among the args."""
    logging.getLogger("aiokafka").error(UNABLE_CONNECT, "127.0.0.1", 9093, error)


def test_sasl_refusals_are_worded_from_the_brokers_answer() -> None:
    # The text Kafka 4.3 answers a wrong password with; aiokafka raises it as the error's arg.
    answer = (
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism SCRAM-SHA-512"
    )
    failure = connect_failure(SaslAuthenticationFailed(answer))
    assert failure == bootstrap.ConnectFailure(
        bootstrap.AUTHENTICATION, "authentication failed (SCRAM-SHA-512): invalid credentials"
    )
    other = connect_failure(SaslAuthenticationFailed("Unexpected answer"))
    assert other.text == "authentication failed: Unexpected answer"
    # aiokafka raises this one with the connection as its only arg: the mechanism is ours.
    unsupported = connect_failure(UnsupportedSaslMechanismError(object()), "SCRAM-SHA-256")
    assert unsupported == bootstrap.ConnectFailure(
        bootstrap.MECHANISM, "the broker does not enable SASL mechanism SCRAM-SHA-256"
    )


def test_closed_refused_and_tls_errors_are_told_apart() -> None:
    closed = connect_failure(KafkaConnectionError("Connection at 127.0.0.1:9093 closed"))
    assert closed == bootstrap.ConnectFailure(bootstrap.CLOSED, "the broker closed the connection")
    refused = connect_failure(ConnectionRefusedError(111, "Connect call failed"))
    assert refused.kind == bootstrap.REFUSED
    wrong_version = ssl.SSLError(
        1, "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)"
    )
    assert connect_failure(wrong_version) == bootstrap.ConnectFailure(
        bootstrap.TLS, "TLS: wrong version number"
    )
    assert connect_failure(TimeoutError()).kind == bootstrap.TIMEOUT


def test_a_listener_of_another_protocol_is_not_an_unreachable_broker() -> None:
    # aiokafka raises this one with the connection as its only arg: nothing to quote.
    not_sasl = connect_failure(IllegalSaslStateError(object()))
    assert not_sasl == bootstrap.ConnectFailure(
        bootstrap.NOT_SASL, "the broker answered, but not as a SASL listener"
    )
    reset = connect_failure(ConnectionResetError())
    assert reset == bootstrap.ConnectFailure(bootstrap.RESET, "the broker reset the connection")


def test_only_the_failures_of_the_block_are_kept_and_nothing_stays_attached() -> None:
    handlers = list(logging.getLogger("aiokafka").handlers)
    log_failed_connection(KafkaConnectionError("before"))  # outside: not kept

    async def elsewhere(started: asyncio.Event, go: asyncio.Event) -> None:
        started.set()
        await go.wait()
        log_failed_connection(KafkaConnectionError("another client's"))

    async def refused_connection() -> None:
        log_failed_connection(ConnectionRefusedError())

    async def run() -> ConnectFailures:
        started, go = asyncio.Event(), asyncio.Event()
        other = asyncio.create_task(elsewhere(started, go))  # its context: before the block
        await started.wait()
        with ConnectFailures("PLAIN") as failures:
            # A task the block starts (aiokafka's wait_for, gather) logs for it.
            await asyncio.create_task(refused_connection())
            go.set()
            await other
        log_failed_connection(KafkaConnectionError("after"))
        return failures

    failures = asyncio.run(run())
    assert [type(e) for e in failures.errors] == [ConnectionRefusedError]
    assert failures.reason() == bootstrap.ConnectFailure(bootstrap.REFUSED, "connection refused")
    assert logging.getLogger("aiokafka").handlers == handlers


def test_no_failure_logged_is_no_reason() -> None:
    with ConnectFailures() as failures:
        logging.getLogger("aiokafka").error("Unable to update metadata from %s", [1])
    assert failures.reason() is None


# -- describe's line, against real sockets (aiokafka connecting for real) -------------------------


@attrs.define
class Listener:
    """A local port that accepts connections and ends each at once (``tls``: after a TLS
    handshake with a self-signed certificate), as a TLS or SASL listener ends a PLAINTEXT
    client's connection; in a thread, as the CLI runs its own event loop."""

    tls: ssl.SSLContext | None
    server: socket.socket = attrs.field(factory=socket.socket)
    thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.getsockname()[1]}"

    def start(self) -> None:
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                if self.tls is None:
                    continue
                # The client refuses the certificate: the handshake fails here too.
                with contextlib.suppress(OSError):
                    self.tls.wrap_socket(conn, server_side=True).close()

    def stop(self) -> None:
        self.server.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        self.server.close()
        if self.thread is not None:
            self.thread.join(timeout=10)


def listening(tmp_path: Path, tls: bool) -> Iterator[Listener]:
    context = None
    if tls:
        (tmp_path / "both.pem").write_text(TEST_CERT + TEST_KEY)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tmp_path / "both.pem")
    listener = Listener(context)
    listener.start()
    yield listener
    listener.stop()


@pytest.fixture
def closing_port(tmp_path: Path) -> Iterator[Listener]:
    yield from listening(tmp_path, tls=False)


@pytest.fixture
def tls_port(tmp_path: Path) -> Iterator[Listener]:
    yield from listening(tmp_path, tls=True)


def describe_line(address: str, *args: str) -> str:
    result = CliRunner().invoke(
        main,
        ["describe", "g", "-b", address, "--timeout", "5", *args],
        env={"STREAMASSIGN_SASL_USERNAME": "u", "STREAMASSIGN_SASL_PASSWORD": "p"},
        catch_exceptions=False,
    )
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    return result.output.rstrip("\n")


def test_a_port_that_closes_the_connection_is_not_a_dead_broker(closing_port: Listener) -> None:
    address = closing_port.address
    assert describe_line(address) == (
        f"Error: cannot reach {address}: the broker closed the connection (a TLS or SASL port "
        "asked with PLAINTEXT?)"
    )
    assert describe_line(address, "--security-protocol", "SASL_PLAINTEXT") == (
        f"Error: cannot reach {address}: the broker closed the connection (is the port's "
        "listener SASL_PLAINTEXT? --security-protocol)"
    )


def test_a_refused_connection_says_so() -> None:
    assert describe_line("127.0.0.1:1") == (
        "Error: cannot reach 127.0.0.1:1: connection refused (no broker listening there?)"
    )


def test_an_untrusted_certificate_names_the_ca_option(tls_port: Listener, tmp_path: Path) -> None:
    address = tls_port.address
    line = describe_line(address, "--security-protocol", "SSL")
    assert line == (
        f"Error: cannot reach {address}: TLS: certificate verify failed: self-signed "
        "certificate (no --ssl-cafile: the system's CAs do not trust it)"
    )


def test_a_certificate_for_another_host_says_so(tls_port: Listener, tmp_path: Path) -> None:
    """The certificate trusted (it is its own CA) but not naming 127.0.0.1: the CA is fine."""
    address = tls_port.address
    (tmp_path / "own.pem").write_text(TEST_CERT)
    line = describe_line(
        address, "--security-protocol", "SSL", "--ssl-cafile", f"{tmp_path}/own.pem"
    )
    assert line == (
        f"Error: cannot reach {address}: TLS: certificate verify failed: IP address mismatch, "
        "certificate is not valid for '127.0.0.1'. (the broker's certificate does not name the "
        "--bootstrap host)"
    )


# -- authorization -------------------------------------------------------------------------------


@attrs.define
class RefusingAdmin:
    """An admin client whose FindCoordinator the broker refuses, as for a principal without
    DESCRIBE on the group."""

    def describe_consumer_groups(self, groups: list[str]) -> Any:
        async def refused() -> Any:
            raise GroupAuthorizationFailedError(f"Unable to get coordinator id for {groups[0]}")

        return refused()


def test_a_group_the_principal_may_not_describe_names_the_acl() -> None:
    admin = _Admin(Connection("127.0.0.1:1", timeout_s=1))
    admin.client = RefusingAdmin()
    with pytest.raises(GroupDescribeError) as raised:
        asyncio.run(admin.describe("appD"))
    assert str(raised.value) == (
        "cannot describe group 'appD': not authorized (GroupAuthorizationFailedError): the "
        "principal needs the DESCRIBE ACL on group 'appD'"
    )


def test_topics_the_metadata_refuses_are_kept_as_undescribable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def metadata(admin: Any, topics: list[str]) -> list[dict[str, Any]]:
        code = {"secret": 29, "nosuch": 3}  # TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC
        return [{"topic": t, "error_code": code[t], "partitions": []} for t in topics]

    monkeypatch.setattr(describe_module, "topic_metadata", metadata)
    admin = _Admin(Connection("127.0.0.1:1", timeout_s=1))
    counts = asyncio.run(admin._partition_counts(["nosuch", "secret"]))
    # Whether "secret" exists is not known: no counts at all, as for any other refusal.
    assert counts == (None, frozenset({"secret"}))


def test_subscribed_topics_the_principal_may_not_describe_are_said_so() -> None:
    group = [
        RawMember(
            f"m{k}",
            "c",
            "h",
            meta(["clicks", "secret"], b""),
            encode_assignment([TopicPartition("clicks", k)], b""),
        )
        for k in range(2)
    ]
    view = describe_bytes("app", "Stable", "consumer", "range", group)
    refused = attrs.evolve(view, undescribable_topics=frozenset({"secret"}))
    assert quality(refused).problems == (
        "1 subscribed topic without a partition assigned to any member (missing from the "
        "cluster?): secret",
        "not authorized to describe 1 subscribed topic (secret): whether it exists is not "
        "known (the principal needs DESCRIBE on it)",
    )


# -- the runtime's start -------------------------------------------------------------------------


class Nothing:
    def process(self, record: Any) -> None:
        pass


def test_the_runtime_start_says_why_it_could_not_bootstrap(
    closing_port: Listener, tmp_path: Path
) -> None:
    """aiokafka's own error type (callers catching it still do), with the reason."""
    from streamassign.runtime import App
    from streamassign.topology import Subtopology, Topology

    topology = Topology([Subtopology(0, ["src"], stores=["totals"])], name="app")
    app = App(topology, {0: Nothing}, bootstrap_servers=closing_port.address, state_dir=tmp_path)

    async def start() -> None:
        try:
            await app.start()
        finally:
            await app.stop()

    with pytest.raises(KafkaConnectionError) as raised:
        asyncio.run(start())
    assert str(raised.value).endswith(
        ": the broker closed the connection (is security_protocol the listener's, in "
        "consumer_config and producer_config?)"
    )
    assert "Unable to bootstrap from [('127.0.0.1'" in str(raised.value)


def test_without_logging_set_up_aiokafkas_lines_still_reach_stderr() -> None:
    """Logging's last resort prints a record only when no handler takes it: the block's
    handler must not silence aiokafka's lines for a process that set up no logging."""
    script = (
        "import logging\n"
        "from streamassign.aiokafka.bootstrap import ConnectFailures\n"
        "with ConnectFailures():\n"
        "    logging.getLogger('aiokafka').error('Unable connect to %s: %s', 'h', OSError(5))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert ran.stderr == "Unable connect to h: 5\n"


def test_two_blocks_open_at_once_print_each_line_once() -> None:
    """Two clients starting at once (two apps, two describes): each block keeps its own
    failure, and a process without logging still sees aiokafka's line on stderr, once."""
    script = (
        "import asyncio, logging\n"
        "from streamassign.aiokafka.bootstrap import ConnectFailures\n"
        "async def one(name, both):\n"
        "    with ConnectFailures() as failures:\n"
        "        await both.wait() if name == 'a' else both.set()\n"
        "        await asyncio.sleep(0)\n"
        "        logging.getLogger('aiokafka.conn').error('Unable connect to %s: %s', name,\n"
        "                                                 OSError(name))\n"
        "        await asyncio.sleep(0)\n"
        "        return [str(e) for e in failures.errors]\n"
        "async def main():\n"
        "    both = asyncio.Event()\n"
        "    print(await asyncio.gather(one('a', both), one('b', both)))\n"
        "asyncio.run(main())\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert ran.stdout == "[['a'], ['b']]\n"
    assert sorted(ran.stderr.splitlines()) == ["Unable connect to a: a", "Unable connect to b: b"]


def test_an_error_before_counts_appended_to_the_line_is_kept() -> None:
    """The runtime's flood filter appends its counts to a line it lets through after holding
    others back: the error is not the last argument then."""
    with ConnectFailures() as failures:
        logging.getLogger("aiokafka").error(
            UNABLE_CONNECT + " (%d similar lines held back over %s)",
            "127.0.0.1",
            9093,
            ConnectionRefusedError(),
            2,
            "11 s",
        )
    assert failures.reason() == bootstrap.ConnectFailure(bootstrap.REFUSED, "connection refused")


def test_a_start_error_without_a_reason_keeps_its_own_cause(tmp_path: Path) -> None:
    """A connection error the block has no reason for is raised as it is, with the cause
    aiokafka gave it (a reset, a TLS error), not made its own cause."""
    from streamassign.runtime import App
    from streamassign.topology import Subtopology, Topology

    topology = Topology([Subtopology(0, ["src"])], name="app")
    app = App(topology, {0: Nothing}, bootstrap_servers="127.0.0.1:1", state_dir=tmp_path)
    reset = ConnectionResetError("reset by peer")

    async def closed(*args: object, **kwargs: object) -> dict[str, int]:
        raise KafkaConnectionError("Connection at 127.0.0.1:1 closed") from reset

    async def start() -> None:
        try:
            await app.start()
        finally:
            await app.stop()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("streamassign.runtime.app.ensure_internal_topics", closed)
        with pytest.raises(KafkaConnectionError) as raised:
            asyncio.run(start())
    assert raised.value.__cause__ is reset


@pytest.mark.parametrize(
    ("code", "message", "kind"),
    [
        (19, "self-signed certificate in certificate chain", bootstrap.CERTIFICATE),
        (20, "unable to get local issuer certificate", bootstrap.CERTIFICATE),
        (10, "certificate has expired", bootstrap.TLS),
        (64, "IP address mismatch", bootstrap.HOSTNAME),
    ],
)
def test_only_an_untrusted_chain_is_a_ca_problem(code: int, message: str, kind: str) -> None:
    """An expired certificate is not fixed by another CA file: no CA hint for it."""
    error = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] {message}")
    error.verify_code, error.verify_message = code, message
    assert connect_failure(error) == bootstrap.ConnectFailure(
        kind, f"TLS: certificate verify failed: {message}"
    )


# -- a coordinator restarting --------------------------------------------------------------------


@attrs.define
class RestartingCoordinator:
    """An admin client whose group coordinator's broker is away for the first ``away`` asks
    (aiokafka's NodeNotReadyError), then loading the group once (an entry error), then
    answers with a Stable group of no members."""

    away: int
    asked: int = 0

    def describe_consumer_groups(self, groups: list[str]) -> Any:
        self.asked += 1
        asked = self.asked

        async def answer() -> Any:
            if asked <= self.away:
                raise NodeNotReadyError("Attempt to send a request to node which is not ready")
            code = 14 if asked == self.away + 1 else 0  # COORDINATOR_LOAD_IN_PROGRESS
            group = {"error_code": code, "group": groups[0], "state": "Stable",
                     "protocol_type": "consumer", "protocol": "range", "members": []}  # fmt: skip
            return [SimpleNamespace(to_object=lambda: {"groups": [group]})]

        return answer()


def test_a_coordinator_restarting_is_asked_again_within_the_timeout() -> None:
    admin = _Admin(Connection("127.0.0.1:1", timeout_s=5))
    admin.client = RestartingCoordinator(away=2)
    view = asyncio.run(admin.describe("app"))
    assert (view.state, admin.client.asked) == ("Stable", 4)


def test_a_coordinator_away_past_the_timeout_is_one_line_that_says_so() -> None:
    admin = _Admin(Connection("127.0.0.1:1", timeout_s=0.5))
    admin.client = RestartingCoordinator(away=1000)
    with pytest.raises(GroupDescribeError) as raised:
        asyncio.run(admin.describe("app"))
    line = str(raised.value)
    assert line.startswith(
        "cannot describe group 'app': NodeNotReadyError: Attempt to send a request to node "
        f"which is not ready (asked {admin.client.asked} times over 0."
    )
    assert line.endswith(
        " s: the group's coordinator restarting or moving, or its address unreachable?)"
    )
    assert 3 <= admin.client.asked <= 5


@pytest.mark.parametrize(
    ("protocol", "hint"),
    [
        ("PLAINTEXT", ""),
        (
            "SASL_SSL",
            " (a port without TLS asked with SASL_SSL? --security-protocol; or the broker "
            "refusing more connections from this address)",
        ),
    ],
)
def test_a_reset_is_told_as_a_protocol_question_only_when_tls_was_asked(
    protocol: str, hint: str
) -> None:
    reset = bootstrap.ConnectFailure(bootstrap.RESET, "the broker reset the connection")
    connection = Connection("127.0.0.1:1", security_protocol=protocol, timeout_s=1)
    line = describe_module._unreachable(ConnectionError(), reset, connection)
    assert line == "the broker reset the connection" + hint


@pytest.mark.parametrize("kind", [bootstrap.NOT_SASL, bootstrap.RESET])
def test_an_app_on_a_listener_of_another_protocol_is_told_to_check_security_protocol(
    kind: str,
) -> None:
    from streamassign.runtime.app import _with_reason

    failure = bootstrap.ConnectFailure(kind, "the broker answered")
    unable = KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1, 0)]")
    said = str(_with_reason(unable, failure))
    assert said.startswith("KafkaConnectionError: Unable to bootstrap")
    assert "the broker answered (is security_protocol the listener's, in consumer_config" in said
