"""DeleteRecords (KIP-107) on a single node over gRPC: the log start moves, reads below it
answer OFFSET_OUT_OF_RANGE with the new start, ListOffsets earliest follows, retention
removes the segments wholly below it, and a restart keeps it; bad input is refused per
partition with Kafka's codes and the broker keeps serving."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.broker.conftest import TIMEOUT_S, fetch, make_batch, produce
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)


def delete_records(
    stub: pb_grpc.BrokerStub, topic: str, offsets: dict[int, int], timeout_ms: int = 0
) -> list[pb.DeleteRecordsResult]:
    response = stub.DeleteRecords(
        pb.DeleteRecordsRequest(
            partitions=[
                pb.DeleteRecordsPartition(topic=topic, partition=p, offset=o)
                for p, o in offsets.items()
            ],
            timeout_ms=timeout_ms,
        ),
        timeout=TIMEOUT_S,
    )
    return list(response.results)


def earliest(stub: pb_grpc.BrokerStub, topic: str, partition: int) -> int:
    response = stub.ListOffsets(
        pb.ListOffsetsRequest(
            partitions=[pb.ListOffsetsPartition(topic=topic, partition=partition, timestamp_ms=-2)]
        ),
        timeout=TIMEOUT_S,
    )
    (result,) = response.results
    assert not result.error_code, result.error_message
    return result.offset


def fill(stub: pb_grpc.BrokerStub, topic: str, partition: int, batches: int) -> None:
    now_ms = int(time.time() * 1000)  # recent: time retention keeps them
    for i in range(batches):
        batch = make_batch([b"a%d" % i, b"b%d" % i], timestamp_ms=now_ms)
        assert not produce(stub, topic, partition, batch).error_code


def test_records_below_the_offset_are_gone(tmp_path: Path) -> None:
    settings = {"log.retention.check.interval.ms": 100}
    with InProcessBroker(tmp_path, settings=settings) as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        stub.CreateTopic(
            pb.CreateTopicRequest(name="trim", partitions=2, config={"segment.bytes": "300"}),
            timeout=TIMEOUT_S,
        )
        fill(stub, "trim", 0, 10)  # offsets 0..19, a few segments
        fill(stub, "trim", 1, 2)
        segments_before = len(list((tmp_path / "trim-0").glob("*.log")))
        assert segments_before > 2

        (zero, one) = delete_records(stub, "trim", {0: 13, 1: -1})
        assert (zero.partition, zero.low_watermark, zero.error_code) == (0, 13, "")
        assert (one.partition, one.low_watermark, one.error_code) == (1, 4, "")  # -1: the HW

        below = fetch(stub, "trim", 0, 12)
        assert (below.error_code, below.log_start_offset) == ("OFFSET_OUT_OF_RANGE", 13)
        assert earliest(stub, "trim", 0) == 13
        assert earliest(stub, "trim", 1) == 4
        at = fetch(stub, "trim", 0, 13)
        assert (at.error_code, at.log_start_offset) == ("", 13)
        assert at.records
        # The segments wholly below 13 go at the next retention pass.
        deadline = time.monotonic() + 20
        while len(list((tmp_path / "trim-0").glob("*.log"))) >= segments_before:
            assert time.monotonic() < deadline, "retention did not remove the segments"
            time.sleep(0.1)

        # A lower offset changes nothing and answers the current start.
        (again,) = delete_records(stub, "trim", {0: 5})
        assert (again.low_watermark, again.error_code) == (13, "")

        broker.restart()
        with broker.channel() as reopened:
            stub = pb_grpc.BrokerStub(reopened)
            assert earliest(stub, "trim", 0) == 13
            assert fetch(stub, "trim", 0, 12).error_code == "OFFSET_OUT_OF_RANGE"
            assert earliest(stub, "trim", 1) == 4
            assert not produce(stub, "trim", 1, make_batch([b"after"])).error_code
            assert fetch(stub, "trim", 1, 4).records


def test_bad_offsets_and_unknown_partitions_are_refused_per_partition(
    stub: pb_grpc.BrokerStub,
) -> None:
    stub.CreateTopic(pb.CreateTopicRequest(name="bad", partitions=2), timeout=TIMEOUT_S)
    fill(stub, "bad", 0, 2)  # high watermark 4
    above, negative, fine = delete_records(stub, "bad", {0: 5, 1: -2}) + delete_records(
        stub, "bad", {0: 3}
    )
    assert (above.error_code, above.low_watermark) == ("OFFSET_OUT_OF_RANGE", -1)
    assert "high watermark" in above.error_message
    assert negative.error_code == "OFFSET_OUT_OF_RANGE"
    assert (fine.error_code, fine.low_watermark) == ("", 3)
    (unknown,) = delete_records(stub, "no-such-topic", {0: 0})
    assert unknown.error_code == "UNKNOWN_TOPIC_OR_PARTITION"
    (missing,) = delete_records(stub, "bad", {7: 0})
    assert missing.error_code == "UNKNOWN_TOPIC_OR_PARTITION"
    assert earliest(stub, "bad", 0) == 3  # the refused ones moved nothing
    assert earliest(stub, "bad", 1) == 0
