"""``tidelog acls``: add, list and remove access control lists (``authorizer.enabled``).

::

    tidelog acls add (--allow-principal P | --deny-principal P) --operation OP...
                     (--topic T | --group G | --cluster) [--host H]
                     [--resource-pattern-type literal|prefixed]
    tidelog acls list [--allow-principal P | --deny-principal P | --principal P]
                      [--operation OP] [--topic T | --group G | --cluster] ...
    tidelog acls remove (--topic T | --group G | --cluster) [the filters of list]

``list`` and ``remove`` take a filter: an option not given matches anything. ACL tables
go to stdout.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tidelog.client.acls import CLUSTER, AclBinding, AclFilter
from tidelog.client.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    Subcommands,
    admin_client,
    help_of,
    print_error,
    print_info,
    print_table,
)

__all__ = ["register"]


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``acls`` and its actions to ``commands``; ``common`` is every action's parent."""
    acls = commands.add_parser("acls", help="access control lists (authorizer.enabled)")
    acls.set_defaults(handler=help_of(acls))
    acl_commands = acls.add_subparsers(title="acls commands", metavar="ACTION")
    for action, help_text in (
        ("add", "allow or deny a principal operations on a resource"),
        ("list", "list the ACLs (of a resource, of a principal)"),
        ("remove", "remove the matching ACLs"),
    ):
        sub = acl_commands.add_parser(action, parents=[common], help=help_text)
        who = sub.add_mutually_exclusive_group(required=action == "add")
        who.add_argument("--allow-principal", metavar="User:NAME")
        who.add_argument("--deny-principal", metavar="User:NAME")
        if action == "list":
            who.add_argument("--principal", metavar="User:NAME")
        sub.add_argument("--host", default=None, help="the client address (default *)")
        sub.add_argument(
            "--operation",
            action="append",
            metavar="OP",
            help="READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, "
            "DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE or ALL (repeatable)",
        )
        what = sub.add_mutually_exclusive_group(required=action != "list")
        what.add_argument("--topic")
        what.add_argument("--group")
        what.add_argument("--cluster", action="store_true")
        sub.add_argument(
            "--resource-pattern-type",
            choices=["literal", "prefixed"],
            default=None,
            help="how --topic/--group matches names (default literal)",
        )
        sub.set_defaults(
            handler={"add": _acls_add, "list": _acls_list, "remove": _acls_remove}[action]
        )


def _acl_resource(args: argparse.Namespace) -> tuple[str | None, str | None]:
    if args.topic is not None:
        return "TOPIC", args.topic
    if args.group is not None:
        return "GROUP", args.group
    if args.cluster:
        return "CLUSTER", CLUSTER
    return None, None


def _acl_principal(args: argparse.Namespace) -> tuple[str | None, str | None]:
    if args.allow_principal:
        return args.allow_principal, "ALLOW"
    if args.deny_principal:
        return args.deny_principal, "DENY"
    return getattr(args, "principal", None), None


def _acls_add(args: argparse.Namespace) -> int:
    kind, name = _acl_resource(args)
    principal, permission = _acl_principal(args)
    if not args.operation:
        print_error("acls add: give at least one --operation")
        return EXIT_USAGE
    if kind is None or name is None or not principal or not permission:
        print_error("acls add: give a principal and a resource")
        return EXIT_USAGE
    bindings = [
        AclBinding(
            principal=principal,
            operation=operation.upper(),
            resource_type=kind,
            resource_name=name,
            pattern_type=(args.resource_pattern_type or "literal").upper(),
            permission=permission,
            host=args.host or "*",
        )
        for operation in args.operation
    ]
    with admin_client(args) as admin:
        admin.create_acls(bindings)
    print_info(f"Added {len(bindings)} ACL(s).")
    return EXIT_OK


def _acl_filter(args: argparse.Namespace) -> AclFilter:
    kind, name = _acl_resource(args)
    principal, permission = _acl_principal(args)
    operations = args.operation or [None]
    if len(operations) > 1:
        raise ValueError("give at most one --operation here")
    return AclFilter(
        principal=principal,
        operation=operations[0].upper() if operations[0] else None,
        resource_type=kind,
        resource_name=name,
        pattern_type=args.resource_pattern_type.upper() if args.resource_pattern_type else None,
        permission=permission,
        host=args.host,
    )


def _print_acls(bindings: Sequence[AclBinding]) -> None:
    rows = [
        [
            b.resource_type,
            b.resource_name,
            b.pattern_type,
            b.principal,
            b.host,
            b.operation,
            b.permission,
        ]
        for b in sorted(
            bindings, key=lambda b: (b.resource_type, b.resource_name, b.principal, b.operation)
        )
    ]
    print_table(
        ["RESOURCE", "NAME", "PATTERN", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION"], rows
    )


def _acls_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        found = admin.describe_acls(_acl_filter(args))
    if not found:
        print("No ACLs.")
        return EXIT_OK
    _print_acls(found)
    return EXIT_OK


def _acls_remove(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        removed = admin.delete_acls(_acl_filter(args))
    print_info(f"Removed {len(removed)} ACL(s).")
    if removed:
        _print_acls(removed)
    return EXIT_OK
