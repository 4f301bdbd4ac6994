"""``tidelog topics``: create, list, describe, alter and delete topics.

::

    tidelog topics create NAME [--partitions N] [--replication-factor N] [--config KEY=VALUE]...
    tidelog topics create NAME --replica-assignment 1:2,2:3,3:1 [--config KEY=VALUE]...
    tidelog topics list [--internal]
    tidelog topics describe NAME | --under-replicated [NAME]
    tidelog topics alter NAME [--partitions N [--replica-assignment A]] [--set KEY=VALUE]...
                              [--delete KEY]...
    tidelog topics delete NAME
    tidelog topics producers NAME [--partition P]...
    tidelog topics delete-records NAME (--before OFFSET | --all) [--partition P]...

Tables go to stdout, one-line summaries to stderr.

``--replica-assignment`` is spelled as Kafka's ``kafka-topics.sh``: partitions separated by
commas, each partition's broker ids by colons, the preferred leader first (``1:2,2:3,3:1``:
partition 0 on brokers 1 and 2, led by 1...). With ``create`` it replaces ``--partitions``
and ``--replication-factor``. With ``alter --partitions N`` it lists, as Kafka's, every
partition of the grown topic, of which only the new ones are used (the existing
partitions' lists are ignored: moving them is ``tidelog reassign``); a list of just the
new partitions is taken as well (it cannot be mistaken for the other: it is shorter).
"""

from __future__ import annotations

import argparse

from tidelog.client.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    Subcommands,
    UsageError,
    admin_client,
    help_of,
    human_bytes,
    non_negative_int,
    parse_pairs,
    positive_int,
    print_error,
    print_info,
    print_table,
    timeout_ms,
)
from tidelog.client.types import TopicPartition

__all__ = ["register"]


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``topics`` and its actions to ``commands``; ``common`` is every action's parent."""
    topics = commands.add_parser("topics", help="create, list, describe, alter, delete topics")
    topics.set_defaults(handler=help_of(topics))
    topic_commands = topics.add_subparsers(title="topic commands", metavar="ACTION")
    create = topic_commands.add_parser("create", parents=[common], help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=positive_int, help="default: the broker's")
    create.add_argument(
        "--replication-factor",
        type=positive_int,
        metavar="N",
        help="copies of each partition (default: the broker's default.replication.factor)",
    )
    create.add_argument(
        "--replica-assignment",
        type=replica_assignment,
        metavar="A",
        help="the brokers of each partition, as Kafka's: 1:2,2:3,3:1 (partition 0 on 1 "
        "and 2, led by 1...); replaces --partitions and --replication-factor",
    )
    create.add_argument(
        "--config", metavar="KEY=VALUE", action="append", default=[], help="topic setting"
    )
    create.set_defaults(handler=_topics_create)
    listing = topic_commands.add_parser("list", parents=[common], help="list topics")
    listing.add_argument("--internal", action="store_true", help="include internal topics")
    listing.set_defaults(handler=_topics_list)
    describe = topic_commands.add_parser("describe", parents=[common], help="describe a topic")
    describe.add_argument("name", nargs="?", help="the topic (every topic with a filter)")
    describe.add_argument(
        "--under-replicated",
        action="store_true",
        help="only partitions whose ISR is smaller than their replica set, of every topic "
        "unless a name is given",
    )
    describe.set_defaults(handler=_topics_describe)
    alter = topic_commands.add_parser(
        "alter", parents=[common], help="change topic settings or add partitions"
    )
    alter.add_argument("name")
    alter.add_argument(
        "--partitions",
        type=positive_int,
        metavar="N",
        help="grow the topic to N partitions in total (partitions are never removed)",
    )
    alter.add_argument(
        "--replica-assignment",
        type=replica_assignment,
        metavar="A",
        help="with --partitions: the brokers of the partitions, as Kafka's (1:2,2:3,3:1), "
        "of every partition (the existing ones' are ignored) or of the new ones only",
    )
    alter.add_argument("--set", metavar="KEY=VALUE", action="append", default=[])
    alter.add_argument("--delete", metavar="KEY", action="append", default=[])
    alter.set_defaults(handler=_topics_alter)
    delete = topic_commands.add_parser("delete", parents=[common], help="delete a topic")
    delete.add_argument("name")
    delete.set_defaults(handler=_topics_delete)
    producers = topic_commands.add_parser(
        "producers",
        parents=[common],
        help="the idempotent producers each partition's leader remembers (DescribeProducers)",
    )
    producers.add_argument("name")
    producers.add_argument(
        "--partition",
        type=int,
        action="append",
        default=[],
        metavar="P",
        help="only this partition (repeatable; default: every partition)",
    )
    producers.set_defaults(handler=_topics_producers)
    delete_records = topic_commands.add_parser(
        "delete-records",
        parents=[common],
        help="delete the records below an offset (DeleteRecords; Kafka's kafka-delete-records)",
    )
    delete_records.add_argument("name")
    where = delete_records.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--before",
        type=non_negative_int,
        metavar="OFFSET",
        help="delete every record below OFFSET: it becomes the partition's log start",
    )
    where.add_argument(
        "--all",
        action="store_true",
        help="delete every record readable now (up to the high watermark)",
    )
    delete_records.add_argument(
        "--partition",
        type=non_negative_int,
        action="append",
        default=[],
        metavar="P",
        help="only this partition (repeatable; default: every partition)",
    )
    delete_records.set_defaults(handler=_topics_delete_records)


