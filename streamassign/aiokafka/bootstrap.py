"""Why aiokafka could not bootstrap: the reason of its last failed connection.

aiokafka's ``Unable to bootstrap from [...]`` says the same for a dead broker, a wrong
password, an untrusted certificate and a client speaking PLAINTEXT to a TLS port; the cause is
only in the log record it writes for each failed connection (``Unable connect to "host:port":
<error>``, the error object among the record's arguments). ``ConnectFailures`` keeps those
errors while a client starts, and ``connect_failure`` words one of them for a one-line error.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import ssl
from types import TracebackType

import attrs
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

#: The ``ConnectFailures`` whose block the running task (or a task it started) is in: records
#: of clients started elsewhere meanwhile are not its own.
_collecting: contextvars.ContextVar[ConnectFailures | None] = contextvars.ContextVar(
    "streamassign_connect_failures", default=None
)

#: Kinds of ``ConnectFailure``: what a caller may add a hint to, in its own option names.
AUTHENTICATION = "authentication"
MECHANISM = "mechanism"
CERTIFICATE = "certificate"
HOSTNAME = "hostname"
TLS = "tls"
CLOSED = "closed"
#: The broker answered the SASL handshake as a listener without SASL does.
NOT_SASL = "not-sasl"
#: The broker reset the connection: what a listener without TLS does with a TLS hello (and
#: a broker over its connection quota with any).
RESET = "reset"
REFUSED = "refused"
TIMEOUT = "timeout"
OTHER = "other"

#: Kafka's SaslAuthenticate answer: "Authentication failed during authentication due to
#: invalid credentials with SASL mechanism SCRAM-SHA-512".
_SASL_ANSWER = re.compile(r"due to (?P<why>.+?) with SASL mechanism (?P<mechanism>\S+)")
#: Python's ssl error text: "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed:
#: self-signed certificate in certificate chain (_ssl.c:1006)".
_SSL_TEXT = re.compile(r"^(\[[^]]*\]\s*)?(?P<text>.*?)(\s*\(_ssl\.c:\d+\))?$")

#: OpenSSL's verify codes for a certificate a CA vouches for that does not name the host or
#: address connected to (X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH).
_NAME_MISMATCH = frozenset({62, 64})
#: OpenSSL's verify codes for a chain no trusted CA vouches for (unable to get the issuer,
#: locally or at all; self-signed, alone or in the chain; unable to verify the leaf): where
#: the CA option is the fix. An expired or not yet valid certificate is not one of them.
_UNTRUSTED = frozenset({2, 18, 19, 20, 21})


@attrs.frozen
class ConnectFailure:
    """One failed connection, worded: ``kind`` (one of the kinds above) and ``text``."""

    kind: str
    text: str


def connect_failure(error: BaseException, sasl_mechanism: str | None = None) -> ConnectFailure:
    """``error`` (what aiokafka logged for a failed connection) worded for a one-line error;
    ``sasl_mechanism``, when known, names the mechanism a broker did not enable."""
    if isinstance(error, SaslAuthenticationFailed):
        return ConnectFailure(AUTHENTICATION, _authentication_text(error))
    if isinstance(error, UnsupportedSaslMechanismError):
        which = f" {sasl_mechanism}" if sasl_mechanism else ""
        return ConnectFailure(MECHANISM, f"the broker does not enable SASL mechanism{which}")
    if isinstance(error, ssl.SSLCertVerificationError):
        code = error.verify_code
        kind = HOSTNAME if code in _NAME_MISMATCH else CERTIFICATE if code in _UNTRUSTED else TLS
        return ConnectFailure(kind, f"TLS: {_ssl_text(error)}")
    if isinstance(error, ssl.SSLError):
        return ConnectFailure(TLS, f"TLS: {_ssl_text(error)}")
    if isinstance(error, ConnectionRefusedError):
        return ConnectFailure(REFUSED, "connection refused")
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        return ConnectFailure(TIMEOUT, "the connection timed out")
    if isinstance(error, KafkaConnectionError) and str(error).endswith(" closed"):
        return ConnectFailure(CLOSED, "the broker closed the connection")
    if isinstance(error, IllegalSaslStateError):
        # aiokafka's text is only the connection's repr; Kafka answers a SaslHandshake so on
        # a listener whose protocol is PLAINTEXT or SSL.
        return ConnectFailure(NOT_SASL, "the broker answered, but not as a SASL listener")
    if isinstance(error, ConnectionResetError):
        return ConnectFailure(RESET, "the broker reset the connection")
    if isinstance(error, KafkaError | OSError):
        return ConnectFailure(OTHER, str(error) or type(error).__name__)
    return ConnectFailure(OTHER, f"{type(error).__name__}: {error}")


def _authentication_text(error: SaslAuthenticationFailed) -> str:
    answer = " ".join(str(a) for a in error.args)
    found = _SASL_ANSWER.search(answer)
    if found is None:
        return f"authentication failed: {answer}" if answer else "authentication failed"
    return f"authentication failed ({found['mechanism']}): {found['why']}"


def _ssl_text(error: ssl.SSLError) -> str:
    text = str(getattr(error, "verify_message", "") or "")
    if isinstance(error, ssl.SSLCertVerificationError) and text:
        return f"certificate verify failed: {text}"
    found = _SSL_TEXT.match(str(error.args[-1]) if error.args else str(error))
    return found["text"] if found and found["text"] else (error.reason or type(error).__name__)


class ConnectFailures(logging.Handler):
    """Within ``with``: the errors aiokafka logs for failed connections of the clients this
    task (and the tasks it starts) uses, in order; outside, nothing is kept or attached."""

    def __init__(self, sasl_mechanism: str | None = None) -> None:
        super().__init__(logging.WARNING)
        self.sasl_mechanism = sasl_mechanism
        self.errors: list[BaseException] = []
        self._token: contextvars.Token[ConnectFailures | None] | None = None

    def __enter__(self) -> ConnectFailures:
        self._token = _collecting.set(self)
        logging.getLogger("aiokafka").addHandler(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        logging.getLogger("aiokafka").removeHandler(self)
        if self._token is not None:
            _collecting.reset(self._token)
            self._token = None

    def emit(self, record: logging.LogRecord) -> None:
        self._as_without_it(record)
        if _collecting.get() is not self or not isinstance(record.args, tuple):
            return
        # Anywhere among the arguments: the runtime's BrokerAwayLines appends its counts to a
        # line it let through after holding others back.
        error = next((a for a in reversed(record.args) if isinstance(a, BaseException)), None)
        if error is not None:
            self.errors.append(error)

    def _as_without_it(self, record: logging.LogRecord) -> None:
        """A record no other handler takes goes to logging's last resort (stderr), as it
        would without this one: a handler anywhere on the way switches the last resort off.
        Of several blocks open at once (two apps starting), the first passes it on, once."""
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if any(not isinstance(handler, ConnectFailures) for handler in logger.handlers):
                return
            logger = logger.parent if logger.propagate else None
        ours = [h for h in logging.getLogger("aiokafka").handlers if isinstance(h, ConnectFailures)]
        if ours and ours[0] is not self:
            return
        last_resort = logging.lastResort
        if last_resort is not None and record.levelno >= last_resort.level:
            last_resort.handle(record)

    def reason(self) -> ConnectFailure | None:
        """The last failed connection, worded; None when aiokafka logged none."""
        if not self.errors:
            return None
        return connect_failure(self.errors[-1], self.sasl_mechanism)
