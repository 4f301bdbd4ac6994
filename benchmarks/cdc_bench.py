"""CDC benchmark (issue #30): the PostgreSQL connector against PostgreSQL's own
``pg_recvlogical`` reading a slot of the same type, in the same run.

::

    python benchmarks/cdc_bench.py [--transactions 20000] [--rate 5000] [--seconds 20]
                                   [--rounds 2] [--quick] [--profile FILE]

A real PostgreSQL (``tests.cdc.postgres.running_postgres``: Debian's server in a
temporary directory, ``wal_level=logical``, fsync off) and one broker process
(``kafka_bench.start_broker``). The load is pgbench's own program with a TPC-B-like
script on four tables (``bench_accounts`` of ``--accounts`` rows, 100 tellers, 10
branches, ``bench_history``), one transaction = 3 UPDATEs, 1 INSERT into the history and
1 DELETE of the history row inserted 500 transactions earlier: 5 row changes. One
publication of the four tables; the connector and ``pg_recvlogical`` each read their own
slot of it with ``pgoutput`` protocol 1 (the ceiling: PostgreSQL decoding and sending,
a C client writing to /dev/null).

1. **Flat out** (``cdc_rows_per_s``, ``pg_recvlogical_rows_per_s``,
   ``cdc_over_pg_recvlogical``, target >= 0.5): with nobody reading, pgbench runs
   ``--transactions`` transactions as fast as it can (4 clients; its own rate is
   ``pgbench_rows_per_s``, what the database produced), then a marker transaction; each
   reader then drains that backlog from its slot, one after the other, timed from its
   start to the last change readable: ``pg_recvlogical --endpos`` (the WAL position after
   the marker) exits; the connector (a warm worker process, imports done, told "go") has
   put every change in the topics, as a read_committed consumer's end offsets say. Rows
   = row changes in PostgreSQL (a delete's tombstone is not counted). Two more readers,
   each on its own slot, say where the connector's time goes: ``psycopg2_read_rows_per_s``
   (psycopg2's ``read_message`` alone, in this process) and
   ``psycopg2_decode_rows_per_s`` (with ``pgoutput.decode`` and ``ChangeAssembler``, the
   records built, no broker). Rounds alternate the order (A B C D, D C B A) and each
   reader keeps its best. ``connector_cpu_us_per_row`` and ``broker_cpu_us_per_row``: the
   CPU time the connector's and the broker's processes used in the connector's drain,
   a row (the best round).
2. **Steady** (``commit_to_visible_p50_ms`` / ``_p99_ms``, target p99 <= 200 at 5,000
   changes/s): the connector runs, pgbench holds ``--rate`` changes/s (``-R``) for
   ``--seconds``; a read_committed consumer on the history topic takes, for each insert,
   the time it received the record minus the transaction's PostgreSQL commit time
   (``source.ts_ms``, the same machine's clock). ``steady_rows_per_s`` is the rate pgbench
   held; ``steady_samples`` the transactions measured.

``--profile FILE`` runs the connector worker under cProfile in the flat-out rounds and
writes the stats to FILE (``python -m pstats FILE``). ``--delivery`` is passed to the
connector when it has that setting. The machine is shared and noisy: compare figures of
one run only. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg2  # noqa: E402 - after the path entry above
import psycopg2.extras  # noqa: E402

from benchmarks.kafka_bench import start_broker  # noqa: E402
from tests.cdc.postgres import Postgres, running_postgres  # noqa: E402
from tidelog.client.consumer import Consumer  # noqa: E402
from tidelog.client.types import TopicPartition  # noqa: E402

DATABASE = "bench"
PUBLICATION = "bench_pub"
CONNECTOR_SLOT = "tidelog_bench"
RECV_SLOT = "recvlogical_bench"
READ_SLOT = "python_read_bench"  # psycopg2 reading, nothing else
DECODE_SLOT = "python_decode_bench"  # psycopg2, pgoutput.decode and ChangeAssembler
PREFIX = "bench"
TABLES = ("bench_accounts", "bench_tellers", "bench_branches", "bench_history")
CHANGES_PER_TXN = 5
DELETE_DISTANCE = 500  # a transaction deletes the history row inserted this many before
CLIENTS = 4
TIMEOUT_S = 300.0
MARKER = "end-of-round"

# PostgreSQL for a benchmark: no checkpoint in the middle of a round, nothing vacuuming
# beside the load, a walsender never timing out on a reader that is not reading yet.
# ``synchronous_commit`` back on (the test server turns it off): a walsender decodes only
# flushed WAL, and with it off a commit waits for the WAL writer's next round
# (``wal_writer_delay``, 200 ms) before any reader can see it. ``fsync`` stays off: the
# disk's flush time would be pgbench's, not the readers'.
SERVER_SETTINGS = {
    "synchronous_commit": "on",
    "max_wal_size": "4GB",
    "checkpoint_timeout": "1h",
    "autovacuum": "off",
    "wal_sender_timeout": "0",
    "max_connections": "50",
}

PGBENCH_SCRIPT = f"""\
\\set aid random(1, :accounts)
\\set tid random(1, 100)
\\set bid random(1, 10)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE bench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
UPDATE bench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE bench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO bench_history (tid, bid, aid, delta, mtime, filler)
  VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP, 'pgbench') RETURNING hid \\gset
