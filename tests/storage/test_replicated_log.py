"""A partition log as a replica: epoch stamping, follower appends, divergence, high watermark.

The replication protocol's storage half (``docs/replication.md``), against real logs in
temporary directories: a leader stamps its epoch, a follower copying the leader's batches
ends byte-identical, a follower whose tail diverged finds the divergence point from the
leader's epochs and truncates, consumers read only below the high watermark, and epochs
and high watermarks survive a reopen.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.conftest import log_config, make_batch, open_log, values
from tidelog.storage.cleaner import summarize_segments
from tidelog.storage.clock import ManualClock
from tidelog.storage.compaction import plan_cleanable_range
from tidelog.storage.errors import FencedLeaderEpochError
from tidelog.storage.files import sync_file_system
from tidelog.storage.leader_epoch import LEADER_EPOCH_CHECKPOINT, EpochEntry
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import iter_batch_headers, split_whole_batches


def replicate(leader: PartitionLog, follower: PartitionLog, max_bytes: int = 300) -> None:
    """Fetch from ``leader`` as a follower does (from the follower's log end) until even."""
    for _ in range(10_000):
        # Every fetch is checked for divergence first, against the leader's epochs.
        epoch = follower.latest_epoch
        if epoch >= 0:
            leader_epoch, end = leader.end_offset_for_epoch(epoch)
            if leader_epoch != epoch or end < follower.log_end_offset:
                follower.truncate_to(follower.divergence_offset(leader_epoch, end))
                continue
        if follower.log_end_offset >= leader.log_end_offset:
            return
        read = leader.read(follower.log_end_offset, max_bytes)
        data = read.records[: split_whole_batches(read.records)]
        follower.append_as_follower(data, read.batch_times)
        follower.set_high_watermark(min(read.high_watermark, follower.log_end_offset))
    raise AssertionError("replication made no progress")


def log_bytes(log: PartitionLog) -> bytes:
    return b"".join(log.read(o, 10**9).records for o in [log.log_start_offset])


def open_replica(path: Path, clock: ManualClock) -> PartitionLog:
    plog = open_log(path, clock)
    plog.track_high_watermark()
    return plog


def test_leader_stamps_its_epoch_outside_the_crc(tmp_path: Path, clock: ManualClock) -> None:
    leader = open_replica(tmp_path / "leader", clock)
    leader.begin_leader_epoch(3)
    leader.append(make_batch(values(2)), leader_epoch=3)
    leader.append(make_batch(values(1)), leader_epoch=3)
    headers = [h for _, h in iter_batch_headers(leader.read(0, 10**6).records, validate=True)]
    assert [h.partition_leader_epoch for h in headers] == [3, 3]
    assert leader.epoch_entries() == [EpochEntry(3, 0)]
    assert (leader.directory / LEADER_EPOCH_CHECKPOINT).read_text() == "0\n1\n3 0\n"
    assert leader.end_offset_for_epoch(3) == (3, 3)
    assert leader.end_offset_for_epoch(2) == (-1, -1)


def test_an_append_stamped_with_an_older_epoch_is_refused(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A produce that read the leader's epoch just before the leader moved to a newer one
    must not land past the new epoch's start stamped with the old epoch: a follower would
    learn epoch 0 for an offset the leader's cache gives to epoch 1, and truncate it, fetch
    it again, and truncate it for ever (seen in a rolling restart)."""
    leader = open_replica(tmp_path / "leader", clock)
    leader.append(make_batch(values(2)), leader_epoch=0)
    leader.begin_leader_epoch(1)
    with pytest.raises(FencedLeaderEpochError, match="epoch 0 is older"):
        leader.append(make_batch(values(1)), leader_epoch=0)
    assert leader.log_end_offset == 2
    assert leader.epoch_entries() == [EpochEntry(0, 0), EpochEntry(1, 2)]
    leader.append(make_batch(values(1)), leader_epoch=1)
    headers = [h for _, h in iter_batch_headers(leader.read(0, 10**6).records)]
    assert [h.partition_leader_epoch for h in headers] == [0, 1]


def test_truncation_inside_a_batch_removes_the_whole_batch(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Kafka's rule: every batch holding an offset at or past the cut goes, so the log
    ends at or below it (a diverged follower keeps nothing the leader may not have)."""
    plog = open_replica(tmp_path / "p", clock)
    plog.append(make_batch(values(3)), leader_epoch=0)  # offsets 0-2
    plog.append(make_batch(values(3, 3)), leader_epoch=0)  # offsets 3-5
    plog.truncate_to(4)
    assert plog.log_end_offset == 3
    plog.truncate_to(3)
    assert plog.log_end_offset == 3
    plog.truncate_to(1)
    assert plog.log_end_offset == 0
    plog.append(make_batch(values(2)), leader_epoch=0)
    assert plog.log_end_offset == 2


def test_a_follower_ends_byte_identical(tmp_path: Path, clock: ManualClock) -> None:
    leader = open_replica(tmp_path / "leader", clock)
    follower = open_replica(tmp_path / "follower", clock)
    for epoch in (0, 1, 4):
        leader.begin_leader_epoch(epoch)
        for n in range(3):
            leader.append(make_batch(values(n + 1)), leader_epoch=epoch)
    replicate(leader, follower)
    assert log_bytes(follower) == log_bytes(leader)
    assert follower.epoch_entries() == leader.epoch_entries()
    # Nothing is readable past the high watermark the follower learnt (the leader's,
    # which here never moved: no follower had reported).
    assert follower.high_watermark == leader.high_watermark == 0


def test_consumers_read_below_the_high_watermark_only(tmp_path: Path, clock: ManualClock) -> None:
    leader = open_replica(tmp_path / "leader", clock)
    for n in range(4):
        leader.append(make_batch(values(2, 2 * n)), leader_epoch=0)  # offsets 2n, 2n+1
    assert leader.set_high_watermark(4)
    hw = leader.high_watermark
    read = leader.read(0, 10**6, max_offset=hw)
    assert [h.last_offset for _, h in iter_batch_headers(read.records)] == [1, 3]
    assert read.high_watermark == 4
    assert leader.read(4, 10**6, max_offset=hw).records == b""  # between HW and log end
    assert leader.read(6, 10**6).records  # a follower reads up to the log end
    assert not leader.set_high_watermark(2)  # never moves down


def test_epochs_and_high_watermark_survive_a_reopen(tmp_path: Path, clock: ManualClock) -> None:
    plog = open_replica(tmp_path / "p", clock)
    plog.begin_leader_epoch(2)
    plog.append(make_batch(values(3)), leader_epoch=2)
    plog.set_high_watermark(2)
    plog.close()
    again = open_log(tmp_path / "p", clock, high_watermark=2, had_clean_shutdown=False)
    assert again.replicated
    assert again.high_watermark == 2
    assert again.epoch_entries() == [EpochEntry(2, 0)]
    assert open_log(tmp_path / "q", clock, high_watermark=99).high_watermark == 0


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shared=st.lists(st.integers(1, 4), min_size=0, max_size=4),
    follower_only=st.lists(st.integers(1, 4), min_size=0, max_size=4),
    leader_only=st.lists(st.integers(1, 4), min_size=0, max_size=4),
    fetch_bytes=st.integers(1, 400),
)
def test_a_diverged_follower_converges_on_the_leader(
    tmp_path_factory: object,
    clock: ManualClock,
    shared: list[int],
    follower_only: list[int],
    leader_only: list[int],
    fetch_bytes: int,
) -> None:
    """Epoch 0 wrote ``shared`` on both; the old leader (now follower) then wrote
    ``follower_only`` at epoch 1 that never replicated; the new leader writes
    ``leader_only`` at epoch 2. After replication both logs are identical: the follower's
    unreplicated tail is gone, nothing of the shared prefix is."""
    base = tmp_path_factory.mktemp("diverge")  # type: ignore[attr-defined]
    leader = open_replica(base / "leader", clock)
    follower = open_replica(base / "follower", clock)
    for plog in (leader, follower):
        plog.begin_leader_epoch(0)
    offset = 0
    for count in shared:
        batch = make_batch(values(count, offset))
        leader.append(batch, leader_epoch=0)
        follower.append(batch, leader_epoch=0)
        offset += count
    follower.begin_leader_epoch(1)
    for count in follower_only:
        follower.append(make_batch(values(count, 1000)), leader_epoch=1)
    leader.begin_leader_epoch(2)
    for count in leader_only:
        leader.append(make_batch(values(count, 2000)), leader_epoch=2)
    replicate(leader, follower, fetch_bytes)
    assert log_bytes(follower) == log_bytes(leader)
    # The follower learns epochs from the data: an epoch that wrote nothing is not in it.
    written = sorted({h.partition_leader_epoch for _, h in iter_batch_headers(log_bytes(leader))})
    assert [e.epoch for e in follower.epoch_entries()] == written
    assert set(written) <= {e.epoch for e in leader.epoch_entries()}


def test_retention_and_compaction_stop_at_the_high_watermark(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Segments holding offsets at or above the high watermark are neither deleted by
    retention nor rewritten by the cleaner: a follower may still need (or truncate) them."""
    config = log_config(segment_bytes=200, retention_bytes=1, cleanup_policy="compact,delete")
    plog = open_log(tmp_path / "p", clock, config)
    plog.track_high_watermark()
    for n in range(12):
        plog.append(make_batch(values(1, n, size=60), keys=[b"k"]), leader_epoch=0)
    assert plog.segment_count >= 4
    plog.set_high_watermark(0)
    assert plog.delete_old_segments() == 0  # everything is above the high watermark
    summaries = summarize_segments(list(plog.segments))
    cleanable = plan_cleanable_range(
        summaries,
        checkpoint_offset=None,
        log_start_offset=0,
        log_end_offset=plog.log_end_offset,
        now_ms=clock.wall_ms(),
        min_compaction_lag_ms=0,
        high_watermark=plog.high_watermark,
    )
    assert cleanable.first_uncleanable_offset == 0
    second = plog.segments[2].base_offset
    plog.set_high_watermark(second)
    assert plog.delete_old_segments() == 2  # the two segments wholly below it
    assert plog.log_start_offset == second


def test_a_follower_below_the_leaders_log_start_starts_over_there(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Retention on the leader deleted what the follower never fetched: the follower
    drops its log, starts empty at the leader's log start and ends byte-identical from
    there, across a reopen (Kafka's truncateFullyAndStartAt)."""
    config = log_config(segment_bytes=200, retention_bytes=1)
    leader = open_log(tmp_path / "leader", clock, config)
    leader.track_high_watermark()
    follower = open_replica(tmp_path / "follower", clock)
    leader.begin_leader_epoch(0)
    for n in range(3):
        leader.append(make_batch(values(1, n, size=60)), leader_epoch=0)
    replicate(leader, follower)
    leader.begin_leader_epoch(1)
    for n in range(3, 12):
        leader.append(make_batch(values(1, n, size=60)), leader_epoch=1)
    leader.set_high_watermark(leader.log_end_offset)
    assert leader.delete_old_segments() > 0
    assert leader.log_start_offset > follower.log_end_offset  # out of the follower's reach

    follower.truncate_fully_and_start_at(leader.log_start_offset)
    assert follower.log_start_offset == follower.log_end_offset == leader.log_start_offset
    assert follower.high_watermark == leader.log_start_offset
    assert follower.epoch_entries() == []
    replicate(leader, follower)
    assert log_bytes(follower) == log_bytes(leader)
    assert follower.epoch_entries() == leader.epoch_entries()
    follower.close()
    again = open_log(tmp_path / "follower", clock, high_watermark=leader.log_end_offset)
    assert again.log_start_offset == leader.log_start_offset
    assert log_bytes(again) == log_bytes(leader)
    assert again.epoch_entries() == leader.epoch_entries()


def test_after_an_unclean_stop_the_epochs_past_the_recovery_point_are_the_batches(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Issue #29 (seed 202): a follower truncated its diverged epoch-4 tail and recorded
    its new leader's epoch 5 at the cut; the checkpoint is fsynced when an epoch begins,
    the cut and the new batches were not, and a power loss brought the epoch-4 tail back
    under the checkpoint's epoch 5. Reopened, the log must not claim epoch 5 for batches
    epoch 4 wrote: OffsetForLeaderEpoch(4) must end the epoch where the log does, so that
    the leader's answer finds the divergence again."""
    plog = open_replica(tmp_path / "p", clock)
    plog.begin_leader_epoch(3)
    plog.append(make_batch(values(5)), leader_epoch=3)  # 0-4, durable
    plog.flush(5)
    plog.begin_leader_epoch(4)
    plog.append(make_batch(values(5, 100)), leader_epoch=4)  # 5-9, never flushed
    plog.close()
    # What the power loss left: the old tail, and the checkpoint naming epoch 5 at 5.
    (tmp_path / "p" / LEADER_EPOCH_CHECKPOINT).write_text("0\n3\n3 0\n4 5\n5 5\n")
    again = open_log(tmp_path / "p", clock, recovery_point=5, had_clean_shutdown=False)
    assert again.epoch_entries() == [EpochEntry(3, 0), EpochEntry(4, 5)]
    assert again.end_offset_for_epoch(4) == (4, 10)
    # Below the recovery point the checkpoint stands; after a clean stop it is trusted.
    again.close()
    (tmp_path / "p" / LEADER_EPOCH_CHECKPOINT).write_text("0\n2\n3 0\n4 5\n")
    clean = open_log(tmp_path / "p", clock, recovery_point=10, had_clean_shutdown=True)
    assert clean.epoch_entries() == [EpochEntry(3, 0), EpochEntry(4, 5)]


def test_an_epoch_recorded_unsynced_is_written_and_made_durable_by_one_flush(
    tmp_path: Path, clock: ManualClock
) -> None:
    """``begin_leader_epoch(sync=False)`` (a view's batch of new leaderships): the
    checkpoint is there at once, ``sync_file_system`` makes it durable for all of them,
    and the role's own ``begin_leader_epoch`` then finds the epoch and writes nothing."""
    logs = [open_replica(tmp_path / f"p{i}", clock) for i in range(3)]
    for plog in logs:
        plog.begin_leader_epoch(7, sync=False)
    sync_file_system(tmp_path)
    for plog in logs:
        checkpoint = plog.directory / LEADER_EPOCH_CHECKPOINT
        assert checkpoint.read_text() == "0\n1\n7 0\n"
        written = checkpoint.stat().st_mtime_ns
        plog.begin_leader_epoch(7)
        assert checkpoint.stat().st_mtime_ns == written
        assert plog.epoch_entries() == [EpochEntry(7, 0)]
    with pytest.raises(NotADirectoryError):
        sync_file_system(logs[0].directory / LEADER_EPOCH_CHECKPOINT)


def test_an_unreadable_epoch_checkpoint_is_rebuilt_from_every_batch(
    tmp_path: Path, clock: ManualClock
) -> None:
    """What an OS crash may leave of a checkpoint written unsynced: a file there but not
    readable. Reopened (even after a clean stop, below the recovery point), the epochs of
    every batch are known again; an empty cache would answer OffsetForLeaderEpoch as if
    the log had none."""
    plog = open_replica(tmp_path / "p", clock)
    plog.begin_leader_epoch(2)
    plog.append(make_batch(values(3)), leader_epoch=2)
    plog.begin_leader_epoch(5)
    plog.append(make_batch(values(2)), leader_epoch=5)
    plog.flush(5)
    plog.close()
    (tmp_path / "p" / LEADER_EPOCH_CHECKPOINT).write_bytes(b"\x00" * 9)
    again = open_log(tmp_path / "p", clock, recovery_point=5, had_clean_shutdown=True)
    assert again.epoch_entries() == [EpochEntry(2, 0), EpochEntry(5, 3)]
    assert again.end_offset_for_epoch(2) == (2, 3)
    again.close()
    # A log that never had one (a new log, or an unreplicated one) reads no batch for it.
    fresh = open_log(tmp_path / "q", clock)
    assert fresh.epoch_entries() == []
