"""A cluster whose brokers speak TLS only, with client certificates required: replica
fetchers and the controlled shutdown call present the broker's certificate
(``broker.tls.InterBrokerChannels``), clients theirs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tidelog.broker.cluster.store import ClusterStore
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import ZooKeeperUserStore
from tidelog.broker.testing_tls import TestPki
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.storage.errors import BrokerUnavailableError, KafkaTimeoutError, TidelogError

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
            # No answer for a plaintext client: refused at the handshake, or (on a loaded
            # machine, as once in CI) still unanswered when its deadline passed.
            pytest.raises((BrokerUnavailableError, KafkaTimeoutError)),
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


def test_scram_users_in_zookeeper_and_brokers_logging_in_to_each_other(tmp_path: Path) -> None:
    require_zookeeper()
    pki = TestPki.create(tmp_path / "pki")
    settings = {
        **pki.broker_settings("SASL_SSL"),
        "inter.broker.sasl.username": "broker",
        "inter.broker.sasl.password": "broker-secret",
        "replica.lag.time.max.ms": 2_000,
        "replica.fetch.backoff.ms": 200,
    }
    with LocalCluster(brokers=2, session_timeout_ms=3_000, settings=settings) as cluster:
        # The first users go straight into ZooKeeper, where every broker reads them.
        store = ClusterStore.connect(f"{cluster.zookeeper.connect_string}/tidelog")
        try:
            users = ZooKeeperUserStore(store)
            users.upsert("broker", credential_from_password("SCRAM-SHA-512", "broker-secret"))
            users.upsert("admin", credential_from_password("SCRAM-SHA-512", "admin-secret"))
        finally:
            store.close()
        admin_login = {
            **pki.client_settings("SASL_SSL"),
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "admin",
            "sasl_plain_password": "admin-secret",
        }
        for broker_id in cluster.broker_ids:  # every broker knows the users
            with AdminClient(cluster.address(broker_id), **admin_login) as admin:
                admin.list_topics()
        with AdminClient(cluster.bootstrap, request_timeout_ms=20_000, **admin_login) as admin:
            admin.upsert_user("erin", "erin-secret", "SCRAM-SHA-256")
            admin.create_topic("sasl", 1, replication_factor=2)
            deadline = time.monotonic() + 60
            while True:  # followers fetch as User:broker
                try:
                    if len(admin.describe_topic("sasl").partitions[0].isr) == 2:
                        break
                except TidelogError:
                    pass
                assert time.monotonic() < deadline, "the follower never joined the ISR"
                time.sleep(0.2)
        erin = {
            **admin_login,
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": "erin",
            "sasl_plain_password": "erin-secret",
        }
        for broker_id in cluster.broker_ids:  # a user made through one broker, on all
            with AdminClient(cluster.address(broker_id), **erin) as admin:
                assert "erin" in admin.list_users()
