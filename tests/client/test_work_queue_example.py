"""``examples/work_queue.py`` against a real broker (issue #32): more workers than
partitions share the jobs; flaky jobs are retried; poison jobs and jobs that keep failing
end in the dead-letter topic exactly once, with their reason; nothing is missing.

The example runs as a user runs it (a process of its own, its own arguments) against a
broker started here; its JSON report is checked against the dead-letter topic read here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.client import Consumer, TopicPartition

pytestmark = pytest.mark.timeout(240)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "work_queue.py"
JOBS = 120
POISON_EVERY = 20  # jobs 0, 20, ..., 100: rejected at once


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker() as running:
        yield running


def test_jobs_are_done_or_dead_lettered_once_by_more_workers_than_partitions(
    broker: InProcessBroker,
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--bootstrap",
            broker.address,
            "--jobs",
            str(JOBS),
            "--workers",
            "5",
            "--work-ms",
            "2",
            "--flaky",
            "0.3",
            "--poison-every",
            str(POISON_EVERY),
            "--max-deliveries",
            "3",
            "--timeout-s",
            "150",
        ],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)

    poison = set(range(0, JOBS, POISON_EVERY))
    done = set(range(JOBS)) - set(report["dead_lettered"])
    assert report["missing"] == []
    assert report["done"] == len(done)
    assert report["done_twice"] == []
    assert poison <= set(report["dead_lettered"])
    assert report["rejected"] >= len(poison)
    assert report["released"] > 0  # flaky jobs were retried
    # 30% flaky with three deliveries: a few jobs fail every time (delivery-limit).
    assert set(report["dead_letter_reasons"]) <= {"rejected", "delivery-limit"}
    assert report["dead_letter_reasons"]["rejected"] == len(poison)
    assert len(report["workers"]) > 2  # more workers than the topic's 2 partitions worked

    # The dead-letter topic holds each dead-lettered job once, read here independently.
    tp = TopicPartition("jobs.dead-letter", 0)
    jobs: list[int] = []
    with Consumer(broker.address, isolation_level="read_committed") as consumer:
        consumer.assign([tp])
        end = consumer.end_offsets([tp], timeout_ms=10_000)[tp]
        consumer.seek(tp, 0)
        while consumer.position(tp, timeout_ms=10_000) < end:
            for record in consumer.poll(timeout_ms=1_000):
                jobs.append(json.loads(record.value or b"{}")["job"])
                headers = dict(record.headers)
                assert headers["tidelog.dlq.group"] == b"workers"
                assert headers["tidelog.dlq.topic"] == b"jobs"
    assert sorted(jobs) == report["dead_lettered"]