def replica_assignment(text: str) -> list[list[int]]:
    """An argparse type: Kafka's ``kafka-topics.sh`` replica assignment (``1:2,2:3``) as
    one broker-id list per partition (``ArgumentTypeError`` for anything else; the broker
    checks the lists themselves)."""
    lists = []
    for part in text.split(","):
        try:
            lists.append([int(b) for b in part.strip().split(":")])
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must look like 1:2,2:3,3:1 (broker ids, ':' between replicas, ',' between "
                f"partitions), got {text!r}"
            ) from None
    return lists


def _topics_create(args: argparse.Namespace) -> int:
    config = parse_pairs(args.config, "--config")
    if args.replica_assignment is not None and (
        args.partitions is not None or args.replication_factor is not None
    ):
        raise UsageError(
            "topics create: --replica-assignment gives the partitions and their replicas; "
            "leave out --partitions and --replication-factor"
        )
    with admin_client(args) as admin:
        description = admin.create_topic(
            args.name,
            args.partitions,
            config,
            replication_factor=args.replication_factor,
            replica_assignment=args.replica_assignment,
        )
    print_info(
        f'Created topic "{description.name}" with {len(description.partitions)} partition(s).'
    )
    return EXIT_OK


def _topics_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        topics = admin.list_topics(include_internal=args.internal)
    if not topics:
        print_info("No topics.")
        return EXIT_OK
    headers = ["TOPIC", "PARTITIONS"] + (["INTERNAL"] if args.internal else [])
    rows = [
        [t.name, str(t.partitions)] + (["yes" if t.internal else ""] if args.internal else [])
        for t in topics
    ]
    print_table(headers, rows, right={1})
    return EXIT_OK


