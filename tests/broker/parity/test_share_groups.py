"""Share groups (heartbeat, fetch, acknowledge, describe) and their offset admin
(describe, alter, delete) through both listeners leave the same trace.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.broker.parity.support import (
    LISTENERS,
    Secure,
    TraceStep,
    _Grpc,
    _Kafka,
    check_steps,
)
from tidelog.broker.kafka.errors import error_name
from tidelog.proto.tidelog.v1 import broker_pb2 as pb

pytestmark = pytest.mark.timeout(120)


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
    steps: list[TraceStep] = [
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
    check_steps(secure, steps)


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
    steps: list[TraceStep] = [
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
    check_steps(secure, steps)
