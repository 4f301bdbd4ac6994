"""A continuous produce-and-consume load on a cluster, and the checker of its history.

``Workload`` runs, on threads, while a failure test breaks the cluster:

* a producer (idempotent, ``acks="all"``) writing ``KEYS`` keys, each key's values
  ``"<key>:<sequence>"`` with sequences 0, 1, 2, ... in send order; it records which
  sends were acknowledged;
* a consumer in a group, reading and committing after every poll; it records every
  record it was given;
* a monitor reading the group's committed offsets now and then.

``check`` then reads every partition from the start with a fresh consumer and asserts
the guarantees of ``docs/replication.md``:

* no acknowledged record is lost;
* no record is stored twice (the producer is idempotent);
* each key's records are stored in send order;
* nothing the group consumer read was above the high watermark: every record it was
  given is still in the log after the failures (a read above the high watermark could
  have been truncated away since);
* the committed offsets never went backwards.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.storage.errors import TidelogError

__all__ = ["KEYS", "Workload"]

KEYS = 6


@dataclass
class History:
    acknowledged: set[tuple[int, int]] = field(default_factory=set)
    failed: set[tuple[int, int]] = field(default_factory=set)
    consumed: set[tuple[int, int]] = field(default_factory=set)
    committed: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)


class Workload:
    """Load on ``topic`` (created by the caller) through ``bootstrap``. ``start``/``stop``."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, *, rate_per_s: int = 200):
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.group = f"checker-{topic}"
        self.history = History()
        self._interval_s = 1 / rate_per_s
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._produce, name="workload-producer", daemon=True),
            threading.Thread(target=self._consume, name="workload-consumer", daemon=True),
            threading.Thread(target=self._monitor, name="workload-monitor", daemon=True),
        ]

    def start(self) -> Workload:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(120)

    def wait_for_acks(self, count: int, timeout_s: float = 60) -> None:
        """Block until ``count`` more sends than now have been acknowledged."""
        with self._lock:
            target = len(self.history.acknowledged) + count
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if len(self.history.acknowledged) >= target:
                    return
            assert time.monotonic() < deadline, (
                f"only {len(self.history.acknowledged)} of {target} acknowledged in time; "
                f"errors: {self.history.errors[-3:]}"
            )
            time.sleep(0.05)

    # --- the threads ----------------------------------------------------------------------

    def _produce(self) -> None:
        sequences = [0] * KEYS
        with Producer(
            self.bootstrap, acks="all", linger_ms=2, delivery_timeout_ms=60_000
        ) as producer:
            pending = []
            n = 0
            while not self._stopping.is_set():
                key = n % KEYS
                sequence = sequences[key]
                sequences[key] += 1
                future = producer.send(
                    self.topic, f"{key}:{sequence}".encode(), key=f"k{key}".encode()
                )
                pending.append(((key, sequence), future))
                n += 1
                pending = self._settle(pending, block=False)
                time.sleep(self._interval_s)
            producer.flush(timeout_ms=90_000)
            self._settle(pending, block=True)

    def _settle(self, pending: list, *, block: bool) -> list:  # type: ignore[type-arg]
        left = []
        for ident, future in pending:
            if not block and not future.done():
                left.append((ident, future))
                continue
            try:
                future.result(timeout=90)
                with self._lock:
                    self.history.acknowledged.add(ident)
            except Exception as exc:
                with self._lock:
                    self.history.failed.add(ident)
                    self.history.errors.append(f"send {ident}: {exc!r}")
        return left

    def _consume(self) -> None:
        with Consumer(
            self.bootstrap,
            group_id=self.group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        ) as consumer:
            consumer.subscribe([self.topic])
            while not self._stopping.is_set():
                try:
                    records = consumer.poll(timeout_ms=200)
                    for record in records:
                        key, sequence = (int(x) for x in (record.value or b"").split(b":"))
                        with self._lock:
                            self.history.consumed.add((key, sequence))
                    if records:
                        consumer.commit()
                except TidelogError as exc:
                    with self._lock:
                        self.history.errors.append(f"consume: {exc!r}")
                    time.sleep(0.2)

    def _monitor(self) -> None:
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        with Consumer(self.bootstrap, group_id=self.group) as watcher:
            while not self._stopping.wait(0.5):
                for tp in tps:
                    try:
                        offset = watcher.committed(tp, timeout_ms=5_000)
                    except TidelogError:
                        continue
                    if offset is not None:
                        with self._lock:
                            self.history.committed[tp.partition].append(offset)

    # --- the verdict ----------------------------------------------------------------------

    def check(self) -> dict[str, int]:
        """Assert the guarantees (module docstring); returns counts for the report."""
        stored = self._read_everything()
        history = self.history
        pairs = [pair for _partition, pair in stored]
        assert len(pairs) == len(set(pairs)), "a record is stored twice"
        lost = history.acknowledged - set(pairs)
        assert not lost, f"{len(lost)} acknowledged record(s) lost, e.g. {sorted(lost)[:5]}"
        by_key: dict[int, list[int]] = defaultdict(list)
        for _partition, (key, sequence) in stored:
            by_key[key].append(sequence)
        for key, sequences in by_key.items():
            assert sequences == sorted(sequences), f"key {key} stored out of order"
        vanished = history.consumed - set(pairs)
        assert not vanished, f"the group read {len(vanished)} record(s) the log no longer has"
        for partition, offsets in history.committed.items():
            drops = [(a, b) for a, b in itertools.pairwise(offsets) if b < a]
            assert not drops, f"partition {partition}: a commit went backwards: {drops[:3]}"
        return {
            "acknowledged": len(history.acknowledged),
            "failed": len(history.failed),
            "stored": len(pairs),
            "consumed": len(history.consumed),
        }

    def _read_everything(self) -> list[tuple[int, tuple[int, int]]]:
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        with AdminClient(self.bootstrap, request_timeout_ms=30_000) as admin:
            ends = admin.list_offsets(dict.fromkeys(tps, "latest"))
        want = {tp: found.offset if found is not None else 0 for tp, found in ends.items()}
        out: list[tuple[int, tuple[int, int]]] = []
        with Consumer(self.bootstrap, auto_offset_reset="earliest") as consumer:
            consumer.assign(tps)
            positions = dict.fromkeys(tps, 0)
            deadline = time.monotonic() + 60
            while any(positions[tp] < want[tp] for tp in tps):
                assert time.monotonic() < deadline, f"could not read back: {positions} {want}"
                for record in consumer.poll(timeout_ms=200):
                    tp = TopicPartition(record.topic, record.partition)
                    positions[tp] = record.offset + 1
                    key, sequence = (int(x) for x in (record.value or b"").split(b":"))
                    out.append((record.partition, (key, sequence)))
        return out
