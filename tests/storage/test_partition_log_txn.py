"""Transactions in a partition log: markers, the LSO, aborted transactions, the files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.conftest import (
    log_config,
    make_batch,
    open_log,
    reopen_clean,
    reopen_unclean,
    scratch_dir,
    segment_files,
)
from tests.storage.txn_reader import read_committed, read_uncommitted, txn_batch
from tidelog.storage.cleaner import LogCleaner
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import iter_batch_headers

PID, OTHER = 7, 8


def _values(log: object) -> list[bytes | None]:
    return [r.value for r in read_committed(log)]  # type: ignore[arg-type]


def test_commit_abort_and_the_lso(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    log.append(make_batch([b"plain"]))
    log.append(txn_batch(PID, 0, 0, [b"t1", b"t2"]))  # offsets 1-2
    assert log.last_stable_offset == 1
    assert _values(log) == [b"plain"]
    log.append(txn_batch(OTHER, 0, 0, [b"o1"]))  # offset 3
    assert log.append_marker(PID, 0, False, 0) == 4  # abort PID
    assert log.last_stable_offset == 3  # OTHER's transaction still open
    assert log.aborted_transactions(0, 5) == [(PID, 1)]
    assert log.append_marker(OTHER, 0, True, 0) == 5
    assert log.last_stable_offset == log.high_watermark == 6
    assert _values(log) == [b"plain", b"o1"]
    # A read_uncommitted reader sees both kinds of data (and skips the markers).
    assert [r.value for r in read_uncommitted(log)] == [b"plain", b"t1", b"t2", b"o1"]
    described = {s.producer_id: s for s in log.describe_producers()}
    assert described[PID].current_txn_start_offset == -1
    assert described[PID].coordinator_epoch == 0
    log.close()


def test_marker_checks(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    log.append(txn_batch(PID, 2, 0, [b"a"]))
    with pytest.raises(InvalidTxnStateError):
        log.append(txn_batch(PID, 2, 1, [b"b"], transactional=False))
    log.append_marker(PID, 2, True, 5)
    end = log.log_end_offset
    with pytest.raises(InvalidProducerEpochError):
        log.append_marker(PID, 1, True, 5)
    with pytest.raises(TransactionCoordinatorFencedError):
        log.append_marker(PID, 2, True, 4)
    assert log.log_end_offset == end  # nothing stored
    # No open transaction: the marker is stored, ends nothing, indexes nothing.
    assert log.append_marker(PID, 2, False, 5) == end
    assert log.aborted_transactions(0, log.log_end_offset) == []
    assert _values(log) == [b"a"]
    log.close()


def test_aborted_transactions_follow_kafkas_fetch_rule_across_segments(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock)
    log.append(txn_batch(PID, 0, 0, [b"a"]))  # 0
    log.roll()
    log.append(txn_batch(OTHER, 0, 0, [b"b"]))  # 1
    log.append_marker(PID, 0, False, 0)  # 2: entry in segment 1, LSO field 1 (OTHER open)
    log.roll()
    log.append_marker(OTHER, 0, False, 0)  # 3: entry in segment 3, LSO field 4
    assert (log_dir / "00000000000000000001.txnindex").exists()
    assert not (log_dir / "00000000000000000000.txnindex").exists()  # created lazily
    assert log.aborted_transactions(0, 1) == [(PID, 0)]  # found in a later segment
    assert log.aborted_transactions(0, 4) == [(PID, 0), (OTHER, 1)]
    assert log.aborted_transactions(3, 4) == [(OTHER, 1)]
    assert _values(log) == []
    log.close()


def _interleaved(log_dir: Path, clock: ManualClock) -> object:
    log = open_log(log_dir, clock, log_config(segment_bytes=400))
    for round_ in range(6):
        log.append(txn_batch(PID, 0, 2 * round_, [b"p%d" % round_]))
        log.append(txn_batch(OTHER, 0, round_, [b"o%d" % round_]))
        log.append(txn_batch(PID, 0, 2 * round_ + 1, [b"q%d" % round_]))
        log.append_marker(PID, 0, round_ % 2 == 0, 0)
        log.append_marker(OTHER, 0, round_ % 3 != 0, 0)
    return log


def _offset_order() -> list[bytes]:
    out = []
    for r in range(6):
        for value, kept in ((b"p%d" % r, r % 2 == 0), (b"o%d" % r, r % 3 != 0)):
            if kept:
                out.append(value)
        if r % 2 == 0:
            out.append(b"q%d" % r)
    return out


def test_reopen_clean_and_unclean_rebuild_the_same_state(log_dir: Path, clock: ManualClock) -> None:
    log = _interleaved(log_dir, clock)
    assert log.segment_count > 3  # type: ignore[attr-defined]
    log.append(txn_batch(PID, 0, 12, [b"open"]))  # type: ignore[attr-defined]
    expected = _offset_order()
    assert _values(log) == expected
    lso = log.last_stable_offset  # type: ignore[attr-defined]
    aborted = log.aborted_transactions(0, lso)  # type: ignore[attr-defined]
    log = reopen_clean(log, clock)  # type: ignore[arg-type]
    assert (_values(log), log.last_stable_offset) == (expected, lso)
    assert log.aborted_transactions(0, lso) == aborted
    # Unclean: every .txnindex is rebuilt from the log (delete them to prove it).
    for path in segment_files(log_dir, ".txnindex"):
        path.write_bytes(path.read_bytes()[:-5])  # torn too
    log = reopen_unclean(log, clock)
    assert (_values(log), log.last_stable_offset) == (expected, lso)
    assert log.aborted_transactions(0, lso) == aborted
    log.append_marker(PID, 0, True, 0)
    assert _values(log) == [*expected, b"open"]
    log.close()


def test_truncation_reopens_transactions_whose_marker_was_cut(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock)
    log.append(txn_batch(PID, 0, 0, [b"a"]))  # 0
    log.append_marker(PID, 0, False, 0)  # 1
    assert log.aborted_transactions(0, 2) == [(PID, 0)]
    log.truncate_to(1)
    assert log.last_stable_offset == 0
    assert log.aborted_transactions(0, 1) == []
    assert log.describe_producers()[0].current_txn_start_offset == 0
    log.append_marker(PID, 0, True, 0)
    assert _values(log) == [b"a"]
    log.close()


def test_retention_deletes_the_index_with_its_segment(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock, log_config(retention_bytes=1))
    log.append(txn_batch(PID, 0, 0, [b"a"]))
    log.append_marker(PID, 0, False, 0)
    log.roll()
    log.append(make_batch([b"later"]))
    assert len(segment_files(log_dir, ".txnindex")) == 1
    assert log.delete_old_segments() == 1
    log.delete_expired_files(force=True)
    assert segment_files(log_dir, ".txnindex") == []
    assert _values(log) == [b"later"]
    log.close()


def test_the_lso_never_falls_below_the_log_start(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    log.append(make_batch([b"a", b"b"]))
    log.append(txn_batch(PID, 0, 0, [b"open"]))  # 2, never ended
    log.append(make_batch([b"c"]))
    assert log.last_stable_offset == 2
    log.increase_log_start_offset(3)  # DeleteRecords past the open transaction's start
    assert log.last_stable_offset == 3
    log.close()


def test_a_follower_stores_markers_and_indexes_aborts(tmp_path: Path, clock: ManualClock) -> None:
    leader = open_log(tmp_path / "events-0", clock)
    follower = open_log(tmp_path / "copy" / "events-0", clock)
    leader.append(txn_batch(PID, 0, 0, [b"a"]))
    leader.append(txn_batch(OTHER, 0, 0, [b"b"]))
    leader.append_marker(PID, 0, False, 0)
    data = leader.read(0, 1 << 20).records
    follower.append_as_follower(data)
    assert follower.last_stable_offset == 1
    assert follower.aborted_transactions(0, 3) == leader.aborted_transactions(0, 3)
    leader.append_marker(OTHER, 0, True, 0)
    follower.append_as_follower(leader.read(3, 1 << 20).records)
    assert _values(follower) == _values(leader) == [b"b"]
    leader.close()
    follower.close()


COMPACT = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@COMPACT
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["plain", "commit", "abort"]), st.integers(0, 3)),
        min_size=1,
        max_size=25,
    )
)
def test_compaction_never_prefers_an_aborted_value(
    tmp_path: Path, steps: list[tuple[str, int]]
) -> None:
    with scratch_dir(tmp_path) as root:
        _compact_and_check(root, steps)


def _compact_and_check(tmp_path: Path, steps: list[tuple[str, int]]) -> None:
    clock = ManualClock(wall_ms=1_700_000_000_000)
    directory = tmp_path / "events-0"
    config = log_config(cleanup_policy="compact", segment_bytes=300, min_cleanable_dirty_ratio=0)
    log = open_log(directory, clock, config)
    latest: dict[bytes, bytes] = {}
    aborted_values: set[bytes] = set()
    sequences = {PID: 0, 100: 0}
    for i, (kind, key_number) in enumerate(steps):
        key, value = b"k%d" % key_number, b"v%d" % i
        pid = 100 if kind == "plain" else PID
        log.append(
            txn_batch(pid, 0, sequences[pid], [value], keys=[key], transactional=kind != "plain")
        )
        sequences[pid] += 1
        if kind != "plain":
            log.append_marker(PID, 0, kind == "commit", 0)
        if kind != "abort":
            latest[key] = value
        else:
            aborted_values.add(value)
    log.roll()
    cleaner = LogCleaner(tmp_path, clock)
    for _ in range(3):  # markers go over later passes, past delete.retention.ms
        cleaner.clean_log(log, force=True)
        seen: dict[bytes, bytes] = {}
        for record in read_committed(log):
            assert record.key is not None
            assert record.value is not None
            seen[record.key] = record.value
        assert seen == latest
        # Aborted records are gone whatever their keys (every segment was below the LSO).
        assert not {r.value for r in read_uncommitted(log)} & aborted_values
        clock.advance(log.config.delete_retention_ms + 1)
    log.close()


def _control_batches(log: PartitionLog) -> list[int]:
    data = log.read(log.log_start_offset, 1 << 20).records
    return [h.base_offset for _, h in iter_batch_headers(data) if h.is_control]


def test_markers_go_once_their_data_is_gone_and_their_horizon_passed(
    log_dir: Path, clock: ManualClock
) -> None:
    config = log_config(cleanup_policy="compact", min_cleanable_dirty_ratio=0)
    log = open_log(log_dir, clock, config)
    log.append(txn_batch(PID, 0, 0, [b"aborted"], keys=[b"k1"]))  # 0
    log.append_marker(PID, 0, False, 0)  # 1
    log.append(txn_batch(PID, 0, 1, [b"old"], keys=[b"k2"]))  # 2
    log.append_marker(PID, 0, True, 0)  # 3
    log.append(txn_batch(PID, 0, 2, [b"new"], keys=[b"k2"]))  # 4
    log.append_marker(PID, 0, True, 0)  # 5
    log.append(make_batch([b"end"], keys=[b"k3"]))  # 6: ends every round
    log.roll()
    cleaner = LogCleaner(log_dir.parent, clock)
    cleaner.clean_log(log, force=True)  # data removed; its markers saw it: kept
    assert _control_batches(log) == [1, 3, 5]
    assert log.aborted_transactions(0, 7) == [(PID, 0)]  # the entry moved with its marker
    cleaner.clean_log(log, force=True)  # no data left: horizons set
    assert _control_batches(log) == [1, 3, 5]
    assert log.aborted_transactions(0, 7) == []
    cleaner.clean_log(log, force=True)  # the horizon has not passed
    assert _control_batches(log) == [1, 3, 5]
    clock.advance(log.config.delete_retention_ms)
    cleaner.clean_log(log, force=True)
    assert _control_batches(log) == [5]  # the live transaction's marker stays
    assert [(r.key, r.value) for r in read_committed(log)] == [(b"k2", b"new"), (b"k3", b"end")]
    log = reopen_clean(log, clock)
    assert _control_batches(log) == [5]
    log.close()


@pytest.mark.parametrize("reopen", ["none", "clean", "unclean"])
def test_an_ended_transactions_sequences_are_no_duplicates_after_a_restart(
    log_dir: Path, clock: ManualClock, reopen: str
) -> None:
    """A transaction's end closes its duplicate window (``storage.producer_state``), and
    the rebuilt table (a snapshot, or a replay after a crash) knows it too: the reused
    sequences are refused with nothing stored, not answered with the aborted offsets."""
    log = open_log(log_dir, clock)
    log.append(txn_batch(PID, 2, 0, [b"aborted-1", b"aborted-2"]))  # 0-1
    log.append_marker(PID, 2, False, 0)  # 2
    if reopen == "clean":
        log = reopen_clean(log, clock)
    elif reopen == "unclean":
        log = reopen_unclean(log, clock)
    end = log.log_end_offset
    with pytest.raises(OutOfOrderSequenceError):
        log.append(txn_batch(PID, 2, 0, [b"lost-1", b"lost-2"]))
    assert log.log_end_offset == end
    log.append(txn_batch(PID, 2, 2, [b"kept"]))
    log.append_marker(PID, 2, True, 0)
    assert _values(log) == [b"kept"]
    log.close()
