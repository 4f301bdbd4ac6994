"""A partition leader's ISR changes (``broker.core.partition``): proposed, written, taken.

Split from ``broker.core.partition`` (its ``Partition`` inherits ``IsrChanges``) to keep
that module under the size limit; the rules are the partition's, under its one lock:

* the leader proposes a change (a follower caught up, ``Partition.on_follower_fetch``;
  a member lagging, ``maybe_shrink_isr``), the replica manager writes it
  (``begin_isr_write``, ``broker.cluster.isr_writes``, ``finish_isr_write``) and it takes
  effect once written;
* the controller removes dead followers from the ISR at the same leader epoch (KRaft's
  rule since KAFKA-15021, ``broker.cluster.election``); the leader takes that ISR from a
  view (``update_isr``) when the view's partition epoch (the state znode's version) is
  newer than the one it knows: its own last write, or the view it last took. A change
  it proposed from the old ISR is refused by ZooKeeper (``isr_writes`` compares the
  ISR it was made from), and its outcome no longer overrides the newer ISR.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidelog.broker.core.partition_roles import Follower, IsrChange, Leading
from tidelog.storage.clock import Clock

if TYPE_CHECKING:
    from tidelog.broker.core.partition import Partition

__all__ = ["IsrChanges", "ordered"]

log = logging.getLogger("tidelog.broker.core.partition")


class IsrChanges:
    """The ISR-change methods of ``Partition`` (which provides these attributes)."""

    topic: str
    partition: int
    replicated: bool
    _clock: Clock
    _lock: threading.Lock
    _role: Leading | Follower | None
    _propose_isr: Callable[[Partition], None]

    def _check_replicated(self) -> None:
        raise NotImplementedError

    def maybe_advance_high_watermark(self) -> bool:
        raise NotImplementedError

    def notify_progress(self) -> None:
        raise NotImplementedError

    def update_isr(self, epoch: int, isr: tuple[int, ...], partition_epoch: int) -> bool:
        """Leading at ``epoch``, take ``isr`` if ``partition_epoch`` (the version of the
        state it was read from) is newer than the one this leader knows: the controller
        removed a dead follower at this epoch (``broker.cluster.election``). A view older
        than the leader's own last write is ignored (adopting its smaller ISR would let
        the high watermark pass a member the controller may still elect). An ISR write
        under way was made from the old ISR: ZooKeeper refuses it (``isr_writes``).
        Whether the ISR changed (the high watermark may move, the listeners hear of it)."""
        self._check_replicated()
        with self._lock:
            leading = self._role
            if (
                not isinstance(leading, Leading)
                or leading.epoch != epoch
                or partition_epoch <= leading.partition_epoch
            ):
                return False
            leading.partition_epoch = partition_epoch
            members = frozenset(isr)
            if members == leading.isr:
                return False
            self._take_isr(leading, members, members - leading.isr)
        self.maybe_advance_high_watermark()
        self.notify_progress()
        return True

    def _take_isr(
        self, leading: Leading, members: frozenset[int], caught_up: frozenset[int]
    ) -> None:
        """``members`` as the ISR (under the lock); ``caught_up`` count as caught up now."""
        leading.isr = members
        now = self._clock.monotonic_ms()
        for r in caught_up:
            if r in leading.followers:
                leading.followers[r].caught_up_ms = max(leading.followers[r].caught_up_ms, now)

    def maybe_shrink_isr(self, now_ms: int, lag_time_max_ms: int) -> bool:
        """Propose dropping the ISR members not caught up for ``lag_time_max_ms``
        (unless a change is being written already); whether one was proposed."""
        if not self.replicated:
            return False
        with self._lock:
            leading = self._role
            if not isinstance(leading, Leading) or leading.pending_isr is not None:
                return False
            lagging = {
                r
                for r in leading.isr
                if r in leading.followers
                and now_ms - leading.followers[r].caught_up_ms > lag_time_max_ms
            }
            if not lagging:
                return False
            leading.pending_isr = ordered(leading.replicas, leading.isr - lagging)
        log.warning(
            "%s-%d: shrinking the ISR: %s not caught up for %d ms",
            self.topic,
            self.partition,
            sorted(lagging),
            lag_time_max_ms,
        )
        self._propose_isr(self)  # type: ignore[arg-type]
        return True

    def begin_isr_write(self) -> IsrChange | None:
        """The proposed ISR change to write now (None: none, or no longer leading)."""
        with self._lock:
            leading = self._role
            if not isinstance(leading, Leading) or leading.pending_isr is None:
                return None
            leading.isr_before = leading.isr
            return IsrChange(leading, leading.epoch, leading.pending_isr, leading.isr)

    def finish_isr_write(
        self, change: IsrChange, written: bool, partition_epoch: int = -1
    ) -> tuple[int, int] | None:
        """The write of ``change`` ended: if ``written`` (as znode version
        ``partition_epoch``; -1: unknown) the new ISR takes effect if this leadership
        still holds and no newer state was taken meanwhile (``update_isr``); the high
        watermark may move and the listeners hear of it. Returns (members dropped,
        members added) when written, else None."""
        leading = change.term
        assert isinstance(leading, Leading)
        with self._lock:
            if self._role is leading:
                leading.pending_isr = None
                if written and (partition_epoch < 0 or partition_epoch > leading.partition_epoch):
                    leading.partition_epoch = max(partition_epoch, leading.partition_epoch)
                    self._take_isr(leading, frozenset(change.isr), frozenset(change.isr))
            before = leading.isr_before if leading.isr_before is not None else frozenset()
        if not written:
            return None
        self.maybe_advance_high_watermark()
        self.notify_progress()
        members = set(change.isr)
        return len(before - members), len(members - before)


def ordered(replicas: tuple[int, ...], members: frozenset[int]) -> tuple[int, ...]:
    return tuple(r for r in replicas if r in members)
