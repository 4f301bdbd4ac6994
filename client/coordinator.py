"""The consumer's group I/O: the heartbeat thread, and the offset commit and fetch calls.

``ConsumerCoordinator`` is the thin shell around the pure ``GroupMembership``
(``client.group_member``): one daemon thread sends the heartbeats the membership asks for
(one in flight at most, each a unary ``ConsumerGroupHeartbeat`` with a deadline), feeds
it the answers, and queues the resulting ``MemberEvent``\\ s. It never runs application
code: the ``Consumer`` takes the events in ``poll`` (``take_events``), runs the rebalance
callbacks on the application's thread, and reports finished revocations back
(``revocation_done``), which makes the next heartbeat go at once. ``wakeup`` (given by
the consumer) is called, without this object's lock held, when events arrive, so a
``poll`` that is waiting for records runs them promptly (``poll`` checks ``has_news``
under its own lock before it sleeps, so a wake-up sent while it was busy is not lost).
It counts the ``lose`` events it queued (``losses``): until the application ran as many,
the consumer refuses commits.

Thread-safe: one lock guards the membership and the event queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from tidelog.client.errors import ClosedError
from tidelog.client.group_member import (
    GroupMembership,
    HeartbeatRequest,
    MemberEvent,
    MemberState,
)
from tidelog.client.routing import ROUTING_ERRORS, ClusterConnections
from tidelog.client.types import TopicPartition
from tidelog.storage.errors import (
    FencedInstanceIdError,
    FencedMemberEpochError,
    InternalError,
    TidelogError,
    UnknownMemberIdError,
    UnreleasedInstanceIdError,
)

__all__ = ["ConsumerCoordinator"]

log = logging.getLogger(__name__)


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class ConsumerCoordinator:
    """Group membership of one consumer: heartbeat thread and event queue. Thread-safe.

    Args:
        connections: the consumer's connections (shared; this object never closes them);
            heartbeats go to the group's coordinator and follow it when it moves.
        group_id: the group to join.
        client_id: reported to the broker (``describe_group`` shows it).
        subscription: the topics.
        session_timeout_ms, rebalance_timeout_ms: sent with every heartbeat (the broker
            clamps the session timeout to its bounds).
        max_poll_interval_ms: leave the group (the partitions are lost) when ``polled``
            was not called for this long; rejoin at the next ``polled``.
        request_timeout_ms: the deadline of one heartbeat (at most the session timeout).
        retry_backoff_ms: the first backoff after a failed heartbeat.
        wakeup: called (from the heartbeat thread) when events are queued.
        group_instance_id: a static member's instance id (``client.group_member``).
    """

    def __init__(
        self,
        connections: ClusterConnections,
        *,
        group_id: str,
        client_id: str,
        subscription: Iterable[str],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        max_poll_interval_ms: int,
        request_timeout_ms: int,
        retry_backoff_ms: int,
        wakeup: Callable[[], None],
        group_instance_id: str | None = None,
    ) -> None:
        self.group_id = group_id
        self._connections = connections
        self._client_id = client_id
        self._session_timeout_ms = session_timeout_ms
        self._rebalance_timeout_ms = rebalance_timeout_ms
        self._max_poll_interval_ms = max_poll_interval_ms
        self._call_timeout_ms = max(min(request_timeout_ms, session_timeout_ms), 1)
        self._wakeup = wakeup
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._membership = GroupMembership(
            subscription,
            session_timeout_ms=session_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            now_ms=_monotonic_ms(),
            max_poll_interval_ms=max_poll_interval_ms,
            instance_id=group_instance_id,
        )
        self._events: deque[MemberEvent] = deque()
        self._losses = 0  # "lose" events queued so far (the application counts those it ran)
        self._finished_heartbeats = 0  # answered or failed
        self._error: TidelogError | None = None  # a heartbeat refused for good, to raise once
        self._stopped = False
        self._thread = threading.Thread(
            target=self._run, name=f"tidelog-heartbeat-{client_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    # --- for the application thread -------------------------------------------------------

    def take_events(self) -> list[MemberEvent]:
        """The events queued since the last call, oldest first."""
        with self._lock:
            events = list(self._events)
            self._events.clear()
            return events

    def put_back(self, events: list[MemberEvent]) -> None:
        """Queue taken events again, ahead of the rest (a step was interrupted)."""
        with self._lock:
            self._events.extendleft(reversed(events))

    def has_news(self) -> bool:
        """Events or an error wait for the application (``poll`` must not sleep)."""
        with self._lock:
            return bool(self._events) or self._error is not None

    def losses(self) -> int:
        """How many ``lose`` events were queued so far (taken or not)."""
        with self._lock:
            return self._losses

    def polled(self) -> None:
        """The application is polling (it is alive); rejoin if it was away too long."""
        with self._lock:
            self._membership.polled(_monotonic_ms())
            self._changed.notify_all()

    def take_error(self) -> TidelogError | None:
        """A non-retriable heartbeat error (e.g. ``INVALID_REQUEST``) since the last call.

        The coordinator keeps trying (with backoff) regardless; this only lets ``poll``
        tell the application once, instead of returning nothing forever.
        """
        with self._lock:
            error, self._error = self._error, None
            return error

    def revocation_done(self, partitions: Iterable[TopicPartition], generation: int) -> None:
        """``on_revoke`` ran for ``partitions``: report them released at once."""
        with self._lock:
            self._membership.revocation_done(partitions, generation, _monotonic_ms())
            self._changed.notify_all()

    def set_subscription(self, topics: Iterable[str]) -> None:
        with self._lock:
            self._membership.set_subscription(topics, _monotonic_ms())
            self._changed.notify_all()

    def member(self) -> tuple[str, int]:
        """``(member_id, member_epoch)`` for a commit (epoch 0 while joining)."""
        with self._lock:
            return self._membership.member_id, self._membership.member_epoch

    def owned(self) -> set[TopicPartition]:
        with self._lock:
            return set(self._membership.owned)

    def wait_for_heartbeat(self, timeout_ms: int) -> bool:
        """Send a heartbeat now (after the one in flight) and wait for it to finish.

        Returns False if ``timeout_ms`` passed first or the coordinator stopped.
        """
        deadline = _monotonic_ms() + max(timeout_ms, 0)
        with self._lock:
            # The one in flight may have left before the change we wait for: wait for two.
            target = self._finished_heartbeats + (2 if self._membership.in_flight else 1)
            self._membership.request_heartbeat(_monotonic_ms())
            self._changed.notify_all()
            while self._finished_heartbeats < target and not self._stopped:
                remaining = deadline - _monotonic_ms()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._changed.wait(remaining / 1000)
            return self._finished_heartbeats >= target

    def leave(self, timeout_ms: int) -> None:
        """Leave the group (heartbeat with epoch -1) and stop the thread.

        Waits at most ``timeout_ms``; errors are logged (the session expires anyway).
        Queued events are dropped: the caller revoked what it holds before.
        """
        deadline = _monotonic_ms() + max(timeout_ms, 0)
        with self._lock:
            self._membership.leave(_monotonic_ms())
            self._events.clear()
            self._changed.notify_all()
            while self._membership.state is not MemberState.LEFT and self._thread.is_alive():
                remaining = deadline - _monotonic_ms()
                if remaining <= 0:
                    log.warning("group %s: no answer to leaving in time", self.group_id)
                    break
                self._changed.wait(remaining / 1000)
        self.stop(max(deadline - _monotonic_ms(), 0))

    def stop(self, timeout_ms: int = 0) -> None:
        """Stop the heartbeat thread (a heartbeat in flight ends by its deadline)."""
        with self._lock:
            self._stopped = True
            self._changed.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_ms / 1000)

    # --- the heartbeat thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                next_request = self._next_request()
                if next_request is None:
                    return
                events = self._send(*next_request)
                with self._lock:
                    self._queue_locked(events)
                    self._finished_heartbeats += 1
                    self._changed.notify_all()
                if events or self._error is not None:
                    self._wakeup()
        except Exception as exc:
            log.exception("group %s: heartbeat thread failed", self.group_id)
            # Nobody heartbeats for this member any more: its partitions are as good as
            # lost. Tell the application (on_lost, then the error from poll) rather than
            # let it read partitions the broker will soon hand to someone else.
            with self._lock:
                try:
                    lost = self._membership.on_fenced(_monotonic_ms())
                except Exception:
                    log.exception("group %s: dropping the partitions failed", self.group_id)
                    lost = []
                self._queue_locked(lost)
                self._error = InternalError(
                    f"the heartbeat thread of group {self.group_id} failed: {exc!r}"
                )
            self._wakeup()
        finally:
            with self._lock:
                self._stopped = True
                self._changed.notify_all()

    def _next_request(self) -> tuple[HeartbeatRequest, int] | None:
        """The next heartbeat and its deadline (ms), once due; None to stop."""
        membership = self._membership
        while True:
            with self._lock:
                if self._stopped or membership.state is MemberState.LEFT:
                    return None
                now = _monotonic_ms()
                events = membership.check_poll_interval(now)
                if events:
                    log.warning(
                        "group %s: not polled for %d ms (max_poll_interval_ms): leaving",
                        self.group_id,
                        self._max_poll_interval_ms,
                    )
                    self._queue_locked(events)
                else:
                    request = membership.start_heartbeat(now)
                    if request is not None:
                        timeout_ms = self._call_timeout_ms
                        session_deadline = membership.session_deadline_ms()
                        if session_deadline is not None:  # fail by the broker's expiry
                            timeout_ms = max(min(timeout_ms, session_deadline - now), 1)
                        return request, timeout_ms
                    wake = membership.next_wakeup_ms()
                    # None: out of the group until the application polls (it notifies).
                    self._changed.wait(None if wake is None else max(wake - now, 1) / 1000)
                    continue
            self._wakeup()

    def _queue_locked(self, events: list[MemberEvent]) -> None:
        self._events.extend(events)
        self._losses += sum(event.kind == "lose" for event in events)

    def _send(self, request: HeartbeatRequest, timeout_ms: int) -> list[MemberEvent]:
        connections = self._connections
        try:
            answer = connections.coordinator(self.group_id, timeout_ms).heartbeat(
                self.group_id,
                request,
                client_id=self._client_id,
                rebalance_timeout_ms=self._rebalance_timeout_ms,
                session_timeout_ms=self._session_timeout_ms,
                timeout_ms=timeout_ms,
            )
        except (UnknownMemberIdError, FencedMemberEpochError) as exc:
            with self._lock:
                lost = self._membership.owned.copy()
                # Queued with the generation change, under one lock: whoever sees the new
                # generation sees the "lose" step too (a revocation still queued is then
                # known to be overtaken, and runs no on_revoke and no commit).
                self._queue_locked(self._membership.on_fenced(_monotonic_ms()))
            log.warning(
                "group %s: %s; rejoining (%d partition(s) lost)", self.group_id, exc, len(lost)
            )
            self._wakeup()
            return []
        except FencedInstanceIdError as exc:
            # Another consumer runs with our instance id: it has the partitions now. Stop
            # for good and tell the application (on_lost, then the error from poll).
            with self._lock:
                self._queue_locked(self._membership.on_instance_fenced(_monotonic_ms()))
                self._error = exc
            log.error("group %s: %s; stopped", self.group_id, exc)
            self._wakeup()
            return []
        except UnreleasedInstanceIdError as exc:
            # Our previous incarnation did not leave (it crashed): its session ends soon
            # and the broker frees the instance id. Retry until then.
            log.info("group %s: %s; retrying", self.group_id, exc)
            with self._lock:
                return self._membership.on_failure(_monotonic_ms())
        except ClosedError as exc:
            with self._lock:
                if self._stopped or self._connections.closed:
                    self._stopped = True
                    return []
                # Not our doing: the broker (or a proxy) cancelled the call, e.g. while
                # shutting down. Stopping here would leave the application reading
                # partitions nobody heartbeats for; retry like any transient failure.
                log.info("group %s: heartbeat cancelled: %s", self.group_id, exc)
                return self._membership.on_failure(_monotonic_ms())
        except TidelogError as exc:
            if isinstance(exc, ROUTING_ERRORS):
                # NOT_COORDINATOR, its broker gone, or its partition without a leader:
                # find the coordinator again for the next heartbeat (after the backoff).
                connections.forget_coordinator(self.group_id)
                connections.mark_stale()
            level = logging.INFO if exc.retriable else logging.WARNING
            log.log(level, "group %s: heartbeat failed: %s", self.group_id, exc)
            with self._lock:
                if not exc.retriable:
                    self._error = exc
                return self._membership.on_failure(_monotonic_ms())
        with self._lock:
            events = self._membership.on_answer(answer, _monotonic_ms())
        for event in events:
            log.info(
                "group %s: %s %s",
                self.group_id,
                event.kind,
                ", ".join(str(tp) for tp in event.partitions),
            )
        return events
