"""``describe``'s connection options: bootstrap servers, SASL and SSL settings and PEM files,
checked before any broker is asked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from .options import _given


def _connection(bootstrap: str, timeout: float, security: Mapping[str, Any]) -> Any:
    import importlib.util

    if importlib.util.find_spec("aiokafka") is None:
        raise click.ClickException(
            "describe needs aiokafka, from the aiokafka extra: pip install 'streamassign[aiokafka]'"
        )
    from ..aiokafka.describe import Connection

    _check_bootstrap(bootstrap)
    return Connection(bootstrap, timeout_s=timeout, **security)


def _check_bootstrap(bootstrap: str) -> None:
    """Each address of ``--bootstrap`` as aiokafka parses it (``HOST[:PORT]``, ``[IPv6]:PORT``),
    or a usage error naming the bad one: aiokafka's own says only ``invalid literal for
    int()``, after a "cannot reach"."""
    from aiokafka.conn import get_ip_port_afi

    addresses = bootstrap.strip().split(",")
    for n, address in enumerate(addresses):
        if not address.strip() and len(addresses) > 1:  # "'' is not HOST:PORT" hides the comma
            where = "before" if n == 0 else "after"
            raise click.BadParameter(
                f"{bootstrap.strip()!r} has an empty address {where} a comma (several: "
                "HOST:PORT,HOST:PORT)",
                param_hint="'--bootstrap'",
            )
        try:
            host, port, _ = get_ip_port_afi(address)
        except ValueError:
            host, port = "", 0
        if not host or not 0 < port < 65536:
            raise click.BadParameter(
                f"{address.strip()!r} is not HOST:PORT (e.g. localhost:9092; several: "
                "HOST:PORT,HOST:PORT)",
                param_hint="'--bootstrap'",
            )


#: The environment variables ``describe`` reads the SASL credentials from (click's envvar).
_SASL_ENV = {
    "sasl_username": "STREAMASSIGN_SASL_USERNAME",
    "sasl_password": "STREAMASSIGN_SASL_PASSWORD",
}


def _option_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def _check_security(security: Mapping[str, Any]) -> None:
    """Refuse security options that cannot work together, before any client is built: SASL
    without its credentials, ``--ssl-*`` or ``--sasl-*`` options the protocol would ignore
    (a user who passes a CA file expects TLS; restating a default is no conflict), certificate
    files that are not PEM."""
    protocol = security["security_protocol"]
    sasl, tls = protocol.startswith("SASL_"), protocol.endswith("SSL")
    # Restating a default (--sasl-mechanism PLAIN) changes nothing: only other values are refused.
    defaults = {p.name: p.default for p in click.get_current_context().command.params}
    given = [
        field
        for field, value in security.items()
        if value is not None and _given(field) and value != defaults.get(field)
    ]
    ignored = [f for f in given if (f.startswith("ssl_") and not tls)]
    ignored += [f for f in given if f.startswith("sasl_") and not sasl]
    if ignored:
        ssl_option = ignored[0].startswith("ssl_")
        wanted = "SSL or SASL_SSL" if ssl_option else "SASL_PLAINTEXT or SASL_SSL"
        raise click.UsageError(
            f"{_option_name(ignored[0])} needs --security-protocol {wanted} (it is {protocol}: "
            "the option would be ignored)"
        )
    for field, env in _SASL_ENV.items():
        if sasl and security[field] is None:
            raise click.UsageError(
                f"--security-protocol {protocol} needs {_option_name(field)} (or ${env})"
            )
    if tls:
        _check_pem_files(security["ssl_cafile"], security["ssl_certfile"], security["ssl_keyfile"])


def _check_pem_files(cafile: str | None, certfile: str | None, keyfile: str | None) -> None:
    """Load the TLS files as the client will (``ssl`` and OpenSSL): one line naming the option
    and the file that cannot be used, instead of OpenSSL's ``PEM lib``."""
    import ssl

    def no_password() -> bytes:  # an encrypted key: refuse, never prompt on the terminal
        raise click.BadParameter(
            f"{keyfile or certfile}: the private key is encrypted; give an unencrypted key",
            param_hint="'--ssl-keyfile'" if keyfile else "'--ssl-certfile'",
        )

    if keyfile is not None and certfile is None:
        raise click.UsageError("--ssl-keyfile needs --ssl-certfile (the client certificate)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for option, path in (("--ssl-cafile", cafile), ("--ssl-certfile", certfile)):
        if path is None:
            continue
        try:
            context.load_verify_locations(cafile=path)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise click.BadParameter(
                f"{path}: not a PEM certificate file{_ssl_reason(exc)}", param_hint=f"'{option}'"
            ) from None
    if certfile is None:
        return
    try:
        context.load_cert_chain(certfile, keyfile, password=no_password)
    except (ssl.SSLError, OSError) as exc:
        if keyfile is None:
            raise click.BadParameter(
                f"{certfile}: holds no private key matching its certificate{_ssl_reason(exc)}; "
                "give the key with --ssl-keyfile",
                param_hint="'--ssl-certfile'",
            ) from None
        raise click.BadParameter(
            f"{keyfile}: not the PEM private key of the certificate in {certfile}"
            f"{_ssl_reason(exc)}",
            param_hint="'--ssl-keyfile'",
        ) from None


def _ssl_reason(exc: Exception) -> str:
    """OpenSSL's short reason (``NO_CERTIFICATE_OR_CRL_FOUND``) in parentheses, if it gave
    one (``PEM lib`` errors give none)."""
    import ssl

    reason = exc.reason if isinstance(exc, ssl.SSLError) else str(exc)
    return f" ({reason})" if reason else ""
