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
  ``on_revoke`` finished;
- ``lose`` (fenced, or the session expired): the partitions are already someone else's:
  they leave the assignment without a commit and ``on_lost`` runs (``on_revoke`` if
  there is no ``on_lost``, as Kafka's default ``onPartitionsLost`` does).

A callback that raises does not stop the step: the bookkeeping finishes (so the group is
never left waiting for a revocation), and the first error is raised once every queued
step ran. Callbacks get a sorted ``list[TopicPartition]``.

Used from the consumer's thread only (not thread-safe); the consumer passes itself as
the ``ConsumerHooks``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from client.coordinator import ConsumerCoordinator
from client.group_member import MemberEvent
from client.types import TopicPartition

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

    def _commit_positions(self, partitions: Iterable[TopicPartition]) -> None:
        """Commit the positions of ``partitions``; log a failure, never raise."""


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

    def run_events(self, consumer: ConsumerHooks, *, auto_commit: bool) -> None:
        """Run the queued rebalance steps in order; then raise a callback's error, if any.

        Also raises (once) a heartbeat error that retrying will not fix, such as
        ``InvalidRequestError`` from a broker without consumer groups.
        """
        error: BaseException | None = None
        for event in self.coordinator.take_events():
            failure = self._run(consumer, event, auto_commit=auto_commit)
            error = error or failure
        error = error or self.coordinator.take_error()
        if error is not None:
            raise error

    def _run(
        self, consumer: ConsumerHooks, event: MemberEvent, *, auto_commit: bool
    ) -> BaseException | None:
        partitions = list(event.partitions)
        names = ", ".join(map(str, partitions))
        if event.kind == "assign":
            consumer._add_partitions(partitions)
            log.info("group %s: assigned %s", self.coordinator.group_id, names)
            return _call(self.on_assign, partitions)
        if event.kind == "revoke":
            if auto_commit:
                consumer._commit_positions(partitions)
            error = _call(self.on_revoke, partitions)
            consumer._drop_partitions(partitions)
            self.coordinator.revocation_done(partitions, event.generation)
            log.info("group %s: revoked %s", self.coordinator.group_id, names)
            return error
        consumer._drop_partitions(partitions)  # lost: no commit, they are someone else's
        log.warning("group %s: lost %s", self.coordinator.group_id, names)
        return _call(self.on_lost or self.on_revoke, partitions)

    def leave(self, consumer: ConsumerHooks, timeout_ms: int, *, auto_commit: bool) -> None:
        """Run what is queued, revoke everything (commit, ``on_revoke``), leave the group.

        Errors, callbacks' included, are logged, not raised: this runs from ``close``.
        Waits at most ``timeout_ms`` for the broker to hear of it.
        """
        for event in self.coordinator.take_events():
            failure = self._run(consumer, event, auto_commit=auto_commit)
            if failure is not None:
                log.warning("rebalance callback failed while leaving: %r", failure)
        held = consumer._held_partitions()
        if held:
            if auto_commit:
                consumer._commit_positions(held)  # still a member: commits with its epoch
            failure = _call(self.on_revoke, held)
            if failure is not None:
                log.warning("on_revoke failed while leaving: %r", failure)
            consumer._drop_partitions(held)
        self.coordinator.leave(timeout_ms)


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
