"""``RecordFuture``: a ``concurrent.futures.Future`` that shares its condition."""

from __future__ import annotations

import concurrent.futures
import gc
import threading
import time
import weakref

import pytest

from tidelog.client.futures import BatchOutcome, RecordFuture, settle_failure, settle_success
from tidelog.client.types import RecordMetadata
from tidelog.storage.errors import KafkaTimeoutError
from tidelog.storage.native import NATIVE


def _metadata(offset: int) -> RecordMetadata:
    return RecordMetadata("t", 0, offset, 1_000)


def _outcome(count: int, base_offset: int = 0) -> BatchOutcome:
    return BatchOutcome("t", 0, base_offset, -1, [1_000] * count)


def test_it_is_a_concurrent_future_that_cannot_be_cancelled() -> None:
    future = RecordFuture(threading.Condition())
    assert isinstance(future, concurrent.futures.Future)
    assert not future.cancel()
    assert not future.cancelled()
    assert not future.done()
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(timeout=0.01)


def test_settle_success_and_failure() -> None:
    condition = threading.Condition()
    ok = [RecordFuture(condition) for _ in range(3)]
    failed = [RecordFuture(condition) for _ in range(2)]
    settle_success(condition, ok, _outcome(3))
    error = KafkaTimeoutError("expired")
    settle_failure(condition, failed, error)
    assert [f.result(0) for f in ok] == [_metadata(0), _metadata(1), _metadata(2)]
    assert ok[0].exception(0) is None
    assert failed[1].exception(0) is error
    with pytest.raises(KafkaTimeoutError):
        failed[0].result(0)


def test_callbacks_run_once_before_and_after_completion() -> None:
    condition = threading.Condition()
    future = RecordFuture(condition)
    seen: list[object] = []
    future.add_done_callback(lambda f: seen.append(f.result()))
    settle_success(condition, [future], _outcome(1, base_offset=5))
    future.add_done_callback(lambda f: seen.append("late"))
    assert seen == [_metadata(5), "late"]


def test_a_failing_callback_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    condition = threading.Condition()
    future = RecordFuture(condition)

    def bad(_: object) -> None:
        raise RuntimeError("callback bug")

    future.add_done_callback(bad)
    settle_success(condition, [future], _outcome(1, base_offset=1))
    assert "exception calling callback" in caplog.text


def test_waiting_on_one_future_ignores_wakeups_for_others() -> None:
    condition = threading.Condition()
    waited = RecordFuture(condition)
    others = [RecordFuture(condition) for _ in range(20)]
    outcome: list[object] = []

    def wait() -> None:
        outcome.append(waited.result(timeout=5))

    thread = threading.Thread(target=wait)
    thread.start()
    for i, other in enumerate(others):  # every settle wakes the waiter, not for its future
        settle_success(condition, [other], _outcome(1, base_offset=i))
        time.sleep(0.001)
    assert thread.is_alive()
    settle_success(condition, [waited], _outcome(1, base_offset=99))
    thread.join(5)
    assert outcome == [_metadata(99)]


def test_works_with_wait_and_as_completed() -> None:
    condition = threading.Condition()
    futures = [RecordFuture(condition) for _ in range(4)]
    done, pending = concurrent.futures.wait(futures, timeout=0.01)
    assert not done
    assert len(pending) == 4
    timer = threading.Timer(0.05, lambda: settle_success(condition, futures, _outcome(4)))
    timer.start()
    results = sorted(f.result().offset for f in concurrent.futures.as_completed(futures, 5))
    assert results == [0, 1, 2, 3]
    done, pending = concurrent.futures.wait(futures, timeout=1)
    assert len(done) == 4
    assert not pending
    timer.join()


def test_outcome_metadata_for_acks_zero_and_log_append_time() -> None:
    condition = threading.Condition()
    futures = [RecordFuture(condition) for _ in range(2)]
    settle_success(condition, futures, BatchOutcome("t", 3, -1, -1, [7, 8]))
    assert [f.result() for f in futures] == [
        RecordMetadata("t", 3, -1, 7),
        RecordMetadata("t", 3, -1, 8),
    ]
    appended = [RecordFuture(condition) for _ in range(2)]
    settle_success(condition, appended, BatchOutcome("t", 3, 10, 555, [7, 8]))
    assert [f.result() for f in appended] == [
        RecordMetadata("t", 3, 10, 555),
        RecordMetadata("t", 3, 11, 555),
    ]
    assert "RecordMetadata" in repr(appended[1])


def test_settling_a_batch_allocates_nothing_per_record() -> None:
    """A future made by the factory is one object, and settling writes its slots: no
    instance dictionary per record for the collector to track (the producer settles
    hundreds of thousands a second). A waiter or callback still gets its list."""
    condition = threading.Condition()
    make = RecordFuture.factory(condition)
    futures = [make() for _ in range(1_000)]
    watched = futures[7]
    seen: list[RecordMetadata] = []
    watched.add_done_callback(lambda f: seen.append(f.result()))
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        # The factory's futures wait untracked (below) and settling hands them back to
        # the collector: count them as already there.
        before = len(gc.get_objects()) + sum(not gc.is_tracked(f) for f in futures)
        settle_success(condition, futures, _outcome(1_000, base_offset=10))
        grown = len(gc.get_objects()) - before
    finally:
        if was_enabled:
            gc.enable()
    assert grown < 100, grown
    assert [f.result(0).offset for f in futures[:3]] == [10, 11, 12]
    assert all(f.done() for f in futures)
    assert seen == [_metadata(17)]
    assert concurrent.futures.wait(futures, timeout=0).not_done == set()


@pytest.mark.skipif(not NATIVE, reason="the untracked futures come from the C extension")
def test_pending_futures_are_left_out_of_the_collector_until_settled() -> None:
    # A pending future holds nothing that closes a cycle, so it waits for its batch out
    # of the collector's lists (the young-generation passes over hundreds of thousands of
    # futures in flight were ~6% of the producer's CPU); settling tracks it again.
    condition = threading.Condition()
    make = RecordFuture.factory(condition)
    ok, failed = [make() for _ in range(3)], [make() for _ in range(2)]
    assert not any(gc.is_tracked(f) for f in ok + failed)
    settle_success(condition, ok, _outcome(3))
    settle_failure(condition, failed, KafkaTimeoutError("expired"))
    assert all(gc.is_tracked(f) for f in ok + failed)


@pytest.mark.parametrize("outcome", ["success", "failure"])
def test_a_cycle_made_while_pending_is_collected_once_settled(outcome: str) -> None:
    # A callback that refers to its own future, or an attribute set on it, closes a
    # cycle the collector must still find: settling tracks the future again first.
    condition = threading.Condition()
    future = RecordFuture.factory(condition)()
    future.add_done_callback(lambda f, me=future: None)  # future -> callbacks -> future
    future.annotation = future  # type: ignore[attr-defined]  # and through its __dict__
    gone = weakref.ref(future)
    if outcome == "success":
        settle_success(condition, [future], _outcome(1))
    else:
        settle_failure(condition, [future], KafkaTimeoutError("expired"))
    del future
    gc.collect()
    assert gone() is None
