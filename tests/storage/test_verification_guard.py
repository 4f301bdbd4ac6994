"""KIP-890's verification guard in a partition log: a transactional batch verified with the
coordinator is appended only if no marker for its producer landed since the verification
began (``storage.producer_state``). The races are driven step by step through the storage
API: take the guard, write the marker a coordinator would write meanwhile, then append."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.storage.conftest import make_batch, open_log
from tests.storage.txn_reader import read_uncommitted, txn_batch
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import InvalidProducerEpochError, InvalidTxnStateError

PID = 7


def test_a_marker_between_verification_and_append_voids_the_verification(
    log_dir: Path, clock: ManualClock
) -> None:
    """Transactions v1: a late Produce of an aborted transaction (verified while the
    transaction was still ongoing) must not open a new transaction at the same epoch."""
    log = open_log(log_dir, clock)
    log.append(txn_batch(PID, 0, 0, [b"first"]))
    log.append_marker(PID, 0, False, 0)  # the first transaction ends: nothing open here

    guard = log.start_verification(PID, 0)
    assert guard is not None
    # The coordinator said yes (the next transaction holds this partition), and then
    # that transaction was aborted before this batch reached the log:
    log.append_marker(PID, 0, False, 0)
    end = log.log_end_offset
    with pytest.raises(InvalidTxnStateError):
        log.append(txn_batch(PID, 0, 1, [b"late"]), verification={PID: guard})
    assert log.log_end_offset == end  # stored nowhere
    assert log.last_stable_offset == log.high_watermark  # no hanging transaction
    log.close()


def test_a_guard_is_good_until_used_or_voided(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    guard = log.start_verification(PID, 0)
    assert guard is not None
    assert log.start_verification(PID, 0) is guard  # a concurrent request shares it
    log.append(txn_batch(PID, 0, 0, [b"a"]), verification={PID: guard})
    # The transaction is open here now: later batches need no guard.
    assert log.start_verification(PID, 0) is None
    log.append(txn_batch(PID, 0, 1, [b"b"]), verification={PID: None})
    # A stale guard (used already) is refused once the transaction has ended.
    log.append_marker(PID, 0, True, 0)
    with pytest.raises(InvalidTxnStateError):
        log.append(txn_batch(PID, 0, 2, [b"c"]), verification={PID: guard})
    # No guard at all for a producer with nothing open: refused.
    with pytest.raises(InvalidTxnStateError):
        log.append(txn_batch(PID, 0, 2, [b"c"]), verification={})
    # A fresh verification is accepted.
    fresh = log.start_verification(PID, 0)
    assert fresh is not None
    assert fresh is not guard
    log.append(txn_batch(PID, 0, 2, [b"c"]), verification={PID: fresh})
    assert [r.value for r in read_uncommitted(log)] == [b"a", b"b", b"c"]
    log.close()


def test_a_marker_landing_on_an_open_transaction_voids_the_sentinel_too(
    log_dir: Path, clock: ManualClock
) -> None:
    """A producer whose transaction was open here needed no guard; if the marker ends that
    transaction before the append, the append needs one and has none."""
    log = open_log(log_dir, clock)
    log.append(txn_batch(PID, 0, 0, [b"a"]))
    assert log.start_verification(PID, 0) is None
    log.append_marker(PID, 0, True, 0)
    with pytest.raises(InvalidTxnStateError):
        log.append(txn_batch(PID, 0, 1, [b"late"]), verification={PID: None})
    log.close()


def test_transactions_v2_keep_the_next_transactions_guard_across_the_bumped_marker(
    log_dir: Path, clock: ManualClock
) -> None:
    """Under v2 the marker carries the epoch the next transaction runs under: a guard the
    producer took at that epoch is its next transaction's, and survives the marker; a
    zombie at the old epoch is refused outright."""
    log = open_log(log_dir, clock)
    log.append(txn_batch(PID, 0, 0, [b"t0"]))
    # The producer's next transaction (epoch 1) verifies before the commit's marker
    # (epoch 1, the bump) lands here.
    guard = log.start_verification(PID, 1, epoch_bump=True)
    assert guard is not None
    log.append_marker(PID, 1, True, 0)
    log.append(txn_batch(PID, 1, 0, [b"t1"]), verification={PID: guard})
    with pytest.raises(InvalidProducerEpochError):
        log.start_verification(PID, 0, epoch_bump=True)
    with pytest.raises(InvalidProducerEpochError):
        log.append(txn_batch(PID, 0, 1, [b"zombie"]), verification={PID: guard})
    # A v1 guard (no epoch bump) at the marker's epoch is void, as before.
    log.append_marker(PID, 1, False, 0)
    v1 = log.start_verification(PID, 1)
    log.append_marker(PID, 1, False, 0)
    with pytest.raises(InvalidTxnStateError):
        log.append(txn_batch(PID, 1, 1, [b"late"]), verification={PID: v1})
    assert [r.value for r in read_uncommitted(log)] == [b"t0", b"t1"]
    log.close()


def test_unverified_appends_and_plain_batches_need_no_guard(
    log_dir: Path, clock: ManualClock
) -> None:
    log = open_log(log_dir, clock)
    log.append(make_batch([b"plain"]), verification={})
    log.append(txn_batch(PID, 0, 0, [b"t"]))  # no verification asked: as before
    log.close()


def test_guards_expire_with_idle_producers(log_dir: Path, clock: ManualClock) -> None:
    log = open_log(log_dir, clock)
    guard = log.start_verification(PID, 0)
    clock.advance(10_001)
    log.expire_producers(10_000)
    with pytest.raises(InvalidTxnStateError):
        log.append(txn_batch(PID, 0, 0, [b"t"]), verification={PID: guard})
    log.close()
