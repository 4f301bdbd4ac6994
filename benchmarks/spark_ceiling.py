"""The ceiling for ``spark_bench.py``: what Spark's Python data source machinery allows.

A Python data source (``tidelog_ceiling``) with the ``tidelog`` source's schema that
yields pre-built Arrow batches of the same rows: no broker, no fetching, no decoding.
``write_partition_files`` writes each partition's rows, as the real reader returns them,
to an Arrow IPC file; the source's ``read`` memory-maps a file and yields its batches.
Its rate is the most a source that hands Spark Arrow batches can reach on this machine.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from spark_sink.schema import arrow_schema, source_schema

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


class _CeilingReader(DataSourceReader):
    def __init__(self, paths: list[str]) -> None:
        self._paths = paths

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(path) for path in self._paths]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Memory-mapped: the batches are the file's pages, nothing is copied or built.
        reader = pa.ipc.open_file(pa.memory_map(partition.value))
        for index in range(reader.num_record_batches):
            yield reader.get_batch(index)
