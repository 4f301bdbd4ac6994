"""``tidelog users``: SCRAM users, on a running broker or in a stopped broker's data directory.

::

    tidelog users add NAME [--password-file F] [--mechanism M]... [--iterations N]
                           [--data-dir D]  (D: write into a data directory, broker stopped)
    tidelog users list
    tidelog users delete NAME [--mechanism M]

The password is read from ``--password-file`` (first line), else asked for on a
terminal, else read from stdin; it never appears on a command line. ``--data-dir`` runs
``python -m broker add-user`` in a subprocess, so the client package still never imports
the broker (docs/security.md).
"""

from __future__ import annotations

import argparse
import getpass
import subprocess
import sys

from tidelog.client.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    Subcommands,
    UsageError,
    admin_client,
    help_of,
    positive_int,
    print_info,
    print_table,
)

__all__ = ["register"]


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``users`` and its actions to ``commands``; ``common`` is every action's parent."""
    users = commands.add_parser("users", help="SCRAM users (docs/security.md)")
    user_commands = users.add_subparsers(metavar="COMMAND")
    users.set_defaults(handler=help_of(users))
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
    user_add.add_argument("--iterations", type=positive_int, default=4096)
    user_add.add_argument("--data-dir", metavar="DIR")
    user_add.set_defaults(handler=_users_add)
    user_list = user_commands.add_parser("list", parents=[common], help="list users")
    user_list.set_defaults(handler=_users_list)
    user_delete = user_commands.add_parser("delete", parents=[common], help="delete a user")
    user_delete.add_argument("name", metavar="NAME")
    user_delete.add_argument("--mechanism", choices=("SCRAM-SHA-256", "SCRAM-SHA-512"))
    user_delete.set_defaults(handler=_users_delete)


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
            sys.executable, "-m", "tidelog.broker", "add-user", args.name,
            "--data-dir", args.data_dir,
            "--iterations", str(args.iterations),
            *(f"--mechanism={m}" for m in mechanisms),
        ]  # fmt: skip
        done = subprocess.run(argv, input=password + "\n", text=True, check=False)
        if done.returncode != 0:
            return EXIT_USAGE if done.returncode == 2 else EXIT_ERROR
        print_info(f"Stored user {args.name} ({', '.join(mechanisms)}) in {args.data_dir}")
        return EXIT_OK
    with admin_client(args) as admin:
        for mechanism in mechanisms:
            try:
                admin.upsert_user(args.name, password, mechanism, iterations=args.iterations)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    print_info(f"Stored user {args.name} ({', '.join(mechanisms)})")
    return EXIT_OK


def _users_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        found = admin.list_users()
    if not found:
        print_info("No users.")
        return EXIT_OK
    print_table(
        ["NAME", "MECHANISMS"],
        [
            [name, ", ".join(f"{m} ({n} iterations)" for m, n in sorted(mechanisms.items()))]
            for name, mechanisms in sorted(found.items())
        ],
    )
    return EXIT_OK


def _users_delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.delete_user(args.name, args.mechanism)
    print_info(f"Deleted user {args.name}" + (f" ({args.mechanism})" if args.mechanism else ""))
    return EXIT_OK
