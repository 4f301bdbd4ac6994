"""``tidelog quotas``: client quotas of client ids, users, or users with client ids.

::

    tidelog quotas set [CLIENT_ID] KEY=VALUE... [--user USER]   (producer_byte_rate,
                   consumer_byte_rate, request_percentage; <default> for either name)
    tidelog quotas list [CLIENT_ID] [--user USER]
    tidelog quotas delete [CLIENT_ID] [KEY]... [--user USER]  (no KEY: every quota)

The quota table goes to stdout, one-line summaries to stderr.
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

__all__ = ["register"]

_QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage")


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``quotas`` and its actions to ``commands``; ``common`` is every action's parent."""
    quotas = commands.add_parser("quotas", help="client quotas (byte rates, request time)")
    quotas.set_defaults(handler=help_of(quotas))
    quota_commands = quotas.add_subparsers(title="quota commands", metavar="ACTION")
    user_help = "the user (principal name; <default>: every user without its own)"
    quota_set = quota_commands.add_parser(
        "set",
        parents=[common],
        help="set quotas of a client id, a user, or both",
        description="Set quotas of a client id, a user (--user), or a user with a client "
        "id (<default> for either: all without their own): producer_byte_rate, "
        "consumer_byte_rate (bytes/s), request_percentage (percent of one broker storage "
        "thread). For each quota the most specific entity that sets it applies "
        "(docs/security.md).",
    )
    quota_set.add_argument("words", nargs="+", metavar="[CLIENT_ID] KEY=VALUE")
    quota_set.add_argument("--user", help=user_help)
    quota_set.set_defaults(handler=_quotas_set)
    quota_list = quota_commands.add_parser("list", parents=[common], help="list quotas")
    quota_list.add_argument("client_id", nargs="?", metavar="CLIENT_ID")
    quota_list.add_argument("--user", help="only this user's")
    quota_list.set_defaults(handler=_quotas_list)
    quota_delete = quota_commands.add_parser(
        "delete", parents=[common], help="remove quotas of a client id, a user, or both"
    )
    quota_delete.add_argument(
        "words", nargs="*", metavar="[CLIENT_ID] KEY", help="no KEY: every quota"
    )
    quota_delete.add_argument("--user", help=user_help)
    quota_delete.set_defaults(handler=_quotas_delete)


def _quota_target(args: argparse.Namespace, client_id: str | None) -> str:
    """The entity a quota command names, for messages; refuses one that names nothing."""
    if client_id is None and args.user is None:
        raise UsageError("name a client id, a user (--user), or both")
    parts = [f"user {args.user}"] if args.user is not None else []
    if client_id is not None:
        parts.append(f"client id {client_id}")
    return " and ".join(parts)


def _quotas_set(args: argparse.Namespace) -> int:
    words = list(args.words)
    client_id = None if "=" in words[0] else words.pop(0)
    target = _quota_target(args, client_id)
    if not words:
        raise UsageError("give at least one KEY=VALUE")
    values = {}
    for key, text in parse_pairs(words, "a quota").items():
        try:
            values[key] = float(text)
        except ValueError:
            raise UsageError(f"quota {key} must be a number, got {text!r}") from None
    with admin_client(args) as admin:
        admin.alter_client_quotas(client_id, values, user=args.user)
    shown = ", ".join(f"{k}={_number(v)}" for k, v in values.items())
    print_info(f"Set quotas of {target}: {shown}")
    return EXIT_OK


def _quotas_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        found = admin.describe_quotas(user=args.user, client_id=args.client_id)
    if not found:
        print_info("No quotas.")
        return EXIT_OK
    print_table(
        ["USER", "CLIENT_ID", *(k.upper() for k in _QUOTA_KEYS)],
        [
            [
                entity.user or "-",
                entity.client_id or "-",
                *(_number(values[k]) if k in values else "-" for k in _QUOTA_KEYS),
            ]
            for entity, values in found.items()
        ],
        right={2, 3, 4},
    )
    return EXIT_OK


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def _quotas_delete(args: argparse.Namespace) -> int:
    words = list(args.words)
    client_id = None
    if words and not (args.user is not None and words[0] in _QUOTA_KEYS):
        client_id = words.pop(0)
    target = _quota_target(args, client_id)
    keys = words or list(_QUOTA_KEYS)
    with admin_client(args) as admin:
        admin.alter_client_quotas(client_id, delete=keys, user=args.user)
    print_info(f"Removed quotas of {target}: {', '.join(keys)}")
    return EXIT_OK
