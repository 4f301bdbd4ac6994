"""A topic the caller may not describe, and a name no topic can have, fail at once
(issue #25, items 1 and 2), on the gRPC listener and in Tidelog's client.

Kafka answers a Metadata request naming a topic the principal may not DESCRIBE with
``TOPIC_AUTHORIZATION_FAILED``, the same whether the topic exists or not, and one naming an
illegal topic with ``INVALID_TOPIC_EXCEPTION``; its producer fails such a send at once.
Before, Tidelog's producer waited ``max_block_ms`` and said the topic did not exist, and
its consumer polled nothing forever. The broker runs TLS with SCRAM and the authorizer
on, as in the issue: ``alice`` may WRITE, READ and DESCRIBE ``orders`` and nothing else;
``secret`` exists.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.acls import AclBinding
from tidelog.client.grpc_connection import grpc_connections
from tidelog.client.security import ClientSecurity
from tidelog.storage.errors import (
    InvalidTopicError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)

pytestmark = pytest.mark.timeout(120)

# Well below the 60 s max_block_ms default the issue measured: a refusal is immediate.
PROMPT_S = 10.0
ILLEGAL = "foo$#!"


@dataclass(frozen=True)
class SecureBroker:
    broker: InProcessBroker
    pki: TestPki

    def login(self, user: str) -> dict[str, Any]:
        return {
            **self.pki.client_settings("SASL_SSL"),
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": user,
            "sasl_plain_password": f"{user}-secret",
        }


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    root = tmp_path_factory.mktemp("topic-refusals")
    pki = TestPki.create(root / "pki")
    data = root / "data"
    data.mkdir()
    users = FileUserStore.open(data)
    for name in ("admin", "alice"):
        users.upsert(name, credential_from_password("SCRAM-SHA-256", f"{name}-secret"))
    settings = {
        **pki.broker_settings("SASL_SSL"),
        "authorizer.enabled": "true",
        "super.users": "User:admin",
    }
    with InProcessBroker(data, settings=settings) as broker:
        found = SecureBroker(broker, pki)
        with AdminClient(broker.address, **found.login("admin")) as admin:
            admin.create_topic("orders", 1)
            admin.create_topic("secret", 1)
            admin.create_acls(
                [
                    AclBinding("User:alice", operation, resource_name="orders")
                    for operation in ("WRITE", "READ", "DESCRIBE")
                ]
                + [
                    AclBinding("User:alice", operation, "GROUP", "g", pattern_type="PREFIXED")
                    for operation in ("READ", "DESCRIBE")
                ]
            )
        yield found


def _alice_metadata(secure: SecureBroker, topics: list[str]) -> dict[str, str]:
    """One gRPC Metadata request as alice: topic name -> error code."""
    login = secure.login("alice")
    connect = grpc_connections(
        client_id="raw",
        request_timeout_ms=10_000,
        reconnect_backoff_max_ms=1_000,
        security=ClientSecurity(**login),
    )
    connection = connect(secure.broker.address)
    try:
        answer = connection.metadata(topics, include_internal=False, timeout_ms=10_000)
    finally:
        connection.close()
    return {name: t.error_code for name, t in answer.topics.items()}


# --- the gRPC listener ------------------------------------------------------------------


def test_grpc_metadata_refuses_named_topics_alike_and_hides_them_in_listings(
    secure: SecureBroker, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="tidelog.audit"):
        named = _alice_metadata(secure, ["orders", "secret", "no-such-topic"])
    assert named == {
        "orders": "",
        "secret": "TOPIC_AUTHORIZATION_FAILED",
        "no-such-topic": "TOPIC_AUTHORIZATION_FAILED",  # the same: existence does not leak
    }
    denied = [r.getMessage() for r in caplog.records if r.name == "tidelog.audit"]
    for name in ("secret", "no-such-topic"):
        assert any(
            '"event":"authorization_denied"' in line
            and '"operation":"DESCRIBE"' in line
            and f'"resource_name":"{name}"' in line
            and '"rpc":"Metadata"' in line
            for line in denied
        ), denied
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tidelog.audit"):
        listed = _alice_metadata(secure, [])
    assert listed == {"orders": ""}  # every topic: the others left out, silently
    assert not [r for r in caplog.records if r.name == "tidelog.audit"]


def test_grpc_metadata_answers_an_illegal_name_invalid_topic(secure: SecureBroker) -> None:
    login = secure.login("admin")
    connect = grpc_connections(
        client_id="raw",
        request_timeout_ms=10_000,
        reconnect_backoff_max_ms=1_000,
        security=ClientSecurity(**login),
    )
    connection = connect(secure.broker.address)
    try:
        answer = connection.metadata(
            [ILLEGAL, "a" * 250, "..", "no-such-topic"], include_internal=False, timeout_ms=10_000
        )
    finally:
        connection.close()
    assert {name: t.error_code for name, t in answer.topics.items()} == {
        ILLEGAL: "INVALID_TOPIC_EXCEPTION",
        "a" * 250: "INVALID_TOPIC_EXCEPTION",
        "..": "INVALID_TOPIC_EXCEPTION",
        "no-such-topic": "UNKNOWN_TOPIC_OR_PARTITION",
    }
    # Authorization comes first: alice may not describe an illegal name either.
    assert _alice_metadata(secure, [ILLEGAL]) == {ILLEGAL: "TOPIC_AUTHORIZATION_FAILED"}


# --- Tidelog's client -------------------------------------------------------------------


@pytest.mark.parametrize("topic", ["secret", "no-such-topic"])
def test_the_producer_fails_a_topic_it_may_not_describe_at_once(
    secure: SecureBroker, topic: str
) -> None:
    with Producer(secure.broker.address, acks=1, **secure.login("alice")) as producer:
        assert producer.config.max_block_ms >= 60_000  # the default the issue waited out
        started = time.monotonic()
        future = producer.send(topic, b"refused")
        with pytest.raises(TopicAuthorizationFailedError, match=topic):
            future.result(timeout=PROMPT_S * 3)
        assert time.monotonic() - started < PROMPT_S
        # Not fatal, as Kafka's: the allowed topic still works, the refused one still fails.
        assert producer.send("orders", b"allowed").result(timeout=PROMPT_S).offset >= 0
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(topic, b"again").result(timeout=PROMPT_S)


def test_the_producer_fails_an_illegal_topic_name_at_once(secure: SecureBroker) -> None:
    with Producer(secure.broker.address, acks=1, **secure.login("admin")) as producer:
        started = time.monotonic()
        future = producer.send(ILLEGAL, b"nowhere")
        with pytest.raises(InvalidTopicError, match="legal topic name"):
            future.result(timeout=PROMPT_S * 3)
        assert time.monotonic() - started < PROMPT_S


def test_a_topic_that_does_not_exist_is_still_waited_for(secure: SecureBroker) -> None:
    """What did not change: a topic that may yet be created is retried, as Kafka's."""
    with Producer(
        secure.broker.address, acks=1, max_block_ms=1_500, **secure.login("admin")
    ) as producer:
        started = time.monotonic()
        future = producer.send("not-yet", b"later")
        with pytest.raises(UnknownTopicOrPartitionError):
            future.result(timeout=PROMPT_S)
        assert time.monotonic() - started >= 1.4  # waited out max_block_ms, not failed


