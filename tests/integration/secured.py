"""A secured test broker (SASL SCRAM-SHA-512, Kafka's StandardAuthorizer) and its ACLs.

``SecuredKafka`` holds the addresses of a broker started by ``scripts/kafka.py`` with
``Security``: the SASL_PLAINTEXT and SASL_SSL listeners the clients under test use, and the
PLAINTEXT one whose anonymous principal is a super user, where the tests create topics and
ACLs. ``grant`` and ``revoke`` change ACLs through aiokafka's CreateAcls and DeleteAcls
requests (its admin client has no call for them) and return once the broker's authorizer
lists the change (DescribeAcls), so the next request meets it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from aiokafka.admin import AIOKafkaAdminClient

#: The SCRAM user the clients under test authenticate as (created at format time).
APP_USER = ("app", "app-secret")
MECHANISM = "SCRAM-SHA-512"
ACL_APPLIED_TIMEOUT = 30.0

# Kafka's AclOperation, ResourceType, PatternType and AclPermissionType codes.
TOPIC, GROUP, TRANSACTIONAL_ID = 2, 3, 5
LITERAL, PREFIXED = 3, 4
ALLOW = 3
OPERATIONS = {
    "READ": 3,
    "WRITE": 4,
    "CREATE": 5,
    "DELETE": 6,
    "ALTER": 7,
    "DESCRIBE": 8,
    "DESCRIBE_CONFIGS": 10,
}


@attrs.frozen
class SecuredKafka:
    """A running secured broker: ``admin_bootstrap`` is the super user's PLAINTEXT port."""

    admin_bootstrap: str
    sasl_bootstrap: str
    sasl_ssl_bootstrap: str
    ca_file: str
    log_file: str

    @property
    def principal(self) -> str:
        return f"User:{APP_USER[0]}"

    def client_config(self, password: str = APP_USER[1], tls: bool = False) -> dict[str, Any]:
        """aiokafka settings of the app user (``consumer_config``); ``tls``: SASL_SSL."""
        config: dict[str, Any] = {
            "security_protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
            "sasl_mechanism": MECHANISM,
            "sasl_plain_username": APP_USER[0],
            "sasl_plain_password": password,
        }
        if tls:
            config["ssl_context"] = ssl.create_default_context(cafile=self.ca_file)
        return config


def refused_verification(address: str) -> ssl.SSLCertVerificationError:
    """How a TLS handshake with the system's CAs only fails at ``address`` (the SASL_SSL
    listener, whose test CA they do not hold): its ``verify_code`` is the class of the failure,
    its ``verify_message`` OpenSSL's wording of it, which differs between OpenSSL versions
    ("self signed" in 1.1, "self-signed" in 3)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        try:
            ssl.create_default_context().wrap_socket(connection, server_hostname=host).close()
        except ssl.SSLCertVerificationError as refused:
            return refused
    raise AssertionError(f"{address}: the system's CAs trust the test CA")


@attrs.frozen
class Acl:
    """``operation`` allowed to the app user on a topic or group named (or prefixed) so."""

    resource_type: int
    name: str
    operation: str
    pattern: int = LITERAL

    @classmethod
    def topic(cls, name: str, operation: str, pattern: int = LITERAL) -> Acl:
        return cls(TOPIC, name, operation, pattern)

    @classmethod
    def group(cls, name: str, operation: str) -> Acl:
        return cls(GROUP, name, operation)

    @classmethod
    def transactional_ids(cls, prefix: str) -> Acl:
        """WRITE on the transactional ids starting with ``prefix``."""
        return cls(TRANSACTIONAL_ID, prefix, "WRITE", PREFIXED)

    def fields(self, principal: str) -> tuple[int, str, int, str, str, int, int]:
        code = OPERATIONS[self.operation]
        return (self.resource_type, self.name, self.pattern, principal, "*", code, ALLOW)


async def _change(kafka: SecuredKafka, acls: list[Acl], create: bool) -> None:
    # Imported here: the conftest imports this module, also for runs without aiokafka.
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.admin_bootstrap)
    await admin.start()
    try:
        for acl in acls:
            request_type = CreateAclsRequest if create else DeleteAclsRequest
            response = await admin._send_request(request_type(*acl.fields(kafka.principal)))
            results = response.to_object()
            key = "creation_responses" if create else "filter_responses"
            for result in results[key]:
                if result["error_code"] != 0:
                    raise RuntimeError(f"{'creating' if create else 'deleting'} {acl}: {result}")
        deadline = time.monotonic() + ACL_APPLIED_TIMEOUT
        while await _listed(admin, kafka.principal, acls) != (set(acls) if create else set()):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the authorizer did not apply {acls} in time")
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


async def _listed(admin: AIOKafkaAdminClient, principal: str, acls: list[Acl]) -> set[Acl]:
    """Those of ``acls`` the broker's authorizer lists now."""
    from aiokafka.protocol.admin import DescribeAclsRequest

    found = set()
    for acl in acls:
        response = await admin._send_request(DescribeAclsRequest(*acl.fields(principal)))
        if response.to_object()["resources"]:
            found.add(acl)
    return found


def grant(kafka: SecuredKafka, *acls: Acl) -> None:
    """Allow the app user ``acls``; returns once the broker applies them."""
    asyncio.run(_change(kafka, list(acls), create=True))


def revoke(kafka: SecuredKafka, *acls: Acl) -> None:
    """Remove ``acls`` of the app user; returns once the broker applies it."""
    asyncio.run(_change(kafka, list(acls), create=False))
