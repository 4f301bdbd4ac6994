"""The transaction coordinator's APIs on the Kafka listener: InitProducerId with a
transactional id, AddPartitionsToTxn (v0-3 the clients' form, v4-5 the brokers' batched
form), AddOffsetsToTxn, EndTxn (v5: transactions v2), TxnOffsetCommit (v5: transactions
v2), DescribeTransactions and ListTransactions, over ``broker.transactions.coordinator``
(``docs/transactions.md``).

Authorization (the policy table): WRITE on the transactional id for InitProducerId,
AddPartitionsToTxn v0-3 and EndTxn, and WRITE on each topic added; CLUSTER_ACTION on the
cluster for AddPartitionsToTxn v4+ (a broker's request); DESCRIBE on each id described;
ListTransactions lists the ids the caller may describe, silently filtered.

Errors as Kafka's ``KafkaApis`` answers them: ``PRODUCER_FENCED`` (90) is
``INVALID_PRODUCER_EPOCH`` (47) for the request versions that predate it (InitProducerId
< 4, AddPartitionsToTxn and EndTxn < 2), which the clients of those versions treat the
same way (fatal); ``TRANSACTION_ABORTABLE`` (120) is ``INVALID_TXN_STATE`` (48) for
AddPartitionsToTxn < 5 and TxnOffsetCommit < 4. AddPartitionsToTxn answers every
partition: when some are refused (authorization) or unknown, those carry their error and
the others ``OPERATION_NOT_ATTEMPTED``; otherwise every partition carries the
coordinator's one answer. In a cluster each broker coordinates the ids of the
``__transaction_state`` partitions it leads; the others are ``NOT_COORDINATOR``
(``COORDINATOR_LOAD_IN_PROGRESS`` while it loads them), and the clients find the right
one again (FindCoordinator).

AddOffsetsToTxn (READ on the group too) adds the group's ``__consumer_offsets`` partition;
TxnOffsetCommit (sent to the group's coordinator) stores offsets pending in the
transaction until its marker (``broker.groups.txn_offsets``).

Transactions v2 (KIP-890 part 2) is the client's choice, per request, as Kafka's: a
client that read ``transaction.version`` 2 from ApiVersions (``broker.kafka.versions``)
sends no AddPartitionsToTxn or AddOffsetsToTxn (its Produce v12 and TxnOffsetCommit v5
add the partitions implicitly) and ends with EndTxn v5, which bumps its epoch; every
other client keeps the v1 protocol against the same coordinator.

WriteTxnMarkers (between brokers) is ``broker.kafka.txn_markers``. Not served yet (not
advertised): InitProducerId v6 (KIP-939's two-phase commit, unshipped in Kafka).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence

from tidelog.broker.core.operations import cluster, group, topic, transactional_id
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC
from tidelog.broker.kafka.authz import denied, refusals, visible
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_code, kafka_error
from tidelog.broker.kafka.groups import classic_error_code, not_coordinator
from tidelog.broker.kafka.listener import Connection
from tidelog.broker.kafka.offsets import commit_answer, commit_entries
from tidelog.broker.transactions.coordinator import TransactionCoordinator
from tidelog.broker.transactions.state import TRANSACTIONS_V2, TxnMetadata
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
_FIRST_BROKER_ADD_VERSION = 4  # AddPartitionsToTxn v4+: the brokers' batched form
_FIRST_ABORTABLE_ADD_VERSION = 5  # v5 may answer TRANSACTION_ABORTABLE
_FIRST_V2_END_TXN_VERSION = 5  # EndTxn v5: transactions v2
_FIRST_ABORTABLE_OFFSETS_VERSION = 4  # TxnOffsetCommit v4 may answer TRANSACTION_ABORTABLE
_FIRST_V2_OFFSETS_VERSION = 5  # TxnOffsetCommit v5: the offsets partition joins implicitly
# How long TxnOffsetCommit v5 waits out CONCURRENT_TRANSACTIONS from its implicit add (the
# previous transaction's markers still being written), as Kafka's broker retries it
# (KAFKA-18654) instead of bouncing it to the client.
_ADD_RETRY_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


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
    """AddPartitionsToTxn: v0-3 a client's partitions join its transaction; v4+ the
    brokers' batched form (``add_partitions_for_brokers``)."""
    if header.api_version >= _FIRST_BROKER_ADD_VERSION:
        return await add_partitions_for_brokers(conn, header, request)
    tid = request["v3_and_below_transactional_id"]
    topics = request["v3_and_below_topics"]
    wanted = [(t["name"], p) for t in topics for p in t["partitions"]]
    id_refused = denied(conn, transactional_id(tid))
    if id_refused:
        codes = dict.fromkeys(wanted, id_refused)
    else:
        refused = refusals(conn, [topic(n) for n in sorted({name for name, _ in wanted})])
        codes = await _added(
            conn,
            tid,
            request["v3_and_below_producer_id"],
            request["v3_and_below_producer_epoch"],
            wanted,
            {r.name: code for r, code in refused.items()},
            header.api_version,
        )
    return {"results_by_topic_v3_and_below": _by_topic(codes)}


