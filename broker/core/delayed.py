"""Delayed operations: Kafka's purgatory. Answer now, or park the request without a thread.

A request that cannot be answered yet (a long-poll fetch that found fewer than
``min_bytes``; an ``acks=all`` produce whose batches are not fsynced yet) becomes a
``DelayedOperation`` and is parked in a ``Purgatory``, watched under the keys of the
partitions it depends on. Nothing waits on its behalf: it completes when

- an event on one of its keys makes it satisfiable: the code that caused the event calls
  ``check_and_complete(key)`` (an append for fetches; the group fsync for produces; later
  high-watermark moves for both), which asks each operation watched there
  ``is_satisfied_by(key)`` (``is_satisfied()`` unless the operation can answer for one
  key alone) and completes those that are;
- its deadline passes: the purgatory's timer (a heap ordered by deadline, driven by one
  reaper thread per purgatory, or by ``expire_due`` in tests on a manual clock) completes
  it with ``expired`` set;
- the purgatory closes (a clean shutdown answers everything that waits at once).

Or it is cancelled (``cancel``): its call ended, and nobody is left to answer. Completion
and cancellation are exclusive and happen once: the first of them wins, atomically.

``on_complete`` runs exactly once, on the thread that completed the operation (an
appending thread, the fsync thread or the reaper), outside the purgatory's lock. It must
therefore be short and must not block: listeners pass a callback that hands the result to
their own event loop or thread (``loop.call_soon_threadsafe``, ``Event.set``).

The race "checked, not satisfied" / "the event happens" / "watched" is closed the way
Kafka's ``tryCompleteElseWatch`` closes it: check, watch, check again. An event after the
watch finds the operation in the watch list; one before it is seen by the second check.

Memory: a completed or cancelled operation is removed from its watch lists at once; its
timer entry stays in the heap until its deadline (or until the heap is rebuilt when more
than half of it is dead), so a purgatory holds O(waiting operations) entries.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable
from typing import Any, Generic, TypeVar

from tidelog.storage.clock import Clock

__all__ = ["DelayedOperation", "DelayedOperations", "Purgatory"]

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

# The reaper re-reads the clock at least this often (real time): an injected manual clock
# moves without telling anyone, and a deadline registered while it slept must be seen.
_REAPER_MAX_SLEEP_MS = 200
_REBUILD_MIN_HEAP = 1_024  # never bother rebuilding a small heap


class DelayedOperation(ABC):
    """One parked request. Thread-safe: completion and cancellation are atomic.

    Subclasses implement ``is_satisfied`` (may it complete now?) and ``on_complete``
    (deliver the answer; runs once). ``deadline_ms`` None means no timer: only an event,
    a cancel or the purgatory closing ends it.
    """

    __slots__ = ("_done", "_expired", "_keys", "_lock", "_watched", "deadline_ms")

    def __init__(self, deadline_ms: int | None) -> None:
        self.deadline_ms = deadline_ms
        self._lock = threading.Lock()
        self._done = False
        self._expired = False
        self._keys: tuple[Any, ...] = ()  # the keys of the purgatory that watches it
        self._watched = False  # counted in its purgatory's parked operations

    @abstractmethod
    def is_satisfied(self) -> bool:
        """Whether the operation can complete now. Cheap, non-blocking, no lock held."""

    def is_satisfied_by(self, key: Any) -> bool:
        """Whether an event on ``key`` (one of the operation's keys) let it complete: by
        default ``is_satisfied``. An operation watched under many keys whose satisfaction
        is per key overrides it, so one event costs one key's check, not all of them
        (a follower's fetch parks under every partition of its session: a failover's
        1,667 new leaderships each checked all 3,333 of it)."""
        return self.is_satisfied()

    @abstractmethod
    def on_complete(self) -> None:
        """Deliver the result (``expired`` says why it ran). Called once; must not block."""

    @property
    def done(self) -> bool:
        """Completed or cancelled."""
        return self._done

    @property
    def expired(self) -> bool:
        """Completed because its deadline passed (or its purgatory closed)."""
        return self._expired

    def force_complete(self, *, expired: bool = False) -> bool:
        """Complete now unless already done; True if this call completed it."""
        with self._lock:
            if self._done:
                return False
            self._done = True
            self._expired = expired
        try:
            self.on_complete()
        except Exception:
            log.exception("a delayed operation failed to deliver its answer")
        return True

    def _cancel(self) -> bool:
        with self._lock:
            if self._done:
                return False
            self._done = True
            return True


class Purgatory(Generic[K]):
    """Parked operations by key, with a timer. Thread-safe.

    Build, then ``start`` the reaper thread (or drive ``expire_due`` by hand in tests);
    ``close`` once.

    Args:
        name: for the reaper thread's name and the logs.
        clock: deadlines are on ``clock.monotonic_ms()``.
    """

    def __init__(self, name: str, clock: Clock) -> None:
        self.name = name
        self._clock = clock
        self._lock = threading.Condition()  # guards everything below
        self._watchers: dict[K, set[DelayedOperation]] = {}
        self._timers: list[tuple[int, int, DelayedOperation]] = []
        self._sequence = itertools.count()
        # The latest event's stamp (``check_and_complete``; ``stamp``): each event takes
        # a new one from ``_stamps`` before it looks for watchers.
        self._stamps = itertools.count(1)
        self._stamp = 0
        self._parked = 0  # operations watched and not done
        self._closed = False
        self._reaper: threading.Thread | None = None

    # --- parking ------------------------------------------------------------------------

    @property
    def stamp(self) -> int:
        """The latest event's stamp: unchanged since a caller read it, no
        ``check_and_complete`` began meanwhile (``try_complete_else_watch``'s
        ``quiet_since``)."""
        return self._stamp

    def try_complete_else_watch(
        self, operation: DelayedOperation, keys: Iterable[K], *, quiet_since: int | None = None
    ) -> bool:
        """Complete ``operation`` now if it can; otherwise park it under ``keys``.

        ``quiet_since``: the ``stamp`` read before the state the operation compares with
        was taken. While the stamp is still that, no event began since, so nothing the
        operation watches moved (every change is followed by its event, which stamps
        before it looks for watchers): its checks here are skipped. A parked fetch of
        3,333 partitions (a follower's session, issue #34) walked them all twice here,
        twice a second per follower, on the event loop.

        Returns True if it completed (here, or concurrently before this returned); False
        if it is parked. After ``close`` it completes at once as expired.
        """
        if self._stamp != quiet_since and operation.is_satisfied() and operation.force_complete():
            return True
        watched = tuple(dict.fromkeys(keys))
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                operation._keys = watched
                operation._watched = True
                for key in watched:
                    self._watchers.setdefault(key, set()).add(operation)
                self._parked += 1
                if operation.deadline_ms is not None:
                    heapq.heappush(
                        self._timers, (operation.deadline_ms, next(self._sequence), operation)
                    )
                    if self._timers[0][2] is operation:
                        self._lock.notify()  # an earlier deadline than the reaper sleeps for
        if closed:
            operation.force_complete(expired=True)
            return True
        # Check again: an event between the first check and the watch found no watcher
        # (an event stamps before it looks: if the stamp is unchanged now, any event
        # after this point finds the watch).
        if self._stamp != quiet_since and operation.is_satisfied() and operation.force_complete():
            self._unwatch(operation)
            return True
        if operation.done:  # completed concurrently by an event or the timer
            self._unwatch(operation)
            return True
        return False

    def check_and_complete(self, key: K) -> int:
        """Complete every operation watched under ``key`` that is satisfied now.

        Called by whatever changes the state the key stands for (an append, an fsync).
        Cheap when nothing waits there. Returns how many completed.
        """
        self._stamp = next(self._stamps)  # before the lookup (``try_complete_else_watch``)
        with self._lock:
            watchers = self._watchers.get(key)
            if not watchers:
                return 0
            candidates = list(watchers)
        completed = 0
        for operation in candidates:
            if not operation.done and operation.is_satisfied_by(key) and operation.force_complete():
                completed += 1
                self._unwatch(operation)
        return completed

    def cancel(self, operation: DelayedOperation) -> bool:
        """Forget ``operation`` without completing it (its call ended). True if it was
        still waiting."""
        if not operation._cancel():
            return False
        self._unwatch(operation)
        return True

    def _unwatch(self, operation: DelayedOperation) -> None:
        with self._lock:
            if not operation._watched:
                return
            operation._watched = False
            keys, operation._keys = operation._keys, ()
            self._parked -= 1
            for key in keys:
                watchers = self._watchers.get(key)
                if watchers is not None:
                    watchers.discard(operation)
                    if not watchers:
                        del self._watchers[key]

    # --- the timer ----------------------------------------------------------------------

    def expire_due(self, now_ms: int | None = None) -> int:
        """Complete (as expired) every operation whose deadline is at or before
        ``now_ms`` (the clock's time if None). Returns how many expired."""
        now = self._clock.monotonic_ms() if now_ms is None else now_ms
        due = []
        with self._lock:
            while self._timers and self._timers[0][0] <= now:
                _, _, operation = heapq.heappop(self._timers)
                if not operation.done:
                    due.append(operation)
            self._maybe_rebuild_locked()
        expired = 0
        for operation in due:
            if operation.force_complete(expired=True):
                expired += 1
            self._unwatch(operation)
        return expired

    def _maybe_rebuild_locked(self) -> None:
        # Cancelled and completed operations leave their timer entry behind; drop them
        # when they are most of the heap, so memory follows the waiting operations.
        if len(self._timers) > _REBUILD_MIN_HEAP and len(self._timers) > 2 * self._parked:
            self._timers = [entry for entry in self._timers if not entry[2].done]
            heapq.heapify(self._timers)

    def _sleep_until_due(self) -> bool:
        """Sleep until the next deadline (or a new earlier one, or close); True if closed."""
        with self._lock:
            if self._closed:
                return True
            sleep_ms = _REAPER_MAX_SLEEP_MS
            if self._timers:
                sleep_ms = min(sleep_ms, self._timers[0][0] - self._clock.monotonic_ms())
            if sleep_ms > 0:
                self._lock.wait(sleep_ms / 1000.0)
            return self._closed

    def start(self) -> None:
        """Start the reaper thread that expires operations at their deadlines."""
        with self._lock:
            if self._reaper is not None or self._closed:
                return
            self._reaper = threading.Thread(
                target=self._reap, name=f"tidelog-purgatory-{self.name}", daemon=True
            )
            self._reaper.start()

    def _reap(self) -> None:
        while not self._sleep_until_due():
            try:
                self.expire_due()
            except Exception:  # never let the timer die: every parked call depends on it
                log.exception("purgatory %s: expiring operations failed", self.name)

    # --- state --------------------------------------------------------------------------

    def parked(self) -> int:
        """How many operations wait now (for the metrics)."""
        with self._lock:
            return self._parked

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        with self._lock:
            return self._closed

    def close(self) -> None:
        """Complete everything that waits (as expired), now and from now on; stop the
        reaper. Idempotent."""
        with self._lock:
            self._closed = True
            waiting = {op for ops in self._watchers.values() for op in ops}
            self._lock.notify_all()
            reaper = self._reaper
        for operation in waiting:
            operation.force_complete(expired=True)
            self._unwatch(operation)
        if reaper is not None and reaper is not threading.current_thread():
            reaper.join(5.0)


class DelayedOperations:
    """The broker's purgatories of partition-keyed operations: parked fetches, ``acks=all``
    produces and DeleteRecords waiting for the followers' log starts (Kafka's
    ``DelayedOperations``, which a ``Partition`` asks to re-check what is parked on it).
    Built before the partition registry, whose listener ``check_and_complete_all`` is; the
    core starts and closes them. Thread-safe."""

    def __init__(self, clock: Clock) -> None:
        self.fetch: Purgatory[tuple[str, int]] = Purgatory("fetch", clock)
        self.produce: Purgatory[tuple[str, int]] = Purgatory("produce", clock)
        self.delete_records: Purgatory[tuple[str, int]] = Purgatory("delete-records", clock)

    def check_and_complete_all(self, topic: str, partition: int) -> None:
        """A high watermark, ISR, leadership or log start moved: re-check the produces,
        the fetches and the DeleteRecords parked on the partition."""
        self.produce.check_and_complete((topic, partition))
        self.fetch.check_and_complete((topic, partition))
        self.delete_records.check_and_complete((topic, partition))
