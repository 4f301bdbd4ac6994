"""Kafka's Metadata on a single node: the node is broker, controller and every leader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic
from tidelog.broker.config import BrokerConfig
from tidelog.broker.core.meta_properties import META_PROPERTIES, ensure_meta_properties
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import InvalidConfigError


def test_a_single_node_answers_metadata_as_the_whole_cluster(broker: InProcessBroker) -> None:
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "m", partitions=3)
        answer = stub.Metadata(pb.MetadataRequest(), timeout=TIMEOUT_S)
        assert answer.broker_id == 0
        assert answer.controller_id == 0
        assert [(b.id, b.host, b.port) for b in answer.brokers] == [(0, "127.0.0.1", broker.port)]
        assert answer.cluster_id
        names = [t.name for t in answer.topics]
        assert "m" in names
        assert "__consumer_offsets" not in names
        topic = next(t for t in answer.topics if t.name == "m")
        assert [
            (p.partition, p.leader, list(p.replicas), list(p.isr)) for p in topic.partitions
        ] == [
            (0, 0, [0], [0]),
            (1, 0, [0], [0]),
            (2, 0, [0], [0]),
        ]
        asked = stub.Metadata(
            pb.MetadataRequest(topics=["m", "nope"], include_internal=True), timeout=TIMEOUT_S
        )
        assert [(t.name, t.error_code) for t in asked.topics] == [
            ("m", ""),
            ("nope", "UNKNOWN_TOPIC_OR_PARTITION"),
        ]
        internal = stub.Metadata(pb.MetadataRequest(include_internal=True), timeout=TIMEOUT_S)
        assert any(t.name == "__consumer_offsets" and t.internal for t in internal.topics)
        described = stub.DescribeTopic(pb.DescribeTopicRequest(name="m"), timeout=TIMEOUT_S)
        assert [(p.leader, list(p.replicas), list(p.isr)) for p in described.partitions] == [
            (0, [0], [0])
        ] * 3


def test_the_cluster_id_survives_a_restart(broker: InProcessBroker) -> None:
    with broker.channel() as channel:
        before = pb_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest(), timeout=TIMEOUT_S)
    broker.restart()
    with broker.channel() as channel:
        after = pb_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest(), timeout=TIMEOUT_S)
    assert after.cluster_id == before.cluster_id


def test_a_data_directory_belongs_to_one_broker_and_cluster(tmp_path: Path) -> None:
    cluster = ensure_meta_properties(tmp_path, 3)
    assert ensure_meta_properties(tmp_path, 3) == cluster
    assert f"cluster.id={cluster}" in (tmp_path / META_PROPERTIES).read_text()
    with pytest.raises(InvalidConfigError, match="belongs to broker 3, not 4"):
        ensure_meta_properties(tmp_path, 4)
    with pytest.raises(InvalidConfigError, match="belongs to cluster"):
        ensure_meta_properties(tmp_path, 3, "another-cluster")


def test_advertised_endpoints() -> None:
    assert BrokerConfig(listen_host="0.0.0.0").advertised_endpoint(7410) == ("127.0.0.1", 7410)
    config = BrokerConfig.from_mapping({"advertised.listeners": "broker-1.example:9000"})
    assert config.advertised_endpoint(7410) == ("broker-1.example", 9000)
    with pytest.raises(InvalidConfigError, match=r"advertised\.listeners"):
        BrokerConfig.from_mapping({"advertised.listeners": "no-port"})


def test_a_single_node_coordinates_every_group(broker: InProcessBroker) -> None:
    with broker.channel() as channel:
        answer = pb_grpc.BrokerStub(channel).FindCoordinator(
            pb.FindCoordinatorRequest(group_id="billing"), timeout=TIMEOUT_S
        )
    assert (answer.coordinator.id, answer.coordinator.port) == (0, broker.port)
