"""The Kafka listener's settings: ``kafka.advertised.listen`` is what Metadata tells
clients, and ``auto.create.topics.enable`` lets Metadata create a topic asked for."""

from __future__ import annotations

import kafka
import pytest

from tests.kafka.conftest import unique
from tidelog.broker.testing import InProcessBroker

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 20.0


def test_advertised_address_and_auto_created_topics() -> None:
    settings = {
        "kafka.listen": "127.0.0.1:0",
        "kafka.advertised.listen": "localhost:0",  # port 0: the bound port
        "auto.create.topics.enable": "true",
        "num.partitions": 2,
    }
    with InProcessBroker(settings=settings) as broker:
        port = broker.server.kafka_port
        assert port is not None
        topic = unique("auto")
        producer = kafka.KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}")
        try:
            # The producer's Metadata request names the topic: created with the defaults.
            metadata = producer.send(topic, b"first").get(TIMEOUT_S)
        finally:
            producer.close(TIMEOUT_S)
        admin = kafka.KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
        try:
            brokers = [(b["host"], b["port"]) for b in admin.describe_cluster()["brokers"]]
        finally:
            admin.close()
        assert metadata.offset == 0
        assert brokers == [("localhost", port)]
        view = broker.server.core.describe_topic(topic)
        assert len(view.partitions) == 2
