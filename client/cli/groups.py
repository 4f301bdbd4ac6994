"""``tidelog groups``: consumer and share groups, their members and lag, and their
committed offsets (a share group's: its start offsets, as ``kafka-share-groups.sh``).

::

    tidelog groups list
    tidelog groups describe GROUP
    tidelog groups delete GROUP
    tidelog groups delete-offsets GROUP --topic T [--partition P]...
    tidelog groups reset-offsets GROUP (--topic T [--partition P]... | --all-topics)
                   (--to-earliest | --to-latest | --to-offset N | --to-datetime ISO)

Tables go to stdout, one-line summaries to stderr. ``list`` shows each group's type;
``describe``, ``reset-offsets``, ``delete-offsets`` and ``delete`` find out whether the
group is a share group (from the listing) and act as ``kafka-share-groups.sh`` does then:
describe shows the members and, per share partition, its start offset, in-flight
(acquired), available and archived counts, the delivery-count histogram and the
dead-lettered count; reset-offsets moves the start offsets of an empty share group;
delete-offsets forgets an empty share group's state on a whole topic.
"""

from __future__ import annotations

import argparse
import datetime

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
from tidelog.client.types import TopicPartition

__all__ = ["register"]


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``groups`` and its actions to ``commands``; ``common`` is every action's parent."""
    groups = commands.add_parser("groups", help="consumer and share groups, their lag")
    groups.set_defaults(handler=help_of(groups))
    group_commands = groups.add_subparsers(title="group commands", metavar="ACTION")
    group_list = group_commands.add_parser("list", parents=[common], help="list groups")
    group_list.set_defaults(handler=_groups_list)
    group_describe = group_commands.add_parser(
        "describe", parents=[common], help="members and lag of a group"
    )
    group_describe.add_argument("group")
    group_describe.set_defaults(handler=_groups_describe)
    group_delete = group_commands.add_parser(
        "delete", parents=[common], help="delete an empty group and its committed offsets"
    )
    group_delete.add_argument("group")
    group_delete.set_defaults(handler=_groups_delete)
    delete_offsets = group_commands.add_parser(
        "delete-offsets",
        parents=[common],
        help="delete a group's committed offsets of a topic",
        description="Delete a group's committed offsets of one topic (all its partitions, "
        "or those given). The group may keep running, as long as none of its members "
        "subscribes to the topic (Kafka's OffsetDelete).",
    )
    delete_offsets.add_argument("group")
    delete_offsets.add_argument("--topic", required=True, help="the topic")
    delete_offsets.add_argument(
        "--partition",
        type=non_negative_int,
        action="append",
        default=[],
        help="only this partition (repeatable; default all)",
    )
    delete_offsets.set_defaults(handler=_groups_delete_offsets)
    reset = group_commands.add_parser(
        "reset-offsets",
        parents=[common],
        help="move an empty group's committed offsets",
        description="Move the committed offsets of a group that has no members (stop its "
        "consumers first). Offsets are clamped to the log; a datetime without a zone is UTC.",
    )
    reset.add_argument("group")
    scope = reset.add_mutually_exclusive_group(required=True)
    scope.add_argument("--topic", help="the topic whose offsets to move")
    scope.add_argument(
        "--all-topics", action="store_true", help="every partition the group has committed"
    )
    reset.add_argument(
        "--partition",
        type=non_negative_int,
        action="append",
        default=[],
        help="with --topic: only this partition (repeatable; default all)",
    )
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the log start")
    target.add_argument("--to-latest", action="store_true", help="the log end")
    target.add_argument("--to-offset", type=non_negative_int, metavar="N", help="offset N")
    target.add_argument(
        "--to-datetime",
        metavar="ISO",
        help="the first record at or after this time (e.g. 2026-01-31T12:00:00Z)",
    )
    reset.set_defaults(handler=_groups_reset_offsets)


def _groups_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        groups = admin.list_groups()
    if not groups:
        print_info("No groups.")
        return EXIT_OK
    print_table(
        ["GROUP", "TYPE", "STATE", "MEMBERS"],
        [[g.group_id, g.group_type, g.state, str(g.members)] for g in groups],
        right={3},
    )
    return EXIT_OK


def _is_share_group(admin: AdminClient, group_id: str) -> bool:
    return any(g.group_id == group_id and g.group_type == "share" for g in admin.list_groups())


