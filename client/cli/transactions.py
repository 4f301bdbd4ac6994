"""``tidelog transactions``: the transactional ids the coordinators know, and one id's
state, with the columns of Kafka's ``kafka-transactions.sh`` (issue #28).

::

    tidelog transactions list [--state S]... [--producer-id P]... [--duration-ms N]
    tidelog transactions describe ID
    tidelog transactions find-hanging [--topic T [--partition P]] [--broker-id B]
                                      [--max-transaction-timeout MINUTES]
    tidelog transactions abort --topic T --partition P
                               (--start-offset O | --producer-id P --producer-epoch E
                                --coordinator-epoch C)

``list`` prints ``TransactionalId Coordinator ProducerId TransactionState`` per id, sorted;
``--duration-ms`` keeps the transactions open at least that long (the hanging ones).
``describe`` prints ``CoordinatorId TransactionalId ProducerId ProducerEpoch
TransactionState TransactionTimeoutMs CurrentTransactionStartTimeMs TransactionDurationMs
TopicPartitions``, ``None`` for the start and duration when no transaction is open, as
Kafka's tool.

``find-hanging`` (Kafka's ``find-hanging``): every transaction a partition holds open
(``describe_producers``: a current transaction start offset) for longer than
``--max-transaction-timeout`` (default 15 minutes, the broker's default
``transaction.max.timeout.ms``: no live transaction can be that old), that its
coordinator does not run (no transactional id of that producer in an open state with
that partition). It prints ``Topic Partition ProducerId ProducerEpoch CoordinatorEpoch
StartOffset LastTimestamp Duration(min)``. Every topic's partitions are looked at unless
``--topic`` (and ``--partition``) or ``--broker-id`` (the partitions it leads) narrows it.

``abort`` writes an ABORT marker for one producer's open transaction on one partition
(``AdminClient.abort_transaction``; CLUSTER_ACTION). ``--start-offset`` finds the
producer whose open transaction starts there, as Kafka's tool; otherwise the producer id
and epoch and the coordinator epoch are given. Only for hanging transactions: a
transaction its coordinator still runs loses that partition's part.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable

from tidelog.client.admin import AdminClient
from tidelog.client.cli.common import (
    EXIT_OK,
    Subcommands,
    UsageError,
    admin_client,
    help_of,
    non_negative_int,
    print_info,
    print_table,
)
from tidelog.client.connection import ProducerState
from tidelog.client.types import AbortTransactionSpec, TopicPartition

__all__ = ["register"]

_NONE = "None"  # what Kafka's tables print for a value that is not known
_OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
_DEFAULT_MAX_TIMEOUT_MIN = 15  # transaction.max.timeout.ms's default, 900,000 ms


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``transactions`` and its actions to ``commands``; ``common`` is every action's
    parent."""
    transactions = commands.add_parser(
        "transactions", help="transactional ids and their transactions (docs/transactions.md)"
    )
    actions = transactions.add_subparsers(metavar="COMMAND")
    transactions.set_defaults(handler=help_of(transactions))
    listing = actions.add_parser(
        "list",
        parents=[common],
        help="list transactional ids",
        description="List the transactional ids the cluster's coordinators know.",
    )
    listing.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="STATE",
        help="only ids in this state (Ongoing, PrepareCommit, CompleteAbort, ...); repeatable",
    )
    listing.add_argument(
        "--producer-id", action="append", type=int, default=[], metavar="ID", help="repeatable"
    )
    listing.add_argument(
        "--duration-ms",
        type=non_negative_int,
        default=None,
        metavar="MS",
        help="only transactions open at least this long",
    )
    listing.set_defaults(handler=_list)
    describe = actions.add_parser(
        "describe",
        parents=[common],
        help="describe a transactional id",
        description="Describe the state of a transactional id and its open transaction.",
    )
    describe.add_argument("transactional_id", metavar="ID")
    describe.set_defaults(handler=_describe)
    hanging = actions.add_parser(
        "find-hanging",
        parents=[common],
        help="find transactions partitions hold open that no coordinator runs",
        description=(
            "List open transactions older than the maximum transaction timeout whose "
            "coordinator does not know them (they hold the last stable offset back)."
        ),
    )
    hanging.add_argument("--topic", default=None, help="only this topic's partitions")
    hanging.add_argument("--partition", type=non_negative_int, default=None)
    hanging.add_argument(
        "--broker-id", type=int, default=None, help="only the partitions this broker leads"
    )
    hanging.add_argument(
        "--max-transaction-timeout",
        type=non_negative_int,
        default=_DEFAULT_MAX_TIMEOUT_MIN,
        metavar="MINUTES",
        help=f"older than this is hanging (default {_DEFAULT_MAX_TIMEOUT_MIN})",
    )
    hanging.set_defaults(handler=_find_hanging)
    abort = actions.add_parser(
        "abort",
        parents=[common],
        help="abort a hanging transaction on one partition",
        description=(
            "Write an ABORT marker for one producer's open transaction on one partition. "
            "Only for hanging transactions (see find-hanging)."
        ),
    )
    abort.add_argument("--topic", required=True)
    abort.add_argument("--partition", type=non_negative_int, required=True)
    abort.add_argument(
        "--start-offset",
        type=non_negative_int,
        default=None,
        help="the first offset of the transaction (find-hanging's StartOffset)",
    )
    abort.add_argument("--producer-id", type=non_negative_int, default=None)
    abort.add_argument("--producer-epoch", type=non_negative_int, default=None)
    abort.add_argument("--coordinator-epoch", type=int, default=None)
    abort.set_defaults(handler=_abort)


