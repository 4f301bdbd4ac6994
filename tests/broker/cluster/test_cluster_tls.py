"""A cluster whose brokers speak TLS only, with client certificates required: replica
fetchers and the controlled shutdown call present the broker's certificate
(``broker.tls.InterBrokerChannels``), clients theirs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker.cluster.testing import LocalCluster
from broker.testing_tls import TestPki
from client import AdminClient, Consumer, Producer, TopicPartition
from storage.errors import BrokerUnavailableError, TidelogError
from tests.broker.cluster.conftest import require_zookeeper

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_replication_over_mutual_tls(tmp_path: Path) -> None:
    require_zookeeper()
    pki = TestPki.create(tmp_path / "pki")
    settings = {
        **pki.broker_settings("SSL", "required"),
        "replica.lag.time.max.ms": 2_000,
        "replica.fetch.backoff.ms": 200,
    }
    client = pki.client_settings("SSL", certificate=True)
    with LocalCluster(brokers=2, session_timeout_ms=3_000, settings=settings) as cluster:
        with (
            AdminClient(cluster.bootstrap, request_timeout_ms=1_500) as plain,
            pytest.raises(BrokerUnavailableError),
        ):
            plain.list_topics()
        with AdminClient(cluster.bootstrap, request_timeout_ms=20_000, **client) as admin:
            admin.create_topic("secure", 1, replication_factor=2)
            deadline = time.monotonic() + 60
            while True:  # the follower caught up over TLS: both replicas in sync
                try:
                    if len(admin.describe_topic("secure").partitions[0].isr) == 2:
                        break
                except TidelogError:
                    pass
                assert time.monotonic() < deadline, "the follower never joined the ISR"
                time.sleep(0.2)
            with Producer(cluster.bootstrap, acks="all", **client) as producer:
                for i in range(20):
                    producer.send("secure", f"m{i}".encode())
                producer.flush(timeout_ms=30_000)
            assert len(admin.describe_topic("secure").partitions[0].isr) == 2
        with Consumer(cluster.bootstrap, auto_offset_reset="earliest", **client) as consumer:
            consumer.assign([TopicPartition("secure", 0)])
            values: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(values) < 20 and time.monotonic() < deadline:
                values += [r.value for r in consumer.poll(timeout_ms=300) if r.value]
        assert values == [f"m{i}".encode() for i in range(20)]
