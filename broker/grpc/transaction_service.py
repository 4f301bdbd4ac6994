"""The gRPC handlers of transactions (issue #28): InitTransactions (Kafka's InitProducerId
with a transactional id), AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit,
DescribeTransactions and ListTransactions, over the same transaction coordinator
(``broker.transactions.coordinator``) and group coordinator the Kafka listener's handlers
(``broker.kafka.transactions``) call.

Plain functions ``(core, request, context) -> response`` in ``broker.grpc.service``'s
table. Each RPC is one neutral operation of ``broker.core.operations`` (the same names
as the Kafka APIs': ``init_transactions``, ``add_partitions_to_txn``, ...), authorized
by the request pipeline before the handler runs (the resources are in
``broker.grpc.authorize``): WRITE on the transactional id, WRITE on each topic added,
READ on the group and its topics for offsets, DESCRIBE on each id described;
ListTransactions leaves out, silently, the ids the caller may not describe.

Decisions where gRPC differs from Kafka's wire, as every other gRPC call:

- A call's error travels as the status and its code string (``PRODUCER_FENCED``,
  ``CONCURRENT_TRANSACTIONS``, ``INVALID_TXN_STATE``, ``NOT_COORDINATOR``...), and a
  refused resource refuses the whole call. AddPartitionsToTxn is all or nothing as on
  the Kafka listener (Kafka answers the others ``OPERATION_NOT_ATTEMPTED``): a partition
  that does not exist refuses the call with ``UNKNOWN_TOPIC_OR_PARTITION``.
- ``PRODUCER_FENCED`` is always spelled so (no request versions to keep compatible).
- TxnOffsetCommit's member check (KIP-447) is against the group's KIP-848 membership,
  the only kind the gRPC listener serves: a member id that is not in the group is
  ``UNKNOWN_MEMBER_ID``, a generation that is not the member's epoch
  ``STALE_MEMBER_EPOCH``; an empty member id commits without a member check (Kafka's
  ``ConsumerGroupMetadata(groupId)``). The group's ``__consumer_offsets`` partition must be
  in the transaction (AddOffsetsToTxn first): ``INVALID_TXN_STATE`` otherwise.
- In a cluster each broker coordinates the ids of the ``__transaction_state`` partitions
  it leads (``NOT_COORDINATOR`` elsewhere, as the Kafka listener answers); TxnOffsetCommit
  asks the id's coordinator wherever it is (``BrokerCore.verify_transactional``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tidelog.broker.core.acl_store import Acls
from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.core.operations import visible
from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.manager import OffsetCommitEntry
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC
from tidelog.broker.transactions.coordinator import TransactionCoordinator
from tidelog.broker.transactions.state import TxnMetadata
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import (
    CoordinatorNotAvailableError,
    InvalidTxnStateError,
    TidelogError,
    UnknownTopicOrPartitionError,
    error_for_code,
)

__all__ = ["TRANSACTION_HANDLERS", "filter_transactions"]

_STATES = frozenset(
    {
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "PrepareEpochFence",
        "Dead",
    }
)


def _coordinator(core: BrokerCore) -> TransactionCoordinator:
    found = core.transactions
    if found is None:  # a core built without one (tests of other layers)
        raise CoordinatorNotAvailableError("this broker has no transaction coordinator")
    return found


def _init_transactions(
    core: BrokerCore, request: pb.InitTransactionsRequest, context: RequestContext
) -> pb.InitTransactionsResponse:
    producer_id, epoch = _coordinator(core).init_producer_id(
        request.transactional_id,
        request.transaction_timeout_ms,
        expected_producer_id=request.producer_id if request.HasField("producer_id") else -1,
        expected_epoch=request.producer_epoch if request.HasField("producer_epoch") else -1,
    )
    return pb.InitTransactionsResponse(producer_id=producer_id, producer_epoch=epoch)


def _add_partitions_to_txn(
    core: BrokerCore, request: pb.AddPartitionsToTxnRequest, context: RequestContext
) -> pb.AddPartitionsToTxnResponse:
    wanted = [(t.topic, p) for t in request.partitions for p in t.partitions]
    counts = _partition_counts(core, sorted({name for name, _ in wanted}))
    for name, index in wanted:
        if not 0 <= index < counts[name]:
            raise UnknownTopicOrPartitionError(f"no partition {name}-{index}")
    _coordinator(core).add_partitions(
        request.transactional_id, request.producer_id, request.producer_epoch, wanted
    )
    return pb.AddPartitionsToTxnResponse()


def _partition_counts(core: BrokerCore, names: Sequence[str]) -> dict[str, int]:
    """Each topic's partition count as this broker sees it (0: unknown)."""
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


def _add_offsets_to_txn(
    core: BrokerCore, request: pb.AddOffsetsToTxnRequest, context: RequestContext
) -> pb.AddOffsetsToTxnResponse:
    _coordinator(core).add_offsets(
        request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
    )
    return pb.AddOffsetsToTxnResponse()


def _end_txn(
    core: BrokerCore, request: pb.EndTxnRequest, context: RequestContext
) -> pb.EndTxnResponse:
    _coordinator(core).end_transaction(
        request.transactional_id, request.producer_id, request.producer_epoch, request.commit
    )
    return pb.EndTxnResponse()