def _under_replicated(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        names = [args.name] if args.name else [t.name for t in admin.list_topics()]
        topics = [admin.describe_topic(name) for name in names]
    rows = [
        [
            topic.name,
            str(p.partition),
            "offline" if p.leader < 0 else str(p.leader),
            ",".join(map(str, p.replicas)),
            _brokers(p.isr),
            _brokers(p.elr),
            _brokers(p.last_known_elr),
        ]
        for topic in topics
        for p in topic.partitions
        if len(p.isr) < len(p.replicas)
    ]
    if not rows:
        print("No under-replicated partitions.")
        return EXIT_OK
    print_table(
        ["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR", "ELR", "LAST KNOWN ELR"],
        rows,
        right={1, 2},
    )
    return EXIT_OK


def _brokers(ids: tuple[int, ...]) -> str:
    """Broker ids as one cell: ``1,3``, or ``-`` for none (a blank cell would shift the
    columns of anyone splitting the line on white space)."""
    return ",".join(map(str, ids)) if ids else "-"


def _topics_describe(args: argparse.Namespace) -> int:
    if args.under_replicated:
        return _under_replicated(args)
    if not args.name:
        print_error("topics describe: give a topic name (or --under-replicated)")
        return EXIT_USAGE
    with admin_client(args) as admin:
        topic = admin.describe_topic(args.name)
    total_records = sum(p.log_end_offset - p.log_start_offset for p in topic.partitions)
    total_bytes = sum(p.size_bytes for p in topic.partitions)
    print(
        f"Topic: {topic.name}   Partitions: {len(topic.partitions)}   "
        f"Records: {total_records}   Size: {human_bytes(total_bytes)}"
        + ("   (internal)" if topic.internal else "")
    )
    print()
    rows = [
        [
            str(p.partition),
            "offline" if p.leader < 0 else str(p.leader),
            ",".join(map(str, p.replicas)),
            _brokers(p.isr),
            _brokers(p.elr),
            _brokers(p.last_known_elr),
            str(p.leader_epoch),
            str(p.log_start_offset),
            str(p.log_end_offset),
            str(p.high_watermark),
            human_bytes(p.size_bytes),
            str(p.segments),
        ]
        for p in topic.partitions
    ]
    print_table(
        [
            "PARTITION",
            "LEADER",
            "REPLICAS",
            "ISR",
            "ELR",
            "LAST KNOWN ELR",
            "EPOCH",
            "LOG START",
            "LOG END",
            "HIGH WATERMARK",
            "SIZE",
            "SEGMENTS",
        ],
        rows,
        right={0, 1, 6, 7, 8, 9, 10, 11},
    )
    if topic.config:
        print()
        print("Config:")
        print_table(None, [[f"  {k}", v] for k, v in topic.config.items()])
    return EXIT_OK


def _topics_alter(args: argparse.Namespace) -> int:
    updates = parse_pairs(args.set, "--set")
    partitions: int | None = args.partitions
    if not updates and not args.delete and partitions is None:
        raise UsageError(
            "topics alter: give --partitions N, or at least one --set KEY=VALUE or --delete KEY"
        )
    lists: list[list[int]] | None = args.replica_assignment
    if lists is not None and partitions is None:
        raise UsageError("topics alter: --replica-assignment needs --partitions N")
    with admin_client(args) as admin:
        # Partitions first: a refused count (the likelier mistake) leaves the config alone.
        if partitions is not None:
            if lists is not None and len(lists) == partitions:
                # Kafka's form: every partition's list; the new ones follow the existing.
                current = len(admin.describe_topic(args.name).partitions)
                lists = lists[current:] or None  # none new: the broker refuses the count
            count = admin.create_partitions(args.name, partitions, replica_assignment=lists)
            print_info(f'Topic "{args.name}" now has {count} partition(s).')
        if updates or args.delete:
            admin.alter_topic_config(args.name, updates, args.delete)
            print_info(f'Updated topic "{args.name}".')
    return EXIT_OK


def _topics_delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.delete_topic(args.name)
    print_info(f'Deleted topic "{args.name}".')
    return EXIT_OK


def _topics_producers(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        partitions = args.partition or [
            p.partition for p in admin.describe_topic(args.name).partitions
        ]
        found = admin.describe_producers(TopicPartition(args.name, p) for p in partitions)
    rows = [
        [
            str(tp.partition),
            str(state.producer_id),
            str(state.producer_epoch),
            str(state.last_sequence),
            str(state.last_offset),
            str(state.last_timestamp_ms),
        ]
        for tp, states in sorted(found.items())
        for state in states
    ]
    if not rows:
        print_info(f'No producers remembered by "{args.name}".')
        return EXIT_OK
    print_table(
        ["PARTITION", "PRODUCER ID", "EPOCH", "LAST SEQUENCE", "LAST OFFSET", "LAST APPEND MS"],
        rows,
        right={0, 1, 2, 3, 4, 5},
    )
    return EXIT_OK


def _topics_delete_records(args: argparse.Namespace) -> int:
    offset = -1 if args.all else args.before
    with admin_client(args) as admin:
        partitions = args.partition or [
            p.partition for p in admin.describe_topic(args.name).partitions
        ]
        low = admin.delete_records(
            {TopicPartition(args.name, p): offset for p in sorted(set(partitions))},
            timeout_ms=timeout_ms(args),
        )
    print_table(
        ["PARTITION", "LOW WATERMARK"],
        [[str(tp.partition), str(start)] for tp, start in sorted(low.items())],
        right={0, 1},
    )
    print_info(f'Deleted the records of "{args.name}" below each partition\'s low watermark.')
    return EXIT_OK