def _share_describe(admin: AdminClient, group_id: str) -> int:
    group = admin.describe_share_group(group_id)
    print(f"Share group: {group.group_id}   State: {group.state}   Members: {len(group.members)}")
    print()
    if group.members:
        print_table(
            ["MEMBER", "CLIENT", "HOST", "EPOCH", "PARTITIONS"],
            [
                [
                    m.member_id,
                    m.client_id or "-",
                    m.client_host or "-",
                    str(m.member_epoch),
                    ",".join(str(tp) for tp in sorted(m.assignment)) or "-",
                ]
                for m in group.members
            ],
            right={3},
        )
        print()
    offsets = admin.list_share_group_offsets(group_id)
    rows = []
    for p in sorted(group.partitions, key=lambda p: p.tp):
        offset = offsets.get(p.tp)
        histogram = " ".join(f"{count}:{n}" for count, n in sorted(p.delivery_counts.items()))
        rows.append(
            [
                p.tp.topic,
                str(p.tp.partition),
                str(p.start_offset),
                str(p.end_offset),
                "-" if offset is None or offset.lag < 0 else str(offset.lag),
                str(p.acquired),
                str(p.available),
                str(p.archived),
                histogram or "-",
                str(p.dead_lettered),
            ]
        )
    print_table(
        [
            "TOPIC",
            "PARTITION",
            "START",
            "END",
            "LAG",
            "IN-FLIGHT",
            "AVAILABLE",
            "ARCHIVED",
            "DELIVERIES (count:records)",
            "DEAD-LETTERED",
        ],
        rows,
        right={1, 2, 3, 4, 5, 6, 7, 9},
    )
    return EXIT_OK


def _groups_describe(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        if _is_share_group(admin, args.group):
            return _share_describe(admin, args.group)
        group = admin.describe_group(args.group)
    print(f"Group: {group.group_id}   State: {group.state}   Members: {len(group.members)}")
    print()
    if group.members:
        # The INSTANCE column (static members' group.instance.id) only when one has it.
        static = any(m.instance_id is not None for m in group.members)
        print_table(
            ["MEMBER", *(["INSTANCE"] if static else []), "CLIENT", "EPOCH", "PARTITIONS"],
            [
                [
                    m.member_id,
                    *([m.instance_id or "-"] if static else []),
                    m.client_id or "-",
                    str(m.member_epoch),
                    ",".join(str(tp) for tp in sorted(m.assignment)) or "-",
                ]
                for m in group.members
            ],
            right={3} if static else {2},
        )
        print()
    rows = [
        [
            p.tp.topic,
            str(p.tp.partition),
            "-" if p.committed_offset is None else str(p.committed_offset),
            str(p.log_end_offset),
            str(p.lag),
            p.member_id or "-",
        ]
        for p in sorted(group.partitions, key=lambda p: p.tp)
    ]
    print_table(
        ["TOPIC", "PARTITION", "COMMITTED", "LOG END", "LAG", "MEMBER"], rows, right={1, 2, 3, 4}
    )
    return EXIT_OK


def _groups_delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.delete_group(args.group)
    print_info(f'Deleted group "{args.group}".')  # a share group with its share state
    return EXIT_OK


def _groups_delete_offsets(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        if _is_share_group(admin, args.group):
            if args.partition:
                raise UsageError("a share group's offsets are deleted per topic: no --partition")
            admin.delete_share_group_offsets(args.group, [args.topic])
            print_info(f'Deleted the share offsets of group "{args.group}" for {args.topic}.')
            return EXIT_OK
        partitions = list(dict.fromkeys(args.partition))
        if not partitions:
            partitions = list(range(len(admin.describe_topic(args.topic).partitions)))
        admin.delete_offsets(args.group, [TopicPartition(args.topic, p) for p in partitions])
    listed = ",".join(str(p) for p in partitions)
    print_info(
        f'Deleted the committed offsets of group "{args.group}" for {args.topic} [{listed}].'
    )
    return EXIT_OK


def _groups_reset_offsets(args: argparse.Namespace) -> int:
    if args.partition and args.topic is None:
        raise UsageError("--partition needs --topic")
    partitions: str | list[TopicPartition] | None = None
    if args.topic is not None:
        partitions = (
            [TopicPartition(args.topic, p) for p in dict.fromkeys(args.partition)]
            if args.partition
            else args.topic
        )
    timestamp_ms = None if args.to_datetime is None else _parse_datetime_ms(args.to_datetime)
    with admin_client(args) as admin:
        reset = (
            admin.reset_share_group_offsets
            if _is_share_group(admin, args.group)
            else admin.reset_group_offsets
        )
        moved = reset(
            args.group,
            partitions,
            to_earliest=args.to_earliest,
            to_latest=args.to_latest,
            to_offset=args.to_offset,
            to_timestamp_ms=timestamp_ms,
        )
    if not moved:
        print_info(f'Group "{args.group}" has no committed offsets to reset.')
        return EXIT_OK
    print_table(
        ["TOPIC", "PARTITION", "NEW OFFSET"],
        [[tp.topic, str(tp.partition), str(offset)] for tp, offset in moved.items()],
        right={1, 2},
    )
    return EXIT_OK


def _parse_datetime_ms(text: str) -> int:
    """ISO 8601 to epoch ms; a time without a zone is UTC."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--to-datetime must be an ISO 8601 time such as 2026-01-31T12:00:00Z, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    ms = int(moment.timestamp() * 1000)
    if ms < 0:
        raise UsageError(f"--to-datetime must not be before 1970, got {text!r}")
    return ms
