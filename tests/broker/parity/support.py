"""What the parity tests share: the principal and its secrets, the broker handle, a
driver per listener (``_Grpc`` over the client's ``Transport``, ``_Kafka`` over a raw
TLS socket logged in with SCRAM-SHA-256) and ``_observe``, which records what one
operation through one listener left behind (decision, audit lines, counted operations).

The names keep the leading underscore they had in the one module the package was split
from: they are this package's helpers, shared by its tests and by nothing else.
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
)
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import FetchResponse, OffsetCommitResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceResponse

from tests.kafka.raw import SaslSession, fetch_request, offset_commit_request
from tidelog.broker.core.audit import AUDIT_LOGGER_NAME
from tidelog.broker.kafka.errors import error_name
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki
from tidelog.client.security import ClientSecurity
from tidelog.client.transport import Transport
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import TidelogError
from tidelog.storage.records import BatchBuilder


# kafka-python ships WriteTxnMarkers' schema but no classes for it (a broker-only API).
class WriteTxnMarkersRequest(ApiMessage):
    pass


class WriteTxnMarkersResponse(ApiMessage):
    pass


LISTENERS = ("grpc", "kafka")
USER = "alice"
PASSWORD = "alice-secret"
MECHANISM = "SCRAM-SHA-256"


@dataclass(frozen=True)
class Secure:
    broker: InProcessBroker
    pki: TestPki


class _KafkaSession(SaslSession):
    """A raw Kafka connection over TLS, logged in with SCRAM-SHA-256."""

    def __init__(self, secure: Secure, client_id: str) -> None:
        context = ssl.create_default_context(cafile=str(secure.pki.ca_cert))
        raw = socket.create_connection(("127.0.0.1", secure.broker.server.kafka_port), 10)
        super().__init__(context.wrap_socket(raw, server_hostname="localhost"), client_id)
        answer = self.login(USER, PASSWORD, MECHANISM)
        assert answer.error_code == 0, answer.error_message


def _grpc(secure: Secure) -> Transport:
    security = ClientSecurity(
        security_protocol="SASL_SSL",
        ssl_cafile=str(secure.pki.ca_cert),
        sasl_mechanism=MECHANISM,
        sasl_plain_username=USER,
        sasl_plain_password=PASSWORD,
    )
    return Transport(
        secure.broker.address,
        client_id="parity-grpc",
        request_timeout_ms=10_000,
        security=security,
    )


class _AuditLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


@dataclass
class Observed:
    """What one operation through one listener left behind."""

    decision: list[str]
    audit: list[dict[str, Any]]
    metrics: dict[tuple[str, str], float]


def _operation_samples(secure: Secure, listener: str) -> dict[tuple[str, str], float]:
    registry = secure.broker.server.core.metrics.registry
    out: dict[tuple[str, str], float] = {}
    for family in registry.collect():
        if family.name != "tidelog_operations":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels["listener"] == listener:
                out[(sample.labels["operation"], sample.labels["outcome"])] = sample.value
    return out


def _normalised(line: dict[str, Any], listener: str) -> dict[str, Any]:
    kept = {k: v for k, v in line.items() if k not in ("time", "host", "rpc", "listener")}
    if kept.get("resource_type") != "CLUSTER" and isinstance(kept.get("resource_name"), str):
        kept["resource_name"] = kept["resource_name"].replace(listener, "L")
    return kept


def _observe(secure: Secure, listener: str, action: Callable[[], list[str]]) -> Observed:
    handler = _AuditLines()
    audit_log = logging.getLogger(AUDIT_LOGGER_NAME)
    old_level = audit_log.level
    audit_log.setLevel(logging.INFO)
    audit_log.addHandler(handler)
    before = _operation_samples(secure, listener)
    try:
        decision = action()
    finally:
        audit_log.removeHandler(handler)
        audit_log.setLevel(old_level)
    after = _operation_samples(secure, listener)
    delta = {
        key: value - before.get(key, 0.0)
        for key, value in after.items()
        if value != before.get(key, 0.0) and key[0] != "authenticate"
    }
    lines = [_normalised(line, listener) for line in handler.lines]
    for line in handler.lines:
        assert line["listener"] == listener
    return Observed(decision, lines, delta)


def _batch(value: bytes) -> bytes:
    builder = BatchBuilder()
    builder.append(1_700_000_000_000, None, value)
    return builder.build()


def _either(name: str) -> str:
    """A name with either listener's part as ``L`` (each side sees both sides' groups)."""
    return name.replace("grpc", "L").replace("kafka", "L")


RECORDS = _batch(b"the same bytes through both listeners")


class _Grpc:
    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def _code(self, method: str, request: Any) -> tuple[str, Any]:
        stub = getattr(self.transport.stub, method)
        try:
            return "OK", self.transport.call(stub, request, what=method)
        except TidelogError as exc:
            return exc.code, None

    def create_topic(self, name: str) -> list[str]:
        return [self._code("CreateTopic", pb.CreateTopicRequest(name=name, partitions=1))[0]]

    def delete_topic(self, name: str) -> list[str]:
        return [self._code("DeleteTopic", pb.DeleteTopicRequest(name=name))[0]]

    def create_assigned(self, name: str, lists: list[list[int]]) -> list[str]:
        assignment = [pb.ReplicaList(brokers=r) for r in lists]
        request = pb.CreateTopicRequest(name=name, replica_assignment=assignment)
        return [self._code("CreateTopic", request)[0]]

    def grow_assigned(self, name: str, count: int, lists: list[list[int]]) -> list[str]:
        topic = pb.CreatePartitionsTopic(
            name=name, count=count, replica_assignment=[pb.ReplicaList(brokers=r) for r in lists]
        )
        code, answer = self._code("CreatePartitions", pb.CreatePartitionsRequest(topics=[topic]))
        # The topic's answer: the call's refusal, or its result's.
        return [r.error_code or "OK" for r in answer.results] if answer else [code]

    def produce(self, name: str) -> list[str]:
        request = pb.ProduceRequest(
            acks=-1,
            timeout_ms=5_000,
            topics=[
                pb.ProduceTopicData(
                    topic=name, partitions=[pb.ProducePartitionData(partition=0, records=RECORDS)]
                )
            ],
        )
        code, answer = self._code("Produce", request)
        return [code, *(r.error_code or "OK" for r in answer.results)]

    def fetch(self, name: str) -> list[str]:
        request = pb.FetchRequest(
            max_wait_ms=0,
            min_bytes=1,
            partitions=[pb.FetchPartition(topic=name, partition=0, fetch_offset=0)],
        )
        code, answer = self._code("Fetch", request)
        return [code, *(r.error_code or "OK" for r in answer.results)]

    def metadata(self, name: str) -> list[str]:
        code, answer = self._code("Metadata", pb.MetadataRequest(topics=[name]))
        return [code, *(t.error_code or "OK" for t in answer.topics)]

    def commit(self, group: str, name: str) -> list[str]:
        request = pb.OffsetCommitRequest(
            group_id=group, offsets=[pb.CommittedOffset(topic=name, partition=0, offset=1)]
        )
        code, answer = self._code("OffsetCommit", request)
        return [code, *(r.error_code or "OK" for r in answer.results)]

    def describe_log_dirs(self) -> list[str]:
        return [self._code("DescribeLogDirs", pb.DescribeLogDirsRequest())[0]]

    def write_txn_markers(self, name: str) -> list[str]:
        entry = pb.TxnMarkerEntry(
            producer_id=1,
            producer_epoch=0,
            commit=False,
            coordinator_epoch=0,
            partitions=[pb.TxnMarkerPartition(topic=name, partition=0)],
        )
        request = pb.WriteTxnMarkersRequest(markers=[entry], broker_id=7)
        code, answer = self._code("WriteTxnMarkers", request)
        if answer is None:
            return [code]
        return [p.error_code or "OK" for m in answer.markers for p in m.partitions]

    def alter_reassignments(self, name: str) -> list[str]:
        target = pb.ReassignmentTarget(topic=name, partition=0, cancel=True)
        request = pb.AlterPartitionReassignmentsRequest(partitions=[target])
        return [self._code("AlterPartitionReassignments", request)[0]]

    def list_reassignments(self) -> list[str]:
        request = pb.ListPartitionReassignmentsRequest()
        return [self._code("ListPartitionReassignments", request)[0]]

    def describe_producers(self, name: str) -> list[str]:
        request = pb.DescribeProducersRequest(
            partitions=[pb.TopicPartitions(topic=name, partitions=[0])]
        )
        code, answer = self._code("DescribeProducers", request)
        return [code, *(p.error_code or "OK" for p in answer.partitions)] if answer else [code]

    def delete_records(self, name: str) -> list[str]:
        request = pb.DeleteRecordsRequest(
            partitions=[pb.DeleteRecordsPartition(topic=name, partition=0, offset=0)]
        )
        code, answer = self._code("DeleteRecords", request)
        return [code, *(r.error_code or "OK" for r in answer.results)] if answer else [code]

    def list_groups(self) -> list[str]:
        code, answer = self._code("ListGroups", pb.ListGroupsRequest())
        return [code, *sorted(_either(g.group_id) for g in answer.groups)]

    def describe_group(self, group: str) -> list[str]:
        return [self._code("DescribeGroup", pb.DescribeGroupRequest(group_id=group))[0]]


class _Kafka:
    def __init__(self, session: _KafkaSession) -> None:
        self.session = session

    def create_topic(self, name: str) -> list[str]:
        request = CreateTopicsRequest[5](
            topics=[
                CreateTopicsRequest[5].CreatableTopic(
                    name=name, num_partitions=1, replication_factor=-1, assignments=[], configs=[]
                )
            ],
            timeout_ms=10_000,
            validate_only=False,
        )
        answer = self.session.call(request, CreateTopicsResponse)
        return [error_name(t.error_code) for t in answer.topics]

    def create_assigned(self, name: str, lists: list[list[int]]) -> list[str]:
        topic = CreateTopicsRequest[5].CreatableTopic
        request = CreateTopicsRequest[5](
            topics=[
                topic(
                    name=name,
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments=[
                        topic.CreatableReplicaAssignment(partition_index=p, broker_ids=r)
                        for p, r in enumerate(lists)
                    ],
                    configs=[],
                )
            ],
            timeout_ms=10_000,
            validate_only=False,
        )
        answer = self.session.call(request, CreateTopicsResponse)
        return [error_name(t.error_code) for t in answer.topics]

    def grow_assigned(self, name: str, count: int, lists: list[list[int]]) -> list[str]:
        topic = CreatePartitionsRequest[1].CreatePartitionsTopic
        request = CreatePartitionsRequest[1](
            topics=[
                topic(
                    name=name,
                    count=count,
                    assignments=[topic.CreatePartitionsAssignment(broker_ids=r) for r in lists],
                )
            ],
            timeout_ms=10_000,
            validate_only=False,
        )
        answer = self.session.call(request, CreatePartitionsResponse)
        return [error_name(r.error_code) for r in answer.results]

    def delete_topic(self, name: str) -> list[str]:
        request = DeleteTopicsRequest[4](topic_names=[name], timeout_ms=10_000)
        answer = self.session.call(request, DeleteTopicsResponse)
        return [error_name(r.error_code) for r in answer.responses]

    def produce(self, name: str) -> list[str]:
        from kafka.protocol.producer import ProduceRequest

        request = ProduceRequest[7](
            acks=-1,
            timeout_ms=5_000,
            topic_data=[
                ProduceRequest.TopicProduceData(
                    name=name,
                    partition_data=[
                        ProduceRequest.TopicProduceData.PartitionProduceData(
                            index=0, records=RECORDS
                        )
                    ],
                )
            ],
        )
        answer = self.session.call(request, ProduceResponse)
        return [
            "OK",
            *(error_name(p.error_code) for t in answer.responses for p in t.partition_responses),
        ]

    def fetch(self, name: str) -> list[str]:
        answer = self.session.call(fetch_request(name), FetchResponse)
        return [
            error_name(answer.error_code),
            *(error_name(p.error_code) for t in answer.responses for p in t.partitions),
        ]

    def metadata(self, name: str) -> list[str]:
        request = MetadataRequest[9](
            topics=[MetadataRequest[9].MetadataRequestTopic(name=name)],
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        answer = self.session.call(request, MetadataResponse)
        return ["OK", *(error_name(t.error_code) for t in answer.topics)]

    def commit(self, group: str, name: str) -> list[str]:
        answer = self.session.call(
            offset_commit_request(group, name, {0: (1, -1)}), OffsetCommitResponse
        )
        return ["OK", *(error_name(p.error_code) for t in answer.topics for p in t.partitions)]

    def describe_log_dirs(self) -> list[str]:
        answer = self.session.call(DescribeLogDirsRequest[4](topics=None), DescribeLogDirsResponse)
        return [error_name(answer.error_code), *(error_name(r.error_code) for r in answer.results)]

    def write_txn_markers(self, name: str) -> list[str]:
        marker = WriteTxnMarkersRequest[1].WritableTxnMarker
        request = WriteTxnMarkersRequest[1](
            markers=[
                marker(
                    producer_id=1,
                    producer_epoch=0,
                    transaction_result=False,
                    topics=[marker.WritableTxnMarkerTopic(name=name, partition_indexes=[0])],
                    coordinator_epoch=0,
                )
            ]
        )
        answer = self.session.call(request, WriteTxnMarkersResponse)
        return [
            error_name(p.error_code) for m in answer.markers for t in m.topics for p in t.partitions
        ]

    def alter_reassignments(self, name: str) -> list[str]:
        topic = AlterPartitionReassignmentsRequest[0].ReassignableTopic
        request = AlterPartitionReassignmentsRequest[0](
            timeout_ms=10_000,
            topics=[topic(name=name, partitions=[topic.ReassignablePartition(partition_index=0)])],
        )
        answer = self.session.call(request, AlterPartitionReassignmentsResponse)
        return [error_name(answer.error_code)]

    def list_reassignments(self) -> list[str]:
        request = ListPartitionReassignmentsRequest[0](timeout_ms=10_000, topics=None)
        answer = self.session.call(request, ListPartitionReassignmentsResponse)
        return [error_name(answer.error_code)]

    def describe_producers(self, name: str) -> list[str]:
        request = DescribeProducersRequest[0](
            topics=[DescribeProducersRequest[0].TopicRequest(name=name, partition_indexes=[0])]
        )
        answer = self.session.call(request, DescribeProducersResponse)
        return ["OK", *(error_name(p.error_code) for t in answer.topics for p in t.partitions)]

    def delete_records(self, name: str) -> list[str]:
        entry = DeleteRecordsRequest[0].DeleteRecordsTopic
        request = DeleteRecordsRequest[0](
            topics=[
                entry(
                    name=name,
                    partitions=[entry.DeleteRecordsPartition(partition_index=0, offset=0)],
                )
            ],
            timeout_ms=5_000,
        )
        answer = self.session.call(request, DeleteRecordsResponse)
        return ["OK", *(error_name(p.error_code) for t in answer.topics for p in t.partitions)]

    def list_groups(self) -> list[str]:
        answer = self.session.call(ListGroupsRequest[4](states_filter=[]), ListGroupsResponse)
        return [
            error_name(answer.error_code),
            *sorted(_either(g.group_id) for g in answer.groups),
        ]

    def describe_group(self, group: str) -> list[str]:
        request = DescribeGroupsRequest[5](groups=[group], include_authorized_operations=False)
        answer = self.session.call(request, DescribeGroupsResponse)
        return [error_name(g.error_code) for g in answer.groups]


# The call on a listener's driver given the listener's name (the scenario tables').
_Action = Callable[[Any, str], list[str]]


# One scenario step: its name, the call through the gRPC listener and through the Kafka
# listener, each side's expected decision, how many audit lines each leaves, and the
# (operation, code) request-metric sample each counts.
TraceStep = tuple[str, Any, Any, tuple[list[str], list[str]], int, tuple[Any, Any]]


def check_steps(secure: Secure, steps: list[TraceStep]) -> None:
    """Run every step through both listeners; assert each decided, audited and counted as
    expected, and that both wrote the same audit lines (all failures reported at once)."""
    failures = []
    for name, on_grpc, on_kafka, decisions, audit_lines, counted in steps:
        seen = {
            "grpc": _observe(secure, "grpc", on_grpc),
            "kafka": _observe(secure, "kafka", on_kafka),
        }
        for index, listener in enumerate(LISTENERS):
            observed = seen[listener]
            if observed.decision != decisions[index]:
                failures.append(f"{name}: {listener} decided {observed.decision}")
            if len(observed.audit) != audit_lines:
                failures.append(f"{name}: {listener} audited {observed.audit}")
            if observed.metrics != {counted[index]: 1.0}:
                failures.append(f"{name}: {listener} counted {observed.metrics}")
        if seen["grpc"].audit != seen["kafka"].audit:
            failures.append(
                f"{name}: audit lines differ: {seen['grpc'].audit} != {seen['kafka'].audit}"
            )
    assert not failures, "\n".join(failures)
