"""The value types of a partition's role (``broker.core.partition``): the follower role,
the leader role with what it knows of each follower, and an ISR change being written.

Split from ``broker.core.partition`` (which re-exports ``Follower`` and ``IsrChange``) to
keep that module under the size limit: these are plain data, and every rule about them
(who may change them, under which lock) is the ``Partition``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Follower", "FollowerProgress", "IsrChange", "Leading"]


@dataclass(frozen=True, slots=True)
class Follower:
    """The follower role: who leads, at which epoch."""

    leader: int
    epoch: int


@dataclass(slots=True)
class FollowerProgress:
    """What the leader knows of one follower."""

    log_end_offset: int = -1
    log_start_offset: int = -1  # as the follower last reported it (-1: not yet)
    caught_up_ms: int = 0
    last_fetch_ms: int = 0
    last_fetch_leader_end: int = -1


@dataclass(slots=True, eq=False)
class Leading:
    """The leader role; mutated under its ``Partition``'s lock only."""

    epoch: int
    replicas: tuple[int, ...]
    isr: frozenset[int]
    epoch_start: int
    followers: dict[int, FollowerProgress] = field(default_factory=dict)
    pending_isr: tuple[int, ...] | None = None
    isr_before: frozenset[int] | None = None
    # A reassignment's adding replicas: their reads go through the leader's throttle.
    adding: frozenset[int] = frozenset()
    # The state znode's version the ISR is from (KRaft's partition epoch; -1: unknown).
    partition_epoch: int = -1


@dataclass(frozen=True, slots=True)
class IsrChange:
    """An ISR change being written: the proposed ISR at the leader epoch it was made in,
    from the ISR ``base``. ``term`` is the leadership it belongs to (a later one ignores
    its outcome)."""

    term: object
    epoch: int
    isr: tuple[int, ...]
    base: frozenset[int] = frozenset()
