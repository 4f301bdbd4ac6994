"""One handler per Kafka API: a plain request in, a plain response out, over the core.

Every handler converts the request (plain values, ``broker.kafka.codec``) into one call of
the listener-neutral core (``broker.core.facade.BrokerCore``), the same calls the gRPC listener
makes, so both listeners see the same log, offsets and topics; then it converts the
answer, rendering Tidelog's error codes as Kafka's numbers (``broker.kafka.errors``).
Fields a version lacks are dropped by the codec, so a handler answers all versions.

Data path (Produce, Fetch, ListOffsets, InitProducerId) lives in ``broker.kafka.data``;
offsets and coordinators in ``broker.kafka.offsets``; this module holds ApiVersions,
Metadata and topic admin, and ``HANDLERS``, the dispatch table the listener uses (its keys
are exactly ``versions.ADVERTISED``'s, which a test checks).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid

from tidelog.broker.core import operations
from tidelog.broker.core.topics import MetadataTopic, TopicRequest, TopicView
from tidelog.broker.kafka.admin import (
    alter_configs,
    delete_records,
    describe_cluster,
    describe_configs,
    describe_log_dirs,
    elect_leaders,
    incremental_alter_configs,
)
from tidelog.broker.kafka.authz import denied, operations_bits, refusals, visible
from tidelog.broker.kafka.cluster import broker_entries
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.data import (
    describe_producers,
    fetch,
    init_producer_id,
    list_offsets,
    offset_for_leader_epoch,
    produce,
)
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_code, kafka_error
from tidelog.broker.kafka.groups import (
    delete_groups,
    describe_groups,
    heartbeat,
    join_group,
    leave_group,
    list_groups,
    sync_group,
)
from tidelog.broker.kafka.kip848 import consumer_group_describe, consumer_group_heartbeat, topic_id
from tidelog.broker.kafka.listener import Connection, Handler
from tidelog.broker.kafka.offsets import (
    find_coordinator,
    offset_commit,
    offset_delete,
    offset_fetch,
)
from tidelog.broker.kafka.reassign import (
    alter_partition_reassignments,
    list_partition_reassignments,
)
from tidelog.broker.kafka.sasl import sasl_authenticate, sasl_handshake
from tidelog.broker.kafka.share import (
    share_acknowledge,
    share_fetch,
    share_group_describe,
    share_group_heartbeat,
)
from tidelog.broker.kafka.share_admin import (
    alter_share_group_offsets,
    delete_share_group_offsets,
    describe_share_group_offsets,
)
from tidelog.broker.kafka.transactions import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    describe_transactions,
    end_txn,
    list_transactions,
    txn_offset_commit,
)
from tidelog.broker.kafka.txn_markers import write_txn_markers
from tidelog.broker.kafka.users import alter_user_scram_credentials, describe_user_scram_credentials
from tidelog.broker.kafka.versions import (
    ADVERTISED,
    FINALIZED_FEATURES,
    FINALIZED_FEATURES_EPOCH,
    SUPPORTED_FEATURES,
)
from tidelog.storage.errors import UnknownTopicOrPartitionError

__all__ = ["HANDLERS"]

log = logging.getLogger(__name__)

_ZERO_UUID = uuid.UUID(int=0)


async def api_versions(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """ApiVersions: every advertised range (``versions.ADVERTISED``) and, v3+, the
    features (``transaction.version``: which transaction protocol clients may use)."""
    return {
        "error_code": NONE,
        "api_keys": [
            {"api_key": key, "min_version": low, "max_version": high}
            for key, (low, high) in sorted(ADVERTISED.items())
        ],
        "supported_features": [
            {"name": name, "min_version": low, "max_version": high}
            for name, (low, high) in sorted(SUPPORTED_FEATURES.items())
        ],
        "finalized_features_epoch": FINALIZED_FEATURES_EPOCH,
        "finalized_features": [
            {"name": name, "min_version_level": level, "max_version_level": level}
            for name, level in sorted(FINALIZED_FEATURES.items())
        ],
    }


async def metadata(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """Metadata: every live broker's Kafka endpoint, the controller, topics and leaders.

    The brokers and partitions follow Kafka's metadata cache (``broker.kafka.cluster``):
    in cluster mode every live broker with a Kafka listener is listed, a partition without
    a live leader answers ``LEADER_NOT_AVAILABLE``. ``topics`` null (v1+) or empty (v0)
    means every topic. With ``auto.create.topics.enable`` and the client's
    ``allow_auto_topic_creation`` (always true before v4), a missing topic asked for by
    name is created with the broker's defaults and answered at once (in cluster mode only
    on the controller: elsewhere the creation gets ``NOT_CONTROLLER`` and the topic stays
    unknown); an illegal name answers ``INVALID_TOPIC_EXCEPTION`` and is never created.
    With the authorizer on, as Kafka's: a listing leaves out the topics the caller may
    not DESCRIBE; a named one it may not describe answers ``TOPIC_AUTHORIZATION_FAILED``
    whether it exists or not (audited, and never auto-created), as does a missing one it
    may not CREATE (on the cluster or the topic) when it would be auto-created. The
    caller's authorized operations (KIP-430) on each topic it may describe and on the
    cluster when asked (v8+; ``broker.kafka.authz.operations_bits``).
    """
    requested = request.get("topics")
    names = [t["name"] for t in requested or [] if t.get("name")]
    if requested is not None and not requested and header.api_version >= 1:
        names = []
        every = False
    else:
        every = not names
    core = conn.core
    refused: set[str] = set()
    if every:
        cluster, topics = await conn.run(core.metadata, [], False)
        if core.acls.enabled:
            # A listing leaves out, silently, what the caller may not describe.
            shown = set(visible(conn, [t.name for t in topics]))
            topics = [t for t in topics if t.name in shown]
    elif names:
        cluster, topics = await conn.run(core.metadata, names, False)
        # Authorization answers first, for every named topic alike (existing, unknown or
        # illegal), so nothing leaks; each refusal is audited (``authz.refusals``).
        decided = refusals(conn, [operations.topic(t.name) for t in topics])
        refused = {resource.name for resource, code in decided.items() if code}
        allow = request.get("allow_auto_topic_creation", True)
        missing = [
            t.name
            for t in topics
            if t.error_code == "UNKNOWN_TOPIC_OR_PARTITION" and t.name not in refused
        ]
        if missing and allow and conn.settings.auto_create_topics:
            # As Kafka: creating needs CREATE on the cluster or on the topic (only the
            # topic's refusal is audited: the cluster's is not final).
            creatable = refusals(
                conn, [operations.topic(name) for name in missing], operation="create_topics"
            )
            refused.update(resource.name for resource, code in creatable.items() if code)
            for name in missing:
                if name in refused:
                    continue
                try:
                    await conn.run(core.create_topic, name, None, {})
                except Exception as exc:
                    log.info("auto-creating topic %r failed: %s", name, exc)
            cluster, topics = await conn.run(core.metadata, names, False)
    else:
        cluster, _ = await conn.run(core.metadata, [], False)
        topics = []
    brokers = conn.kafka_brokers()
    topic_operations = bool(request.get("include_topic_authorized_operations"))
    topics = [
        MetadataTopic(t.name, "TOPIC_AUTHORIZATION_FAILED") if t.name in refused else t
        for t in topics
    ]
    bits = [
        operations_bits(
            conn,
            operations.topic(t.name),
            topic_operations and t.error_code != "TOPIC_AUTHORIZATION_FAILED",
        )
        for t in topics
    ]
    return {
        "brokers": broker_entries(brokers, racks=conn.kafka_racks()),
        "cluster_id": cluster.cluster_id,
        "controller_id": cluster.controller_id,
        # Each topic's entry encoded once while it is unchanged (``broker.kafka.
        # metadata_cache``): authorization above and the bits are still per request.
        "topics": conn.listener.metadata_entries.answer(topics, bits, brokers, header.api_version),
        "cluster_authorized_operations": operations_bits(
            conn,
            operations.cluster(),
            bool(request.get("include_cluster_authorized_operations")),
        ),
    }


async def create_topics(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """CreateTopics: the authorized topics created by the core in one batch (broker
    defaults for -1 counts), answered when every partition has a leader, or at the
    request's ``timeout_ms`` with ``REQUEST_TIMED_OUT`` for each topic still pending
    (``Topics.create_topics``; ``timeout_ms <= 0`` answers without waiting, as Kafka).

    A topic's ``assignments`` (partition index -> broker ids, preferred leader first) is a
    manual replica assignment (``broker.core.replica_assignment``): ``num_partitions`` and
    ``replication_factor`` must then be -1 (``INVALID_REQUEST``), and a list Kafka would
    refuse is ``INVALID_REPLICA_ASSIGNMENT`` with Kafka's message. ``validate_only`` makes
    every check (the replication factor and the assignment's brokers included) and
    creates nothing. A topic named twice in one request is ``INVALID_REQUEST`` for each
    entry, as Kafka's.
    """
    validate_only = bool(request.get("validate_only", False))
    names = [t["name"] for t in request["topics"]]
    dupes = {n for n in names if names.count(n) > 1}
    results: list[Plain] = []
    batch: list[TopicRequest] = []
    for topic in request["topics"]:
        name = topic["name"]
        result: Plain = {"name": name, "topic_id": _ZERO_UUID}
        results.append(result)
        if name in dupes:
            result.update(
                error_code=error_code_for("INVALID_REQUEST"),
                error_message="Found multiple entries for this topic.",
            )
            continue
        # CREATE on the cluster, or else on the topic: only the topic's refusal is
        # audited (the policy table's ``or_on_cluster``).
        if code := denied(conn, operations.topic(name)):
            result.update(error_code=code)
            continue
        wanted = _topic_request(topic)
        if not validate_only:
            batch.append(wanted)
            continue
        try:
            created, replicas = await conn.run(
                functools.partial(
                    conn.core.validate_new_topic,
                    name,
                    wanted.partitions,
                    wanted.config,
                    replication_factor=wanted.replication_factor,
                    assignment=wanted.assignment,
                )
            )
        except Exception as exc:
            _topic_failed(result, exc)
        else:
            result.update(error_code=NONE, num_partitions=created, replication_factor=replicas)
            result.update(configs=[])
    if batch:
        timeout_ms = int(request.get("timeout", 60_000))  # kio names it "timeout" (ms)
        try:
            answers = await conn.run(conn.core.create_topics, batch, timeout_ms)
        except Exception as exc:
            answers = {r.name: exc for r in batch}
        by_name = {r["name"]: r for r in results}
        for name, answer in answers.items():
            _topic_answered(by_name[name], name, answer)
    return {"topics": results}


def _topic_request(topic: Plain) -> TopicRequest:
    count = topic["num_partitions"]
    factor = topic["replication_factor"]
    configs = {c["name"]: c["value"] for c in topic.get("configs", []) if c["value"]}
    assignment = [
        (a["partition_index"], tuple(a["broker_ids"])) for a in topic.get("assignments") or []
    ]
    if assignment:  # -1 is unset; anything else is refused by the core
        partitions = None if count == -1 else count
        replication = None if factor == -1 else factor
    else:
        partitions = count if count > 0 else None
        replication = factor if factor > 0 else None
    return TopicRequest(topic["name"], partitions, configs, replication, assignment or None)


def _topic_failed(result: Plain, exc: BaseException) -> None:
    if isinstance(exc, ValueError):
        result.update(error_code=error_code_for("INVALID_REQUEST"), error_message=str(exc))
    else:
        code, message = kafka_error(exc)
        result.update(error_code=code, error_message=message)


def _topic_answered(result: Plain, name: str, answer: TopicView | Exception | None) -> None:
    """One topic's CreateTopics result from the core's answer (None: created, not waited
    for: the counts are -1, as Kafka's when it has none to give)."""
    if isinstance(answer, Exception):
        _topic_failed(result, answer)
        return
    if answer is None:
        result.update(error_code=NONE, num_partitions=-1, replication_factor=-1, configs=[])
        return
    result.update(
        error_code=NONE,
        topic_id=topic_id(name),
        num_partitions=len(answer.partitions),
        replication_factor=len(answer.partitions[0].replicas) if answer.partitions else 1,
        configs=[
            {
                "name": k,
                "value": v,
                "read_only": False,
                "config_source": 5,
                "is_sensitive": False,
            }
            for k, v in sorted(answer.config.items())
        ],
    )


async def delete_topics(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """DeleteTopics: by name (v1-5 ``topic_names``, v6 ``topics``); ids are refused. The
    authorized topics are deleted by the core in one batch, answered when gone, or at
    ``timeout_ms`` with ``REQUEST_TIMED_OUT`` for each still pending
    (``Topics.delete_topics``)."""
    names: list[str | None] = list(request.get("topic_names") or [])
    names += [t.get("name") for t in request.get("topics") or []]
    responses: list[Plain] = []
    batch: list[str] = []
    for name in names:
        if not name:
            responses.append(
                {
                    "name": None,
                    "error_code": error_code_for("UNKNOWN_TOPIC_ID"),
                    "error_message": "topics are deleted by name here",
                }
            )
            continue
        response: Plain = {"name": name, "error_code": NONE}
        responses.append(response)
        code = denied(conn, operations.topic(name))
        if code:
            response["error_code"] = code
        elif name not in batch:
            batch.append(name)
    if batch:
        timeout_ms = int(request.get("timeout", 60_000))  # kio names it "timeout" (ms)
        answers: dict[str, Exception | None]
        try:
            answers = await conn.run(conn.core.delete_topics, batch, timeout_ms)
        except Exception as exc:
            answers = dict.fromkeys(batch, exc)
        for response in responses:
            error = answers.get(response["name"]) if response["error_code"] == NONE else None
            if error is not None:
                code, message = kafka_error(error)
                response.update(error_code=code, error_message=message)
    return {"responses": responses}


async def create_partitions(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """CreatePartitions: grow each topic to its new total count (ALTER on each topic), in
    a cluster as one controller batch answered when led or at ``timeout_ms``
    (``REQUEST_TIMED_OUT``) like CreateTopics.

    A topic's ``assignments`` (one broker-id list per new partition, or null) places the
    new partitions as given (``Topics.create_partitions``: Kafka's
    ``INVALID_REPLICA_ASSIGNMENT`` for a list count, a length or a broker it refuses)."""
    results: list[Plain] = []
    counts = []
    assignments: dict[str, list[tuple[int, ...]]] = {}
    for t in request["topics"]:
        code = denied(conn, operations.topic(t["name"]))
        if code:
            results.append({"name": t["name"], "error_code": code})
            continue
        counts.append((t["name"], t["count"]))
        if t.get("assignments") is not None:
            assignments[t["name"]] = [tuple(a["broker_ids"]) for a in t["assignments"]]
    validate_only = bool(request.get("validate_only", False))
    timeout_ms = int(request.get("timeout", 60_000))  # kio's name for timeout_ms
    try:
        answers = await conn.run(
            lambda: conn.core.create_partitions(
                counts, validate_only=validate_only, assignments=assignments, timeout_ms=timeout_ms
            )
        )
    except UnknownTopicOrPartitionError as exc:
        code, message = kafka_error(exc)
        results += [{"name": n, "error_code": code, "error_message": message} for n, _ in counts]
        return {"results": results}
    results += [
        {
            "name": a.name,
            "error_code": kafka_code(a.error_code),
            "error_message": a.error_message or None,
        }
        for a in answers
    ]
    return {"results": results}


HANDLERS: dict[int, Handler] = {
    0: produce,
    1: fetch,
    2: list_offsets,
    3: metadata,
    8: offset_commit,
    9: offset_fetch,
    10: find_coordinator,
    11: join_group,
    12: heartbeat,
    13: leave_group,
    14: sync_group,
    15: describe_groups,
    16: list_groups,
    17: sasl_handshake,
    18: api_versions,
    19: create_topics,
    20: delete_topics,
    21: delete_records,
    22: init_producer_id,
    24: add_partitions_to_txn,
    25: add_offsets_to_txn,
    26: end_txn,
    27: write_txn_markers,
    28: txn_offset_commit,
    23: offset_for_leader_epoch,
    32: describe_configs,
    33: alter_configs,
    35: describe_log_dirs,
    36: sasl_authenticate,
    37: create_partitions,
    42: delete_groups,
    43: elect_leaders,
    44: incremental_alter_configs,
    45: alter_partition_reassignments,
    46: list_partition_reassignments,
    47: offset_delete,
    50: describe_user_scram_credentials,
    51: alter_user_scram_credentials,
    60: describe_cluster,
    61: describe_producers,
    65: describe_transactions,
    66: list_transactions,
    68: consumer_group_heartbeat,
    69: consumer_group_describe,
    76: share_group_heartbeat,
    77: share_group_describe,
    78: share_fetch,
    79: share_acknowledge,
    90: describe_share_group_offsets,
    91: alter_share_group_offsets,
    92: delete_share_group_offsets,
}

# Handlers must not block the loop: every core call above goes through ``conn.run``.
assert all(asyncio.iscoroutinefunction(h) for h in HANDLERS.values())
