"""Idempotent producers end to end: ids, duplicates, fencing, restarts."""

from __future__ import annotations

import grpc
import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, error_code, fetch, make_batch, produce
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.records import decode_records


def _init(stub: pb_grpc.BrokerStub, producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
    answer = stub.InitProducerId(
        pb.InitProducerIdRequest(producer_id=producer_id, producer_epoch=epoch), timeout=TIMEOUT_S
    )
    return answer.producer_id, answer.producer_epoch


def test_retried_batch_is_stored_once_and_answered_with_the_original_offset(
    stub: pb_grpc.BrokerStub,
) -> None:
    create_topic(stub, "t")
    pid, epoch = _init(stub)
    produce(stub, "t", 0, make_batch([b"other"]))
    batch = make_batch([b"a", b"b"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    first = produce(stub, "t", 0, batch, acks=-1)
    retry = produce(stub, "t", 0, batch, acks=-1)
    assert (first.base_offset, first.duplicate) == (1, False)
    assert (retry.error_code, retry.base_offset, retry.duplicate) == ("", 1, True)
    nxt = make_batch([b"c"], producer_id=pid, producer_epoch=epoch, base_sequence=2)
    assert produce(stub, "t", 0, nxt).base_offset == 3
    values = [r.value for r in decode_records(fetch(stub, "t", 0, 0).records)]
    assert values == [b"other", b"a", b"b", b"c"]


def test_sequence_gaps_and_old_epochs_are_refused(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, "t")
    pid, epoch = _init(stub)
    produce(
        stub, "t", 0, make_batch([b"a"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    )
    gap = make_batch([b"b"], producer_id=pid, producer_epoch=epoch, base_sequence=5)
    assert produce(stub, "t", 0, gap).error_code == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    # Re-initialising bumps the epoch; the new epoch starts at sequence 0 and fences the old.
    assert _init(stub, pid, epoch) == (pid, epoch + 1)
    new = make_batch([b"c"], producer_id=pid, producer_epoch=epoch + 1, base_sequence=0)
    assert produce(stub, "t", 0, new).error_code == ""
    zombie = make_batch([b"z"], producer_id=pid, producer_epoch=epoch, base_sequence=1)
    assert produce(stub, "t", 0, zombie).error_code == "INVALID_PRODUCER_EPOCH"


def test_an_empty_request_is_a_new_producer_not_producer_zero(stub: pb_grpc.BrokerStub) -> None:
    first = stub.InitProducerId(pb.InitProducerIdRequest(), timeout=TIMEOUT_S)
    second = stub.InitProducerId(pb.InitProducerIdRequest(), timeout=TIMEOUT_S)
    assert (first.producer_id, first.producer_epoch) == (0, 0)
    assert (second.producer_id, second.producer_epoch) == (1, 0)  # producer 0 not bumped
    assert _init(stub, 0, 0) == (0, 1)  # explicit fields still re-initialise


def test_init_producer_id_errors(stub: pb_grpc.BrokerStub) -> None:
    pid, epoch = _init(stub)
    _init(stub, pid, epoch)
    cases = [
        ((pid, epoch), grpc.StatusCode.FAILED_PRECONDITION, "INVALID_PRODUCER_EPOCH"),
        ((pid + 100, 0), grpc.StatusCode.FAILED_PRECONDITION, "UNKNOWN_PRODUCER_ID"),
        ((pid, -1), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"),
    ]
    for (producer_id, producer_epoch), status, code in cases:
        with pytest.raises(grpc.RpcError) as info:
            _init(stub, producer_id, producer_epoch)
        assert info.value.code() == status
        assert error_code(info.value) == code


def test_ids_and_producer_state_survive_a_restart(broker: InProcessBroker) -> None:
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t")
        pid, epoch = _init(stub)
        batch = make_batch([b"once"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
        assert produce(stub, "t", 0, batch, acks=-1).base_offset == 0
    broker.restart()
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        retry = produce(stub, "t", 0, batch, acks=-1)
        assert (retry.base_offset, retry.duplicate) == (0, True)
        assert _init(stub)[0] > pid  # never handed out twice
        assert len(list(decode_records(fetch(stub, "t", 0, 0).records))) == 1
