"""Group membership on the application's thread: the rebalance steps and the callbacks.

The heartbeat thread (``client.coordinator``) only queues ``MemberEvent``\\ s; a
``GroupSubscription`` runs them when the consumer's owner calls ``poll`` (or ``close``,
``unsubscribe``), as Kafka's consumer runs its rebalance listener inside ``poll``:

- ``assign``: the partitions join the consumer's assignment without a position (so they
  are not fetched yet), then ``on_assign`` runs (it may ``seek``); the next position
  lookup takes the committed offset, else ``auto_offset_reset``;
- ``revoke``: with auto-commit their positions are committed first (the member may still
  commit a partition it is giving up), then ``on_revoke`` runs, then they leave the
  assignment (nothing more is fetched or handed out), and only then the coordinator
  hears they are released: a partition is never reported released before its
  ``on_revoke`` finished. A revocation overtaken by a loss (a ``lose`` step is queued
  after it) only stops reading the partitions: they are in the ``lose`` step;
- ``lose`` (fenced, or the session expired): the partitions are already someone else's:
  they leave the assignment without a commit and ``on_lost`` runs (``on_revoke`` if
  there is no ``on_lost``, as Kafka's default ``onPartitionsLost`` does).

From the moment the heartbeat thread loses the membership until the ``lose`` step ran,
commits are refused (``check_not_lost``): the positions the application holds are of
partitions that are someone else's, even if the member already rejoined and got them
back.

A callback that raises does not stop the step: the bookkeeping finishes (so the group is
never left waiting for a revocation), and the first error is raised once every queued
step ran. An interrupted step (``KeyboardInterrupt``) still releases its partitions, and
the steps after it run at the next ``poll``; ``leave`` always leaves the group. Callbacks
get a sorted ``list[TopicPartition]``.

Used from the consumer's thread only (not thread-safe); the consumer passes itself as
the ``ConsumerHooks``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from tidelog.client.coordinator import ConsumerCoordinator
from tidelog.client.group_member import MemberEvent
from tidelog.client.types import TopicPartition
from tidelog.storage.errors import FencedMemberEpochError

__all__ = ["ConsumerHooks", "GroupSubscription", "PartitionsCallback"]

log = logging.getLogger(__name__)

PartitionsCallback = Callable[[list[TopicPartition]], object]
"""A rebalance callback: called with the partitions assigned, revoked or lost."""


class ConsumerHooks(Protocol):
    """What a ``GroupSubscription`` needs of the consumer it serves."""

    def _add_partitions(self, partitions: list[TopicPartition]) -> None:
        """Add to the assignment, without a position."""

    def _drop_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """Remove from the assignment; their fetched records are dropped."""

    def _held_partitions(self) -> list[TopicPartition]:
        """The assignment, sorted."""

    def _commit_positions(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> None:
        """Commit the positions of ``partitions`` within ``timeout_ms`` (default
        ``request_timeout_ms``); log a failure, never raise."""


class GroupSubscription:
    """A consumer's membership: its coordinator and its rebalance callbacks.

    Not thread-safe: the consumer's thread only.
    """

    def __init__(
        self,
        coordinator: ConsumerCoordinator,
        *,
        on_assign: PartitionsCallback | None,
        on_revoke: PartitionsCallback | None,
        on_lost: PartitionsCallback | None,
    ) -> None:
        self.coordinator = coordinator
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self.on_lost = on_lost
        self._losses_handled = 0  # "lose" steps run, against the coordinator's count

    def check_not_lost(self) -> None:
        """Raise ``FencedMemberEpochError`` while a loss of the membership is not handled.

        Once the heartbeat thread was fenced (or the session expired), the partitions
        the application still reads are someone else's, even if the member already
        rejoined and got them back: its positions belong to the old membership, and
        committing them could undo the new owner's progress. Commits are refused until
        ``poll`` has run the ``lose`` step (``on_lost``), as Kafka's ``CommitFailed``.
        """
        if self._losses_handled != self.coordinator.losses():
            raise FencedMemberEpochError(
                f"group {self.coordinator.group_id}: the membership was lost (fenced, "
                "session expired, or no poll() for max_poll_interval_ms) and its partitions "
                "with it; poll() runs on_lost and rejoins, then commits work again"
            )

    def run_events(self, consumer: ConsumerHooks, *, auto_commit: bool) -> None:
        """Run the queued rebalance steps in order; then raise a callback's error, if any.

        Also raises (once) a heartbeat error that retrying will not fix, such as
        ``InvalidRequestError`` from a broker without consumer groups.
        """
        error: BaseException | None = None
        events = self.coordinator.take_events()
        for index, event in enumerate(events):
            try:
                failure = self._run(consumer, event, auto_commit=auto_commit)
            except BaseException:
                # Interrupted (KeyboardInterrupt from a callback...): the steps not run
                # yet run at the next poll, so no revocation is left unfinished.
                self.coordinator.put_back(events[index + 1 :])
                raise
            error = error or failure
        error = error or self.coordinator.take_error()
        if error is not None:
            raise error

    def _run(
        self,
        consumer: ConsumerHooks,
        event: MemberEvent,
        *,
        auto_commit: bool,
        commit_timeout_ms: int | None = None,
    ) -> BaseException | None:
        partitions = list(event.partitions)
        names = ", ".join(map(str, partitions))
        if event.kind == "assign":
            consumer._add_partitions(partitions)
            log.info("group %s: assigned %s", self.coordinator.group_id, names)
            return _call(self.on_assign, partitions)
        if event.kind == "revoke":
            if self._losses_handled != self.coordinator.losses():
                # The membership was lost after this revocation: a "lose" step follows
                # (queued, or later in this batch), and these partitions are in it. They
                # may be someone else's already: no commit and no on_revoke, just stop
                # reading them; on_lost runs with the lose step.
                consumer._drop_partitions(partitions)
                return None
            if auto_commit:
                consumer._commit_positions(partitions, commit_timeout_ms)
            try:  # even if interrupted: the group waits for this release
                error = _call(self.on_revoke, partitions)
            finally:
                consumer._drop_partitions(partitions)
                self.coordinator.revocation_done(partitions, event.generation)
            log.info("group %s: revoked %s", self.coordinator.group_id, names)
            return error
        consumer._drop_partitions(partitions)  # lost: no commit, they are someone else's
        log.warning("group %s: lost %s", self.coordinator.group_id, names)
        try:  # commits are refused until the callback ran (none in on_lost, as Kafka's)
            return _call(self.on_lost or self.on_revoke, partitions)
        finally:
            self._losses_handled += 1

    def leave(self, consumer: ConsumerHooks, timeout_ms: int, *, auto_commit: bool) -> None:
        """Run what is queued, revoke everything (commit, ``on_revoke``), leave the group.

        Errors, callbacks' included, are logged, not raised: this runs from ``close``.
        Waits at most ``timeout_ms`` for the commits (all of them together), then at most
        ``timeout_ms`` for the broker to hear of the leave.
        """
        commit_deadline = _monotonic_ms() + timeout_ms

        def commit_timeout_ms() -> int:
            return max(commit_deadline - _monotonic_ms(), 1)

        try:
            for event in self.coordinator.take_events():
                failure = self._run(
                    consumer, event, auto_commit=auto_commit, commit_timeout_ms=commit_timeout_ms()
                )
                if failure is not None:
                    log.warning("rebalance callback failed while leaving: %r", failure)
            held = consumer._held_partitions()
            if held:
                if auto_commit:  # still a member: commits with its epoch
                    consumer._commit_positions(held, commit_timeout_ms())
                try:
                    failure = _call(self.on_revoke, held)
                finally:
                    consumer._drop_partitions(held)
                if failure is not None:
                    log.warning("on_revoke failed while leaving: %r", failure)
        finally:
            # Even if interrupted (KeyboardInterrupt from a callback): never leave a
            # heartbeat thread keeping a member alive for a consumer that is going away.
            self.coordinator.leave(timeout_ms)


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _call(
    callback: PartitionsCallback | None, partitions: list[TopicPartition]
) -> BaseException | None:
    """Run a rebalance callback; return its exception instead of raising it."""
    if callback is None:
        return None
    try:
        callback(list(partitions))
    except Exception as exc:
        log.exception("rebalance callback %r failed", callback)
        return exc
    return None
