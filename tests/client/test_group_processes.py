"""Consumer groups with several consumer processes against a real broker.

Each member is its own process (``tests/client/group_worker.py``), so a member can really
be killed (SIGKILL: no leave, no commit) and the group must notice by the session timeout
alone. The broker runs in this process with short group timeouts (heartbeat every 100
ms, sessions of 3 s), so a whole rebalance takes a fraction of a second.

What is proven (issue 5): two members split four partitions two and two, disjointly; when
one leaves, the other owns all four at once (well before the session timeout); when one
is killed, within the session timeout; a second group receives every record too; after a
crash before a commit, the records after the last commit are delivered again and none
before it; the rebalance callbacks get the right partitions, and per partition they
alternate assign, revoke/lost, assign...
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Producer

ROOT = Path(__file__).resolve().parents[2]
SESSION_TIMEOUT_MS = 3_000
GROUP_SETTINGS = {
    "group.consumer.heartbeat.interval.ms": 100,
    "group.consumer.min.session.timeout.ms": 500,
    "group.consumer.session.timeout.ms": SESSION_TIMEOUT_MS,
}


class Worker:
    """One ``group_worker`` process and what it reported."""

    def __init__(self, address: str, group: str, topic: str, *options: str) -> None:
        self.events: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.client.group_worker", address, group, topic,
             "--session-timeout-ms", str(SESSION_TIMEOUT_MS), *options],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                with self._changed:
                    self.events.append(json.loads(line))
                    self._changed.notify_all()

    def dispose(self) -> None:
        """Kill the process if it still runs; close its pipes."""
        if self.process.poll() is None:
            self.kill()
        assert self.process.stdin is not None
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        self._reader.join(10)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._changed:
            return list(self.events)

    def owned(self) -> set[int]:
        held: set[int] = set()
        for event in self.snapshot():
            if event["e"] == "assign":
                held |= set(event["p"])
            elif event["e"] in ("revoke", "lost"):
                held -= set(event["p"])
        return held

    def records(self) -> list[tuple[int, int]]:
        return [(p, o) for e in self.snapshot() if e["e"] == "recs" for p, o in e["r"]]

    def callbacks(self) -> list[tuple[str, list[int]]]:
        kinds = ("assign", "revoke", "lost")
        return [(e["e"], e["p"]) for e in self.snapshot() if e["e"] in kinds]

    def wait_for(self, condition: Callable[[], bool], timeout_s: float = 20) -> float:
        """Seconds until ``condition`` held; fails the test after ``timeout_s``."""
        start = time.monotonic()
        deadline = start + timeout_s
        with self._changed:
            while not condition():
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"timed out; events: {self.events[-10:]}"
                assert self.process.poll() is None or condition(), "the worker died"
                self._changed.wait(min(remaining, 0.05))
        return time.monotonic() - start

    def command(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def close(self) -> None:
        self.command("close")
        self.wait_for(lambda: any(e["e"] == "closed" for e in self.events))
        self.process.wait(10)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


@pytest.fixture(scope="module")
def group_broker() -> Iterator[InProcessBroker]:
    with InProcessBroker(settings=GROUP_SETTINGS) as running:
        yield running


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.dispose()


def produce(address: str, topic: str, partitions: int, per_partition: int) -> None:
    with Producer(address, linger_ms=0) as producer:
        for i in range(per_partition):
            for p in range(partitions):
                producer.send(topic, f"{p}-{i}".encode(), partition=p)


def check_alternation(worker: Worker) -> None:
    """Per partition the callbacks alternate: assign, revoke or lost, assign, ..."""
    held: set[int] = set()
    for kind, partitions in worker.callbacks():
        if kind == "assign":
            assert not held & set(partitions), worker.callbacks()
            held |= set(partitions)
        elif kind in ("revoke", "lost"):
            assert set(partitions) <= held, worker.callbacks()
            held -= set(partitions)


def test_members_split_leave_and_are_killed_and_a_second_group_reads_everything(
    group_broker: InProcessBroker, workers: list[Worker]
) -> None:
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("procs", 4)
        produce(address, "procs", 4, 10)
        everything = {(p, o) for p in range(4) for o in range(10)}

        a = Worker(address, "g1", "procs")
        b = Worker(address, "g1", "procs")
        other = Worker(address, "g2", "procs")
        workers += [a, b, other]

        # Two members: two partitions each, disjoint; the broker agrees.
        a.wait_for(lambda: len(a.owned()) == 2 and len(b.owned()) == 2)
        assert a.owned().isdisjoint(b.owned())
        assert a.owned() | b.owned() == {0, 1, 2, 3}
        group = admin.describe_group("g1")
        assert group.state == "Stable"
        assert sorted(len(m.assignment) for m in group.members) == [2, 2]
        a.wait_for(lambda: set(a.records()) | set(b.records()) == everything)
        # The second group gets every record too, from its one member, once each.
        other.wait_for(lambda: len(other.records()) == len(everything))
        assert set(other.records()) == everything
        assert other.owned() == {0, 1, 2, 3}

        # A member that leaves (close) hands over at once, far below the session timeout.
        b_held = b.owned()
        start = time.monotonic()
        b.close()
        a.wait_for(lambda: a.owned() == {0, 1, 2, 3})
        assert time.monotonic() - start < SESSION_TIMEOUT_MS / 1000 / 2
        assert b.callbacks()[-1] == ("revoke", sorted(b_held))
        assert a.callbacks()[-1] == ("assign", sorted(b_held))

        # A member that is killed: its partitions move within the session timeout.
        c = Worker(address, "g1", "procs")
        workers.append(c)
        c.wait_for(lambda: len(c.owned()) == 2 and len(a.owned()) == 2)
        assert a.owned().isdisjoint(c.owned())
        c_held = c.owned()
        c.kill()
        start = time.monotonic()
        a.wait_for(lambda: a.owned() == {0, 1, 2, 3})
        took_s = time.monotonic() - start
        assert took_s < SESSION_TIMEOUT_MS / 1000 + 1.5, took_s
        assert a.callbacks()[-1] == ("assign", sorted(c_held))
        assert [m.client_id for m in admin.describe_group("g1").members] == ["worker-g1"]

        # The survivor reads what comes next on every partition.
        produce(address, "procs", 4, 5)
        later = {(p, o) for p in range(4) for o in range(10, 15)}
        a.wait_for(lambda: later <= set(a.records()))
        for worker in (a, b, c, other):
            check_alternation(worker)
        a.close()
        other.close()
        assert admin.describe_group("g1").members == ()


def test_a_crash_before_commit_redelivers_from_the_last_commit(
    group_broker: InProcessBroker, workers: list[Worker]
) -> None:
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("crash", 2)
    produce(address, "crash", 2, 20)
    first = Worker(address, "crashers", "crash", "--no-auto-commit")
    workers.append(first)
    first.wait_for(lambda: len(first.records()) == 40)
    first.command("commit")
    first.wait_for(lambda: first.snapshot()[-1]["e"] == "committed")
    produce(address, "crash", 2, 10)  # read, never committed
    first.wait_for(lambda: len(first.records()) == 60)
    first.kill()

    second = Worker(address, "crashers", "crash", "--no-auto-commit")
    workers.append(second)
    second.wait_for(lambda: len(second.records()) >= 20)
    time.sleep(0.3)  # nothing more may come
    got = second.records()
    assert sorted(got) == [(p, o) for p in range(2) for o in range(20, 30)]  # once each
    assert second.callbacks() == [("assign", [0, 1])]
