"""The ``tidelog`` program: the root parser, the command groups in it, dispatch.

``main`` builds the root parser (the global options, then each command group's
``register``, in the order ``tidelog --help`` lists them), parses, sets up logging and
runs the chosen command's handler, turning what escapes it into an exit status and a
one-line message: ``UsageError`` 2, ``TidelogError`` 1, Ctrl-C 130, a closed stdout 0.

``serve`` and ``cluster up`` belong to the broker: ``main`` hands them to
``broker.cli.main`` through ``_run_broker``, a lazy import, so the client never imports the
broker package unless one of them runs (their entries in the parser exist only for the
help).
This module is where the environment is read (``TIDELOG_BOOTSTRAP``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from tidelog.client.cli import (
    acls,
    cdc,
    cluster,
    configs,
    console,
    consume,
    groups,
    produce,
    quotas,
    reassign,
    topics,
    transactions,
    users,
)
from tidelog.client.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Handler,
    UsageError,
    common_options,
    describe_error,
    non_negative_int,
    print_error,
    quiet_broken_pipe,
)
from tidelog.client.config import DEFAULT_BOOTSTRAP
from tidelog.storage.errors import TidelogError

__all__ = ["main"]

log = logging.getLogger(__name__)

# Registered in this order, which is the order ``tidelog --help`` lists them in
# (``cluster`` registers ``cluster`` and ``leaders``, ``reassign`` ``reassign`` and
# ``brokers``).
_COMMAND_GROUPS = (
    cluster,
    reassign,
    topics,
    configs,
    produce,
    consume,
    groups,
    transactions,
    acls,
    quotas,
    console,
    users,
    cdc,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (the console script exits with it).

    Args:
        argv: the arguments after the program name; ``sys.argv[1:]`` when None.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "serve":
        return _run_broker(["serve", *args_list[1:]])
    if args_list[:2] == ["cluster", "up"]:
        return _run_broker(["cluster-up", *args_list[2:]])
    parser = _parser()
    args = parser.parse_args(args_list)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return handler(args)
    except UsageError as exc:
        print_error(str(exc))
        return EXIT_USAGE
    except TidelogError as exc:
        print_error(describe_error(exc))
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        quiet_broken_pipe()
        return EXIT_OK


def _run_broker(argv: Sequence[str]) -> int:
    """``tidelog serve`` and ``tidelog cluster up``: the broker's own command line,
    imported only when asked for."""
    broker_cli: Any = importlib.import_module("tidelog.broker.cli")
    status: int = broker_cli.main(list(argv))
    return status


def _parser() -> argparse.ArgumentParser:
    default_bootstrap = os.environ.get("TIDELOG_BOOTSTRAP", DEFAULT_BOOTSTRAP)
    common = common_options(default_bootstrap)

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
    parser.add_argument("--timeout-ms", type=non_negative_int, default=None)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    parser.add_argument(
        "--command-config",
        metavar="FILE",
        default=None,
        help="properties file of security settings (Kafka tools' format)",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    commands.add_parser("serve", help="run the broker daemon (see `tidelog serve --help`)")
    for group in _COMMAND_GROUPS:
        group.register(commands, common)
    return parser
