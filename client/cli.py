"""The ``tidelog`` command line.

::

    tidelog topics create NAME [--partitions N] [--config KEY=VALUE]...
    tidelog topics list [--internal]
    tidelog topics describe NAME
    tidelog topics alter NAME [--partitions N] [--set KEY=VALUE]... [--delete KEY]...
    tidelog topics delete NAME
    tidelog produce TOPIC [--key-separator SEP] [--partition P] [--acks 0|1|all] ...
    tidelog consume TOPIC [--from-beginning] [--partition P [--offset N]]
                          [--max-messages N] [--format FMT] [--timeout-ms MS] [--group G]
    tidelog groups list | describe GROUP | delete GROUP
    tidelog groups reset-offsets GROUP (--topic T [--partition P]... | --all-topics)
                   (--to-earliest | --to-latest | --to-offset N | --to-datetime ISO)
    tidelog quotas set [CLIENT_ID] KEY=VALUE... [--user USER]   (producer_byte_rate,
                   consumer_byte_rate, request_percentage; <default> for either name)
    tidelog quotas list [CLIENT_ID] [--user USER]
    tidelog quotas delete [CLIENT_ID] [KEY]... [--user USER]  (no KEY: every quota)
    tidelog users add NAME [--password-file F] [--mechanism M]... [--iterations N]
                           [--data-dir D]  (D: write into a data directory, broker stopped)
    tidelog users list
    tidelog users delete NAME [--mechanism M]
    tidelog serve ...              (the broker daemon: see `tidelog serve --help`)
    tidelog console [--listen 127.0.0.1:7480] [--refresh-ms MS] [--sample-ms MS]
                                   (the web console: docs/console.md)

Every command takes ``--bootstrap HOST:PORT`` (default ``$TIDELOG_BOOTSTRAP`` or
``127.0.0.1:7410``) and ``--command-config FILE``: a Kafka tools properties file with the
security settings (``security.protocol``, ``sasl.mechanism``, ``sasl.jaas.config`` or
``sasl.username``/``sasl.password``, ``ssl.cafile``/``ssl.certfile``/``ssl.keyfile``;
``client.security.settings_from_properties``). Tables are aligned for a terminal; records
go to stdout, summaries and errors to stderr. An error is one line
(``tidelog: error: ... [CODE]``), never a traceback.

Exit status: 0 success (``consume`` stopped with Ctrl-C included); 1 the broker refused
the request, could not be reached, or a record was not delivered; 2 bad usage; 130
interrupted (other commands).

``serve`` belongs to the broker: ``main`` hands it to ``broker.cli.main`` through
``_run_broker``, a lazy import, so the client never imports the broker package unless
``tidelog serve`` runs. This is the only client module that writes to the terminal and
reads the environment.
"""

from __future__ import annotations

import argparse
import codecs
import datetime
import getpass
import importlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from client.acls import CLUSTER, AclBinding, AclFilter
from client.admin import AdminClient
from client.config import DEFAULT_BOOTSTRAP
from client.consumer import Consumer
from client.producer import Producer
from client.security import settings_from_properties
from client.types import ConsumerRecord, RecordMetadata, TopicPartition
from storage.errors import TidelogError

__all__ = ["main"]

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

_DEFAULT_TIMEOUT_MS = 10_000
_POLL_MS = 500
_FORMAT_FIELDS = (
    "topic",
    "partition",
    "offset",
    "timestamp",
    "sent_timestamp",
    "received_timestamp",
    "corrected_timestamp",
    "key",
    "value",
    "headers",
)
# --print-timestamps: the four times of a record before its formatted line.
_TIMESTAMPS_PREFIX = (
    "timestamp={timestamp}\tsent={sent_timestamp}\treceived={received_timestamp}\t"
    "corrected={corrected_timestamp}\t"
)


