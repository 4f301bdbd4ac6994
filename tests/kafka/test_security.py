"""SASL over TLS on the Kafka listener with the broker's own users and ACLs: each client
family logs in with SCRAM (and PLAIN), produces and reads back; a user without WRITE is
refused with Kafka's TOPIC_AUTHORIZATION_FAILED; a wrong password and a request before
authentication end the connection."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import aiokafka
import aiokafka.helpers
import confluent_kafka
import confluent_kafka.admin
import kafka
import kafka.errors
import pytest

from tests.kafka.conftest import unique
from tidelog import client
from tidelog.broker.core.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 20.0
TOPIC = "secure-orders"


@dataclass(frozen=True)
class SecureBroker:
    broker: InProcessBroker
    bootstrap: str
    pki: TestPki


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    root = tmp_path_factory.mktemp("kafka-sasl")
    pki = TestPki.create(root / "pki")
    data = root / "data"
    data.mkdir()
    users = FileUserStore.open(data)
    for name in ("alice", "bob"):
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            users.upsert(name, credential_from_password(mechanism, f"{name}-secret"))
    settings = {
        **pki.broker_settings("SASL_SSL"),
        "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
        "authorizer.enabled": "true",
        "kafka.listen": "127.0.0.1:0",
        # Some tests fail logins on purpose: keep 127.0.0.1 from being locked out.
        "sasl.login.failures.max": "1000",
    }
    with InProcessBroker(data, settings=settings) as broker:
        core = broker.server.core
        core.create_topic(TOPIC, 1, {})

        def allow(user: str, operation: Operation, kind: ResourceType, name: str) -> None:
            core.acls.create(
                [
                    AclBinding(
                        f"User:{user}",
                        "*",
                        operation,
                        Permission.ALLOW,
                        kind,
                        name,
                        PatternType.LITERAL if kind != ResourceType.GROUP else PatternType.PREFIXED,
                    )
                ]
            )

        for operation in (Operation.WRITE, Operation.READ, Operation.DESCRIBE):
            allow("alice", operation, ResourceType.TOPIC, TOPIC)
        allow("alice", Operation.READ, ResourceType.GROUP, "g")
        allow("alice", Operation.DESCRIBE, ResourceType.GROUP, "g")
        allow("bob", Operation.DESCRIBE, ResourceType.TOPIC, TOPIC)
        allow("bob", Operation.READ, ResourceType.TOPIC, TOPIC)
        port = broker.server.kafka_port
        yield SecureBroker(broker, f"127.0.0.1:{port}", pki)


def _kafka_python(secure: SecureBroker, user: str, mechanism: str) -> dict[str, object]:
    return {
        "bootstrap_servers": secure.bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(secure.pki.ca_cert),
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": f"{user}-secret",
        "request_timeout_ms": int(TIMEOUT_S * 1000),
    }


def _confluent(secure: SecureBroker, user: str, mechanism: str) -> dict[str, object]:
    return {
        "bootstrap.servers": secure.bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(secure.pki.ca_cert),
        "sasl.mechanisms": mechanism,
        "sasl.username": user,
        "sasl.password": f"{user}-secret",
    }


def _read_all(secure: SecureBroker, mechanism: str) -> list[bytes]:
    consumer = kafka.KafkaConsumer(**_kafka_python(secure, "alice", mechanism))
    try:
        tp = kafka.TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning()
        end = consumer.end_offsets([tp])[tp]
        got: list[bytes] = []
        while len(got) < end:
            for batch in consumer.poll(timeout_ms=500).values():
                got.extend(m.value for m in batch)
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_kafka_python_over_sasl_ssl(secure: SecureBroker, mechanism: str) -> None:
    value = unique(mechanism).encode()
    producer = kafka.KafkaProducer(**_kafka_python(secure, "alice", mechanism))
    try:
        producer.send(TOPIC, value=value, partition=0).get(TIMEOUT_S)
    finally:
        producer.close(TIMEOUT_S)
    assert value in _read_all(secure, mechanism)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_over_sasl_ssl(secure: SecureBroker, mechanism: str) -> None:
    value = unique(f"rdk-{mechanism}").encode()
    producer = confluent_kafka.Producer(_confluent(secure, "alice", mechanism))
    errors: list[object] = []
    producer.produce(TOPIC, value=value, partition=0, on_delivery=lambda e, m: errors.append(e))
    assert producer.flush(TIMEOUT_S) == 0
    assert errors == [None]
    assert value in _read_all(secure, "SCRAM-SHA-256")


def test_aiokafka_over_sasl_ssl(secure: SecureBroker) -> None:
    value = unique("aio").encode()

    async def run() -> None:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=secure.bootstrap,
            security_protocol="SASL_SSL",
            ssl_context=aiokafka.helpers.create_ssl_context(cafile=str(secure.pki.ca_cert)),
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username="alice",
            sasl_plain_password="alice-secret",
        )
        await producer.start()
        try:
            await producer.send_and_wait(TOPIC, value=value, partition=0)
        finally:
            await producer.stop()

    asyncio.run(asyncio.wait_for(run(), TIMEOUT_S))
    assert value in _read_all(secure, "SCRAM-SHA-512")


def _kcat_options(secure: SecureBroker, mechanism: str) -> list[str]:
    return [
        "-X", "security.protocol=SASL_SSL", "-X", f"sasl.mechanisms={mechanism}",
        "-X", "sasl.username=alice", "-X", "sasl.password=alice-secret",
        "-X", f"ssl.ca.location={secure.pki.ca_cert}",
    ]  # fmt: skip


def test_kcat_over_sasl_ssl_with_plain(secure: SecureBroker) -> None:
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not installed: apt-get install kcat (make venv does)"
    value = unique("kcat")
    subprocess.run(
        [kcat, "-b", secure.bootstrap, *_kcat_options(secure, "PLAIN"), "-P", "-t", TOPIC,
         "-p", "0"],
        input=value + "\n", text=True, check=True, timeout=TIMEOUT_S, capture_output=True,
    )  # fmt: skip
    assert value.encode() in _read_all(secure, "SCRAM-SHA-256")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_debians_kcat_logs_in_with_scram(secure: SecureBroker, mechanism: str) -> None:
    # librdkafka < 2.6.1 (Debian's kcat links 2.0.2) repeats the client nonce in its
    # client-final message (confluentinc/librdkafka#4895); the Kafka listener takes a nonce
    # that ends with the expected one, as Kafka 3.8.1-3.9 did (broker/core/scram.py).
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not installed: apt-get install kcat (make venv does)"
    value = unique(f"kcat-{mechanism}")
    subprocess.run(
        [kcat, "-b", secure.bootstrap, *_kcat_options(secure, mechanism), "-P", "-t", TOPIC,
         "-p", "0"],
        input=value + "\n", text=True, check=True, timeout=TIMEOUT_S, capture_output=True,
    )  # fmt: skip
    assert value.encode() in _read_all(secure, mechanism)


def test_kcat_with_a_wrong_scram_password_is_refused(secure: SecureBroker) -> None:
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not installed: apt-get install kcat (make venv does)"
    options = [
        o.replace("alice-secret", "not-alice") for o in _kcat_options(secure, "SCRAM-SHA-256")
    ]
    # kcat waits out its metadata timeout (-m) after the refusal, logged at once.
    done = subprocess.run(
        [kcat, "-b", secure.bootstrap, *options, "-L", "-m", "2"],
        text=True, check=False, timeout=TIMEOUT_S, capture_output=True,
    )  # fmt: skip
    assert done.returncode != 0
    assert "invalid credentials" in done.stderr


def test_a_user_without_write_is_refused_with_kafkas_code(secure: SecureBroker) -> None:
    producer = kafka.KafkaProducer(
        **_kafka_python(secure, "bob", "SCRAM-SHA-256"), enable_idempotence=False, acks=1,
        retries=0,
    )  # fmt: skip
    try:
        future = producer.send(TOPIC, value=b"by bob", partition=0)
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            future.get(TIMEOUT_S)
    finally:
        producer.close(TIMEOUT_S)
    assert b"by bob" not in _read_all(secure, "SCRAM-SHA-256")


def test_a_wrong_password_fails_the_login(secure: SecureBroker) -> None:
    config = {**_confluent(secure, "alice", "SCRAM-SHA-256"), "sasl.password": "nope"}
    errors: list[confluent_kafka.KafkaError] = []
    admin = confluent_kafka.admin.AdminClient({**config, "error_cb": errors.append})

    def refused() -> bool:
        return any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors)

    with pytest.raises(confluent_kafka.KafkaException):
        admin.list_topics(timeout=1)
    # Polled until librdkafka reports the refusal: it keeps retrying the login, and a
    # list_topics(timeout=5) waited its whole 5 s for nothing more.
    deadline = time.monotonic() + 5
    while not refused() and time.monotonic() < deadline:
        admin.poll(0.1)  # delivers the error callbacks
    assert refused(), errors


def _tls_socket(secure: SecureBroker) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(secure.pki.ca_cert))
    host, port = secure.bootstrap.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
    return context.wrap_socket(raw, server_hostname=host)


def test_requests_before_authentication_close_the_connection(secure: SecureBroker) -> None:
    client = b"raw"
    header = struct.pack(">hhih", 3, 1, 9, len(client)) + client  # Metadata v1
    body = struct.pack(">i", -1)  # all topics
    with _tls_socket(secure) as sock:
        sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        assert sock.recv(4) == b""  # closed, nothing answered
    # ApiVersions is answered before authentication.
    header = struct.pack(">hhih", 18, 0, 10, len(client)) + client
    with _tls_socket(secure) as sock:
        sock.sendall(struct.pack(">i", len(header)) + header)
        size = struct.unpack(">i", sock.recv(4))[0]
        assert size > 8
        assert struct.unpack(">i", sock.recv(4))[0] == 10


def test_the_same_users_and_acls_as_the_grpc_listener(secure: SecureBroker) -> None:
    # What alice writes over Kafka (SCRAM over TLS) is what Tidelog's own client reads as
    # alice over gRPC (the same user, the same ACLs, the same log).
    value = unique("both").encode()
    producer = kafka.KafkaProducer(**_kafka_python(secure, "alice", "SCRAM-SHA-512"))
    try:
        offset = producer.send(TOPIC, value=value, partition=0).get(TIMEOUT_S).offset
    finally:
        producer.close(TIMEOUT_S)
    with client.Consumer(
        secure.broker.address, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="alice", sasl_plain_password="alice-secret",
        ssl_cafile=str(secure.pki.ca_cert),
    ) as consumer:  # fmt: skip
        tp = client.TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        got: list[bytes | None] = []
        deadline = time.monotonic() + TIMEOUT_S
        while not got and time.monotonic() < deadline:
            got = [r.value for r in consumer.poll(timeout_ms=300)]
    assert got[:1] == [value]
