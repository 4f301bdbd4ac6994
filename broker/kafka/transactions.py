"""The transaction coordinator's APIs on the Kafka listener: InitProducerId with a
transactional id, AddPartitionsToTxn (v0-3, the clients' form), EndTxn, DescribeTransactions
and ListTransactions, over ``broker.transactions.coordinator`` (``docs/transactions.md``).

Authorization (the policy table): WRITE on the transactional id for InitProducerId,
AddPartitionsToTxn and EndTxn, and WRITE on each topic added; DESCRIBE on each id
described; ListTransactions lists the ids the caller may describe, silently filtered.

Errors as Kafka's ``KafkaApis`` answers them: ``PRODUCER_FENCED`` (90) is
``INVALID_PRODUCER_EPOCH`` (47) for the request versions that predate it (InitProducerId
< 4, AddPartitionsToTxn and EndTxn < 2), which the clients of those versions treat the
same way (fatal). AddPartitionsToTxn answers every partition: when some are refused
(authorization) or unknown, those carry their error and the others
``OPERATION_NOT_ATTEMPTED``; otherwise every partition carries the coordinator's one
answer. In a cluster each broker coordinates the ids of the ``__transaction_state``
partitions it leads; the others are ``NOT_COORDINATOR`` (``COORDINATOR_LOAD_IN_PROGRESS``
while it loads them), and the clients find the right one again (FindCoordinator).

AddOffsetsToTxn (READ on the group too) adds the group's ``__consumer_offsets`` partition;
TxnOffsetCommit (sent to the group's coordinator) stores offsets pending in the
transaction until its marker (``broker.groups.txn_offsets``).

WriteTxnMarkers (between brokers) is ``broker.kafka.txn_markers``. Not served yet (not
advertised): AddPartitionsToTxn v4+ (brokers' verification, KIP-890), EndTxn v5 and
TxnOffsetCommit v5 (transactions v2).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from tidelog.broker.core.operations import group, topic, transactional_id
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC
from tidelog.broker.kafka.authz import denied, refusals, visible
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_code, kafka_error
from tidelog.broker.kafka.groups import classic_error_code, not_coordinator
from tidelog.broker.kafka.listener import Connection
from tidelog.broker.kafka.offsets import commit_answer, commit_entries
from tidelog.broker.transactions.coordinator import TransactionCoordinator
from tidelog.broker.transactions.state import TxnMetadata
from tidelog.storage.errors import CoordinatorNotAvailableError, UnknownTopicOrPartitionError

__all__ = [
    "add_offsets_to_txn",
    "add_partitions_to_txn",
    "describe_transactions",
    "end_txn",
    "init_transactional_producer",
    "list_transactions",
    "txn_offset_commit",
]

_FENCED = error_code_for("PRODUCER_FENCED")
_OLD_FENCED = error_code_for("INVALID_PRODUCER_EPOCH")


def _coordinator(conn: Connection) -> TransactionCoordinator:
    found = conn.core.transactions
    if found is None:  # a core built without one (tests of other layers)
        raise CoordinatorNotAvailableError("this broker has no transaction coordinator")
    return found


def _code(exc: BaseException, version: int, fenced_since: int) -> int:
    """Kafka's number for ``exc``, PRODUCER_FENCED as the old versions spell it."""
    code, _ = kafka_error(exc)
    return _OLD_FENCED if code == _FENCED and version < fenced_since else code


async def init_transactional_producer(
    conn: Connection, header: RequestHeader, request: Plain
) -> Plain:
    """InitProducerId with a ``transactional_id``: the id's producer id and a bumped epoch
    (older instances fenced); ``CONCURRENT_TRANSACTIONS`` while its last transaction is
    being aborted or completed (the client retries)."""
    tid = request["transactional_id"]
    failed = {"producer_id": -1, "producer_epoch": -1}
    refused = denied(conn, transactional_id(tid), operation="init_transactions")
    if refused:
        return {"error_code": refused, **failed}
    try:
        producer_id, epoch = await conn.run(
            functools.partial(
                _coordinator(conn).init_producer_id,
                tid,
                request["transaction_timeout"],
                expected_producer_id=request.get("producer_id", -1),
                expected_epoch=request.get("producer_epoch", -1),
            )
        )
    except Exception as exc:
        return {"error_code": _code(exc, header.api_version, 4), **failed}
    return {"error_code": NONE, "producer_id": producer_id, "producer_epoch": epoch}


