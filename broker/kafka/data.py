"""Kafka's data path over the core: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch,
InitProducerId.

- Produce: the RecordBatch v2 bytes the client sent are appended unchanged
  (``BrokerCore.append_inline`` on the loop's thread for a small request to unreplicated
  partitions when no append of it would wait, issue #31, else ``BrokerCore.append`` on
  the listener's thread pool), then ``BrokerCore.complete``
  keeps the ``acks`` promise: 0 answers nothing at all (the listener writes no response),
  1 once appended, -1 (all) from the produce purgatory once durable, without a thread
  waiting. Records from this listener carry no sent time (``BatchTimes.sent_ms`` -1) and
  the broker's received time. A transactional produce needs WRITE on its transactional id
  too, and its batches are verified against the id's transaction (``broker.core.produce``).
- Leader discovery (KIP-951): a Produce (v10+) partition answered
  ``NOT_LEADER_OR_FOLLOWER``, or a Fetch (v16+) one answered that or
  ``FENCED_LEADER_EPOCH``, carries ``current_leader`` (the leader id and epoch this
  broker sees) and the response ``node_endpoints`` with that leader's Kafka endpoint
  (``broker.kafka.cluster.leader_hint``). Produce v11 (KIP-890 part 1) answers a
  transactional batch the coordinator did not verify ``TRANSACTION_ABORTABLE`` (before
  v11: ``INVALID_TXN_STATE``); v12 (KIP-890 part 2, transactions v2) changes no field: a
  transactional batch of a v12 request joins its producer's transaction implicitly
  (``PartitionRecords.transaction_v2``). Produce stops at v12: v13 names topics by id.
- Fetch: a long poll is parked in the core's fetch purgatory (``start_fetch`` /
  ``step_fetch``) and woken by an append through the pipeline's ``LoopBridge``; reads stop at
  the high watermark; ``read_committed`` (``isolation_level`` 1) reads stop at the last
  stable offset and the answer names the aborted transactions the records overlap
  (``docs/transactions.md``), every answer carries the last stable offset. v7+ keeps incremental
  fetch sessions (KIP-227, ``broker.core.fetch_sessions``): an incremental fetch reads
  every partition of its session at the offsets last sent and is answered with those
  that have records, an error, or a high watermark or log start offset that moved.
  v13+ names topics by id (KIP-516): the ids are the ones Metadata reports (derived from
  the name, ``kip848.topic_id``), resolved through the listener's cache of the topic
  list; an id no topic has answers ``UNKNOWN_TOPIC_ID`` per partition (also for a topic
  deleted since the client learnt its id), forgotten ids of no topic are ignored. v14
  only adds a tiered-storage error (none here), v15 moves a follower's ``replica_id``
  into the ``replica_state`` tag (followers use the gRPC replication path: ignored, as
  ``replica_id`` was), v16 adds the leader hints above. Stops at v16: v17 carries
  KIP-853's replica directory ids (KRaft). On a plaintext connection (and
  ``kafka.zero.copy.fetch``, on by default) the records are not read: each partition
  answers a ``FileRegion`` that the listener sends with ``sendfile`` (issue #31,
  ``docs/performance.md``); a TLS connection reads and copies them.
- ListOffsets: -2 earliest, -1 latest (the last stable offset for
  ``read_committed``), -3 the record with
  the largest timestamp below the high watermark (v7, KIP-734; the first of several
  sharing it, as Kafka); v4+ with the leader epoch that wrote the offset found (latest:
  the log's current epoch), which consumers keep to validate their position (KIP-320).
- DescribeProducers (v0, KIP-664): what each partition's leader remembers of its
  idempotent producers (``BrokerCore.describe_producers``, the gRPC call's); READ on
  each topic; ``NOT_LEADER_OR_FOLLOWER`` on a follower; with each producer's open
  transaction's first offset and coordinator epoch (-1: none), which
  ``kafka-transactions.sh find-hanging`` reads.
- OffsetForLeaderEpoch (v2-4): where an epoch ends on the leader
  (``BrokerCore.offsets_for_leader_epochs``), which consumers use to detect a truncated
  log (KIP-320). Kafka's rule: DESCRIBE on the topic for a consumer, CLUSTER_ACTION for a
  follower (``replica_id`` >= 0, v3+).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence

from tidelog.broker.core.fetch import FetchSpec, PartitionFetched, PartitionFetchSpec, release
from tidelog.broker.core.fetch_sessions import (
    FINAL_EPOCH,
    FetchSession,
    SessionError,
    Update,
    answered,
)
from tidelog.broker.core.offsets import EpochQuery, OffsetQuery
from tidelog.broker.core.operations import cluster, topic, transactional_id
from tidelog.broker.core.produce import Acks, PartitionProduced, PartitionRecords
from tidelog.broker.core.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE
from tidelog.broker.kafka.authz import denied, gate, refusals
from tidelog.broker.kafka.cluster import leader_hint
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_code, kafka_error
from tidelog.broker.kafka.kip848 import topic_id
from tidelog.broker.kafka.listener import Connection
from tidelog.broker.kafka.transactions import init_transactional_producer
from tidelog.storage.batch_times import NO_TIME, BatchTimes

__all__ = ["fetch", "init_producer_id", "list_offsets", "offset_for_leader_epoch", "produce"]

log = logging.getLogger(__name__)


async def produce(conn: Connection, header: RequestHeader, request: Plain) -> Plain | None:
    """Produce (v3+): see the module docstring. None: no response (``acks=0``)."""
    acks_value = request["acks"]
    topics = request["topic_data"]
    refused_code = 0
    tid = request.get("transactional_id")
    if acks_value not in (-1, 0, 1):
        refused_code = error_code_for("INVALID_REQUIRED_ACKS")
    elif tid is not None:
        # WRITE on the transactional id too (Kafka's rule); the batches are verified
        # against its transaction by the core (broker.core.produce).
        refused_code = denied(conn, transactional_id(tid))
    if refused_code:
        if acks_value == 0:
            return None
        return _produce_response(
            [
                (t["name"], p["index"], {"error_code": refused_code, "base_offset": -1})
                for t in topics
                for p in t["partition_data"]
            ]
        )
    acks = Acks(acks_value)
    times = BatchTimes(NO_TIME, conn.core.wall_ms())
    refuse = gate(conn)
    parts = [
        PartitionRecords(
            t["name"],
            p["index"],
            bytes(p["records"] or b""),
            times,
            acks == Acks.ALL,
            refused=refuse(t["name"]),
            transactional_id=tid,
            transaction_v2=header.api_version >= _FIRST_IMPLICIT_ADD_PRODUCE_VERSION,
        )
        for t in topics
        for p in t["partition_data"]
    ]
    size = sum(len(p.records) for p in parts)
    # Metered before the append, so the mute after this answer covers these bytes.
    conn.record_quota(PRODUCER_BYTE_RATE, size)
    # queued.max.request.bytes: held from before the append until the answer.
    await conn.admit_bytes(size)
    try:
        answer = await _append_and_answer(conn, parts, acks, header.api_version)
    finally:
        conn.release_bytes(size)
    if answer is not None and header.api_version >= _FIRST_PRODUCE_HINT_VERSION:
        _add_leader_hints(
            conn,
            answer,
            [(t["name"], p) for t in answer["responses"] for p in t["partition_responses"]],
            "index",
            _PRODUCE_HINTED,
        )
    return answer


_FIRST_ABORTABLE_PRODUCE_VERSION = 11  # KIP-890: TRANSACTION_ABORTABLE answered as itself
_FIRST_IMPLICIT_ADD_PRODUCE_VERSION = 12  # KIP-890 part 2: transactions v2
_TRANSACTION_ABORTABLE = error_code_for("TRANSACTION_ABORTABLE")
_INVALID_TXN_STATE = error_code_for("INVALID_TXN_STATE")


def _produce_code(name: str, version: int) -> int:
    """A partition's error code as Produce ``version`` answers it: a failed verification
    (``TRANSACTION_ABORTABLE``) is ``INVALID_TXN_STATE`` before v11, as Kafka's."""
    code = kafka_code(name)
    if code == _TRANSACTION_ABORTABLE and version < _FIRST_ABORTABLE_PRODUCE_VERSION:
        return _INVALID_TXN_STATE
    return code


