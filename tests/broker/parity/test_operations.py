"""The common operations through both listeners leave the same trace (decision, audit
lines, counted operations, quota meters), and each API's authorization rule holds on
both: OffsetFetch, LeaveGroup, DescribeProducers, KIP-430's authorized operations,
DeleteGroups and OffsetDelete, batched FindCoordinator, DeleteRecords.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from kafka.protocol.admin import (
    DescribeGroupsRequest,
    DescribeGroupsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.broker.parity.support import (
    LISTENERS,
    USER,
    Secure,
    _Action,
    _either,
    _Grpc,
    _Kafka,
    _observe,
)
from tidelog.broker.core.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE
from tidelog.broker.kafka.errors import error_name
from tidelog.proto.tidelog.v1 import broker_pb2 as pb

pytestmark = pytest.mark.timeout(120)


def _this_scenarios_groups(listing: list[str]) -> list[str]:
    """A ListGroups answer (its code, then the group names) cut to this scenario's groups:
    the ones it commits and the hidden ones it may not describe. The package's other
    tests make groups of their own on the same broker, in any order."""
    return listing[:1] + [g for g in listing[1:] if g in ("ok-L-group", "hidden-L-group")]


# (name, the call on a listener's driver given the listener's name, expected decision,
# expected audit lines (normalised), the operation and outcome counted)
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
        lambda d, lst: _this_scenarios_groups(d.list_groups()),
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