async def _added(
    conn: Connection,
    tid: str,
    producer_id: int,
    epoch: int,
    wanted: Sequence[tuple[str, int]],
    refused: Mapping[str, int],
    version: int,
) -> dict[tuple[str, int], int]:
    """Add ``wanted`` to ``tid``'s transaction: per partition its code. When some are
    refused (``refused``: topic -> authorization code) or unknown, those carry their error
    and the others ``OPERATION_NOT_ATTEMPTED``; otherwise each carries the coordinator's
    one answer."""
    codes = dict.fromkeys(wanted, NONE)
    names = sorted({name for name, _ in wanted})
    counts = await conn.run(_partition_counts, conn, names)
    for name, index in wanted:
        code = refused.get(name, NONE)
        if not code and not 0 <= index < counts[name]:
            code = error_code_for(UnknownTopicOrPartitionError.code)
        codes[(name, index)] = code
    if any(codes.values()):
        not_attempted = error_code_for("OPERATION_NOT_ATTEMPTED")
        return {tp: code or not_attempted for tp, code in codes.items()}
    try:
        await conn.run(_coordinator(conn).add_partitions, tid, producer_id, epoch, wanted)
    except Exception as exc:
        return dict.fromkeys(wanted, _code(exc, version, 2))
    return codes


def _by_topic(codes: Mapping[tuple[str, int], int]) -> list[Plain]:
    by_topic: dict[str, list[Plain]] = {}
    for (name, index), code in codes.items():
        by_topic.setdefault(name, []).append(
            {"partition_index": index, "partition_error_code": code}
        )
    return [{"name": name, "results_by_partition": results} for name, results in by_topic.items()]


async def add_partitions_for_brokers(
    conn: Connection, header: RequestHeader, request: Plain
) -> Plain:
    """AddPartitionsToTxn v4-5, sent by partition leaders (KIP-890): many transactional
    ids per request, each answered by itself. ``verify_only`` asks whether the partitions
    are in the id's ongoing transaction (part 1: per partition ``NONE`` or
    ``TRANSACTION_ABORTABLE``, which v4 spells ``INVALID_TXN_STATE``); without it the
    partitions are added (part 2: a transactions v2 producer's Produce v12 or
    TxnOffsetCommit v5 reached a partition its transaction did not hold yet). Needs
    CLUSTER_ACTION on the cluster (top-level ``CLUSTER_AUTHORIZATION_FAILED``, as
    Kafka's): a broker's request, not a client's."""
    refused = denied(conn, cluster())
    if refused:
        return {"error_code": refused, "results_by_transaction": []}
    results = []
    for txn in request["transactions"]:
        wanted = [(t["name"], p) for t in txn["topics"] for p in t["partitions"]]
        tid, pid, epoch = txn["transactional_id"], txn["producer_id"], txn["producer_epoch"]
        if txn["verify_only"]:
            codes = await _verified(conn, tid, pid, epoch, wanted, header.api_version)
        else:
            codes = await _added(conn, tid, pid, epoch, wanted, {}, header.api_version)
        results.append({"transactional_id": tid, "topic_results": _by_topic(codes)})
    return {"error_code": NONE, "results_by_transaction": results}


