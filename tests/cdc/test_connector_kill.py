"""``tidelog cdc postgres`` as a process, SIGKILLed five times in one run (during the
snapshot, mid-transaction, between commit and LSN confirmation, at a random moment) and
restarted each time: exactly once for read_committed readers. The compacted topic ends
equal to ``SELECT *`` row for row, and the raw change stream read read_committed holds
each key's changes exactly once, in commit order.

The deterministic stops use the connector's documented test hook
(``client.cdc.testhooks``: ``TIDELOG_CDC_TEST_STOP_AT``), which logs the point and
SIGSTOPs the process there; the test checks the state the point promises (records in
the log but not visible, a position committed but not confirmed) before the SIGKILL, so
each round provably killed the connector where it says.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.cluster.waiting import eventually
from tests.cdc.checks import Writer, check_exactly_once, compacted_differences
from tests.cdc.test_connector import Workload, _create_table
from tests.cdc.topics import (
    confirmed_flush_lsn,
    execute,
    read_topic,
)
from tidelog.broker.testing import InProcessBroker
from tidelog.client.cdc.sink import decode_position, read_positions
from tidelog.client.cdc.testhooks import ENV
from tidelog.client.consumer import Consumer
from tidelog.client.types import TopicPartition

pytestmark = pytest.mark.timeout(180)


class ConnectorProcess:
    """``tidelog cdc postgres`` in a child process, its output in ``log_path``."""

    def __init__(self, args: list[str], log_path: Path, stop_at: str | None = None) -> None:
        self.log_path = log_path
        self._start = log_path.stat().st_size if log_path.exists() else 0
        self._log = open(log_path, "ab")  # noqa: SIM115 (closed in wait/kill)
        env = {k: v for k, v in os.environ.items() if k != ENV}
        if stop_at is not None:
            env[ENV] = stop_at
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tidelog.client.cli", *args],
            stdout=self._log,
            stderr=self._log,
            env=env,
        )

    def log_text(self) -> str:
        """This process's part of the log."""
        with open(self.log_path, "rb") as log:
            log.seek(self._start)
            return log.read().decode(errors="replace")

    def wait_stopped_at(self, point: str) -> None:
        line = f"CDC test hook: stopped at {point}"
        eventually(lambda: line in self.log_text() or self.process.poll() is not None, 90)
        assert line in self.log_text(), self.log_text()[-3000:]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        self._log.close()

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(60)
        self._log.close()
        return code


@pytest.fixture
def processes() -> Iterator[list[ConnectorProcess]]:
    """Connector processes a test started: any still running at the end is killed."""
    started: list[ConnectorProcess] = []
    yield started
    for process in started:
        if process.process.poll() is None:
            process.kill()


def _stored_lsn(bootstrap: str, offsets_topic: str, name: str, level: str) -> int:
    """The connector's latest position in the offsets topic read at ``level``."""
    positions = [
        decode_position(r.value).position.lsn
        for r in read_topic(bootstrap, offsets_topic, level)
        if r.key == name.encode() and r.value is not None
    ]
    return positions[-1] if positions else 0


