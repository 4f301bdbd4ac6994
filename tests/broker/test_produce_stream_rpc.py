"""ProduceStream over gRPC: in-flight requests, answers in order, errors end the stream."""

from __future__ import annotations

import grpc
import pytest

from tests.broker.conftest import (
    TIMEOUT_S,
    create_topic,
    error_code,
    fetch,
    make_batch,
    produce_request,
)
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.records import decode_records


@pytest.mark.parametrize("acks", [0, 1, -1])
def test_stream_answers_every_request_in_order(
    broker: InProcessBroker, stub: pb_grpc.BrokerStub, acks: int
) -> None:
    create_topic(stub, "t", 2)
    requests = [
        produce_request(
            "t", n % 2, make_batch([f"v{n}".encode()] * 3), acks, correlation_id=100 + n
        )
        for n in range(40)
    ]
    answers = list(stub.ProduceStream(iter(requests), timeout=TIMEOUT_S))
    assert [a.correlation_id for a in answers] == [100 + n for n in range(40)]
    assert all(r.error_code == "" for a in answers for r in a.results)
    if acks != 0:
        assert [a.results[0].base_offset for a in answers[::2]] == list(range(0, 60, 3))
    if acks == -1:
        for partition in (0, 1):
            assert broker.server.core.logs.get_log("t", partition).recovery_point == 60
    records = list(decode_records(fetch(stub, "t", 1, 0, partition_max_bytes=1 << 20).records))
    assert [r.value for r in records[::3]] == [f"v{n}".encode() for n in range(1, 40, 2)]


def test_partition_errors_do_not_end_the_stream(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    requests = [
        produce_request("t", 0, make_batch([b"ok"]), correlation_id=1),
        produce_request("t", 0, b"garbage" * 20, correlation_id=2),
        produce_request("t", 9, make_batch([b"ok"]), correlation_id=3),
        produce_request("t", 0, make_batch([b"ok"]), correlation_id=4),
    ]
    answers = list(stub.ProduceStream(iter(requests), timeout=TIMEOUT_S))
    codes = [a.results[0].error_code for a in answers]
    assert codes == ["", "CORRUPT_MESSAGE", "UNKNOWN_TOPIC_OR_PARTITION", ""]
    assert answers[3].results[0].base_offset == 1


def test_a_bad_request_ends_the_stream_with_its_code(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    requests = [
        produce_request("t", 0, make_batch([b"ok"]), correlation_id=1),
        produce_request("t", 0, make_batch([b"ok"]), acks=5, correlation_id=2),
        produce_request("t", 0, make_batch([b"never"]), correlation_id=3),
    ]
    call = stub.ProduceStream(iter(requests), timeout=TIMEOUT_S)
    got: list[int] = []

    def drain() -> None:
        got.extend(answer.correlation_id for answer in call)

    with pytest.raises(grpc.RpcError) as info:
        drain()
    assert got == [1]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_code(info.value) == "INVALID_REQUEST"
    records = list(decode_records(fetch(stub, "t", 0, 0).records))
    assert [r.value for r in records] == [b"ok"]
