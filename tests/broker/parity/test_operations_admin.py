"""The admin calls through both listeners: topic and group configs, partition
reassignments, manual replica assignments, and the inter-broker ``Envelope``.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.broker.parity.support import (
    LISTENERS,
    USER,
    Secure,
    _Action,
    _Grpc,
    _Kafka,
    _observe,
)
from tidelog.broker.core.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from tidelog.broker.kafka.errors import error_name
from tidelog.proto.tidelog.v1 import broker_pb2 as pb

pytestmark = pytest.mark.timeout(120)


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
