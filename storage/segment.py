"""One segment: a ``.log`` file of whole record batches, its two sparse indexes, the
``.batchtimes`` sidecar (``storage.batch_times``: each batch's sent and received times) and
the ``.txnindex`` of its aborted transactions (``storage.txn_index``, created lazily).

A segment holds the batches whose offsets start at ``base_offset`` (the number in its file
names) and end before the next segment's base offset. Batches are appended whole; the
indexes get an entry whenever more than ``index.interval.bytes`` were appended since the
last one (see ``storage.index`` for what an entry means).

The in-memory state that is not in the files (``next_offset``, ``max_timestamp_ms``, the
bytes since the last index entry) is derived on ``open`` by scanning the batch headers after
the last index entry: at most about ``index.interval.bytes`` of log, so opening a clean
segment costs no full scan. ``recover`` rescans the whole file, validating every batch.

Not thread-safe: ``PartitionLog`` holds its lock around every mutating call. Reads
(``read``, ``find_position``) use ``os.pread`` and may run concurrently with an append,
without a lock, provided the caller bounds them by a ``size_bytes`` it read first: an
append sets ``size_bytes`` last, after the batches, their index entries and their times.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.storage.batch_times import (
    BATCH_TIMES_SUFFIX,
    BatchTimes,
    BatchTimesEntry,
    BatchTimesFile,
)
from tidelog.storage.errors import CorruptRecordError, LogDirFullError, StorageError
from tidelog.storage.file_region import FileRegion
from tidelog.storage.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, offset_file_name
from tidelog.storage.index import (
    OFFSET_ENTRY_BYTES,
    TIME_ENTRY_BYTES,
    CorruptIndexError,
    OffsetIndex,
    TimeIndex,
)
from tidelog.storage.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    NO_TIMESTAMP,
    BatchHeader,
    decode_batch,
    read_header,
    split_whole_batches,
    validate_batch,
)
from tidelog.storage.txn_index import TXN_INDEX_SUFFIX, TransactionIndex

__all__ = ["BatchPosition", "Segment"]

log = logging.getLogger(__name__)

# How much to read at a time when walking batch headers through a file.
_SCAN_CHUNK_BYTES = 64 * 1024
# Pieces per writev call (the kernel's limit, IOV_MAX, is 1024 on Linux).
_IOV_MAX = 1024
# Batch headers a read walks to size its answer exactly before falling back to a cut.
_EXACT_READ_HEADERS = 4
# baseOffset, batchLength, partitionLeaderEpoch, magic: enough to step over a batch.
_FRAMING = struct.Struct(">qiib")
# A whole batch header as a region walks it: framing, lastOffsetDelta, recordsCount.
_REGION_HEAD = struct.Struct(">qiib4x2xi8x8x8x2x4xi")


@dataclass(frozen=True, slots=True)
class BatchPosition:
    """Where a batch starts in a segment's log, and its header."""

    position: int
    header: BatchHeader