def test_sigkill_five_times_exactly_once(
    dsn: str, broker: InProcessBroker, tmp_path: Path, processes: list[ConnectorProcess]
) -> None:
    initial = range(3_000)
    _create_table(dsn, len(initial))
    workload = Workload(dsn, seed=7, ids=initial)
    writer = Writer(workload)
    offsets, topic, name = "killed-offsets", "killed.public.t", "killed"
    args = [
        "--bootstrap", broker.address, "cdc", "postgres", "--dsn", dsn,
        "--tables", "public.t", "--slot", name, "--topic-prefix", "killed",
        "--offsets-topic", offsets, "--chunk-rows", "200",
    ]  # fmt: skip
    log_path = tmp_path / "connector.log"

    def start(stop_at: str | None = None) -> ConnectorProcess:
        processes.append(ConnectorProcess(args, log_path, stop_at))
        return processes[-1]

    # 1. During the snapshot: chunks in the log inside the open snapshot transaction,
    # nothing of it visible read_committed.
    first = start("snapshot:3")
    first.wait_stopped_at("snapshot")
    assert len(read_topic(broker.address, topic)) >= 600
    assert read_topic(broker.address, topic, "read_committed") == []
    first.kill()

    # 2. Mid-transaction: the snapshot is taken again and committed; then changes stream
    # and the connector stops with a batch and its position in the log, not committed.
    second = start("mid_transaction:3")
    eventually(
        lambda: (
            (p := read_positions(broker.address, offsets, {}, 10_000).get(name)) is not None
            and p.position.snapshot_done
        ),
        90,
    )
    writer.start()  # every change from here on is one the stream must carry
    second.wait_stopped_at("mid_transaction")
    committed = _stored_lsn(broker.address, offsets, name, "read_committed")
    assert _stored_lsn(broker.address, offsets, name, "read_uncommitted") > committed
    second.kill()

    # 3. Between commit and confirmation: the position committed is ahead of the slot's
    # confirmed LSN, so PostgreSQL sends those transactions again on restart.
    third = start("after_commit:4")
    third.wait_stopped_at("after_commit")
    committed = _stored_lsn(broker.address, offsets, name, "read_committed")
    assert committed > confirmed_flush_lsn(dsn, name)
    third.kill()

    # 4. At a random moment while streaming.
    fourth = start()
    floor = _stored_lsn(broker.address, offsets, name, "read_committed")
    eventually(lambda: _stored_lsn(broker.address, offsets, name, "read_committed") > floor, 60)
    time.sleep(random.Random(30).uniform(0.0, 1.0))
    fourth.kill()

    # 5. Mid-transaction again, after the random kill's leftovers were fenced.
    fifth = start("mid_transaction:2")
    fifth.wait_stopped_at("mid_transaction")
    fifth.kill()

    # The last run catches up and stops gracefully.
    final = start()
    time.sleep(0.5)
    writer.stop()
    try:
        eventually(lambda: not compacted_differences(broker.address, topic, dsn), 60)
    except AssertionError:
        wrong = compacted_differences(broker.address, topic, dsn)
        raise AssertionError(f"{len(wrong)} keys differ, e.g. {wrong[:5]}") from None
    assert final.terminate() == 0, final.log_text()[-3000:]
    assert sum(len(h) for h in workload.history.values()) > 100, "too few changes to matter"
    check_exactly_once(read_topic(broker.address, topic, "read_committed"), workload, initial)


def test_a_multi_table_transaction_is_atomic(
    dsn: str, broker: InProcessBroker, tmp_path: Path, processes: list[ConnectorProcess]
) -> None:
    """Each PostgreSQL transaction writes one row to ``a`` and one to ``b``. While the
    connector stands stopped with such transactions in the log uncommitted, a
    read_committed consumer sees no part of them; a consumer polling both topics
    read_committed the whole time sees every transaction exactly once, in both tables."""
    execute(
        dsn,
        "CREATE TABLE a (id int PRIMARY KEY, n int NOT NULL)",
        "CREATE TABLE b (id int PRIMARY KEY, n int NOT NULL)",
    )
    args = [
        "--bootstrap", broker.address, "cdc", "postgres", "--dsn", dsn,
        "--tables", "public.a,public.b", "--slot", "atomic", "--topic-prefix", "atomic",
        "--offsets-topic", "atomic-offsets",
    ]  # fmt: skip
    topics = [TopicPartition("atomic.public.a", 0), TopicPartition("atomic.public.b", 0)]
    seen: dict[str, list[int]] = {tp.topic: [] for tp in topics}
    done = threading.Event()

    def consume() -> None:
        with Consumer(
            broker.address,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        ) as consumer:
            consumer.assign(topics)
            while not done.is_set():
                for record in consumer.poll(timeout_ms=100):
                    if record.value is not None:
                        seen[record.topic].append(json.loads(record.value)["after"]["n"])

    def transaction(n: int) -> None:
        execute(dsn, f"INSERT INTO a VALUES ({n}, {n})", f"INSERT INTO b VALUES ({n}, {n})")

    log_path = tmp_path / "connector.log"
    stopped = ConnectorProcess(args, log_path, "mid_transaction:1")
    processes.append(stopped)
    eventually(lambda: "atomic" in read_positions(broker.address, "atomic-offsets", {}, 10_000), 90)
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    for n in range(3):
        transaction(n)
    stopped.wait_stopped_at("mid_transaction")
    # In the log, both tables' rows; below the last stable offset, none.
    for tp in topics:
        assert read_topic(broker.address, tp.topic), tp
        assert read_topic(broker.address, tp.topic, "read_committed") == [], tp
    with Consumer(broker.address, isolation_level="read_committed") as probe:
        assert set(probe.end_offsets(topics, timeout_ms=10_000).values()) == {0}
    stopped.kill()

    running = ConnectorProcess(args, log_path)
    processes.append(running)
    for n in range(3, 40):
        transaction(n)
    try:
        eventually(lambda: all(len(ns) >= 40 for ns in seen.values()), 60)
    finally:
        done.set()
        consumer.join(30)
    assert running.terminate() == 0
    assert seen["atomic.public.a"] == list(range(40))
    assert seen["atomic.public.b"] == list(range(40))