def _poll_for(consumer: Consumer, seconds: float) -> None:
    """Poll for ``seconds``: whatever ``poll`` raises meanwhile is raised."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        consumer.poll(timeout_ms=500)


@pytest.mark.parametrize("seek", [False, True], ids=["reset", "seek"])
@pytest.mark.parametrize("topic", ["secret", "no-such-topic", ILLEGAL])
def test_an_assigned_topic_alice_may_not_describe_fails_the_poll(
    secure: SecureBroker, topic: str, seek: bool
) -> None:
    """With or without a position (a fetch, or a ListOffsets lookup first)."""
    with Consumer(secure.broker.address, **secure.login("alice")) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        if seek:
            consumer.seek(TopicPartition(topic, 0), 0)
        started = time.monotonic()
        with pytest.raises(TopicAuthorizationFailedError):
            _poll_for(consumer, PROMPT_S)
        assert time.monotonic() - started < PROMPT_S


def test_position_of_a_topic_alice_may_not_describe_is_refused(secure: SecureBroker) -> None:
    with Consumer(secure.broker.address, **secure.login("alice")) as consumer:
        consumer.assign([TopicPartition("secret", 0)])
        started = time.monotonic()
        with pytest.raises(TopicAuthorizationFailedError):
            consumer.position(TopicPartition("secret", 0), timeout_ms=30_000)
        assert time.monotonic() - started < PROMPT_S


@pytest.mark.parametrize("seek", [False, True], ids=["reset", "seek"])
def test_an_assigned_illegal_topic_fails_the_poll(secure: SecureBroker, seek: bool) -> None:
    with Consumer(secure.broker.address, **secure.login("admin")) as consumer:
        consumer.assign([TopicPartition(ILLEGAL, 0)])
        if seek:
            consumer.seek(TopicPartition(ILLEGAL, 0), 0)
        started = time.monotonic()
        with pytest.raises(InvalidTopicError):
            _poll_for(consumer, PROMPT_S)
        assert time.monotonic() - started < PROMPT_S


@pytest.mark.parametrize("group_id", [None, "g-refused"])
def test_a_subscribed_topic_alice_may_not_describe_fails_the_poll(
    secure: SecureBroker, group_id: str | None
) -> None:
    with Consumer(secure.broker.address, group_id=group_id, **secure.login("alice")) as consumer:
        consumer.subscribe(["secret"])
        started = time.monotonic()
        with pytest.raises(TopicAuthorizationFailedError):
            _poll_for(consumer, PROMPT_S)
        assert time.monotonic() - started < PROMPT_S


def test_a_subscribed_illegal_topic_fails_the_poll(secure: SecureBroker) -> None:
    with Consumer(secure.broker.address, **secure.login("admin")) as consumer:
        consumer.subscribe([ILLEGAL])
        with pytest.raises(InvalidTopicError):
            _poll_for(consumer, PROMPT_S)


def test_admin_describe_topic_refuses_and_rejects_at_once(secure: SecureBroker) -> None:
    with AdminClient(secure.broker.address, **secure.login("alice")) as admin:
        for topic in ("secret", "no-such-topic", ILLEGAL):
            with pytest.raises(TopicAuthorizationFailedError):
                admin.describe_topic(topic)
    with AdminClient(secure.broker.address, **secure.login("admin")) as admin:
        with pytest.raises(InvalidTopicError):
            admin.describe_topic(ILLEGAL)
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.describe_topic("no-such-topic")