DELETE FROM bench_history WHERE hid = :hid - {DELETE_DISTANCE};
END;
"""


# --- the database ------------------------------------------------------------------------


def _sql(dsn: str, *statements: str) -> list[tuple[Any, ...]]:
    """Run ``statements`` in one transaction; the last one's rows."""
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            rows: list[tuple[Any, ...]] = []
            for statement in statements:
                cur.execute(statement)
                rows = cur.fetchall() if cur.description else []
            return rows
    finally:
        conn.close()


def create_schema(server: Postgres, accounts: int) -> str:
    """The bench database, its four tables filled (history with ``DELETE_DISTANCE``
    rows, so every transaction's delete finds its row), the publication; its DSN."""
    admin = psycopg2.connect(server.dsn())
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {DATABASE}")
    admin.close()
    dsn = server.dsn(DATABASE)
    _sql(
        dsn,
        "CREATE TABLE bench_branches (bid int PRIMARY KEY, bbalance int, filler char(88))",
        "CREATE TABLE bench_tellers (tid int PRIMARY KEY, bid int, tbalance int, filler char(84))",
        "CREATE TABLE bench_accounts (aid int PRIMARY KEY, bid int, abalance int, filler char(84))",
        "CREATE TABLE bench_history (hid bigserial PRIMARY KEY, tid int, bid int, aid int, "
        "delta int, mtime timestamptz, filler char(22))",
        "INSERT INTO bench_branches SELECT i, 0, '' FROM generate_series(1, 10) i",
        "INSERT INTO bench_tellers SELECT i, (i - 1) / 10 + 1, 0, '' "
        "FROM generate_series(1, 100) i",
        f"INSERT INTO bench_accounts SELECT i, (i - 1) % 10 + 1, 0, '' "
        f"FROM generate_series(1, {accounts}) i",
        f"INSERT INTO bench_history (tid, bid, aid, delta, mtime, filler) "
        f"SELECT 1, 1, 1, 0, now(), 'seed' FROM generate_series(1, {DELETE_DISTANCE})",
        f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(TABLES)}",
    )
    return dsn


def _history_rows(dsn: str) -> int:
    return int(_sql(dsn, "SELECT count(*) FROM bench_history")[0][0])


def _wal_lsn(dsn: str) -> str:
    return str(_sql(dsn, "SELECT pg_current_wal_lsn()::text")[0][0])


