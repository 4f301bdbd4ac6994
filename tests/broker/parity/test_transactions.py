"""The transaction coordinator's APIs through both listeners leave the same trace, and
WriteTxnMarkers and VerifyTxnPartition are accepted only from a broker.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from kafka.protocol.producer import ProduceResponse

from tests.broker.parity.support import (
    LISTENERS,
    RECORDS,
    Secure,
    TraceStep,
    _either,
    _Grpc,
    _Kafka,
    _observe,
    check_steps,
)
from tidelog.broker.kafka.errors import error_name
from tidelog.proto.tidelog.v1 import broker_pb2 as pb

pytestmark = pytest.mark.timeout(120)


def test_transactions_leave_the_same_trace_on_both_listeners(
    secure: Secure, both: dict[str, Any]
) -> None:
    """The transaction coordinator's APIs (gRPC's InitTransactions ... ListTransactions,
    Kafka's InitProducerId with a transactional id ... ListTransactions): the same
    decisions, audit lines and counted operations. Kafka counts InitProducerId under its
    api's operation (``init_producer_id``) whatever its content; its authorization is
    ``init_transactions``'s on both."""
    from kafka.protocol.admin.transactions import (
        DescribeTransactionsRequest,
        DescribeTransactionsResponse,
        ListTransactionsRequest,
        ListTransactionsResponse,
    )
    from kafka.protocol.producer.transaction import (
        AddPartitionsToTxnRequest,
        AddPartitionsToTxnResponse,
        EndTxnRequest,
        EndTxnResponse,
        InitProducerIdRequest,
        InitProducerIdResponse,
    )

    core = secure.broker.server.core
    assert core.transactions is not None
    grpc: _Grpc = both["grpc"]
    kafka: _Kafka = both["kafka"]
    identity: dict[str, tuple[int, int]] = {}
    for listener in LISTENERS:  # an id she may not describe, which listings leave out
        core.transactions.init_producer_id(f"hidden-{listener}-tx", 60_000)

    def grpc_init(tid: str) -> list[str]:
        request = pb.InitTransactionsRequest(transactional_id=tid, transaction_timeout_ms=60_000)
        code, answer = grpc._code("InitTransactions", request)
        if answer is not None:
            identity["grpc"] = (answer.producer_id, answer.producer_epoch)
        return [code]

    def kafka_init(tid: str) -> list[str]:
        request = InitProducerIdRequest[4](
            transactional_id=tid, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1
        )
        answer = kafka.session.call(request, InitProducerIdResponse)
        if not answer.error_code:
            identity["kafka"] = (answer.producer_id, answer.producer_epoch)
        return [error_name(answer.error_code)]

    def grpc_add(tid: str, name: str) -> list[str]:
        pid, epoch = identity["grpc"]
        request = pb.AddPartitionsToTxnRequest(
            transactional_id=tid,
            producer_id=pid,
            producer_epoch=epoch,
            partitions=[pb.TopicPartitions(topic=name, partitions=[0])],
        )
        return [grpc._code("AddPartitionsToTxn", request)[0]]

    def kafka_add(tid: str, name: str) -> list[str]:
        pid, epoch = identity["kafka"]
        topic_class = AddPartitionsToTxnRequest[3].AddPartitionsToTxnTopic
        request = AddPartitionsToTxnRequest[3](
            v3_and_below_transactional_id=tid,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[topic_class(name=name, partitions=[0])],
        )
        answer = kafka.session.call(request, AddPartitionsToTxnResponse)
        return [
            error_name(p.partition_error_code)
            for t in answer.results_by_topic_v3_and_below
            for p in t.results_by_partition
        ]

    def grpc_end(tid: str) -> list[str]:
        pid, epoch = identity["grpc"]
        request = pb.EndTxnRequest(
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, commit=True
        )
        return [grpc._code("EndTxn", request)[0]]

    def kafka_end(tid: str) -> list[str]:
        pid, epoch = identity["kafka"]
        request = EndTxnRequest[3](
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=True
        )
        return [error_name(kafka.session.call(request, EndTxnResponse).error_code)]

    def grpc_describe(tid: str) -> list[str]:
        request = pb.DescribeTransactionsRequest(transactional_ids=[tid])
        code, answer = grpc._code("DescribeTransactions", request)
        return [code, *(t.error_code or "OK" for t in answer.transactions)] if answer else [code]

    def kafka_describe(tid: str) -> list[str]:
        request = DescribeTransactionsRequest[0](transactional_ids=[tid])
        answer = kafka.session.call(request, DescribeTransactionsResponse)
        return [error_name(t.error_code) for t in answer.transaction_states]

    def grpc_list() -> list[str]:
        code, answer = grpc._code("ListTransactions", pb.ListTransactionsRequest())
        return [code, *sorted(_either(t.transactional_id) for t in answer.transactions)]

    def kafka_list() -> list[str]:
        request = ListTransactionsRequest[0](state_filters=[], producer_id_filters=[])
        answer = kafka.session.call(request, ListTransactionsResponse)
        return [
            error_name(answer.error_code),
            *sorted(_either(t.transactional_id) for t in answer.transaction_states),
        ]

    def grpc_produce(tid: str, name: str) -> list[str]:
        request = pb.ProduceRequest(
            acks=-1,
            timeout_ms=5_000,
            transactional_id=tid,
            topics=[
                pb.ProduceTopicData(
                    topic=name, partitions=[pb.ProducePartitionData(partition=0, records=RECORDS)]
                )
            ],
        )
        code, answer = grpc._code("Produce", request)
        return [code, *(r.error_code or "OK" for r in answer.results)]

    def kafka_produce(tid: str, name: str) -> list[str]:
        from kafka.protocol.producer import ProduceRequest

        data = ProduceRequest.TopicProduceData
        request = ProduceRequest[7](
            transactional_id=tid,
            acks=-1,
            timeout_ms=5_000,
            topic_data=[
                data(
                    name=name, partition_data=[data.PartitionProduceData(index=0, records=RECORDS)]
                )
            ],
        )
        answer = kafka.session.call(request, ProduceResponse)
        return [
            "OK",
            *(error_name(p.error_code) for t in answer.responses for p in t.partition_responses),
        ]

    refused_id = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    # (what, gRPC's call, Kafka's call, decision (gRPC, Kafka), audit lines, gRPC's and
    # Kafka's counted operation and outcome)
    steps: list[TraceStep] = [
        (
            "init without WRITE on the id",
            lambda: grpc_init("hidden-grpc-other"),
            lambda: kafka_init("hidden-kafka-other"),
            ([refused_id], [refused_id]),
            1,
            (("init_transactions", refused_id), ("init_producer_id", refused_id)),
        ),
        (
            "a transactional produce without WRITE on the id",
            lambda: grpc_produce("hidden-grpc-tx", "ok-grpc-data"),
            lambda: kafka_produce("hidden-kafka-tx", "ok-kafka-data"),
            (["OK", refused_id], ["OK", refused_id]),
            1,
            (("produce", "OK"), ("produce", "OK")),
        ),
        (
            "init",
            lambda: grpc_init("ok-grpc-tx"),
            lambda: kafka_init("ok-kafka-tx"),
            (["OK"], ["OK"]),
            0,
            (("init_transactions", "OK"), ("init_producer_id", "OK")),
        ),
        (
            "add a partition she may not WRITE",
            lambda: grpc_add("ok-grpc-tx", "ro-grpc"),
            lambda: kafka_add("ok-kafka-tx", "ro-kafka"),
            (["TOPIC_AUTHORIZATION_FAILED"], ["TOPIC_AUTHORIZATION_FAILED"]),
            1,
            (
                ("add_partitions_to_txn", "TOPIC_AUTHORIZATION_FAILED"),
                ("add_partitions_to_txn", "OK"),  # answered per partition
            ),
        ),
        (
            "add a partition",
            lambda: grpc_add("ok-grpc-tx", "ok-grpc-data"),
            lambda: kafka_add("ok-kafka-tx", "ok-kafka-data"),
            (["OK"], ["OK"]),
            0,
            (("add_partitions_to_txn", "OK"), ("add_partitions_to_txn", "OK")),
        ),
        (
            "commit",
            lambda: grpc_end("ok-grpc-tx"),
            lambda: kafka_end("ok-kafka-tx"),
            (["OK"], ["OK"]),
            0,
            (("end_txn", "OK"), ("end_txn", "OK")),
        ),
        (
            "describe",
            lambda: grpc_describe("ok-grpc-tx"),
            lambda: kafka_describe("ok-kafka-tx"),
            (["OK", "OK"], ["OK"]),
            0,
            (("describe_transactions", "OK"), ("describe_transactions", "OK")),
        ),
        (
            "describe an id she may not describe",
            lambda: grpc_describe("hidden-grpc-tx"),
            lambda: kafka_describe("hidden-kafka-tx"),
            ([refused_id], [refused_id]),
            1,
            (("describe_transactions", refused_id), ("describe_transactions", "OK")),
        ),
        (
            "list: the hidden ids left out silently",
            grpc_list,
            kafka_list,
            (["OK", "ok-L-tx", "ok-L-tx"], ["OK", "ok-L-tx", "ok-L-tx"]),
            0,
            (("list_transactions", "OK"), ("list_transactions", "OK")),
        ),
    ]
    check_steps(secure, steps)


