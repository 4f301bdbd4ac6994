"""Mutual TLS on the Kafka listener: a client certificate's subject is the ACL principal
(``User:CN=alice,O=Tidelog``, the same name the gRPC listener gives it);
``ssl.client.auth=requested`` asks for a certificate without requiring one (Python's
``CERT_OPTIONAL``: possible here, not on grpcio), ``required`` refuses a client without.
"""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path

import kafka
import kafka.errors
import pytest

from tidelog.broker.core.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 20.0
TOPIC = "mtls-orders"
ALICE = "User:CN=alice,O=Tidelog"  # the subject of TestPki's client certificate


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki.create(tmp_path_factory.mktemp("kafka-mtls"))


def start(pki: TestPki, client_auth: str, data: Path) -> InProcessBroker:
    settings = {
        **pki.broker_settings("SSL", client_auth=client_auth),
        "authorizer.enabled": "true",
        "kafka.listen": "127.0.0.1:0",
    }
    broker = InProcessBroker(data, settings=settings).start()
    core = broker.server.core
    core.create_topic(TOPIC, 1, {})
    core.acls.create(
        [
            AclBinding(
                ALICE, "*", op, Permission.ALLOW, ResourceType.TOPIC, TOPIC, PatternType.LITERAL
            )
            for op in (Operation.WRITE, Operation.READ, Operation.DESCRIBE)
        ]
    )
    return broker


@pytest.fixture(params=["required", "requested"])
def broker(
    request: pytest.FixtureRequest, pki: TestPki, tmp_path: Path
) -> Iterator[InProcessBroker]:
    running = start(pki, request.param, tmp_path)
    try:
        yield running
    finally:
        running.stop()


def producer(broker: InProcessBroker, pki: TestPki, *, certificate: bool) -> kafka.KafkaProducer:
    settings: dict[str, object] = {
        "bootstrap_servers": f"127.0.0.1:{broker.server.kafka_port}",
        "security_protocol": "SSL",
        "ssl_cafile": str(pki.ca_cert),
        "request_timeout_ms": int(TIMEOUT_S * 1000),
        "max_block_ms": 5_000,
        "enable_idempotence": False,
    }
    if certificate:
        settings["ssl_certfile"] = str(pki.client_cert)
        settings["ssl_keyfile"] = str(pki.client_key)
    return kafka.KafkaProducer(**settings)


def refused_without_certificate(broker: InProcessBroker, pki: TestPki) -> bool:
    """A TLS connection without a client certificate: True if the broker ends it before
    answering an ApiVersions request (TLS 1.3 reports the missing certificate as an
    alert on the client's first read)."""
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    api_versions_v0 = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
    with (
        socket.create_connection(("127.0.0.1", broker.server.kafka_port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        try:
            tls.sendall(struct.pack(">i", len(api_versions_v0)) + api_versions_v0)
            return tls.recv(4) == b""
        except (ssl.SSLError, ConnectionError):
            return True


def test_the_certificate_subject_is_the_principal(broker: InProcessBroker, pki: TestPki) -> None:
    with_certificate = producer(broker, pki, certificate=True)
    try:
        sent = with_certificate.send(TOPIC, b"by alice", partition=0).get(TIMEOUT_S)
    finally:
        with_certificate.close(TIMEOUT_S)
    assert sent.offset == 0  # allowed only to ALICE: the subject became the principal


def test_without_a_certificate(broker: InProcessBroker, pki: TestPki) -> None:
    client_auth = broker.config.security.ssl_client_auth
    if client_auth == "required":
        # The connection is refused: nothing answered, nothing stored.
        assert refused_without_certificate(broker, pki)
        assert broker.server.core.logs.get_log(TOPIC, 0).log_end_offset == 0
        return
    # requested: connected as ANONYMOUS, which no ACL allows.
    anonymous = producer(broker, pki, certificate=False)
    try:
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            anonymous.send(TOPIC, b"anonymous", partition=0).get(TIMEOUT_S)
    finally:
        anonymous.close(TIMEOUT_S)