_FIRST_PRODUCE_HINT_VERSION = 10
_FIRST_FETCH_HINT_VERSION = 16
_FIRST_TOPIC_ID_FETCH_VERSION = 13
_NOT_LEADER_OR_FOLLOWER = error_code_for("NOT_LEADER_OR_FOLLOWER")
_PRODUCE_HINTED = frozenset({_NOT_LEADER_OR_FOLLOWER})
_FETCH_HINTED = frozenset({_NOT_LEADER_OR_FOLLOWER, error_code_for("FENCED_LEADER_EPOCH")})
_UNKNOWN_TOPIC_ID = error_code_for("UNKNOWN_TOPIC_ID")
_UNKNOWN_TOPIC_OR_PARTITION = error_code_for("UNKNOWN_TOPIC_OR_PARTITION")


def _add_leader_hints(
    conn: Connection,
    answer: Plain,
    partitions: Sequence[tuple[str, Plain]],
    index_field: str,
    hinted: frozenset[int],
) -> None:
    """KIP-951: ``current_leader`` on each ``(topic, partition answer)`` whose error is
    in ``hinted``, and the leaders' endpoints in ``answer["node_endpoints"]``."""
    wrong = [(name, part) for name, part in partitions if part["error_code"] in hinted]
    if not wrong:
        return
    brokers, racks = conn.kafka_brokers(), conn.kafka_racks()
    nodes: dict[int, Plain] = {}
    for name, part in wrong:
        try:
            placement = conn.core.placement.partition(name, part[index_field])
        except Exception as exc:  # a broker still joining knows no placement yet
            log.debug("no leader hint for %s-%d: %r", name, part[index_field], exc)
            continue
        current, node = leader_hint(placement, brokers, racks)
        part["current_leader"] = current
        if node is not None:
            nodes[node["node_id"]] = node
    answer["node_endpoints"] = [nodes[node_id] for node_id in sorted(nodes)]


