"""Tidelog's storage engine: record batches, segments, indexes, partition logs.

Plain blocking Python with explicit locks; no grpc, no pyspark, no broker or client code.
Layers, bottom up: ``records`` (the RecordBatch v2 byte format), ``index`` (sparse offset
and time indexes), ``segment`` (one ``.log`` file and its indexes), ``partition_log`` (the
ordered segments of one partition), ``log_manager`` (a data directory of partitions, with
background retention, cleaning and flushing). ``retention`` and ``cleaner`` plan deletion
and compaction; ``errors`` is the one error tree of the whole project.

This package exports the names a broker needs; the format lives in ``storage.records``.
"""

from storage.clock import Clock, ManualClock, SystemClock
from storage.config import LogConfig
from storage.log_manager import LogManager, LogManagerConfig, TopicMetadata
from storage.partition_log import AppendResult, PartitionLog, ReadResult

__all__ = [
    "AppendResult",
    "Clock",
    "LogConfig",
    "LogManager",
    "LogManagerConfig",
    "ManualClock",
    "PartitionLog",
    "ReadResult",
    "SystemClock",
    "TopicMetadata",
]
