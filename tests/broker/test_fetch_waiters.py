"""FetchWaiters: appends wake the fetches waiting on their partition, and only those."""

from __future__ import annotations

import threading

from broker.fetch_waiters import FetchWaiters, Waiter


def test_notify_wakes_waiters_of_that_partition_only() -> None:
    waiters = FetchWaiters()
    with (
        waiters.register([("a", 0), ("b", 1)]) as on_a_and_b,
        waiters.register([("a", 1)]) as on_a1,
    ):
        assert waiters.waiting() == 2
        waiters.notify("b", 1)
        assert on_a_and_b.wait(0)
        assert not on_a1.wait(0)
        waiters.notify("c", 0)  # nobody waits: cheap no-op
    assert waiters.waiting() == 0


def test_clear_forgets_earlier_wakeups() -> None:
    waiters = FetchWaiters()
    with waiters.register([("a", 0)]) as waiter:
        waiters.notify("a", 0)
        waiter.clear()
        assert not waiter.wait(0)


def test_a_wakeup_from_another_thread_ends_the_wait() -> None:
    waiters = FetchWaiters()
    with waiters.register([("a", 0)]) as waiter:
        thread = threading.Thread(target=waiters.notify, args=("a", 0))
        thread.start()
        assert waiter.wait(5_000)
        thread.join(5)


def test_close_wakes_everyone_now_and_later() -> None:
    waiters = FetchWaiters()
    with waiters.register([("a", 0)]) as before:
        waiters.close()
        assert before.wait(0)
    assert waiters.closed
    with waiters.register([("a", 0)]) as after:
        assert after.wait(0)


def test_cancel_is_sticky_and_a_given_waiter_is_reused() -> None:
    waiters = FetchWaiters()
    mine = Waiter()
    with waiters.register([("a", 0)], mine) as registered:
        assert registered is mine
        mine.cancel()
        mine.clear()
        assert mine.cancelled
    assert waiters.waiting() == 0
