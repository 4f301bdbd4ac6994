"""``tidelog cluster`` and ``tidelog leaders``: the brokers of a cluster and its leaderships.

::

    tidelog cluster up [--brokers N] [--data-dir D] [--base-port B]
                                        ZooKeeper and N brokers on this machine, in the
                                        foreground (the broker's command line runs it)
    tidelog cluster describe            brokers and the controller
    tidelog cluster log-dirs [--broker ID]... [--topic T]...
                                        each broker's log directory (DescribeLogDirs)
    tidelog leaders elect (--preferred | --unclean) [--topic T [--partition P]...]
                                        Kafka's ElectLeaders (kafka-leader-election)
"""

from __future__ import annotations

import argparse
from typing import Literal

from tidelog.client.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    Subcommands,
    UsageError,
    admin_client,
    help_of,
    human_bytes,
    print_info,
    print_table,
)
from tidelog.client.types import TopicPartition

__all__ = ["register"]


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``cluster`` and ``leaders`` to ``commands``; ``common`` is every action's parent."""
    cluster = commands.add_parser("cluster", help="the brokers of the cluster")
    cluster.set_defaults(handler=help_of(cluster))
    cluster_commands = cluster.add_subparsers(title="cluster commands", metavar="ACTION")
    # Only for the help: ``program.main`` hands ``cluster up`` to the broker's command
    # line before parsing (``tidelog cluster up --help`` has the options).
    cluster_commands.add_parser(
        "up", help="run ZooKeeper and N brokers on this machine (see `tidelog cluster up --help`)"
    )
    cluster_describe = cluster_commands.add_parser(
        "describe", parents=[common], help="brokers and the controller"
    )
    cluster_describe.set_defaults(handler=_cluster_describe)
    log_dirs = cluster_commands.add_parser(
        "log-dirs",
        parents=[common],
        help="each broker's log directory: free space and the partition copies in it",
    )
    log_dirs.add_argument(
        "--broker", type=int, action="append", metavar="ID", help="only this broker (repeatable)"
    )
    log_dirs.add_argument(
        "--topic", action="append", metavar="T", help="only this topic's copies (repeatable)"
    )
    log_dirs.set_defaults(handler=_cluster_log_dirs)

    leaders = commands.add_parser("leaders", help="partition leadership (cluster mode)")
    leaders.set_defaults(handler=help_of(leaders))
    leader_commands = leaders.add_subparsers(title="leaders commands", metavar="ACTION")
    elect = leader_commands.add_parser(
        "elect", parents=[common], help="elect partition leaders (preferred or unclean)"
    )
    kind = elect.add_mutually_exclusive_group(required=True)
    kind.add_argument(
        "--preferred",
        action="store_true",
        help="elect each partition's preferred replica (the first of its replicas)",
    )
    kind.add_argument(
        "--unclean",
        action="store_true",
        help="elect any live replica of a partition without a leader, even one missing "
        "acknowledged records",
    )
    elect.add_argument("--topic", help="only this topic's partitions (default: every partition)")
    elect.add_argument(
        "--partition",
        type=int,
        action="append",
        default=[],
        metavar="P",
        help="with --topic: only this partition (repeatable)",
    )
    elect.set_defaults(handler=_leaders_elect)


def _cluster_describe(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        cluster = admin.describe_cluster()
    controller = "none" if cluster.controller_id < 0 else str(cluster.controller_id)
    print(f"Cluster: {cluster.cluster_id or '-'}   Controller: {controller}")
    print()
    rows = [
        [str(b.id), b.host, str(b.port), "yes" if b.id == cluster.controller_id else ""]
        for b in cluster.brokers
    ]
    headers = ["BROKER", "HOST", "PORT", "CONTROLLER"]
    if any(b.rack for b in cluster.brokers):  # broker.rack: a column only when set
        headers.insert(3, "RACK")
        for row, b in zip(rows, cluster.brokers, strict=True):
            row.insert(3, b.rack or "-")
    print_table(headers, rows, right={0, 2})
    return EXIT_OK


def _cluster_log_dirs(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        found = admin.describe_log_dirs(args.broker, args.topic)
    rows = [
        [
            str(broker_id),
            d.path,
            human_bytes(d.usable_bytes),
            human_bytes(d.total_bytes),
            tp.topic,
            str(tp.partition),
            human_bytes(replica.size_bytes),
            str(replica.offset_lag),
        ]
        for broker_id, d in found.items()
        for tp, replica in sorted(d.replicas.items())
    ]
    empty = [b for b, d in found.items() if not d.replicas]
    if rows:
        print_table(
            ["BROKER", "LOG DIR", "FREE", "TOTAL", "TOPIC", "PARTITION", "SIZE", "LAG"],
            rows,
            right={0, 2, 3, 5, 6, 7},
        )
    for broker_id in empty:
        d = found[broker_id]
        print_info(
            f"Broker {broker_id}: {d.path}, {human_bytes(d.usable_bytes)} free of "
            f"{human_bytes(d.total_bytes)}, no partition copies asked for."
        )
    return EXIT_OK


def _leaders_elect(args: argparse.Namespace) -> int:
    if args.partition and not args.topic:
        raise UsageError("leaders elect: --partition needs --topic")
    kind: Literal["preferred", "unclean"] = "unclean" if args.unclean else "preferred"
    with admin_client(args) as admin:
        partitions = None
        if args.topic:
            numbers = args.partition or [
                p.partition for p in admin.describe_topic(args.topic).partitions
            ]
            partitions = [TopicPartition(args.topic, p) for p in numbers]
        results = admin.elect_leaders(kind, partitions)
    rows = [
        [tp.topic, str(tp.partition), "elected" if error is None else error.code]
        for tp, error in sorted(results.items())
    ]
    if rows:
        print_table(["TOPIC", "PARTITION", "RESULT"], rows, right={1})
    moved = sum(1 for error in results.values() if error is None)
    print_info(f"{kind.capitalize()} leader election: {moved} partition(s) moved.")
    failed = [e for e in results.values() if e is not None and e.code != "ELECTION_NOT_NEEDED"]
    return EXIT_ERROR if failed else EXIT_OK
