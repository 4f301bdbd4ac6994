"""Coordinators and committed offsets over the core: FindCoordinator, OffsetCommit,
OffsetFetch, OffsetDelete. OffsetFetch's ``require_stable`` (v7+, KIP-447) answers
``UNSTABLE_OFFSET_COMMIT`` for a partition whose offset is pending in a transaction.

Committed offsets are the core's (``BrokerCore.commit_offsets`` / ``fetch_offsets``), the
same ``__consumer_offsets`` the gRPC listener writes and reads, so a group's position is
the same through both listeners. A commit without a member (``generation_id`` -1, empty
member id: a consumer using assign) is the core's "simple" commit, accepted while no
Tidelog (KIP-848) member is in the group. A commit by a classic group member is checked
against its classic group first (``broker.groups.classic``: member known, generation
current) and then written the same way.

A transaction coordinator (FindCoordinator ``key_type`` 1, DESCRIBE on the
transactional id) is the leader of the id's ``__transaction_state`` partition, in a
cluster as on a single node (``COORDINATOR_NOT_AVAILABLE`` while the topic or that
partition has no leader).
"""

from __future__ import annotations

import functools

from tidelog.broker.core.operations import group, topic, transactional_id
from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.manager import OffsetCommitEntry
from tidelog.broker.kafka.authz import denied, refusals, visible
from tidelog.broker.kafka.cluster import coordinator_endpoint
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_code, kafka_error
from tidelog.broker.kafka.groups import classic_error_code, not_coordinator
from tidelog.broker.kafka.listener import Connection
from tidelog.storage.errors import LeaderNotAvailableError

__all__ = [
    "commit_answer",
    "commit_entries",
    "find_coordinator",
    "offset_commit",
    "offset_delete",
    "offset_fetch",
]


