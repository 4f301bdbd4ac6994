"""``tidelog console``: start the web console (``client.console``, the ``console`` extra).

::

    tidelog console [--listen 127.0.0.1:7480] [--refresh-ms MS] [--sample-ms MS]

Only the launcher lives here: the console package is imported when the command runs, so
the command line works without the extra installed (and says how to get it when asked
for the console). The console itself is documented in docs/console.md.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from tidelog.client.cli.common import (
    EXIT_OK,
    Subcommands,
    UsageError,
    positive_int,
    print_info,
    security_settings,
)

__all__ = ["register"]


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``console`` to ``commands``; ``common`` is its parent parser."""
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
        type=positive_int,
        default=5_000,
        help="how often pages and charts update themselves (default 5000)",
    )
    console.add_argument(
        "--sample-ms",
        type=positive_int,
        default=5_000,
        help="how often the console samples the cluster for its charts, page open or "
        "not (1000 to 60000; default 5000)",
    )
    console.set_defaults(handler=_console)


def _console(args: argparse.Namespace) -> int:
    """``tidelog console``: the web console (``client.console``, the ``console`` extra).

    ``--command-config`` gives the protocol, mechanism and TLS files; a user name and
    password in it are refused: with SASL every console user logs in with their own."""
    try:
        console: Any = importlib.import_module("tidelog.client.console")
        importlib.import_module("tidelog.client.console.app")
    except ImportError as exc:
        raise UsageError(
            f"the console needs the 'console' extra (pip install 'tidelog[console]'): {exc}"
        ) from None
    security = security_settings(args)
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
    print_info(f"Tidelog console on http://{args.listen}/ (cluster {args.bootstrap}); Ctrl-C stops")
    console.serve(config)
    return EXIT_OK
