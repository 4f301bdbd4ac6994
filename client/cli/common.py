"""What every ``tidelog`` command shares: options, connection settings, terminal output.

Owns the exit statuses and ``UsageError`` (bad arguments argparse cannot see); the parent
parser of the options every command takes (``--bootstrap``, ``--timeout-ms``, ``-v``,
``--command-config``) and the argument types; turning those options into client settings
(the timeout, the security settings of ``--command-config``, an ``AdminClient``); and the
terminal: aligned tables, byte sizes, one-line error messages, info lines on stderr, a
reader that went away. Nothing here talks to a broker by itself; every function is
stateless and safe to call from any thread (the output functions write to the streams
``sys`` holds at call time, so a test's captured streams receive them).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO, TypeAlias

from tidelog.client.admin import AdminClient
from tidelog.client.security import settings_from_properties
from tidelog.storage.errors import TidelogError

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Handler",
    "Subcommands",
    "UsageError",
    "admin_client",
    "common_options",
    "describe_error",
    "help_of",
    "human_bytes",
    "non_negative_int",
    "parse_pairs",
    "positive_int",
    "print_error",
    "print_info",
    "print_table",
    "quiet_broken_pipe",
    "security_settings",
    "timeout_ms",
]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

DEFAULT_TIMEOUT_MS = 10_000

Handler: TypeAlias = Callable[[argparse.Namespace], int]
"""What a command runs: its parsed arguments in, its exit status out."""

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``ArgumentParser.add_subparsers`` returns: a command group registers into it."""


class UsageError(Exception):
    """Bad arguments that argparse cannot see (exit status 2)."""


# --- options ------------------------------------------------------------------------------


def common_options(default_bootstrap: str) -> argparse.ArgumentParser:
    """The parent parser of every command's own options.

    Args:
        default_bootstrap: shown in ``--bootstrap``'s help; the value itself comes from
            the root parser, because every option here defaults to ``argparse.SUPPRESS``
            (given after the command, it overrides the one given before it).
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        default=argparse.SUPPRESS,
        help=f"broker addresses, HOST:PORT[,HOST:PORT...] (default {default_bootstrap})",
    )
    common.add_argument(
        "--timeout-ms",
        type=non_negative_int,
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
    return common


def help_of(parser: argparse.ArgumentParser) -> Handler:
    """A handler for a command group given no action: ``parser``'s help on stderr, status 2."""

    def show_help(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return EXIT_USAGE

    return show_help


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (``ArgumentTypeError`` otherwise)."""
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0 (``ArgumentTypeError`` otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def parse_pairs(items: Sequence[str], what: str) -> dict[str, str]:
    """``KEY=VALUE`` words to a dict (a later key wins).

    Raises:
        UsageError: a word without ``=`` or with an empty key; ``what`` names the option.
    """
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} must look like KEY=VALUE, got {item!r}")
        out[key] = value
    return out


# --- connection settings ------------------------------------------------------------------


def timeout_ms(args: argparse.Namespace) -> int:
    """``--timeout-ms``, at least 1; ``DEFAULT_TIMEOUT_MS`` when not given."""
    value: int | None = args.timeout_ms
    return DEFAULT_TIMEOUT_MS if value is None else max(value, 1)


def security_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The client security settings of ``--command-config`` (none without it).

    Raises:
        UsageError: the file cannot be read or holds a bad setting.
    """
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


def admin_client(args: argparse.Namespace) -> AdminClient:
    """An ``AdminClient`` for ``--bootstrap`` with the timeout and security settings.

    Raises:
        UsageError: the settings are refused (a bad bootstrap list, a bad security file).
    """
    try:
        return AdminClient(
            args.bootstrap, request_timeout_ms=timeout_ms(args), **security_settings(args)
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# --- terminal output ----------------------------------------------------------------------


def print_table(
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


def human_bytes(size: int) -> str:
    """``size`` in B (whole), KiB, MiB or GiB (one decimal)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # unreachable; keeps type checkers calm


def describe_error(error: BaseException) -> str:
    """An error's message, ending with ``[CODE]`` for a ``TidelogError`` that has one."""
    message = str(error).strip() or type(error).__name__
    code = getattr(error, "code", None)
    if isinstance(error, TidelogError) and code and code not in message:
        return f"{message} [{code}]"
    return message


def print_info(message: str) -> None:
    """A summary line, on stderr (stdout carries records and tables)."""
    print(message, file=sys.stderr)


def print_error(message: str) -> None:
    """An error as one line on stderr: ``tidelog: error: MESSAGE``."""
    print(f"tidelog: error: {message}", file=sys.stderr)


def quiet_broken_pipe() -> None:
    """Point stdout at ``/dev/null`` so the interpreter's final flush cannot fail."""
    # The reader went away (`tidelog consume ... | head`): stop writing without a traceback.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
