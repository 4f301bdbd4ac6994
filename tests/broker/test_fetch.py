"""Fetch over gRPC: stored bytes, offsets out of range, limits, long polls."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, error_code, fetch, make_batch, produce
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.records import decode_records, iter_batch_headers


def test_fetch_answers_stored_bytes_and_offsets(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    produce(stub, "t", 0, make_batch([b"a", b"b", b"c"]))
    produce(stub, "t", 0, make_batch([b"d"]))
    result = fetch(stub, "t", 0, 1)
    assert (result.error_code, result.high_watermark, result.log_start_offset) == ("", 4, 0)
    # The first batch starts before the offset asked for: it is returned whole, as stored.
    records = list(decode_records(result.records))
    assert [(r.offset, r.value) for r in records] == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    at_end = fetch(stub, "t", 0, 4)
    assert (at_end.error_code, at_end.records, at_end.high_watermark) == ("", b"", 4)


@pytest.mark.parametrize("offset", [-1, -100, 5, 1_000_000])
def test_offsets_out_of_range(stub: pb_grpc.BrokerStub, offset: int) -> None:
    create_topic(stub, "t")
    produce(stub, "t", 0, make_batch([b"a", b"b", b"c", b"d"]))
    result = fetch(stub, "t", 0, offset)
    assert result.error_code == "OFFSET_OUT_OF_RANGE"
    assert "out of range" in result.error_message
    assert fetch(stub, "t", 0, 0).records  # still serving


def test_an_out_of_range_partition_answers_at_once_even_with_a_long_wait(
    stub: pb_grpc.BrokerStub,
) -> None:
    create_topic(stub, "t")
    started = time.monotonic()
    result = fetch(stub, "t", 0, 3, max_wait_ms=5_000, min_bytes=1)
    assert result.error_code == "OFFSET_OUT_OF_RANGE"
    assert time.monotonic() - started < 2


def test_unknown_topic_or_partition_per_partition(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    assert fetch(stub, "t", 3, 0).error_code == "UNKNOWN_TOPIC_OR_PARTITION"
    assert fetch(stub, "nope", 0, 0).error_code == "UNKNOWN_TOPIC_OR_PARTITION"
    assert fetch(stub, "a/b", 0, 0).error_code == "UNKNOWN_TOPIC_OR_PARTITION"


@pytest.mark.parametrize("field", ["max_wait_ms", "min_bytes", "max_bytes"])
def test_negative_limits_fail_the_call(stub: pb_grpc.BrokerStub, field: str) -> None:
    create_topic(stub, "t")
    request = pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=0)])
    setattr(request, field, -1)
    with pytest.raises(grpc.RpcError) as info:
        stub.Fetch(request, timeout=TIMEOUT_S)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_code(info.value) == "INVALID_REQUEST"


def test_long_poll_is_woken_by_an_append(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    produce(stub, "t", 0, make_batch([b"old"]))

    def later() -> None:
        time.sleep(0.2)
        produce(stub, "t", 0, make_batch([b"new"]))

    thread = threading.Thread(target=later)
    started = time.monotonic()
    thread.start()
    result = fetch(stub, "t", 0, 1, max_wait_ms=8_000, min_bytes=1)
    elapsed = time.monotonic() - started
    thread.join(5)
    assert [r.value for r in decode_records(result.records)] == [b"new"]
    assert 0.15 < elapsed < 4  # woken by the append, not by the 8 s timeout


def test_long_poll_waits_out_max_wait_when_nothing_arrives(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    started = time.monotonic()
    result = fetch(stub, "t", 0, 0, max_wait_ms=300, min_bytes=1)
    elapsed = time.monotonic() - started
    assert (result.error_code, result.records, result.high_watermark) == ("", b"", 0)
    assert 0.28 < elapsed < 3


def test_min_bytes_keeps_waiting_for_enough_data(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t", 2)
    small = make_batch([b"x"])
    done = threading.Event()
    answer: list[pb.FetchResponse] = []

    def poll() -> None:
        answer.append(
            stub.Fetch(
                pb.FetchRequest(
                    max_wait_ms=8_000,
                    min_bytes=3 * len(small),
                    partitions=[
                        pb.FetchPartition(topic="t", partition=0),
                        pb.FetchPartition(topic="t", partition=1),
                    ],
                ),
                timeout=TIMEOUT_S,
            )
        )
        done.set()

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.1)
    produce(stub, "t", 0, small)
    produce(stub, "t", 1, small)
    assert not done.wait(0.3)  # 2 batches are less than min_bytes
    produce(stub, "t", 1, small)
    assert done.wait(4)
    thread.join(5)
    sizes = [len(r.records) for r in answer[0].results]
    assert sizes == [len(small), 2 * len(small)]


def test_the_call_deadline_cuts_a_long_poll_short(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    started = time.monotonic()
    result = fetch(stub, "t", 0, 0, max_wait_ms=30_000, min_bytes=1, timeout_s=0.5)
    assert result.records == b""
    assert time.monotonic() - started < 0.5


def test_size_limits_keep_batches_whole(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t", 2)
    big = make_batch([b"x" * 5_000])
    for _ in range(3):
        produce(stub, "t", 0, big)
        produce(stub, "t", 1, big)
    # The first batch is whole even though it is larger than every limit.
    one = fetch(stub, "t", 0, 0, partition_max_bytes=100)
    assert [h.base_offset for _, h in iter_batch_headers(one.records)] == [0]
    two = fetch(stub, "t", 0, 0, partition_max_bytes=2 * len(big))
    assert len(two.records) == 2 * len(big)
    # The whole answer's limit: partition 1 gets nothing once partition 0 used it up.
    response = stub.Fetch(
        pb.FetchRequest(
            max_bytes=len(big) + 10,
            partitions=[
                pb.FetchPartition(topic="t", partition=0, fetch_offset=0),
                pb.FetchPartition(topic="t", partition=1, fetch_offset=0),
            ],
        ),
        timeout=TIMEOUT_S,
    )
    assert [len(r.records) for r in response.results] == [len(big), 0]
    assert response.results[1].high_watermark == 3  # offsets still answered


def test_fetch_stream_answers_each_request_in_order(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    for value in (b"a", b"b", b"c"):
        produce(stub, "t", 0, make_batch([value]))
    requests = [
        pb.FetchRequest(
            correlation_id=n, partitions=[pb.FetchPartition(topic="t", partition=0, fetch_offset=n)]
        )
        for n in range(4)
    ]
    answers = list(stub.FetchStream(iter(requests), timeout=TIMEOUT_S))
    assert [a.correlation_id for a in answers] == [0, 1, 2, 3]
    assert [len(a.results[0].records) > 0 for a in answers] == [True, True, True, False]


def test_stopping_the_broker_answers_waiting_long_polls() -> None:
    broker = InProcessBroker().start()
    try:
        with broker.channel() as channel:
            stub = pb_grpc.BrokerStub(channel)
            create_topic(stub, "t")
            future = stub.Fetch.future(
                pb.FetchRequest(
                    max_wait_ms=20_000,
                    min_bytes=1,
                    partitions=[pb.FetchPartition(topic="t", partition=0)],
                ),
                timeout=TIMEOUT_S,
            )
            time.sleep(0.2)
            started = time.monotonic()
            broker.stop(grace_ms=5_000)
            assert time.monotonic() - started < 3
            assert future.result(timeout=5).results[0].records == b""
    finally:
        broker.stop()
