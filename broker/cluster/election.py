"""Leader elections, as Kafka's controller makes them (``PartitionStateMachine``, ``Election``).

Pure: a partition's assignment, its current state and the live brokers in, the new state
(or None: no change possible) out. The controller writes the result to ZooKeeper with a
fenced compare-and-set; every new leader, and every ISR change the controller makes,
bumps the leader epoch, so brokers and clients holding the old epoch are fenced.

* **Offline** (the leader died, or the partition is new): the first replica in
  assignment order that is alive and in the ISR. With unclean election allowed and no
  such replica, the first live replica, whose log "becomes the source of truth even
  though it is not guaranteed to have every committed message". New ISR: the live members
  of the old ISR if the leader was one of them, else ``[leader]``.
* **Preferred**: the first replica of the assignment, if alive and in the ISR.
* **Controlled shutdown**: the first live ISR member that is not shutting down; the
  shutting-down broker leaves the ISR.
* **A follower died**: it leaves the ISR (the leader stays; the epoch moves).
* **A leader from a previous life** (``leadership_predates_leader``): the state names a
  live leader whose registration (broker epoch: the creation zxid of its
  ``/brokers/ids/<id>``, KIP-380) is newer than the state's last write. The broker
  restarted (or its session expired and it registered again) and no controller has
  granted it anything since: Kafka's controller treats such a "bounced" broker as failed,
  then started. Here every broker's view shows such a partition without a leader, and
  the controller elects again as for an offline partition (the restarted broker counts
  as live and may be chosen), with a new epoch. Without this a broker restarted with all
  the others could serve as leader, at its old epoch, a log tail that the controller's
  next election cuts off: a consumer group read an offset commit that later vanished.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from broker.cluster.znodes import NO_LEADER, PartitionState

__all__ = [
    "Elected",
    "elect_for_shutdown",
    "elect_offline",
    "elect_preferred",
    "leadership_predates_leader",
    "offline_state",
    "without_dead_followers",
]


@dataclass(frozen=True, slots=True)
class Elected:
    """A new partition state and whether it came from an unclean election."""

    state: PartitionState
    unclean: bool = False


def _next(
    state: PartitionState, leader: int, isr: Sequence[int], controller_epoch: int
) -> PartitionState:
    return PartitionState(leader, state.leader_epoch + 1, tuple(isr), controller_epoch)


def elect_offline(
    replicas: Sequence[int],
    state: PartitionState,
    live: Collection[int],
    *,
    unclean_allowed: bool,
    controller_epoch: int,
) -> Elected | None:
    """A leader for a partition whose leader is not alive (or that has none).

    Returns None when no replica may lead: the partition stays (or goes) offline, with
    leader -1 written by the caller via ``offline_state``.
    """
    isr = set(state.isr)
    for replica in replicas:
        if replica in live and replica in isr:
            new_isr = [r for r in state.isr if r in live]
            return Elected(_next(state, replica, new_isr, controller_epoch))
    if unclean_allowed:
        for replica in replicas:
            if replica in live:
                return Elected(_next(state, replica, [replica], controller_epoch), unclean=True)
    return None


def offline_state(state: PartitionState, controller_epoch: int) -> PartitionState:
    """No leader: Kafka keeps the ISR as it was so a clean election can still happen later."""
    return PartitionState(NO_LEADER, state.leader_epoch + 1, state.isr, controller_epoch)


def elect_preferred(
    replicas: Sequence[int], state: PartitionState, live: Collection[int], *, controller_epoch: int
) -> Elected | None:
    """The preferred replica as leader, if it can be and is not already."""
    preferred = replicas[0]
    if state.leader == preferred or preferred not in live or preferred not in state.isr:
        return None
    return Elected(_next(state, preferred, state.isr, controller_epoch))


def elect_for_shutdown(
    replicas: Sequence[int],
    state: PartitionState,
    live: Collection[int],
    shutting_down: Collection[int],
    *,
    controller_epoch: int,
) -> Elected | None:
    """Move leadership (and ISR membership) off brokers that are shutting down.

    None when nothing changes, or when no other ISR member can lead (the partition keeps
    its leader until the broker actually stops; Kafka does the same rather than go
    offline early).
    """
    leaving = set(shutting_down)
    new_isr = [r for r in state.isr if r not in leaving]
    if state.leader not in leaving:
        if len(new_isr) == len(state.isr):
            return None
        return Elected(_next(state, state.leader, new_isr, controller_epoch))
    for replica in replicas:
        if replica in live and replica not in leaving and replica in new_isr:
            return Elected(_next(state, replica, new_isr, controller_epoch))
    return None


def without_dead_followers(
    state: PartitionState, live: Collection[int], *, controller_epoch: int
) -> Elected | None:
    """The same leader with dead followers out of the ISR, or None if none died."""
    if state.leader == NO_LEADER or state.leader not in live:
        return None
    new_isr = [r for r in state.isr if r in live]
    if len(new_isr) == len(state.isr):
        return None
    return Elected(_next(state, state.leader, new_isr, controller_epoch))


def leadership_predates_leader(
    state: PartitionState, written_zxid: int, broker_epochs: Mapping[int, int]
) -> bool:
    """True if the state names a live leader that registered after the state was written.

    ``broker_epochs``: live brokers' epochs (registration creation zxids). A leader not
    live is not "predating" (the ordinary offline case).
    """
    epoch = broker_epochs.get(state.leader)
    return state.leader != NO_LEADER and epoch is not None and epoch > written_zxid
