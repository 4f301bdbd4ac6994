"""Incremental fetch sessions on the gRPC listener (KIP-227's rules, as the followers use
them): a session opened and continued, a forgotten partition no longer answered, Kafka's
errors for a retried epoch or an unknown session, a session closed, and a consumer's
fetch with a session refused. On a single node every partition answers its own error to
a follower (nothing is replicated here), which is what lets each answer be seen; the
skipping of idle partitions is tested against a leader in
``tests/broker/cluster/test_follower_fetch_sessions.py``, and the followers' use of it
between broker processes in ``tests/broker/cluster/test_fetch_session_processes.py``."""

from __future__ import annotations

import grpc
import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, error_code
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

TOPIC = "sessions"


def follower_fetch(
    stub: pb_grpc.BrokerStub,
    session_id: int,
    epoch: int | None,
    partitions: list[int],
    forgotten: list[int] | None = None,
) -> pb.FetchResponse:
    request = pb.FetchRequest(
        replica_id=7,
        partitions=[pb.FetchPartition(topic=TOPIC, partition=p) for p in partitions],
        session_id=session_id,
        forgotten=[pb.TopicPartitions(topic=TOPIC, partitions=forgotten or [])],
    )
    if epoch is not None:
        request.session_epoch = epoch
    return stub.Fetch(request, timeout=TIMEOUT_S)


def answered(response: pb.FetchResponse) -> list[int]:
    return sorted(r.partition for r in response.results)


def test_a_session_is_opened_continued_and_closed(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, TOPIC, 3)
    opened = follower_fetch(stub, 0, 0, [0, 1, 2])
    assert opened.session_id > 0
    assert not opened.error_code
    assert answered(opened) == [0, 1, 2]
    session = opened.session_id
    # Naming nothing: the session's partitions are read (each answers its error here).
    assert answered(follower_fetch(stub, session, 1, [])) == [0, 1, 2]
    dropped = follower_fetch(stub, session, 2, [], forgotten=[1])
    assert dropped.session_id == session
    assert answered(dropped) == [0, 2]
    retried = follower_fetch(stub, session, 2, [])  # the same epoch again
    assert retried.error_code == "INVALID_FETCH_SESSION_EPOCH"
    assert not retried.results
    unknown = follower_fetch(stub, session + 1, 1, [])
    assert unknown.error_code == "FETCH_SESSION_ID_NOT_FOUND"
    assert not unknown.results
    closed = follower_fetch(stub, session, -1, [0])  # a full fetch, the session closed
    assert closed.session_id == 0
    assert answered(closed) == [0]
    gone = follower_fetch(stub, session, 3, [])
    assert gone.error_code == "FETCH_SESSION_ID_NOT_FOUND"


def test_a_fetch_without_session_fields_keeps_none(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, TOPIC, 2)
    response = follower_fetch(stub, 0, None, [0, 1])
    assert response.session_id == 0
    assert answered(response) == [0, 1]


def test_a_consumer_fetch_with_a_session_is_refused(stub: pb_grpc.BrokerStub) -> None:
    create_topic(stub, TOPIC, 1)
    request = pb.FetchRequest(
        partitions=[pb.FetchPartition(topic=TOPIC, partition=0)], session_epoch=0
    )
    with pytest.raises(grpc.RpcError) as refused:
        stub.Fetch(request, timeout=TIMEOUT_S)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_code(refused.value) == "INVALID_REQUEST"
    assert "follower" in (refused.value.details() or "")
