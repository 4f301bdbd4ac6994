"""``tidelog reassign`` and ``tidelog brokers``: moving partition replicas (KIP-455).

::

    tidelog reassign generate --brokers 1,2,3 [--topics T1,T2]
                                        a plan (Kafka's reassignment JSON, on stdout) that
                                        moves only what must move (``client.reassign_plan``)
    tidelog reassign execute --plan FILE
                                        start it (AlterPartitionReassignments)
    tidelog reassign verify --plan FILE
                                        done, in progress, or not as planned, per partition
    tidelog reassign cancel [--plan FILE]
                                        cancel the plan's (or every) reassignment in progress
    tidelog brokers decommission ID [--wait]
                                        move every replica off broker ID (then it can stop)

``generate`` without ``--topics`` plans every topic, the internal ones included (a
broker left out of ``--brokers`` must lose all its replicas). It prints the current
assignment of the partitions it moves on stderr, to roll back with ``execute``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tidelog.client.admin import AdminClient
from tidelog.client.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    Subcommands,
    UsageError,
    admin_client,
    help_of,
    print_info,
    print_table,
)
from tidelog.client.reassign_plan import plan, plan_from_json, plan_to_json
from tidelog.client.types import TopicPartition

__all__ = ["register"]

_POLL_S = 0.5


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``reassign`` and ``brokers`` to ``commands``."""
    reassign = commands.add_parser("reassign", help="move partition replicas between brokers")
    reassign.set_defaults(handler=help_of(reassign))
    actions = reassign.add_subparsers(title="reassign commands", metavar="ACTION")
    generate = actions.add_parser(
        "generate",
        parents=[common],
        help="propose a plan that moves only what must move (JSON on stdout)",
    )
    generate.add_argument(
        "--brokers", required=True, metavar="IDS", help="the brokers to place replicas on: 1,2,3"
    )
    generate.add_argument("--topics", metavar="T1,T2", help="only these topics (default: all)")
    generate.set_defaults(handler=_generate)
    execute = actions.add_parser("execute", parents=[common], help="start a plan's moves")
    execute.add_argument("--plan", required=True, metavar="FILE", help="Kafka's JSON format")
    execute.set_defaults(handler=_execute)
    verify = actions.add_parser("verify", parents=[common], help="whether a plan is done")
    verify.add_argument("--plan", required=True, metavar="FILE")
    verify.set_defaults(handler=_verify)
    cancel = actions.add_parser("cancel", parents=[common], help="cancel reassignments")
    cancel.add_argument("--plan", metavar="FILE", help="only this plan's partitions")
    cancel.set_defaults(handler=_cancel)

    brokers = commands.add_parser("brokers", help="brokers of a cluster")
    brokers.set_defaults(handler=help_of(brokers))
    broker_actions = brokers.add_subparsers(title="brokers commands", metavar="ACTION")
    decommission = broker_actions.add_parser(
        "decommission", parents=[common], help="move every replica off a broker"
    )
    decommission.add_argument("broker", type=int, metavar="ID")
    decommission.add_argument(
        "--wait",
        action="store_true",
        help="wait until the broker holds no replica (bounded by --timeout-ms, default 300 s)",
    )
    decommission.set_defaults(handler=_decommission)


def _broker_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--brokers: expected ids like 1,2,3, got {text!r}") from None
    if not ids:
        raise UsageError("--brokers: no broker ids")
    return ids


def _current(admin: AdminClient, topics: list[str] | None) -> dict[TopicPartition, tuple[int, ...]]:
    names = topics or [t.name for t in admin.list_topics(include_internal=True)]
    return {
        TopicPartition(name, p.partition): tuple(p.replicas)
        for name in names
        for p in admin.describe_topic(name).partitions
    }


def _read_plan(path: str) -> dict[TopicPartition, tuple[int, ...]]:
    try:
        return plan_from_json(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"--plan {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--plan {path}: {exc}") from None