class UsageError(Exception):
    """Bad arguments that argparse cannot see (exit status 2)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (the console script exits with it)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "serve":
        return _run_broker(args_list[1:])
    parser = _parser()
    args = parser.parse_args(args_list)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return handler(args)
    except UsageError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except TidelogError as exc:
        _error(_describe_error(exc))
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_broken_pipe()
        return EXIT_OK


def _run_broker(argv: Sequence[str]) -> int:
    """``tidelog serve``: the broker's own command line, imported only when asked for."""
    broker_cli: Any = importlib.import_module("broker.cli")
    status: int = broker_cli.main(["serve", *argv])
    return status


# --- argument parsing ---------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    default_bootstrap = os.environ.get("TIDELOG_BOOTSTRAP", DEFAULT_BOOTSTRAP)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        default=argparse.SUPPRESS,
        help=f"broker addresses, HOST:PORT[,HOST:PORT...] (default {default_bootstrap})",
    )
    common.add_argument(
        "--timeout-ms",
        type=_non_negative_int,
        default=argparse.SUPPRESS,
        help="how long to wait for the broker",
    )
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)
    common.add_argument(
        "--command-config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="properties file of security settings (Kafka tools' format)",
    )

    parser = argparse.ArgumentParser(
        prog="tidelog",
        description="Manage topics, produce and consume records on a Tidelog broker.",
        epilog="Exit status: 0 success, 1 error from or reaching the broker, 2 bad usage.",
    )
    parser.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        default=default_bootstrap,
        help="broker addresses, HOST:PORT[,HOST:PORT...]: any live broker of the cluster",
    )
    parser.add_argument("--timeout-ms", type=_non_negative_int, default=None)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    parser.add_argument(
        "--command-config",
        metavar="FILE",
        default=None,
        help="properties file of security settings (Kafka tools' format)",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    commands.add_parser("serve", help="run the broker daemon (see `tidelog serve --help`)")

    cluster = commands.add_parser("cluster", help="the brokers of the cluster")
    cluster.set_defaults(handler=_help_of(cluster))
    cluster_commands = cluster.add_subparsers(title="cluster commands", metavar="ACTION")
    cluster_describe = cluster_commands.add_parser(
        "describe", parents=[common], help="brokers and the controller"
    )
    cluster_describe.set_defaults(handler=_cluster_describe)

    leaders = commands.add_parser("leaders", help="partition leadership (cluster mode)")
    leaders.set_defaults(handler=_help_of(leaders))
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

    topics = commands.add_parser("topics", help="create, list, describe, alter, delete topics")
    topics.set_defaults(handler=_help_of(topics))
    topic_commands = topics.add_subparsers(title="topic commands", metavar="ACTION")
    create = topic_commands.add_parser("create", parents=[common], help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=_positive_int, help="default: the broker's")
    create.add_argument(
        "--replication-factor",
        type=_positive_int,
        metavar="N",
        help="copies of each partition (default: the broker's default.replication.factor)",
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
        type=_positive_int,
        metavar="N",
        help="grow the topic to N partitions in total (partitions are never removed)",
    )
    alter.add_argument("--set", metavar="KEY=VALUE", action="append", default=[])
    alter.add_argument("--delete", metavar="KEY", action="append", default=[])
    alter.set_defaults(handler=_topics_alter)
    delete = topic_commands.add_parser("delete", parents=[common], help="delete a topic")
    delete.add_argument("name")
    delete.set_defaults(handler=_topics_delete)

    produce = commands.add_parser(
        "produce", parents=[common], help="send lines of stdin as records"
    )
    produce.add_argument("topic")
    produce.add_argument(
        "--key-separator",
        metavar="SEP",
        help="split each line at the first SEP into key and value",
    )
    produce.add_argument("--partition", type=_non_negative_int, help="send to this partition")
    produce.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"])
    produce.add_argument(
        "--compression", choices=["none", "gzip", "snappy", "lz4", "zstd"], default="none"
    )
    produce.add_argument("--linger-ms", type=_non_negative_int, default=5)
    produce.add_argument(
        "--header", metavar="KEY=VALUE", action="append", default=[], help="header on every record"
    )
    produce.set_defaults(handler=_produce)

    consume = commands.add_parser("consume", parents=[common], help="print records of a topic")
    consume.add_argument("topic")
    consume.add_argument(
        "--from-beginning", action="store_true", help="start at the oldest record, not new ones"
    )
    consume.add_argument("--partition", type=_non_negative_int, help="read only this partition")
    consume.add_argument(
        "--offset", help="with --partition: start here (an offset, 'earliest' or 'latest')"
    )
    consume.add_argument("--max-messages", type=_positive_int, help="stop after N records")
    consume.add_argument(
        "--format",
        default="{value}",
        help="output per record, with {topic} {partition} {offset} {timestamp} "
        "{sent_timestamp} {received_timestamp} {corrected_timestamp} {key} {value} "
        "{headers}; \\t and \\n work (default {value})",
    )
    consume.add_argument(
        "--print-timestamps",
        action="store_true",
        help="start each line with the record's four times in ms: timestamp (its own), "
        "sent (producer clock), received (broker clock), corrected (timestamp + received "
        "- sent); null when unknown",
    )
    consume.add_argument(
        "--idle-timeout-ms",
        type=_non_negative_int,
        help="stop after this long without a record (default: wait forever)",
    )
    consume.add_argument(
        "--group",
        help="join this consumer group (share the partitions, commit what was printed); "
        "with --partition: read outside the group, from its committed offset",
    )
    consume.set_defaults(handler=_consume)

    groups = commands.add_parser("groups", help="consumer groups and their lag")
    groups.set_defaults(handler=_help_of(groups))
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
        type=_non_negative_int,
        action="append",
        default=[],
        help="with --topic: only this partition (repeatable; default all)",
    )
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the log start")
    target.add_argument("--to-latest", action="store_true", help="the log end")
    target.add_argument("--to-offset", type=_non_negative_int, metavar="N", help="offset N")
    target.add_argument(
        "--to-datetime",
        metavar="ISO",
        help="the first record at or after this time (e.g. 2026-01-31T12:00:00Z)",
    )
    reset.set_defaults(handler=_groups_reset_offsets)

    acls = commands.add_parser("acls", help="access control lists (authorizer.enabled)")
    acls.set_defaults(handler=_help_of(acls))
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

    quotas = commands.add_parser("quotas", help="client quotas (byte rates, request time)")
    quotas.set_defaults(handler=_help_of(quotas))
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

    console = commands.add_parser(
        "console", parents=[common], help="serve the web console (docs/console.md)"
    )
    console.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:7480",
        help="where to serve it (default 127.0.0.1:7480: this machine only)",
    )
    console.add_argument(
        "--refresh-ms",
        type=_positive_int,
        default=5_000,
        help="how often pages and charts update themselves (default 5000)",
    )
    console.add_argument(
        "--sample-ms",
        type=_positive_int,
        default=5_000,
        help="how often the console samples the cluster for its charts, page open or "
        "not (1000 to 60000; default 5000)",
    )
    console.set_defaults(handler=_console)

    users = commands.add_parser("users", help="SCRAM users (docs/security.md)")
    user_commands = users.add_subparsers(metavar="COMMAND")
    users.set_defaults(handler=_help_of(users))
    user_add = user_commands.add_parser(
        "add",
        parents=[common],
        help="create a user or change its password",
        description="Create a SCRAM user or change its password. The password is read "
        "from --password-file (first line), else asked for on a terminal, else read from "
        "stdin. With --data-dir the user is written into that data directory (the broker "
        "stopped): the first super user, before the first start.",
    )
    user_add.add_argument("name", metavar="NAME")
    user_add.add_argument("--password-file", metavar="FILE")
    user_add.add_argument(
        "--mechanism",
        action="append",
        choices=("SCRAM-SHA-256", "SCRAM-SHA-512"),
        help="default: both",
    )
    user_add.add_argument("--iterations", type=_positive_int, default=4096)
    user_add.add_argument("--data-dir", metavar="DIR")
    user_add.set_defaults(handler=_users_add)
    user_list = user_commands.add_parser("list", parents=[common], help="list users")
    user_list.set_defaults(handler=_users_list)
    user_delete = user_commands.add_parser("delete", parents=[common], help="delete a user")
    user_delete.add_argument("name", metavar="NAME")
    user_delete.add_argument("--mechanism", choices=("SCRAM-SHA-256", "SCRAM-SHA-512"))
    user_delete.set_defaults(handler=_users_delete)
    return parser