def pgbench(
    server: Postgres, script: Path, accounts: int, *, transactions: int = 0, rate: float = 0,
    seconds: float = 0,
) -> tuple[int, float]:  # fmt: skip
    """Run pgbench (``transactions`` in all, or ``seconds`` at ``rate`` transactions/s);
    returns (transactions done, pgbench's own transactions/s)."""
    args = [
        str(server.bindir / "pgbench"), "-n", "-h", server.host, "-p", str(server.port),
        "-U", server.user, "-c", str(CLIENTS), "-j", "2", "-f", str(script),
        "-D", f"accounts={accounts}",
    ]  # fmt: skip
    if transactions:
        args += ["-t", str(max(1, transactions // CLIENTS))]
    else:
        args += ["-T", str(max(1, round(seconds))), "-R", f"{rate:.1f}"]
    done = subprocess.run(
        [*args, DATABASE], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed:\n{done.stdout}\n{done.stderr}")
    processed = re.search(r"number of transactions actually processed: (\d+)", done.stdout)
    tps = re.search(r"tps = ([\d.]+)", done.stdout)
    if processed is None or tps is None:
        raise RuntimeError(f"pgbench said nothing usable:\n{done.stdout}")
    return int(processed.group(1)), float(tps.group(1))


def _marker(dsn: str, label: str) -> str:
    """The round's last transaction (one history insert); the WAL position after it."""
    _sql(
        dsn,
        "INSERT INTO bench_history (tid, bid, aid, delta, mtime, filler) "
        f"VALUES (1, 1, 1, 0, now(), '{label}')",
    )
    return _wal_lsn(dsn)


# --- the readers -------------------------------------------------------------------------


def _recvlogical_args(server: Postgres) -> list[str]:
    return [
        str(server.bindir / "pg_recvlogical"), "-h", server.host, "-p", str(server.port),
        "-U", server.user, "-d", DATABASE, "-S", RECV_SLOT,
    ]  # fmt: skip


def create_reader_slots(server: Postgres, dsn: str) -> None:
    """``pg_recvlogical``'s slot (made by it) and the two Python readers' slots."""
    subprocess.run(
        [*_recvlogical_args(server), "--create-slot", "-P", "pgoutput"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    for slot in (READ_SLOT, DECODE_SLOT):
        _sql(dsn, f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")


def python_drain(dsn: str, slot: str, endpos: str, assemble: bool) -> float:
    """psycopg2 reads ``slot`` up to ``endpos`` (the marker's commit: its XLogData starts
    there), decoding and assembling each message when ``assemble``; seconds taken. The
    breakdown of the connector's time: what psycopg2 costs alone, what decoding adds."""
    from tidelog.client.cdc.events import ChangeAssembler, parse_lsn

    end = parse_lsn(endpos)
    keys = {"bench_accounts": ("aid",), "bench_tellers": ("tid",), "bench_branches": ("bid",),
            "bench_history": ("hid",)}  # fmt: skip
    assembler = ChangeAssembler(PREFIX, lambda relation: keys[relation.name])
    started = time.perf_counter()
    conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        cur = conn.cursor()
        cur.start_replication(
            slot_name=slot,
            slot_type=psycopg2.extras.REPLICATION_LOGICAL,
            options={"proto_version": "1", "publication_names": PUBLICATION},
            decode=False,
        )
        idle_since = None
        while True:
            message = cur.read_message()
            if message is None:
                # Something wrote WAL after the marker before endpos was read: the
                # server's end passed endpos and nothing more comes (rare; slower, not faster).
                now = time.monotonic()
                idle_since = idle_since or now
                if cur.wal_end >= end and now - idle_since > 1:
                    break
                select.select([cur], [], [], 0.1)
                continue
            idle_since = None
            if assemble:
                assembler.feed_payload(message.payload)
            if message.data_start >= end:
                break
        return time.perf_counter() - started
    finally:
        conn.close()


def recvlogical_drain(server: Postgres, endpos: str) -> float:
    """``pg_recvlogical`` reads its slot up to ``endpos`` into /dev/null; seconds taken."""
    args = [
        *_recvlogical_args(server), "--start", "--endpos", endpos, "--no-loop",
        "-o", "proto_version=1", "-o", f"publication_names={PUBLICATION}",
        "-F", "0", "-f", "/dev/null",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed: {done.stderr}")
    return elapsed


class ConnectorWorker:
    """The connector in its own process (``--worker``), started and warm (imports done,
    nothing connected) until ``go``; ``stop`` is SIGTERM (stores, confirms, exits)."""

    def __init__(self, dsn: str, bootstrap: str, delivery: str | None, profile: Path | None):
        settings = {"dsn": dsn, "bootstrap": bootstrap, "delivery": delivery}
        if profile is not None:
            settings["profile"] = str(profile)
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(settings)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._expect("ready")

    def _expect(self, word: str) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if line != word:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"connector worker said {line!r}, expected {word!r}")

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def wait_streaming(self) -> None:
        self._expect("streaming")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise RuntimeError("the connector did not stop within 60 s") from None
        finally:
            for pipe in (self.process.stdin, self.process.stdout):
                if pipe is not None:
                    pipe.close()
        if code != 0:
            raise RuntimeError(f"the connector exited with {code}")


def _connector_config(settings: dict[str, Any]) -> Any:
    from tidelog.client.cdc import ConnectorConfig

    options: dict[str, Any] = {
        "dsn": settings["dsn"],
        "bootstrap_servers": settings["bootstrap"],
        "publication": PUBLICATION,
        "slot": CONNECTOR_SLOT,
        "topic_prefix": PREFIX,
    }
    if settings.get("delivery") and "delivery" in ConnectorConfig.__dataclass_fields__:
        options["delivery"] = settings["delivery"]
    return ConnectorConfig(**options)


def worker(raw: str) -> None:
    """The ``--worker`` process: print ``ready``, wait for ``go``, run the connector until
    SIGTERM (printing ``streaming`` once it streams)."""
    import cProfile

    from tidelog.client.cdc import PostgresConnector

    settings = json.loads(raw)
    connector = PostgresConnector(_connector_config(settings))
    signal.signal(signal.SIGTERM, lambda *_: connector.stop())

    def announce() -> None:
        if connector.streaming.wait(TIMEOUT_S):
            print("streaming", flush=True)

    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    threading.Thread(target=announce, daemon=True).start()
    if settings.get("profile"):
        profiler = cProfile.Profile()
        profiler.runcall(connector.run)
        profiler.dump_stats(settings["profile"])
    else:
        connector.run()


def _topics() -> list[TopicPartition]:
    return [TopicPartition(f"{PREFIX}.public.{table}", 0) for table in TABLES]


def _ends(consumer: Consumer) -> dict[TopicPartition, int]:
    return consumer.end_offsets(_topics(), timeout_ms=30_000)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def connector_drain(
    worker_: ConnectorWorker,
    consumer: Consumer,
    expected: dict[TopicPartition, int],
    broker_pid: int,
) -> tuple[float, float, float]:
    """``go``, then until every topic's read_committed end offset reaches ``expected``;
    (seconds, the connector's CPU seconds, the broker's CPU seconds)."""
    cpu = _cpu_s(worker_.process.pid), _cpu_s(broker_pid)
    started = time.perf_counter()
    worker_.go()
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        ends = _ends(consumer)
        if all(ends[tp] >= expected[tp] for tp in expected):
            return (
                time.perf_counter() - started,
                _cpu_s(worker_.process.pid) - cpu[0],
                _cpu_s(broker_pid) - cpu[1],
            )
        if worker_.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the connector stopped short: {ends} of {expected}")
        time.sleep(0.01)


# --- the phases --------------------------------------------------------------------------


def flat_out_round(
    server: Postgres,
    dsn: str,
    script: Path,
    args: argparse.Namespace,
    consumer: Consumer,
    broker: tuple[str, int],
    round_: int,
) -> dict[str, float]:
    """One backlog, drained by both readers (order by ``round_``); their seconds."""
    before_history = _history_rows(dsn)
    before_ends = _ends(consumer)
    done, tps = pgbench(server, script, args.accounts, transactions=args.transactions)
    endpos = _marker(dsn, f"{MARKER}-{round_}")
    deletes = before_history + done + 1 - _history_rows(dsn)
    changes = done * 4 + deletes + 1
    # Topic records: an update or insert is one, a delete two (the event and its tombstone).
    accounts, tellers, branches, history = _topics()
    expected = {
        accounts: before_ends[accounts] + done,
        tellers: before_ends[tellers] + done,
        branches: before_ends[branches] + done,
        history: before_ends[history] + done + 1 + 2 * deletes,
    }
    profile = args.profile if args.profile and round_ == 0 else None
    worker_ = ConnectorWorker(dsn, broker[0], args.delivery, profile)
    timings: dict[str, float] = {}
    cpu = (0.0, 0.0)
    sides = ["recv", "read", "decode", "cdc"]
    try:
        for side in sides if round_ % 2 == 0 else reversed(sides):
            if side == "recv":
                timings[side] = recvlogical_drain(server, endpos)
            elif side == "read":
                timings[side] = python_drain(dsn, READ_SLOT, endpos, assemble=False)
            elif side == "decode":
                timings[side] = python_drain(dsn, DECODE_SLOT, endpos, assemble=True)
            else:
                timings[side], *cpu = connector_drain(worker_, consumer, expected, broker[1])
    finally:
        worker_.stop()
    return {
        "changes": changes,
        "pgbench_rows_per_s": tps * changes / max(1, done),
        **{f"{side}_rows_per_s": changes / seconds for side, seconds in timings.items()},
        # Negated so that the best round's (the most rows a CPU second) is the max.
        "neg_connector_cpu_us_per_row": -cpu[0] / changes * 1e6,
        "neg_broker_cpu_us_per_row": -cpu[1] / changes * 1e6,
    }


def steady(
    server: Postgres, dsn: str, script: Path, args: argparse.Namespace, bootstrap: str
) -> dict[str, Any]:
    """The connector streaming while pgbench holds ``--rate`` changes/s: commit to visible."""
    history = _topics()[3]
    latencies: list[float] = []
    stop = threading.Event()
    with Consumer(
        bootstrap, enable_auto_commit=False, isolation_level="read_committed"
    ) as consumer:
        consumer.assign([history])
        consumer.seek(history, consumer.end_offsets([history], timeout_ms=30_000)[history])

        def collect() -> None:
            while not stop.is_set():
                for record in consumer.poll(timeout_ms=200):
                    seen_ms = time.time() * 1000
                    if record.value is None:
                        continue
                    event = json.loads(record.value)
                    if event["op"] == "c":
                        latencies.append(seen_ms - event["source"]["ts_ms"])

        worker_ = ConnectorWorker(dsn, bootstrap, args.delivery, None)
        try:
            worker_.go()
            worker_.wait_streaming()
            reader = threading.Thread(target=collect, daemon=True)
            reader.start()
            done, tps = pgbench(
                server, script, args.accounts, rate=args.rate / CHANGES_PER_TXN,
                seconds=args.seconds,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while len(latencies) < done and time.monotonic() < deadline:
                time.sleep(0.05)
            stop.set()
            reader.join(10)
        finally:
            worker_.stop()
    if len(latencies) < done:
        raise RuntimeError(f"saw {len(latencies)} of {done} transactions")
    cuts = statistics.quantiles(latencies, n=100)
    return {
        "steady_rows_per_s": round(tps * CHANGES_PER_TXN),
        "steady_samples": len(latencies),
        "commit_to_visible_p50_ms": round(statistics.median(latencies), 1),
        "commit_to_visible_p99_ms": round(cuts[98], 1),
        "commit_to_visible_max_ms": round(max(latencies), 1),
    }


@contextmanager
def _broker() -> Iterator[tuple[str, int]]:
    """The broker process: its address and pid."""
    work = Path(tempfile.mkdtemp(prefix="tidelog-cdc-bench-"))
    process, address, _ = start_broker(work)
    try:
        yield address, process.pid
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--transactions", type=int, default=20_000, help="flat-out backlog size")
    p.add_argument("--accounts", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=5_000.0, help="steady changes/s")
    p.add_argument("--seconds", type=float, default=20.0, help="steady run length")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--delivery", default=None, help="the connector's delivery setting")
    p.add_argument("--profile", type=Path, default=None, help="cProfile the connector")
    p.add_argument("--quick", action="store_true", help="4,000 transactions, 10 s steady")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return {}
    if args.quick:
        args.transactions, args.seconds = 4_000, 10.0
    results: dict[str, Any] = {
        "transactions": args.transactions,
        "rate": args.rate,
        "seconds": args.seconds,
        "clients": CLIENTS,
    }
    work = Path(tempfile.mkdtemp(prefix="tidelog-cdc-bench-script-"))
    script = work / "tpcb-like.sql"
    script.write_text(PGBENCH_SCRIPT)
    try:
        with running_postgres(SERVER_SETTINGS) as server, _broker() as broker:
            bootstrap = broker[0]
            dsn = create_schema(server, args.accounts)
            # The connector's first start: the publication's topics, the snapshot, its slot.
            first = ConnectorWorker(dsn, bootstrap, args.delivery, None)
            first.go()
            first.wait_streaming()
            first.stop()
            create_reader_slots(server, dsn)
            best: dict[str, float] = {}
            with Consumer(
                bootstrap, enable_auto_commit=False, isolation_level="read_committed"
            ) as consumer:
                for round_ in range(args.rounds):
                    got = flat_out_round(server, dsn, script, args, consumer, broker, round_)
                    for key, value in got.items():
                        best[key] = max(best[key], value) if key in best else value
            results["flat_out_changes"] = int(best["changes"])
            results["pgbench_rows_per_s"] = round(best["pgbench_rows_per_s"])
            results["pg_recvlogical_rows_per_s"] = round(best["recv_rows_per_s"])
            results["psycopg2_read_rows_per_s"] = round(best["read_rows_per_s"])
            results["psycopg2_decode_rows_per_s"] = round(best["decode_rows_per_s"])
            results["cdc_rows_per_s"] = round(best["cdc_rows_per_s"])
            results["cdc_over_pg_recvlogical"] = round(
                best["cdc_rows_per_s"] / best["recv_rows_per_s"], 3
            )
            results["connector_cpu_us_per_row"] = round(-best["neg_connector_cpu_us_per_row"], 1)
            results["broker_cpu_us_per_row"] = round(-best["neg_broker_cpu_us_per_row"], 1)
            results.update(steady(server, dsn, script, args, bootstrap))
            results["delivery"] = args.delivery or _default_delivery()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results))
    return results


def _default_delivery() -> str:
    from tidelog.client.cdc import ConnectorConfig

    field = ConnectorConfig.__dataclass_fields__.get("delivery")
    return str(field.default) if field is not None else "at-least-once"


if __name__ == "__main__":
    main()