def _txn_offset_commit(
    core: BrokerCore, request: pb.TxnOffsetCommitRequest, context: RequestContext
) -> pb.TxnOffsetCommitResponse:
    group_id = request.group_id
    pid, epoch = request.producer_id, request.producer_epoch
    if request.member_id:
        core.groups.check_member(group_id, request.member_id, request.generation_id)
    offsets_partition = (OFFSETS_TOPIC, core.groups.store.partition_for(group_id))
    # Asked of the id's coordinator wherever it is (a cluster: maybe another broker).
    verified = core.verify_transactional(request.transactional_id, pid, epoch, offsets_partition)
    if verified == "TRANSACTION_ABORTABLE":
        raise InvalidTxnStateError(
            f"{OFFSETS_TOPIC}-{offsets_partition[1]} (group {group_id!r}) is not in the "
            f"transaction of {request.transactional_id!r}: AddOffsetsToTxn first"
        )
    if verified:  # PRODUCER_FENCED, CONCURRENT_TRANSACTIONS, NOT_COORDINATOR...
        raise error_for_code(
            verified, f"producer {pid} epoch {epoch} of {request.transactional_id!r}"
        )
    entries = [
        OffsetCommitEntry(
            TopicPartition(o.topic, o.partition),
            o.offset,
            o.metadata,
            o.leader_epoch if o.HasField("leader_epoch") else -1,
        )
        for o in request.offsets
    ]
    results = core.commit_transactional_offsets(group_id, pid, epoch, entries)
    return pb.TxnOffsetCommitResponse(
        results=[
            pb.CommittedOffset(
                topic=r.tp.topic,
                partition=r.tp.partition,
                offset=r.offset,
                metadata=r.metadata,
                error_code=r.error_code,
                error_message=r.error_message,
                leader_epoch=r.leader_epoch,
            )
            for r in results
        ]
    )


def _describe_transactions(
    core: BrokerCore, request: pb.DescribeTransactionsRequest, context: RequestContext
) -> pb.DescribeTransactionsResponse:
    ids = list(dict.fromkeys(request.transactional_ids))
    found = _coordinator(core).describe(ids)
    broker_id = core.config.broker_id
    out = []
    for tid in ids:
        answer = found.get(tid)
        if isinstance(answer, TxnMetadata):
            out.append(_described(answer, broker_id))
        else:
            code = answer.code if isinstance(answer, TidelogError) else "UNKNOWN_SERVER_ERROR"
            out.append(
                pb.TransactionDescription(
                    transactional_id=tid,
                    error_code=code,
                    error_message=str(answer),
                    producer_id=-1,
                    producer_epoch=-1,
                    transaction_start_time_ms=-1,
                    coordinator_id=broker_id,
                )
            )
    return pb.DescribeTransactionsResponse(transactions=out)


def _described(metadata: TxnMetadata, broker_id: int) -> pb.TransactionDescription:
    by_topic: dict[str, list[int]] = {}
    for name, index in sorted(metadata.partitions):
        by_topic.setdefault(name, []).append(index)
    return pb.TransactionDescription(
        transactional_id=metadata.transactional_id,
        state=metadata.state.kafka_name,
        producer_id=metadata.producer_id,
        producer_epoch=metadata.producer_epoch,
        transaction_timeout_ms=metadata.timeout_ms,
        transaction_start_time_ms=metadata.start_ms,
        topics=[pb.TransactionTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
        coordinator_id=broker_id,
    )


def _list_transactions(
    core: BrokerCore, request: pb.ListTransactionsRequest, context: RequestContext
) -> pb.ListTransactionsResponse:
    states = list(request.state_filters)
    unknown = [s for s in states if s not in _STATES]
    if states and len(unknown) == len(states):  # only unknown states: nothing matches
        return pb.ListTransactionsResponse(unknown_state_filters=unknown)
    found = _coordinator(core).list_transactions(
        [s for s in states if s in _STATES],
        list(request.producer_id_filters),
        request.duration_filter_ms if request.duration_filter_ms > 0 else -1,
    )
    broker_id = core.config.broker_id
    return pb.ListTransactionsResponse(
        transactions=[
            pb.TransactionListing(
                transactional_id=m.transactional_id,
                producer_id=m.producer_id,
                state=m.state.kafka_name,
                coordinator_id=broker_id,
            )
            for m in found
        ],
        unknown_state_filters=unknown,
    )


def filter_transactions(
    acls: Acls, response: pb.ListTransactionsResponse, context: RequestContext
) -> pb.ListTransactionsResponse:
    """ListTransactions: leave out, silently, the ids the caller may not describe."""
    if not acls.enabled:
        return response
    names = [t.transactional_id for t in response.transactions]
    shown = set(visible(acls, context, "list_transactions", names))
    kept = [t for t in response.transactions if t.transactional_id in shown]
    del response.transactions[:]
    response.transactions.extend(kept)
    return response


TRANSACTION_HANDLERS: dict[str, Callable[[BrokerCore, Any, RequestContext], Any]] = {
    "InitTransactions": _init_transactions,
    "AddPartitionsToTxn": _add_partitions_to_txn,
    "AddOffsetsToTxn": _add_offsets_to_txn,
    "EndTxn": _end_txn,
    "TxnOffsetCommit": _txn_offset_commit,
    "DescribeTransactions": _describe_transactions,
    "ListTransactions": _list_transactions,
}