def _list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        try:
            found = admin.list_transactions(
                args.state,
                args.producer_id,
                -1 if args.duration_ms is None else args.duration_ms,
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if not found:
        print_info("No transactional ids.")
        return EXIT_OK
    print_table(
        ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"],
        [[t.transactional_id, str(t.coordinator_id), str(t.producer_id), t.state] for t in found],
    )
    return EXIT_OK


def _describe(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        described = admin.describe_transactions([args.transactional_id])[args.transactional_id]
    start = described.transaction_start_time_ms
    print_table(
        [
            "CoordinatorId",
            "TransactionalId",
            "ProducerId",
            "ProducerEpoch",
            "TransactionState",
            "TransactionTimeoutMs",
            "CurrentTransactionStartTimeMs",
            "TransactionDurationMs",
            "TopicPartitions",
        ],
        [
            [
                str(described.coordinator_id),
                described.transactional_id,
                str(described.producer_id),
                str(described.producer_epoch),
                described.state,
                str(described.transaction_timeout_ms),
                _NONE if start < 0 else str(start),
                _NONE if start < 0 else str(max(time.time_ns() // 1_000_000 - start, 0)),
                ",".join(str(tp) for tp in described.partitions) or _NONE,
            ]
        ],
    )
    return EXIT_OK


def _open_transactions(
    admin: AdminClient, partitions: Iterable[TopicPartition]
) -> list[tuple[TopicPartition, ProducerState]]:
    """Every producer holding a transaction open on ``partitions``, by partition."""
    found = admin.describe_producers(partitions)
    return [
        (tp, state)
        for tp in sorted(found)
        for state in found[tp]
        if state.current_txn_start_offset >= 0
    ]


def _partitions(admin: AdminClient, args: argparse.Namespace) -> list[TopicPartition]:
    if args.partition is not None and args.topic is None:
        raise UsageError("--partition needs --topic")
    names = (
        [args.topic]
        if args.topic is not None
        else [t.name for t in admin.list_topics(include_internal=False)]
    )
    out: list[TopicPartition] = []
    for name in names:
        for p in admin.describe_topic(name).partitions:
            if args.partition is not None and p.partition != args.partition:
                continue
            if args.broker_id is not None and p.leader != args.broker_id:
                continue
            out.append(TopicPartition(name, p.partition))
    if args.partition is not None and not out and args.broker_id is None:
        raise UsageError(f"{args.topic} has no partition {args.partition}")
    return out


def _run_by_coordinator(
    admin: AdminClient, candidates: list[tuple[TopicPartition, ProducerState]]
) -> set[tuple[TopicPartition, int]]:
    """The (partition, producer id) pairs of ``candidates`` that a coordinator runs:
    one of the producer's transactional ids is in an open state with that partition."""
    producer_ids = sorted({state.producer_id for _, state in candidates})
    listed = admin.list_transactions(_OPEN_STATES, producer_ids)
    described = admin.describe_transactions([t.transactional_id for t in listed])
    return {
        (tp, d.producer_id)
        for d in described.values()
        if d.state in _OPEN_STATES
        for tp in d.partitions
    }


def _find_hanging(args: argparse.Namespace) -> int:
    now_ms = time.time_ns() // 1_000_000
    limit_ms = args.max_transaction_timeout * 60_000
    with admin_client(args) as admin:
        old = [
            (tp, state)
            for tp, state in _open_transactions(admin, _partitions(admin, args))
            if now_ms - state.last_timestamp_ms >= limit_ms
        ]
        running = _run_by_coordinator(admin, old) if old else set()
    hanging = [(tp, s) for tp, s in old if (tp, s.producer_id) not in running]
    if not hanging:
        print_info("No hanging transactions.")
        return EXIT_OK
    print_table(
        [
            "Topic",
            "Partition",
            "ProducerId",
            "ProducerEpoch",
            "CoordinatorEpoch",
            "StartOffset",
            "LastTimestamp",
            "Duration(min)",
        ],
        [
            [
                tp.topic,
                str(tp.partition),
                str(s.producer_id),
                str(s.producer_epoch),
                str(s.coordinator_epoch),
                str(s.current_txn_start_offset),
                str(s.last_timestamp_ms),
                str(max(now_ms - s.last_timestamp_ms, 0) // 60_000),
            ]
            for tp, s in hanging
        ],
    )
    return EXIT_OK


def _abort(args: argparse.Namespace) -> int:
    tp = TopicPartition(args.topic, args.partition)
    by_ids = (args.producer_id, args.producer_epoch, args.coordinator_epoch)
    if (args.start_offset is None) == all(v is None for v in by_ids):
        raise UsageError(
            "give --start-offset, or --producer-id, --producer-epoch and --coordinator-epoch"
        )
    if args.start_offset is None and any(v is None for v in by_ids):
        raise UsageError("--producer-id, --producer-epoch and --coordinator-epoch go together")
    with admin_client(args) as admin:
        if args.start_offset is not None:
            found = [
                s
                for _, s in _open_transactions(admin, [tp])
                if s.current_txn_start_offset == args.start_offset
            ]
            if not found:
                raise UsageError(f"no transaction open on {tp} starts at {args.start_offset}")
            state = found[0]
            spec = AbortTransactionSpec(
                tp, state.producer_id, state.producer_epoch, state.coordinator_epoch
            )
        else:
            spec = AbortTransactionSpec(tp, *by_ids)
        admin.abort_transaction(spec)
    print_info(
        f"Aborted the transaction of producer {spec.producer_id} (epoch {spec.producer_epoch}) "
        f"on {tp}."
    )
    return EXIT_OK