class Segment:
    """One ``.log`` file and its ``.index``/``.timeindex``. Not thread-safe."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        fd: int,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        batch_times: BatchTimesFile,
        *,
        suffix: str = "",
        index_interval_bytes: int,
        created_ms: int,
        txn_index: TransactionIndex | None = None,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.suffix = suffix
        self.offset_index = offset_index
        self.time_index = time_index
        self.batch_times = batch_times
        # Entries are added by the partition (``storage.partition_txns``), not by append.
        self.txn_index = txn_index or TransactionIndex(
            self.paths(directory, base_offset, suffix)[4], base_offset
        )
        self.index_interval_bytes = index_interval_bytes
        self.created_ms = created_ms
        self._fd = fd
        self.size_bytes = 0
        self.next_offset = base_offset
        self.max_timestamp_ms = NO_TIMESTAMP
        self.first_batch_timestamp_ms = NO_TIMESTAMP
        self.bytes_since_last_index_entry = 0
        self.deleted = False
        # Why appends are refused, once a failed append could not be undone.
        self._unusable: str | None = None

    # ------------------------------------------------------------------ factories

    @staticmethod
    def paths(
        directory: Path, base_offset: int, suffix: str = ""
    ) -> tuple[Path, Path, Path, Path, Path]:
        """The ``.log``, ``.index``, ``.timeindex``, ``.batchtimes`` and ``.txnindex`` paths
        (each with ``suffix`` appended)."""
        return (
            directory / (offset_file_name(base_offset, LOG_SUFFIX) + suffix),
            directory / (offset_file_name(base_offset, INDEX_SUFFIX) + suffix),
            directory / (offset_file_name(base_offset, TIME_INDEX_SUFFIX) + suffix),
            directory / (offset_file_name(base_offset, BATCH_TIMES_SUFFIX) + suffix),
            directory / (offset_file_name(base_offset, TXN_INDEX_SUFFIX) + suffix),
        )

    @classmethod
    def create(
        cls,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        index_max_bytes: int,
        now_ms: int,
        suffix: str = "",
    ) -> Segment:
        """Create an empty segment (truncating any stale files of the same name; a stale
        ``.txnindex`` is removed: the new one is created by its first entry)."""
        log_path, index_path, time_path, times_path, txn_path = cls.paths(
            directory, base_offset, suffix
        )
        fd = _open_log(log_path, truncate=True)
        txn_path.unlink(missing_ok=True)
        batch_times = BatchTimesFile.create(times_path)
        offset_index = OffsetIndex(index_path, base_offset, index_max_bytes // OFFSET_ENTRY_BYTES)
        time_index = TimeIndex(time_path, base_offset, index_max_bytes // TIME_ENTRY_BYTES)
        offset_index.reset()
        time_index.reset()
        return cls(
            directory,
            base_offset,
            fd,
            offset_index,
            time_index,
            batch_times,
            suffix=suffix,
            index_interval_bytes=index_interval_bytes,
            created_ms=now_ms,
        )

    @classmethod
    def open(
        cls,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        index_max_bytes: int,
        max_message_bytes: int,
        recover: bool,
        suffix: str = "",
        contiguous_from: int | None = None,
    ) -> tuple[Segment, int]:
        """Open an existing segment; returns it and the number of bytes recovery cut off.

        With ``recover`` (an unclean stop), or when an index file is missing or fails its
        sanity check, every batch is validated and the indexes are rebuilt; the log is
        truncated at the first invalid byte. Otherwise only the tail after the last index
        entry is scanned. ``contiguous_from``: see ``recover``.
        """
        log_path, index_path, time_path, times_path, txn_path = cls.paths(
            directory, base_offset, suffix
        )
        fd = _open_log(log_path, truncate=False)
        size = os.fstat(fd).st_size
        created_ms = int(os.stat(log_path).st_mtime * 1000)
        offset_entries = index_max_bytes // OFFSET_ENTRY_BYTES
        time_entries = index_max_bytes // TIME_ENTRY_BYTES
        offset_index = OffsetIndex(index_path, base_offset, offset_entries)
        time_index = TimeIndex(time_path, base_offset, time_entries)
        trust_indexes = not recover and index_path.exists() and time_path.exists()
        if trust_indexes:
            try:
                offset_index = OffsetIndex.open(index_path, base_offset, offset_entries, size)
                time_index = TimeIndex.open(time_path, base_offset, time_entries, 2**63 - 1)
            except CorruptIndexError as exc:
                log.warning("segment %s: %s; rebuilding its indexes", log_path, exc)
                trust_indexes = False
        segment = cls(
            directory,
            base_offset,
            fd,
            offset_index,
            time_index,
            # Replaced below, once the log's valid size and next offset are known.
            BatchTimesFile(times_path, []),
            suffix=suffix,
            index_interval_bytes=index_interval_bytes,
            created_ms=created_ms,
        )
        segment.size_bytes = size
        truncated = 0
        try:
            segment.txn_index = TransactionIndex.open(txn_path, base_offset)
            if trust_indexes:
                try:
                    segment._load_tail()
                except (CorruptIndexError, CorruptRecordError) as exc:
                    log.warning("segment %s: %s; rebuilding its indexes", log_path, exc)
                    trust_indexes = False
            if not trust_indexes:
                # recover() resets both indexes before rebuilding them from the log.
                truncated = segment.recover(max_message_bytes, contiguous_from=contiguous_from)
                # Its aborted transactions are rebuilt from the log with the producer
                # state, which a segment alone does not have (``storage.log_loader``).
                segment.txn_index.needs_rebuild = True
            # Entries past the (recovered) log are cut; a missing file is an empty one.
            segment.batch_times = BatchTimesFile.open(
                times_path, log_size=segment.size_bytes, next_offset=segment.next_offset
            )
        except BaseException:
            segment.close()
            raise
        return segment, truncated

    # ------------------------------------------------------------------ state

    @property
    def is_empty(self) -> bool:
        return self.size_bytes == 0

    @property
    def log_path(self) -> Path:
        return self.paths(self.directory, self.base_offset, self.suffix)[0]

    def _load_tail(self) -> None:
        """Derive in-memory state from the last index entries plus a scan of the tail.

        The last time index entry covers every batch up to the last offset index entry's
        batch; the scan covers the rest (about ``index.interval.bytes``).
        """
        _, position = self.offset_index.last_entry()
        entry = self.time_index.last_entry()
        self.max_timestamp_ms = NO_TIMESTAMP if entry is None else entry[0]
        self.first_batch_timestamp_ms = (
            self._header_at(0).max_timestamp if self.size_bytes else NO_TIMESTAMP
        )
        self.next_offset = self.base_offset
        self.bytes_since_last_index_entry = 0
        for batch in self.iter_batches(position):
            self.next_offset = batch.header.next_offset
            self.max_timestamp_ms = max(self.max_timestamp_ms, batch.header.max_timestamp)
            self.bytes_since_last_index_entry += batch.header.size_bytes
        if entry is not None and entry[1] >= self.next_offset:
            raise CorruptIndexError("the time index points past the last batch")

    def _header_at(self, position: int) -> BatchHeader:
        data = os.pread(self._fd, HEADER_SIZE, position)
        return read_header(data, 0, whole=False)

    def iter_batches(
        self, start_position: int = 0, *, validate: bool = False
    ) -> Iterator[BatchPosition]:
        """Yield ``BatchPosition`` for each whole batch from ``start_position`` to the end.

        With ``validate`` every batch's CRC is checked (reading the whole batch); otherwise
        only headers are read. Raises ``CorruptRecordError`` at a bad or partial batch.
        """
        position = start_position
        end = self.size_bytes
        while position < end:
            if validate:
                head = os.pread(self._fd, LOG_OVERHEAD, position)
                if len(head) < LOG_OVERHEAD:
                    raise CorruptRecordError(f"partial batch header at position {position}")
                length = int.from_bytes(head[8:12], "big", signed=True)
                size = LOG_OVERHEAD + length
                if length < HEADER_SIZE - LOG_OVERHEAD or position + size > end:
                    raise CorruptRecordError(
                        f"batch at position {position} has an impossible length {length}"
                    )
                data = os.pread(self._fd, size, position)
                header = validate_batch(data, 0)
            else:
                header = self._header_at(position)
                if position + header.size_bytes > end:
                    raise CorruptRecordError(f"batch at position {position} runs past the end")
            yield BatchPosition(position, header)
            position += header.size_bytes

    # ------------------------------------------------------------------ writes

    def append(
        self,
        data: bytes | bytearray | Sequence[bytes | bytearray | memoryview],
        batches: list[BatchPosition],
        times: BatchTimes | Sequence[BatchTimes] | None = None,
    ) -> None:
        """Append whole, already validated batches with assigned offsets.

        ``data`` is the bytes, or a list of consecutive pieces of them (written with one
        ``writev``, so a caller need not copy a large request to patch a few bytes).
        ``batches`` gives each batch's position within ``data`` and its header. ``times``:
        the sent/received times of every batch (one value for all, or one per batch),
        written to the ``.batchtimes`` sidecar; None writes no entries (times unknown).

        All or nothing: when this raises, nothing of the append is visible and both files
        are cut back to their old sizes, so the caller (which advances the producer state
        only after a successful append) can let the producer retry without storing the
        batch twice. The sidecar entries go first: until the batches land they name
        positions past the log's end, which readers never ask for and recovery cuts
        (``batch_times.valid_prefix``); nothing in memory (indexes, next offset, size)
        changes before the batches are written whole. Issue #29: the opposite order left
        the batches published when the sidecar write hit ENOSPC after them, the append
        raised, and every idempotent retry was stored again. A cut-back that itself fails
        leaves the segment refusing appends (``StorageError``) rather than writing after
        bytes it disowned.

        Raises:
            LogDirFullError: the disk is full.
            StorageError: any other I/O failure, or the segment is unusable after one.
        """
        if self._unusable is not None:
            raise StorageError(f"segment {self.log_path} refuses appends: {self._unusable}")
        start = self.size_bytes
        if times is not None and batches:
            if isinstance(times, BatchTimes):
                times = [times] * len(batches)
            # Cuts itself back on failure (LogDirFullError, StorageError): nothing written.
            self.batch_times.append(
                [
                    BatchTimesEntry(
                        b.header.last_offset, start + b.position, t.sent_ms, t.received_ms
                    )
                    for b, t in zip(batches, times, strict=True)
                ]
            )
        try:
            written = _write_all(self._fd, data)
        except OSError as exc:
            self._cut_back(start)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise LogDirFullError(f"no space left appending to {self.log_path}") from exc
            raise StorageError(f"cannot append to {self.log_path}: {exc}") from exc
        for batch in batches:
            header = batch.header
            if start + batch.position == 0:
                self.first_batch_timestamp_ms = header.max_timestamp
            self._index_batch(start + batch.position, header)
        # Published last: a lock-free reader bounded by size_bytes finds the batches'
        # index entries and times already there; and the next offset (a single node's
        # high watermark) only after the bytes, so no reader sees a new end before it
        # can read up to it (a fetch that did parked as if it had read the records, and
        # slept to its deadline: a 500 ms end-to-end p99.9).
        self.size_bytes = start + written
        if batches:
            self.next_offset = batches[-1].header.next_offset

    def _cut_back(self, size_bytes: int) -> None:
        """Undo a failed append: the log and the sidecar back to a log of ``size_bytes``."""
        try:
            os.ftruncate(self._fd, size_bytes)
            self.batch_times.truncate_to_position(size_bytes)
        except OSError as exc:
            # O_APPEND would write the next batch after the disowned bytes, at a position
            # the indexes and the sidecar do not expect: refuse appends from now on.
            self._unusable = f"a failed append could not be cut back ({exc})"
            log.exception("segment %s: %s", self.log_path, self._unusable)

    def _index_batch(self, position: int, header: BatchHeader) -> None:
        # Kafka's rule: an entry when more than index.interval.bytes were appended since the
        # last one, counted before this batch. Position 0 never needs one (lookups fall
        # back to it).
        if header.max_timestamp > self.max_timestamp_ms:
            self.max_timestamp_ms = header.max_timestamp
        if self.bytes_since_last_index_entry > self.index_interval_bytes:
            self.offset_index.append(header.base_offset, position)
            self.time_index.maybe_append(self.max_timestamp_ms, header.base_offset)
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += header.size_bytes

    @property
    def index_is_full(self) -> bool:
        """Either index has no room for another entry: time to roll."""
        return self.offset_index.is_full or self.time_index.is_full

    def write_pending(self) -> None:
        """Hand buffered index entries to the OS (page cache)."""
        self.offset_index.write_pending()
        self.time_index.write_pending()

    def fsync(self, *, indexes: bool = True) -> None:
        """Make the log, the batch times, the aborted transactions and (``indexes``) both
        indexes durable. Call ``write_pending`` first (under lock).

        ``indexes`` False is the produce path's flush of the active segment (issue #31):
        its offset and time indexes are derived data, rebuilt from the log by recovery
        after an unclean stop (the active segment always holds or follows the recovery
        point, so ``storage.log_loader`` recovers it), and fsynced when the segment is
        sealed (``fsync_indexes`` at the roll) or the log closes cleanly. The batch times
        and the aborted-transaction index cannot be rebuilt from the log: always synced.
        """
        os.fsync(self._fd)
        if indexes:
            self.fsync_indexes()
        self.batch_times.fsync()
        self.txn_index.fsync()

    def fsync_indexes(self) -> None:
        """Make both indexes durable (a file with nothing written since its last fsync
        costs nothing). Call ``write_pending`` first (under lock)."""
        self.offset_index.fsync()
        self.time_index.fsync()

    def recover(self, max_message_bytes: int, *, contiguous_from: int | None = None) -> int:
        """Validate every batch, rebuild both indexes, cut the log at the first bad byte.

        Returns the number of bytes removed. A batch is invalid if its framing or CRC is
        bad, it is larger than ``max_message_bytes`` (with slack for the header), or its
        offsets go backwards. With ``contiguous_from`` (a log without compaction, whose
        offsets have no gaps), a batch that does not start where the one before it ended,
        from that offset on, is invalid too: its base offset lies outside the CRC, so only
        this catches damage confined to those 8 bytes.
        """
        self.offset_index.reset()
        self.time_index.reset()
        self.next_offset = self.base_offset
        self.max_timestamp_ms = NO_TIMESTAMP
        self.first_batch_timestamp_ms = NO_TIMESTAMP
        self.bytes_since_last_index_entry = 0
        valid_end = 0
        try:
            for batch in self.iter_batches(0, validate=True):
                header = batch.header
                if header.size_bytes > max_message_bytes + HEADER_SIZE:
                    raise CorruptRecordError(f"batch at {batch.position} is impossibly large")
                if header.base_offset < self.next_offset:
                    raise CorruptRecordError(
                        f"offset {header.base_offset} at position {batch.position} goes back"
                    )
                if (
                    contiguous_from is not None
                    and self.next_offset >= contiguous_from
                    and header.base_offset != self.next_offset
                ):
                    raise CorruptRecordError(
                        f"offset {header.base_offset} at position {batch.position} does not "
                        f"follow {self.next_offset}"
                    )
                if header.last_offset - self.base_offset > 2**31 - 1:
                    raise CorruptRecordError("offset does not fit the segment's index")
                if batch.position == 0:
                    self.first_batch_timestamp_ms = header.max_timestamp
                self._index_batch(batch.position, header)
                self.next_offset = header.next_offset
                valid_end = batch.position + header.size_bytes
        except CorruptRecordError as exc:
            log.warning(
                "segment %s: invalid data at position %d of %d (%s); truncating",
                self.log_path,
                valid_end,
                self.size_bytes,
                exc,
            )
        truncated = self.size_bytes - valid_end
        if truncated:
            os.ftruncate(self._fd, valid_end)
            self.size_bytes = valid_end
        self.write_pending()
        return truncated

    def truncate_to(self, offset: int) -> int:
        """Remove every batch holding an offset >= ``offset``; returns bytes removed.

        Truncation is at batch granularity, as Kafka's ``LogSegment.truncateTo``: a batch
        that straddles ``offset`` goes whole, so the segment ends at or below ``offset``
        (a follower cutting a diverged log must keep nothing at or past the cut).
        """
        if offset >= self.next_offset:
            return 0
        _, start = self.offset_index.lookup(offset)
        cut = next((b for b in self.iter_batches(start) if b.header.last_offset >= offset), None)
        if cut is None:
            return 0
        position = cut.position
        removed = self.size_bytes - position
        os.ftruncate(self._fd, position)
        self.size_bytes = position
        self.offset_index.truncate_to(cut.header.base_offset)
        self.time_index.truncate_to(cut.header.base_offset)
        self.batch_times.truncate_to_position(position)
        self.txn_index.truncate_to(cut.header.base_offset)
        self._load_tail()  # next offset, max timestamp, index counter from what remains
        return removed

    # ------------------------------------------------------------------ reads

    def find_position(self, offset: int, *, batch_start: bool = False) -> int | None:
        """Byte position of the first batch holding an offset >= ``offset``.

        With ``batch_start``, the first batch whose *base* offset is >= ``offset`` instead.
        None when no batch qualifies.
        """
        _, position = self.offset_index.lookup(offset)
        for batch in self.iter_batches(position):
            header = batch.header
            if batch_start:
                if header.base_offset >= offset:
                    return batch.position
            elif header.last_offset >= offset:
                return batch.position
        return None

    def read(self, offset: int, max_bytes: int, max_position: int | None = None) -> bytes:
        """Whole batches from the one holding ``offset``, up to ``max_bytes``.

        The first batch is returned whole even when larger than ``max_bytes``, so a reader
        always makes progress. ``max_position`` bounds the read (a ``size_bytes`` read earlier).
        """
        return self._read(offset, max_bytes, max_position)[1]

    def read_with_times(
        self, offset: int, max_bytes: int, max_position: int | None = None
    ) -> tuple[bytes, bytes]:
        """``read``, plus the wire entries (``storage.batch_times``) of the batches read."""
        position, data = self._read(offset, max_bytes, max_position)
        if not data:
            return data, b""
        return data, self.batch_times.wire_entries(position, position + len(data))

    def read_region(
        self, offset: int, max_bytes: int, max_position: int | None = None
    ) -> FileRegion | None:
        """Where ``read`` finds its bytes, as a ``FileRegion`` (``storage.file_region``),
        without reading them; None where ``read`` returns no bytes.

        The same batches as ``read``, byte for byte (the tests compare them): whole
        batches up to ``max_bytes``, the first whole even when larger, stopping at a batch
        whose framing is bad. It walks every batch header of the range (one ``pread`` of
        ``HEADER_SIZE`` each) for the region's end, its next offset and record count.
        """
        end = self.size_bytes if max_position is None else min(max_position, self.size_bytes)
        position = self.find_position(offset)
        if position is None or position >= end:
            return None
        limit = min(position + max_bytes, end)
        stop = position
        next_offset = -1
        records = 0
        while stop + HEADER_SIZE <= end:
            head = os.pread(self._fd, HEADER_SIZE, stop)
            if len(head) < HEADER_SIZE:
                break
            base, length, _, magic, last_delta, count = _REGION_HEAD.unpack(head)
            if magic != MAGIC or length < HEADER_SIZE - LOG_OVERHEAD:
                break
            size = LOG_OVERHEAD + length
            if stop + size > limit:
                if stop == position:  # the first batch alone exceeds max_bytes: whole
                    stop += min(size, end - position)
                    next_offset, records = base + last_delta + 1, count
                break
            stop += size
            next_offset = base + last_delta + 1
            records += count
        if stop == position:
            self._header_at(position)  # raises for the bad framing ``read`` raises for
            return None
        return FileRegion(self._fd, position, stop - position, next_offset, records)

    def _read(self, offset: int, max_bytes: int, max_position: int | None) -> tuple[int, bytes]:
        end = self.size_bytes if max_position is None else min(max_position, self.size_bytes)
        position = self.find_position(offset)
        if position is None or position >= end:
            return 0, b""
        return position, self._read_at(position, max_bytes, end)

    def _read_at(self, position: int, max_bytes: int, end: int) -> bytes:
        # Large batches: find where the whole batches within max_bytes end from a few
        # headers and read exactly that much. Reading max_bytes and then slicing off a
        # partial tail batch copies the whole answer a second time (a 1 MiB memcpy).
        limit = min(position + max_bytes, end)
        stop = position
        for _ in range(_EXACT_READ_HEADERS):
            if stop + HEADER_SIZE > limit:
                break
            _, length, _, magic = _FRAMING.unpack(os.pread(self._fd, _FRAMING.size, stop))
            if magic != MAGIC or length < HEADER_SIZE - LOG_OVERHEAD:
                break
            if stop + LOG_OVERHEAD + length > limit:
                break
            stop += LOG_OVERHEAD + length
        else:
            stop = -1  # many small batches: read max_bytes and cut below
        if stop == position:  # the first batch alone exceeds max_bytes: return it whole
            first = self._header_at(position)
            return os.pread(self._fd, min(first.size_bytes, end - position), position)
        if stop > position:
            return os.pread(self._fd, stop - position, position)
        data = os.pread(self._fd, min(max_bytes, end - position), position)
        whole = split_whole_batches(data)
        if whole == 0:
            first = self._header_at(position)
            return os.pread(self._fd, min(first.size_bytes, end - position), position)
        return data[:whole] if whole < len(data) else data

    def read_range(self, start_position: int, end_position: int) -> bytes:
        """Raw bytes between two positions (for the log cleaner and tools)."""
        return os.pread(self._fd, end_position - start_position, start_position)

    def offset_for_timestamp(
        self, timestamp_ms: int, min_offset: int = 0
    ) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record at or after ``min_offset`` (the log
        start, which may lie inside a batch) with a timestamp >= ``timestamp_ms``."""
        entry = self.time_index.lookup_before(timestamp_ms)
        start = self.base_offset if entry is None else entry[1]
        position = self.find_position(max(start, min_offset))
        if position is None:
            return None
        for batch in self.iter_batches(position):
            if batch.header.max_timestamp < timestamp_ms or batch.header.last_offset < min_offset:
                continue
            data = os.pread(self._fd, batch.header.size_bytes, batch.position)
            _, records = decode_batch(data, 0)
            for record in records:
                if record.offset >= min_offset and record.timestamp_ms >= timestamp_ms:
                    return record.offset, record.timestamp_ms
        return None

    def max_timestamp(self, min_offset: int, end_offset: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record with this segment's largest timestamp
        among the records at ``min_offset`` <= offset < ``end_offset``, or None."""
        position = self.find_position(min_offset)
        if position is None:
            return None
        best: tuple[int, int] | None = None  # (offset, timestamp)
        for batch in self.iter_batches(position):
            header = batch.header
            if header.base_offset >= end_offset:
                break
            if header.last_offset < min_offset or (
                best is not None and header.max_timestamp <= best[1]
            ):
                continue
            data = os.pread(self._fd, header.size_bytes, batch.position)
            _, records = decode_batch(data, 0)
            for record in records:
                if min_offset <= record.offset < end_offset and (
                    best is None or record.timestamp_ms > best[1]
                ):
                    best = (record.offset, record.timestamp_ms)
        return best

    # ------------------------------------------------------------------ files

    def rename_suffix(self, suffix: str) -> None:
        """Rename the five files to carry ``suffix`` (``""`` strips it)."""
        new_log, new_index, new_time, new_times, new_txn = self.paths(
            self.directory, self.base_offset, suffix
        )
        # The sidecar cannot be rebuilt from the log, unlike the indexes. Stripping a suffix
        # (a compaction swap's last step) renames it first: a crash midway leaves the
        # .log.swap that makes open() finish the swap, not a final .log whose leftover
        # .swap files are discarded. Adding one (.deleted, .swap) renames it last: a crash
        # leaves it beside a live log, not a live sidecar beside a doomed log.
        # The aborted-transaction index is rebuilt from the log only with the producer
        # state, after an unclean stop: it moves with the sidecar, for the same reasons.
        if not suffix:
            self.txn_index.rename(new_txn)
            self.batch_times.rename(new_times)
        os.replace(self.log_path, new_log)
        self.offset_index.rename(new_index)
        self.time_index.rename(new_time)
        if suffix:
            self.batch_times.rename(new_times)
            self.txn_index.rename(new_txn)
        self.suffix = suffix

    def close(self) -> None:
        """Write pending index entries and close every file."""
        if self._fd >= 0:
            self.offset_index.close()
            self.time_index.close()
            self.batch_times.close()
            self.txn_index.close()
            os.close(self._fd)
            self._fd = -1

    def delete_files(self) -> None:
        """Close and unlink the five files."""
        path = self.log_path
        self.close()
        self.offset_index.delete()
        self.time_index.delete()
        self.batch_times.delete()
        self.txn_index.delete()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return (
            f"Segment(base_offset={self.base_offset}, next_offset={self.next_offset}, "
            f"size_bytes={self.size_bytes}, suffix={self.suffix!r})"
        )


def _open_log(path: Path, *, truncate: bool) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND
    if truncate:
        flags |= os.O_TRUNC
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise LogDirFullError(f"no space left creating {path}") from exc
        raise StorageError(f"cannot open {path}: {exc}") from exc


def _write_all(fd: int, data: bytes | bytearray | Sequence[bytes | bytearray | memoryview]) -> int:
    """Write ``data`` (bytes, or pieces of it) whole, across short writes; returns its size."""
    if isinstance(data, bytes | bytearray | memoryview):
        parts = [memoryview(data)]
    else:
        parts = [memoryview(part) for part in data]
    total = sum(len(part) for part in parts)
    first = 0
    while first < len(parts):
        written = os.writev(fd, parts[first : first + _IOV_MAX])
        # Drop the pieces written whole; keep the unwritten rest of a piece cut short.
        while first < len(parts) and written >= len(parts[first]):
            written -= len(parts[first])
            first += 1
        if written:
            parts[first] = parts[first][written:]
    return total