async def _append_and_answer(
    conn: Connection, parts: list[PartitionRecords], acks: Acks, version: int
) -> Plain | None:
    # Inline where the append cannot block (``ProducePath.append_inline``), the rest on
    # the thread pool, in request order.
    appends = conn.run_inline(conn.core.append_inline, parts)
    conn.listener.inline_appends += len(appends)
    if len(appends) < len(parts):
        rest = parts[len(appends) :]
        appends += await conn.run(conn.core.append, rest)
        conn.listener.pool_appends += len(rest)
    conn.mark_appended()  # a pipelined connection reads its next request now
    if acks != Acks.ALL:
        # acks 0/1: ``complete`` delivers on this thread before it returns (its
        # contract), so no future is made, resolved and awaited for it.
        delivered: list[list[PartitionProduced]] = []
        conn.core.complete(appends, acks, delivered.append)
        if acks == Acks.NONE:
            return None
        answers = delivered[0]
    else:
        bridge = conn.listener.pipeline.bridge
        answered: asyncio.Future[list[PartitionProduced]] = bridge.loop.create_future()
        # Delivered on the group fsync thread (or this one, when durable already),
        # through the pipeline's one bridge back to the loop: never blocks, never raises
        # into the fsync thread (the listener may have stopped meanwhile).
        conn.core.complete(appends, acks, bridge.resolver(answered))
        answers = await answered
    return _produce_response(
        [
            (
                a.topic,
                a.partition,
                {
                    "error_code": _produce_code(a.error_code, version),
                    "error_message": a.error_message or None,
                    "base_offset": a.base_offset,
                    "log_append_time": a.log_append_time_ms,
                    "log_start_offset": a.log_start_offset,
                },
            )
            for a in answers
        ]
    )


def _produce_response(parts: Sequence[tuple[str, int, Plain]]) -> Plain:
    by_topic: dict[str, list[Plain]] = {}
    for name, partition, values in parts:
        by_topic.setdefault(name, []).append(
            {"index": partition, "log_append_time": -1, "log_start_offset": -1, **values}
        )
    return {
        "responses": [
            {"name": name, "partition_responses": partitions}
            for name, partitions in by_topic.items()
        ]
    }


