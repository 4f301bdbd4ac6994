"""Share-group offset admin (KIP-932, issue #32) on the Kafka listener:
DescribeShareGroupOffsets (90, v0-1), AlterShareGroupOffsets (91, v0) and
DeleteShareGroupOffsets (92, v0), the versions Kafka 4.1 serves. DeleteGroups (42) of a
share group is ``broker.kafka.groups.delete_groups``: the core's ``delete_group`` knows
both kinds.

Each handler makes the core call the gRPC servicer makes (``broker.core.share_admin``
through ``ShareOps``) under the same operation and policy; only the wire and Kafka's
per-resource refusals differ:

- **Authorization, as Kafka's ``KafkaApis``**: the group's refusal (DESCRIBE, READ,
  DELETE) answers ``GROUP_AUTHORIZATION_FAILED`` for the group (Describe: that group's
  ``error_code``; Alter and Delete: the top-level one, repeated on every topic or
  partition named); a topic's refusal (DESCRIBE for Describe, READ for the others)
  answers ``TOPIC_AUTHORIZATION_FAILED`` for that topic's partitions only, the others
  go through. Describe with ``topics`` null lists every share partition of the group and
  leaves out, silently, the topics the caller may not describe.
- **Whole-call errors** (``GROUP_ID_NOT_FOUND``, ``NON_EMPTY_GROUP``, ``NOT_COORDINATOR``,
  ``COORDINATOR_LOAD_IN_PROGRESS``) are the group's (Describe) or the top-level
  ``error_code`` with every topic and partition named carrying the same code (Kafka's
  ``getErrorResponse``).
- Topics are named by name in the requests and answered with their id as well (the id
  Metadata reports; all zero for an unknown topic).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from tidelog.broker.core.operations import group, topic
from tidelog.broker.core.share_ops import ShareOps
from tidelog.broker.core.topic_ids import topic_id
from tidelog.broker.kafka.authz import refusals, visible
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_code, kafka_error
from tidelog.broker.kafka.listener import Connection
from tidelog.storage.errors import InvalidRequestError
from tidelog.storage.types import TopicPartition

__all__ = [
    "alter_share_group_offsets",
    "delete_share_group_offsets",
    "describe_share_group_offsets",
]

_ZERO_ID = uuid.UUID(int=0)


def _shares(conn: Connection) -> ShareOps:
    if conn.core.shares is None:
        raise InvalidRequestError("this broker serves no share groups")
    return conn.core.shares


def _id(conn: Connection, name: str) -> uuid.UUID:
    try:
        conn.core.logs.topic(name)
    except Exception:  # unknown: Kafka answers the zero id
        return _ZERO_ID
    return topic_id(name)


def _topic_refusals(conn: Connection, names: Sequence[str]) -> dict[str, int]:
    unique = list(dict.fromkeys(names))
    decided = refusals(conn, [topic(n) for n in unique])
    return {n: decided[topic(n)] for n in unique if decided[topic(n)]}


# --- DescribeShareGroupOffsets (90) --------------------------------------------------------


async def describe_share_group_offsets(
    conn: Connection, header: RequestHeader, request: Plain
) -> Plain:
    """DescribeShareGroupOffsets (v0-1): per group, each share partition's start offset
    (and lag, v1)."""
    groups = []
    for asked in request["groups"]:
        groups.append(await _describe_group(conn, asked["group_id"], asked.get("topics")))
    return {"groups": groups}


async def _describe_group(conn: Connection, group_id: str, topics: list[Plain] | None) -> Plain:
    refused = refusals(conn, [group(group_id)])[group(group_id)]
    if refused:
        return {"group_id": group_id, "topics": [], "error_code": refused}
    named: list[TopicPartition] | None = None
    topic_refused: dict[str, int] = {}
    if topics is not None:
        topic_refused = _topic_refusals(conn, [t["topic_name"] for t in topics])
        named = [
            TopicPartition(t["topic_name"], p)
            for t in topics
            if t["topic_name"] not in topic_refused
            for p in t.get("partitions") or ()
        ]
    try:
        offsets = await conn.run(_shares(conn).describe_offsets, group_id, named)
    except Exception as exc:
        code, message = kafka_error(exc)
        return {"group_id": group_id, "topics": [], "error_code": code, "error_message": message}
    rows: dict[str, list[Plain]] = {}
    for o in offsets:
        rows.setdefault(o.tp.topic, []).append(
            {
                "partition_index": o.tp.partition,
                "start_offset": o.start_offset,
                "leader_epoch": o.leader_epoch,
                "lag": o.lag,
                "error_code": kafka_code(o.error_code),
                "error_message": o.error_message or None,
            }
        )
    if topics is None:
        allowed = set(visible(conn, list(rows)))
        rows = {name: ps for name, ps in rows.items() if name in allowed}
    else:
        denied_code = error_code_for("TOPIC_AUTHORIZATION_FAILED")
        for t in topics:
            if t["topic_name"] in topic_refused:
                rows[t["topic_name"]] = [
                    {
                        "partition_index": p,
                        "start_offset": -1,
                        "leader_epoch": -1,
                        "lag": -1,
                        "error_code": denied_code,
                    }
                    for p in t.get("partitions") or ()
                ]
    return {
        "group_id": group_id,
        "error_code": NONE,
        "topics": [
            {"topic_name": name, "topic_id": _id(conn, name), "partitions": ps}
            for name, ps in rows.items()
        ],
    }


# --- AlterShareGroupOffsets (91) -----------------------------------------------------------


async def alter_share_group_offsets(
    conn: Connection, header: RequestHeader, request: Plain
) -> Plain:
    """AlterShareGroupOffsets (v0): an empty group's share partitions start over at the
    offsets given."""
    group_id = request["group_id"]
    topics = request.get("topics") or []
    refused = refusals(conn, [group(group_id)])[group(group_id)]
    if refused:
        return _alter_error(conn, topics, refused, None)
    topic_refused = _topic_refusals(conn, [t["topic_name"] for t in topics])
    offsets = {
        TopicPartition(t["topic_name"], p["partition_index"]): p["start_offset"]
        for t in topics
        if t["topic_name"] not in topic_refused
        for p in t["partitions"]
    }
    try:
        results = await conn.run(_shares(conn).alter_offsets, group_id, offsets)
    except Exception as exc:
        return _alter_error(conn, topics, *kafka_error(exc))
    codes = {r.tp: (kafka_code(r.error_code), r.error_message or None) for r in results}
    answer = []
    for t in topics:
        name = t["topic_name"]
        partitions = []
        for p in t["partitions"]:
            code, message = codes.get(
                TopicPartition(name, p["partition_index"]), (topic_refused.get(name, NONE), None)
            )
            partitions.append(
                {
                    "partition_index": p["partition_index"],
                    "error_code": code,
                    "error_message": message,
                }
            )
        answer.append({"topic_name": name, "topic_id": _id(conn, name), "partitions": partitions})
    return {"error_code": NONE, "responses": answer}


def _alter_error(conn: Connection, topics: list[Plain], code: int, message: str | None) -> Plain:
    return {
        "error_code": code,
        "error_message": message,
        "responses": [
            {
                "topic_name": t["topic_name"],
                "topic_id": _id(conn, t["topic_name"]),
                "partitions": [
                    {
                        "partition_index": p["partition_index"],
                        "error_code": code,
                        "error_message": message,
                    }
                    for p in t["partitions"]
                ],
            }
            for t in topics
        ],
    }


# --- DeleteShareGroupOffsets (92) ----------------------------------------------------------


async def delete_share_group_offsets(
    conn: Connection, header: RequestHeader, request: Plain
) -> Plain:
    """DeleteShareGroupOffsets (v0): an empty group forgets its state on each topic."""
    group_id = request["group_id"]
    names = list(dict.fromkeys(t["topic_name"] for t in request.get("topics") or []))
    refused = refusals(conn, [group(group_id)])[group(group_id)]
    if refused:
        return _delete_error(conn, names, refused, None)
    topic_refused = _topic_refusals(conn, names)
    try:
        results = await conn.run(
            _shares(conn).delete_offsets, group_id, [n for n in names if n not in topic_refused]
        )
    except Exception as exc:
        return _delete_error(conn, names, *kafka_error(exc))
    codes = {r.topic: (kafka_code(r.error_code), r.error_message or None) for r in results}
    return {
        "error_code": NONE,
        "responses": [
            {
                "topic_name": name,
                "topic_id": _id(conn, name),
                "error_code": codes.get(name, (topic_refused.get(name, NONE), None))[0],
                "error_message": codes.get(name, (NONE, None))[1],
            }
            for name in names
        ],
    }


def _delete_error(conn: Connection, names: list[str], code: int, message: str | None) -> Plain:
    return {
        "error_code": code,
        "error_message": message,
        "responses": [
            {
                "topic_name": name,
                "topic_id": _id(conn, name),
                "error_code": code,
                "error_message": message,
            }
            for name in names
        ],
    }
