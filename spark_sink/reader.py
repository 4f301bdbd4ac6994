"""The executor side of reads: one offset range of one partition into Arrow batches.

``read_ranges`` runs inside a Spark task. It opens a ``Consumer`` (no group, nothing
committed, ``auto_offset_reset="none"`` so that a range below the log start is noticed
rather than silently reset), assigns the range's partition, seeks to its start and
yields the records with ``start <= offset < end`` as ``pyarrow.RecordBatch``es in the
source's schema (``schema.py``). Arrow rather than tuples: Spark takes Arrow batches
from a Python data source without converting row by row. The consumer decodes the
fetched batches straight into Arrow-layout columns (``Consumer.poll_columns``) when
the C extension is built, so no Python object is made per record; without it (no
compiler, ``TIDELOG_PURE_PYTHON=1``) it polls records and converts them, as before.

Edge cases:

- compaction leaves gaps, and so do transaction markers and (read_committed) aborted
  records: the consumer's position moves past a batch's last offset, so a range may
  hold fewer records than ``end - start`` (or none); reading stops at the first record
  at or past ``end`` or when the position reaches ``end`` (after a batch the position
  moves to the batch's last offset + 1, which compaction keeps even when it empties the
  batch);
- a partition that ends before the range does (log truncated by an unclean stop, topic
  recreated: the fetch answers ``OFFSET_OUT_OF_RANGE`` *above* the log end, or a poll
  finds nothing while the log end is at or below the position) is data loss too, and so
  is a partition that no longer exists (topic deleted while the query ran): without
  ``failOnDataLoss`` the rest of the range is skipped, never read from elsewhere (no
  record outside ``[start, end)`` is ever returned);
- retention deleted offsets the range needs (the fetch answers
  ``OFFSET_OUT_OF_RANGE``): with ``failOnDataLoss`` a ``DataLossError`` naming the
  partition, the offsets and the option; without, a warning and a skip to the log start
  (nothing at all if the log start is past the range). A partition the query found
  after it started (``from_log_start``) starts at the log start without a warning.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

import pyarrow as pa

from tidelog.client import (
    Consumer,
    OffsetOutOfRangeError,
    TidelogError,
    UnknownTopicOrPartitionError,
)
from tidelog.client.columns import NATIVE_COLUMNS, finish_columns, new_column_builder
from tidelog.client.types import ConsumerRecord, TopicPartition
from tidelog.spark_sink.offsets import OffsetRange
from tidelog.spark_sink.options import ReadOptions
from tidelog.spark_sink.schema import columns_to_arrow, records_to_arrow

__all__ = ["DataLossError", "read_ranges"]

log = logging.getLogger(__name__)

_ARROW_BATCH_ROWS = 8192
# Arrow binary columns have int32 offsets: hand a batch over long before 2 GiB of data.
_FLUSH_BYTES = 256 << 20
_POLL_MS = 200
_HINT = ". Set the option failOnDataLoss to false to skip them and go on."


class DataLossError(RuntimeError):
    """Offsets a query needs are gone (retention), and ``failOnDataLoss`` is true."""


def read_ranges(
    options: ReadOptions,
    ranges: Sequence[OffsetRange],
    timestamp_types: Sequence[int],
) -> Iterator[pa.RecordBatch]:
    """Yield the records of every range, in order, as Arrow batches.

    Raises ``DataLossError`` (see the module doc), or the client's error when the broker
    cannot be reached within ``requestTimeoutMs``.
    """
    for offset_range, timestamp_type in zip(ranges, timestamp_types, strict=True):
        if offset_range.size == 0:
            continue
        yield from _read_range(options, offset_range, timestamp_type)


def _read_range(
    options: ReadOptions, offset_range: OffsetRange, timestamp_type: int
) -> Iterator[pa.RecordBatch]:
    tp, end = offset_range.tp, offset_range.end
    consumer = Consumer(
        options.bootstrap_servers,
        client_id="tidelog-spark-reader",
        auto_offset_reset="none",
        enable_auto_commit=False,
        max_poll_records=_ARROW_BATCH_ROWS,
        max_partition_fetch_bytes=options.fetch_max_bytes,
        fetch_max_wait_ms=_POLL_MS,
        request_timeout_ms=options.request_timeout_ms,
        isolation_level=options.isolation_level,
        **options.security_settings,
    )
    rows = _new_rows(
        offset_range, timestamp_type, options.include_headers, options.use_corrected_timestamp
    )
    try:
        consumer.assign([tp])
        consumer.seek(tp, offset_range.start)
        idle_since = time.monotonic()
        progress = offset_range.start
        while True:
            try:
                added = rows.poll(consumer)
            except OffsetOutOfRangeError:
                start = _skip_ahead(consumer, options, offset_range, consumer.position(tp))
                if start >= end:
                    break
                consumer.seek(tp, start)
                continue
            last = rows.last_offset
            done = added > 0 and last is not None and last >= end
            if rows.rows >= _ARROW_BATCH_ROWS or rows.data_bytes >= _FLUSH_BYTES:
                batch = rows.flush()
                if batch.num_rows:
                    yield batch
            if done:
                break
            position = consumer.position(tp)
            if added or position > progress:
                # Progress: records, or (read_committed) aborted ones and markers passed.
                idle_since = time.monotonic()
                progress = position
            if position >= end:
                break
            highwater = consumer.highwater(tp)
            lost = None
            if not added and highwater is not None and position >= highwater:
                # The partition now ends before the range does: its log was truncated
                # (an unclean broker stop) or the topic recreated.
                lost = f"{tp} ends at {highwater}, before this micro-batch's end {end}"
            elif not added:
                # Nothing arrived: ask the broker whether the partition still exists and
                # still reaches the position (a deleted topic's fetches only ever retry).
                lost = _partition_lost(consumer, tp, position, end)
            if lost is not None:
                if options.fail_on_data_loss:
                    raise DataLossError(lost + _HINT)
                log.warning("%s; reading no further (failOnDataLoss=false)", lost)
                break
            if not added and time.monotonic() - idle_since > options.request_timeout_ms / 1000:
                raise TimeoutError(
                    f"{tp}: no records between offsets {position} and {end} arrived within "
                    f"{options.request_timeout_ms} ms (high watermark {highwater})"
                )
        if rows.rows:
            batch = rows.flush()
            if batch.num_rows:
                yield batch
    finally:
        consumer.close(autocommit=False)


class _Rows(Protocol):
    """What ``_read_range`` gathers between Arrow batches. Not thread-safe."""

    @property
    def rows(self) -> int: ...
    @property
    def data_bytes(self) -> int: ...
    @property
    def last_offset(self) -> int | None: ...
    def poll(self, consumer: Consumer) -> int: ...
    def flush(self) -> pa.RecordBatch: ...


def _new_rows(
    offset_range: OffsetRange, timestamp_type: int, include_headers: bool, use_corrected: bool
) -> _Rows:
    # Columns when the C builder does the decoding; records otherwise: the pure-Python
    # column builder is the C one's reference, slower than records + pyarrow.
    if NATIVE_COLUMNS:
        return _ColumnRows(offset_range, timestamp_type, include_headers, use_corrected)
    return _RecordRows(offset_range, timestamp_type, include_headers, use_corrected)


class _ColumnRows:
    """Records decoded straight into Arrow columns: no Python object per record."""

    def __init__(
        self,
        offset_range: OffsetRange,
        timestamp_type: int,
        include_headers: bool,
        use_corrected: bool,
    ):
        self._range = offset_range
        self._timestamp_type = timestamp_type
        self._include_headers = include_headers
        self._use_corrected = use_corrected
        self._builder = new_column_builder(include_headers)
        # (rows, sent_ms, received_ms) per batch in the builder, in order.
        self._batch_times: list[tuple[int, int | None, int | None]] = []

    @property
    def rows(self) -> int:
        return self._builder.rows

    @property
    def data_bytes(self) -> int:
        return self._builder.data_bytes

    @property
    def last_offset(self) -> int | None:
        return self._builder.last_offset

    def poll(self, consumer: Consumer) -> int:
        # The consumer's position starts at the range's start and only moves forward, so
        # every row is at or past it; rows at or past the end are cut off in `flush`.
        return consumer.poll_columns(
            self._builder, timeout_ms=_POLL_MS, batch_times=self._batch_times
        )

    def flush(self) -> pa.RecordBatch:
        """The rows so far as one Arrow batch, cut before the first offset past the range."""
        columns = finish_columns(self._builder)
        tp = self._range.tp
        batch_times, self._batch_times = self._batch_times, []
        batch = columns_to_arrow(
            columns,
            tp.topic,
            tp.partition,
            self._timestamp_type,
            self._include_headers,
            batch_times,
            self._use_corrected,
        )
        offsets = memoryview(columns.offsets).cast("q")  # ascending: a partition's offsets
        keep = bisect.bisect_left(offsets, self._range.end)
        return batch if keep == columns.rows else batch.slice(0, keep)


class _RecordRows:
    """``ConsumerRecord``s, turned into Arrow batches by ``records_to_arrow``."""

    def __init__(
        self,
        offset_range: OffsetRange,
        timestamp_type: int,
        include_headers: bool,
        use_corrected: bool,
    ):
        self._range = offset_range
        self._timestamp_type = timestamp_type
        self._include_headers = include_headers
        self._use_corrected = use_corrected
        self._pending: list[ConsumerRecord] = []
        self._last_offset: int | None = None
        self.data_bytes = 0  # batches are cut by rows only, as before the columns

    @property
    def rows(self) -> int:
        return len(self._pending)

    @property
    def last_offset(self) -> int | None:
        return self._last_offset

    def poll(self, consumer: Consumer) -> int:
        records = consumer.poll(timeout_ms=_POLL_MS)
        if records:
            self._last_offset = records[-1].offset
        start, end = self._range.start, self._range.end
        # Only offsets of the range, whatever the consumer was moved to.
        self._pending.extend(r for r in records if start <= r.offset < end)
        return len(records)

    def flush(self) -> pa.RecordBatch:
        pending, self._pending = self._pending, []
        return records_to_arrow(
            pending, self._timestamp_type, self._include_headers, self._use_corrected
        )


def _partition_lost(consumer: Consumer, tp: TopicPartition, position: int, end: int) -> str | None:
    """Why the rest of the range can never be read, or None if it still may arrive."""
    try:
        log_end = consumer.end_offsets([tp])[tp]
    except UnknownTopicOrPartitionError:
        return (
            f"{tp} no longer exists (deleted topic?): offsets {position} to {end} of this "
            "micro-batch cannot be read"
        )
    except TidelogError as exc:
        if exc.retriable:  # a leader change (OFFSET_NOT_AVAILABLE, ...): not a loss
            log.info("%s: cannot tell the log end yet (%s); reading on", tp, exc.code)
            return None
        raise
    if log_end <= position:
        return f"{tp} ends at {log_end}, before this micro-batch's end {end}"
    return None


def _skip_ahead(
    consumer: Consumer, options: ReadOptions, offset_range: OffsetRange, position: int
) -> int:
    """Where to continue after ``OFFSET_OUT_OF_RANGE`` at ``position``.

    Below the log start (retention): the log start, or ``DataLossError`` when that is not
    allowed. At or above the log end (truncated or recreated log): the range's end (the
    rest is skipped; reading from the new log start would return records outside the
    range), or ``DataLossError``.
    """
    tp = offset_range.tp
    log_start = consumer.beginning_offsets([tp])[tp]
    if log_start <= position:
        log_end = consumer.end_offsets([tp])[tp]
        message = (
            f"{tp} ends at {log_end}, before offsets {position} to {offset_range.end} of "
            "this micro-batch (log truncated or topic recreated)"
        )
        if options.fail_on_data_loss:
            raise DataLossError(message + _HINT)
        log.warning("%s; skipping them (failOnDataLoss=false)", message)
        return offset_range.end
    if offset_range.from_log_start:
        return log_start
    message = (
        f"{tp}: offsets {offset_range.start} to {min(log_start, offset_range.end)} of this "
        f"micro-batch were deleted (log start offset is now {log_start}), probably by "
        "retention before the query read them"
    )
    if options.fail_on_data_loss:
        raise DataLossError(message + _HINT)
    log.warning("%s; skipping to %d (failOnDataLoss=false)", message, log_start)
    return log_start
