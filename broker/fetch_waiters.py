"""Wake-ups for long-polling fetches: a fetch waits on an event, appends set it.

A fetch that found fewer than ``min_bytes`` registers a ``Waiter`` for the partitions it
reads; every append calls ``notify(topic, partition)``, which sets the event of each
waiter registered for that partition. Nothing polls: a waiting fetch costs a blocked
thread and one entry per partition here.

The race between "read found nothing" and "data arrives" is closed by ordering, not by
holding a lock across the read: the fetch registers first, then clears its event, then
reads, then waits. An append that lands after the read sets the event (the waiter was
already registered); one that landed before the read is seen by the read. See
``broker.fetch.FetchEngine.fetch``.

``close`` wakes every waiter and makes later ones return at once, so that a clean shutdown
answers long polls immediately instead of waiting out their ``max_wait_ms``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

__all__ = ["FetchWaiters", "Waiter"]

_TopicPartition = tuple[str, int]


class Waiter:
    """One waiting fetch's wake-up event. Thread-safe."""

    __slots__ = ("_cancelled", "_event")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        """Whether ``cancel`` was called: the fetch should answer now."""
        return self._cancelled

    def cancel(self) -> None:
        """Wake the fetch for good (its call ended); later waits return at once too."""
        self._cancelled = True
        self._event.set()

    def clear(self) -> None:
        """Forget earlier wake-ups; call before reading so none is missed."""
        self._event.clear()

    def wake(self) -> None:
        """Wake the fetch (data arrived or the broker is stopping)."""
        self._event.set()

    def wait(self, timeout_ms: int) -> bool:
        """Block until woken or ``timeout_ms`` passed; True if woken."""
        return self._event.wait(max(timeout_ms, 0) / 1000.0)


class FetchWaiters:
    """Registry of waiting fetches by topic-partition. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_partition: dict[_TopicPartition, set[Waiter]] = {}
        self._closed = False

    @contextmanager
    def register(
        self, partitions: Iterable[_TopicPartition], waiter: Waiter | None = None
    ) -> Iterator[Waiter]:
        """Register ``waiter`` (a new one if None) for ``partitions`` during the ``with``.

        After ``close`` the waiter is born awake, so a fetch never blocks a shutdown.
        """
        if waiter is None:
            waiter = Waiter()
        keys = set(partitions)
        with self._lock:
            if self._closed:
                waiter.wake()
            for key in keys:
                self._by_partition.setdefault(key, set()).add(waiter)
        try:
            yield waiter
        finally:
            with self._lock:
                for key in keys:
                    waiters = self._by_partition.get(key)
                    if waiters is not None:
                        waiters.discard(waiter)
                        if not waiters:
                            del self._by_partition[key]

    def notify(self, topic: str, partition: int) -> None:
        """Wake every fetch waiting on ``topic``-``partition``. Cheap when none waits."""
        with self._lock:
            waiters = self._by_partition.get((topic, partition))
            if not waiters:
                return
            to_wake = list(waiters)
        for waiter in to_wake:
            waiter.wake()

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        with self._lock:
            return self._closed

    def waiting(self) -> int:
        """How many fetches are waiting right now (for the metrics)."""
        with self._lock:
            return len({w for waiters in self._by_partition.values() for w in waiters})

    def close(self) -> None:
        """Wake every waiter now and every later one at once. Idempotent."""
        with self._lock:
            self._closed = True
            to_wake = [w for waiters in self._by_partition.values() for w in waiters]
        for waiter in to_wake:
            waiter.wake()
