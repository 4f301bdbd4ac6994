"""``tidelog cluster`` and ``tidelog leaders``: the brokers of a cluster and its leaderships.

::

    tidelog cluster describe            brokers and the controller
    tidelog leaders elect --preferred   move leaderships back to the preferred replicas
"""

from __future__ import annotations

import argparse

from tidelog.client.cli.common import (
    EXIT_OK,
    Subcommands,
    admin_client,
    help_of,
    print_info,
    print_table,
)

__all__ = ["register"]


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``cluster`` and ``leaders`` to ``commands``; ``common`` is every action's parent."""
    cluster = commands.add_parser("cluster", help="the brokers of the cluster")
    cluster.set_defaults(handler=help_of(cluster))
    cluster_commands = cluster.add_subparsers(title="cluster commands", metavar="ACTION")
    cluster_describe = cluster_commands.add_parser(
        "describe", parents=[common], help="brokers and the controller"
    )
    cluster_describe.set_defaults(handler=_cluster_describe)

    leaders = commands.add_parser("leaders", help="partition leadership (cluster mode)")
    leaders.set_defaults(handler=help_of(leaders))
    leader_commands = leaders.add_subparsers(title="leaders commands", metavar="ACTION")
    elect = leader_commands.add_parser(
        "elect", parents=[common], help="move leaderships back to the preferred replicas"
    )
    elect.add_argument(
        "--preferred",
        action="store_true",
        required=True,
        help="elect each partition's preferred replica (the first of its replicas)",
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
    print_table(["BROKER", "HOST", "PORT", "CONTROLLER"], rows, right={0, 2})
    return EXIT_OK


def _leaders_elect(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        moved = admin.elect_preferred_leaders()
    print_info(f"Preferred leader election: {moved} partition(s) moved.")
    return EXIT_OK
