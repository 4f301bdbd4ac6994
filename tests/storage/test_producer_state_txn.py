"""The producer table's transaction rules (Kafka's ``ProducerStateManager``)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.storage.txn_reader import txn_batch
from tidelog.storage.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from tidelog.storage.producer_state import NO_TXN, CompletedTxn, ProducerStateTable
from tidelog.storage.records import read_header


def _append(table: ProducerStateTable, batch: bytes, base_offset: int) -> None:
    header = dataclasses.replace(read_header(batch), base_offset=base_offset)
    assert table.check(header) is None
    table.update(header, 0)


def test_a_transactional_batch_opens_a_transaction_at_its_base_offset() -> None:
    table = ProducerStateTable()
    _append(table, txn_batch(7, 0, 0, [b"a", b"b"]), 10)
    _append(table, txn_batch(7, 0, 2, [b"c"]), 15)
    assert table.ongoing_first_offsets() == {10: 7}
    assert table.first_unstable_offset(100) == 10
    (summary,) = table.describe(7)
    assert summary.current_txn_start_offset == 10


def test_a_plain_batch_inside_an_open_transaction_is_invalid_txn_state() -> None:
    table = ProducerStateTable()
    _append(table, txn_batch(7, 0, 0, [b"a"]), 0)
    plain = read_header(txn_batch(7, 0, 1, [b"b"], transactional=False))
    with pytest.raises(InvalidTxnStateError):
        table.check(plain)
    with pytest.raises(InvalidTxnStateError):
        table.check_all([plain])


def test_a_retry_inside_the_open_transaction_is_a_duplicate() -> None:
    table = ProducerStateTable()
    _append(table, txn_batch(7, 2, 0, [b"a", b"b", b"c"]), 57)  # the transaction's first
    _append(table, txn_batch(7, 2, 3, [b"d", b"e"]), 65)
    for sequence, offset in ((0, 57), (3, 65)):
        retry = read_header(txn_batch(7, 2, sequence, [b"x"] * (3 if sequence == 0 else 2)))
        found = table.check(retry)
        assert found is not None
        assert found.base_offset == offset
        assert table.check_all([retry]) == [found]


@pytest.mark.parametrize("commit", [False, True])
def test_a_transaction_end_closes_its_duplicate_window(commit: bool) -> None:
    """librdkafka after aborting a transaction whose batch a restart left possibly
    persisted: same epoch, the batch's sequences reused by the next transaction. Answered
    as a duplicate, those new records would be lost without a word; they are out of order
    instead (the client fails the transaction)."""
    table = ProducerStateTable()
    _append(table, txn_batch(7, 2, 0, [b"a", b"b", b"c"]), 57)
    table.complete_txn(7, 2, 0, 60, commit=True, timestamp_ms=0)
    _append(table, txn_batch(7, 2, 3, [b"t2.1-11", b"t2.1-12"]), 65)
    table.complete_txn(7, 2, 0, 68, commit=commit, timestamp_ms=0)
    reused = read_header(txn_batch(7, 2, 3, [b"t2.1-15", b"t2.1-16"]))
    with pytest.raises(OutOfOrderSequenceError):
        table.check(reused)
    with pytest.raises(OutOfOrderSequenceError):
        table.check_all([reused])
    # A batch of the earlier transaction likewise (a stale retry), and the next sequence
    # is what follows them all: the sequences go on across transactions (v1).
    with pytest.raises(OutOfOrderSequenceError):
        table.check(read_header(txn_batch(7, 2, 0, [b"a", b"b", b"c"])))
    _append(table, txn_batch(7, 2, 5, [b"next"]), 70)
    # Non-transactional idempotent producers keep their window: no transactions end it.
    plain = ProducerStateTable()
    _append(plain, txn_batch(8, 0, 0, [b"a"], transactional=False), 0)
    again = read_header(txn_batch(8, 0, 0, [b"a"], transactional=False))
    assert plain.check(again) is not None


def test_a_request_opening_a_transaction_gets_no_duplicate_of_an_ended_one() -> None:
    # check_all: the batch that opens the request's transaction has no offsets yet; the
    # window it opens must still exclude the ended transaction's batches.
    table = ProducerStateTable()
    _append(table, txn_batch(7, 2, 0, [b"a", b"b"]), 10)
    table.complete_txn(7, 2, 0, 12, commit=False, timestamp_ms=0)
    first = read_header(txn_batch(7, 2, 2, [b"c"]))
    stale = read_header(txn_batch(7, 2, 0, [b"x", b"y"]))
    with pytest.raises(OutOfOrderSequenceError):
        table.check_all([first, stale])


def test_markers_check_epochs_and_end_the_transaction() -> None:
    table = ProducerStateTable()
    _append(table, txn_batch(7, 3, 0, [b"a"]), 4)
    table.complete_txn(7, 3, 5, 6, commit=True, timestamp_ms=0)  # an empty one before
    _append(table, txn_batch(7, 3, 1, [b"b"]), 8)
    with pytest.raises(InvalidProducerEpochError):
        table.check_marker(7, 2, 5)
    with pytest.raises(TransactionCoordinatorFencedError):
        table.check_marker(7, 3, 4)
    table.check_marker(7, 4, 5)  # transactions v2: the marker carries the bumped epoch
    done = table.complete_txn(7, 4, 5, 9, commit=False, timestamp_ms=0)
    assert done == CompletedTxn(7, 8, 9, aborted=True)
    assert table.ongoing_first_offsets() == {}
    assert table.entry(7) is not None
    assert table.entry(7).epoch == 4  # type: ignore[union-attr]
    # Unreplicated until the high watermark passes the marker.
    assert table.first_unstable_offset(9) == 8
    assert table.first_unstable_offset(10) is None


def test_a_marker_without_an_open_transaction_completes_nothing() -> None:
    table = ProducerStateTable()
    assert table.complete_txn(9, 0, 1, 0, commit=True, timestamp_ms=0) is None
    assert table.first_unstable_offset(0) is None
    (summary,) = table.describe(9)
    assert (summary.current_txn_start_offset, summary.coordinator_epoch) == (NO_TXN, 1)


def test_the_index_lso_is_the_oldest_other_open_transaction() -> None:
    table = ProducerStateTable()
    _append(table, txn_batch(1, 0, 0, [b"a"]), 0)
    _append(table, txn_batch(2, 0, 0, [b"b"]), 1)
    done = table.complete_txn(1, 0, 0, 2, commit=False, timestamp_ms=0)
    assert done is not None
    assert table.last_stable_offset_of(done) == 1
    done = table.complete_txn(2, 0, 0, 3, commit=False, timestamp_ms=0)
    assert done is not None
    assert table.last_stable_offset_of(done) == 4


def test_producers_with_an_open_transaction_never_expire() -> None:
    table = ProducerStateTable()
    _append(table, txn_batch(1, 0, 0, [b"a"]), 0)
    _append(table, txn_batch(2, 0, 0, [b"b"], transactional=False), 1)
    assert table.expire(now_ms=10**12, expiration_ms=1) == 1
    assert [s.producer_id for s in table.describe()] == [1]


def test_snapshots_keep_transactions_and_version_1_still_loads() -> None:
    table = ProducerStateTable()
    _append(table, txn_batch(1, 0, 0, [b"a"]), 0)
    _append(table, txn_batch(2, 0, 0, [b"b"]), 1)
    table.complete_txn(2, 0, 3, 2, commit=True, timestamp_ms=0)
    loaded, offset = ProducerStateTable.from_bytes(table.to_bytes(3))
    assert offset == 3
    assert loaded.describe() == table.describe()
    assert loaded.ongoing_first_offsets() == {0: 1}
    assert loaded.first_unstable_offset(2) == 0
    old = {"version": 1, "offset": 5, "producers": [[4, 1, 7, [[0, 2, 0, 2]]]]}
    v1, offset = ProducerStateTable.from_bytes(json.dumps(old).encode())
    (summary,) = v1.describe()
    assert (offset, summary.producer_id, summary.last_sequence) == (5, 4, 2)
    assert summary.current_txn_start_offset == NO_TXN
    with pytest.raises(ValueError, match="version"):
        ProducerStateTable.from_bytes(json.dumps({**old, "version": 3}).encode())
