"""Idempotent-producer state of one partition: the last batches of every producer id.

Kafka's rules (reference section 4): a batch from producer id ``P`` with epoch ``E`` and
sequences ``[first, last]`` is

* a **duplicate** if ``(first, last)`` equals one of the last five batches stored for
  ``(P, E)``: it is not stored again and the original offsets are returned. For a
  transactional batch, only a batch of the transaction open here counts (one stored
  since ``current_txn_first_offset``): a transaction's end closes its duplicate window
  (below);
* **fenced** (``InvalidProducerEpochError``) if ``E`` is older than the stored epoch;
* **in order** if ``E`` is newer and ``first == 0``, or ``E`` is the same and ``first`` is
  the stored last sequence plus one (sequences wrap at 2**31); anything else is
  ``OutOfOrderSequenceError``.

A producer id this partition has never seen is accepted at any sequence (its state may have
been removed by retention or expiry; Kafka since 2.5 does the same).

Transactions (Kafka's ``ProducerStateManager`` and ``ProducerAppendInfo``, reference
``transactions.md`` section 7.1): each producer also remembers the first offset of its
open transaction on this partition (``current_txn_first_offset``, -1 when none) and the
newest coordinator epoch that wrote it a marker.

* A transactional data batch opens a transaction at its base offset unless one is open.
* A non-transactional batch from a producer whose transaction is open is refused
  (``InvalidTxnStateError``) on a leader's append (``check``).
* An end-transaction marker (``complete_txn``) with an older producer epoch is
  ``InvalidProducerEpochError``, with an older coordinator epoch
  ``TransactionCoordinatorFencedError`` (both checked on a leader's append only; a
  follower takes what its leader wrote). It ends the open transaction, if any, and
  returns it as a ``CompletedTxn``; a marker with no open transaction (an empty
  transaction on this partition) returns None and adds no index entry. Either way the
  producer's epoch and coordinator epoch move to the marker's, as Kafka's
  ``appendEndTxnMarker`` does (a marker's newer epoch, transactions v2's bump, starts the
  producer's next epoch: its batches begin at sequence 0).
* A completed transaction stays *unreplicated* until the high watermark passes its
  marker. The first unstable offset is the smallest first offset of the open and the
  unreplicated transactions; the last stable offset is that capped at the high watermark
  (``first_unstable_offset``).
* Producers with an open transaction never expire (``expire``).
* **A transaction's end closes its duplicate window.** Once a marker ended P's
  transaction here, a transactional batch repeating the sequences of one of that
  transaction's batches is no retry the client can still be waiting for (a commit
  follows its acknowledgements, an abort purges what was unanswered), so it is not
  answered as a duplicate: it is checked as a new batch, and its sequence, at or below
  the stored last one, is ``OutOfOrderSequenceError``. Kafka answers it with the ended
  batch's offsets, and then the new records are lost without a word: librdkafka 2.16
  (transactions v1) sends exactly that after aborting a transaction whose in-flight
  batch a broker restart left "possibly persisted": it purges the batch, keeps its
  epoch and reuses the batch's sequences in the next transaction (seen in
  ``tests/faults/test_transactions_under_kills.py``, a committed transaction missing
  the records of one partition). Refused instead, the client fails that transaction
  (librdkafka: a fatal sequence desynchronization) and nothing it commits is missing.
  Under transactions v2 every marker starts a new epoch, which opens a new window
  anyway; non-transactional idempotent producers are unchanged.

Verification guards (KIP-890 part 1, Kafka's ``VerificationStateEntry``). A leader asks
the transaction coordinator whether a partition is in a producer's transaction before it
appends that producer's first transactional batch of a transaction here; the answer can
be stale by the time the batch is appended (the transaction ended, and its marker landed,
in between: the batch would open a transaction nobody will ever end). So the leader first
takes a ``VerificationGuard`` from this table (``start_verification``, under the partition
lock), asks the coordinator outside the lock, then appends with the guard; the append
(``check_verified``, under the lock again) accepts a transactional batch of a producer
with no open transaction at that epoch only if the table still holds that very guard
object. A marker for the producer removes it (``complete_txn``), as does the producer's
first transactional batch (the transaction is then open, and later batches need no
guard), so a verification that a marker overtook can never be used. The one exception
is Kafka's: under transactions v2 (a guard taken for Produce v12+, ``epoch_bump``) a
marker carrying the guard's own epoch is the previous transaction's (v2 markers carry
the bumped epoch the next transaction runs under), so it leaves the guard alone. Guards
live in memory only (a restarted or new leader has none: an in-flight append is refused
and the client aborts) and are dropped with ``expire`` once as old as an idle producer.

The table is pure: it works on batch headers and integers. ``PartitionLog`` calls it under
its lock, snapshots it (``to_bytes``) when a segment rolls and at clean shutdown, and rebuilds
it on load from the newest snapshot plus the batch headers after it; no record is decoded.

Snapshot format: UTF-8 JSON ``{"version": 2, "offset": N, "producers": [[pid, epoch,
last_timestamp_ms, [[first_seq, last_seq, base_offset, last_offset], ...],
coordinator_epoch, current_txn_first_offset], ...], "unreplicated": [[pid, first_offset,
last_offset, aborted], ...]}`` where ``N`` is the log end offset the snapshot covers.
Version 1 (no coordinator epoch, no transaction, no ``unreplicated``) is still read: its
producers have no open transaction, as was true when only idempotent batches existed.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tidelog.storage.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from tidelog.storage.records import NO_PRODUCER_ID, NO_SEQUENCE, BatchHeader

__all__ = [
    "BATCHES_KEPT",
    "NO_TXN",
    "BatchMetadata",
    "CompletedTxn",
    "ProducerEntry",
    "ProducerStateTable",
    "ProducerSummary",
    "VerificationGuard",
]

BATCHES_KEPT = 5
NO_TXN = -1  # no open transaction (Kafka's empty currentTxnFirstOffset)
NO_COORDINATOR_EPOCH = -1
_SNAPSHOT_VERSION = 2
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
    current_txn_start_offset: int = NO_TXN  # the open transaction's first offset
    coordinator_epoch: int = NO_COORDINATOR_EPOCH


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction ended by a marker at ``last_offset``; ``aborted`` for ABORT."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


@dataclass(slots=True)
class ProducerEntry:
    """What a partition remembers of one producer id."""

    producer_id: int
    epoch: int
    last_timestamp_ms: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))
    coordinator_epoch: int = NO_COORDINATOR_EPOCH
    current_txn_first_offset: int = NO_TXN

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE


# check_all's stand-in for the first offset of a transaction its request opens.
_PAST_EVERY_OFFSET = 2**63 - 1


def _in_duplicate_window(entry: ProducerEntry, stored: BatchMetadata, header: BatchHeader) -> bool:
    """Whether ``header`` may be a retry of ``stored``: always for a non-transactional
    batch; for a transactional one, only while the transaction ``stored`` belongs to is
    still open here (module docstring)."""
    if not header.is_transactional:
        return True
    first = entry.current_txn_first_offset
    return first != NO_TXN and stored.base_offset >= first


class VerificationGuard:
    """A token proving that the coordinator was asked after it was taken (module
    docstring). Compared by identity: only the object the table holds is valid."""

    __slots__ = ("created_ms", "epoch", "epoch_bump", "producer_id")

    def __init__(self, producer_id: int, epoch: int, epoch_bump: bool, created_ms: int) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.epoch_bump = epoch_bump  # taken for a transactions v2 producer
        self.created_ms = created_ms

    def __repr__(self) -> str:
        return f"VerificationGuard(producer {self.producer_id} epoch {self.epoch})"


class ProducerStateTable:
    """Producer id -> ``ProducerEntry`` for one partition. Not thread-safe."""

    def __init__(self) -> None:
        self._entries: dict[int, ProducerEntry] = {}
        # Verification guards by producer id (leaders only, memory only).
        self._guards: dict[int, VerificationGuard] = {}
        # Open transactions: first offset -> producer id (one per producer at most).
        self._ongoing: dict[int, int] = {}
        # Transactions completed by a marker the high watermark has not passed yet.
        self._unreplicated: list[CompletedTxn] = []

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
                    entry.current_txn_first_offset,
                    entry.coordinator_epoch,
                )
            )
        return out

    def check(self, header: BatchHeader) -> BatchMetadata | None:
        """Classify an incoming batch before offsets are assigned.

        Returns the stored batch if this one is a duplicate, None if it is new and in order.

        Raises:
            InvalidProducerEpochError: the epoch is older than the stored one.
            InvalidTxnStateError: a non-transactional batch while the producer's
                transaction is open.
            OutOfOrderSequenceError: the sequence does not follow the stored one.
        """
        if header.producer_id == NO_PRODUCER_ID:
            return None
        entry = self._entries.get(header.producer_id)
        if entry is None:
            return None
        if header.producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {header.producer_id} epoch {header.producer_epoch} is older than "
                f"the current epoch {entry.epoch}"
            )
        if not header.is_transactional and entry.current_txn_first_offset != NO_TXN:
            raise InvalidTxnStateError(
                f"producer {header.producer_id} sent a non-transactional batch while its "
                f"transaction from offset {entry.current_txn_first_offset} is open"
            )
        if header.base_sequence == NO_SEQUENCE:
            return None
        first, last = header.base_sequence, header.last_sequence
        if header.producer_epoch > entry.epoch:
            if first != 0:
                raise OutOfOrderSequenceError(
                    f"producer {header.producer_id} started epoch {header.producer_epoch} at "
                    f"sequence {first}, expected 0"
                )
            return None
        for batch in entry.batches:
            if (
                batch.first_sequence == first
                and batch.last_sequence == last
                and _in_duplicate_window(entry, batch, header)
            ):
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
        out: list[BatchMetadata | None] = []
        if all(h.producer_id == NO_PRODUCER_ID for h in headers):
            return [None] * len(headers)  # no idempotent producer: nothing to check
        scratch = ProducerStateTable()
        for header in headers:
            pid = header.producer_id
            if pid == NO_PRODUCER_ID:
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
                        entry.coordinator_epoch,
                        entry.current_txn_first_offset,
                    )
                copied = scratch._entries.get(pid)
                was_open = copied is not None and copied.current_txn_first_offset != NO_TXN
                scratch.update(header, 0)
                if header.is_transactional and not was_open:
                    # The transaction this batch opens starts past everything stored (its
                    # offsets are not assigned yet): the ended transactions' batches stay
                    # out of its duplicate window.
                    scratch._entries[pid].current_txn_first_offset = _PAST_EVERY_OFFSET
            out.append(found)
        return out

    def has_ongoing_txn(self, producer_id: int, epoch: int) -> bool:
        """Whether ``producer_id`` has a transaction open here under ``epoch`` (a newer
        epoch's batch needs a guard: its transaction may have ended since)."""
        entry = self._entries.get(producer_id)
        return (
            entry is not None and entry.epoch == epoch and entry.current_txn_first_offset != NO_TXN
        )

    def start_verification(
        self, producer_id: int, epoch: int, *, epoch_bump: bool, now_ms: int
    ) -> VerificationGuard | None:
        """Before the coordinator is asked about a transactional batch: the producer's
        guard (taken now, or the one an earlier request of the same epoch took), or None
        if its transaction is open here already (no guard needed).

        Raises:
            InvalidProducerEpochError: ``epoch`` is older than the stored one (refused
                before the coordinator is asked, as Kafka's).
        """
        entry = self._entries.get(producer_id)
        if entry is not None and epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id} epoch {epoch} is older than the current epoch "
                f"{entry.epoch}"
            )
        if self.has_ongoing_txn(producer_id, epoch):
            return None
        guard = self._guards.get(producer_id)
        if guard is None or guard.epoch != epoch:
            guard = VerificationGuard(producer_id, epoch, epoch_bump, now_ms)
            self._guards[producer_id] = guard
        return guard

    def guard(self, producer_id: int) -> VerificationGuard | None:
        """The guard held for ``producer_id``, if any."""
        return self._guards.get(producer_id)

    def check_verified(
        self,
        headers: Sequence[BatchHeader],
        guards: Mapping[int, VerificationGuard | None],
    ) -> None:
        """At a verified append, under the partition lock: every transactional data batch
        of a producer with no transaction open here at its epoch must come with the guard
        this table holds for it (``guards``: producer id -> the guard the verification
        started with).

        Raises:
            InvalidTxnStateError: no guard, or not the one held (a marker landed since
                the verification began, or the guard expired): nothing is appended.
        """
        for header in headers:
            if not header.is_transactional or header.is_control:
                continue
            pid = header.producer_id
            if self.has_ongoing_txn(pid, header.producer_epoch):
                continue
            given = guards.get(pid)
            if given is None or self._guards.get(pid) is not given:
                raise InvalidTxnStateError(
                    f"producer {pid} epoch {header.producer_epoch}: the record was not part "
                    "of an ongoing transaction (its verification is no longer valid: the "
                    "transaction ended while it ran)"
                )

    def update(self, header: BatchHeader, timestamp_ms: int) -> None:
        """Record a data batch that was appended (its header carries the assigned offsets);
        a transactional one opens its producer's transaction if none is open. Control
        batches go to ``complete_txn`` instead."""
        if header.producer_id == NO_PRODUCER_ID:
            return
        entry = self._entries.get(header.producer_id)
        if entry is None or header.producer_epoch > entry.epoch:
            entry = self._new_epoch(header.producer_id, header.producer_epoch, timestamp_ms)
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, timestamp_ms)
        if header.is_transactional and entry.current_txn_first_offset == NO_TXN:
            entry.current_txn_first_offset = header.base_offset
            self._ongoing[header.base_offset] = header.producer_id
        if header.is_transactional:
            self._guards.pop(header.producer_id, None)  # the transaction is open now
        if header.base_sequence != NO_SEQUENCE:
            entry.batches.append(
                BatchMetadata(
                    header.base_sequence,
                    header.last_sequence,
                    header.base_offset,
                    header.last_offset,
                )
            )

    def _new_epoch(self, producer_id: int, epoch: int, timestamp_ms: int) -> ProducerEntry:
        """A fresh entry for a producer's newer epoch, keeping what survives an epoch bump
        (its open transaction: under transactions v2 the marker itself brings the bump,
        and Kafka keeps ``currentTxnFirstOffset`` across epochs; the coordinator epoch)."""
        old = self._entries.get(producer_id)
        entry = ProducerEntry(producer_id, epoch, timestamp_ms)
        if old is not None:
            entry.coordinator_epoch = old.coordinator_epoch
            entry.current_txn_first_offset = old.current_txn_first_offset
        self._entries[producer_id] = entry
        return entry

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """Whether a leader may append an end-transaction marker (before it is written).

        Raises:
            InvalidProducerEpochError: ``epoch`` is older than the producer's.
            TransactionCoordinatorFencedError: ``coordinator_epoch`` is older than the
                newest one that wrote this producer a marker here.
        """
        entry = self._entries.get(producer_id)
        if entry is None:
            return
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"marker for producer {producer_id} epoch {epoch} is older than the current "
                f"epoch {entry.epoch}"
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker for producer {producer_id} from coordinator epoch "
                f"{coordinator_epoch}, older than {entry.coordinator_epoch}"
            )

    def complete_txn(
        self,
        producer_id: int,
        epoch: int,
        coordinator_epoch: int,
        marker_offset: int,
        *,
        commit: bool,
        timestamp_ms: int,
    ) -> CompletedTxn | None:
        """Record an appended marker; the transaction it ended, or None if none was open.

        Checks nothing (a leader calls ``check_marker`` first; a follower or a recovery
        replays what is in the log). The completed transaction is unreplicated until the
        high watermark passes ``marker_offset``.
        """
        entry = self._entries.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = self._new_epoch(producer_id, epoch, timestamp_ms)
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, timestamp_ms)
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
        guard = self._guards.get(producer_id)
        if guard is not None and not (guard.epoch_bump and guard.epoch == epoch):
            # A verification begun before this marker is void (module docstring).
            del self._guards[producer_id]
        first = entry.current_txn_first_offset
        if first == NO_TXN:
            return None
        entry.current_txn_first_offset = NO_TXN
        self._ongoing.pop(first, None)
        completed = CompletedTxn(producer_id, first, marker_offset, not commit)
        self._unreplicated.append(completed)
        return completed

    def last_stable_offset_of(self, completed: CompletedTxn) -> int:
        """The ``.txnindex`` entry's LSO field for ``completed`` (Kafka's
        ``lastStableOffset(CompletedTxn)``): the first offset of the oldest open
        transaction of another producer, else the marker's offset plus one."""
        others = [f for f, pid in self._ongoing.items() if pid != completed.producer_id]
        return min(others) if others else completed.last_offset + 1

    def has_undecided(self) -> bool:
        """Whether a transaction is open or completed above a high watermark (safe to
        call without the partition lock: two container sizes)."""
        return bool(self._ongoing) or bool(self._unreplicated)

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The smallest first offset of the open transactions and of the completed ones
        whose marker is at or past ``high_watermark`` (None: no such transaction).

        Completed transactions whose marker is below ``high_watermark`` are forgotten
        here: the high watermark only rises (a truncation rebuilds the table).
        """
        if self._unreplicated:
            self._unreplicated = [t for t in self._unreplicated if t.last_offset >= high_watermark]
        firsts = [t.first_offset for t in self._unreplicated]
        if self._ongoing:
            firsts.append(min(self._ongoing))
        return min(firsts) if firsts else None

    def ongoing_first_offsets(self) -> dict[int, int]:
        """Open transactions: first offset -> producer id (a copy)."""
        return dict(self._ongoing)

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for longer than ``expiration_ms``, except those with an
        open transaction (Kafka never expires them); returns how many."""
        stale = [
            pid
            for pid, entry in self._entries.items()
            if now_ms - entry.last_timestamp_ms > expiration_ms
            and entry.current_txn_first_offset == NO_TXN
        ]
        for pid in stale:
            del self._entries[pid]
        for pid, guard in list(self._guards.items()):
            if now_ms - guard.created_ms > expiration_ms:
                del self._guards[pid]
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
                e.coordinator_epoch,
                e.current_txn_first_offset,
            ]
            for e in self._entries.values()
        ]
        unreplicated = [
            [t.producer_id, t.first_offset, t.last_offset, t.aborted]
            for t in self._unreplicated
            if t.last_offset < offset
        ]
        document = {
            "version": _SNAPSHOT_VERSION,
            "offset": offset,
            "producers": producers,
            "unreplicated": unreplicated,
        }
        return json.dumps(document).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> tuple[ProducerStateTable, int]:
        """Parse a snapshot; returns the table and the offset it covers.

        Raises:
            ValueError: not a version 1 or 2 snapshot (the caller rebuilds).
        """
        try:
            document = json.loads(data)
            version = document["version"]
            if version not in (1, _SNAPSHOT_VERSION):
                raise ValueError(f"unknown snapshot version {version}")
            table = cls()
            for fields in document["producers"]:
                pid, epoch, last_ts, batches = fields[:4]
                entry = ProducerEntry(int(pid), int(epoch), int(last_ts))
                if version >= 2:
                    entry.coordinator_epoch = int(fields[4])
                    entry.current_txn_first_offset = int(fields[5])
                for first, last, base, last_offset in batches:
                    entry.batches.append(
                        BatchMetadata(int(first), int(last), int(base), int(last_offset))
                    )
                table._entries[entry.producer_id] = entry
                if entry.current_txn_first_offset != NO_TXN:
                    table._ongoing[entry.current_txn_first_offset] = entry.producer_id
            for pid, first, last, aborted in document.get("unreplicated", []):
                table._unreplicated.append(
                    CompletedTxn(int(pid), int(first), int(last), bool(aborted))
                )
            return table, int(document["offset"])
        except (KeyError, TypeError, IndexError, json.JSONDecodeError) as exc:
            raise ValueError(f"unreadable producer snapshot: {exc}") from exc