async def add_partitions_to_txn(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """AddPartitionsToTxn v0-3: the partitions join the producer's transaction."""
    tid = request["v3_and_below_transactional_id"]
    topics = request["v3_and_below_topics"]
    wanted = [(t["name"], p) for t in topics for p in t["partitions"]]
    codes = dict.fromkeys(wanted, NONE)
    id_refused = denied(conn, transactional_id(tid))
    if id_refused:
        codes = dict.fromkeys(wanted, id_refused)
    else:
        names = sorted({name for name, _ in wanted})
        refused = refusals(conn, [topic(n) for n in names])
        counts = await conn.run(_partition_counts, conn, names)
        for name, index in wanted:
            code = refused[topic(name)]
            if not code and not 0 <= index < counts[name]:
                code = error_code_for(UnknownTopicOrPartitionError.code)
            codes[(name, index)] = code
        if any(codes.values()):
            not_attempted = error_code_for("OPERATION_NOT_ATTEMPTED")
            codes = {tp: code or not_attempted for tp, code in codes.items()}
        else:
            try:
                await conn.run(
                    _coordinator(conn).add_partitions,
                    tid,
                    request["v3_and_below_producer_id"],
                    request["v3_and_below_producer_epoch"],
                    wanted,
                )
            except Exception as exc:
                codes = dict.fromkeys(wanted, _code(exc, header.api_version, 2))
    by_topic: dict[str, list[Plain]] = {}
    for (name, index), code in codes.items():
        by_topic.setdefault(name, []).append(
            {"partition_index": index, "partition_error_code": code}
        )
    return {
        "results_by_topic_v3_and_below": [
            {"name": name, "results_by_partition": results} for name, results in by_topic.items()
        ]
    }


def _partition_counts(conn: Connection, names: Sequence[str]) -> dict[str, int]:
    """Each topic's partition count as this broker sees it (0: unknown)."""
    core = conn.core
    known = core.placement.topics()
    out = {}
    for name in names:
        if known is not None:
            out[name] = known.get(name, 0)
            continue
        try:
            out[name] = core.logs.topic(name).partitions
        except UnknownTopicOrPartitionError:
            out[name] = 0
    return out


async def end_txn(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """EndTxn v0-3: commit or abort; answered once the decision is durable (the markers
    follow, ``broker.transactions.coordinator``)."""
    tid = request["transactional_id"]
    refused = denied(conn, transactional_id(tid))
    if refused:
        return {"error_code": refused}
    try:
        await conn.run(
            _coordinator(conn).end_transaction,
            tid,
            request["producer_id"],
            request["producer_epoch"],
            bool(request["committed"]),
        )
    except Exception as exc:
        return {"error_code": _code(exc, header.api_version, 2)}
    return {"error_code": NONE}


async def describe_transactions(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """DescribeTransactions v0: each id's state, or ``TRANSACTIONAL_ID_NOT_FOUND``."""
    ids = list(request["transactional_ids"])
    refused = refusals(conn, [transactional_id(t) for t in ids])
    allowed = [t for t in ids if not refused[transactional_id(t)]]
    try:
        found = await conn.run(_coordinator(conn).describe, allowed) if allowed else {}
    except Exception as exc:
        code, _ = kafka_error(exc)
        found = {}
        refused = {transactional_id(t): refused[transactional_id(t)] or code for t in ids}
    states = []
    for tid in ids:
        answer = found.get(tid)
        code = refused[transactional_id(tid)]
        if isinstance(answer, BaseException):
            code, _ = kafka_error(answer)
        states.append(_described(tid, code, answer if isinstance(answer, TxnMetadata) else None))
    return {"transaction_states": states}


def _described(tid: str, code: int, metadata: TxnMetadata | None) -> Plain:
    if metadata is None:
        return {
            "error_code": code,
            "transactional_id": tid,
            "transaction_state": "",
            "producer_id": -1,
            "producer_epoch": -1,
            "transaction_start_time": -1,
            "topics": [],
        }
    by_topic: dict[str, list[int]] = {}
    for name, index in sorted(metadata.partitions):
        by_topic.setdefault(name, []).append(index)
    return {
        "error_code": NONE,
        "transactional_id": tid,
        "transaction_state": metadata.state.kafka_name,
        "transaction_timeout": metadata.timeout_ms,
        "transaction_start_time": metadata.start_ms,
        "producer_id": metadata.producer_id,
        "producer_epoch": metadata.producer_epoch,
        "topics": [{"topic": name, "partitions": parts} for name, parts in by_topic.items()],
    }


async def list_transactions(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """ListTransactions v0-1: the ids this broker coordinates, filtered by state, producer
    id and (v1, KIP-994) duration; unknown state names are echoed back."""
    states = list(request.get("state_filters") or [])
    known = {"Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit"}
    known |= {"CompleteAbort", "PrepareEpochFence", "Dead"}
    if states and not any(s in known for s in states):  # asked only for unknown states
        return {"error_code": NONE, "unknown_state_filters": states, "transaction_states": []}
    try:
        found = await conn.run(
            _coordinator(conn).list_transactions,
            [s for s in states if s in known],
            list(request.get("producer_id_filters") or []),
            request.get("duration_filter", -1),
        )
    except Exception as exc:
        code, _ = kafka_error(exc)
        return {"error_code": code, "unknown_state_filters": [], "transaction_states": []}
    shown = set(visible(conn, [m.transactional_id for m in found]))
    return {
        "error_code": NONE,
        "unknown_state_filters": [s for s in states if s not in known],
        "transaction_states": [
            {
                "transactional_id": m.transactional_id,
                "producer_id": m.producer_id,
                "transaction_state": m.state.kafka_name,
            }
            for m in found
            if m.transactional_id in shown
        ],
    }


async def add_offsets_to_txn(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """AddOffsetsToTxn v0-3: the group's ``__consumer_offsets`` partition joins the
    transaction (WRITE on the id, READ on the group)."""
    tid = request["transactional_id"]
    group_id = request["group_id"]
    decided = refusals(conn, [transactional_id(tid), group(group_id)], whole=True)
    refused = next((code for code in decided.values() if code), 0)
    if refused:
        return {"error_code": refused}
    try:
        await conn.run(
            _coordinator(conn).add_offsets,
            tid,
            request["producer_id"],
            request["producer_epoch"],
            group_id,
        )
    except Exception as exc:
        return {"error_code": _code(exc, header.api_version, 2)}
    return {"error_code": NONE}


async def txn_offset_commit(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """TxnOffsetCommit v0-3, sent to the group's coordinator: the offsets, pending in the
    producer's transaction until its marker (``broker.groups.txn_offsets``). The group's
    partition must be in that transaction (AddOffsetsToTxn, verified with the transaction
    coordinator: ``INVALID_TXN_STATE`` otherwise); v3's member and generation (KIP-447) are
    checked as a classic OffsetCommit's, fencing a zombie consumer's producer."""
    tid = request["transactional_id"]
    group_id = request["group_id"]
    topics = request["topics"]
    decided = refusals(
        conn,
        [transactional_id(tid), group(group_id), *(topic(t["name"]) for t in topics)],
        whole=True,
    )
    error = next((code for code in decided.values() if code), 0)
    pid, epoch = request["producer_id"], request["producer_epoch"]
    member_id = request.get("member_id") or ""
    generation = request.get("generation_id", -1)
    if not error:
        error = await not_coordinator(conn, group_id)
    if not error and (member_id or generation >= 0):
        classic = conn.core.groups.classic
        error = classic_error_code(
            classic.check_commit(group_id, member_id, generation, request.get("group_instance_id"))
        )
    if not error:
        offsets_partition = (OFFSETS_TOPIC, conn.core.groups.store.partition_for(group_id))
        # Asked of the id's coordinator wherever it is (a cluster: maybe another broker).
        verified = await conn.run(
            conn.core.verify_transactional, tid, pid, epoch, offsets_partition
        )
        if verified:
            error = error_code_for(
                "INVALID_PRODUCER_EPOCH" if verified == "PRODUCER_FENCED" else "INVALID_TXN_STATE"
            )
    codes: list[int] = []
    if not error:
        entries = commit_entries(topics)
        try:
            results = await conn.run(
                conn.core.commit_transactional_offsets, group_id, pid, epoch, entries
            )
        except Exception as exc:
            error, _ = kafka_error(exc)
        else:
            codes = [kafka_code(r.error_code) for r in results]
    return commit_answer(topics, error, codes)
