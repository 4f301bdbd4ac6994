"""Kafka's answers for a topic the caller may not describe and for an illegal topic name,
on the Kafka listener (issue #25, items 1 and 2), checked with raw Metadata requests and
with a real Kafka client (confluent-kafka, librdkafka).

Kafka answers a Metadata request naming an illegal topic with ``INVALID_TOPIC_EXCEPTION``
(17) and never tries to create it; one naming a topic the principal may not DESCRIBE with
``TOPIC_AUTHORIZATION_FAILED`` (29), whether it exists or not, without creating it; a
listing of every topic leaves such topics out. Clients fail those sends at once.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.kafka import raw
from tests.kafka.conftest import unique
from tidelog.broker.core.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 20.0
PROMPT_S = 10.0  # well below the message timeouts below: a refusal is immediate
ILLEGAL = "foo$#!"
INVALID_TOPIC_EXCEPTION = 17
TOPIC_AUTHORIZATION_FAILED = 29
UNKNOWN_TOPIC_OR_PARTITION = 3


@pytest.fixture(scope="module")
def auto_create() -> Iterator[InProcessBroker]:
    """A broker without security whose Kafka Metadata creates the topics it names."""
    settings = {"kafka.listen": "127.0.0.1:0", "auto.create.topics.enable": "true"}
    with InProcessBroker(settings=settings) as broker:
        yield broker


def _bootstrap(broker: InProcessBroker) -> str:
    return f"127.0.0.1:{broker.server.kafka_port}"


def _metadata(broker: InProcessBroker, version: int, request: Any) -> dict[str, int]:
    """One raw Metadata request: topic name -> error code."""
    host, port = _bootstrap(broker).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        answer = raw.call(sock, request, "topic-refusals")
    assert answer is not None, "the broker closed the connection"
    response = MetadataResponse[version].decode(answer, header=True)
    return {t.name: t.error_code for t in response.topics}


def _topic(name: str) -> Any:
    return MetadataRequest.MetadataRequestTopic(name=name)  # v7's topic entry


def test_raw_metadata_answers_illegal_names_invalid_topic_and_creates_nothing(
    auto_create: InProcessBroker, caplog: pytest.LogCaptureFixture
) -> None:
    legal = unique("legal")
    names = [ILLEGAL, "a" * 250, "..", legal]
    with caplog.at_level(logging.INFO, logger="tidelog.broker.kafka.handlers"):
        answered = _metadata(
            auto_create,
            7,
            MetadataRequest[7](topics=[_topic(n) for n in names], allow_auto_topic_creation=True),
        )
    assert answered == {
        ILLEGAL: INVALID_TOPIC_EXCEPTION,
        "a" * 250: INVALID_TOPIC_EXCEPTION,
        "..": INVALID_TOPIC_EXCEPTION,
        legal: 0,  # auto-created, as before
    }
    # No refused auto-creation was even tried (the issue saw one logged every 0.5 s).
    assert not [r for r in caplog.records if "auto-creating" in r.getMessage()]
    # Without auto-creation, and in the oldest version (no such flag): the same.
    other = unique("other")
    assert _metadata(
        auto_create,
        7,
        MetadataRequest[7](
            topics=[_topic(ILLEGAL), _topic(other)], allow_auto_topic_creation=False
        ),
    ) == {ILLEGAL: INVALID_TOPIC_EXCEPTION, other: UNKNOWN_TOPIC_OR_PARTITION}
    assert _metadata(auto_create, 0, MetadataRequest[0](topics=[ILLEGAL])) == {
        ILLEGAL: INVALID_TOPIC_EXCEPTION
    }


def test_confluent_fails_a_message_to_an_illegal_topic_at_once(
    auto_create: InProcessBroker,
) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": _bootstrap(auto_create), "message.timeout.ms": 60_000}
    )
    reports: list[confluent_kafka.KafkaError | None] = []
    started = time.monotonic()
    producer.produce(ILLEGAL, b"nowhere", on_delivery=lambda err, msg: reports.append(err))
    producer.flush(TIMEOUT_S)
    assert time.monotonic() - started < PROMPT_S  # not the 60 s message timeout
    assert len(reports) == 1
    assert reports[0] is not None
    # librdkafka reports the broker's code: TOPIC_EXCEPTION, "Broker: Invalid topic".
    assert reports[0].code() == confluent_kafka.KafkaError.TOPIC_EXCEPTION, reports[0]


# --- with the authorizer on -------------------------------------------------------------


@dataclass(frozen=True)
class SecureBroker:
    broker: InProcessBroker
    pki: TestPki

    def confluent(self, user: str) -> dict[str, object]:
        return {
            "bootstrap.servers": _bootstrap(self.broker),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(self.pki.ca_cert),
            "sasl.mechanisms": "SCRAM-SHA-256",
            "sasl.username": user,
            "sasl.password": f"{user}-secret",
        }

    def topics(self) -> set[str]:
        return {t.name for t in self.broker.server.core.list_topics(False)}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """TLS, SCRAM, the authorizer and auto-creation on. ``alice`` may WRITE and DESCRIBE
    ``orders``, DESCRIBE (not CREATE) topics named ``ask-*``, and DESCRIBE and CREATE
    topics named ``made-*``; ``secret`` exists."""
    root = tmp_path_factory.mktemp("kafka-topic-refusals")
    pki = TestPki.create(root / "pki")
    data = root / "data"
    data.mkdir()
    FileUserStore.open(data).upsert(
        "alice", credential_from_password("SCRAM-SHA-256", "alice-secret")
    )
    settings = {
        **pki.broker_settings("SASL_SSL"),
        "sasl.enabled.mechanisms": "SCRAM-SHA-256",
        "authorizer.enabled": "true",
        "kafka.listen": "127.0.0.1:0",
        "auto.create.topics.enable": "true",
    }
    with InProcessBroker(data, settings=settings) as broker:
        core = broker.server.core
        core.create_topic("orders", 1, {})
        core.create_topic("secret", 1, {})

        def allow(operation: Operation, name: str, pattern: PatternType) -> AclBinding:
            return AclBinding(
                "User:alice", "*", operation, Permission.ALLOW, ResourceType.TOPIC, name, pattern
            )

        core.acls.create(
            [
                allow(Operation.WRITE, "orders", PatternType.LITERAL),
                allow(Operation.DESCRIBE, "orders", PatternType.LITERAL),
                allow(Operation.DESCRIBE, "ask-", PatternType.PREFIXED),
                allow(Operation.DESCRIBE, "made-", PatternType.PREFIXED),
                allow(Operation.CREATE, "made-", PatternType.PREFIXED),
            ]
        )
        yield SecureBroker(broker, pki)


def _named(secure: SecureBroker, topic: str) -> confluent_kafka.KafkaError | None:
    """confluent's Metadata request naming ``topic`` (as alice): the topic's error."""
    admin = confluent_kafka.admin.AdminClient(secure.confluent("alice"))
    return admin.list_topics(topic=topic, timeout=TIMEOUT_S).topics[topic].error


def test_a_topic_alice_may_not_describe_is_refused_alike_and_never_created(
    secure: SecureBroker, caplog: pytest.LogCaptureFixture
) -> None:
    absent = unique("absent")
    with caplog.at_level(logging.INFO, logger="tidelog.audit"):
        for topic in ("secret", absent, ILLEGAL):
            error = _named(secure, topic)
            assert error is not None, topic
            assert error.code() == TOPIC_AUTHORIZATION_FAILED, topic
    assert absent not in secure.topics()  # auto-creation did not go around the ACLs
    lines = [r.getMessage() for r in caplog.records if r.name == "tidelog.audit"]
    for topic in ("secret", absent):
        assert any(
            f'"resource_name":"{topic}"' in line
            and '"operation":"DESCRIBE"' in line
            and '"rpc":"Metadata"' in line
            for line in lines
        ), lines
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tidelog.audit"):
        admin = confluent_kafka.admin.AdminClient(secure.confluent("alice"))
        listed = set(admin.list_topics(timeout=TIMEOUT_S).topics)
    assert "orders" in listed
    assert "secret" not in listed
    assert not [r for r in caplog.records if r.name == "tidelog.audit"]  # ...silently


def test_auto_creation_needs_create_as_kafkas(secure: SecureBroker) -> None:
    asked = unique("ask")  # DESCRIBE, no CREATE
    error = _named(secure, asked)
    assert error is not None
    assert error.code() == TOPIC_AUTHORIZATION_FAILED
    assert asked not in secure.topics()
    made = unique("made")  # DESCRIBE and CREATE
    deadline = time.monotonic() + PROMPT_S
    while _named(secure, made) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert made in secure.topics()


def test_confluent_fails_a_message_to_a_topic_it_may_not_describe_at_once(
    secure: SecureBroker,
) -> None:
    producer = confluent_kafka.Producer({**secure.confluent("alice"), "message.timeout.ms": 60_000})
    reports: dict[str, confluent_kafka.KafkaError | None] = {}
    started = time.monotonic()
    for topic in ("secret", "orders"):
        producer.produce(
            topic, b"x", on_delivery=lambda err, msg, topic=topic: reports.update({topic: err})
        )
    producer.flush(TIMEOUT_S)
    assert time.monotonic() - started < PROMPT_S
    assert reports["orders"] is None
    refused = reports["secret"]
    assert refused is not None
    assert refused.code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
