"""Offset checkpoint files and the clean-shutdown marker of a data directory.

Offset checkpoints use Kafka's text format (``OffsetCheckpointFile``)::

    0                      <- format version
    2                      <- number of entries
    events 0 1234          <- topic, partition, offset
    events 1 99

and are always written with ``atomic_write``. A missing file reads as empty; an unreadable
one raises ``ValueError`` so the caller can fall back (recover everything).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tidelog.storage.files import atomic_write

__all__ = [
    "CLEANER_OFFSET_CHECKPOINT",
    "CLEAN_SHUTDOWN_MARKER",
    "LOG_START_OFFSET_CHECKPOINT",
    "RECOVERY_POINT_CHECKPOINT",
    "REPLICATION_OFFSET_CHECKPOINT",
    "read_offsets",
    "write_offsets",
]

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
# High watermarks of replicated logs (cluster mode); Kafka's name. Absent on a single node.
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
CLEAN_SHUTDOWN_MARKER = ".tidelog_cleanshutdown"

TopicPartitionKey = tuple[str, int]


def write_offsets(path: str | os.PathLike[str], offsets: Mapping[TopicPartitionKey, int]) -> None:
    """Write ``{(topic, partition): offset}`` atomically in Kafka's checkpoint format."""
    lines = ["0", str(len(offsets))]
    lines += [
        f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())
    ]
    atomic_write(path, ("\n".join(lines) + "\n").encode())


def read_offsets(path: str | os.PathLike[str]) -> dict[TopicPartitionKey, int]:
    """Read a checkpoint file; ``{}`` if it does not exist.

    Raises:
        ValueError: the file is not a version-0 checkpoint with the stated entry count.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    lines = text.splitlines()
    if len(lines) < 2 or lines[0].strip() != "0":
        raise ValueError(f"{path}: not a version 0 offset checkpoint")
    count = int(lines[1])
    entries = lines[2:]
    if len(entries) != count:
        raise ValueError(f"{path}: expected {count} entries, found {len(entries)}")
    out: dict[TopicPartitionKey, int] = {}
    for line in entries:
        topic, partition, offset = line.split()
        out[(topic, int(partition))] = int(offset)
    return out
