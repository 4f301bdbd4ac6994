"""Idempotent-producer state of one partition: the last batches of every producer id.

Kafka's rules (reference section 4): a batch from producer id ``P`` with epoch ``E`` and
sequences ``[first, last]`` is

* a **duplicate** if ``(first, last)`` equals one of the last five batches stored for
  ``(P, E)``: it is not stored again and the original offsets are returned;
* **fenced** (``InvalidProducerEpochError``) if ``E`` is older than the stored epoch;
* **in order** if ``E`` is newer and ``first == 0``, or ``E`` is the same and ``first`` is
  the stored last sequence plus one (sequences wrap at 2**31); anything else is
  ``OutOfOrderSequenceError``.

A producer id this partition has never seen is accepted at any sequence (its state may have
been removed by retention or expiry; Kafka since 2.5 does the same).

The table is pure: it works on batch headers and integers. ``PartitionLog`` calls it under
its lock, snapshots it (``to_bytes``) when a segment rolls and at clean shutdown, and rebuilds
it on load from the newest snapshot plus the batch headers after it; no record is decoded.

Snapshot format: UTF-8 JSON ``{"version": 1, "offset": N, "producers": [[pid, epoch,
last_timestamp_ms, [[first_seq, last_seq, base_offset, last_offset], ...]], ...]}`` where
``N`` is the log end offset the snapshot covers.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tidelog.storage.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from tidelog.storage.records import NO_PRODUCER_ID, NO_SEQUENCE, BatchHeader

__all__ = [
    "BATCHES_KEPT",
    "BatchMetadata",
    "ProducerEntry",
    "ProducerStateTable",
    "ProducerSummary",
]

BATCHES_KEPT = 5
_SEQUENCE_MODULUS = 2**31


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """Sequences and offsets of one stored batch."""

    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class ProducerSummary:
    """One producer as ``DescribeProducers`` reports it (a copy, safe to hand out)."""

    producer_id: int
    epoch: int
    last_sequence: int  # NO_SEQUENCE (-1) when no sequenced batch is remembered
    last_timestamp_ms: int
    last_offset: int  # -1 when no batch is remembered


@dataclass(slots=True)
class ProducerEntry:
    """What a partition remembers of one producer id."""

    producer_id: int
    epoch: int
    last_timestamp_ms: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE


class ProducerStateTable:
    """Producer id -> ``ProducerEntry`` for one partition. Not thread-safe."""

    def __init__(self) -> None:
        self._entries: dict[int, ProducerEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._entries.get(producer_id)

    def describe(self, producer_id: int | None = None) -> list[ProducerSummary]:
        """What the table remembers, as values: every producer, or only ``producer_id``.

        Like every method here, called under the partition's lock
        (``PartitionLog.describe_producers``).
        """
        if producer_id is not None:
            found = self._entries.get(producer_id)
            entries = [] if found is None else [found]
        else:
            entries = list(self._entries.values())
        out = []
        for entry in entries:
            batches = tuple(entry.batches)
            last = batches[-1] if batches else None
            out.append(
                ProducerSummary(
                    entry.producer_id,
                    entry.epoch,
                    NO_SEQUENCE if last is None else last.last_sequence,
                    entry.last_timestamp_ms,
                    -1 if last is None else last.last_offset,
                )
            )
        return out

    def check(self, header: BatchHeader) -> BatchMetadata | None:
        """Classify an incoming batch before offsets are assigned.

        Returns the stored batch if this one is a duplicate, None if it is new and in order.

        Raises:
            InvalidProducerEpochError: the epoch is older than the stored one.
            OutOfOrderSequenceError: the sequence does not follow the stored one.
        """
        if header.producer_id == NO_PRODUCER_ID or header.base_sequence == NO_SEQUENCE:
            return None
        entry = self._entries.get(header.producer_id)
        if entry is None:
            return None
        first, last = header.base_sequence, header.last_sequence
        if header.producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {header.producer_id} epoch {header.producer_epoch} is older than "
                f"the current epoch {entry.epoch}"
            )
        if header.producer_epoch > entry.epoch:
            if first != 0:
                raise OutOfOrderSequenceError(
                    f"producer {header.producer_id} started epoch {header.producer_epoch} at "
                    f"sequence {first}, expected 0"
                )
            return None
        for batch in entry.batches:
            if batch.first_sequence == first and batch.last_sequence == last:
                return batch
        expected = (entry.last_sequence + 1) % _SEQUENCE_MODULUS
        if entry.last_sequence != NO_SEQUENCE and first != expected:
            raise OutOfOrderSequenceError(
                f"producer {header.producer_id} epoch {header.producer_epoch}: sequence "
                f"{first}, expected {expected}"
            )
        return None

    def check_all(self, headers: Sequence[BatchHeader]) -> list[BatchMetadata | None]:
        """``check`` for the batches of one request, in order.

        Each batch is checked as if the new batches before it in the request were already
        stored, so one request may carry several consecutive batches of a producer.
        Raises as ``check`` does (for the first offending batch).
        """
        scratch = ProducerStateTable()
        out: list[BatchMetadata | None] = []
        for header in headers:
            pid = header.producer_id
            if pid == NO_PRODUCER_ID or header.base_sequence == NO_SEQUENCE:
                out.append(None)
                continue
            table = scratch if pid in scratch._entries else self
            found = table.check(header)
            if found is None:
                entry = self._entries.get(pid)
                if pid not in scratch._entries and entry is not None:
                    scratch._entries[pid] = ProducerEntry(
                        pid,
                        entry.epoch,
                        entry.last_timestamp_ms,
                        deque(entry.batches, maxlen=BATCHES_KEPT),
                    )
                scratch.update(header, 0)
            out.append(found)
        return out

    def update(self, header: BatchHeader, timestamp_ms: int) -> None:
        """Record a batch that was appended (its header carries the assigned offsets)."""
        if header.producer_id == NO_PRODUCER_ID:
            return
        entry = self._entries.get(header.producer_id)
        if entry is None or header.producer_epoch > entry.epoch:
            entry = ProducerEntry(header.producer_id, header.producer_epoch, timestamp_ms)
            self._entries[header.producer_id] = entry
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, timestamp_ms)
        if header.base_sequence != NO_SEQUENCE:
            entry.batches.append(
                BatchMetadata(
                    header.base_sequence,
                    header.last_sequence,
                    header.base_offset,
                    header.last_offset,
                )
            )

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for longer than ``expiration_ms``; returns how many."""
        stale = [
            pid
            for pid, entry in self._entries.items()
            if now_ms - entry.last_timestamp_ms > expiration_ms
        ]
        for pid in stale:
            del self._entries[pid]
        return len(stale)

    def to_bytes(self, offset: int) -> bytes:
        """Serialise the table as of log end offset ``offset``."""
        producers = [
            [
                e.producer_id,
                e.epoch,
                e.last_timestamp_ms,
                [
                    [b.first_sequence, b.last_sequence, b.base_offset, b.last_offset]
                    for b in e.batches
                ],
            ]
            for e in self._entries.values()
        ]
        return json.dumps({"version": 1, "offset": offset, "producers": producers}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> tuple[ProducerStateTable, int]:
        """Parse a snapshot; returns the table and the offset it covers.

        Raises:
            ValueError: the snapshot is not a version-1 snapshot (the caller rebuilds).
        """
        try:
            document = json.loads(data)
            if document["version"] != 1:
                raise ValueError(f"unknown snapshot version {document['version']}")
            table = cls()
            for pid, epoch, last_ts, batches in document["producers"]:
                entry = ProducerEntry(int(pid), int(epoch), int(last_ts))
                for first, last, base, last_offset in batches:
                    entry.batches.append(
                        BatchMetadata(int(first), int(last), int(base), int(last_offset))
                    )
                table._entries[entry.producer_id] = entry
            return table, int(document["offset"])
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"unreadable producer snapshot: {exc}") from exc
