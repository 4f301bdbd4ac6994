"""``PostgresConnector``: PostgreSQL's committed changes into Tidelog topics.

::

    connector = PostgresConnector(ConnectorConfig(
        dsn="host=127.0.0.1 port=5432 dbname=shop user=cdc",
        bootstrap_servers="127.0.0.1:7410", tables=("public.orders",), topic_prefix="pg"))
    connector.run()          # blocks; connector.stop() from another thread ends it

What ``run`` does (docs/cdc.md has the operator's view):

1. Aligns the publication (``--tables``: created or set to exactly those tables, named
   after the slot unless ``--publication`` names it; ``--publication`` alone: used as it
   is), refuses tables without a primary key, creates one compacted topic per table and
   the compacted offsets topic.
2. Reads its position from the offsets topic. With a finished snapshot and the slot in
   place it streams from that position; without a finished snapshot it drops a leftover
   slot and starts over (as Debezium); a finished snapshot whose slot is gone is a
   ``CdcError``: the changes in between are lost and only a new snapshot can cover them.
3. Initial snapshot: ``CREATE_REPLICATION_SLOT ... LOGICAL pgoutput EXPORT_SNAPSHOT`` on
   the replication connection, which then stays silent (any command there would end the
   exported snapshot); a second connection opens ``REPEATABLE READ`` with ``SET
   TRANSACTION SNAPSHOT`` and reads each table in chunks through a server-side cursor,
   every column as text, emitting ``r`` events; progress goes to ``on_progress`` and the
   log. Then ``START_REPLICATION`` from the slot's consistent point: every transaction
   committed after the snapshot, none before. No gap, no overlap.
4. Streaming: pgoutput protocol version 1 (``client.cdc.pgoutput``); one transaction =
   one ``ChangeUnit`` handed to the ``ChangeSink``; whenever no message is waiting the
   sink is flushed (the transactional sink commits its batch); the slot's flush LSN is
   confirmed only up to ``sink.durable_lsn()``. Transactions at or below the recorded
   position (the slot's confirmed LSN can be behind it: killed between commit and
   confirmation, or a PostgreSQL crash rewinding the slot) are skipped.
5. PostgreSQL going away while streaming (restarted, a connection cut) is survived: the
   sink is flushed (whole transactions only), the connector reconnects for up to
   ``reconnect_timeout_ms`` and streams again from its durable position; a slot that is
   gone then is a ``CdcError``. During the snapshot it is not: the snapshot's exported
   snapshot died with the connection, so the connector stops and the next start takes
   the snapshot again.

Delivery: ``delivery="exactly-once"`` (the default) uses ``TransactionalSink``
(``client.cdc.txn_sink``: a batch of whole PostgreSQL transactions and the position in one
Tidelog transaction, the snapshot as one transaction; it fences an older connector of the
same name when it is built, before the position is read, and the position is read
read_committed). ``delivery="at-least-once"`` keeps ``ProducerSink``: no transactions, so
consumers need not read read_committed and pay no commit per batch, but a restart can
repeat changes.

Lag (``lag()``, ``metrics()``): bytes from the connector's durable position (or, when it
holds nothing unstored, the WAL end PostgreSQL last reported) to the server's current WAL
LSN, asked every second; ms since the oldest commit received and not yet stored.

Why pgoutput and not wal2json: it is built into PostgreSQL (nothing to install on the
database server), filters by publication on the server, and is what PostgreSQL's own
subscribers and Debezium use; wal2json renders every value as JSON text on the server and
cannot stream large transactions.

Thread-safety: ``run`` on one thread; ``stop`` and ``lag`` from any.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras
from psycopg2 import sql

from tidelog.client.admin import AdminClient
from tidelog.client.cdc import catalog
from tidelog.client.cdc.events import (
    CdcError,
    ChangeAssembler,
    ChangeRecord,
    ChangeUnit,
    Position,
    TableShape,
    format_lsn,
    parse_lsn,
    read_records,
    topic_for,
)
from tidelog.client.cdc.pgoutput import Relation
from tidelog.client.cdc.sink import (
    ChangeSink,
    ProducerSink,
    ensure_compacted_topic,
    live_keys,
    read_position,
)
from tidelog.client.cdc.txn_sink import TransactionalSink

__all__ = ["ConnectorConfig", "Lag", "PostgresConnector"]

log = logging.getLogger(__name__)

_SLOT_BUSY_WAIT_MS = 30_000  # a killed predecessor's walsender takes a moment to notice
_SERVER_LSN_INTERVAL_S = 1.0  # how often the server's current WAL LSN is asked (lag)
_RECONNECT_BACKOFF_S = 0.5
DELIVERIES = ("exactly-once", "at-least-once")


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectorConfig:
    """Everything a ``PostgresConnector`` obeys.

    - ``dsn``: libpq connection string of a role with REPLICATION (or superuser);
    - ``tables`` (``schema.table``; bare names are ``public``) and/or ``publication``:
      tables given make the connector own the publication (default name: the slot's);
      a publication alone is used as it stands;
    - ``slot``: the logical replication slot, also the connector's name in the offsets
      topic; ``topic_prefix``: topics are ``PREFIX.SCHEMA.TABLE``;
    - ``offsets_topic``: the compacted topic of positions; ``topic_partitions``: the
      partition count of the topics the connector creates;
    - ``snapshot_chunk_rows``: rows per snapshot read (and per unit handed to the sink);
    - ``security``: producer/consumer/admin security settings (kafka-python's names);
    - ``delivery``: ``exactly-once`` (``TransactionalSink``) or ``at-least-once``
      (``ProducerSink``); ``commit_interval_ms``: the longest a received transaction
      waits before the Tidelog transaction holding it begins; ``snapshot_timeout_ms``:
      the snapshot transaction's timeout;
    - ``reconnect_timeout_ms``: how long a lost PostgreSQL connection is retried.
    """

    dsn: str
    bootstrap_servers: str
    tables: tuple[str, ...] = ()
    publication: str | None = None
    slot: str = "tidelog_cdc"
    topic_prefix: str = "pg"
    offsets_topic: str = "tidelog-cdc-offsets"
    topic_partitions: int = 1
    snapshot_chunk_rows: int = 2_000
    request_timeout_ms: int = 30_000
    security: Mapping[str, Any] = field(default_factory=dict)
    delivery: str = "exactly-once"
    commit_interval_ms: int = 50
    snapshot_timeout_ms: int = 900_000
    reconnect_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.delivery not in DELIVERIES:
            raise ValueError(f"delivery: one of {DELIVERIES}, got {self.delivery!r}")
        if not self.tables and not self.publication:
            raise ValueError("give tables, a publication, or both")
        if not self.slot or not all(c.isalnum() or c == "_" for c in self.slot):
            raise ValueError(f"slot: letters, digits and underscores only, got {self.slot!r}")
        if self.slot != self.slot.lower():
            raise ValueError(f"slot: lower case only (PostgreSQL's rule), got {self.slot!r}")
        for name, value in (
            ("topic_partitions", self.topic_partitions),
            ("snapshot_chunk_rows", self.snapshot_chunk_rows),
            ("commit_interval_ms", self.commit_interval_ms),
            ("snapshot_timeout_ms", self.snapshot_timeout_ms),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")

    @property
    def publication_name(self) -> str:
        return self.publication or self.slot


@dataclass(frozen=True, slots=True)
class Lag:
    """How far the stored position is behind: WAL bytes behind the server's current WAL
    LSN (asked every second), and ms since the oldest commit received and not yet durably
    stored (0 if none)."""

    bytes: int
    ms: int


ProgressCallback = Callable[[str, int, int], None]
"""``on_progress(table, rows_read, rows_estimated)`` during the snapshot."""


class PostgresConnector:
    """Snapshot, then stream, into a ``ChangeSink`` (``ProducerSink`` by default).

    Args:
        config: the settings.
        sink: where units go; if None, the one ``config.delivery`` names (built in
            ``run``, after the topics, before the position is read).
        on_progress: snapshot progress, called after every chunk.
        now_ms: the wall clock (ms), injected for positions and lag.
    """

    def __init__(
        self,
        config: ConnectorConfig,
        *,
        sink: ChangeSink | None = None,
        on_progress: ProgressCallback | None = None,
        now_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        self.config = config
        self._sink = sink
        self._on_progress = on_progress
        self._now_ms = now_ms
        self._stop = threading.Event()
        self.streaming = threading.Event()  # set once START_REPLICATION succeeded
        self._lock = threading.Lock()
        self._wal_end = 0  # the server's WAL end as last reported in the stream
        self._server_lsn = 0  # pg_current_wal_lsn() as last asked
        self._caught_up = 0  # a WAL end up to which everything received is stored
        self._durable = 0
        self._transactions = 0
        self._reconnects = 0
        self._unconfirmed: deque[tuple[int, int]] = deque()  # (end LSN, commit ms)

    # --- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask ``run`` to finish: it stores what it has, confirms it, and returns."""
        self._stop.set()

    def lag(self) -> Lag:
        with self._lock:
            server = max(self._server_lsn, self._wal_end)
            behind = max(0, server - max(self._durable, self._caught_up))
            oldest = self._unconfirmed[0][1] if self._unconfirmed else None
        return Lag(behind, 0 if oldest is None else max(0, self._now_ms() - oldest))

    def metrics(self) -> dict[str, int]:
        """The running connector's gauges and counters: ``lag_bytes``, ``lag_ms``,
        ``durable_lsn`` and ``server_lsn`` (as integers), ``transactions`` (PostgreSQL
        transactions handed to the sink), ``reconnects`` (to PostgreSQL)."""
        lag = self.lag()
        with self._lock:
            return {
                "lag_bytes": lag.bytes,
                "lag_ms": lag.ms,
                "durable_lsn": self._durable,
                "server_lsn": max(self._server_lsn, self._wal_end),
                "transactions": self._transactions,
                "reconnects": self._reconnects,
            }

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> None:
        """Run until ``stop``. Raises ``CdcError`` (a condition the operator must fix),
        psycopg2's errors (PostgreSQL unreachable) and Tidelog's (the brokers)."""
        config = self.config
        sql_conn = self._connect()
        sql_conn.autocommit = True
        repl_conn: Any = None
        sink = self._sink
        try:
            shapes = self._prepare(sql_conn)
            if sink is None:
                # Before the position is read: the transactional sink fences a zombie
                # and its open transaction is aborted, so nobody moves the position on.
                sink = self._default_sink()
            stored = read_position(
                config.bootstrap_servers,
                config.offsets_topic,
                config.slot,
                config.security,
                config.request_timeout_ms,
            )
            repl_conn = self._connect(psycopg2.extras.LogicalReplicationConnection)
            repl_cur = repl_conn.cursor()
            has_slot = catalog.slot_exists(sql_conn, config.slot)
            if stored is not None and stored.position.snapshot_done:
                if not has_slot:
                    raise CdcError(
                        f"replication slot {config.slot!r} is gone but the position "
                        f"{format_lsn(stored.position.lsn)} says the snapshot was taken: "
                        "changes since then are lost; drop the connector's position "
                        "(or use a new slot name) to snapshot again"
                    )
                start_lsn = stored.position.lsn
                log.info("CDC %s: resuming at %s", config.slot, format_lsn(start_lsn))
            else:
                if has_slot:
                    log.info("CDC %s: no finished snapshot; dropping the slot", config.slot)
                    repl_cur.execute(
                        sql.SQL("DROP_REPLICATION_SLOT {} WAIT").format(sql.Identifier(config.slot))
                    )
                start_lsn = self._snapshot(sql_conn, repl_cur, shapes, sink)
            with self._lock:
                self._durable = start_lsn
            while True:
                try:
                    self._stream(sql_conn, repl_cur, sink, start_lsn)
                    return
                except psycopg2.DatabaseError as exc:
                    if self._stop.is_set() or not _connection_lost(exc):
                        raise
                    log.warning("CDC %s: PostgreSQL connection lost: %s", config.slot, exc)
                    self.streaming.clear()
                    # Whole transactions received so far are stored; the rest comes again.
                    start_lsn = max(start_lsn, sink.flush(config.request_timeout_ms) or 0)
                    with self._lock:
                        self._durable = max(self._durable, start_lsn)
                        self._unconfirmed.clear()
                    for conn in (repl_conn, sql_conn):
                        conn.close()
                    sql_conn, repl_conn = self._reconnect()
                    repl_cur = repl_conn.cursor()
        finally:
            if sink is not None and self._sink is None:
                sink.close()
            if repl_conn is not None:
                repl_conn.close()
            sql_conn.close()

    def _default_sink(self) -> ChangeSink:
        config = self.config
        if config.delivery == "at-least-once":
            return ProducerSink(
                config.bootstrap_servers,
                config.slot,
                config.offsets_topic,
                config.security,
                self._now_ms,
            )
        return TransactionalSink(
            config.bootstrap_servers,
            config.slot,
            config.offsets_topic,
            config.security,
            self._now_ms,
            commit_interval_ms=config.commit_interval_ms,
            snapshot_timeout_ms=config.snapshot_timeout_ms,
            request_timeout_ms=config.request_timeout_ms,
        )

    def _reconnect(self) -> tuple[Any, Any]:
        """Both connections again, retried for ``reconnect_timeout_ms``; the slot must
        still be there (``CdcError`` if not: the changes since are lost)."""
        config = self.config
        deadline = time.monotonic() + config.reconnect_timeout_ms / 1000
        while True:
            try:
                sql_conn = self._connect()
                sql_conn.autocommit = True
                try:
                    has_slot = catalog.slot_exists(sql_conn, config.slot)
                    repl_conn = self._connect(psycopg2.extras.LogicalReplicationConnection)
                except BaseException:
                    sql_conn.close()
                    raise
                break
            except psycopg2.OperationalError as exc:
                if time.monotonic() > deadline or self._stop.is_set():
                    raise
                log.info("CDC %s: reconnecting to PostgreSQL: %s", config.slot, exc)
                time.sleep(_RECONNECT_BACKOFF_S)
        if not has_slot:
            repl_conn.close()
            sql_conn.close()
            raise _slot_dropped(config.slot)
        with self._lock:
            self._reconnects += 1
        log.info("CDC %s: reconnected to PostgreSQL", config.slot)
        return sql_conn, repl_conn

    def _connect(self, factory: Any = None) -> Any:
        kwargs: dict[str, Any] = {"options": catalog.SESSION_OPTIONS}
        if factory is not None:
            kwargs["connection_factory"] = factory
        return psycopg2.connect(self.config.dsn, **kwargs)

    def _prepare(self, sql_conn: Any) -> list[TableShape]:
        """The publication, its tables' shapes (PK checked), their topics."""
        config = self.config
        if config.tables:
            catalog.ensure_publication(sql_conn, config.publication_name, config.tables)
        tables = catalog.publication_tables(sql_conn, config.publication_name)
        if not tables:
            raise CdcError(f"publication {config.publication_name!r} publishes no table")
        shapes = [catalog.table_shape(sql_conn, schema, name) for schema, name in tables]
        with AdminClient(
            config.bootstrap_servers,
            request_timeout_ms=config.request_timeout_ms,
            **config.security,
        ) as admin:
            ensure_compacted_topic(admin, config.offsets_topic, 1)
            for shape in shapes:
                topic = topic_for(config.topic_prefix, shape.schema, shape.name)
                ensure_compacted_topic(admin, topic, config.topic_partitions)
        return shapes

    def _snapshot(
        self, sql_conn: Any, repl_cur: Any, shapes: list[TableShape], sink: ChangeSink
    ) -> int:
        """Create the slot, read every table in its exported snapshot; returns the
        consistent point to stream from."""
        config = self.config
        # Rows a previous, unfinished snapshot (or an older connector) left in the topics:
        # each one this snapshot does not read gets a tombstone at its end, or a row
        # deleted in between would stay in the compacted topic forever.
        leftovers = {
            shape: live_keys(
                config.bootstrap_servers,
                topic_for(config.topic_prefix, shape.schema, shape.name),
                config.security,
                config.request_timeout_ms,
            )
            for shape in shapes
        }
        repl_cur.execute(
            sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput EXPORT_SNAPSHOT").format(
                sql.Identifier(config.slot)
            )
        )
        _, consistent_point, snapshot_name, _ = repl_cur.fetchone()
        lsn = parse_lsn(consistent_point)
        log.info(
            "CDC %s: slot created at %s, snapshot %s", config.slot, consistent_point, snapshot_name
        )
        started_ms = self._now_ms()
        reader = self._connect()
        try:
            reader.set_session(
                isolation_level=psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ,
                readonly=True,
            )
            with reader.cursor() as cur:
                # The first statement of the transaction (psycopg2 has just sent BEGIN).
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
                estimates = {}
                for shape in shapes:
                    cur.execute(
                        "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                        (_qualified(shape),),
                    )
                    row = cur.fetchone()
                    estimates[shape] = max(0, int(row[0])) if row else 0
            for shape in shapes:
                self._snapshot_table(
                    reader, shape, lsn, started_ms, estimates[shape], sink, leftovers[shape]
                )
                if self._stop.is_set():
                    raise CdcError("stopped during the snapshot: it starts over next time")
            reader.commit()
        finally:
            reader.close()
        tombstones = tuple(
            ChangeRecord(topic_for(config.topic_prefix, shape.schema, shape.name), key, None)
            for shape, keys in leftovers.items()
            for key in sorted(keys)
        )
        if tombstones:
            log.info("CDC %s: %d rows gone since an earlier snapshot", config.slot, len(tombstones))
        sink.write(ChangeUnit(tombstones, Position(lsn, True, 0), snapshot=True))
        return lsn

    def _snapshot_table(
        self,
        reader: Any,
        shape: TableShape,
        lsn: int,
        ts_ms: int,
        estimate: int,
        sink: ChangeSink,
        leftovers: set[bytes],
    ) -> None:
        """Read one table in chunks; keys read are taken out of ``leftovers``."""
        config = self.config
        columns = sql.SQL(", ").join(
            sql.SQL("{}::text").format(sql.Identifier(name)) for name, _ in shape.columns
        )
        query = sql.SQL("SELECT {} FROM {}").format(
            columns, sql.Identifier(shape.schema, shape.name)
        )
        done = 0
        with reader.cursor(name=f"tidelog_snapshot_{shape.name}"[:60]) as cur:
            cur.itersize = config.snapshot_chunk_rows
            cur.execute(query)
            while True:
                rows = cur.fetchmany(config.snapshot_chunk_rows)
                if not rows:
                    break
                records = read_records(config.topic_prefix, shape, rows, lsn, ts_ms)
                leftovers.difference_update(r.key for r in records)
                sink.write(ChangeUnit(tuple(records), None, snapshot=True))
                done += len(rows)
                log.info(
                    "CDC snapshot %s.%s: %d of ~%d rows", shape.schema, shape.name, done, estimate
                )
                if self._on_progress is not None:
                    self._on_progress(f"{shape.schema}.{shape.name}", done, estimate)
                if self._stop.is_set():
                    return

    def _stream(self, sql_conn: Any, repl_cur: Any, sink: ChangeSink, start_lsn: int) -> None:
        """Stream from ``start_lsn`` until ``stop``; transactions at or below it are skipped."""
        config = self.config
        self._start_replication(repl_cur, start_lsn)
        self.streaming.set()

        def key_of(relation: Relation) -> tuple[str, ...]:
            return catalog.primary_key(sql_conn, relation.oid, f"{relation.schema}.{relation.name}")

        assembler = ChangeAssembler(config.topic_prefix, key_of)
        confirmed = 0
        handled = 0
        asked_server = 0.0
        wal_end = 0  # the latest WAL end heard, published to ``lag()`` once a unit
        read_message = repl_cur.read_message
        feed_payload = assembler.feed_payload
        drained = getattr(sink, "drained", None)
        wakeup = getattr(sink, "wakeup_fd", None)
        waits: list[Any] = [repl_cur] if wakeup is None else [repl_cur, wakeup()]
        while not self._stop.is_set():
            if time.monotonic() - asked_server >= _SERVER_LSN_INTERVAL_S:
                self._ask_server_lsn(sql_conn, sink)
                asked_server = time.monotonic()
            message = read_message()
            if message is None:
                # Drained: store the batch now (the transactional sink commits it in the
                # background; another sink stores it before this returns).
                if drained is not None:
                    drained()
                else:
                    sink.flush(config.request_timeout_ms)
                wal_end = max(wal_end, int(repl_cur.wal_end))
                with self._lock:
                    self._wal_end = max(self._wal_end, wal_end)
                confirmed = self._confirm(repl_cur, sink, confirmed)
                if assembler.idle:
                    self._note_caught_up(int(repl_cur.wal_end))
                ready, _, _ = select.select(waits, [], [], 0.2)
                if len(waits) > 1 and waits[1] in ready:
                    _drain_pipe(waits[1])
                continue
            # Published to ``lag()`` once a unit (and when drained), not once a message:
            # the lock per message cost more than the lag needs.
            wal_end = message.wal_end
            unit = feed_payload(message.payload)
            if unit is not None and unit.position is not None:
                if unit.position.lsn <= start_lsn:
                    log.debug("CDC: skipping %s, already stored", format_lsn(unit.position.lsn))
                else:
                    with self._lock:
                        self._wal_end = max(self._wal_end, wal_end)
                        self._unconfirmed.append((unit.position.lsn, unit.position.commit_ts_ms))
                        self._transactions += 1
                    sink.write(unit)
            handled += 1
            if handled % 256 == 0:
                confirmed = self._confirm(repl_cur, sink, confirmed)
        durable = sink.flush(config.request_timeout_ms)
        if durable is not None:
            repl_cur.send_feedback(flush_lsn=max(durable, confirmed), force=True)
            log.info("CDC %s: stopped at %s", config.slot, format_lsn(durable))

    def _ask_server_lsn(self, sql_conn: Any, sink: ChangeSink) -> None:
        """The server's current WAL LSN, for the lag (and written with the positions)."""
        with sql_conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            row = cur.fetchone()
        server = parse_lsn(str(row[0])) if row else 0
        with self._lock:
            self._server_lsn = max(self._server_lsn, server)
        if isinstance(sink, ProducerSink | TransactionalSink):
            sink.server_wal_end = max(server, self._wal_end)

    def _note_caught_up(self, wal_end: int) -> None:
        """Nothing received is unstored: the connector is as far as the WAL end heard."""
        with self._lock:
            if not self._unconfirmed:
                self._caught_up = max(self._caught_up, wal_end)

    def _start_replication(self, repl_cur: Any, lsn: int) -> None:
        """START_REPLICATION, retried while a killed predecessor's walsender still holds
        the slot (it notices the dead connection within moments)."""
        config = self.config
        deadline = time.monotonic() + _SLOT_BUSY_WAIT_MS / 1000
        while True:
            try:
                repl_cur.start_replication(
                    slot_name=config.slot,
                    slot_type=psycopg2.extras.REPLICATION_LOGICAL,
                    start_lsn=lsn,
                    options={"proto_version": "1", "publication_names": config.publication_name},
                    decode=False,
                    # A status update every second (psycopg2's default is 10 s): an idle
                    # slot's confirmed LSN follows the WAL end within a second, so `cdc
                    # status` and anyone waiting for the connector to catch up see it soon;
                    # the cost is one small message a second.
                    status_interval=1,
                )
                return
            except psycopg2.errors.ObjectInUse:
                if time.monotonic() > deadline or self._stop.is_set():
                    raise
                time.sleep(0.2)
            except psycopg2.errors.UndefinedObject as exc:  # dropped since it was checked
                raise _slot_dropped(config.slot) from exc

    def _confirm(self, repl_cur: Any, sink: ChangeSink, confirmed: int) -> int:
        """Confirm the sink's durable LSN to PostgreSQL if it moved (at once: the slot
        may free WAL); returns the new one."""
        durable = sink.durable_lsn()
        if durable is None or durable <= confirmed:
            return confirmed
        repl_cur.send_feedback(flush_lsn=durable, force=True)
        with self._lock:
            self._durable = max(self._durable, durable)
            while self._unconfirmed and self._unconfirmed[0][0] <= durable:
                self._unconfirmed.popleft()
        return durable


def _drain_pipe(fd: int) -> None:
    """Read a sink's wake-up pipe empty (non-blocking)."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _slot_dropped(slot: str) -> CdcError:
    return CdcError(
        f"replication slot {slot!r} was dropped while the connector ran: changes since "
        "its position are lost; drop the connector's position (or use a new slot name) "
        "to snapshot again"
    )


def _connection_lost(exc: psycopg2.DatabaseError) -> bool:
    """A PostgreSQL error that means the session is gone, not that a statement failed:
    a broken connection, the server shutting down (57P01), or the server ending the
    replication COPY (psycopg2: "no COPY in progress", no SQLSTATE)."""
    return (
        isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError) or exc.pgcode is None
    )


def _qualified(shape: TableShape) -> str:
    return '"{}"."{}"'.format(shape.schema.replace('"', '""'), shape.name.replace('"', '""'))
