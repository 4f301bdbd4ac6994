"""``tidelog configs``: describe and change topic, broker and group configs (Kafka's
``kafka-configs.sh``; ``--group`` is its ``--entity-type groups``).

::

    tidelog configs describe (--topic T | --broker ID | --broker-defaults | --group G)
                             [--synonyms] [--docs] [KEY]...
    tidelog configs alter (--topic T | --broker ID | --broker-defaults | --group G)
                          [--set KEY=VALUE]... [--delete KEY]... [--append KEY=VALUE]...
                          [--subtract KEY=VALUE]... [--validate-only]

``describe`` prints KEY, VALUE, SOURCE (where the value comes from: a topic's own, this
broker's dynamic value, the cluster-wide dynamic default, the settings file, or the
built-in default) and, with ``--synonyms``, every place it could come from, most specific
first. A broker takes only the keys it applies live (``docs/configs.md``); a group its
``share.*`` configs and ``errors.deadletterqueue.topic.name`` (``docs/share-groups.md``),
set and deleted. Tables go to stdout, one-line summaries to stderr.
"""

from __future__ import annotations

import argparse

from tidelog.client.cli.common import (
    EXIT_OK,
    Subcommands,
    UsageError,
    admin_client,
    help_of,
    parse_pairs,
    print_info,
    print_table,
)
from tidelog.client.types import AlterConfigOp, ConfigResource

__all__ = ["register"]


def _target_options(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--topic", metavar="T", help="a topic's configs")
    target.add_argument("--broker", metavar="ID", type=int, help="one broker's configs")
    target.add_argument(
        "--broker-defaults",
        action="store_true",
        help="the cluster-wide dynamic broker defaults",
    )
    target.add_argument("--group", metavar="G", help="a group's configs (share groups)")


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``configs`` and its actions to ``commands``; ``common`` is every action's parent."""
    configs = commands.add_parser(
        "configs", help="describe and change topic, broker and group configs"
    )
    configs.set_defaults(handler=help_of(configs))
    actions = configs.add_subparsers(title="config commands", metavar="ACTION")
    describe = actions.add_parser(
        "describe", parents=[common], help="every config key with its value and source"
    )
    _target_options(describe)
    describe.add_argument("keys", nargs="*", metavar="KEY", help="only these keys")
    describe.add_argument("--synonyms", action="store_true", help="show every source")
    describe.add_argument("--docs", action="store_true", help="one line on each key")
    describe.set_defaults(handler=_describe)
    alter = actions.add_parser(
        "alter",
        parents=[common],
        help="set, reset, append to or subtract from config keys",
        description="Change dynamic configs, all or nothing: --set KEY=VALUE, --delete KEY "
        "(back to the default), --append / --subtract KEY=VALUE (list-valued keys such as "
        "cleanup.policy). A broker takes only the keys it applies live (docs/configs.md).",
    )
    _target_options(alter)
    alter.add_argument("--set", metavar="KEY=VALUE", action="append", default=[])
    alter.add_argument("--delete", metavar="KEY", action="append", default=[])
    alter.add_argument("--append", metavar="KEY=VALUE", action="append", default=[])
    alter.add_argument("--subtract", metavar="KEY=VALUE", action="append", default=[])
    alter.add_argument("--validate-only", action="store_true", help="check, change nothing")
    alter.set_defaults(handler=_alter)


def _resource(args: argparse.Namespace) -> ConfigResource:
    if args.topic is not None:
        return ConfigResource.topic(args.topic)
    if args.broker is not None:
        return ConfigResource.broker(args.broker)
    if args.group is not None:
        return ConfigResource.group(args.group)
    return ConfigResource.broker(None)


def _label(resource: ConfigResource) -> str:
    if resource.type in ("topic", "group"):
        return f"{resource.type} {resource.name}"
    return f"broker {resource.name}" if resource.name else "the broker defaults"


def _describe(args: argparse.Namespace) -> int:
    resource = _resource(args)
    with admin_client(args) as admin:
        entries = admin.describe_configs(resource, args.keys or None)
    if not entries:
        print_info(f"No configs set for {_label(resource)}.")
        return EXIT_OK
    headers = ["KEY", "VALUE", "SOURCE"]
    if args.synonyms:
        headers.append("SYNONYMS")
    if args.docs:
        headers.append("DOCUMENTATION")
    rows = []
    for entry in entries.values():
        row = [entry.name, "(sensitive)" if entry.sensitive else str(entry.value), entry.source]
        if args.synonyms:
            row.append(" < ".join(f"{s.name}={s.value} ({s.source})" for s in entry.synonyms))
        if args.docs:
            row.append(entry.documentation)
        rows.append(row)
    print_table(headers, rows)
    return EXIT_OK


def _alter(args: argparse.Namespace) -> int:
    resource = _resource(args)
    changes = [AlterConfigOp(k, "set", v) for k, v in parse_pairs(args.set, "--set").items()]
    changes += [AlterConfigOp(k, "delete") for k in args.delete]
    changes += [
        AlterConfigOp(k, "append", v) for k, v in parse_pairs(args.append, "--append").items()
    ]
    changes += [
        AlterConfigOp(k, "subtract", v) for k, v in parse_pairs(args.subtract, "--subtract").items()
    ]
    if not changes:
        raise UsageError("configs alter: give at least one --set, --delete, --append or --subtract")
    with admin_client(args) as admin:
        admin.incremental_alter_configs(resource, changes, validate_only=args.validate_only)
    verb = "Validated" if args.validate_only else "Changed"
    print_info(f"{verb} {len(changes)} config key(s) of {_label(resource)}")
    return EXIT_OK