async def find_coordinator(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """FindCoordinator: the Kafka endpoint of a group's coordinator, the leader of its
    ``__consumer_offsets`` partition (the core's placement, as for gRPC clients). v0-3 ask
    for one ``key``; v4+ (KIP-699) for several ``coordinator_keys`` at once, answered one
    ``coordinators`` entry per key in request order, each with its own error, as Kafka's
    ``KafkaApis.handleFindCoordinatorRequest`` answers them (a refused or unknown key does
    not fail the others).

    ``COORDINATOR_NOT_AVAILABLE`` (retried by clients) while that partition has no leader
    or its leader has no Kafka listener."""
    key_type = request.get("key_type", 0)
    if header.api_version < 4:
        return await _coordinator_of(conn, key_type, request["key"])
    coordinators = []
    for key in request.get("coordinator_keys") or []:
        coordinators.append({"key": key, **await _coordinator_of(conn, key_type, key)})
    return {"coordinators": coordinators}


async def _coordinator_of(conn: Connection, key_type: int, key: str) -> Plain:
    """One key's answer: error code and message, node id, host and port."""
    if key_type not in (0, 1):
        message = f"coordinator key type {key_type} is not supported (0: group, 1: transaction)"
        code = error_code_for("INVALID_REQUEST")
        return {"error_code": code, "error_message": message, **_NO_NODE}
    transaction = key_type == 1
    code = denied(conn, transactional_id(key) if transaction else group(key))
    if code:
        return {"error_code": code, "error_message": None, **_NO_NODE}
    unavailable = error_code_for("COORDINATOR_NOT_AVAILABLE")
    try:
        coordinator = await conn.run(
            functools.partial(conn.core.find_coordinator, key, transaction=transaction)
        )
    except LeaderNotAvailableError as exc:
        # Kafka's answer while the offsets partition has no leader.
        return {"error_code": unavailable, "error_message": str(exc), **_NO_NODE}
    except Exception as exc:
        code, message = kafka_error(exc)
        return {"error_code": code, "error_message": message, **_NO_NODE}
    endpoint = coordinator_endpoint(coordinator.broker_id, conn.kafka_brokers())
    if endpoint is None:
        message = f"broker {coordinator.broker_id} coordinates it but has no Kafka listener"
        return {"error_code": unavailable, "error_message": message, **_NO_NODE}
    host, port = endpoint
    return {
        "error_code": NONE,
        "error_message": None,
        "node_id": coordinator.broker_id,
        "host": host,
        "port": port,
    }


_NO_NODE: Plain = {"node_id": -1, "host": "", "port": -1}


async def offset_commit(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """OffsetCommit (v2-9): per partition, the core's commit; group errors apply to all."""
    group_id = request["group_id"]
    member_id = request.get("member_id") or ""
    generation = request.get("generation_id_or_member_epoch", -1)
    topics = request["topics"]
    # READ on the group, then on each topic; the first refusal answers every partition.
    decided = refusals(conn, [group(group_id), *(topic(t["name"]) for t in topics)], whole=True)
    group_error = next((code for code in decided.values() if code), 0)
    # A KIP-848 member (ConsumerGroupHeartbeat) commits as itself, checked by the core;
    # a classic member is checked here and written as a simple commit; no member: simple.
    # A static classic member (``group_instance_id``, v7+) is checked by its instance id:
    # an incarnation another one replaced is answered FENCED_INSTANCE_ID (KIP-345).
    classic = conn.core.groups.classic
    instance_id = request.get("group_instance_id")
    as_member, as_epoch = "", -1
    if (
        member_id
        and not classic.has_member(group_id, member_id)
        and not (instance_id is not None and classic.has_instance(group_id, instance_id))
        and header.api_version >= 9
    ):
        as_member, as_epoch = member_id, generation
    elif not group_error and (member_id or generation >= 0):
        # The coordinator first, as Kafka: a former coordinator's answer about the
        # member would be stale (the member must find the new one).
        group_error = await not_coordinator(conn, group_id) or classic_error_code(
            classic.check_commit(group_id, member_id, generation, instance_id)
        )
    codes: list[int] = []
    if not group_error:
        entries = commit_entries(topics)
        try:
            results = await conn.run(
                conn.core.commit_offsets, group_id, as_member, as_epoch, entries
            )
        except Exception as exc:
            group_error, _ = kafka_error(exc)
        else:
            codes = [kafka_code(r.error_code) for r in results]
    return commit_answer(topics, group_error, codes)


def commit_entries(topics: list[Plain]) -> list[OffsetCommitEntry]:
    """An OffsetCommit's (or TxnOffsetCommit's) partitions as the core's entries."""
    return [
        OffsetCommitEntry(
            TopicPartition(t["name"], p["partition_index"]),
            p["committed_offset"],
            p.get("committed_metadata") or "",
            p.get("committed_leader_epoch", -1),  # v6+ (KIP-320)
        )
        for t in topics
        for p in t["partitions"]
    ]


def commit_answer(topics: list[Plain], error: int, codes: list[int]) -> Plain:
    """Every asked partition with ``error`` (a group-level refusal) or its own code, in
    request order (``codes`` aligned with ``commit_entries``)."""
    answer = []
    index = 0
    for t in topics:
        partitions = []
        for p in t["partitions"]:
            code = error or codes[index]
            index += 1
            partitions.append({"partition_index": p["partition_index"], "error_code": code})
        answer.append({"name": t["name"], "partitions": partitions})
    return {"topics": answer}


class _RefusedError(Exception):
    """Not authorized: answered with the code already known."""


async def offset_fetch(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """OffsetFetch (v1-9): committed offsets, -1 where none; ``topics`` null: all. v8+
    asks for several groups at once (KIP-709)."""
    stable = bool(request.get("require_stable", False))  # v7+ (KIP-447)
    if "groups" in request:
        groups = []
        for entry in request["groups"]:
            answer = await _offsets_of(conn, header, entry["group_id"], entry.get("topics"), stable)
            groups.append({"group_id": entry["group_id"], **answer})
        return {"groups": groups}
    return await _offsets_of(conn, header, request["group_id"], request.get("topics"), stable)


async def _offsets_of(
    conn: Connection,
    header: RequestHeader,
    group_id: str,
    topics: list[Plain] | None,
    stable: bool = False,
) -> Plain:
    selection = None if topics is None else {t["name"]: t["partition_indexes"] for t in topics}
    refused = denied(conn, group(group_id))
    # As Kafka: a named topic the caller may not describe answers
    # TOPIC_AUTHORIZATION_FAILED per partition (audited); with every committed partition
    # asked for, such topics are left out silently.
    hidden: dict[str, int] = {}
    if not refused and selection is not None:
        decided = refusals(conn, [topic(name) for name in selection])
        hidden = {resource.name: code for resource, code in decided.items() if code}
        selection = {name: parts for name, parts in selection.items() if name not in hidden}
    try:
        if refused:
            raise _RefusedError
        if selection is not None and not selection and hidden:
            results = []  # every named topic refused: nothing to ask the core
        else:
            # require_stable: UNSTABLE_OFFSET_COMMIT per pending partition (the core's).
            results = await conn.run(conn.core.fetch_offsets, group_id, selection, stable)
        if topics is None:
            shown = set(visible(conn, sorted({r.tp.topic for r in results})))
            results = [r for r in results if r.tp.topic in shown]
    except Exception as exc:
        code = refused or kafka_error(exc)[0]
        if header.api_version < 2:  # no group-level error field: per partition
            return {
                "topics": [
                    {
                        "name": t["name"],
                        "partitions": [
                            {"partition_index": p, "committed_offset": -1, "error_code": code}
                            for p in t["partition_indexes"]
                        ],
                    }
                    for t in topics or []
                ]
            }
        return {"topics": [], "error_code": code}
    by_topic: dict[str, list[Plain]] = {}
    for t in topics or []:
        if t["name"] in hidden:
            by_topic[t["name"]] = [
                {
                    "partition_index": p,
                    "committed_offset": -1,
                    "committed_leader_epoch": -1,
                    "metadata": "",
                    "error_code": hidden[t["name"]],
                }
                for p in t["partition_indexes"]
            ]
    for r in results:
        by_topic.setdefault(r.tp.topic, []).append(
            {
                "partition_index": r.tp.partition,
                "committed_offset": r.offset,
                "committed_leader_epoch": r.leader_epoch,  # v5+ (KIP-320)
                "metadata": r.metadata,
                "error_code": kafka_code(r.error_code),
            }
        )
    return {
        "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
        "error_code": NONE,
    }


async def offset_delete(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """OffsetDelete (v0, KIP-496): delete a group's committed offsets of some partitions.

    As Kafka's ``handleOffsetDeleteRequest``: DELETE on the group or the whole request is
    answered ``GROUP_AUTHORIZATION_FAILED``; a topic the caller may not READ answers
    ``TOPIC_AUTHORIZATION_FAILED`` for each of its partitions; the others go to the core
    (``GroupManager.delete_offsets``), whose per-partition errors are
    ``UNKNOWN_TOPIC_OR_PARTITION`` and ``GROUP_SUBSCRIBED_TO_TOPIC``. A group-level error
    (``GROUP_ID_NOT_FOUND``, ``NON_EMPTY_GROUP``, ``NOT_COORDINATOR``...) is the top-level
    ``error_code``, with only the refused topics listed, as Kafka merges them.
    """
    group_id = request["group_id"]
    topics = request.get("topics") or []
    code = denied(conn, group(group_id)) or (
        NONE if group_id else error_code_for("INVALID_GROUP_ID")
    )
    if code:
        return {"error_code": code, "topics": []}
    decided = refusals(conn, [topic(t["name"]) for t in topics])
    refused = {resource.name: code for resource, code in decided.items() if code}
    wanted = [
        TopicPartition(t["name"], p["partition_index"])
        for t in topics
        if t["name"] not in refused
        for p in t["partitions"]
    ]
    codes: dict[TopicPartition, int] = {}
    group_error = NONE
    try:
        results = await conn.run(conn.core.delete_offsets, group_id, wanted)
    except Exception as exc:
        group_error, _ = kafka_error(exc)
    else:
        codes = {r.tp: kafka_code(r.error_code) for r in results}
    answer = []
    for t in topics:
        name = t["name"]
        if name not in refused and group_error:
            continue
        partitions = [
            {
                "partition_index": p["partition_index"],
                "error_code": refused.get(name)
                or codes.get(TopicPartition(name, p["partition_index"]), NONE),
            }
            for p in t["partitions"]
        ]
        answer.append({"name": name, "partitions": partitions})
    return {"error_code": group_error, "topics": answer}
