"""KIP-368 re-authentication with ``connections.max.reauth.ms``: on the Kafka listener a
login answers its session's lifetime, a client logs in again on its live connection
before it ends (librdkafka does it by itself), a connection that did not is closed at its
next request, and a re-authentication may change neither the mechanism nor the user. On
the gRPC listener the session token ends as soon, and Tidelog's client logs in again
without the caller seeing it."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import confluent_kafka
import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.kafka.raw import SaslSession
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Producer

pytestmark = pytest.mark.timeout(90)

REAUTH_MS = 3_000  # wide enough that a loaded CI machine keeps the margins below
MECHANISM = "SCRAM-SHA-256"
USERS = {"alice": "alice-secret", "bob": "bob-secret"}
TOPIC = "reauth"


@dataclass(frozen=True)
class Broker:
    broker: InProcessBroker
    bootstrap: str


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    data = tmp_path_factory.mktemp("reauth")
    users = FileUserStore.open(data)
    for user, password in USERS.items():
        users.upsert(user, credential_from_password(MECHANISM, password))
    settings = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": MECHANISM,
        "kafka.listen": "127.0.0.1:0",
        "connections.max.reauth.ms": REAUTH_MS,
    }
    with InProcessBroker(data, settings=settings) as running:
        running.server.core.create_topic(TOPIC, 1, {})
        yield Broker(running, f"127.0.0.1:{running.server.kafka_port}")


def _session(broker: Broker, user: str = "alice") -> SaslSession:
    host, port = broker.bootstrap.rsplit(":", 1)
    session = SaslSession(socket.create_connection((host, int(port)), 10), "reauth-test")
    answer = session.login(user, USERS[user], MECHANISM)
    assert answer.error_code == 0, answer.error_message
    return session


def _metadata(session: SaslSession) -> int:
    request = MetadataRequest[9](
        topics=None,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    return len(session.call(request, MetadataResponse).brokers)


def test_a_login_is_renewed_on_the_live_connection_and_lapses_without(broker: Broker) -> None:
    session = _session(broker)
    try:
        assert 0 < session.session_lifetime_ms <= REAUTH_MS
        assert _metadata(session) == 1
        time.sleep(REAUTH_MS / 2000)
        renewed = session.login("alice", USERS["alice"], MECHANISM)  # on the same socket
        assert renewed.error_code == 0
        time.sleep(REAUTH_MS * 0.7 / 1000)  # past the first session's end, not the second's
        assert _metadata(session) == 1
        time.sleep(REAUTH_MS / 1000)  # past the second's
        with pytest.raises(ConnectionError):
            _metadata(session)
    finally:
        session.close()


def test_a_re_authentication_keeps_its_user_and_mechanism(broker: Broker) -> None:
    other_user = _session(broker)
    try:
        refused = other_user.login("bob", USERS["bob"], MECHANISM)
        assert refused.error_code == 58  # SASL_AUTHENTICATION_FAILED
        with pytest.raises(ConnectionError):
            _metadata(other_user)
    finally:
        other_user.close()
    other_mechanism = _session(broker)
    try:
        changed = other_mechanism.login("alice", USERS["alice"], "SCRAM-SHA-512")
        assert changed.error_code in (33, 34)  # UNSUPPORTED_SASL_MECHANISM / ILLEGAL_SASL_STATE
    finally:
        other_mechanism.close()


def test_librdkafka_re_authenticates_by_itself(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tidelog.broker.core.auth")
    config = {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": MECHANISM,
        "sasl.username": "alice",
        "sasl.password": USERS["alice"],
    }
    producer = confluent_kafka.Producer(config)
    errors: list[object] = []
    started = time.monotonic()
    count = 0
    while time.monotonic() - started < REAUTH_MS * 3 / 1000:
        producer.produce(TOPIC, b"%d" % count, on_delivery=lambda e, m: errors.append(e))
        assert producer.flush(10) == 0
        count += 1
        time.sleep(0.1)
    assert errors == [None] * count  # nothing failed across the session ends
    logins = [r for r in caplog.records if r.getMessage().startswith("authenticated User:alice")]
    assert len(logins) >= 3  # the first login and at least two renewals


def test_grpc_sessions_end_as_soon_and_are_renewed(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tidelog.broker.core.auth")
    security = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": MECHANISM,
        "sasl_plain_username": "alice",
        "sasl_plain_password": USERS["alice"],
    }
    with (
        AdminClient(broker.broker.address, **security) as admin,
        Producer(broker.broker.address, **security) as producer,
    ):
        started = time.monotonic()
        while time.monotonic() - started < REAUTH_MS * 2.5 / 1000:
            assert TOPIC in {t.name for t in admin.list_topics()}
            producer.send(TOPIC, b"grpc").result(10)
            time.sleep(0.2)
    logins = [r for r in caplog.records if r.getMessage().startswith("authenticated User:alice")]
    assert len(logins) >= 4  # each client's first login and at least one renewal each
