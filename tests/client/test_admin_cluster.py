"""Cluster views of a single node through the real client: it is a one-broker cluster."""

from __future__ import annotations

import socket

import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.admin import ClusterDescription
from tidelog.client.cluster import BrokerNode
from tidelog.storage.errors import InvalidReplicationFactorError


def _dead_address() -> str:
    """A local port nobody listens on (bound then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_single_node_is_a_one_broker_cluster(broker: InProcessBroker, admin: AdminClient) -> None:
    host, port = broker.address.rsplit(":", 1)
    description = admin.describe_cluster()
    assert isinstance(description, ClusterDescription)
    assert description.brokers == (BrokerNode(0, host, int(port)),)
    assert description.controller_id == 0


def test_describe_topic_shows_leader_replicas_isr_and_epoch(admin: AdminClient) -> None:
    created = admin.create_topic("cluster-describe", 2, replication_factor=1)
    for partitions in (created.partitions, admin.describe_topic("cluster-describe").partitions):
        assert [(p.leader, p.replicas, p.isr) for p in partitions] == [(0, (0,), (0,))] * 2
        assert all(p.leader_epoch >= 0 for p in partitions)


def test_more_replicas_than_one_node_holds_are_refused(admin: AdminClient) -> None:
    with pytest.raises(InvalidReplicationFactorError, match="replication factor 2"):
        admin.create_topic("cluster-rf2", 1, replication_factor=2)
    assert "cluster-rf2" not in {t.name for t in admin.list_topics()}
    with pytest.raises(ValueError, match="replication_factor"):
        admin.create_topic("cluster-rf0", 1, replication_factor=0)


def test_a_bootstrap_list_works_when_a_later_address_is_dead(broker: InProcessBroker) -> None:
    bootstrap = f"{broker.address},{_dead_address()}"
    with AdminClient(bootstrap, request_timeout_ms=10_000) as admin:
        admin.create_topic("cluster-bootstrap", 1)
        assert admin.describe_cluster().controller_id == 0
    with Producer(bootstrap) as producer:
        producer.send("cluster-bootstrap", b"v").result(timeout=10)
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("cluster-bootstrap", 0)])
        assert consumer.end_offsets([TopicPartition("cluster-bootstrap", 0)]) == {
            TopicPartition("cluster-bootstrap", 0): 1
        }