async def fetch(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """Fetch (v4-16): see the module docstring."""
    refuse = gate(conn)
    topics: list[Plain] = request["topics"]
    forgotten: list[Plain] = request.get("forgotten_topics_data") or []
    unknown_ids: list[Plain] = []
    by_id = header.api_version >= _FIRST_TOPIC_ID_FETCH_VERSION
    if by_id:
        names = await _topic_names(conn, [t["topic_id"] for t in topics + forgotten])
        unknown_ids = [
            {"topic_id": t["topic_id"], "partitions": [_unknown_id(p) for p in t["partitions"]]}
            for t in topics
            if t["topic_id"] not in names
        ]
        topics = [{**t, "topic": names[t["topic_id"]]} for t in topics if t["topic_id"] in names]
        forgotten = [
            {**t, "topic": names[t["topic_id"]]} for t in forgotten if t["topic_id"] in names
        ]
    updates = [
        Update(
            (t["topic"], p["partition"]),
            p["fetch_offset"],
            p.get("partition_max_bytes", 0),
            p.get("current_leader_epoch", -1),
        )
        for t in topics
        for p in t["partitions"]
    ]
    try:
        session, incremental = _session_of(conn, header, request, updates, forgotten)
    except SessionError as exc:
        return {"error_code": error_code_for(exc.code), "session_id": 0, "responses": []}
    wanted = (
        [
            Update(key, c.fetch_offset, c.max_bytes, c.current_leader_epoch)
            for key, c in session.partitions.items()
        ]
        if session is not None
        else updates
    )
    spec = FetchSpec(
        partitions=[
            PartitionFetchSpec(
                u.key[0],
                u.key[1],
                u.fetch_offset,
                u.max_bytes,
                u.current_leader_epoch,
                refused=refuse(u.key[0]),
            )
            for u in wanted
        ],
        max_wait_ms=max(request["max_wait"], 0),
        min_bytes=max(request["min_bytes"], 0),
        max_bytes=max(request.get("max_bytes", 0), 0),
        isolation_level=request.get("isolation_level", 0),
        # Plaintext connections send the records with sendfile (broker.kafka.listener).
        zero_copy=conn.settings.zero_copy_fetch and not conn.tls,
    )
    answers = await _fetch(conn, spec)
    conn.record_quota(CONSUMER_BYTE_RATE, sum(a.size for a in answers))
    by_topic: dict[str, list[Plain]] = {}
    for a in answered(session, answers, incremental):
        by_topic.setdefault(a.topic, []).append(_fetched(a))
    if by_id:
        await _unknown_topic_ids(conn, by_topic)
    answer: Plain = {
        "error_code": NONE,
        "session_id": session.session_id if session is not None else 0,
        "responses": [
            {"topic": name, "topic_id": topic_id(name), "partitions": partitions}
            for name, partitions in by_topic.items()
        ]
        + unknown_ids,
    }
    if header.api_version >= _FIRST_FETCH_HINT_VERSION:
        _add_leader_hints(
            conn,
            answer,
            [(name, p) for name, parts in by_topic.items() for p in parts],
            "partition_index",
            _FETCH_HINTED,
        )
    return answer


async def _topic_names(conn: Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The topics ``ids`` name (Fetch v13+), those known; the listener's cache is
    rebuilt from the topic list when one is missing (so a topic deleted since drops
    out)."""
    cache = conn.listener.topic_names
    if any(i not in cache for i in ids):
        listed = await conn.run(conn.core.list_topics, True)
        cache.clear()
        cache.update((topic_id(t.name), t.name) for t in listed)
    return {i: cache[i] for i in ids if i in cache}


async def _unknown_topic_ids(conn: Connection, by_topic: dict[str, list[Plain]]) -> None:
    """Fetch v13+: a topic named by an id that is no longer any topic's (deleted since
    the client learnt it) answers ``UNKNOWN_TOPIC_ID``, as Kafka; an unknown partition
    of a live topic stays ``UNKNOWN_TOPIC_OR_PARTITION``."""
    suspects = [
        name
        for name, parts in by_topic.items()
        if any(p["error_code"] == _UNKNOWN_TOPIC_OR_PARTITION for p in parts)
    ]
    if not suspects:
        return
    listed = await conn.run(conn.core.list_topics, True)
    live_names = {t.name for t in listed}
    for name in suspects:
        if name not in live_names:
            for p in by_topic[name]:
                if p["error_code"] == _UNKNOWN_TOPIC_OR_PARTITION:
                    p["error_code"] = _UNKNOWN_TOPIC_ID


def _unknown_id(p: Plain) -> Plain:
    return {
        "partition_index": p["partition"],
        "error_code": _UNKNOWN_TOPIC_ID,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        "aborted_transactions": None,
        "preferred_read_replica": -1,
        "records": None,
    }


def _session_of(
    conn: Connection,
    header: RequestHeader,
    request: Plain,
    updates: list[Update],
    forgotten_topics: list[Plain],
) -> tuple[FetchSession | None, bool]:
    """The fetch's session (None: a full fetch without one) and whether the fetch is
    incremental; raises ``SessionError`` for a session it may not use.
    ``forgotten_topics``: the request's, each with its topic's name."""
    if header.api_version < 7:
        return None, False
    return conn.listener.fetch_sessions.resolve(
        request.get("session_id", 0),
        request.get("session_epoch", FINAL_EPOCH),
        updates,
        lambda: [(t["topic"], p) for t in forgotten_topics for p in t["partitions"]],
    )


async def _fetch(conn: Connection, spec: FetchSpec) -> list[PartitionFetched]:
    """Read, or park until woken, as often as the core asks; no thread waits."""
    core = conn.core
    woken = asyncio.Event()
    # Woken from whichever thread completed the parked fetch (an append, the reaper),
    # through the pipeline's one bridge back to the loop.
    pending = core.start_fetch(spec, wake=conn.listener.pipeline.bridge.waker(woken))
    try:
        while True:
            woken.clear()
            answers = await conn.run(core.step_fetch, pending)
            if answers is not None:
                return answers
            await woken.wait()
    except BaseException:
        release(pending.last_answers)
        raise
    finally:
        core.cancel_fetch(pending)


def _fetched(a: PartitionFetched) -> Plain:
    return {
        "partition_index": a.partition,
        "error_code": kafka_code(a.error_code),
        "high_watermark": a.high_watermark,
        "last_stable_offset": a.last_stable_offset
        if a.last_stable_offset >= 0
        else a.high_watermark,
        "log_start_offset": a.log_start_offset,
        "aborted_transactions": (
            [{"producer_id": pid, "first_offset": first} for pid, first in a.aborted_transactions]
            if not a.error_code
            else None
        ),
        "preferred_read_replica": -1,
        # A region is encoded as its length and sent from the file (broker.kafka.codec).
        "records": a.region if a.region is not None else a.records,
    }


async def list_offsets(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """ListOffsets (v1-7): earliest, latest or by timestamp, per partition."""
    queries = [
        OffsetQuery(
            t["name"],
            p["partition_index"],
            p["timestamp"],
            p.get("current_leader_epoch", -1),
            read_committed=request.get("isolation_level", 0) == 1,
        )
        for t in request["topics"]
        for p in t["partitions"]
    ]
    decided = refusals(conn, [topic(t["name"]) for t in request["topics"]])
    refused = {resource.name: code for resource, code in decided.items() if code}
    answers = await conn.run(conn.core.list_offsets, [q for q in queries if q.topic not in refused])
    by_topic: dict[str, list[Plain]] = {}
    for q in queries:
        if q.topic in refused:
            by_topic.setdefault(q.topic, []).append(
                {
                    "partition_index": q.partition,
                    "error_code": refused[q.topic],
                    "timestamp": -1,
                    "offset": -1,
                    "leader_epoch": -1,
                }
            )
    for a in answers:
        by_topic.setdefault(a.topic, []).append(
            {
                "partition_index": a.partition,
                "error_code": kafka_code(a.error_code),
                "timestamp": a.timestamp_ms,
                "offset": a.offset,
                "leader_epoch": a.leader_epoch,
            }
        )
    return {"topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()]}


async def offset_for_leader_epoch(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """OffsetForLeaderEpoch (v2-4): per partition, the largest epoch <= the one asked for
    and where it ends on this leader; see the module docstring."""
    follower = request.get("replica_id", -1) >= 0
    refused: dict[str, int] = {}
    # A follower's CLUSTER_ACTION on the cluster refuses every topic; else DESCRIBE each.
    cluster_refused = denied(conn, cluster()) if follower else 0
    if cluster_refused:
        refused = {t["topic"]: cluster_refused for t in request["topics"]}
    else:
        decided = refusals(conn, [topic(t["topic"]) for t in request["topics"]])
        refused = {resource.name: code for resource, code in decided.items() if code}
    queries = [
        EpochQuery(t["topic"], p["partition"], p["leader_epoch"], p["current_leader_epoch"])
        for t in request["topics"]
        if t["topic"] not in refused
        for p in t["partitions"]
    ]
    answers = await conn.run(conn.core.offsets_for_leader_epochs, queries)
    by_topic: dict[str, list[Plain]] = {}
    for t in request["topics"]:
        if t["topic"] in refused:
            by_topic[t["topic"]] = [
                {
                    "partition": p["partition"],
                    "error_code": refused[t["topic"]],
                    "leader_epoch": -1,
                    "end_offset": -1,
                }
                for p in t["partitions"]
            ]
    for a in answers:
        by_topic.setdefault(a.topic, []).append(
            {
                "partition": a.partition,
                "error_code": kafka_code(a.error_code),
                "leader_epoch": a.leader_epoch,
                "end_offset": a.end_offset,
            }
        )
    return {"topics": [{"topic": name, "partitions": parts} for name, parts in by_topic.items()]}


async def init_producer_id(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """InitProducerId: a new idempotent producer id, or the epoch bumped (KIP-360).

    With a ``transactional_id`` it is the transaction coordinator's
    (``broker.kafka.transactions``).
    """
    if request.get("transactional_id") is not None:
        return await init_transactional_producer(conn, header, request)
    # IDEMPOTENT_WRITE on the cluster, or else WRITE on some topic (the policy table).
    refused = denied(conn, cluster())
    if refused:
        return {"error_code": refused, "producer_id": -1, "producer_epoch": -1}
    try:
        producer_id, epoch = await conn.run(
            conn.core.init_producer_id,
            request.get("producer_id", -1),
            request.get("producer_epoch", -1),
        )
    except Exception as exc:
        code, _ = kafka_error(exc)
        return {"error_code": code, "producer_id": -1, "producer_epoch": -1}
    return {"error_code": NONE, "producer_id": producer_id, "producer_epoch": epoch}


async def describe_producers(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """DescribeProducers (v0): per partition, its leader's idempotent producers; see the
    module docstring."""
    decided = refusals(conn, [topic(t["name"]) for t in request["topics"]])
    refused = {resource.name: code for resource, code in decided.items() if code}
    wanted = [
        (t["name"], p)
        for t in request["topics"]
        if t["name"] not in refused
        for p in t["partition_indexes"]
    ]
    answers = await conn.run(conn.core.describe_producers, wanted, None) if wanted else []
    by_topic: dict[str, list[Plain]] = {}
    for t in request["topics"]:
        if t["name"] in refused:
            by_topic.setdefault(t["name"], []).extend(
                {
                    "partition_index": p,
                    "error_code": refused[t["name"]],
                    "error_message": None,
                    "active_producers": [],
                }
                for p in t["partition_indexes"]
            )
    for a in answers:
        by_topic.setdefault(a.topic, []).append(
            {
                "partition_index": a.partition,
                "error_code": kafka_code(a.error_code),
                "error_message": a.error_message or None,
                "active_producers": [
                    {
                        "producer_id": p.producer_id,
                        "producer_epoch": p.epoch,
                        "last_sequence": p.last_sequence,
                        "last_timestamp": p.last_timestamp_ms,
                        "coordinator_epoch": p.coordinator_epoch,
                        "current_txn_start_offset": p.current_txn_start_offset,
                    }
                    for p in a.producers
                ],
            }
        )
    return {"topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()]}
