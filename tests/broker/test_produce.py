"""Produce over gRPC: acks, per-partition errors, bad bytes and size limits."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from tests.broker.conftest import (
    TIMEOUT_S,
    create_topic,
    error_code,
    fetch,
    make_batch,
    produce,
)
from tidelog.broker.core.delayed import Purgatory
from tidelog.broker.core.group_fsync import GroupFsync
from tidelog.broker.core.metrics import BrokerMetrics
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.core.produce import Acks, PartitionRecords, ProducePath
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.clock import ManualClock
from tidelog.storage.control import build_marker
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.records import BatchBuilder, decode_records


def _values(stub: pb_grpc.BrokerStub, topic: str, partition: int = 0) -> list[bytes | None]:
    result = fetch(stub, topic, partition, 0, partition_max_bytes=10_000_000)
    assert result.error_code == ""
    return [r.value for r in decode_records(result.records)]


def test_acks_1_answers_offsets(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    first = produce(stub, "t", 0, make_batch([b"a", b"b", b"c"]))
    second = produce(stub, "t", 0, make_batch([b"d"]))
    assert (first.error_code, first.base_offset, second.base_offset) == ("", 0, 3)
    assert first.log_append_time_ms == -1
    assert first.log_start_offset == 0
    assert _values(stub, "t") == [b"a", b"b", b"c", b"d"]


def test_acks_all_answers_once_flushed(broker: InProcessBroker, stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    result = produce(stub, "t", 0, make_batch([b"durable"]), acks=-1)
    assert (result.error_code, result.base_offset) == ("", 0)
    plog = broker.server.core.logs.get_log("t", 0)
    assert plog.recovery_point >= 1  # fsynced before the answer left


def test_acks_0_answers_nothing_but_stores(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    result = produce(stub, "t", 0, make_batch([b"fire", b"forget"]), acks=0)
    assert (result.topic, result.partition, result.base_offset, result.error_code) == (
        "t",
        0,
        -1,
        "",
    )
    # Even a refused append answers nothing with acks=0.
    assert produce(stub, "t", 0, b"garbage", acks=0).error_code == ""
    assert _values(stub, "t") == [b"fire", b"forget"]


@pytest.mark.parametrize("acks", [2, -2, 100])
def test_invalid_acks_fail_the_call(stub: pb_grpc.BrokerStub, acks: int) -> None:
    create_topic(stub, "t")
    with pytest.raises(grpc.RpcError) as info:
        produce(stub, "t", 0, make_batch([b"x"]), acks=acks)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_code(info.value) == "INVALID_REQUEST"


def test_log_append_time_topics_get_the_broker_time(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "stamped", 1, **{"message.timestamp.type": "LogAppendTime"})
    result = produce(stub, "stamped", 0, make_batch([b"x"], timestamp_ms=5))
    assert result.log_append_time_ms > 1_600_000_000_000
    (record,) = decode_records(fetch(stub, "stamped", 0, 0).records)
    assert record.timestamp_ms == result.log_append_time_ms


def test_errors_are_per_partition(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t", 2)
    good = make_batch([b"ok"])
    response = stub.Produce(
        pb.ProduceRequest(
            acks=1,
            topics=[
                pb.ProduceTopicData(
                    topic="t",
                    partitions=[
                        pb.ProducePartitionData(partition=0, records=good),
                        pb.ProducePartitionData(partition=7, records=good),
                        pb.ProducePartitionData(partition=1, records=b"\x00" * 70),
                    ],
                ),
                pb.ProduceTopicData(
                    topic="missing", partitions=[pb.ProducePartitionData(partition=0, records=good)]
                ),
                pb.ProduceTopicData(
                    topic="../x", partitions=[pb.ProducePartitionData(partition=0, records=good)]
                ),
            ],
        ),
        timeout=TIMEOUT_S,
    )
    codes = [(r.topic, r.partition, r.error_code) for r in response.results]
    assert codes == [
        ("t", 0, ""),
        ("t", 7, "UNKNOWN_TOPIC_OR_PARTITION"),
        ("t", 1, "CORRUPT_MESSAGE"),
        ("missing", 0, "UNKNOWN_TOPIC_OR_PARTITION"),
        ("../x", 0, "UNKNOWN_TOPIC_OR_PARTITION"),
    ]
    assert all(r.error_message for r in response.results[1:])
    assert _values(stub, "t") == [b"ok"]


def _corruptions() -> dict[str, bytes]:
    batch = make_batch([b"hello", b"world"])
    flipped = bytearray(batch)
    flipped[-1] ^= 0xFF  # inside the CRC-covered records
    bad_magic = bytearray(batch)
    bad_magic[16] = 1
    return {
        "garbage": b"this is not a record batch at all, not even close........" * 2,
        "truncated": batch[:-3],
        "header-only": batch[:40],
        "crc-mismatch": bytes(flipped),
        "bad-magic": bytes(bad_magic),
        "trailing-garbage": batch + b"\x01\x02\x03",
        "empty": b"",
    }


@pytest.mark.parametrize("kind", sorted(_corruptions()))
def test_bad_batch_bytes_are_refused_and_lose_nothing(stub: pb_grpc.BrokerStub, kind: str) -> None:
    create_topic(stub, "t")
    produce(stub, "t", 0, make_batch([b"before"]), acks=-1)
    result = produce(stub, "t", 0, _corruptions()[kind])
    expected = "INVALID_REQUEST" if kind == "empty" else "CORRUPT_MESSAGE"
    assert result.error_code == expected
    assert result.error_message
    after = produce(stub, "t", 0, make_batch([b"after"]))
    assert (after.error_code, after.base_offset) == ("", 1)
    assert _values(stub, "t") == [b"before", b"after"]


def test_topic_max_message_bytes(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "small", 1, **{"max.message.bytes": "1000"})
    result = produce(stub, "small", 0, make_batch([b"x" * 2000]))
    assert result.error_code == "MESSAGE_TOO_LARGE"
    assert "max.message.bytes" in result.error_message
    assert produce(stub, "small", 0, make_batch([b"x" * 500])).error_code == ""


def test_broker_message_max_bytes_is_the_topic_default() -> None:
    settings = {"message.max.bytes": 1500}
    with InProcessBroker(settings=settings) as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "default")
        create_topic(stub, "override", 1, **{"max.message.bytes": "100000"})
        too_big = make_batch([b"x" * 3000])
        assert produce(stub, "default", 0, too_big).error_code == "MESSAGE_TOO_LARGE"
        assert produce(stub, "override", 0, too_big).error_code == ""


def test_requests_over_socket_request_max_bytes_are_refused() -> None:
    settings = {"socket.request.max.bytes": 64 * 1024, "message.max.bytes": 1_000_000}
    with InProcessBroker(settings=settings) as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t")
        with pytest.raises(grpc.RpcError) as info:
            produce(stub, "t", 0, make_batch([b"x" * 100_000]))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The broker keeps serving, on the same channel.
        assert produce(stub, "t", 0, make_batch([b"small"])).base_offset == 0


def test_concurrent_acks_all_producers_get_distinct_offsets(
    broker: InProcessBroker, stub: pb_grpc.BrokerStub
) -> None:
    create_topic(stub, "t")
    offsets: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def run(worker: int) -> None:
        with broker.channel() as channel:
            own = pb_grpc.BrokerStub(channel)
            for i in range(20):
                result = produce(own, "t", 0, make_batch([f"{worker}-{i}".encode()] * 5), acks=-1)
                with lock:
                    offsets.append(result.base_offset)
                    if result.error_code:
                        errors.append(result.error_code)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert sorted(offsets) == list(range(0, 8 * 20 * 5, 5))
    assert broker.server.core.logs.get_log("t", 0).recovery_point == 800


def test_multi_batch_request_in_one_partition(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    records = make_batch([b"a", b"b"]) + make_batch([b"c"])
    result = produce(stub, "t", 0, records)
    assert (result.error_code, result.base_offset) == ("", 0)
    assert _values(stub, "t") == [b"a", b"b", b"c"]


def test_an_epoch_bump_during_the_append_answers_not_leader_and_appends_nothing(
    tmp_path: Path,
) -> None:
    """Kafka's produce never answers FENCED_LEADER_EPOCH, and librdkafka fails a record
    for good on it (seen in the Kafka listener's cluster test after a broker was killed):
    the race answers NOT_LEADER_OR_FOLLOWER, which every client retries.

    The race: a produce read the role (leader at epoch 3), then a new leadership at epoch
    4 began in the log before its append. A replicated partition of the produce path's own
    registry is set up as the append finds it: leading at 3, the log at 4."""
    clock = ManualClock()
    logs = LogManager.open(tmp_path, LogManagerConfig(), clock)
    try:
        logs.create_topic("bumped", 1, {})
        partitions = PartitionRegistry(logs, 1, clock, replicated=True)
        path = ProducePath(
            partitions,
            lambda _t, _p: None,
            Purgatory("produce", clock),
            GroupFsync(lambda _t, _p: None),
            BrokerMetrics(),
            clock=clock,
        )
        partitions.get("bumped", 0).make_leader(3, (1,), (1,))
        [before] = path.produce(
            [PartitionRecords("bumped", 0, make_batch([b"before"]))], Acks.LEADER
        )
        assert before.error_code == ""
        logs.get_log("bumped", 0).begin_leader_epoch(4)
        [refused] = path.produce(
            [PartitionRecords("bumped", 0, make_batch([b"stale stamp"]))], Acks.LEADER
        )
        assert refused.error_code == "NOT_LEADER_OR_FOLLOWER", refused
        assert "leader epoch moved" in refused.error_message
        stored = logs.get_log("bumped", 0).read(0, 1 << 20).records
        assert [r.value for r in decode_records(stored)] == [b"before"]
    finally:
        logs.close()


def test_markers_and_unverified_transactional_batches_are_refused(
    stub: pb_grpc.BrokerStub,
) -> None:
    """Producers never write markers; a transactional batch is appended only when its
    request names its transactional id and the coordinator confirms the partition is in
    that transaction (``broker.core.produce``). gRPC's Produce names none (Tidelog's
    client has no transactional producer yet, issue #28): refused, nothing stored."""
    create_topic(stub, "t")
    builder = BatchBuilder(producer_id=1, producer_epoch=0, base_sequence=0, is_transactional=True)
    builder.append(0, None, b"in a transaction")
    marker = build_marker(1, 0, commit=True, coordinator_epoch=0, timestamp_ms=0)
    for batch, why in (
        (builder.build(), "without a transactional id"),
        (marker, "control batches"),
        (make_batch([b"ok"]) + builder.build(), "without a transactional id"),
    ):
        result = produce(stub, "t", 0, batch)
        assert result.error_code == "INVALID_REQUEST"
        assert why in result.error_message
    assert _values(stub, "t") == []


@pytest.mark.parametrize("transaction_v2", [False, True])
def test_a_damaged_transactional_batch_is_refused_before_its_coordinator_is_asked(
    tmp_path: Path, transaction_v2: bool
) -> None:
    """The produce path reads a request's headers once, CRC-32C included (issue #31),
    for the transactional check and the append: a transactional batch whose CRC does not
    match is answered ``CORRUPT_MESSAGE`` without asking its coordinator to verify it or
    (transactions v2) to add the partition to the transaction; nothing is stored. The same
    batch undamaged is verified, then appended."""
    clock = ManualClock()
    logs = LogManager.open(tmp_path, LogManagerConfig(), clock)
    asked: list[tuple[str, int, int, tuple[str, int]]] = []

    def coordinator(tid: str, pid: int, epoch: int, tp: tuple[str, int]) -> str:
        asked.append((tid, pid, epoch, tp))
        return ""

    try:
        logs.create_topic("t", 1, {})
        path = ProducePath(
            PartitionRegistry(logs, 1, clock, replicated=False),
            lambda _t, _p: None,
            Purgatory("produce", clock),
            GroupFsync(lambda _t, _p: None),
            BrokerMetrics(),
            clock=clock,
            verify=coordinator,
            add_partition=coordinator,
        )
        builder = BatchBuilder(
            producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True
        )
        builder.append(0, None, b"in a transaction")
        batch = builder.build()
        damaged = bytearray(batch)
        damaged[-1] ^= 0xFF  # inside the CRC-covered records
        v2 = transaction_v2
        [refused] = path.produce(
            [PartitionRecords("t", 0, bytes(damaged), transactional_id="tx", transaction_v2=v2)],
            Acks.LEADER,
        )
        assert refused.error_code == "CORRUPT_MESSAGE", refused
        assert asked == []
        assert logs.get_log("t", 0).log_end_offset == 0
        [stored] = path.produce(
            [PartitionRecords("t", 0, batch, transactional_id="tx", transaction_v2=v2)],
            Acks.LEADER,
        )
        assert (stored.error_code, stored.base_offset) == ("", 0)
        assert asked == [("tx", 7, 0, ("t", 0))]
    finally:
        logs.close()
