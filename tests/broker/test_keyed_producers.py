"""Keyed InitProducerId and DescribeProducers: what an effectively-once writer builds on."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, error_code, make_batch, produce
from tidelog.broker.core.producer_ids import STATE_FILE_NAME, ProducerIdManager
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import InvalidRequestError

DAY_MS = 86_400_000


def test_a_key_keeps_its_id_and_epoch_across_restarts(tmp_path: Path) -> None:
    clock = ManualClock()
    manager = ProducerIdManager.open(tmp_path, clock, DAY_MS)
    plain = manager.init(-1, -1)
    first = manager.init_keyed("spark:q:0:1")
    assert first == (plain[0] + 1, 0)
    assert manager.init_keyed("spark:q:0:1") == first  # not bumped
    other = manager.init_keyed("spark:q:0:2")
    assert other[0] not in (plain[0], first[0])
    reopened = ProducerIdManager.open(tmp_path, clock, DAY_MS)
    assert reopened.init_keyed("spark:q:0:1") == first
    assert reopened.init(-1, -1)[0] == other[0] + 1  # keyed ids are never handed out again
    document = json.loads((tmp_path / STATE_FILE_NAME).read_text())
    assert document["keys"] == {"spark:q:0:1": first[0], "spark:q:0:2": other[0]}


def test_a_key_expires_with_its_id(tmp_path: Path) -> None:
    clock = ManualClock()
    manager = ProducerIdManager.open(tmp_path, clock, DAY_MS)
    first = manager.init_keyed("k")
    clock.advance(DAY_MS // 2)
    assert manager.init_keyed("k") == first  # using it refreshes it
    clock.advance(DAY_MS + 1)
    assert manager.init_keyed("k")[0] != first[0]
    with pytest.raises(InvalidRequestError):
        manager.init_keyed("")


def _keyed(stub: pb_grpc.BrokerStub, key: str) -> tuple[int, int]:
    answer = stub.InitProducerId(pb.InitProducerIdRequest(producer_key=key), timeout=TIMEOUT_S)
    return answer.producer_id, answer.producer_epoch


def _describe(
    stub: pb_grpc.BrokerStub, topic: str, partitions: list[int], producer_id: int | None = None
) -> list[pb.DescribeProducersPartition]:
    request = pb.DescribeProducersRequest(
        partitions=[pb.TopicPartitions(topic=topic, partitions=partitions)]
    )
    if producer_id is not None:
        request.producer_id = producer_id
    return list(stub.DescribeProducers(request, timeout=TIMEOUT_S).partitions)


def test_describe_producers_reports_last_sequences_durably(broker: InProcessBroker) -> None:
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t", partitions=2)
        pid, _ = _keyed(stub, "writer-1")
        for base in range(0, 21, 3):  # 7 batches: more than the 5 kept for duplicates
            batch = make_batch([b"x"] * 3, producer_id=pid, producer_epoch=4, base_sequence=base)
            assert produce(stub, "t", 0, batch).error_code == ""
        (p0, p1) = _describe(stub, "t", [0, 1], pid)
        assert [(s.producer_id, s.producer_epoch, s.last_sequence) for s in p0.producers] == [
            (pid, 4, 20)
        ]
        assert p0.producers[0].last_offset == 20
        assert list(p1.producers) == []
        with pytest.raises(grpc.RpcError) as raised:
            stub.InitProducerId(
                pb.InitProducerIdRequest(producer_key="k", producer_id=pid), timeout=TIMEOUT_S
            )
        assert error_code(raised.value) == "INVALID_REQUEST"
        unknown = _describe(stub, "missing", [0])[0]
        assert unknown.error_code == "UNKNOWN_TOPIC_OR_PARTITION"
    broker.restart()
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        assert _keyed(stub, "writer-1")[0] == pid
        (p0,) = _describe(stub, "t", [0])
        assert [(s.producer_id, s.last_sequence) for s in p0.producers] == [(pid, 20)]
