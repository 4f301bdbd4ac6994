"""The ceiling for ``spark_bench.py``: what Spark's Python data source machinery allows.

A Python data source (``tidelog_ceiling``) with the ``tidelog`` source's schema that
yields pre-built Arrow batches of the same rows: no broker, no fetching, no decoding.
``write_partition_files`` writes each partition's rows, as the real reader returns them,
to an Arrow IPC file; the source's ``read`` memory-maps a file and yields its batches.
Its rate is the most a source that hands Spark Arrow batches can reach on this machine.

The same source read with ``spark.readStream`` (``Trigger.AvailableNow``, one
micro-batch of every row: offsets are row counts per file) is the streaming ceiling: what
Spark's Python *streaming* data source machinery allows (a Python process for the
driver side, the offset log and commit log written per trigger), which no streaming
source can beat, however fast it decodes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit
from pyspark.sql.types import StructType

from tidelog.spark_sink.schema import arrow_schema, source_schema

__all__ = ["CeilingDataSource", "write_partition_files"]


def write_partition_files(
    batches_by_partition: Sequence[Iterator[pa.RecordBatch]], directory: Path
) -> list[str]:
    """One Arrow IPC file per partition of ``batches_by_partition``; returns the paths."""
    paths = []
    for index, batches in enumerate(batches_by_partition):
        path = directory / f"partition-{index}.arrow"
        with (
            pa.OSFile(str(path), "wb") as sink,
            pa.ipc.new_file(sink, arrow_schema(False)) as writer,
        ):
            for batch in batches:
                writer.write_batch(batch)
        paths.append(str(path))
    return paths


class CeilingDataSource(DataSource):
    """``spark.read.format("tidelog_ceiling").option("paths", "a,b")``: one partition a file."""

    @classmethod
    def name(cls) -> str:
        return "tidelog_ceiling"

    def schema(self) -> StructType:
        return source_schema(False)

    def reader(self, schema: StructType) -> DataSourceReader:
        return _CeilingReader(self.options["paths"].split(","))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return _CeilingStreamReader(self.options["paths"].split(","))


class _CeilingReader(DataSourceReader):
    def __init__(self, paths: list[str]) -> None:
        self._paths = paths

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(path) for path in self._paths]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _batches(partition.value)


def _batches(path: str) -> Iterator[pa.RecordBatch]:
    """The batches of one partition file, memory-mapped: the batches are the file's
    pages, nothing is copied or built."""
    reader = pa.ipc.open_file(pa.memory_map(path))
    for index in range(reader.num_record_batches):
        yield reader.get_batch(index)


class _CeilingStreamReader(DataSourceStreamReader):
    """Offsets ``{"0": rows, "1": rows...}``: every file is there from the start, so the
    first trigger reads all of it and the next finds nothing new."""

    def __init__(self, paths: list[str]) -> None:
        self._paths = paths

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        return {str(index): 0 for index in range(len(self._paths))}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        return {
            str(index): sum(batch.num_rows for batch in _batches(path))
            for index, path in enumerate(self._paths)
        }

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [
            InputPartition(path)
            for index, path in enumerate(self._paths)
            if end[str(index)] > start[str(index)]
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _batches(partition.value)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to keep: the files do not change."""
