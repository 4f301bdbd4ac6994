"""``tidelog cdc postgres`` as a process, SIGKILLed during the snapshot and twice while
changes stream, restarted each time: at least once, so the compacted topic ends equal to
the table and no committed change is missing (duplicates are allowed and counted)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.cluster.waiting import eventually
from tests.cdc.test_connector import Workload, _check_stream, _create_table
from tests.cdc.topics import database_rows, latest_rows, read_topic
from tidelog.broker.testing import InProcessBroker
from tidelog.client.consumer import Consumer
from tidelog.client.types import TopicPartition

pytestmark = pytest.mark.timeout(180)


class ConnectorProcess:
    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 (closed in wait/kill)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tidelog.client.cli", *args],
            stdout=self._log,
            stderr=self._log,
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        self._log.close()

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(60)
        self._log.close()
        return code


def _end_offset(bootstrap: str, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap, enable_auto_commit=False) as consumer:
        return consumer.end_offsets([tp], timeout_ms=10_000)[tp]


@pytest.fixture
def processes() -> Iterator[list[ConnectorProcess]]:
    """Connector processes a test started: any still running at the end is killed."""
    started: list[ConnectorProcess] = []
    yield started
    for process in started:
        if process.process.poll() is None:
            process.kill()


def test_sigkill_at_three_points_loses_nothing(
    dsn: str, broker: InProcessBroker, tmp_path: Path, processes: list[ConnectorProcess]
) -> None:
    _create_table(dsn, 5_000)
    workload = Workload(dsn, seed=7, ids=range(5_000))
    args = [
        "--bootstrap", broker.address, "cdc", "postgres", "--dsn", dsn,
        "--tables", "public.t", "--slot", "killed", "--topic-prefix", "killed",
        "--offsets-topic", "killed-offsets", "--chunk-rows", "100",
    ]  # fmt: skip
    log_path = tmp_path / "connector.log"

    def start() -> ConnectorProcess:
        processes.append(ConnectorProcess(args, log_path))
        return processes[-1]

    # 1. Killed during the snapshot (progress seen, snapshot not finished).
    first = start()
    eventually(lambda: "snapshot public.t: 1000 rows" in first.log_text(), 60)
    assert "snapshot public.t: 5000 rows" not in first.log_text()
    first.kill()

    # 2 and 3. Killed while transactions stream in, after a position was stored. The
    # writes start once the snapshot is stored, so every version they commit is a change
    # the stream must carry (a version overwritten before a snapshot is never seen).
    for round_ in range(2):
        process = start()
        floor = _end_offset(broker.address, "killed-offsets")
        eventually(lambda f=floor: _end_offset(broker.address, "killed-offsets") > f, 60)
        floor = _end_offset(broker.address, "killed-offsets")
        writer = threading.Thread(target=workload.run, args=(80,))
        writer.start()
        eventually(lambda f=floor: _end_offset(broker.address, "killed-offsets") > f, 60)
        process.kill()
        writer.join(60)
        assert not writer.is_alive(), f"round {round_}: the workload did not finish"

    # The last run catches up and stops gracefully.
    final = start()
    workload.run(40)
    topic = "killed.public.t"
    try:
        eventually(
            lambda: latest_rows(read_topic(broker.address, topic)) == database_rows(dsn, "t"),
            60,
        )
    except AssertionError:
        got, want = latest_rows(read_topic(broker.address, topic)), database_rows(dsn, "t")
        wrong = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        raise AssertionError(f"{len(wrong)} keys differ, e.g. {wrong[:5]}") from None
    assert final.terminate() == 0, final.log_text()[-3000:]

    records = read_topic(broker.address, topic)
    seen = _check_stream(records, workload)
    duplicates = sum(count - 1 for count in seen.values())
    snapshots = sum(1 for r in records if r.value is not None and json.loads(r.value)["op"] == "r")
    # The first snapshot was cut short and taken again: its rows are there twice at most.
    assert snapshots >= 5_000
    print(f"duplicates: {duplicates} of {sum(seen.values())} row versions")  # noqa: T201
