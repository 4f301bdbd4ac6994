"""Sequence numbers and answer decisions of the idempotent producer. Pure."""

from __future__ import annotations

import pytest

from tidelog.client.idempotence import Decision, ResetMode, SequenceTable
from tidelog.client.types import TopicPartition
from tidelog.storage.errors import (
    BrokerUnavailableError,
    InternalError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    StorageError,
)

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)


def _table(producer_id: int = 7) -> SequenceTable:
    table = SequenceTable()
    table.set_producer_id(producer_id, 0)
    return table


def test_no_sends_before_a_producer_id() -> None:
    table = SequenceTable()
    assert table.needs_producer_id
    assert not table.can_send(TP)
    with pytest.raises(RuntimeError):
        table.assign(TP, 1)
    table.set_producer_id(3, 0)
    assert table.can_send(TP)


def test_sequences_count_records_per_partition_and_wrap() -> None:
    table = _table()
    assert table.assign(TP, 5) == (7, 0, 0)
    assert table.assign(TP, 3) == (7, 0, 5)
    assert table.assign(OTHER, 2) == (7, 0, 0)
    table._partitions[TP].next_sequence = 2**31 - 2  # near the int32 edge
    assert table.assign(TP, 4)[2] == 2**31 - 2
    assert table.assign(TP, 1)[2] == 2  # wrapped as Kafka's sequences do


def test_retriable_errors_retry_with_the_same_sequence() -> None:
    table = _table()
    _, _, sequence = table.assign(TP, 1)
    error = BrokerUnavailableError("down")
    assert table.decide_error(TP, 7, sequence, error, can_retry=True) is Decision.RETRY
    assert table.reset_mode(TP) is None


def test_out_of_order_behind_a_missing_batch_is_retried() -> None:
    table = _table()
    table.assign(TP, 2)  # 0-1
    _, _, second = table.assign(TP, 2)  # 2-3: the broker has not stored 0-1 yet
    error = OutOfOrderSequenceError("expected 0")
    assert table.decide_error(TP, 7, second, error, can_retry=True) is Decision.RETRY


def test_out_of_order_for_the_next_expected_batch_fails_it_and_starts_over() -> None:
    table = _table()
    _, _, first = table.assign(TP, 2)
    table.acked(TP, 7, 1)
    _, _, second = table.assign(TP, 2)  # 2-3 is exactly what comes next
    _, _, third = table.assign(TP, 2)
    error = OutOfOrderSequenceError("broker lost its state")
    assert table.decide_error(TP, 7, second, error, can_retry=True) is Decision.FAIL
    assert table.reset_mode(TP) is ResetMode.RESEQUENCE
    assert not table.can_send(TP)
    # The batch after it cannot have been stored: it gets new sequences.
    assert table.decide_error(TP, 7, third, error, can_retry=True) is Decision.REQUEUE_FRESH
    assert first == 0


def test_a_batch_refused_for_good_makes_its_followers_resequence() -> None:
    table = _table()
    _, _, first = table.assign(TP, 1)
    _, _, second = table.assign(TP, 1)
    too_large = RecordTooLargeError("too large")
    assert table.decide_error(TP, 7, first, too_large, can_retry=True) is Decision.FAIL
    behind = OutOfOrderSequenceError("expected 0")
    assert table.decide_error(TP, 7, second, behind, can_retry=True) is Decision.REQUEUE_FRESH


def test_a_storage_error_is_retried_with_the_same_sequence() -> None:
    # A leader answers it when its log went away before the fsync (a reassignment): the
    # batch may be stored, on the next leader too, which recognises the same sequence.
    table = _table()
    _, _, first = table.assign(TP, 1)
    error = StorageError("the broker stopped before the fsync")
    assert table.decide_error(TP, 7, first, error, can_retry=True) is Decision.RETRY
    assert table.reset_mode(TP) is None


def test_a_final_error_after_the_append_fails_the_followers_instead_of_resending() -> None:
    table = _table()
    _, _, first = table.assign(TP, 1)
    _, _, second = table.assign(TP, 1)
    internal = InternalError("unexpected")
    assert table.decide_error(TP, 7, first, internal, can_retry=True) is Decision.FAIL
    assert table.reset_mode(TP) is ResetMode.FAIL
    assert table.decide_error(TP, 7, second, internal, can_retry=True) is Decision.FAIL


def test_out_of_retries_with_an_unknown_outcome_fails_the_followers_too() -> None:
    table = _table()
    _, _, first = table.assign(TP, 1)
    _, _, second = table.assign(TP, 1)
    timeout = BrokerUnavailableError("down")
    assert table.decide_error(TP, 7, first, timeout, can_retry=False) is Decision.FAIL
    assert table.reset_mode(TP) is ResetMode.FAIL
    # Resending the follower under a new identity could store it twice: it fails too.
    assert table.decide_error(TP, 7, second, timeout, can_retry=True) is Decision.FAIL


def test_finishing_a_reset_needs_a_fresh_producer_id_for_that_partition_only() -> None:
    table = _table()
    table.assign(TP, 1)
    table.assign(OTHER, 1)
    table.expired(TP, 7, 0)
    assert table.resetting() == [TP]
    table.finish_reset(TP)
    assert table.needs_producer_id
    assert not table.can_send(TP)
    assert table.can_send(OTHER)  # keeps its identity and sequences
    assert table.assign(OTHER, 1) == (7, 0, 1)
    table.set_producer_id(8, 0)
    assert table.assign(TP, 1) == (8, 0, 0)


def test_answers_from_a_left_behind_identity_do_not_touch_the_new_one() -> None:
    table = _table()
    table.assign(TP, 1)
    table.expired(TP, 7, 0)
    table.finish_reset(TP)
    table.set_producer_id(8, 0)
    table.assign(TP, 1)
    table.acked(TP, 7, 0)  # a late answer for the old identity
    assert table._partitions[TP].last_acked == -1


def test_without_sequences_only_retriability_counts() -> None:
    table = SequenceTable()
    down = BrokerUnavailableError("down")
    assert table.decide_error(TP, -1, -1, down, can_retry=True) is Decision.RETRY
    assert table.decide_error(TP, -1, -1, down, can_retry=False) is Decision.FAIL
    too_large = RecordTooLargeError("x")
    assert table.decide_error(TP, -1, -1, too_large, can_retry=True) is Decision.FAIL
