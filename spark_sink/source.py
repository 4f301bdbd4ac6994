"""The data source ``tidelog``: batch and streaming readers, batch and streaming writers.

``TidelogDataSource`` is what ``spark.dataSource.register`` takes (the top-level module
``pyspark_tidelog`` re-exports it as ``DefaultSource``, so PySpark registers it by
itself). The planning (which offsets each batch reads, how ranges become input
partitions) is in the pure ``spark_sink.offsets``; this module wires it to Spark:

- ``TidelogStreamReader.initialOffset`` resolves ``startingOffsets`` /
  ``startingTimestamp`` into concrete offsets (so the checkpoint holds numbers);
- ``latestOffset(start, limit)`` reads the partitions' high watermarks, adds partitions
  that appeared since (they start at the log start), drops or refuses vanished ones
  (``failOnDataLoss``), caps by the read limit (``maxOffsetsPerTrigger`` through Spark's
  ``ReadMaxRows``) and, after ``prepareForTriggerAvailableNow``, by the target offsets
  recorded then;
- ``partitions(start, end)`` turns the two offsets into ranges and cuts them;
- ``read`` (on an executor) is ``spark_sink.reader.read_ranges``.

Offsets are dicts built by ``offsets.offset_dict`` (fixed key order). ``commit`` has
nothing to do: the broker keeps no position for the query, the checkpoint does.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidelog.client.types import TopicPartition
from tidelog.spark_sink.broker_view import BrokerView, PartitionInfo
from tidelog.spark_sink.offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    OffsetSpec,
    cap_offsets,
    offset_dict,
    parse_offsets,
    split_ranges,
)
from tidelog.spark_sink.options import ReadOptions, WriteOptions, include_headers
from tidelog.spark_sink.reader import DataLossError, read_ranges
from tidelog.spark_sink.schema import source_schema
from tidelog.spark_sink.writer import TidelogBatchWriter, TidelogStreamWriter

__all__ = [
    "TidelogBatchReader",
    "TidelogDataSource",
    "TidelogInputPartition",
    "TidelogStreamReader",
]

log = logging.getLogger(__name__)


class TidelogInputPartition(InputPartition):
    """One Spark task's work: an offset range of one partition. Picklable, immutable."""

    def __init__(self, offset_range: OffsetRange, timestamp_type: int) -> None:
        super().__init__((offset_range, timestamp_type))
        self.offset_range = offset_range
        self.timestamp_type = timestamp_type


def _resolve_spec(
    spec: OffsetSpec, current: dict[TopicPartition, PartitionInfo], default: int
) -> dict[TopicPartition, int]:
    """Concrete offsets for ``spec`` over ``current`` (-2 log start, -1 high watermark).

    A partition the JSON form does not name gets ``default`` (one of the markers).
    """
    given = spec.as_dict()
    out = {}
    for tp, info in current.items():
        if spec.kind == "earliest":
            wanted = EARLIEST
        elif spec.kind == "latest":
            wanted = LATEST
        else:
            wanted = given.get(tp, default)
        if wanted == EARLIEST:
            out[tp] = info.log_start_offset
        elif wanted == LATEST:
            out[tp] = info.high_watermark
        else:
            out[tp] = wanted
    unknown = sorted(set(given) - set(current))
    if unknown:
        raise ValueError(f"offsets given for partitions the query does not read: {unknown}")
    return out


def _starting_offsets(
    options: ReadOptions, view: BrokerView, current: dict[TopicPartition, PartitionInfo]
) -> dict[TopicPartition, int]:
    if options.starting_timestamp_ms is None:
        return _resolve_spec(options.starting, current, EARLIEST)
    found = view.offsets_for_timestamp(current, options.starting_timestamp_ms)
    # No record that recent: start at the end (nothing older than the timestamp is read).
    return {
        tp: (found[tp] if found.get(tp) is not None else info.high_watermark)  # type: ignore[misc]
        for tp, info in current.items()
    }


def _plan(
    options: ReadOptions,
    start: dict[TopicPartition, int],
    end: dict[TopicPartition, int],
    current: dict[TopicPartition, PartitionInfo],
) -> list[TidelogInputPartition]:
    ranges = []
    for tp in sorted(end):
        from_log_start = tp not in start
        ranges.append(OffsetRange(tp, start.get(tp, 0), end[tp], from_log_start))
    pieces = split_ranges(
        ranges,
        max_records_per_partition=options.max_records_per_partition,
        min_partitions=options.min_partitions,
    )
    return [
        TidelogInputPartition(piece, current[piece.tp].timestamp_type if piece.tp in current else 0)
        for piece in pieces
    ]


def _read(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(partition, TidelogInputPartition)
    return read_ranges(options, [partition.offset_range], [partition.timestamp_type])


class TidelogBatchReader(DataSourceReader):
    """``spark.read.format("tidelog")``: the offsets between the starting and ending ones.

    Holds only options (picklable); ``partitions`` runs on the driver, ``read`` in tasks.
    """

    def __init__(self, options: ReadOptions) -> None:
        self._options = options

    def partitions(self) -> Sequence[InputPartition]:
        view = BrokerView(self._options)
        try:
            current = view.partitions()
            start = _starting_offsets(self._options, view, current)
            end = _resolve_spec(self._options.ending, current, LATEST)
        finally:
            view.close()
        for tp, offset in end.items():
            if offset < start[tp]:
                raise ValueError(
                    f"{tp}: endingOffsets {offset} is before startingOffsets {start[tp]}"
                )
            if offset > current[tp].high_watermark:
                raise ValueError(
                    f"{tp}: endingOffsets {offset} is past the high watermark "
                    f"{current[tp].high_watermark}"
                )
        return _plan(self._options, start, end, current)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self._options, partition)


class TidelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("tidelog")``.

    Not thread-safe: Spark calls the driver methods from one thread, and ``read`` runs on a
    fresh unpickled copy in each task.
    """

    def __init__(self, options: ReadOptions) -> None:
        self._options = options
        self._view = BrokerView(options)
        self._available_now: dict[TopicPartition, int] | None = None
        # What the last `latestOffset` found: Spark asks `reportLatestOffset` and
        # `partitions` right after it in the same trigger, so they reuse it rather than
        # ask the broker again (three calls each). Dropped when pickled (`read` needs
        # none of it).
        self._last_seen: dict[TopicPartition, PartitionInfo] | None = None

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_last_seen"] = None
        return state

    def initialOffset(self) -> dict[str, dict[str, int]]:  # noqa: N802
        current = self._view.partitions()
        return offset_dict(_starting_offsets(self._options, self._view, current))

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self._options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self._options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        """Record the high watermarks now: the query reads up to them and stops."""
        current = self._view.partitions(strict=False)  # vanished ones: latestOffset decides
        self._available_now = {tp: info.high_watermark for tp, info in current.items()}
        log.info("Trigger.AvailableNow: target offsets %s", offset_dict(self._available_now))

    def latestOffset(  # noqa: N802
        self, start: dict[str, dict[str, int]], limit: ReadLimit
    ) -> dict[str, dict[str, int]]:
        begin = parse_offsets(start)
        current = self._view.partitions(strict=False)
        self._last_seen = current
        latest = {tp: info.high_watermark for tp, info in current.items()}
        if self._available_now is not None:
            # Only what existed when the trigger was prepared (partitions new since are
            # left to a later run), and nothing written after.
            latest = {
                tp: min(offset, self._available_now[tp])
                for tp, offset in latest.items()
                if tp in self._available_now
            }
        for tp, offset in begin.items():
            if tp not in latest:
                self._lost(f"{tp} no longer exists (deleted topic?); the query read it to {offset}")
                continue
            if offset > latest[tp]:
                if self._available_now is not None and tp in self._available_now:
                    latest[tp] = offset  # read past the target already (earlier run)
                    continue
                self._lost(
                    f"{tp}: the checkpoint is at offset {offset} but the partition ends at "
                    f"{latest[tp]} (recreated topic?); continuing from {latest[tp]}"
                )
        for tp in begin:
            if tp in latest and begin[tp] > latest[tp]:
                begin[tp] = latest[tp]
        if isinstance(limit, ReadMaxRows):
            # A partition new since the start is read from its log start, not 0: count
            # its backlog from there, or the cap would admit offsets retention deleted.
            fresh = {tp: current[tp].log_start_offset for tp in latest if tp not in begin}
            end = cap_offsets({**fresh, **begin}, latest, limit.max_rows)
        else:
            end = latest
        # Partitions that vanished (failOnDataLoss=false) drop out of the offsets; a
        # partition never moves backwards.
        end = {tp: max(offset, begin.get(tp, 0)) for tp, offset in end.items()}
        return offset_dict(end)

    def _lost(self, message: str) -> None:
        if self._options.fail_on_data_loss:
            raise DataLossError(
                message + ". Set the option failOnDataLoss to false to go on without it."
            )
        log.warning("%s (failOnDataLoss=false)", message)

    def reportLatestOffset(self) -> dict[str, dict[str, int]]:  # noqa: N802
        """The partitions' high watermarks (Spark shows them in the query progress): as
        the trigger's `latestOffset` just found them, else asked now."""
        current = self._last_seen
        if current is None:
            current = self._view.partitions(strict=False)
        return offset_dict({tp: info.high_watermark for tp, info in current.items()})

    def partitions(
        self, start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]
    ) -> Sequence[InputPartition]:
        begin, finish = parse_offsets(start), parse_offsets(end)
        # Only for the timestamp types: the trigger's `latestOffset` found them, unless
        # this is a batch planned again from the checkpoint after a restart.
        current = self._last_seen
        if current is None or any(tp not in current for tp in finish):
            current = self._view.partitions(strict=False)
        return _plan(self._options, begin, finish, current)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self._options, partition)

    def commit(self, end: dict[str, dict[str, int]]) -> None:
        """Nothing to do: the checkpoint, not the broker, holds the query's position."""

    def stop(self) -> None:
        self._view.close()


class TidelogDataSource(DataSource):
    """``format("tidelog")``: read and write Tidelog topics (``docs/spark.md``).

    Spark builds one per query or job from the options; it only parses them.
    """

    @classmethod
    def name(cls) -> str:
        return "tidelog"

    def schema(self) -> StructType:
        return source_schema(include_headers(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return TidelogBatchReader(ReadOptions.from_mapping(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return TidelogStreamReader(ReadOptions.from_mapping(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return TidelogBatchWriter(WriteOptions.from_mapping(self.options), schema)

    def streamWriter(  # noqa: N802
        self, schema: StructType, overwrite: bool
    ) -> DataSourceStreamWriter:
        return TidelogStreamWriter(WriteOptions.from_mapping(self.options), schema)
