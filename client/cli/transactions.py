"""``tidelog transactions``: the transactional ids the coordinators know, and one id's
state, with the columns of Kafka's ``kafka-transactions.sh`` (issue #28).

::

    tidelog transactions list [--state S]... [--producer-id P]... [--duration-ms N]
    tidelog transactions describe ID

``list`` prints ``TransactionalId Coordinator ProducerId TransactionState`` per id, sorted;
``--duration-ms`` keeps the transactions open at least that long (the hanging ones).
``describe`` prints ``CoordinatorId TransactionalId ProducerId ProducerEpoch
TransactionState TransactionTimeoutMs CurrentTransactionStartTimeMs TransactionDurationMs
TopicPartitions``, ``None`` for the start and duration when no transaction is open, as
Kafka's tool. ``abort`` (finding a hanging transaction's partition and writing its marker)
needs WriteTxnMarkers and is not here yet.
"""

from __future__ import annotations

import argparse
import time

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

__all__ = ["register"]

_NONE = "None"  # what Kafka's tables print for a value that is not known


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