def _generate(args: argparse.Namespace) -> int:
    brokers = _broker_ids(args.brokers)
    topics = [t for t in args.topics.split(",") if t] if args.topics else None
    with admin_client(args) as admin:
        racks = {b.id: b.rack for b in admin.describe_cluster().brokers}
        current = _current(admin, topics)
    try:
        moves = plan(current, brokers, racks)
    except ValueError as exc:
        raise UsageError(f"reassign generate: {exc}") from None
    print_info("Current assignment of the partitions that move (to roll back):")
    print(plan_to_json({tp: current[tp] for tp in moves}), file=sys.stderr)
    print(plan_to_json(moves))
    print_info(f"{len(moves)} partition(s) move.")
    return EXIT_OK


def _execute_plan(admin: AdminClient, moves: dict[TopicPartition, tuple[int, ...]]) -> int:
    results = admin.alter_partition_reassignments(dict(moves)) if moves else {}
    rows = [
        [tp.topic, str(tp.partition), "started" if error is None else error.code]
        for tp, error in sorted(results.items())
    ]
    if rows:
        print_table(["TOPIC", "PARTITION", "RESULT"], rows, right={1})
    failed = sum(1 for error in results.values() if error is not None)
    print_info(f"{len(results) - failed} reassignment(s) started, {failed} refused.")
    return EXIT_ERROR if failed else EXIT_OK


def _execute(args: argparse.Namespace) -> int:
    moves = _read_plan(args.plan)
    with admin_client(args) as admin:
        return _execute_plan(admin, moves)


def _verify(args: argparse.Namespace) -> int:
    moves = _read_plan(args.plan)
    with admin_client(args) as admin:
        moving = admin.list_partition_reassignments(list(moves))
        rows = []
        done = 0
        for tp, target in sorted(moves.items()):
            if tp in moving:
                state = "in progress"
            else:
                replicas = tuple(admin.describe_topic(tp.topic).partitions[tp.partition].replicas)
                state = "complete" if replicas == target else f"differs: {list(replicas)}"
                done += state == "complete"
            rows.append([tp.topic, str(tp.partition), str(list(target)), state])
    if rows:
        print_table(["TOPIC", "PARTITION", "TARGET", "STATE"], rows, right={1})
    print_info(f"{done} of {len(moves)} reassignment(s) complete.")
    return EXIT_OK if done == len(moves) else EXIT_ERROR


def _cancel(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        wanted = list(_read_plan(args.plan)) if args.plan else None
        moving = admin.list_partition_reassignments(wanted)
        results = admin.alter_partition_reassignments(dict.fromkeys(moving)) if moving else {}
    rows = [
        [tp.topic, str(tp.partition), "cancelled" if error is None else error.code]
        for tp, error in sorted(results.items())
    ]
    if rows:
        print_table(["TOPIC", "PARTITION", "RESULT"], rows, right={1})
    failed = sum(1 for error in results.values() if error is not None)
    print_info(f"{len(results) - failed} reassignment(s) cancelled.")
    return EXIT_ERROR if failed else EXIT_OK


def _decommission(args: argparse.Namespace) -> int:
    leaving = args.broker
    with admin_client(args) as admin:
        brokers = admin.describe_cluster().brokers
        racks = {b.id: b.rack for b in brokers}
        staying = [b.id for b in brokers if b.id != leaving]
        if leaving not in racks:
            print_info(f"Broker {leaving} is not live; moving its replicas anyway.")
        current = _current(admin, None)
        try:
            # Only the leaving broker's replicas move: no balancing among the others.
            moves = plan(current, staying, racks, balance=False)
        except ValueError as exc:
            raise UsageError(f"brokers decommission {leaving}: {exc}") from None
        status = _execute_plan(admin, moves)
        if status != EXIT_OK or not args.wait:
            return status
        deadline = time.monotonic() + (args.timeout_ms or 300_000) / 1000
        while True:
            left = [
                tp
                for tp, r in _current(admin, list({tp.topic for tp in moves})).items()
                if leaving in r
            ]
            if not left:
                print_info(f"Broker {leaving} holds no replica now; it can be stopped.")
                return EXIT_OK
            if time.monotonic() > deadline:
                print_info(f"Broker {leaving} still holds {len(left)} replica(s).")
                return EXIT_ERROR
            time.sleep(_POLL_S)