async def _verified(
    conn: Connection,
    tid: str,
    producer_id: int,
    epoch: int,
    wanted: Sequence[tuple[str, int]],
    version: int,
) -> dict[tuple[str, int], int]:
    try:
        names = await conn.run(
            _coordinator(conn).verify_partitions, tid, producer_id, epoch, wanted
        )
    except Exception as exc:
        return dict.fromkeys(wanted, _code(exc, version, 2))
    abortable = error_code_for("TRANSACTION_ABORTABLE")
    codes = {}
    for tp in wanted:
        code = error_code_for(names[tp]) if names[tp] else NONE
        if code == abortable and version < _FIRST_ABORTABLE_ADD_VERSION:
            code = error_code_for("INVALID_TXN_STATE")
        codes[tp] = code
    return codes


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
    """EndTxn v0-5: commit or abort; answered once the decision is durable (the markers
    follow, ``broker.transactions.coordinator``). v5 is transactions v2 (KIP-890 part 2):
    the epoch is bumped at every commit or abort, and the answer names the producer id
    and epoch the producer continues with (a new id once the epoch is exhausted)."""
    tid = request["transactional_id"]
    failed = {"producer_id": -1, "producer_epoch": -1}
    refused = denied(conn, transactional_id(tid))
    if refused:
        return {"error_code": refused, **failed}
    v2 = header.api_version >= _FIRST_V2_END_TXN_VERSION
    try:
        producer_id, epoch = await conn.run(
            functools.partial(
                _coordinator(conn).end_transaction,
                tid,
                request["producer_id"],
                request["producer_epoch"],
                bool(request["committed"]),
                client_version=TRANSACTIONS_V2 if v2 else 0,
            )
        )
    except Exception as exc:
        return {"error_code": _code(exc, header.api_version, 2), **failed}
    return {"error_code": NONE, "producer_id": producer_id, "producer_epoch": epoch}


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
    """TxnOffsetCommit v0-5, sent to the group's coordinator: the offsets, pending in the
    producer's transaction until its marker (``broker.groups.txn_offsets``). The group's
    partition must be in that transaction (v0-4: AddOffsetsToTxn, verified with the
    transaction coordinator: ``INVALID_TXN_STATE``, v4 ``TRANSACTION_ABORTABLE``,
    otherwise; v5, transactions v2: added to it here); v3's member and generation
    (KIP-447) are checked as a classic OffsetCommit's, fencing a zombie consumer's
    producer."""
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
        verified = await _offsets_partition_checked(
            conn, tid, pid, epoch, offsets_partition, header.api_version
        )
        if verified == "PRODUCER_FENCED":
            error = error_code_for("INVALID_PRODUCER_EPOCH")
        elif verified and header.api_version >= _FIRST_ABORTABLE_OFFSETS_VERSION:
            error = error_code_for(
                verified if verified == "CONCURRENT_TRANSACTIONS" else "TRANSACTION_ABORTABLE"
            )
        elif verified:
            error = error_code_for("INVALID_TXN_STATE")
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


async def _offsets_partition_checked(
    conn: Connection, tid: str, pid: int, epoch: int, tp: tuple[str, int], version: int
) -> str:
    """TxnOffsetCommit's check of the group's offsets partition: verified to be in the
    transaction (v0-4: AddOffsetsToTxn added it), or added now (v5, transactions v2: no
    AddOffsetsToTxn is sent), retrying ``CONCURRENT_TRANSACTIONS`` for a short while.
    ``""`` or Kafka's error name."""
    # Asked of the id's coordinator wherever it is (a cluster: maybe another broker).
    if version < _FIRST_V2_OFFSETS_VERSION:
        return str(await conn.run(conn.core.verify_transactional, tid, pid, epoch, tp))
    answer = ""
    for pause in (*_ADD_RETRY_S, None):
        answer = await conn.run(conn.core.add_transactional, tid, pid, epoch, tp)
        if answer != "CONCURRENT_TRANSACTIONS" or pause is None:
            break
        await asyncio.sleep(pause)
    return answer
