"""One request pipeline for every listener (issue #26): the operation tables cover every
API either listener serves, and the same operation done through the gRPC listener and
the Kafka listener of one broker (TLS, SCRAM, the authorizer on) gives the same
authorization decision, the same audit lines (normalised for the listener), the same
request-metric samples and the same quota accounting.

The Kafka side speaks the wire protocol on a raw TLS socket (SCRAM-SHA-256 done here),
so that no client library adds requests of its own; the gRPC side uses the client's
``Transport`` (one Authenticate call, then exactly the calls made here).
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
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
from tidelog.broker.core.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from tidelog.broker.core.audit import AUDIT_LOGGER_NAME
from tidelog.broker.core.operations import (
    GRPC_METHOD_OPERATIONS,
    KAFKA_API_VARIANTS,
    KAFKA_APIS,
    OPERATIONS,
)
from tidelog.broker.core.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, QuotaEntity
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.grpc.authorize import _RESOURCES
from tidelog.broker.kafka.errors import error_name
from tidelog.broker.kafka.handlers import HANDLERS
from tidelog.broker.kafka.versions import ADVERTISED
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki
from tidelog.client.security import ClientSecurity
from tidelog.client.transport import Transport
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import TidelogError
from tidelog.storage.records import BatchBuilder

pytestmark = pytest.mark.timeout(120)


# kafka-python ships WriteTxnMarkers' schema but no classes for it (a broker-only API).
class WriteTxnMarkersRequest(ApiMessage):
    pass


class WriteTxnMarkersResponse(ApiMessage):
    pass


LISTENERS = ("grpc", "kafka")
USER = "alice"
PASSWORD = "alice-secret"
MECHANISM = "SCRAM-SHA-256"


# --- the tables cover every API ------------------------------------------------------


def test_every_advertised_kafka_api_has_an_operation_and_a_policy() -> None:
    assert set(KAFKA_APIS) == set(ADVERTISED), "an advertised api key without an operation"
    assert set(HANDLERS) <= set(KAFKA_APIS)
    for key, (_, operation) in KAFKA_APIS.items():
        assert operation in OPERATIONS, f"api {key}: {operation} has no policy entry"


def test_every_grpc_method_has_an_operation_a_policy_and_its_resources() -> None:
    methods = set(pb.DESCRIPTOR.services_by_name["Broker"].methods_by_name)
    assert set(GRPC_METHOD_OPERATIONS) == methods, "a gRPC method without an operation"
    assert set(_RESOURCES) == methods, "a gRPC method without its resources"
    for method, operation in GRPC_METHOD_OPERATIONS.items():
        assert operation in OPERATIONS, f"{method}: {operation} has no policy entry"


def test_every_operation_is_reached_from_some_listener() -> None:
    reached = (
        set(GRPC_METHOD_OPERATIONS.values())
        | {op for _, op in KAFKA_APIS.values()}
        | {op for op, key in KAFKA_API_VARIANTS.items() if key in KAFKA_APIS}
    )
    assert reached == set(OPERATIONS)


def test_no_authorization_decision_is_written_outside_the_policy_table() -> None:
    """An ACL check written inline in a handler means the pipeline was bypassed (STYLE.md):
    only ``broker.core.operations`` asks the ACLs (``Acls.allowed``, ``allowed_any``,
    ``check``) or writes an ``authorization_denied`` audit line."""
    broker = Path(__file__).resolve().parents[2] / "broker"
    allowed_here = {broker / "core" / "operations.py", broker / "core" / "acl_store.py"}
    offenders = []
    for path in sorted(broker.rglob("*.py")):
        if path in allowed_here:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            inline_check = (
                isinstance(node, ast.Attribute)
                and node.attr in ("allowed", "allowed_any", "check")
                and ast.unparse(node.value).endswith("acls")
            )
            denial = isinstance(node, ast.Constant) and node.value == "authorization_denied"
            if inline_check or denial:
                offenders.append(f"{path.relative_to(broker.parent)}:{getattr(node, 'lineno', 0)}")
    assert not offenders, f"authorization decided outside broker.core.operations: {offenders}"


# --- the same operations through both listeners --------------------------------------


@dataclass(frozen=True)
class Secure:
    broker: InProcessBroker
    pki: TestPki


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    root = tmp_path_factory.mktemp("parity")
    pki = TestPki.create(root / "pki")
    data = root / "data"
    data.mkdir()
    users = FileUserStore.open(data)
    users.upsert(USER, credential_from_password(MECHANISM, PASSWORD))
    settings = {
        **pki.broker_settings("SASL_SSL"),
        "sasl.enabled.mechanisms": MECHANISM,
        "authorizer.enabled": "true",
        "kafka.listen": "127.0.0.1:0",
    }
    with InProcessBroker(data, settings=settings) as broker:
        core = broker.server.core

        def allow(operation: Operation, kind: ResourceType, name: str) -> None:
            core.acls.create(
                [
                    AclBinding(
                        f"User:{USER}",
                        "*",
                        operation,
                        Permission.ALLOW,
                        kind,
                        name,
                        PatternType.PREFIXED,
                    )
                ]
            )

        # alice may do everything on "ok-" topics and groups, but has no cluster ACL (a
        # CreateTopics allowed by the topic alone); "ro-" topics she may only read.
        for operation in (
            Operation.WRITE,
            Operation.READ,
            Operation.DESCRIBE,
            Operation.CREATE,
            Operation.DELETE,
        ):
            allow(operation, ResourceType.TOPIC, "ok-")
        allow(Operation.READ, ResourceType.TOPIC, "ro-")
        allow(Operation.DESCRIBE, ResourceType.TOPIC, "ro-")
        allow(Operation.READ, ResourceType.GROUP, "ok-")
        allow(Operation.DESCRIBE, ResourceType.GROUP, "ok-")
        # "del-" groups she may delete (DeleteGroups, OffsetDelete), and only that.
        allow(Operation.DELETE, ResourceType.GROUP, "del-")
        # "ok-" transactional ids she may use and describe.
        allow(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, "ok-")
        allow(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, "ok-")
        for listener in LISTENERS:
            core.create_topic(f"ok-{listener}-data", 1, {})
            core.create_topic(f"ro-{listener}", 1, {})
            core.create_topic(f"hidden-{listener}", 1, {})
            # Quotas far above anything here: the meters count, nothing is throttled.
            core.quotas.alter(
                QuotaEntity(USER, f"parity-{listener}"),
                {PRODUCER_BYTE_RATE: 1e15, CONSUMER_BYTE_RATE: 1e15},
                [],
            )
        yield Secure(broker, pki)


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


@pytest.fixture(scope="module")
def both(secure: Secure) -> Iterator[dict[str, Any]]:
    transport = _grpc(secure)
    session = _KafkaSession(secure, "parity-kafka")
    try:
        yield {"grpc": _Grpc(transport), "kafka": _Kafka(session)}
    finally:
        transport.close()
        session.close()


# (name, the call on a listener's driver given the listener's name, expected decision,
# expected audit lines (normalised), the operation and outcome counted)
_Action = Callable[[Any, str], list[str]]
SCENARIOS: list[tuple[str, _Action, list[str], int, tuple[str, str]]] = [
    (
        "create a topic allowed on the topic only (Kafka wrote a false cluster denial)",
        lambda d, lst: d.create_topic(f"ok-{lst}-created"),
        ["OK"],
        0,
        ("create_topics", "OK"),
    ),
    (
        "produce",
        lambda d, lst: d.produce(f"ok-{lst}-data"),
        ["OK", "OK"],
        0,
        ("produce", "OK"),
    ),
    (
        "fetch",
        lambda d, lst: d.fetch(f"ok-{lst}-data"),
        ["OK", "OK"],
        0,
        ("fetch", "OK"),
    ),
    (
        "commit offsets",
        lambda d, lst: d.commit(f"ok-{lst}-group", f"ok-{lst}-data"),
        ["OK", "OK"],
        0,
        ("offset_commit", "OK"),
    ),
    (
        "list groups: the hidden one left out silently",
        lambda d, lst: d.list_groups(),
        ["OK", "ok-L-group", "ok-L-group"],
        0,
        ("list_groups", "OK"),
    ),
    (
        "describe log dirs without DESCRIBE on the cluster",
        lambda d, lst: d.describe_log_dirs(),
        ["CLUSTER_AUTHORIZATION_FAILED"],
        1,
        ("describe_log_dirs", "CLUSTER_AUTHORIZATION_FAILED"),
    ),
    (
        "describe producers",
        lambda d, lst: d.describe_producers(f"ok-{lst}-data"),
        ["OK", "OK"],
        0,
        ("describe_producers", "OK"),
    ),
    (
        "delete records",
        lambda d, lst: d.delete_records(f"ok-{lst}-data"),
        ["OK", "OK"],
        0,
        ("delete_records", "OK"),
    ),
    (
        "describe a group",
        lambda d, lst: d.describe_group(f"ok-{lst}-group"),
        ["OK"],
        0,
        ("describe_groups", "OK"),
    ),
    (
        "delete a topic",
        lambda d, lst: d.delete_topic(f"ok-{lst}-created"),
        ["OK"],
        0,
        ("delete_topics", "OK"),
    ),
    (
        "a refused write",
        lambda d, lst: d.produce(f"ro-{lst}"),
        ["OK", "TOPIC_AUTHORIZATION_FAILED"],
        1,
        ("produce", "OK"),
    ),
    (
        "a refused describe",
        lambda d, lst: d.metadata(f"hidden-{lst}"),
        ["OK", "TOPIC_AUTHORIZATION_FAILED"],
        1,
        ("metadata", "OK"),
    ),
]


def test_the_same_operations_through_both_listeners_leave_the_same_trace(
    secure: Secure, both: dict[str, Any]
) -> None:
    core = secure.broker.server.core
    # A group alice may not describe, on each side (committed with no authorizer in the way).
    from tidelog.broker.groups.assignor import TopicPartition
    from tidelog.broker.groups.manager import OffsetCommitEntry

    for listener in LISTENERS:
        core.commit_offsets(
            f"hidden-{listener}-group",
            "",
            -1,
            [OffsetCommitEntry(TopicPartition(f"hidden-{listener}", 0), 0, "", -1)],
        )
    failures = []
    for name, action, decision, audit_lines, counted in SCENARIOS:
        seen = {
            listener: _observe(
                secure, listener, functools.partial(action, both[listener], listener)
            )
            for listener in LISTENERS
        }
        grpc, kafka = seen["grpc"], seen["kafka"]
        for listener, observed in seen.items():
            if observed.decision != decision:
                failures.append(f"{name}: {listener} decided {observed.decision}")
            if len(observed.audit) != audit_lines:
                failures.append(f"{name}: {listener} audited {observed.audit}")
            if observed.metrics != {counted: 1.0}:
                failures.append(f"{name}: {listener} counted {observed.metrics}")
        if grpc.audit != kafka.audit:
            failures.append(f"{name}: audit lines differ: {grpc.audit} != {kafka.audit}")
    assert not failures, "\n".join(failures)
    # The same bytes metered against the same quotas, per listener's client id.
    quotas = core.quotas
    for quota in (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE):
        metered = {lst: quotas.metered(USER, f"parity-{lst}", quota) for lst in LISTENERS}
        assert metered["grpc"] == metered["kafka"] > 0, (quota, metered)


def test_offset_fetch_refuses_named_topics_and_hides_the_rest_on_both_listeners(
    secure: Secure, both: dict[str, Any]
) -> None:
    """OffsetFetch, as Kafka: a named topic the caller may not describe is refused (one
    audit line); every committed partition leaves such topics out silently. (The Kafka
    listener used to answer both; gRPC refuses the named one with the whole call, Kafka
    per partition: the decision and the audit line agree.)"""
    from kafka.protocol.consumer import OffsetFetchRequest, OffsetFetchResponse

    from tidelog.broker.groups.assignor import TopicPartition
    from tidelog.broker.groups.manager import OffsetCommitEntry

    core = secure.broker.server.core
    for listener in LISTENERS:
        core.commit_offsets(
            f"ok-{listener}-mixed",
            "",
            -1,
            [
                OffsetCommitEntry(TopicPartition(f"ok-{listener}-data", 0), 1, "", -1),
                OffsetCommitEntry(TopicPartition(f"hidden-{listener}", 0), 1, "", -1),
            ],
        )
    grpc: _Grpc = both["grpc"]
    kafka: _Kafka = both["kafka"]

    def grpc_named() -> list[str]:
        request = pb.OffsetFetchRequest(
            group_id="ok-grpc-mixed",
            partitions=[pb.TopicPartitions(topic="hidden-grpc", partitions=[0])],
        )
        return [grpc._code("OffsetFetch", request)[0]]

    def kafka_named() -> list[str]:
        request = OffsetFetchRequest[7](
            group_id="ok-kafka-mixed",
            topics=[
                OffsetFetchRequest[7].OffsetFetchRequestTopic(
                    name="hidden-kafka", partition_indexes=[0]
                )
            ],
            require_stable=False,
        )
        answer = kafka.session.call(request, OffsetFetchResponse)
        return [error_name(p.error_code) for t in answer.topics for p in t.partitions]

    named = {
        "grpc": _observe(secure, "grpc", grpc_named),
        "kafka": _observe(secure, "kafka", kafka_named),
    }
    for observed in named.values():
        assert observed.decision == ["TOPIC_AUTHORIZATION_FAILED"]
        assert len(observed.audit) == 1
    assert named["grpc"].audit == named["kafka"].audit

    def grpc_all() -> list[str]:
        code, answer = grpc._code("OffsetFetch", pb.OffsetFetchRequest(group_id="ok-grpc-mixed"))
        return [code, *sorted(_either(o.topic) for o in answer.offsets)]

    def kafka_all() -> list[str]:
        request = OffsetFetchRequest[7](
            group_id="ok-kafka-mixed", topics=None, require_stable=False
        )
        answer = kafka.session.call(request, OffsetFetchResponse)
        return [error_name(answer.error_code), *sorted(_either(t.name) for t in answer.topics)]

    listing = {
        "grpc": _observe(secure, "grpc", grpc_all),
        "kafka": _observe(secure, "kafka", kafka_all),
    }
    for observed in listing.values():
        assert observed.decision == ["OK", "ok-L-data"]
        assert observed.audit == []
        assert observed.metrics == {("offset_fetch", "OK"): 1.0}


def test_kafka_leave_group_needs_read_on_the_group(secure: Secure, both: dict[str, Any]) -> None:
    """LeaveGroup, as Kafka: READ on the group first (the policy table's rule; the handler
    did not ask it, and a member of another principal's group could be removed). Refused
    once, audited once; an allowed group gets past the check (no such member there)."""
    from kafka.protocol.consumer import LeaveGroupRequest, LeaveGroupResponse

    kafka: _Kafka = both["kafka"]

    def leave(group_id: str) -> list[str]:
        request = LeaveGroupRequest[1](group_id=group_id, member_id="someone")
        return [error_name(kafka.session.call(request, LeaveGroupResponse).error_code)]

    refused = _observe(secure, "kafka", lambda: leave("hidden-leave"))
    assert refused.decision == ["GROUP_AUTHORIZATION_FAILED"]
    assert [line["operation"] for line in refused.audit] == ["READ"]
    allowed = _observe(secure, "kafka", lambda: leave("ok-leave"))
    assert allowed.decision == ["UNKNOWN_MEMBER_ID"]
    assert allowed.audit == []


def test_describe_producers_needs_read_on_the_topic(both: dict[str, Any]) -> None:
    """Kafka answers the refusal per partition, gRPC refuses the call (its resources are
    authorized as a whole, as every gRPC method's)."""
    assert both["kafka"].describe_producers("hidden-kafka") == ["OK", "TOPIC_AUTHORIZATION_FAILED"]
    assert both["grpc"].describe_producers("hidden-grpc") == ["TOPIC_AUTHORIZATION_FAILED"]


READ, WRITE, CREATE, DELETE, DESCRIBE = 3, 4, 5, 6, 8  # Kafka's AclOperation codes


def test_authorized_operations_follow_the_acls(secure: Secure, both: dict[str, Any]) -> None:
    """KIP-430 with the authorizer on: what alice's ACLs allow on each topic, none on the
    cluster (no cluster ACL), no audit line (they are not requests to do anything)."""
    session = both["kafka"].session
    request = MetadataRequest[9](
        topics=[
            MetadataRequest[9].MetadataRequestTopic(name=name)
            for name in ("ok-kafka-data", "ro-kafka", "hidden-kafka")
        ],
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=True,
        include_topic_authorized_operations=True,
    )
    answer = session.call(request, MetadataResponse)
    by_name = {t.name: (t.error_code, t.authorized_operations) for t in answer.topics}
    # kafka-python decodes the bit field as the set of Kafka's AclOperation codes.
    assert by_name["ok-kafka-data"] == (0, {READ, WRITE, CREATE, DELETE, DESCRIBE})
    assert by_name["ro-kafka"] == (0, {READ, DESCRIBE})
    assert by_name["hidden-kafka"] == (29, None)  # refused: Kafka's "unknown" (INT32_MIN)
    assert answer.authorized_operations == set()  # asked for, and none allowed

    both["kafka"].commit("ok-kafka-ops-group", "ok-kafka-data")  # the group exists
    described = session.call(
        DescribeGroupsRequest[5](groups=["ok-kafka-ops-group"], include_authorized_operations=True),
        DescribeGroupsResponse,
    )
    (group,) = described.groups
    assert (group.error_code, group.authorized_operations) == (0, {READ, DESCRIBE})


def test_group_deletion_needs_delete_on_the_group_and_read_on_each_topic(
    secure: Secure, both: dict[str, Any]
) -> None:
    """DeleteGroups and OffsetDelete, as Kafka's ``KafkaApis``: DELETE on each group
    (DeleteGroups answers per group; OffsetDelete refuses the whole request), then
    OffsetDelete asks READ on each topic and refuses a topic per partition. gRPC's
    OffsetDelete refuses as a whole, with the same decisions and audit lines."""
    from kafka.protocol.admin import DeleteGroupsRequest, DeleteGroupsResponse
    from kafka.protocol.consumer import OffsetDeleteRequest, OffsetDeleteResponse

    from tidelog.broker.groups.assignor import TopicPartition
    from tidelog.broker.groups.manager import OffsetCommitEntry

    core = secure.broker.server.core
    kafka: _Kafka = both["kafka"]
    grpc: _Grpc = both["grpc"]
    for group in ("del-kafka-g", "del-grpc-g", "ok-kafka-nodelete"):
        core.commit_offsets(
            group,
            "",
            -1,
            [
                OffsetCommitEntry(TopicPartition("ok-kafka-data", 0), 1),
                OffsetCommitEntry(TopicPartition("hidden-kafka", 0), 1),
            ],
        )

    def delete_groups(*groups: str) -> list[str]:
        request = DeleteGroupsRequest[2](groups_names=list(groups))
        answer = kafka.session.call(request, DeleteGroupsResponse)
        return [error_name(r.error_code) for r in answer.results]

    def offset_delete(group: str, *topics: str) -> list[str]:
        request = OffsetDeleteRequest[0](
            group_id=group,
            topics=[
                OffsetDeleteRequest.OffsetDeleteRequestTopic(
                    name=name,
                    partitions=[
                        OffsetDeleteRequest.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(
                            partition_index=0
                        )
                    ],
                )
                for name in topics
            ],
        )
        answer = kafka.session.call(request, OffsetDeleteResponse)
        return [
            error_name(answer.error_code),
            *(error_name(p.error_code) for t in answer.topics for p in t.partitions),
        ]

    refused = _observe(
        secure, "kafka", lambda: delete_groups("ok-kafka-nodelete", "del-kafka-unknown")
    )
    assert refused.decision == ["GROUP_AUTHORIZATION_FAILED", "GROUP_ID_NOT_FOUND"]
    assert [(a["operation"], a["resource_name"]) for a in refused.audit] == [
        ("DELETE", "ok-L-nodelete")
    ]
    refused = _observe(secure, "kafka", lambda: offset_delete("ok-kafka-nodelete", "ok-kafka-data"))
    assert refused.decision == ["GROUP_AUTHORIZATION_FAILED"]
    assert [a["operation"] for a in refused.audit] == ["DELETE"]
    partly = _observe(
        secure, "kafka", lambda: offset_delete("del-kafka-g", "ok-kafka-data", "hidden-kafka")
    )
    assert partly.decision == ["OK", "OK", "TOPIC_AUTHORIZATION_FAILED"]
    assert [(a["operation"], a["resource_name"]) for a in partly.audit] == [("READ", "hidden-L")]
    committed = core.fetch_offsets("del-kafka-g", None)
    assert [(r.tp.topic, r.offset) for r in committed] == [("hidden-kafka", 1)]
    assert core.fetch_offsets("ok-kafka-nodelete", None)[0].offset == 1  # untouched

    def grpc_offset_delete(group: str, *topics: str) -> list[str]:
        request = pb.OffsetDeleteRequest(
            group_id=group, partitions=[pb.TopicPartitions(topic=t, partitions=[0]) for t in topics]
        )
        code, answer = grpc._code("OffsetDelete", request)
        return [code, *(r.error_code or "OK" for r in (answer.results if answer else []))]

    whole = _observe(secure, "grpc", lambda: grpc_offset_delete("del-grpc-g", "hidden-kafka"))
    assert whole.decision == ["TOPIC_AUTHORIZATION_FAILED"]
    assert [a["operation"] for a in whole.audit] == ["READ"]
    whole = _observe(
        secure, "grpc", lambda: grpc_offset_delete("ok-kafka-nodelete", "ok-kafka-data")
    )
    assert whole.decision == ["GROUP_AUTHORIZATION_FAILED"]
    allowed = _observe(secure, "grpc", lambda: grpc_offset_delete("del-grpc-g", "ok-kafka-data"))
    assert allowed.decision == ["OK", "OK"]
    assert allowed.audit == []
    assert [r.tp.topic for r in core.fetch_offsets("del-grpc-g", None)] == ["hidden-kafka"]


def test_batched_find_coordinator_refuses_each_key_on_its_own(
    secure: Secure, both: dict[str, Any]
) -> None:
    """FindCoordinator v4 (KIP-699): one answer per key in request order; a group the
    caller may not describe is refused alone (one audit line), the others answered."""
    from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

    kafka: _Kafka = both["kafka"]

    def find(*keys: str, key_type: int = 0) -> list[str]:
        request = FindCoordinatorRequest[4](key_type=key_type, coordinator_keys=list(keys))
        answer = kafka.session.call(request, FindCoordinatorResponse)
        assert [c.key for c in answer.coordinators] == list(keys)
        port = secure.broker.server.kafka_port
        return [
            f"{error_name(c.error_code)}:{c.node_id}:{c.port == port}" for c in answer.coordinators
        ]

    observed = _observe(secure, "kafka", lambda: find("ok-a", "hidden-b", "ok-c"))
    assert observed.decision == [
        "OK:0:True",
        "GROUP_AUTHORIZATION_FAILED:-1:False",
        "OK:0:True",
    ]
    assert [(a["operation"], a["resource_name"]) for a in observed.audit] == [
        ("DESCRIBE", "hidden-b")
    ]
    assert find("tx", key_type=1) == ["TRANSACTIONAL_ID_AUTHORIZATION_FAILED:-1:False"]


def test_delete_records_needs_delete_on_the_topic(secure: Secure, both: dict[str, Any]) -> None:
    """Kafka answers the refusal per partition, gRPC refuses the call; one audit line
    each, the same decision logged."""
    kafka = _observe(secure, "kafka", lambda: both["kafka"].delete_records("hidden-kafka"))
    assert kafka.decision == ["OK", "TOPIC_AUTHORIZATION_FAILED"]
    grpc = _observe(secure, "grpc", lambda: both["grpc"].delete_records("hidden-grpc"))
    assert grpc.decision == ["TOPIC_AUTHORIZATION_FAILED"]
    assert kafka.audit == grpc.audit
    assert len(kafka.audit) == 1


def test_configs_need_alter_configs_and_describe_configs(
    secure: Secure, both: dict[str, Any]
) -> None:
    """IncrementalAlterConfigs / DescribeConfigs (#27) on both listeners: ALTER_CONFIGS
    or DESCRIBE_CONFIGS on the topic, or on the cluster for a broker; each refusal audited
    once. Kafka answers per resource, gRPC refuses the call."""
    from kafka.protocol.admin import (
        DescribeConfigsRequest,
        DescribeConfigsResponse,
        IncrementalAlterConfigsRequest,
        IncrementalAlterConfigsResponse,
    )

    core = secure.broker.server.core
    for operation in (Operation.ALTER_CONFIGS, Operation.DESCRIBE_CONFIGS):
        core.acls.create(
            [
                AclBinding(
                    f"User:{USER}", "*", operation, Permission.ALLOW, ResourceType.TOPIC,
                    "cfg-", PatternType.PREFIXED,
                )
            ]
        )  # fmt: skip
    for listener in LISTENERS:
        core.create_topic(f"cfg-{listener}", 1, {})
    kafka: _Kafka = both["kafka"]
    grpc: _Grpc = both["grpc"]
    alter_class = IncrementalAlterConfigsRequest[1]

    def kafka_alter(kind: int, name: str) -> list[str]:
        request = alter_class(
            resources=[
                alter_class.AlterConfigsResource(
                    resource_type=kind,
                    resource_name=name,
                    configs=[
                        alter_class.AlterConfigsResource.AlterableConfig(
                            name="retention.ms" if kind == 2 else "log.retention.ms",
                            config_operation=0,
                            value="60000",
                        )
                    ],
                )
            ],
            validate_only=False,
        )
        answer = kafka.session.call(request, IncrementalAlterConfigsResponse)
        return [error_name(r.error_code) for r in answer.responses]

    def kafka_describe(kind: int, name: str) -> list[str]:
        describe_class = DescribeConfigsRequest[2]
        request = describe_class(
            resources=[
                describe_class.DescribeConfigsResource(
                    resource_type=kind, resource_name=name, configuration_keys=None
                )
            ],
            include_synonyms=True,
        )
        answer = kafka.session.call(request, DescribeConfigsResponse)
        return [error_name(r.error_code) for r in answer.results]

    def grpc_alter(kind: int, name: str) -> list[str]:
        request = pb.IncrementalAlterConfigsRequest(
            resource=pb.ConfigResource(type=kind, name=name),  # type: ignore[arg-type]
            alterations=[
                pb.ConfigAlteration(
                    name="retention.ms" if kind == 2 else "log.retention.ms", value="60000"
                )
            ],
        )
        return [grpc._code("IncrementalAlterConfigs", request)[0]]

    def grpc_describe(kind: int, name: str) -> list[str]:
        request = pb.DescribeConfigsRequest(resource=pb.ConfigResource(type=kind, name=name))  # type: ignore[arg-type]
        return [grpc._code("DescribeConfigs", request)[0]]

    calls = {"grpc": (grpc_alter, grpc_describe), "kafka": (kafka_alter, kafka_describe)}
    for listener, (alter, describe) in calls.items():
        allowed = _observe(secure, listener, lambda: alter(2, f"cfg-{listener}"))  # noqa: B023
        assert (allowed.decision, allowed.audit) == (["OK"], [])
        assert core.logs.get_log(f"cfg-{listener}", 0).config.retention_ms == 60_000
        assert describe(2, f"cfg-{listener}") == ["OK"]
        refused = _observe(secure, listener, lambda: alter(2, f"ro-{listener}"))  # noqa: B023
        assert refused.decision == ["TOPIC_AUTHORIZATION_FAILED"], listener
        assert [line["operation"] for line in refused.audit] == ["ALTER_CONFIGS"]
        refused = _observe(secure, listener, lambda: describe(2, f"ro-{listener}"))  # noqa: B023
        assert refused.decision == ["TOPIC_AUTHORIZATION_FAILED"], listener
        assert [line["operation"] for line in refused.audit] == ["DESCRIBE_CONFIGS"]
        refused = _observe(secure, listener, lambda: alter(4, ""))  # noqa: B023
        assert refused.decision == ["CLUSTER_AUTHORIZATION_FAILED"], listener
        assert [line["operation"] for line in refused.audit] == ["ALTER_CONFIGS"]
        assert describe(4, "0") == ["CLUSTER_AUTHORIZATION_FAILED"]


def test_group_configs_need_alter_configs_and_describe_configs_on_the_group(
    secure: Secure, both: dict[str, Any]
) -> None:
    """A GROUP config resource (type 32, Kafka 4.x) on both listeners: ALTER_CONFIGS or
    DESCRIBE_CONFIGS on the group, as Kafka's; each refusal audited once (Kafka answers
    per resource, gRPC refuses the call)."""
    from kafka.protocol.admin import (
        DescribeConfigsRequest,
        DescribeConfigsResponse,
        IncrementalAlterConfigsRequest,
        IncrementalAlterConfigsResponse,
    )

    core = secure.broker.server.core
    shares = core.shares
    assert shares is not None
    for operation in (Operation.ALTER_CONFIGS, Operation.DESCRIBE_CONFIGS):
        core.acls.create(
            [
                AclBinding(
                    f"User:{USER}", "*", operation, Permission.ALLOW, ResourceType.GROUP,
                    "gcfg-", PatternType.PREFIXED,
                )
            ]
        )  # fmt: skip
    kafka: _Kafka = both["kafka"]
    grpc: _Grpc = both["grpc"]
    alter_class = IncrementalAlterConfigsRequest[1]
    describe_class = DescribeConfigsRequest[2]
    key = "share.delivery.count.limit"

    def kafka_alter(name: str) -> list[str]:
        config = alter_class.AlterConfigsResource.AlterableConfig(
            name=key, config_operation=0, value="3"
        )
        request = alter_class(
            resources=[
                alter_class.AlterConfigsResource(
                    resource_type=32, resource_name=name, configs=[config]
                )
            ],
            validate_only=False,
        )
        answer = kafka.session.call(request, IncrementalAlterConfigsResponse)
        return [error_name(r.error_code) for r in answer.responses]

    def kafka_describe(name: str) -> list[str]:
        request = describe_class(
            resources=[
                describe_class.DescribeConfigsResource(
                    resource_type=32, resource_name=name, configuration_keys=None
                )
            ],
            include_synonyms=True,
        )
        answer = kafka.session.call(request, DescribeConfigsResponse)
        return [error_name(r.error_code) for r in answer.results]

    def grpc_alter(name: str) -> list[str]:
        request = pb.IncrementalAlterConfigsRequest(
            resource=pb.ConfigResource(type=pb.CONFIG_RESOURCE_TYPE_GROUP, name=name),
            alterations=[pb.ConfigAlteration(name=key, value="3")],
        )
        return [grpc._code("IncrementalAlterConfigs", request)[0]]

    def grpc_describe(name: str) -> list[str]:
        resource = pb.ConfigResource(type=pb.CONFIG_RESOURCE_TYPE_GROUP, name=name)
        return [grpc._code("DescribeConfigs", pb.DescribeConfigsRequest(resource=resource))[0]]

    calls = {"grpc": (grpc_alter, grpc_describe), "kafka": (kafka_alter, kafka_describe)}
    for listener, (alter, describe) in calls.items():
        allowed = _observe(secure, listener, lambda: alter(f"gcfg-{listener}"))  # noqa: B023
        assert (allowed.decision, allowed.audit) == (["OK"], [])
        assert shares.share_groups.settings(f"gcfg-{listener}").delivery_count_limit == 3
        assert describe(f"gcfg-{listener}") == ["OK"]
        refused = _observe(secure, listener, lambda: alter(f"ro-{listener}"))  # noqa: B023
        assert refused.decision == ["GROUP_AUTHORIZATION_FAILED"], listener
        assert [line["operation"] for line in refused.audit] == ["ALTER_CONFIGS"]
        refused = _observe(secure, listener, lambda: describe(f"ro-{listener}"))  # noqa: B023
        assert refused.decision == ["GROUP_AUTHORIZATION_FAILED"], listener
        assert [line["operation"] for line in refused.audit] == ["DESCRIBE_CONFIGS"]
        assert shares.share_groups.group_configs(f"ro-{listener}") == {}


# Reassignment (issue #27): a test of their own, so that the quota meters the main test
# compares keep their timing (they measure over a live window).
REASSIGNMENT_SCENARIOS: list[tuple[str, _Action, list[str], int, tuple[str, str]]] = [
    (
        "alter partition reassignments without ALTER on the cluster",
        lambda d, lst: d.alter_reassignments(f"ok-{lst}-data"),
        ["CLUSTER_AUTHORIZATION_FAILED"],
        1,
        ("alter_partition_reassignments", "CLUSTER_AUTHORIZATION_FAILED"),
    ),
    (
        "list partition reassignments without DESCRIBE on the cluster",
        lambda d, lst: d.list_reassignments(),
        ["CLUSTER_AUTHORIZATION_FAILED"],
        1,
        ("list_partition_reassignments", "CLUSTER_AUTHORIZATION_FAILED"),
    ),
]


def test_reassignments_are_refused_the_same_way_on_both_listeners(
    secure: Secure, both: dict[str, Any]
) -> None:
    for name, action, decision, audit_lines, counted in REASSIGNMENT_SCENARIOS:
        seen = {
            listener: _observe(
                secure, listener, functools.partial(action, both[listener], listener)
            )
            for listener in LISTENERS
        }
        for listener, observed in seen.items():
            assert observed.decision == decision, (name, listener, observed.decision)
            assert len(observed.audit) == audit_lines, (name, listener, observed.audit)
            assert observed.metrics == {counted: 1.0}, (name, listener, observed.metrics)
        assert seen["grpc"].audit == seen["kafka"].audit, name


# Manual replica assignments (issue #27): the same answers, audit lines and counts on
# both listeners. alice may create "ok-" topics but not ALTER them. A refusal fails a gRPC
# call as a whole (counted with its code), while a Kafka CreateTopics answer carries it per
# topic (counted OK), as ``observe`` says: the count is then per listener.
_Counted = tuple[str, str] | dict[str, tuple[str, str]]
ASSIGNMENT_SCENARIOS: list[tuple[str, _Action, list[str], int, _Counted]] = [
    (
        "create a topic with a manual assignment on this broker",
        lambda d, lst: d.create_assigned(f"ok-{lst}-assigned", [[0], [0]]),
        ["OK"],
        0,
        ("create_topics", "OK"),
    ),
    (
        "a manual assignment naming a broker that is not registered",
        lambda d, lst: d.create_assigned(f"ok-{lst}-unknown-broker", [[3]]),
        ["INVALID_REPLICA_ASSIGNMENT"],
        0,
        {
            "grpc": ("create_topics", "INVALID_REPLICA_ASSIGNMENT"),
            "kafka": ("create_topics", "OK"),
        },
    ),
    (
        "grow with an assignment without ALTER on the topic",
        lambda d, lst: d.grow_assigned(f"ok-{lst}-assigned", 3, [[0]]),
        ["TOPIC_AUTHORIZATION_FAILED"],
        1,
        {
            "grpc": ("create_partitions", "TOPIC_AUTHORIZATION_FAILED"),
            "kafka": ("create_partitions", "OK"),
        },
    ),
]


def test_manual_assignments_answer_the_same_on_both_listeners(
    secure: Secure, both: dict[str, Any]
) -> None:
    for name, action, decision, audit_lines, counted in ASSIGNMENT_SCENARIOS:
        seen = {
            listener: _observe(
                secure, listener, functools.partial(action, both[listener], listener)
            )
            for listener in LISTENERS
        }
        for listener, observed in seen.items():
            expected = counted[listener] if isinstance(counted, dict) else counted
            assert observed.decision == decision, (name, listener, observed.decision)
            assert len(observed.audit) == audit_lines, (name, listener, observed.audit)
            assert observed.metrics == {expected: 1.0}, (name, listener, observed.metrics)
        assert seen["grpc"].audit == seen["kafka"].audit, name
    core = secure.broker.server.core
    for listener in LISTENERS:
        assert [p.replicas for p in core.describe_topic(f"ok-{listener}-assigned").partitions] == [
            (0,),
            (0,),
        ]


def test_a_forwarded_admin_call_is_accepted_only_from_a_broker(
    secure: Secure, both: dict[str, Any]
) -> None:
    """``Envelope`` (KIP-590's idea, ``broker.cluster.forwarding``) is inter-broker only
    (gRPC): the caller needs CLUSTER_ACTION on the cluster, as ``ControlledShutdown``;
    a user with every topic right is refused before the call runs, and audited once."""
    request = pb.EnvelopeRequest(
        call="delete_topic", arguments=b'{"name": "ok-grpc-data"}', broker_id=7
    )
    refused = _observe(secure, "grpc", lambda: [both["grpc"]._code("Envelope", request)[0]])
    assert refused.decision == ["CLUSTER_AUTHORIZATION_FAILED"]
    assert len(refused.audit) == 1


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
    steps: list[tuple[str, Any, Any, tuple[list[str], list[str]], int, tuple[Any, Any]]] = [
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


def test_share_groups_leave_the_same_trace_on_both_listeners(
    secure: Secure, both: dict[str, Any]
) -> None:
    """Share groups (issue #32): gRPC's ShareGroupHeartbeat, ShareFetch, ShareAcknowledge,
    DescribeShareGroup and the Kafka listener's APIs 76-79 (v1, built by the listener's
    codec): the same decisions, audit lines and counted operations. A topic refused in a
    ShareFetch refuses the gRPC call and only that partition on Kafka (as Kafka does)."""
    import uuid

    from tidelog.broker.core.topic_ids import topic_id

    grpc: _Grpc = both["grpc"]
    kafka: _Kafka = both["kafka"]
    members = {lst: str(uuid.uuid4()) for lst in LISTENERS}
    sessions = {"kafka": 0}

    def grpc_join(group: str, name: str) -> list[str]:
        request = pb.ShareGroupHeartbeatRequest(
            group_id=group, member_id=members["grpc"], member_epoch=0, subscribed_topic_names=[name]
        )
        return [grpc._code("ShareGroupHeartbeat", request)[0]]

    def kafka_join(group: str, name: str) -> list[str]:
        answer = kafka.session.call_plain(
            76,
            1,
            {"group_id": group, "member_id": members["kafka"], "member_epoch": 0,
             "subscribed_topic_names": [name]},
        )  # fmt: skip
        return [error_name(answer["error_code"])]

    def grpc_fetch(group: str, name: str) -> list[str]:
        request = pb.ShareFetchRequest(
            group_id=group,
            member_id=members["grpc"],
            partitions=[pb.TopicPartitions(topic=name, partitions=[0])],
        )
        code, answer = grpc._code("ShareFetch", request)
        return [code, *(p.error_code or "OK" for p in answer.partitions)] if answer else [code]

    def kafka_fetch(group: str, name: str) -> list[str]:
        answer = kafka.session.call_plain(
            78,
            1,
            {
                "group_id": group,
                "member_id": members["kafka"],
                "share_session_epoch": sessions["kafka"],
                "max_wait": 0,
                "min_bytes": 1,
                "max_records": 10,
                "batch_size": 10,
                "topics": [
                    {"topic_id": topic_id(name),
                     "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]}
                ],
                "forgotten_topics_data": [],
            },
        )  # fmt: skip
        if answer["error_code"] == 0:
            sessions["kafka"] += 1
        return [
            error_name(answer["error_code"]),
            *(error_name(p["error_code"]) for t in answer["responses"] for p in t["partitions"]),
        ]

    def grpc_ack(group: str, name: str) -> list[str]:
        request = pb.ShareAcknowledgeRequest(
            group_id=group,
            member_id=members["grpc"],
            acknowledgements=[
                pb.ShareAcknowledgement(
                    topic=name, partition=0, first_offset=0, last_offset=0, kind=1
                )
            ],
        )
        code, answer = grpc._code("ShareAcknowledge", request)
        return [code, *(r.error_code or "OK" for r in answer.results)] if answer else [code]

    def kafka_ack(group: str, name: str) -> list[str]:
        batch = {"first_offset": 0, "last_offset": 0, "acknowledge_types": [1]}
        answer = kafka.session.call_plain(
            79,
            1,
            {
                "group_id": group,
                "member_id": members["kafka"],
                "share_session_epoch": sessions["kafka"],
                "topics": [
                    {"topic_id": topic_id(name),
                     "partitions": [{"partition_index": 0, "acknowledgement_batches": [batch]}]}
                ],
            },
        )  # fmt: skip
        if answer["error_code"] == 0:
            sessions["kafka"] += 1
        return [
            error_name(answer["error_code"]),
            *(error_name(p["error_code"]) for t in answer["responses"] for p in t["partitions"]),
        ]

    def grpc_describe(group: str) -> list[str]:
        return [grpc._code("DescribeShareGroup", pb.DescribeShareGroupRequest(group_id=group))[0]]

    def kafka_describe(group: str) -> list[str]:
        answer = kafka.session.call_plain(77, 1, {"group_ids": [group]})
        return [error_name(g["error_code"]) for g in answer["groups"]]

    group_refused, topic_refused = "GROUP_AUTHORIZATION_FAILED", "TOPIC_AUTHORIZATION_FAILED"
    # (what, gRPC's call, Kafka's call, decision (gRPC, Kafka), audit lines, counted
    # operation and outcome (gRPC, Kafka))
    steps: list[tuple[str, Any, Any, tuple[list[str], list[str]], int, tuple[Any, Any]]] = [
        (
            "join a group she may not read",
            lambda: grpc_join("hidden-grpc-share", "ok-grpc-data"),
            lambda: kafka_join("hidden-kafka-share", "ok-kafka-data"),
            ([group_refused], [group_refused]),
            1,
            (("share_group_heartbeat", group_refused), ("share_group_heartbeat", group_refused)),
        ),
        (
            "join subscribing to a topic she may not read",
            lambda: grpc_join("ok-grpc-share", "hidden-grpc"),
            lambda: kafka_join("ok-kafka-share", "hidden-kafka"),
            ([topic_refused], [topic_refused]),
            1,
            (("share_group_heartbeat", topic_refused), ("share_group_heartbeat", topic_refused)),
        ),
        (
            "join",
            lambda: grpc_join("ok-grpc-share", "ok-grpc-data"),
            lambda: kafka_join("ok-kafka-share", "ok-kafka-data"),
            (["OK"], ["OK"]),
            0,
            (("share_group_heartbeat", "OK"), ("share_group_heartbeat", "OK")),
        ),
        (
            "fetch",
            lambda: grpc_fetch("ok-grpc-share", "ok-grpc-data"),
            lambda: kafka_fetch("ok-kafka-share", "ok-kafka-data"),
            (["OK", "OK"], ["OK", "OK"]),
            0,
            (("share_fetch", "OK"), ("share_fetch", "OK")),
        ),
        (
            "fetch a topic she may not read",
            lambda: grpc_fetch("ok-grpc-share", "hidden-grpc"),
            lambda: kafka_fetch("ok-kafka-share", "hidden-kafka"),
            ([topic_refused], ["OK", "OK", topic_refused]),
            1,
            (("share_fetch", topic_refused), ("share_fetch", "OK")),
        ),
        (
            "acknowledge a record never acquired",
            lambda: grpc_ack("ok-grpc-share", "ok-grpc-data"),
            lambda: kafka_ack("ok-kafka-share", "ok-kafka-data"),
            (["OK", "INVALID_RECORD_STATE"], ["OK", "INVALID_RECORD_STATE"]),
            0,
            (("share_acknowledge", "OK"), ("share_acknowledge", "OK")),
        ),
        (
            "describe",
            lambda: grpc_describe("ok-grpc-share"),
            lambda: kafka_describe("ok-kafka-share"),
            (["OK"], ["OK"]),
            0,
            (("describe_share_group", "OK"), ("describe_share_group", "OK")),
        ),
        (
            "describe a group she may not describe",
            lambda: grpc_describe("hidden-grpc-share"),
            lambda: kafka_describe("hidden-kafka-share"),
            ([group_refused], [group_refused]),
            1,
            (("describe_share_group", group_refused), ("describe_share_group", "OK")),
        ),
    ]
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


def test_share_group_offset_admin_leaves_the_same_trace_on_both_listeners(
    secure: Secure, both: dict[str, Any]
) -> None:
    """The share-group offset admin (issue #32): gRPC's DescribeShareGroupOffsets,
    AlterShareGroupOffsets, DeleteShareGroupOffsets and the Kafka listener's 90-92 (built
    by its codec): the same decisions and audit lines. A refused topic refuses the gRPC
    call and only that topic's partitions on Kafka (as Kafka's ``KafkaApis``)."""
    import uuid

    grpc: _Grpc = both["grpc"]
    kafka: _Kafka = both["kafka"]
    # An empty share group per listener: a member joins and leaves.
    for listener in LISTENERS:
        member = str(uuid.uuid4())
        for epoch in (0, -1):
            request = pb.ShareGroupHeartbeatRequest(
                group_id=f"ok-{listener}-admin",
                member_id=member,
                member_epoch=epoch,
                subscribed_topic_names=[f"ok-{listener}-data"],
            )
            assert grpc._code("ShareGroupHeartbeat", request)[0] == "OK"

    def grpc_describe(group: str, name: str) -> list[str]:
        request = pb.DescribeShareGroupOffsetsRequest(
            group_id=group, partitions=[pb.TopicPartitions(topic=name, partitions=[0])]
        )
        code, answer = grpc._code("DescribeShareGroupOffsets", request)
        return [code, *(o.error_code or "OK" for o in answer.offsets)] if answer else [code]

    def kafka_describe(group: str, name: str) -> list[str]:
        asked = {"group_id": group, "topics": [{"topic_name": name, "partitions": [0]}]}
        answer = kafka.session.call_plain(90, 1, {"groups": [asked]})
        [g] = answer["groups"]
        return [
            error_name(g["error_code"]),
            *(error_name(p["error_code"]) for t in g["topics"] for p in t["partitions"]),
        ]

    def grpc_alter(group: str, name: str) -> list[str]:
        request = pb.AlterShareGroupOffsetsRequest(
            group_id=group,
            offsets=[pb.ShareStartOffset(topic=name, partition=0, start_offset=0)],
        )
        code, answer = grpc._code("AlterShareGroupOffsets", request)
        return [code, *(r.error_code or "OK" for r in answer.results)] if answer else [code]

    def kafka_alter(group: str, name: str) -> list[str]:
        topics = [{"topic_name": name, "partitions": [{"partition_index": 0, "start_offset": 0}]}]
        answer = kafka.session.call_plain(91, 0, {"group_id": group, "topics": topics})
        return [
            error_name(answer["error_code"]),
            *(error_name(p["error_code"]) for t in answer["responses"] for p in t["partitions"]),
        ]

    def grpc_delete(group: str, name: str) -> list[str]:
        request = pb.DeleteShareGroupOffsetsRequest(group_id=group, topics=[name])
        code, answer = grpc._code("DeleteShareGroupOffsets", request)
        return [code, *(r.error_code or "OK" for r in answer.results)] if answer else [code]

    def kafka_delete(group: str, name: str) -> list[str]:
        answer = kafka.session.call_plain(
            92, 0, {"group_id": group, "topics": [{"topic_name": name}]}
        )
        return [
            error_name(answer["error_code"]),
            *(error_name(t["error_code"]) for t in answer["responses"]),
        ]

    group_refused, topic_refused = "GROUP_AUTHORIZATION_FAILED", "TOPIC_AUTHORIZATION_FAILED"
    describe, alter, delete = (
        "describe_share_group_offsets",
        "alter_share_group_offsets",
        "delete_share_group_offsets",
    )
    # (what, gRPC's call, Kafka's call, decision (gRPC, Kafka), audit lines, counted
    # operation and outcome (gRPC, Kafka))
    steps: list[tuple[str, Any, Any, tuple[list[str], list[str]], int, tuple[Any, Any]]] = [
        (
            "describe the offsets of a group she may not describe",
            lambda: grpc_describe("hidden-grpc-admin", "ok-grpc-data"),
            lambda: kafka_describe("hidden-kafka-admin", "ok-kafka-data"),
            ([group_refused], [group_refused]),
            1,
            ((describe, group_refused), (describe, "OK")),
        ),
        (
            "describe offsets",
            lambda: grpc_describe("ok-grpc-admin", "ok-grpc-data"),
            lambda: kafka_describe("ok-kafka-admin", "ok-kafka-data"),
            (["OK", "OK"], ["OK", "OK"]),
            0,
            ((describe, "OK"), (describe, "OK")),
        ),
        (
            "describe the offsets of a topic she may not describe",
            lambda: grpc_describe("ok-grpc-admin", "hidden-grpc"),
            lambda: kafka_describe("ok-kafka-admin", "hidden-kafka"),
            ([topic_refused], ["OK", topic_refused]),
            1,
            ((describe, topic_refused), (describe, "OK")),
        ),
        (
            "alter offsets",
            lambda: grpc_alter("ok-grpc-admin", "ok-grpc-data"),
            lambda: kafka_alter("ok-kafka-admin", "ok-kafka-data"),
            (["OK", "OK"], ["OK", "OK"]),
            0,
            ((alter, "OK"), (alter, "OK")),
        ),
        (
            "alter the offsets of a topic she may not read",
            lambda: grpc_alter("ok-grpc-admin", "hidden-grpc"),
            lambda: kafka_alter("ok-kafka-admin", "hidden-kafka"),
            ([topic_refused], ["OK", topic_refused]),
            1,
            ((alter, topic_refused), (alter, "OK")),
        ),
        (
            "delete the offsets of a group she may not delete",
            lambda: grpc_delete("ok-grpc-admin", "ok-grpc-data"),
            lambda: kafka_delete("ok-kafka-admin", "ok-kafka-data"),
            ([group_refused], [group_refused, group_refused]),
            1,
            ((delete, group_refused), (delete, group_refused)),
        ),
        (
            "delete the offsets of a share group that does not exist",
            lambda: grpc_delete("del-grpc-admin", "ok-grpc-data"),
            lambda: kafka_delete("del-kafka-admin", "ok-kafka-data"),
            (["GROUP_ID_NOT_FOUND"], ["GROUP_ID_NOT_FOUND", "GROUP_ID_NOT_FOUND"]),
            0,
            ((delete, "GROUP_ID_NOT_FOUND"), (delete, "GROUP_ID_NOT_FOUND")),
        ),
    ]
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
