"""Leader epochs of one partition: which epoch wrote which offsets, and its checkpoint.

Kafka's ``LeaderEpochFileCache`` (reference: replication.md section 1.6). Every batch
carries the epoch of the leader that appended it (``partitionLeaderEpoch``, outside the
CRC), so the cache is derived from the data: an append of a batch whose epoch is newer
than the last one records ``(epoch, base offset)``. A new leader also records
``(new epoch, log end offset)`` before it writes. Followers use ``end_offset_for`` to find
where their log diverged from the leader's (KIP-101, KIP-279) and truncate there.

``end_offset_for(epoch, log_end_offset)``:

* the latest epoch (or a newer one) ends at the log end offset;
* an older epoch ends where the next higher epoch starts, and the answer names the
  largest known epoch at or below the one asked for;
* an epoch below every known one: ``(-1, -1)`` (Kafka's UNDEFINED_EPOCH_OFFSET).

The checkpoint file ``leader-epoch-checkpoint`` is Kafka's text format, written with
``storage.files.atomic_write`` (temp file, fsync, rename, fsync the directory)::

    0                 format version
    2                 number of entries
    0 0               <epoch> <start offset>, epochs and offsets increasing
    3 1500

Not thread-safe: ``PartitionLog`` reaches it under its lock.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from pathlib import Path

from tidelog.storage.files import atomic_write

__all__ = [
    "LEADER_EPOCH_CHECKPOINT",
    "UNDEFINED_EPOCH",
    "EpochEntry",
    "LeaderEpochCache",
]

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
_VERSION = 0


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """Epoch ``epoch`` wrote from ``start_offset`` on."""

    epoch: int
    start_offset: int


class LeaderEpochCache:
    """Epoch -> start offset, increasing in both. Not thread-safe."""

    def __init__(self, entries: list[EpochEntry] | None = None) -> None:
        self._entries: list[EpochEntry] = list(entries or [])

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; returns whether it changed.

        An epoch no newer than the latest is ignored (every batch of an epoch passes here,
        only its first one starts it). A newer epoch starting at or below the start of
        existing entries replaces them: they never wrote anything that survived.
        Raises ``ValueError`` for a negative epoch or offset.
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"epoch {epoch} and start offset {start_offset} must be >= 0")
        if self._entries and epoch <= self._entries[-1].epoch:
            return False
        while self._entries and self._entries[-1].start_offset >= start_offset:
            self._entries.pop()
        self._entries.append(EpochEntry(epoch, start_offset))
        return True

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """``(largest known epoch <= epoch, the offset where it ended)``; see the module."""
        if not self._entries or epoch < self._entries[0].epoch:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH
        if epoch >= self._entries[-1].epoch:
            return self._entries[-1].epoch, log_end_offset
        epochs = [e.epoch for e in self._entries]
        index = bisect.bisect_right(epochs, epoch)  # the first entry with a larger epoch
        return self._entries[index - 1].epoch, self._entries[index].start_offset

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch that wrote ``offset`` (UNDEFINED_EPOCH before the first entry)."""
        starts = [e.start_offset for e in self._entries]
        index = bisect.bisect_right(starts, offset)
        return self._entries[index - 1].epoch if index else UNDEFINED_EPOCH

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was cut at ``end_offset``: forget epochs that start at or after it."""
        while self._entries and self._entries[-1].start_offset >= end_offset:
            self._entries.pop()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: drop epochs wholly before it, and move
        the epoch that covers it to start there (Kafka keeps that one, adjusted)."""
        keep_from = 0
        for index, entry in enumerate(self._entries):
            if entry.start_offset <= start_offset:
                keep_from = index
        kept = self._entries[keep_from:]
        if kept and kept[0].start_offset < start_offset:
            kept[0] = EpochEntry(kept[0].epoch, start_offset)
        self._entries = kept

    # --- the checkpoint ---------------------------------------------------------------

    def to_text(self) -> str:
        lines = [str(_VERSION), str(len(self._entries))]
        lines += [f"{e.epoch} {e.start_offset}" for e in self._entries]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_text(cls, text: str) -> LeaderEpochCache:
        """Parse a checkpoint. Raises ``ValueError`` for anything but Kafka's format."""
        lines = text.splitlines()
        if len(lines) < 2 or lines[0].strip() != str(_VERSION):
            raise ValueError("not a version-0 leader-epoch-checkpoint")
        count = int(lines[1])
        if count < 0 or len(lines) - 2 != count:
            raise ValueError(f"leader-epoch-checkpoint says {count} entries, has {len(lines) - 2}")
        entries = []
        for line in lines[2:]:
            epoch_text, offset_text = line.split()
            entries.append(EpochEntry(int(epoch_text), int(offset_text)))
        for before, after in itertools.pairwise(entries):
            if after.epoch <= before.epoch or after.start_offset < before.start_offset:
                raise ValueError("leader-epoch-checkpoint entries are not increasing")
        return cls(entries)

    def write(self, directory: Path, *, sync: bool = True) -> None:
        """Replace the checkpoint (``atomic_write``; ``sync`` False: not yet durable)."""
        atomic_write(directory / LEADER_EPOCH_CHECKPOINT, self.to_text().encode(), sync=sync)

    @classmethod
    def read(cls, directory: Path) -> LeaderEpochCache | None:
        """The checkpoint in ``directory``, or None if missing or unreadable (rebuild it
        from the batch headers)."""
        path = directory / LEADER_EPOCH_CHECKPOINT
        try:
            return cls.from_text(path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            return None
