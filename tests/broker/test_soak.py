"""A bounded soak: many connections, producers and group consumers coming and going.

The broker runs as a process of its own (its RSS is measured from ``/proc``), on
127.0.0.1, with short group session timeouts. Around it:

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

Sizes: the default is the short version CI runs (about 30 s: 300 idle connections, 8
producers, 2 groups of 6 consumers). ``TIDELOG_SOAK=full`` runs the issue's version
(about 3 minutes: 1,000 connections, 50 producers, 200 consumers in 4 groups).
Everything is bounded in count and time; every helper process exits by itself. The
figures (records read twice, members that rejoined, RSS) are logged at INFO
(``pytest -o log_cli=true -o log_cli_level=INFO``).
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from client import AdminClient, Consumer, Producer, TopicPartition

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
_PARKED = re.compile(r'^tidelog_parked_operations\{purgatory="fetch"\} (\S+)$', re.MULTILINE)


@dataclass(frozen=True)
class Scale:
    seconds: float
    idle_connections: int
    producers: int
    groups: int
    consumers_per_group: int
    partitions: int


SHORT = Scale(
    seconds=20, idle_connections=300, producers=8, groups=2, consumers_per_group=6, partitions=6
)
FULL = Scale(
    seconds=150,
    idle_connections=1_000,
    producers=50,
    groups=4,
    consumers_per_group=50,
    partitions=24,
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
        [sys.executable, "-m", "broker", "--data-dir", str(work / "data"),
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


class _Producers:
    """Producer threads; each sends unique values and replaces its producer at random."""

    def __init__(self, address: str, topic: str, count: int, rng: random.Random) -> None:
        self._address = address
        self._topic = topic
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.acked: list[bytes] = []
        self.failed = 0
        self.replaced = 0
        self._threads = [
            threading.Thread(target=self._run, args=(i, random.Random(rng.random())))
            for i in range(count)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _run(self, index: int, rng: random.Random) -> None:
        sequence = 0
        while not self._stop.is_set():
            with Producer(
                self._address,
                client_id=f"soak-producer-{index}",
                acks="all",
                linger_ms=5,
                request_timeout_ms=10_000,
            ) as producer:
                lifetime_s = rng.uniform(1, 6)
                ends = time.monotonic() + lifetime_s
                futures = []
                while time.monotonic() < ends and not self._stop.is_set():
                    value = f"{index}-{sequence}".encode()
                    sequence += 1
                    futures.append((value, producer.send(self._topic, value, key=value)))
                    time.sleep(rng.uniform(0, 0.004))
                producer.flush(timeout_ms=30_000)
                done = []
                failed = 0
                for value, future in futures:
                    if future.exception(timeout=30) is None:
                        done.append(value)
                    else:
                        failed += 1
            with self._lock:
                self.acked += done
                self.failed += failed
                self.replaced += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)
            assert not thread.is_alive(), "a producer did not stop"


class _Group:
    """Consumer threads of one group; at random one leaves and a new one joins."""

    def __init__(self, address: str, group: str, topic: str, size: int, rng: random.Random):
        self._address = address
        self._group = group
        self._topic = topic
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._lock = threading.Lock()
        self.seen: Counter[bytes] = Counter()
        self.rejoined = 0
        self._threads = [
            threading.Thread(target=self._run, args=(i, random.Random(rng.random())))
            for i in range(size)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _run(self, index: int, rng: random.Random) -> None:
        while not self._stop.is_set():
            consumer = Consumer(
                self._address,
                group_id=self._group,
                client_id=f"soak-{self._group}-{index}",
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=3_000,
                heartbeat_interval_ms=500,
                request_timeout_ms=10_000,
            )
            try:
                consumer.subscribe([self._topic])
                ends = time.monotonic() + rng.uniform(2, 10)
                while not self._stop.is_set() and (
                    self._draining.is_set() or time.monotonic() < ends
                ):
                    records = consumer.poll(timeout_ms=200)
                    if records:
                        with self._lock:
                            self.seen.update(r.value or b"" for r in records)
                        consumer.commit()
            finally:
                consumer.close()
            with self._lock:
                self.rejoined += 1

    def drain(self) -> None:
        """Members stop leaving: the group settles and reads to the end."""
        self._draining.set()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)
            assert not thread.is_alive(), "a consumer did not stop"


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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_soak(broker_process: tuple[subprocess.Popen[str], str, int]) -> None:
    scale = FULL if os.environ.get("TIDELOG_SOAK") == "full" else SHORT
    process, address, metrics_port = broker_process
    rng = random.Random(12)
    with AdminClient(address) as admin:
        admin.create_topic("quiet", 1)
        admin.create_topic("soak", scale.partitions)
    holders = []
    producers = _Producers(address, "soak", scale.producers, rng)
    groups = [
        _Group(address, f"group-{g}", "soak", scale.consumers_per_group, rng)
        for g in range(scale.groups)
    ]
    try:
        for start in range(0, scale.idle_connections, 500):
            count = min(500, scale.idle_connections - start)
            holder = subprocess.Popen(
                [sys.executable, "-m", "tests.broker.fetch_holder", address, "quiet",
                 str(count), str(scale.seconds * 3 + 120)],
                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            holders.append(holder)
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "ready"
        producers.start()
        for group in groups:
            group.start()
        time.sleep(min(10.0, scale.seconds / 3))  # warm-up: everyone connected, data flows
        assert _parked(metrics_port) >= scale.idle_connections
        warm_rss = _rss_kib(process.pid)
        time.sleep(scale.seconds)
        producers.stop()
        acked = Counter(producers.acked)
        assert acked, "nothing was acknowledged"
        for group in groups:
            group.drain()
        deadline = time.monotonic() + 120
        for group in groups:
            while set(acked) - set(group.seen):
                assert time.monotonic() < deadline, (
                    f"{group._group} never read {len(set(acked) - set(group.seen))} records"
                )
                time.sleep(0.2)
        end_rss = _rss_kib(process.pid)
    finally:
        producers.stop()
        for group in groups:
            group.stop()
        for holder in holders:
            holder.communicate(input="", timeout=60)
    contents = _log_contents(address, "soak", scale.partitions)
    # Every acknowledged record is in the log exactly once.
    assert all(contents[value] == 1 for value in acked), "a record is missing or doubled"
    for group in groups:
        assert set(acked) <= set(group.seen)
        duplicates = sum(n - 1 for n in group.seen.values() if n > 1)
        log.info(
            f"{group._group}: {len(group.seen)} records read, {duplicates} read twice, "
            f"{group.rejoined} members left and rejoined"
        )
    log.info(
        f"acknowledged {len(acked)}, failed {producers.failed}, producers replaced "
        f"{producers.replaced}; broker RSS {warm_rss} KiB after warm-up, {end_rss} KiB at "
        "the end"
    )
    assert end_rss <= warm_rss * 1.2, f"broker RSS grew from {warm_rss} to {end_rss} KiB"