def test_transaction_markers_are_accepted_only_from_a_broker(
    secure: Secure, both: dict[str, Any]
) -> None:
    """WriteTxnMarkers (Kafka's api 27, gRPC's ``WriteTxnMarkers``; issue #28) is a
    coordinator's call to a partition leader: the caller needs CLUSTER_ACTION on the
    cluster on both listeners, is refused before anything is written, and audited the same
    way. (Counted as each listener counts a refusal: gRPC refuses the call, Kafka answers
    every partition, WriteTxnMarkers having no top-level error.) The gRPC-only
    ``VerifyTxnPartition`` is refused the same way."""
    core = secure.broker.server.core
    core.create_topic("ok-markers", 1, {})
    before = core.logs.get_log("ok-markers", 0).log_end_offset
    seen = {
        listener: _observe(
            secure, listener, functools.partial(both[listener].write_txn_markers, "ok-markers")
        )
        for listener in LISTENERS
    }
    for listener, observed in seen.items():
        assert observed.decision == ["CLUSTER_AUTHORIZATION_FAILED"], listener
        assert len(observed.audit) == 1, (listener, observed.audit)
    assert seen["grpc"].audit == seen["kafka"].audit
    assert seen["grpc"].metrics == {("write_txn_markers", "CLUSTER_AUTHORIZATION_FAILED"): 1.0}
    assert seen["kafka"].metrics == {("write_txn_markers", "OK"): 1.0}
    assert core.logs.get_log("ok-markers", 0).log_end_offset == before  # no marker
    request = pb.VerifyTxnPartitionRequest(
        transactional_id="someone", producer_id=1, topic="ok-markers", broker_id=7
    )
    refused = _observe(
        secure, "grpc", lambda: [both["grpc"]._code("VerifyTxnPartition", request)[0]]
    )
    assert refused.decision == ["CLUSTER_AUTHORIZATION_FAILED"]
    assert len(refused.audit) == 1
