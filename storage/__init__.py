"""Tidelog's storage engine: record batches, segments, indexes, partition logs.

Plain blocking Python with explicit locks; no grpc, no pyspark, no broker or client code.
Layers, bottom up: ``records`` (the RecordBatch v2 byte format), ``index`` (sparse offset
and time indexes), ``segment`` (one ``.log`` file and its indexes), ``partition_log`` (the
ordered segments of one partition), ``log_manager`` (a data directory of partitions, with
background retention, cleaning and flushing). ``retention`` and ``cleaner`` plan deletion
and compaction; ``errors`` is the one error tree of the whole project.

This package exports the names a broker needs; the format lives in ``storage.records``.
The exports are loaded on first use (PEP 562): the client imports only ``storage.records``
and ``storage.errors``, and importing the package must not load the log manager, the
cleaner and the rest of the engine into every client process (about 40 ms).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidelog.storage.clock import Clock, ManualClock, SystemClock
    from tidelog.storage.config import LogConfig
    from tidelog.storage.log_manager import LogManager, LogManagerConfig, TopicMetadata
    from tidelog.storage.partition_log import AppendResult, PartitionLog, ReadResult

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

_HOMES = {
    "AppendResult": "tidelog.storage.partition_log",
    "Clock": "tidelog.storage.clock",
    "LogConfig": "tidelog.storage.config",
    "LogManager": "tidelog.storage.log_manager",
    "LogManagerConfig": "tidelog.storage.log_manager",
    "ManualClock": "tidelog.storage.clock",
    "PartitionLog": "tidelog.storage.partition_log",
    "ReadResult": "tidelog.storage.partition_log",
    "SystemClock": "tidelog.storage.clock",
    "TopicMetadata": "tidelog.storage.log_manager",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
