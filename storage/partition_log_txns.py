"""The transaction side of ``PartitionLog``: verification, markers, the last stable offset
and the aborted transactions a read_committed fetch reports.

``TransactionCalls`` is mixed into ``PartitionLog`` (``storage.partition_log``) and is not
used alone: it takes the log's lock, and moves the log's producer state through the pure
functions of ``storage.partition_txns`` (which hold Kafka's rules: what a marker ends,
what gets a ``.txnindex`` entry, where the last stable offset is). It is apart because a
transactional partition's surface (Kafka's ``UnifiedLog`` for WriteTxnMarkers, the
produce path's verification and read_committed fetches) is its own concept on top of the
append path; the transactional data batches themselves go through ``PartitionLog.append``
(a leader) and ``append_as_follower`` (a follower, ``storage.partition_log_replication``).

Thread-safe, as ``PartitionLog`` is: the locking and crash-consistency rules are in
``storage.partition_log``'s docstring; ``last_stable_offset`` is lock-free while nothing is
undecided (its docstring says why that is safe).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from tidelog.storage.clock import Clock
from tidelog.storage.control import EndTxnMarker, build_marker
from tidelog.storage.errors import FencedLeaderEpochError, StorageError
from tidelog.storage.leader_epoch import LeaderEpochCache
from tidelog.storage.local_log import LocalLog, io_error
from tidelog.storage.partition_txns import apply_marker, collect_aborted, last_stable_offset
from tidelog.storage.producer_state import ProducerStateTable, VerificationGuard
from tidelog.storage.records import read_header
from tidelog.storage.segment import BatchPosition

if TYPE_CHECKING:
    from tidelog.storage.config import LogConfig
    from tidelog.storage.segment import Segment

__all__ = ["TransactionCalls"]


class TransactionCalls:
    """``PartitionLog``'s transaction methods. Thread-safe; needs the attributes below,
    which ``PartitionLog.__init__`` assigns."""

    _clock: Clock
    _local: LocalLog
    _producer_state: ProducerStateTable
    _opening: bool
    _leader_epochs: LeaderEpochCache
    _lock: threading.Lock
    _unflushed_records: int
    _closed: bool

    if TYPE_CHECKING:
        # PartitionLog's and ReplicationCalls', used here.
        @property
        def log_end_offset(self) -> int: ...

        @property
        def high_watermark(self) -> int: ...

        def _maybe_roll_locked(
            self,
            incoming_bytes: int,
            first_offset: int,
            last_offset: int,
            max_timestamp: int,
            config: LogConfig,
        ) -> Segment: ...

        def _assign_epoch_locked(
            self, epoch: int, start_offset: int, *, sync: bool = True
        ) -> None: ...

        def _rewrite_stale_epochs_locked(self) -> None: ...

    def start_verification(
        self, producer_id: int, epoch: int, *, epoch_bump: bool = False
    ) -> VerificationGuard | None:
        """Before the coordinator is asked about a transactional batch of ``producer_id``:
        its guard, or None if its transaction is open here (``storage.producer_state``).

        Raises:
            InvalidProducerEpochError: ``epoch`` is older than the producer's here.
            StorageError: the log is closed.
        """
        with self._lock:
            if self._closed:
                raise StorageError(f"{self} is closed")
            return self._producer_state.start_verification(
                producer_id, epoch, epoch_bump=epoch_bump, now_ms=self._clock.wall_ms()
            )

    def append_marker(
        self,
        producer_id: int,
        epoch: int,
        commit: bool,
        coordinator_epoch: int,
        *,
        leader_epoch: int | None = None,
    ) -> int:
        """Append a COMMIT (``commit``) or ABORT marker for ``producer_id``; its offset.

        The leader's side of WriteTxnMarkers (``storage.control`` has the batch layout).
        It ends the producer's open transaction here, if any; an ABORT then gets an entry
        in the active segment's ``.txnindex``. A producer with no open transaction gets
        the marker stored and nothing else (``storage.partition_txns``).

        Raises:
            InvalidProducerEpochError: ``epoch`` is older than the producer's.
            TransactionCoordinatorFencedError: ``coordinator_epoch`` is older than the
                last one that wrote this producer a marker here.
            FencedLeaderEpochError: ``leader_epoch`` is older than the log's newest epoch.
            LogDirFullError, StorageError: the write failed; nothing was stored.
        """
        with self._lock:
            if self._closed:
                raise StorageError(f"{self} is closed")
            if leader_epoch is not None and leader_epoch < self._leader_epochs.latest_epoch:
                raise FencedLeaderEpochError(
                    f"{self}: leader epoch {leader_epoch} is older than this log's "
                    f"{self._leader_epochs.latest_epoch}; no marker appended"
                )
            self._producer_state.check_marker(producer_id, epoch, coordinator_epoch)
            offset = self.log_end_offset
            now_ms = self._clock.wall_ms()
            batch = build_marker(
                producer_id,
                epoch,
                commit=commit,
                coordinator_epoch=coordinator_epoch,
                timestamp_ms=now_ms,
                base_offset=offset,
                partition_leader_epoch=-1 if leader_epoch is None else leader_epoch,
            )
            header = read_header(batch)
            try:
                self._rewrite_stale_epochs_locked()
                if leader_epoch is not None and leader_epoch > self._leader_epochs.latest_epoch:
                    self._assign_epoch_locked(leader_epoch, offset)
                segment = self._maybe_roll_locked(
                    len(batch), offset, offset, now_ms, self._local.config
                )
                segment.append(batch, [BatchPosition(0, header)], None)
            except OSError as exc:
                raise io_error(exc, f"{self}: marker append failed") from exc
            apply_marker(
                self._producer_state, segment, header, EndTxnMarker(commit, coordinator_epoch)
            )
            self._unflushed_records += 1
            return offset

    @property
    def last_stable_offset(self) -> int:
        """Below it every transaction is decided: min(first unstable offset, high
        watermark); the high watermark when no transaction is open or unreplicated.

        Lock-free while the partition holds no undecided transaction (the fetch path
        must not wait behind an append's fsync, ``tests/broker/test_slow_disk.py``): the
        high watermark is read first, then whether a transaction is open or being opened
        (``_opening``, set under the lock before transactional bytes are published and
        cleared after the producer state has them). Whoever reads a high watermark that
        includes such bytes therefore sees the transaction, and takes the lock."""
        high_watermark = self.high_watermark
        if not self._opening and not self._producer_state.has_undecided():
            return high_watermark
        with self._lock:
            return last_stable_offset(
                self._producer_state, self.high_watermark, self._local.log_start_offset
            )

    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[tuple[int, int]]:
        """``(producer_id, first_offset)`` of the aborted transactions a read_committed
        fetch of ``[fetch_offset, upper_bound)`` reports (Kafka's rule, in
        ``storage.partition_txns.collect_aborted``), oldest marker first."""
        with self._lock:
            segments = self._local.segments
            found = collect_aborted(segments, fetch_offset, upper_bound)
        return [(t.producer_id, t.first_offset) for t in found]
