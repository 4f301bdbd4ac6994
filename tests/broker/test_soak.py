"""A bounded soak: many connections, producers and group consumers coming and going.

The broker runs as a process of its own (its RSS is measured from ``/proc``), on
127.0.0.1, with short group session timeouts. Around it, in helper processes (hundreds of
Python clients in one process starve their own heartbeats; ``tests.broker.soak_worker``):

- idle connections, each a ``FetchStream`` parked at the end of a quiet topic
  (``tests.broker.fetch_holder`` processes);
- producers (idempotent, ``acks=all``) sending unique values; at random one is closed
  and a new one takes its place;
- consumers in groups, each group reading the topic; at random one leaves (closes,
  committing what it processed) and a new one joins.

At the end: every acknowledged value is in the topic exactly once (idempotent producers
never duplicate, nothing acknowledged is lost), every group has consumed every
acknowledged value (at least once: Tidelog's delivery is at-least-once, so a rebalance
may hand a few records to two members; they are counted and reported), and the broker's
RSS is within 20% of its RSS after the warm-up.

Sizes: CI runs ``[ci]`` (300 idle connections, 8 producers, 2 groups of 6 consumers, 2
worker processes, an 8 s warm-up then 10 s of churn: every producer is replaced and
every consumer leaves once or more; about 25 s in all). ``make test-extended`` runs
``[extended]``: the short version (the same sizes, a 10 s warm-up and 20 s, about 40 s)
or, with ``TIDELOG_SOAK`` set, a larger one. ``TIDELOG_SOAK=full`` runs the
issue's version (about 4 minutes: 1,000 connections, 50 producers, 200 consumers in 4
groups, 10 worker processes; it needs more than the 2 shared cores of the development
machine, where the clients alone kept the load average near 100 and starved the broker
of CPU). ``TIDELOG_SOAK=medium`` sits between: 1,000 connections, 16 producers, 2 groups
of 16 consumers, 4 worker processes, 60 s.
Everything is bounded in count and time; every helper process exits by itself. The
figures (records read twice, members that rejoined, RSS) are logged at INFO
(``pytest -o log_cli=true -o log_cli_level=INFO``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tidelog.client import AdminClient, Consumer, TopicPartition

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
_PARKED = re.compile(r'^tidelog_parked_operations\{purgatory="fetch"\} (\S+)$', re.MULTILINE)


@dataclass(frozen=True)
class Scale:
    seconds: float
    idle_connections: int
    producers: int  # in all, shared among the workers
    groups: int
    consumers_per_group: int  # in all, shared among the workers
    partitions: int
    workers: int  # client processes
    warmup_s: float = 10.0  # everyone connected and data flowing before RSS is measured


CI = Scale(
    seconds=10,
    idle_connections=300,
    producers=8,
    groups=2,
    consumers_per_group=6,
    partitions=6,
    workers=2,
    warmup_s=8.0,
)
SHORT = Scale(
    seconds=20,
    idle_connections=300,
    producers=8,
    groups=2,
    consumers_per_group=6,
    partitions=6,
    workers=2,
)
MEDIUM = Scale(
    seconds=60,
    idle_connections=1_000,
    producers=16,
    groups=2,
    consumers_per_group=16,
    partitions=12,
    workers=4,
)
FULL = Scale(
    seconds=150,
    idle_connections=1_000,
    producers=50,
    groups=4,
    consumers_per_group=50,
    partitions=24,
    workers=10,
)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def broker_process() -> Iterator[tuple[subprocess.Popen[str], str, int]]:
    work = Path(tempfile.mkdtemp(prefix="tidelog-soak-"))
    ready = work / "ready"
    metrics_port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tidelog.broker", "--data-dir", str(work / "data"),
         "--listen", "127.0.0.1:0", "--ready-file", str(ready), "--log-level", "WARNING",
         "--set", f"metrics.port={metrics_port}", "--set", "metrics.host=127.0.0.1",
         "--set", "fetch.max.wait.ms=600000",
         "--set", "group.consumer.min.session.timeout.ms=3000",
         "--set", "group.consumer.session.timeout.ms=3000",
         "--set", "group.consumer.heartbeat.interval.ms=500"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert process.poll() is None, "the broker exited"
            assert time.monotonic() < deadline, "the broker did not start"
            time.sleep(0.05)
        yield process, ready.read_text().strip(), metrics_port
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(work, ignore_errors=True)


def _parked(metrics_port: int) -> int:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        found = _PARKED.search(response.read().decode())
    return int(float(found.group(1))) if found else 0


class _Worker:
    """A ``tests.broker.soak_worker`` process: some of the producers and consumers."""

    def __init__(
        self, address: str, index: int, scale: Scale, groups: list[str], lifetime_s: float
    ) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.broker.soak_worker", address, "soak",
             "--index", str(index), "--producers", str(scale.producers // scale.workers),
             "--groups", ",".join(groups),
             "--consumers-per-group", str(scale.consumers_per_group // scale.workers),
             "--lifetime-s", str(lifetime_s)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def ask(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"a soak worker died (status {self.process.poll()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self) -> dict[str, Any]:
        answer = self.ask("stop") if self.process.poll() is None else {}
        self.process.communicate(timeout=60)  # waits, and closes the pipes
        return answer


def _log_contents(address: str, topic: str, partitions: int) -> Counter[bytes]:
    contents: Counter[bytes] = Counter()
    with Consumer(address, auto_offset_reset="earliest") as reader:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        reader.assign(tps)
        reader.seek_to_beginning()
        ends = {tp: reader.end_offsets([tp])[tp] for tp in tps}
        while any(reader.position(tp) < end for tp, end in ends.items()):
            contents.update(r.value or b"" for r in reader.poll(timeout_ms=1_000))
    return contents


EXTENDED = {"full": FULL, "medium": MEDIUM}.get(os.environ.get("TIDELOG_SOAK", ""), SHORT)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "scale",
    [pytest.param(CI, id="ci"), pytest.param(EXTENDED, id="extended", marks=pytest.mark.extended)],
)
def test_soak(broker_process: tuple[subprocess.Popen[str], str, int], scale: Scale) -> None:
    process, address, metrics_port = broker_process
    groups = [f"group-{g}" for g in range(scale.groups)]
    with AdminClient(address) as admin:
        admin.create_topic("quiet", 1)
        admin.create_topic("soak", scale.partitions)
    lifetime_s = scale.seconds * 3 + 300
    holders: list[subprocess.Popen[str]] = []
    workers: list[_Worker] = []
    try:
        for start in range(0, scale.idle_connections, 500):
            count = min(500, scale.idle_connections - start)
            holder = subprocess.Popen(
                [sys.executable, "-m", "tests.broker.fetch_holder", address, "quiet",
                 str(count), str(lifetime_s)],
                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            holders.append(holder)
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "ready"
        workers = [_Worker(address, i, scale, groups, lifetime_s) for i in range(scale.workers)]
        time.sleep(scale.warmup_s)  # warm-up: everyone connected, data flows
        assert _parked(metrics_port) >= scale.idle_connections
        warm_rss = _rss_kib(process.pid)
        time.sleep(scale.seconds)
        acked: set[str] = set()
        failed = replaced = 0
        for worker in workers:
            answer = worker.ask("stop-producers")
            acked.update(answer["acked"])
            failed += answer["failed"]
            replaced += answer["replaced"]
        assert acked, "nothing was acknowledged"
        for worker in workers:
            worker.ask("drain")
        seen: dict[str, Counter[str]] = {}
        deadline = time.monotonic() + 180
        while True:
            seen = {group: Counter() for group in groups}
            for worker in workers:
                for group, values in worker.ask("seen")["seen"].items():
                    seen[group].update(values)
            missing = {group: len(acked - set(values)) for group, values in seen.items()}
            if not any(missing.values()):
                break
            assert time.monotonic() < deadline, f"records never read, by group: {missing}"
            time.sleep(1)
        end_rss = _rss_kib(process.pid)
        rejoined: Counter[str] = Counter()
        for worker in workers:
            rejoined.update(worker.stop().get("rejoined", {}))
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.kill()
            worker.process.communicate(timeout=30)
        for holder in holders:
            holder.communicate(input="", timeout=60)
    contents = _log_contents(address, "soak", scale.partitions)
    # Every acknowledged record is in the log exactly once.
    doubled = [value for value in acked if contents[value.encode()] != 1]
    assert not doubled, f"{len(doubled)} acknowledged records missing or doubled"
    for group in groups:
        duplicates = sum(n - 1 for n in seen[group].values() if n > 1)
        log.info(
            "%s: %d records read, %d read twice, %d members left and rejoined",
            group,
            len(seen[group]),
            duplicates,
            rejoined[group],
        )
    log.info(
        "acknowledged %d, failed %d, producers replaced %d; broker RSS %d KiB after "
        "warm-up, %d KiB at the end",
        len(acked),
        failed,
        replaced,
        warm_rss,
        end_rss,
    )
    assert end_rss <= warm_rss * 1.2, f"broker RSS grew from {warm_rss} to {end_rss} KiB"
