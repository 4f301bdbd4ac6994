"""Opening a partition directory and recovering it after a crash (Kafka's ``LogLoader``).

This module owns the classmethod-factory side of a partition log: everything
``PartitionLog.open`` does before the log takes appends. ``load_log`` turns a directory into
a ``LoadedLog`` value (its segments, log start offset, leader epochs and clamped high
watermark); ``rebuild_producer_state`` rebuilds the producer table (idempotence and transactions)
from the newest usable ``.snapshot`` plus the batches after it (``truncate_to`` calls it
again), and the ``.txnindex`` of the segments recovery revalidated.

Recovery, in order:

1. ``clean_directory``: remove ``.deleted`` and ``.tmp`` leftovers; discard a compaction
   swap interrupted while renaming ``.cleaned`` -> ``.swap``, finish one interrupted later
   (old segments covered by the ``.swap`` range unlinked, ``.swap`` stripped); drop stray
   index ``.swap`` files and index files without a ``.log``.
2. Open every segment; validate every batch from the segment holding the recovery point to
   the end (unless the stop was clean), cut at the first invalid byte and delete every
   later segment, so the log stays a prefix of what was written. Missing or damaged index
   files are rebuilt by ``Segment.open``.
3. An empty (or wholly cut) log gets one empty segment at the log start offset.
4. The leader-epoch checkpoint is read and cut to ``[log start, log end)`` in memory.
   After an unclean stop, the epochs past the recovery point are taken from the batches
   themselves (each replicated batch carries the epoch of the leader that wrote it): the
   checkpoint is fsynced when an epoch begins, the batches it describes may not have
   been, and a log that lost them (or got back an older tail a lost truncation had cut)
   must not claim an epoch its batches do not hold.

Crash consistency: every rename finishing a swap happens before one fsync of the
directory; a new empty segment is followed by an fsync of the directory before the log is
returned. Unlinks (leftovers, segments after a cut) are not followed by a directory fsync
here: ``.deleted``, ``.tmp``, ``.cleaned`` and stray index files are garbage by name, and
the next ``load_log`` removes them again if a crash brings them back. What recovery
validated is made durable by the caller (``PartitionLog.open`` flushes after an unclean
stop, which moves the recovery point to the log end).

Thread-safety: plain functions, not thread-safe. ``load_log`` and ``clean_directory`` run on
a directory no other thread uses yet; ``rebuild_producer_state`` runs either there or under
the owning ``PartitionLog``'s lock (``truncate_to``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tidelog.storage.batch_times import BATCH_TIMES_SUFFIX
from tidelog.storage.clock import Clock
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import StorageError
from tidelog.storage.files import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TMP_SUFFIX,
    base_offset_from_name,
    fsync_dir,
    make_dir_durable,
    offset_file_name,
)
from tidelog.storage.leader_epoch import LEADER_EPOCH_CHECKPOINT, LeaderEpochCache
from tidelog.storage.local_log import unlink_if_exists
from tidelog.storage.partition_txns import replay
from tidelog.storage.producer_state import ProducerStateTable
from tidelog.storage.segment import Segment
from tidelog.storage.txn_index import TXN_INDEX_SUFFIX

__all__ = [
    "SNAPSHOT_SUFFIX",
    "LoadedLog",
    "clean_directory",
    "load_log",
    "rebuild_producer_state",
]

log = logging.getLogger(__name__)

# Producer-state snapshots: ``<20-digit offset>.snapshot``, the offset being the log end
# the snapshot covers (exclusive). Written by ``PartitionLog`` on roll and close.
SNAPSHOT_SUFFIX = ".snapshot"
# Recovery must not judge stored batches by today's max.message.bytes: the limit can be
# lowered after they were accepted. Framing, the file's size and the CRC decide validity.
_RECOVERY_MAX_BATCH_BYTES = 2**31 - 1


@dataclass(frozen=True, slots=True)
class LoadedLog:
    """What ``load_log`` found: the state a ``PartitionLog`` is constructed from.

    ``recovery_point``: what the constructor gets (the checkpointed point, capped at the
    log end, after a clean stop; 0 after an unclean one, until the caller's flush).
    ``high_watermark``: the checkpoint clamped to ``[log start, log end]``, or None.
    """

    segments: list[Segment]
    log_start_offset: int
    log_end_offset: int
    recovery_point: int
    leader_epochs: LeaderEpochCache
    high_watermark: int | None


def load_log(
    directory: Path,
    config: LogConfig,
    clock: Clock,
    *,
    log_start_offset: int,
    recovery_point: int,
    had_clean_shutdown: bool,
    high_watermark: int | None,
) -> LoadedLog:
    """Open (creating if needed) and, after an unclean stop, recover a partition directory.

    Recovery validates every batch from the segment holding ``recovery_point`` to the
    end, truncates at the first invalid byte and drops every later segment; segments whose
    index files are missing or damaged get them rebuilt. Interrupted compaction swaps are
    finished or discarded. The returned segments are open; nothing else holds them.

    Raises:
        StorageError: the directory is unusable.
        OSError: opening, recovering or creating a segment failed.
    """
    try:
        make_dir_durable(directory)  # its name, not only its files, before any ack
        bases = clean_directory(directory, config)
    except OSError as exc:
        raise StorageError(f"cannot open log directory {directory}: {exc}") from exc
    segments: list[Segment] = []
    truncated_at: int | None = None
    for base in bases:
        if truncated_at is not None:
            log.warning("%s: deleting segment %d after a truncated one", directory, base)
            for path in Segment.paths(directory, base):
                unlink_if_exists(path)
            continue
        # Recover from the segment holding the recovery point to the end.
        recover = not had_clean_shutdown and _next_base(bases, base) > recovery_point
        segment, truncated = Segment.open(
            directory,
            base,
            index_interval_bytes=config.index_interval_bytes,
            index_max_bytes=config.segment_index_bytes,
            max_message_bytes=_RECOVERY_MAX_BATCH_BYTES,
            recover=recover,
            # Without compaction offsets have no gaps; above the recovery point
            # (written in this configuration, not yet durable) a gap is damage.
            contiguous_from=None if config.compact else recovery_point,
        )
        segments.append(segment)
        if truncated:
            log.warning("%s: recovery cut %d bytes from segment %d", directory, truncated, base)
            truncated_at = base
        elif (
            recover
            and not config.compact
            and base != bases[-1]
            and recovery_point <= segment.next_offset < _next_base(bases, base)
        ):
            # The crash took whole batches off the end of a sealed segment (its size
            # was not durable yet): nothing to cut, but a hole before the next segment.
            # Without compaction, whose holes are legitimate, that is lost data, and
            # what follows it must go too, so the log stays a prefix of what was written.
            log.warning(
                "%s: segment %d ends at %d, below the next segment: batches were lost",
                directory,
                base,
                segment.next_offset,
            )
            truncated_at = base
    now_ms = clock.wall_ms()
    # An empty segment in the middle (e.g. compaction emptied it) is fine; an empty log
    # needs one segment to append to.
    log_end = segments[-1].next_offset if segments else log_start_offset
    if segments:
        log_start_offset = max(log_start_offset, segments[0].base_offset)
    if log_end < log_start_offset:
        for segment in segments:
            segment.delete_files()
        segments = []
    if not segments:
        segments.append(
            Segment.create(
                directory,
                log_start_offset,
                index_interval_bytes=config.index_interval_bytes,
                index_max_bytes=config.segment_index_bytes,
                now_ms=now_ms,
            )
        )
        fsync_dir(directory)
    log_end = segments[-1].next_offset
    epochs = LeaderEpochCache.read(directory)
    if epochs is None:
        epochs = LeaderEpochCache()
        if (directory / LEADER_EPOCH_CHECKPOINT).exists():
            # There but unreadable: an OS crash after an unsynced write (a new leader's,
            # made durable by one flush for a whole view, ``begin_leader_epoch``). The
            # batches hold every epoch that wrote a record.
            log.warning(
                "%s: unreadable leader-epoch checkpoint; rebuilt from the batches", directory
            )
            _epochs_from_batches(epochs, segments, 0)
    elif not had_clean_shutdown:
        _epochs_from_batches(epochs, segments, recovery_point)
    epochs.truncate_from_end(log_end)
    epochs.truncate_from_start(log_start_offset)
    if high_watermark is not None:
        high_watermark = min(max(high_watermark, log_start_offset), log_end)
    return LoadedLog(
        segments,
        log_start_offset=log_start_offset,
        log_end_offset=log_end,
        recovery_point=min(recovery_point, log_end) if had_clean_shutdown else 0,
        leader_epochs=epochs,
        high_watermark=high_watermark,
    )


def clean_directory(directory: Path, config: LogConfig) -> list[int]:
    """Remove leftovers, finish or discard interrupted swaps; return segment bases, sorted.

    Follows Kafka's swap protocol (see ``storage.local_log``): a ``.cleaned`` file means
    the crash came while renaming ``.cleaned`` -> ``.swap``, so the swap is discarded; only
    ``.swap`` files mean every new segment was complete, so the swap is finished. Raises
    ``OSError``.
    """
    names = os.listdir(directory)
    for name in names:
        if name.endswith((DELETED_SUFFIX, TMP_SUFFIX)):
            unlink_if_exists(directory / name)
    names = os.listdir(directory)
    cleaned = [n for n in names if n.endswith(CLEANED_SUFFIX)]
    swaps = sorted(base_offset_from_name(n) for n in names if n.endswith(LOG_SUFFIX + SWAP_SUFFIX))
    if cleaned:
        # A crash while renaming .cleaned -> .swap: the swap is incomplete; discard it
        # (those .swap files whose offset is >= the smallest .cleaned, and the .cleaned).
        smallest = min(base_offset_from_name(n) for n in cleaned)
        for name in cleaned:
            unlink_if_exists(directory / name)
        for base in [b for b in swaps if b >= smallest]:
            for path in Segment.paths(directory, base, SWAP_SUFFIX):
                unlink_if_exists(path)
        swaps = [b for b in swaps if b < smallest]
    if swaps:
        # Every .swap is complete: finish the swap. The replaced range runs from the
        # smallest swap base to the largest swap segment's next offset.
        swap_end = 0
        for base in swaps:
            segment, _ = Segment.open(
                directory,
                base,
                index_interval_bytes=config.index_interval_bytes,
                index_max_bytes=config.segment_index_bytes,
                max_message_bytes=_RECOVERY_MAX_BATCH_BYTES,
                recover=True,
                suffix=SWAP_SUFFIX,
            )
            swap_end = max(swap_end, segment.next_offset)
            segment.close()
        names = os.listdir(directory)
        for name in names:
            if name.endswith(LOG_SUFFIX) and swaps[0] <= base_offset_from_name(name) < swap_end:
                for path in Segment.paths(directory, base_offset_from_name(name)):
                    unlink_if_exists(path)
        for base in swaps:
            for swap_path, final in zip(
                Segment.paths(directory, base, SWAP_SUFFIX),
                Segment.paths(directory, base),
                strict=True,
            ):
                if swap_path.exists():
                    os.replace(swap_path, final)
        fsync_dir(directory)
    # A crash while stripping .swap from one segment's four files leaves its index
    # .swap files behind its final .log; no .log.swap names them, so nothing above
    # does. The log is final and missing indexes are rebuilt, so they can go.
    for name in os.listdir(directory):
        if name.endswith(SWAP_SUFFIX):
            unlink_if_exists(directory / name)
    names = os.listdir(directory)
    bases = sorted(base_offset_from_name(n) for n in names if n.endswith(LOG_SUFFIX))
    # Index files without a log are stale.
    known = {offset_file_name(b, "") for b in bases}
    for name in names:
        if (
            name.endswith((".index", ".timeindex", BATCH_TIMES_SUFFIX, TXN_INDEX_SUFFIX))
            and name.split(".", 1)[0] not in known
        ):
            unlink_if_exists(directory / name)
    return bases


def _epochs_from_batches(
    epochs: LeaderEpochCache, segments: list[Segment], recovery_point: int
) -> None:
    """Replace the epochs starting at or past ``recovery_point`` (not known durable) with
    those the batch headers after it name."""
    epochs.truncate_from_end(recovery_point)
    for segment in segments:
        if segment.next_offset <= recovery_point:
            continue
        for batch in segment.iter_batches():
            header = batch.header
            if header.last_offset < recovery_point or header.partition_leader_epoch < 0:
                continue
            epochs.assign(header.partition_leader_epoch, header.base_offset)


def rebuild_producer_state(
    directory: Path, segments: list[Segment], log_end: int, owner: object
) -> ProducerStateTable:
    """The producer table: newest usable snapshot, plus the batches after it.

    Snapshots above ``log_end`` (covering data recovery or truncation cut off) are
    unlinked; unreadable ones are skipped with a warning naming ``owner``. Only headers
    are read, and each control batch's one record (``storage.partition_txns.replay``).

    Segments whose ``.txnindex`` needs a rebuild (recovered after an unclean stop, or
    damaged) get it rebuilt, with every later segment's, by a second replay from a
    snapshot at or below the first of them (or from the first segment), so that the
    transactions open there are known. The table returned still comes from the newest
    snapshot: it may remember producers whose batches retention has deleted since,
    which an older snapshot would not. Not thread-safe: the caller holds the partition
    lock (or owns the log alone).
    """
    rebuild = [s.base_offset for s in segments if s.txn_index.needs_rebuild]
    index_from = min(rebuild) if rebuild else None
    for offset, path in _snapshots(directory):
        if offset > log_end:
            unlink_if_exists(path)  # covers data that recovery cut off
    table, start = _newest_snapshot(directory, log_end, owner, segments[0].base_offset)
    if index_from is not None and start > index_from:
        scratch, scratch_start = _newest_snapshot(
            directory, index_from, owner, segments[0].base_offset
        )
        replay(scratch, segments, scratch_start, index_from=index_from, owner=owner)
        index_from = None
    replay(table, segments, start, index_from=index_from, owner=owner)
    return table


def _snapshots(directory: Path) -> list[tuple[int, Path]]:
    return sorted((base_offset_from_name(p.name), p) for p in directory.glob("*" + SNAPSHOT_SUFFIX))


def _newest_snapshot(
    directory: Path, limit: int, owner: object, first_base: int
) -> tuple[ProducerStateTable, int]:
    """The newest readable snapshot at or below ``limit`` and its offset; an empty table
    from ``first_base`` when there is none."""
    for offset, path in reversed(_snapshots(directory)):
        if offset > limit:
            continue
        try:
            return ProducerStateTable.from_bytes(path.read_bytes())
        except (OSError, ValueError) as exc:
            log.warning("%s: ignoring producer snapshot %s: %s", owner, path, exc)
    return ProducerStateTable(), first_base


def _next_base(bases: list[int], base: int) -> int:
    i = bases.index(base)
    return bases[i + 1] if i + 1 < len(bases) else 2**63 - 1
