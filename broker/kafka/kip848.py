"""ConsumerGroupHeartbeat (KIP-848) on the core's own group coordinator.

Tidelog's groups are KIP-848 groups already (``broker.groups``: the broker assigns), so a
Kafka client using the new protocol (confluent-kafka with ``group.protocol=consumer``)
joins the very groups Tidelog's own consumers join, and ``tidelog groups describe`` shows
it. Two translations:

- Kafka's heartbeat sends the subscription and the owned partitions only when they
  changed (null: as last time); the core wants both on every heartbeat. The last ones
  are kept per member here (``MemberMemory``), dropped when the member leaves or is fenced.
- Kafka names partitions by topic id. Tidelog topics have no ids of their own: the listener
  derives one per name (``topic_id``, a UUID v5), which Metadata v10+ reports too. A topic
  deleted and created again under the same name keeps its id (Kafka's would change).

Static members (``instance_id``, KIP-848's form of KIP-345) are the core's: a member
leaving with epoch -2 keeps its partitions for its session, and a new member id joining
with the same instance id takes them over without moving anyone else's; a join while the
instance is still live is ``UNRELEASED_INSTANCE_ID``, and a heartbeat of an incarnation
that was replaced is ``FENCED_INSTANCE_ID``.

ConsumerGroupDescribe (v0) shows a KIP-848 group with members: each member's
subscription, assignment and target assignment (topics by id and name), the group and
assignment epochs, the assignor (``uniform``: the core's, which plays that part), and the
caller's authorized operations when asked (KIP-430). DESCRIBE on the group. A classic
group, a group known only by committed offsets, or none answers ``GROUP_ID_NOT_FOUND`` as
Kafka's does for "not a consumer group"; ``NOT_COORDINATOR`` off its coordinator.

Regular-expression subscriptions (KIP-848 ``subscribed_topic_regex``) are refused with
``INVALID_REGULAR_EXPRESSION``; server assignors are the core's (``server_assignor`` is
ignored).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from tidelog.broker.core.operations import group
from tidelog.broker.core.topic_ids import topic_id
from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.coordinator import HeartbeatRequest
from tidelog.broker.kafka.authz import denied, operations_bits
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_error
from tidelog.broker.kafka.listener import Connection

__all__ = ["MemberMemory", "consumer_group_describe", "consumer_group_heartbeat", "topic_id"]

_LEAVE_EPOCHS = (-1, -2)


@dataclass(frozen=True, slots=True)
class MemberMemory:
    """What a member last said (Kafka heartbeats omit what did not change)."""

    subscribed: frozenset[str]
    owned: frozenset[TopicPartition]


async def consumer_group_heartbeat(
    conn: Connection, header: RequestHeader, request: Plain
) -> Plain:
    """ConsumerGroupHeartbeat (v0-1): join (epoch 0), heartbeat, or leave (-1, -2)."""
    group_id = request["group_id"]
    member_id = request.get("member_id") or ""
    epoch = request["member_epoch"]
    code = denied(conn, group(group_id))
    if code:
        return _error(code, None)
    if request.get("subscribed_topic_regex"):
        return _error(
            error_code_for("INVALID_REGULAR_EXPRESSION"),
            "regular expression subscriptions are not supported; name the topics",
        )
    memory = conn.listener.kip848_members
    key = (group_id, member_id)
    known = memory.get(key) if epoch != 0 else None
    names = request.get("subscribed_topic_names")
    subscribed = frozenset(names) if names is not None else (known.subscribed if known else None)
    owned_given = request.get("topic_partitions")
    if owned_given is not None:
        by_id = await conn.run(_names_by_id, conn)
        owned = frozenset(
            TopicPartition(by_id[t["topic_id"]], p)
            for t in owned_given
            if t["topic_id"] in by_id
            for p in t["partitions"]
        )
    else:
        owned = known.owned if known else frozenset()
    if subscribed is None and epoch not in _LEAVE_EPOCHS:
        return _error(error_code_for("INVALID_REQUEST"), "the first heartbeat must name the topics")
    try:
        answer = await conn.run(
            conn.core.consumer_group_heartbeat,
            HeartbeatRequest(
                group_id=group_id,
                member_id=member_id,
                member_epoch=epoch,
                subscribed_topics=subscribed or frozenset(),
                owned=owned,
                rebalance_timeout_ms=max(request.get("rebalance_timeout", 0), 0),
                client_id=conn.context.client_id,
                instance_id=request.get("instance_id"),
            ),
        )
    except Exception as exc:
        memory.pop(key, None)
        code, message = kafka_error(exc)
        return _error(code, message)
    memory.pop(key, None)
    if epoch in _LEAVE_EPOCHS:
        return {"error_code": NONE, "member_id": member_id, "member_epoch": epoch,
                "heartbeat_interval": 0, "assignment": None}  # fmt: skip
    memory[(group_id, answer.member_id)] = MemberMemory(subscribed or frozenset(), owned)
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(answer.assignment):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return {
        "error_code": NONE,
        "member_id": answer.member_id,
        "member_epoch": answer.member_epoch,
        "heartbeat_interval": answer.heartbeat_interval_ms,
        "assignment": {
            "topic_partitions": [
                {"topic_id": topic_id(name), "partitions": partitions}
                for name, partitions in by_topic.items()
            ]
        },
    }


def _names_by_id(conn: Connection) -> dict[uuid.UUID, str]:
    return {topic_id(t.name): t.name for t in conn.core.list_topics(False)}


def _error(code: int, message: str | None) -> Plain:
    return {
        "error_code": code,
        "error_message": message,
        "member_epoch": -1,
        "heartbeat_interval": 0,
        "assignment": None,
    }


def _assignment(partitions: Iterable[TopicPartition]) -> Plain:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return {
        "topic_partitions": [
            {"topic_id": topic_id(name), "topic_name": name, "partitions": parts}
            for name, parts in by_topic.items()
        ]
    }


async def consumer_group_describe(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """ConsumerGroupDescribe (v0): see the module docstring."""
    asked = bool(request.get("include_authorized_operations"))
    groups: list[Plain] = []
    for group_id in request["group_ids"]:
        refused = denied(conn, group(group_id))
        if refused:
            groups.append(_described_error(group_id, refused, None))
            continue
        try:
            view = await conn.run(conn.core.describe_consumer_group, group_id)
        except Exception as exc:
            code, message = kafka_error(exc)
            groups.append(_described_error(group_id, code, message))
            continue
        groups.append(
            {
                "error_code": NONE,
                "error_message": None,
                "group_id": group_id,
                "group_state": view.state.value,
                "group_epoch": view.group_epoch,
                "assignment_epoch": view.assignment_epoch,
                "assignor_name": "uniform",
                "members": [
                    {
                        "member_id": m.member_id,
                        "instance_id": m.instance_id,
                        "rack_id": None,
                        "member_epoch": m.member_epoch,
                        "client_id": m.client_id,
                        "client_host": "",
                        "subscribed_topic_names": sorted(m.subscribed_topics),
                        "subscribed_topic_regex": None,
                        "assignment": _assignment(m.assigned),
                        "target_assignment": _assignment(m.target),
                    }
                    for m in view.members
                ],
                "authorized_operations": operations_bits(conn, group(group_id), asked),
            }
        )
    return {"groups": groups}


def _described_error(group_id: str, code: int, message: str | None) -> Plain:
    return {
        "error_code": code,
        "error_message": message,
        "group_id": group_id,
        "group_state": "",
        "group_epoch": -1,
        "assignment_epoch": -1,
        "assignor_name": "",
        "members": [],
        "authorized_operations": -(2**31),
    }
