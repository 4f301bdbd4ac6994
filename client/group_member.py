"""A consumer's side of group membership, as a pure state machine (``docs/groups.md``).

``GroupMembership`` decides, from the answers of ``ConsumerGroupHeartbeat`` and the
clock it is given (``now_ms``), when to heartbeat, what each heartbeat says, and what the
application must do: revoke, assign or lose partitions. It does no I/O and starts no
thread; ``client.coordinator`` is the shell that sends the heartbeats it asks for, and the
``Consumer`` runs the resulting ``MemberEvent``\\ s (the rebalance callbacks) on the
application's thread inside ``poll``.

Partitions, as seen from here:

- ``owned``: everything the member holds and reports in ``owned_partitions``. A granted
  partition is owned from the answer that granted it (the broker gives it to no one else
  until we report it released); a revoked one stays owned until the application says
  ``revocation_done``: only then may the next heartbeat leave it out, so a partition is
  never reported released before ``on_revoke`` has run and committed.
- ``revoking`` (a subset of ``owned``): revocations handed to the application and not yet
  done. A partition revoked and then granted again (the broker keeps a revoked partition
  that is back in the target) is revoked first, then assigned again by a later answer:
  the callbacks always alternate ``on_assign``/``on_revoke`` per partition.

Each ``lose`` (fencing, or no heartbeat answered for the session timeout) starts a new
``generation``: every event carries the generation it belongs to, and a
``revocation_done`` of an older generation is ignored (those partitions were already
given up as lost).

Liveness of the application (Kafka's ``max.poll.interval.ms``): the shell reports every
``poll`` (``polled``); a member whose application has not polled for
``max_poll_interval_ms`` gives up its partitions (a ``lose`` event: they go to the other
members, and the application may be stuck, so nothing is committed) and leaves the
group, then rejoins at its next ``poll``. Without this, a hung application would keep
its partitions, heartbeating, for ever.

Static membership (``instance_id``, Kafka's ``group.instance.id``): the member names its
instance in every heartbeat, and ``leave`` (closing) sends epoch -2 rather than -1, so
the broker keeps its partitions for its session and the next consumer started with the
same instance id takes them over without a rebalance of the others. Leaving for not
polling stays epoch -1: a stuck application's partitions must go to the others.
``on_instance_fenced`` (another live consumer took the instance id) loses everything and
stops for good.

Heartbeat pacing: one in flight at most (``start_heartbeat`` .. ``on_answer`` /
``on_fenced`` / ``on_failure``); the next is due ``heartbeat_interval_ms`` (the broker's
number) after an answer, or at once after a revocation is done, the subscription changes,
the member is fenced, or ``leave`` is asked for. Failures back off from
``retry_backoff_ms`` doubling to ``_MAX_RETRY_BACKOFF_MS``.

Not thread-safe: the shell guards it with its lock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from tidelog.client.types import TopicPartition

__all__ = [
    "GroupMembership",
    "HeartbeatAnswer",
    "HeartbeatRequest",
    "MemberEvent",
    "MemberState",
]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
LEAVE_STATIC_EPOCH = -2  # a static member leaving for now (closing); see the docstring
_MAX_RETRY_BACKOFF_MS = 1_000


class MemberState(enum.Enum):
    JOINING = "joining"  # the next heartbeat has epoch 0
    MEMBER = "member"  # has a member epoch > 0
    LEAVING = "leaving"  # the next heartbeat has epoch -1
    IDLE = "idle"  # left because the application stopped polling; rejoins when it polls
    LEFT = "left"  # nothing more to send


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """What one heartbeat says: the full subscription and the full owned list."""

    member_id: str
    member_epoch: int
    subscription: tuple[str, ...]
    owned: tuple[TopicPartition, ...]  # sorted
    instance_id: str | None = None  # a static member's group.instance.id


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: frozenset[TopicPartition]  # all the member may own now


@dataclass(frozen=True, slots=True)
class MemberEvent:
    """One step for the application thread, run in the order the events were made.

    ``kind``: ``"revoke"`` (commit, ``on_revoke``, stop fetching, then
    ``revocation_done``), ``"assign"`` (start fetching from the committed offset,
    ``on_assign``) or ``"lose"`` (stop fetching, no commit: the partitions are already
    someone else's; ``on_lost``).
    """

    kind: Literal["assign", "revoke", "lose"]
    partitions: tuple[TopicPartition, ...]  # sorted, never empty
    generation: int


def _sorted(tps: Iterable[TopicPartition]) -> tuple[TopicPartition, ...]:
    return tuple(sorted(tps))


class GroupMembership:
    """One member's protocol state. Pure and not thread-safe.

    Args:
        subscription: the topic names subscribed to.
        session_timeout_ms: without an answer for this long, the partitions count as lost.
        retry_backoff_ms: the first backoff after a failed heartbeat.
        now_ms: the current time; the first heartbeat is due at once.
        max_poll_interval_ms: leave (and lose the partitions) when the application has
            not polled for this long; None never does.
        member_id: an id to join with ("" lets the broker choose one).
        instance_id: a static member's instance id (None: a dynamic member).
    """

    def __init__(
        self,
        subscription: Iterable[str],
        *,
        session_timeout_ms: int,
        retry_backoff_ms: int,
        now_ms: int,
        member_id: str = "",
        max_poll_interval_ms: int | None = None,
        instance_id: str | None = None,
    ) -> None:
        self.subscription = tuple(dict.fromkeys(subscription))
        self.instance_id = instance_id
        self.member_id = member_id
        self.member_epoch = JOIN_EPOCH
        self.state = MemberState.JOINING
        self.generation = 0
        self.owned: set[TopicPartition] = set()
        self.revoking: set[TopicPartition] = set()
        self.heartbeat_interval_ms: int | None = None  # the broker's, once answered
        self.answers = 0  # heartbeats answered (the shell waits on it)
        self._session_timeout_ms = session_timeout_ms
        self._retry_backoff_ms = retry_backoff_ms
        self._failures = 0
        self._in_flight = False
        self._due_ms = now_ms
        self._urgent = False  # heartbeat at once after the answer in flight
        # The session, as the broker counts it, runs from its receipt of the last heartbeat
        # it answered: from our sending it is the safe side (never later than the broker's).
        self._last_answer_ms = now_ms
        self._sent_ms = now_ms  # when the heartbeat in flight was sent
        self._max_poll_interval_ms = max_poll_interval_ms
        self._last_poll_ms = now_ms
        self._after_leave = MemberState.LEFT  # IDLE or JOINING when leaving for not polling

    # --- heartbeats -----------------------------------------------------------------------

    @property
    def in_flight(self) -> bool:
        return self._in_flight

    def next_heartbeat_ms(self) -> int | None:
        """When the next heartbeat is due; None while one is in flight or out of the group."""
        if self._in_flight or self.state in (MemberState.LEFT, MemberState.IDLE):
            return None
        return self._due_ms

    def next_wakeup_ms(self) -> int | None:
        """When the shell must act next: a heartbeat is due or the poll interval runs out.

        None: nothing until an answer arrives or the application does something.
        """
        due = self.next_heartbeat_ms()
        deadline = None if self._in_flight else self._poll_deadline_ms()
        if due is None or deadline is None:
            return due if deadline is None else deadline
        return min(due, deadline)

    def session_deadline_ms(self) -> int | None:
        """When the broker may have removed the member for silence; None without a stake.

        The shell bounds each heartbeat's deadline by it, so a heartbeat retried against
        an unreachable broker fails (and ``on_failure`` loses the partitions) by the time
        the broker gives them to someone else, not one whole call timeout later.
        """
        if not self.owned and self.state is not MemberState.MEMBER:
            return None
        return self._last_answer_ms + self._session_timeout_ms

    def _poll_deadline_ms(self) -> int | None:
        if self._max_poll_interval_ms is None or self.state not in (
            MemberState.JOINING,
            MemberState.MEMBER,
        ):
            return None
        return self._last_poll_ms + self._max_poll_interval_ms

    def check_poll_interval(self, now_ms: int) -> list[MemberEvent]:
        """Leave the group if the application has not polled for ``max_poll_interval_ms``.

        Returns the ``lose`` event for what it held (none if it held nothing).
        """
        deadline = self._poll_deadline_ms()
        if deadline is None or now_ms < deadline:
            return []
        events = self._lose_all()
        if self.member_id or self._in_flight:
            self.state = MemberState.LEAVING
            self._after_leave = MemberState.IDLE
            self.request_heartbeat(now_ms)
        else:
            self.state = MemberState.IDLE
        return events

    def polled(self, now_ms: int) -> None:
        """The application polled: it is alive; a member that left for not polling rejoins."""
        self._last_poll_ms = now_ms
        if self.state is MemberState.IDLE:
            self.state = MemberState.JOINING
            self.request_heartbeat(now_ms)
        elif self.state is MemberState.LEAVING and self._after_leave is MemberState.IDLE:
            self._after_leave = MemberState.JOINING  # rejoin once the leave is answered

    def start_heartbeat(self, now_ms: int) -> HeartbeatRequest | None:
        """The heartbeat to send now, if one is due (it is then in flight)."""
        due = self.next_heartbeat_ms()
        if due is None or now_ms < due:
            return None
        self._in_flight = True
        self._sent_ms = now_ms
        if self.state is MemberState.LEAVING:
            # Closing, a static member leaves for now; leaving for not polling, for good.
            for_now = self.instance_id is not None and self._after_leave is MemberState.LEFT
            epoch = LEAVE_STATIC_EPOCH if for_now else LEAVE_EPOCH
            return HeartbeatRequest(self.member_id, epoch, self.subscription, (), self.instance_id)
        return HeartbeatRequest(
            self.member_id,
            self.member_epoch,
            self.subscription,
            _sorted(self.owned),
            self.instance_id,
        )

    def on_answer(self, answer: HeartbeatAnswer, now_ms: int) -> list[MemberEvent]:
        """Reconcile to an answer: the events the application must run, in order.

        Partitions owned (and not already being revoked) that the assignment leaves out
        are revoked; partitions of the assignment not owned are assigned and owned from
        now on. A partition being revoked that the assignment lists again stays being
        revoked (it comes back as an assignment after ``revocation_done``).
        """
        urgent = self._finish(now_ms)
        self.answers += 1
        self._failures = 0
        self._last_answer_ms = self._sent_ms
        if self.state is MemberState.LEAVING:
            if answer.member_epoch in (LEAVE_EPOCH, LEAVE_STATIC_EPOCH):
                self._left(now_ms)
            else:  # answers a heartbeat sent before leave(): leave as the member it made
                self.member_id = answer.member_id or self.member_id
                self._due_ms = now_ms
            return []
        if self.state in (MemberState.LEFT, MemberState.IDLE):
            return []
        self.member_id = answer.member_id
        self.member_epoch = answer.member_epoch
        self.state = MemberState.MEMBER
        self.heartbeat_interval_ms = answer.heartbeat_interval_ms
        if not urgent:
            self._due_ms = now_ms + max(answer.heartbeat_interval_ms, 1)
        events: list[MemberEvent] = []
        revoke = self.owned - self.revoking - answer.assignment
        if revoke:
            self.revoking |= revoke
            events.append(MemberEvent("revoke", _sorted(revoke), self.generation))
        assign = answer.assignment - self.owned
        if assign:
            self.owned |= assign
            events.append(MemberEvent("assign", _sorted(assign), self.generation))
        return events

    def on_fenced(self, now_ms: int) -> list[MemberEvent]:
        """``UNKNOWN_MEMBER_ID``/``FENCED_MEMBER_EPOCH``: lose everything, rejoin at once.

        The member id is kept (the broker lets a member rejoin as itself).
        """
        self._finish(now_ms)
        if self.state in (MemberState.LEAVING, MemberState.LEFT, MemberState.IDLE):
            if self.state is MemberState.LEAVING:
                self._left(now_ms)  # already gone from the group: nothing to leave
            self.owned.clear()
            self.revoking.clear()
            return []
        self._last_answer_ms = now_ms  # a fresh session starts with the rejoin
        self._due_ms = now_ms
        return self._lose_all()

    def on_instance_fenced(self, now_ms: int) -> list[MemberEvent]:
        """``FENCED_INSTANCE_ID``: another consumer joined with this instance id. Lose
        everything and stop (no rejoin: the two would fence each other in turn)."""
        self._finish(now_ms)
        events = self._lose_all() if self.state is not MemberState.LEFT else []
        self.owned.clear()
        self.revoking.clear()
        self.state = self._after_leave = MemberState.LEFT
        return events

    def on_failure(self, now_ms: int) -> list[MemberEvent]:
        """No answer (broker unreachable, timeout, other error): retry after a backoff.

        Once no heartbeat was answered for the session timeout, the broker has removed
        the member: its partitions are lost, and it rejoins when the broker answers. A
        member that is leaving gives up (the session expiry removes it anyway).
        """
        self._finish(now_ms)
        if self.state is MemberState.LEAVING:
            self._left(now_ms)  # the session expiry removes the member anyway
            return []
        if self.state in (MemberState.LEFT, MemberState.IDLE):
            return []
        self._failures += 1
        backoff = min(
            self._retry_backoff_ms * 2 ** min(self._failures - 1, 10),
            max(self._retry_backoff_ms, _MAX_RETRY_BACKOFF_MS),
        )
        self._due_ms = now_ms + max(backoff, 1)
        if now_ms - self._last_answer_ms >= self._session_timeout_ms and (
            self.owned or self.state is MemberState.MEMBER
        ):
            self._last_answer_ms = now_ms
            return self._lose_all()
        return []

    def _finish(self, now_ms: int) -> bool:
        """The heartbeat in flight is over; True if the next one is due at once."""
        self._in_flight = False
        urgent, self._urgent = self._urgent, False
        if urgent:
            self._due_ms = now_ms
        return urgent

    def _left(self, now_ms: int) -> None:
        self.state, self._after_leave = self._after_leave, MemberState.LEFT
        self.member_epoch = JOIN_EPOCH
        if self.state is MemberState.JOINING:
            self._due_ms = now_ms

    def _lose_all(self) -> list[MemberEvent]:
        lost = _sorted(self.owned)
        self.owned.clear()
        self.revoking.clear()
        self.member_epoch = JOIN_EPOCH
        self.state = MemberState.JOINING
        events = [MemberEvent("lose", lost, self.generation)] if lost else []
        self.generation += 1
        return events

    # --- the application's side -----------------------------------------------------------

    def revocation_done(
        self, partitions: Iterable[TopicPartition], generation: int, now_ms: int
    ) -> None:
        """The application ran ``on_revoke`` for ``partitions``: report them released.

        Heartbeats at once (or right after the one in flight). Ignored for an older
        generation: those partitions were lost meanwhile.
        """
        if generation != self.generation:
            return
        done = set(partitions) & self.revoking
        if not done:
            return
        self.revoking -= done
        self.owned -= done
        self.request_heartbeat(now_ms)

    def set_subscription(self, topics: Iterable[str], now_ms: int) -> None:
        """Subscribe to other topics; heartbeats at once if they differ."""
        names = tuple(dict.fromkeys(topics))
        if names != self.subscription:
            self.subscription = names
            self.request_heartbeat(now_ms)

    def leave(self, now_ms: int) -> None:
        """Leave the group: the next heartbeat (at once) has epoch -1.

        The application revokes what it holds first; anything granted meanwhile is
        dropped here without an event. A member that never joined has nothing to leave.
        """
        self._after_leave = MemberState.LEFT
        if self.state in (MemberState.LEFT, MemberState.LEAVING):
            return
        if self.state is MemberState.IDLE or (
            self.state is MemberState.JOINING and not self.member_id and not self._in_flight
        ):
            self.state = MemberState.LEFT  # not in the group
        else:
            self.state = MemberState.LEAVING
        self.owned.clear()
        self.revoking.clear()
        self.request_heartbeat(now_ms)

    def request_heartbeat(self, now_ms: int) -> None:
        """Heartbeat at once, or right after the one in flight."""
        if self._in_flight:
            self._urgent = True
        else:
            self._due_ms = min(self._due_ms, now_ms)