def _read_password(args: argparse.Namespace) -> str:
    if args.password_file:
        try:
            with open(args.password_file, encoding="utf-8") as file:
                password = file.readline().rstrip("\r\n")
        except OSError as exc:
            raise UsageError(f"cannot read --password-file: {exc.strerror or exc}") from None
    elif sys.stdin.isatty():
        password = getpass.getpass(f"Password for {args.name}: ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise UsageError("empty password")
    return password


def _users_add(args: argparse.Namespace) -> int:
    password = _read_password(args)
    mechanisms = args.mechanism or ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    if args.data_dir:
        # Written by the broker package (the client never imports it otherwise), as
        # ``tidelog serve`` is; the password goes over a pipe, never on a command line.
        argv = [
            sys.executable, "-m", "broker", "add-user", args.name, "--data-dir", args.data_dir,
            "--iterations", str(args.iterations),
            *(f"--mechanism={m}" for m in mechanisms),
        ]  # fmt: skip
        done = subprocess.run(argv, input=password + "\n", text=True, check=False)
        if done.returncode != 0:
            return EXIT_USAGE if done.returncode == 2 else EXIT_ERROR
        _info(f"Stored user {args.name} ({', '.join(mechanisms)}) in {args.data_dir}")
        return EXIT_OK
    with _admin(args) as admin:
        for mechanism in mechanisms:
            try:
                admin.upsert_user(args.name, password, mechanism, iterations=args.iterations)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    _info(f"Stored user {args.name} ({', '.join(mechanisms)})")
    return EXIT_OK


def _users_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        found = admin.list_users()
    if not found:
        _info("No users.")
        return EXIT_OK
    _print_table(
        ["NAME", "MECHANISMS"],
        [
            [name, ", ".join(f"{m} ({n} iterations)" for m, n in sorted(mechanisms.items()))]
            for name, mechanisms in sorted(found.items())
        ],
    )
    return EXIT_OK


def _users_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_user(args.name, args.mechanism)
    _info(f"Deleted user {args.name}" + (f" ({args.mechanism})" if args.mechanism else ""))
    return EXIT_OK


def _console(args: argparse.Namespace) -> int:
    """``tidelog console``: the web console (``client.console``, the ``console`` extra).

    ``--command-config`` gives the protocol, mechanism and TLS files; a user name and
    password in it are refused: with SASL every console user logs in with their own."""
    try:
        console: Any = importlib.import_module("client.console")
        importlib.import_module("client.console.app")
    except ImportError as exc:
        raise UsageError(
            f"the console needs the 'console' extra (pip install 'tidelog[console]'): {exc}"
        ) from None
    security = _security(args)
    if "sasl_plain_username" in security or "sasl_plain_password" in security:
        raise UsageError("console: users log in on the login page; drop the credentials")
    try:
        host, port = console.parse_listen(args.listen)
        config = console.ConsoleConfig(
            bootstrap_servers=args.bootstrap,
            host=host,
            port=port,
            refresh_ms=args.refresh_ms,
            sample_interval_ms=args.sample_ms,
            request_timeout_ms=args.timeout_ms or 5_000,
            security=security,
        )
    except ValueError as exc:
        raise UsageError(f"console: {exc}") from None
    _info(f"Tidelog console on http://{args.listen}/ (cluster {args.bootstrap}); Ctrl-C stops")
    console.serve(config)
    return EXIT_OK


def _security(args: argparse.Namespace) -> dict[str, Any]:
    """The client security settings of ``--command-config`` (none without it)."""
    path: str | None = getattr(args, "command_config", None)
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            return settings_from_properties(file.read())
    except OSError as exc:
        raise UsageError(f"cannot read --command-config {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--command-config {path}: {exc}") from None


_QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage")


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
        _error("acls add: give at least one --operation")
        return EXIT_USAGE
    if kind is None or name is None or not principal or not permission:
        _error("acls add: give a principal and a resource")
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
    with _admin(args) as admin:
        admin.create_acls(bindings)
    _info(f"Added {len(bindings)} ACL(s).")
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
    _print_table(
        ["RESOURCE", "NAME", "PATTERN", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION"], rows
    )


def _acls_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        found = admin.describe_acls(_acl_filter(args))
    if not found:
        print("No ACLs.")
        return EXIT_OK
    _print_acls(found)
    return EXIT_OK


def _acls_remove(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        removed = admin.delete_acls(_acl_filter(args))
    _info(f"Removed {len(removed)} ACL(s).")
    if removed:
        _print_acls(removed)
    return EXIT_OK


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
    for key, text in _pairs(words, "a quota").items():
        try:
            values[key] = float(text)
        except ValueError:
            raise UsageError(f"quota {key} must be a number, got {text!r}") from None
    with _admin(args) as admin:
        admin.alter_client_quotas(client_id, values, user=args.user)
    shown = ", ".join(f"{k}={_number(v)}" for k, v in values.items())
    _info(f"Set quotas of {target}: {shown}")
    return EXIT_OK


def _quotas_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        found = admin.describe_quotas(user=args.user, client_id=args.client_id)
    if not found:
        _info("No quotas.")
        return EXIT_OK
    _print_table(
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
    with _admin(args) as admin:
        admin.alter_client_quotas(client_id, delete=keys, user=args.user)
    _info(f"Removed quotas of {target}: {', '.join(keys)}")
    return EXIT_OK


def _help_of(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    def show_help(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return EXIT_USAGE

    return show_help


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def _pairs(items: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} must look like KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _timeout(args: argparse.Namespace) -> int:
    value: int | None = args.timeout_ms
    return _DEFAULT_TIMEOUT_MS if value is None else max(value, 1)


def _admin(args: argparse.Namespace) -> AdminClient:
    try:
        return AdminClient(args.bootstrap, request_timeout_ms=_timeout(args), **_security(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# --- cluster ------------------------------------------------------------------------------


def _cluster_describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        cluster = admin.describe_cluster()
    controller = "none" if cluster.controller_id < 0 else str(cluster.controller_id)
    print(f"Cluster: {cluster.cluster_id or '-'}   Controller: {controller}")
    print()
    rows = [
        [str(b.id), b.host, str(b.port), "yes" if b.id == cluster.controller_id else ""]
        for b in cluster.brokers
    ]
    _print_table(["BROKER", "HOST", "PORT", "CONTROLLER"], rows, right={0, 2})
    return EXIT_OK


# --- topics -------------------------------------------------------------------------------


def _topics_create(args: argparse.Namespace) -> int:
    config = _pairs(args.config, "--config")
    with _admin(args) as admin:
        description = admin.create_topic(
            args.name, args.partitions, config, replication_factor=args.replication_factor
        )
    _info(f'Created topic "{description.name}" with {len(description.partitions)} partition(s).')
    return EXIT_OK


def _topics_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        topics = admin.list_topics(include_internal=args.internal)
    if not topics:
        _info("No topics.")
        return EXIT_OK
    headers = ["TOPIC", "PARTITIONS"] + (["INTERNAL"] if args.internal else [])
    rows = [
        [t.name, str(t.partitions)] + (["yes" if t.internal else ""] if args.internal else [])
        for t in topics
    ]
    _print_table(headers, rows, right={1})
    return EXIT_OK


def _leaders_elect(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        moved = admin.elect_preferred_leaders()
    _info(f"Preferred leader election: {moved} partition(s) moved.")
    return EXIT_OK


def _under_replicated(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        names = [args.name] if args.name else [t.name for t in admin.list_topics()]
        topics = [admin.describe_topic(name) for name in names]
    rows = [
        [
            topic.name,
            str(p.partition),
            "offline" if p.leader < 0 else str(p.leader),
            ",".join(map(str, p.replicas)),
            ",".join(map(str, p.isr)),
        ]
        for topic in topics
        for p in topic.partitions
        if len(p.isr) < len(p.replicas)
    ]
    if not rows:
        print("No under-replicated partitions.")
        return EXIT_OK
    _print_table(["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR"], rows, right={1, 2})
    return EXIT_OK


def _topics_describe(args: argparse.Namespace) -> int:
    if args.under_replicated:
        return _under_replicated(args)
    if not args.name:
        _error("topics describe: give a topic name (or --under-replicated)")
        return EXIT_USAGE
    with _admin(args) as admin:
        topic = admin.describe_topic(args.name)
    total_records = sum(p.log_end_offset - p.log_start_offset for p in topic.partitions)
    total_bytes = sum(p.size_bytes for p in topic.partitions)
    print(
        f"Topic: {topic.name}   Partitions: {len(topic.partitions)}   "
        f"Records: {total_records}   Size: {_human_bytes(total_bytes)}"
        + ("   (internal)" if topic.internal else "")
    )
    print()
    rows = [
        [
            str(p.partition),
            "offline" if p.leader < 0 else str(p.leader),
            ",".join(map(str, p.replicas)),
            ",".join(map(str, p.isr)),
            str(p.leader_epoch),
            str(p.log_start_offset),
            str(p.log_end_offset),
            str(p.high_watermark),
            _human_bytes(p.size_bytes),
            str(p.segments),
        ]
        for p in topic.partitions
    ]
    _print_table(
        [
            "PARTITION",
            "LEADER",
            "REPLICAS",
            "ISR",
            "EPOCH",
            "LOG START",
            "LOG END",
            "HIGH WATERMARK",
            "SIZE",
            "SEGMENTS",
        ],
        rows,
        right={0, 1, 4, 5, 6, 7, 8, 9},
    )
    if topic.config:
        print()
        print("Config:")
        _print_table(None, [[f"  {k}", v] for k, v in topic.config.items()])
    return EXIT_OK


def _topics_alter(args: argparse.Namespace) -> int:
    updates = _pairs(args.set, "--set")
    partitions: int | None = args.partitions
    if not updates and not args.delete and partitions is None:
        raise UsageError(
            "topics alter: give --partitions N, or at least one --set KEY=VALUE or --delete KEY"
        )
    with _admin(args) as admin:
        # Partitions first: a refused count (the likelier mistake) leaves the config alone.
        if partitions is not None:
            count = admin.create_partitions(args.name, partitions)
            _info(f'Topic "{args.name}" now has {count} partition(s).')
        if updates or args.delete:
            admin.alter_topic_config(args.name, updates, args.delete)
            _info(f'Updated topic "{args.name}".')
    return EXIT_OK


def _topics_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_topic(args.name)
    _info(f'Deleted topic "{args.name}".')
    return EXIT_OK


# --- produce ------------------------------------------------------------------------------


def _produce(args: argparse.Namespace) -> int:
    separator: str | None = args.key_separator
    if separator == "":
        raise UsageError("--key-separator must not be empty")
    headers = [(k, v.encode()) for k, v in _pairs(args.header, "--header").items()]
    failures: list[BaseException] = []
    sent = 0

    def on_delivery(metadata: RecordMetadata | None, error: BaseException | None) -> None:
        if error is not None:
            failures.append(error)

    try:
        producer = Producer(
            args.bootstrap,
            acks=args.acks,
            compression=None if args.compression == "none" else args.compression,
            linger_ms=args.linger_ms,
            enable_idempotence=args.acks != "0",
            max_block_ms=_timeout(args),
            request_timeout_ms=_timeout(args),
            delivery_timeout_ms=max(_timeout(args) + args.linger_ms, 2 * _timeout(args)),
            **_security(args),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        with producer:
            # Fail fast on a missing topic instead of after max_block_ms per record.
            producer.partitions_for(args.topic, timeout_ms=_timeout(args))
            for number, raw in enumerate(_stdin_lines(), start=1):
                line = raw[:-1] if raw.endswith(b"\n") else raw
                key: bytes | None = None
                if separator is not None:
                    key_part, sep, value_part = line.partition(separator.encode())
                    if not sep:
                        raise UsageError(f"line {number} has no key separator {separator!r}")
                    key, line = key_part, value_part
                producer.send(
                    args.topic,
                    value=line,
                    key=key,
                    headers=headers,
                    partition=args.partition,
                    callback=on_delivery,
                )
                sent += 1
            producer.flush()
    except UsageError:
        _info(f"Stopped: {sent} record(s) before the bad line were sent.")
        raise
    if failures:
        _error(f"{len(failures)} of {sent} record(s) not delivered: {_describe_error(failures[0])}")
        return EXIT_ERROR
    _info(f'Produced {sent} record(s) to "{args.topic}".')
    return EXIT_OK


def _stdin_lines() -> Any:
    return iter(sys.stdin.buffer.readline, b"")


# --- consume ------------------------------------------------------------------------------


def _consume(args: argparse.Namespace) -> int:
    template = _decode_escapes(args.format)
    _check_format(template)
    if args.print_timestamps:
        template = _TIMESTAMPS_PREFIX + template
    if args.offset is not None and args.partition is None:
        raise UsageError("--offset needs --partition")
    try:
        consumer = Consumer(
            args.bootstrap,
            group_id=args.group,
            auto_offset_reset="earliest" if args.from_beginning else "latest",
            enable_auto_commit=args.group is not None,
            request_timeout_ms=max(_timeout(args), 1_000),
            **_security(args),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    count = 0
    out = sys.stdout
    try:
        with consumer:
            if args.partition is None:
                consumer.partitions_for_topic(args.topic, timeout_ms=_timeout(args))
                consumer.subscribe([args.topic])
            else:
                tp = TopicPartition(args.topic, args.partition)
                if args.partition not in consumer.partitions_for_topic(
                    args.topic, timeout_ms=_timeout(args)
                ):
                    raise UsageError(f"topic {args.topic!r} has no partition {args.partition}")
                consumer.assign([tp])
                _seek(consumer, tp, args.offset)
            limit: int | None = args.max_messages
            idle_ms: int | None = args.idle_timeout_ms
            last_record = time.monotonic()
            while limit is None or count < limit:
                # Never take more than will be printed: a group commits what poll returned.
                records = consumer.poll(
                    timeout_ms=_POLL_MS, max_records=None if limit is None else limit - count
                )
                if not records:
                    if idle_ms is not None and (time.monotonic() - last_record) * 1000 >= idle_ms:
                        break
                    continue
                last_record = time.monotonic()
                if limit is not None:
                    records = records[: limit - count]
                out.write("".join(_format_record(template, r) + "\n" for r in records))
                out.flush()
                count += len(records)
    except KeyboardInterrupt:
        pass
    finally:
        try:
            out.flush()
        except BrokenPipeError:
            _quiet_broken_pipe()
    _info(f"Processed a total of {count} message(s).")
    return EXIT_OK


def _seek(consumer: Consumer, tp: TopicPartition, offset: str | None) -> None:
    if offset is None:
        return
    if offset == "earliest":
        consumer.seek_to_beginning(tp)
    elif offset == "latest":
        consumer.seek_to_end(tp)
    else:
        try:
            value = int(offset)
        except ValueError:
            raise UsageError(
                f"--offset must be an offset, 'earliest' or 'latest', got {offset!r}"
            ) from None
        if value < 0:
            raise UsageError(f"--offset must not be negative, got {value}")
        consumer.seek(tp, value)


def _decode_escapes(text: str) -> str:
    try:
        return codecs.decode(text, "unicode_escape")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--format: bad escape sequence ({exc.reason})") from None


def _check_format(template: str) -> None:
    sample = dict.fromkeys(_FORMAT_FIELDS, "")
    try:
        template.format_map(sample)
    except (KeyError, IndexError, ValueError) as exc:
        known = " ".join(f"{{{f}}}" for f in _FORMAT_FIELDS)
        raise UsageError(
            f"--format: unknown field or bad template ({exc}); known: {known}"
        ) from None


def _text(data: bytes | None) -> str:
    if data is None:
        return "null"
    return data.decode("utf-8", errors="backslashreplace")


def _ms_or_null(value: int | None) -> str:
    return "null" if value is None else str(value)


def _format_record(template: str, record: ConsumerRecord) -> str:
    return template.format_map(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp_ms,
            "sent_timestamp": _ms_or_null(record.sent_timestamp_ms),
            "received_timestamp": _ms_or_null(record.received_timestamp_ms),
            "corrected_timestamp": _ms_or_null(record.corrected_timestamp_ms),
            "key": _text(record.key),
            "value": _text(record.value),
            "headers": ",".join(f"{k}={_text(v)}" for k, v in record.headers),
        }
    )


# --- groups -------------------------------------------------------------------------------


def _groups_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        groups = admin.list_groups()
    if not groups:
        _info("No consumer groups.")
        return EXIT_OK
    _print_table(
        ["GROUP", "STATE", "MEMBERS"],
        [[g.group_id, g.state, str(g.members)] for g in groups],
        right={2},
    )
    return EXIT_OK


def _groups_describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        group = admin.describe_group(args.group)
    print(f"Group: {group.group_id}   State: {group.state}   Members: {len(group.members)}")
    print()
    if group.members:
        _print_table(
            ["MEMBER", "CLIENT", "EPOCH", "PARTITIONS"],
            [
                [
                    m.member_id,
                    m.client_id or "-",
                    str(m.member_epoch),
                    ",".join(str(tp) for tp in sorted(m.assignment)) or "-",
                ]
                for m in group.members
            ],
            right={2},
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
    _print_table(
        ["TOPIC", "PARTITION", "COMMITTED", "LOG END", "LAG", "MEMBER"], rows, right={1, 2, 3, 4}
    )
    return EXIT_OK


def _groups_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_group(args.group)
    _info(f'Deleted group "{args.group}".')
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
    with _admin(args) as admin:
        moved = admin.reset_group_offsets(
            args.group,
            partitions,
            to_earliest=args.to_earliest,
            to_latest=args.to_latest,
            to_offset=args.to_offset,
            to_timestamp_ms=timestamp_ms,
        )
    if not moved:
        _info(f'Group "{args.group}" has no committed offsets to reset.')
        return EXIT_OK
    _print_table(
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


# --- terminal output ----------------------------------------------------------------------


def _print_table(
    headers: Sequence[str] | None,
    rows: Sequence[Sequence[str]],
    *,
    right: set[int] | None = None,
    out: TextIO | None = None,
) -> None:
    """Columns padded to their widest cell, two spaces apart; ``right`` columns flush right."""
    stream = out or sys.stdout
    table = ([list(headers)] if headers else []) + [list(r) for r in rows]
    if not table:
        return
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    right = right or set()
    for row in table:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        stream.write("  ".join(cells).rstrip() + "\n")


def _human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # unreachable; keeps type checkers calm


def _describe_error(error: BaseException) -> str:
    message = str(error).strip() or type(error).__name__
    code = getattr(error, "code", None)
    if isinstance(error, TidelogError) and code and code not in message:
        return f"{message} [{code}]"
    return message


def _info(message: str) -> None:
    print(message, file=sys.stderr)


def _error(message: str) -> None:
    print(f"tidelog: error: {message}", file=sys.stderr)


def _quiet_broken_pipe() -> None:
    # The reader went away (`tidelog consume ... | head`): stop writing without a traceback.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
