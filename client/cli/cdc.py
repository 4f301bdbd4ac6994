"""``tidelog cdc``: change data capture from PostgreSQL (``client.cdc``, the ``cdc`` extra).

::

    tidelog cdc postgres --dsn DSN [--tables s.t,...] [--publication P] [--slot NAME]
                         [--topic-prefix PREFIX] [--offsets-topic T] [--partitions N]
                         [--chunk-rows N] [--delivery exactly-once|at-least-once]
                         [--commit-interval-ms MS]
    tidelog cdc status [--offsets-topic T] [--dsn DSN]

``postgres`` runs the connector in the foreground until SIGTERM or Ctrl-C, which store
and confirm what was read, then exit 0; snapshot progress goes to stderr. ``--delivery``
(default ``exactly-once``: Tidelog transactions, read the topics read_committed) picks the
sink (docs/cdc.md). ``status``
lists every connector's position from the offsets topic, with its lag (WAL bytes and ms
behind) as of the last position written; with ``--dsn`` also the slot's live lag
(``pg_current_wal_lsn()`` minus its confirmed flush LSN). The ``client.cdc`` package is
imported only when a command runs, so the command line works without the extra.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import time
from typing import Any

from tidelog.client.cli.common import (
    EXIT_OK,
    Subcommands,
    UsageError,
    help_of,
    positive_int,
    print_info,
    print_table,
    security_settings,
)

__all__ = ["register"]

_DEFAULT_OFFSETS_TOPIC = "tidelog-cdc-offsets"


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``cdc postgres`` and ``cdc status`` to ``commands``."""
    cdc = commands.add_parser("cdc", help="change data capture from PostgreSQL (docs/cdc.md)")
    cdc.set_defaults(handler=help_of(cdc))
    actions = cdc.add_subparsers(title="cdc commands", metavar="ACTION")
    postgres = actions.add_parser(
        "postgres", parents=[common], help="stream a PostgreSQL database's changes to topics"
    )
    postgres.add_argument("--dsn", required=True, help="libpq connection string")
    postgres.add_argument("--tables", help="schema.table[,schema.table...] to capture")
    postgres.add_argument("--publication", help="publication to use (or create for --tables)")
    postgres.add_argument("--slot", default="tidelog_cdc", help="replication slot name")
    postgres.add_argument("--topic-prefix", default="pg", help="topics are PREFIX.SCHEMA.TABLE")
    postgres.add_argument("--offsets-topic", default=_DEFAULT_OFFSETS_TOPIC)
    postgres.add_argument("--partitions", type=positive_int, default=1)
    postgres.add_argument("--chunk-rows", type=positive_int, default=2_000)
    postgres.add_argument(
        "--delivery", choices=("exactly-once", "at-least-once"), default="exactly-once"
    )
    postgres.add_argument(
        "--commit-interval-ms",
        type=positive_int,
        default=50,
        help="longest a change waits before its transaction begins (exactly-once)",
    )
    postgres.set_defaults(handler=_postgres)
    status = actions.add_parser("status", parents=[common], help="positions and lag")
    status.add_argument("--offsets-topic", default=_DEFAULT_OFFSETS_TOPIC)
    status.add_argument("--dsn", help="also ask PostgreSQL for each slot's live lag")
    status.set_defaults(handler=_status)


def _package() -> Any:
    try:
        return importlib.import_module("tidelog.client.cdc")
    except ImportError as exc:
        raise UsageError(f"cdc needs the 'cdc' extra (pip install 'tidelog[cdc]'): {exc}") from None


def _postgres(args: argparse.Namespace) -> int:
    cdc = _package()
    tables = tuple(t.strip() for t in (args.tables or "").split(",") if t.strip())
    try:
        config = cdc.ConnectorConfig(
            dsn=args.dsn,
            bootstrap_servers=args.bootstrap,
            tables=tables,
            publication=args.publication,
            slot=args.slot,
            topic_prefix=args.topic_prefix,
            offsets_topic=args.offsets_topic,
            topic_partitions=args.partitions,
            snapshot_chunk_rows=args.chunk_rows,
            delivery=args.delivery,
            commit_interval_ms=args.commit_interval_ms,
            request_timeout_ms=args.timeout_ms or 30_000,
            security=security_settings(args),
        )
    except ValueError as exc:
        raise UsageError(f"cdc postgres: {exc}") from None

    def progress(table: str, done: int, estimate: int) -> None:
        print_info(f"snapshot {table}: {done} rows of ~{estimate}")

    connector = cdc.PostgresConnector(config, on_progress=progress)

    def stop(signum: int, frame: object) -> None:
        connector.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print_info(f"cdc {config.slot}: {args.dsn} -> {args.bootstrap}; SIGTERM or Ctrl-C stops")
    try:
        connector.run()
    except cdc.CdcError as exc:
        raise UsageError(f"cdc postgres: {exc}") from None
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    sink = importlib.import_module("tidelog.client.cdc.sink")
    events = importlib.import_module("tidelog.client.cdc.events")
    positions = sink.read_positions(
        args.bootstrap, args.offsets_topic, security_settings(args), args.timeout_ms or 10_000
    )
    live = _live_lag(args.dsn) if args.dsn else {}
    now_ms = time.time_ns() // 1_000_000
    rows = []
    for name, stored in sorted(positions.items()):
        position = stored.position
        lag_ms = stored.written_ms - position.commit_ts_ms if position.commit_ts_ms else 0
        row = [
            name,
            events.format_lsn(position.lsn),
            "done" if position.snapshot_done else "running",
            str(max(0, stored.server_wal_end - position.lsn)),
            str(max(0, lag_ms)),
            str(max(0, now_ms - stored.written_ms)),
        ]
        if args.dsn:
            row.append(live.get(name, "no slot"))
        rows.append(row)
    headers = ["CONNECTOR", "LSN", "SNAPSHOT", "LAG_BYTES", "LAG_MS", "WRITTEN_MS_AGO"]
    print_table(headers + (["SLOT_LAG_BYTES"] if args.dsn else []), rows, right={3, 4, 5, 6})
    return EXIT_OK


def _live_lag(dsn: str) -> dict[str, str]:
    psycopg2: Any = importlib.import_module("psycopg2")
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT slot_name, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) "
                "FROM pg_replication_slots WHERE plugin = 'pgoutput'"
            )
            return {str(name): str(int(lag or 0)) for name, lag in cur.fetchall()}
    finally:
        conn.close()
