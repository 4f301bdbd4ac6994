"""Producers and group consumers of the soak test, in a process of their own.

::

    python -m tests.broker.soak_worker ADDRESS TOPIC --index I --producers N
        --groups G1,G2 --consumers-per-group M [--seed S] [--lifetime-s L]

Producers (idempotent, ``acks=all``) send unique values ``w{I}-{producer}-{n}`` and are
replaced at random; consumers join the groups, commit what they processed after each
poll and leave at random (closing cleanly), a new one taking their place. The test drives
the worker through stdin, one command a line, and reads one JSON object a line back:

- ``stop-producers`` -> ``{"acked": [...], "failed": n, "replaced": n}``;
- ``drain`` -> ``{"draining": true}``: members stop leaving, so the groups settle;
- ``seen`` -> ``{"seen": {group: {value: times read}}}``;
- ``stop`` -> ``{"rejoined": {group: n}}``, then the process exits.

Several of these share the load: Python clients are CPU-bound, and hundreds of them in
one process starve their own heartbeats. The worker exits by itself after ``LIFETIME_S``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from collections import Counter

from tidelog.client import Consumer, Producer, TidelogError


def _say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Producers:
    """Producer threads; each sends unique values and replaces its producer at random."""

    def __init__(
        self, address: str, topic: str, prefix: str, count: int, rng: random.Random
    ) -> None:
        self._address = address
        self._topic = topic
        self._prefix = prefix
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.acked: list[str] = []
        self.failed = 0
        self.replaced = 0
        self._threads = [
            threading.Thread(target=self._run, args=(i, random.Random(rng.random())))
            for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, index: int, rng: random.Random) -> None:
        sequence = 0
        while not self._stop.is_set():
            with Producer(
                self._address,
                client_id=f"soak-producer-{self._prefix}-{index}",
                acks="all",
                linger_ms=5,
                request_timeout_ms=30_000,
            ) as producer:
                ends = time.monotonic() + rng.uniform(1, 6)
                futures = []
                while time.monotonic() < ends and not self._stop.is_set():
                    value = f"{self._prefix}-{index}-{sequence}"
                    sequence += 1
                    futures.append((value, producer.send(self._topic, value.encode())))
                    time.sleep(rng.uniform(0, 0.01))
                try:
                    producer.flush(timeout_ms=60_000)
                except TidelogError:
                    pass  # what is not done by now counts as failed below
                done, failed = [], 0
                for value, future in futures:
                    try:
                        ok = future.exception(timeout=60) is None
                    except TimeoutError:
                        ok = False
                    if ok:
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
            thread.join(180)


class Group:
    """Consumer threads of one group; at random one leaves and a new one joins."""

    def __init__(self, address: str, group: str, topic: str, size: int, rng: random.Random) -> None:
        self._address = address
        self.name = group
        self._topic = topic
        self._stop = threading.Event()
        self.draining = threading.Event()
        self._lock = threading.Lock()
        self._seen: Counter[str] = Counter()
        self.rejoined = 0
        self._threads = [
            threading.Thread(target=self._run, args=(i, random.Random(rng.random())))
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, index: int, rng: random.Random) -> None:
        while not self._stop.is_set():
            consumer = Consumer(
                self._address,
                group_id=self.name,
                client_id=f"soak-{self.name}-{index}",
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=3_000,
                heartbeat_interval_ms=500,
                request_timeout_ms=30_000,
            )
            try:
                consumer.subscribe([self._topic])
                ends = time.monotonic() + rng.uniform(2, 10)
                while not self._stop.is_set() and (
                    self.draining.is_set() or time.monotonic() < ends
                ):
                    records = consumer.poll(timeout_ms=200)
                    if records:
                        with self._lock:
                            self._seen.update((r.value or b"").decode() for r in records)
                        consumer.commit()
            except TidelogError as exc:
                # Fenced or timed out (a rebalance raced the commit): leave and rejoin,
                # as an application would; the uncommitted records come again.
                sys.stderr.write(f"soak consumer {self.name}-{index}: {exc!r}\n")
            finally:
                try:
                    consumer.close()
                except TidelogError as exc:
                    sys.stderr.write(f"soak consumer {self.name}-{index} close: {exc!r}\n")
            with self._lock:
                self.rejoined += 1

    def seen(self) -> dict[str, int]:
        with self._lock:
            return dict(self._seen)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(180)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("topic")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--producers", type=int, required=True)
    parser.add_argument("--groups", required=True)
    parser.add_argument("--consumers-per-group", type=int, required=True)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--lifetime-s", type=float, default=900.0)
    args = parser.parse_args()
    rng = random.Random(args.seed * 1_000 + args.index)
    # Exit by ourselves whatever the test does.
    threading.Timer(args.lifetime_s, lambda: os._exit(3)).start()
    producers = Producers(args.address, args.topic, f"w{args.index}", args.producers, rng)
    groups = [
        Group(args.address, name, args.topic, args.consumers_per_group, rng)
        for name in args.groups.split(",")
    ]
    for line in sys.stdin:
        command = line.strip()
        if command == "stop-producers":
            producers.stop()
            _say(acked=producers.acked, failed=producers.failed, replaced=producers.replaced)
        elif command == "drain":
            for group in groups:
                group.draining.set()
            _say(draining=True)
        elif command == "seen":
            _say(seen={group.name: group.seen() for group in groups})
        elif command == "stop":
            break
    producers.stop()
    for group in groups:
        group.stop()
    _say(rejoined={group.name: group.rejoined for group in groups})
    sys.stdout.flush()
    os._exit(0)  # the lifetime timer thread must not keep us


if __name__ == "__main__":
    main()
