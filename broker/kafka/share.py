"""Share groups (KIP-932, issue #32) on the Kafka listener: ShareGroupHeartbeat (76),
ShareGroupDescribe (77), ShareFetch (78) and ShareAcknowledge (79), all at v1, the only
version Kafka 4.1 serves (v0 was 4.0's early access; v2 is 4.2's KIP-1222 lock renewal).

Every handler makes the same core call as the gRPC servicer (``broker.grpc.share_service``
over ``broker.core.share_ops.ShareOps``) under the same operations and policies
(``share_group_heartbeat``, ``describe_share_group``, ``share_fetch``,
``share_acknowledge``): only the wire differs. Decisions:

- **Authorization.** READ on the group refuses the whole call
  (``GROUP_AUTHORIZATION_FAILED``). A heartbeat subscribing to a topic it may not read is
  refused whole (``TOPIC_AUTHORIZATION_FAILED``); ShareFetch and ShareAcknowledge refuse
  only the partitions of such a topic (their acknowledgements are not applied, nothing is
  fetched from them), as Kafka's.
- **Share sessions are modelled as Kafka's** (KIP-932), per (group, member) on this
  broker: ShareFetch with epoch 0 opens a session (replacing the member's previous one)
  over the partitions it names and may carry no acknowledgements (``INVALID_REQUEST``);
  epoch N > 0 must be the session's next epoch (``INVALID_SHARE_SESSION_EPOCH``; no
  session: ``SHARE_SESSION_NOT_FOUND``), adds the partitions it names, drops
  ``forgotten_topics_data``, and fetches from every partition of the session; epoch -1
  applies the acknowledgements, fetches nothing, closes the session and releases at
  once every record the member still holds here (``ShareOps.acknowledge`` with
  ``close_session``). ShareAcknowledge takes epoch N > 0 (and moves the session on) or
  -1 (closes it); epoch 0 is ``INVALID_SHARE_SESSION_EPOCH``. A member leaving through
  ShareGroupHeartbeat on this broker loses its session here. At most 2,000 sessions
  (``broker.kafka.share_sessions``, Kafka's ``group.share.max.share.sessions``
  default); when full, sessions idle for 45 s are evicted, else a new one is
  ``SHARE_SESSION_LIMIT_REACHED``.
- **Acknowledgement batches**: one type for the whole range, or one per offset (Kafka's
  two forms; anything else: ``INVALID_REQUEST`` for that partition). An acknowledgement
  call is all or nothing per partition (``ShareOps``); its outcome is the partition's
  ``acknowledge_error_code`` in ShareFetch, its ``error_code`` in ShareAcknowledge.
- ``current_leader`` is always -1/-1 and ``node_endpoints`` empty: a client told
  ``NOT_LEADER_OR_FOLLOWER`` refreshes its metadata (Kafka's hint is an optimisation).
- ShareFetch's long poll (``max_wait``) runs on one of the listener's io threads, capped
  at ``share_ops.MAX_SHARE_WAIT_MS`` as on gRPC. ``min_bytes``, ``max_bytes`` and
  ``batch_size`` are ignored: ``max_records`` bounds the answer.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tidelog.broker.core.operations import Resource, group, topic
from tidelog.broker.core.share_ops import (
    ShareAcknowledged,
    ShareAckRange,
    ShareFetched,
    ShareFetchSpec,
    ShareOps,
)
from tidelog.broker.core.topic_ids import topic_id
from tidelog.broker.kafka.authz import operations_bits, refusals
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.data import _topic_names
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_code, kafka_error
from tidelog.broker.kafka.listener import Connection
from tidelog.broker.kafka.share_sessions import ShareSessionError
from tidelog.broker.share.groups_coordinator import LEAVE_EPOCH, ShareHeartbeatRequest
from tidelog.storage.errors import InvalidRequestError
from tidelog.storage.types import TopicPartition

__all__ = [
    "share_acknowledge",
    "share_fetch",
    "share_group_describe",
    "share_group_heartbeat",
]

_INITIAL_EPOCH = 0
_FINAL_EPOCH = -1
_NO_LEADER = {"leader_id": -1, "leader_epoch": -1}


def _shares(conn: Connection) -> ShareOps:
    if conn.core.shares is None:
        raise InvalidRequestError("this broker serves no share groups")
    return conn.core.shares


def _first_refusal(conn: Connection, resources: Sequence[Resource]) -> int:
    decisions = refusals(conn, resources)
    return next((decisions[r] for r in resources if decisions[r]), NONE)


# --- ShareGroupHeartbeat, ShareGroupDescribe ---------------------------------------------


async def share_group_heartbeat(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """ShareGroupHeartbeat (v1): join (epoch 0), heartbeat, or leave (-1)."""
    group_id = request["group_id"]
    member_id = request.get("member_id") or ""
    names = request.get("subscribed_topic_names")
    refused = _first_refusal(conn, [group(group_id), *(topic(n) for n in names or ())])
    if refused:
        return _heartbeat_error(refused, None)
    try:
        answer = await conn.run(
            _shares(conn).heartbeat,
            ShareHeartbeatRequest(
                group_id=group_id,
                member_id=member_id,
                member_epoch=request["member_epoch"],
                subscribed_topics=frozenset(names) if names is not None else None,
                rack_id=request.get("rack_id"),
                client_id=conn.context.client_id,
                client_host=conn.peer,
            ),
        )
    except Exception as exc:
        return _heartbeat_error(*kafka_error(exc))
    if request["member_epoch"] == LEAVE_EPOCH:
        conn.listener.share_sessions.close((group_id, member_id))
    assignment = None
    if answer.assignment_changed and request["member_epoch"] != LEAVE_EPOCH:
        assignment = {
            "topic_partitions": [
                {"topic_id": topic_id(name), "partitions": parts}
                for name, parts in _by_topic(answer.assignment).items()
            ]
        }
    return {
        "error_code": NONE,
        "member_id": answer.member_id,
        "member_epoch": answer.member_epoch,
        "heartbeat_interval": answer.heartbeat_interval_ms,
        "assignment": assignment,
    }


def _heartbeat_error(code: int, message: str | None) -> Plain:
    return {
        "error_code": code,
        "error_message": message,
        "member_id": None,
        "member_epoch": -1,
        "heartbeat_interval": 0,
        "assignment": None,
    }


def _by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return by_topic


async def share_group_describe(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """ShareGroupDescribe (v1): each group's members and assignments (DESCRIBE on it)."""
    asked = bool(request.get("include_authorized_operations"))
    groups: list[Plain] = []
    for group_id in request["group_ids"]:
        refused = _first_refusal(conn, [group(group_id)])
        if refused:
            groups.append(_described_error(group_id, refused, None))
            continue
        try:
            # No statistics: ShareGroupDescribe has no field for them.
            described = await conn.run(_shares(conn).describe, group_id, False)
        except Exception as exc:
            groups.append(_described_error(group_id, *kafka_error(exc)))
            continue
        view = described.view
        groups.append(
            {
                "error_code": NONE,
                "group_id": group_id,
                "group_state": view.state.value,
                "group_epoch": view.group_epoch,
                "assignment_epoch": view.assignment_epoch,
                "assignor_name": view.assignor_name,
                "members": [
                    {
                        "member_id": m.member_id,
                        "rack_id": m.rack_id,
                        "member_epoch": m.member_epoch,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "subscribed_topic_names": sorted(m.subscribed_topics),
                        "assignment": {
                            "topic_partitions": [
                                {"topic_id": topic_id(n), "topic_name": n, "partitions": ps}
                                for n, ps in _by_topic(m.assignment).items()
                            ]
                        },
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
    }


# --- ShareFetch, ShareAcknowledge ---------------------------------------------------------


@dataclass(slots=True)
class _Partitions:
    """A request's partitions, resolved and authorized: the acknowledgements to apply,
    and the answers already decided (unknown topic id, refused, malformed batches)."""

    acks: list[ShareAckRange] = field(default_factory=list)
    decided: dict[tuple[uuid.UUID, int], tuple[int, str | None]] = field(default_factory=dict)
    refused_topics: set[str] = field(default_factory=set)


def _ack_ranges(name: str, partition: int, batches: Sequence[Plain]) -> list[ShareAckRange]:
    """Kafka's acknowledgement batches as ranges; raises ``InvalidRequestError``."""
    out: list[ShareAckRange] = []
    for b in batches:
        first, last, kinds = b["first_offset"], b["last_offset"], list(b["acknowledge_types"])
        if last < first or any(k not in (0, 1, 2, 3) for k in kinds):
            raise InvalidRequestError(f"bad acknowledgement batch {first}-{last} {kinds}")
        if len(kinds) == 1:
            out.append(ShareAckRange(name, partition, first, last, kinds[0]))
        elif len(kinds) == last - first + 1:
            start = first
            for offset in range(first + 1, last + 2):
                if offset > last or kinds[offset - first] != kinds[start - first]:
                    out.append(
                        ShareAckRange(name, partition, start, offset - 1, kinds[start - first])
                    )
                    start = offset
        else:
            raise InvalidRequestError(
                f"acknowledgement batch {first}-{last}: {len(kinds)} types "
                f"for {last - first + 1} offsets"
            )
    return out


async def _resolve(
    conn: Connection, group_id: str, topics: Sequence[Plain], extra: Sequence[uuid.UUID]
) -> tuple[int, dict[uuid.UUID, str], _Partitions]:
    """The group's refusal (whole call), names by id, and the acknowledgements allowed."""
    names = await _topic_names(conn, [t["topic_id"] for t in topics] + list(extra))
    resources = [group(group_id), *(topic(n) for n in dict.fromkeys(names.values()))]
    decisions = refusals(conn, resources)
    whole = decisions[resources[0]]
    parts = _Partitions()
    parts.refused_topics = {r.name for r in resources[1:] if decisions[r]}
    for t in topics:
        tid = t["topic_id"]
        for p in t["partitions"]:
            key = (tid, p["partition_index"])
            name = names.get(tid)
            if name is None:
                parts.decided[key] = (error_code_for("UNKNOWN_TOPIC_ID"), None)
            elif name in parts.refused_topics:
                parts.decided[key] = (error_code_for("TOPIC_AUTHORIZATION_FAILED"), None)
            else:
                try:
                    parts.acks += _ack_ranges(
                        name, p["partition_index"], p["acknowledgement_batches"]
                    )
                except InvalidRequestError as exc:
                    parts.decided[key] = (error_code_for("INVALID_REQUEST"), str(exc))
    return whole, names, parts


def _whole_error(code: int, message: str | None, **extra: object) -> Plain:
    return {"error_code": code, "error_message": message, "responses": [], **extra}


def _ack_codes(results: Iterable[ShareAcknowledged]) -> dict[tuple[str, int], tuple[int, str]]:
    return {(r.topic, r.partition): (kafka_code(r.error_code), r.error_message) for r in results}


async def share_fetch(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """ShareFetch (v1): acknowledgements, then records, within the member's share session."""
    group_id = request.get("group_id") or ""
    member_id = request.get("member_id") or ""
    epoch = request["share_session_epoch"]
    if not group_id or not member_id:
        return _whole_error(
            error_code_for("INVALID_REQUEST"), "group_id and member_id are required"
        )
    topics = request["topics"]
    forgotten = request.get("forgotten_topics_data") or []
    key = (group_id, member_id)
    sessions = conn.listener.share_sessions
    session_ids: list[uuid.UUID] = []
    if epoch > 0:
        session_ids = [topic_id(tp.topic) for tp in sessions.partitions(key)]
    whole, names, parts = await _resolve(conn, group_id, topics, session_ids)
    if whole:
        return _whole_error(whole, None)
    if epoch == _INITIAL_EPOCH and parts.acks:
        return _whole_error(
            error_code_for("INVALID_REQUEST"), "a share session's first fetch acknowledges nothing"
        )
    named = [
        TopicPartition(names[t["topic_id"]], p["partition_index"])
        for t in topics
        if t["topic_id"] in names
        for p in t["partitions"]
    ]
    shares = _shares(conn)
    try:
        if epoch == _FINAL_EPOCH:
            sessions.close(key)
            closing = functools.partial(shares.acknowledge, close_session=True)
            acks = await conn.run(closing, group_id, member_id, parts.acks)
            return _fetch_answer(names, parts, [], acks, topics_only=topics)
        if epoch == _INITIAL_EPOCH:
            session = sessions.open(key, named)
        else:
            session = sessions.advance(key, epoch)
            for tp in named:
                session.partitions.setdefault(tp, None)
            for t in forgotten:
                for p in t["partitions"]:
                    if t["topic_id"] in names:
                        session.partitions.pop(TopicPartition(names[t["topic_id"]], p), None)
    except ShareSessionError as exc:
        return _whole_error(error_code_for(exc.code), exc.message)
    allowed = tuple(tp for tp in session.partitions if tp.topic not in parts.refused_topics)
    refused = [tp for tp in session.partitions if tp.topic in parts.refused_topics]
    for tp in refused:
        parts.decided[(topic_id(tp.topic), tp.partition)] = (
            error_code_for("TOPIC_AUTHORIZATION_FAILED"),
            None,
        )
    try:
        fetched, acks = await conn.run(
            shares.fetch,
            ShareFetchSpec(
                group_id=group_id,
                member_id=member_id,
                partitions=allowed,
                acknowledgements=tuple(parts.acks),
                max_records=request.get("max_records") or 500,
                max_wait_ms=max(request.get("max_wait", 0), 0),
            ),
        )
    except Exception as exc:
        return _whole_error(*kafka_error(exc))
    lock_ms = await conn.run(shares.lock_duration_ms, group_id)
    answer = _fetch_answer(names, parts, fetched, acks, topics_only=topics)
    answer["acquisition_lock_timeout"] = lock_ms
    return answer


def _fetch_answer(
    names: dict[uuid.UUID, str],
    parts: _Partitions,
    fetched: Sequence[ShareFetched],
    acks: Sequence[ShareAcknowledged],
    *,
    topics_only: Sequence[Plain],
) -> Plain:
    ack_codes = _ack_codes(acks)
    rows: dict[tuple[uuid.UUID, int], Plain] = {}

    def row(tid: uuid.UUID, partition: int) -> Plain:
        return rows.setdefault(
            (tid, partition),
            {
                "partition_index": partition,
                "error_code": NONE,
                "acknowledge_error_code": NONE,
                "current_leader": _NO_LEADER,
                "records": b"",
                "acquired_records": [],
            },
        )

    for f in fetched:
        r = row(topic_id(f.topic), f.partition)
        r["error_code"] = kafka_code(f.error_code)
        r["error_message"] = f.error_message or None
        r["records"] = f.records
        r["acquired_records"] = [
            {
                "first_offset": a.first_offset,
                "last_offset": a.last_offset,
                "delivery_count": a.delivery_count,
            }
            for a in f.acquired
        ]
    for (name, partition), (code, message) in ack_codes.items():
        r = row(topic_id(name), partition)
        r["acknowledge_error_code"] = code
        r["acknowledge_error_message"] = message or None
    for t in topics_only:
        for p in t["partitions"]:
            row(t["topic_id"], p["partition_index"])
    for (tid, partition), (code, why) in parts.decided.items():
        r = row(tid, partition)
        r["error_code"] = code
        r["error_message"] = why
    by_topic: dict[uuid.UUID, list[Plain]] = {}
    for (tid, _), r in sorted(rows.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        by_topic.setdefault(tid, []).append(r)
    return {
        "error_code": NONE,
        "responses": [{"topic_id": tid, "partitions": ps} for tid, ps in by_topic.items()],
        "node_endpoints": [],
    }


async def share_acknowledge(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """ShareAcknowledge (v1): acknowledgements within the member's share session; epoch -1
    closes the session (releasing what the member still holds here)."""
    group_id = request.get("group_id") or ""
    member_id = request.get("member_id") or ""
    epoch = request["share_session_epoch"]
    if not group_id or not member_id:
        return _whole_error(
            error_code_for("INVALID_REQUEST"), "group_id and member_id are required"
        )
    topics = request["topics"]
    whole, _, parts = await _resolve(conn, group_id, topics, [])
    if whole:
        return _whole_error(whole, None)
    key = (group_id, member_id)
    sessions = conn.listener.share_sessions
    try:
        if epoch == _FINAL_EPOCH:
            sessions.close(key)
        elif epoch == _INITIAL_EPOCH:
            raise ShareSessionError(
                "INVALID_SHARE_SESSION_EPOCH", "ShareAcknowledge needs an open share session"
            )
        else:
            sessions.advance(key, epoch)
    except ShareSessionError as exc:
        return _whole_error(error_code_for(exc.code), exc.message)
    try:
        call = functools.partial(_shares(conn).acknowledge, close_session=epoch == _FINAL_EPOCH)
        results = await conn.run(call, group_id, member_id, parts.acks)
    except Exception as exc:
        return _whole_error(*kafka_error(exc))
    rows: dict[tuple[uuid.UUID, int], Plain] = {}
    for t in topics:
        for p in t["partitions"]:
            rows[(t["topic_id"], p["partition_index"])] = {
                "partition_index": p["partition_index"],
                "error_code": NONE,
                "current_leader": _NO_LEADER,
            }
    for (name, partition), (code, message) in _ack_codes(results).items():
        rows[(topic_id(name), partition)].update(error_code=code, error_message=message or None)
    for k, (code, why) in parts.decided.items():
        rows[k].update(error_code=code, error_message=why)
    by_topic: dict[uuid.UUID, list[Plain]] = {}
    for (tid, _), r in rows.items():
        by_topic.setdefault(tid, []).append(r)
    return {
        "error_code": NONE,
        "responses": [{"topic_id": tid, "partitions": ps} for tid, ps in by_topic.items()],
        "node_endpoints": [],
    }
