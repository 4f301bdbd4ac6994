"""The leader-epoch cache against Kafka's rules, and its checkpoint round trip."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.storage.leader_epoch import (
    LEADER_EPOCH_CHECKPOINT,
    UNDEFINED_EPOCH,
    EpochEntry,
    LeaderEpochCache,
)


def cache(*pairs: tuple[int, int]) -> LeaderEpochCache:
    built = LeaderEpochCache()
    for epoch, offset in pairs:
        built.assign(epoch, offset)
    return built


def test_end_offsets_as_kafka_answers_them() -> None:
    epochs = cache((0, 0), (2, 10), (5, 30))
    assert epochs.end_offset_for(5, 42) == (5, 42)  # the latest epoch ends at the log end
    assert epochs.end_offset_for(7, 42) == (5, 42)
    assert epochs.end_offset_for(2, 42) == (2, 30)
    assert epochs.end_offset_for(3, 42) == (2, 30)  # unknown: the largest smaller epoch
    assert epochs.end_offset_for(0, 42) == (0, 10)
    assert cache((3, 4)).end_offset_for(1, 42) == (UNDEFINED_EPOCH, UNDEFINED_EPOCH)
    assert LeaderEpochCache().end_offset_for(0, 42) == (UNDEFINED_EPOCH, UNDEFINED_EPOCH)


def test_assignments_truncations_and_lookups() -> None:
    epochs = cache((0, 0), (2, 10))
    assert not epochs.assign(2, 15)  # later batches of the same epoch change nothing
    assert not epochs.assign(1, 20)  # an old epoch never comes back
    assert epochs.assign(4, 10)  # a new epoch at an existing start replaces it
    assert epochs.entries == [EpochEntry(0, 0), EpochEntry(4, 10)]
    assert epochs.epoch_for_offset(9) == 0
    assert epochs.epoch_for_offset(10) == 4
    epochs.truncate_from_end(10)
    assert epochs.entries == [EpochEntry(0, 0)]
    epochs = cache((0, 0), (2, 10), (5, 30))
    epochs.truncate_from_start(12)
    assert epochs.entries == [EpochEntry(2, 12), EpochEntry(5, 30)]
    with pytest.raises(ValueError, match="must be >= 0"):
        epochs.assign(-1, 0)


def test_checkpoint_file_is_kafkas_format(tmp_path: Path) -> None:
    epochs = cache((0, 0), (3, 1500))
    epochs.write(tmp_path)
    assert (tmp_path / LEADER_EPOCH_CHECKPOINT).read_text() == "0\n2\n0 0\n3 1500\n"
    read = LeaderEpochCache.read(tmp_path)
    assert read is not None
    assert read.entries == epochs.entries
    (tmp_path / LEADER_EPOCH_CHECKPOINT).write_text("0\n3\n0 0\n")
    assert LeaderEpochCache.read(tmp_path) is None  # unreadable: rebuild from the log
    assert LeaderEpochCache.read(tmp_path / "missing") is None


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 200)), max_size=30))
def test_entries_stay_increasing_and_round_trip(pairs: list[tuple[int, int]]) -> None:
    epochs = cache(*pairs)
    entries = epochs.entries
    assert all(
        a.epoch < b.epoch and a.start_offset < b.start_offset
        for a, b in itertools.pairwise(entries)
    )
    assert LeaderEpochCache.from_text(epochs.to_text()).entries == entries
    for epoch in range(22):
        found_epoch, end = epochs.end_offset_for(epoch, 1_000)
        assert found_epoch <= max(epoch, epochs.latest_epoch)
        if found_epoch != UNDEFINED_EPOCH:
            assert end >= next(e.start_offset for e in entries if e.epoch == found_epoch)
