"""Partition reassignment (KIP-455) as the controller runs it: the pure decisions.

Kafka's algorithm, for a partition with replicas ``O`` asked to move to target ``T``:

1. **Start.** The assignment becomes the union ``T + (O - T)`` (the target's order
   first, so its first replica is the preferred leader afterwards), with ``adding`` =
   ``T - O`` and ``removing`` = ``O - T`` recorded beside it (``znodes``: the topic
   znode's ``adding_replicas``/``removing_replicas``). The partition state gets a new
   leader epoch (same leader, same ISR): the leader re-reads its replica list at a new
   epoch and starts serving the adding replicas' fetches; they fetch and catch up as any
   follower does, and the leader adds each to the ISR once it reached the high watermark.
2. **Completion**, once every target replica is in the ISR: the leader moves to the
   first live target replica in the ISR if it is not a target replica itself, the
   removed replicas leave the ISR (and the ELR), the assignment becomes ``T`` and the
   lists are dropped, in one transaction with a new leader epoch. A removed replica sees
   that it is no longer a replica, stops, and deletes its copy of the log
   (``ReplicaManager.apply``).
3. **Cancel** (a null target): back to ``O`` at once: the adding replicas leave the ISR
   and the assignment; the leader moves to an original replica in the ISR if it was one
   of the adding ones.

A new target for a partition already moving is taken as a reassignment from ``O`` (the
replicas it had before the first), as Kafka does: replicas of the old union that are in
neither ``O`` nor the new target leave at once.

Nothing acknowledged is lost: the leader only ever moves to a replica in the ISR (which
holds every record at or below the high watermark), and the ISR only loses replicas that
are leaving; with ``acks=all`` every acknowledged record is on every ISR member,
the adding replicas included once they joined.

Pure: assignments and states in, the new ones (or an error name) out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from tidelog.broker.cluster.znodes import NO_LEADER, PartitionState

__all__ = ["Move", "cancel", "complete", "invalid_target", "start"]


@dataclass(frozen=True, slots=True)
class Move:
    """A partition's new replicas, adding/removing lists and state."""

    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]
    state: PartitionState


def invalid_target(target: Sequence[int], live: Collection[int]) -> str | None:
    """Why ``target`` is not a replica list Kafka would accept (INVALID_REPLICA_ASSIGNMENT),
    or None: empty, a duplicate, a negative id, or a broker that is not live."""
    if not target:
        return "the target replica list is empty"
    if len(set(target)) != len(target):
        return f"the target replica list {list(target)} names a broker twice"
    unknown = sorted(r for r in target if r < 0 or r not in live)
    if unknown:
        return f"broker(s) {unknown} of {list(target)} are not live brokers"
    return None


def _leader_among(
    candidates: Sequence[int], state: PartitionState, live: Collection[int]
) -> int | None:
    """The current leader if it is a candidate, else the first live ISR candidate."""
    if state.leader in candidates and state.leader in live:
        return state.leader
    for replica in candidates:
        if replica in state.isr and replica in live:
            return replica
    return None


def _narrowed(
    state: PartitionState, keep: Sequence[int], leader: int, controller_epoch: int
) -> PartitionState:
    """``state`` with only ``keep``'s members in its ISR and ELR, ``leader`` leading, at a
    new leader epoch."""
    isr = tuple(r for r in state.isr if r in keep)
    if leader != NO_LEADER and leader not in isr:
        isr = (leader, *isr)
    return replace(
        state,
        leader=leader,
        leader_epoch=state.leader_epoch + 1,
        isr=isr,
        controller_epoch=controller_epoch,
        elr=tuple(r for r in state.elr if r in keep),
        last_known_elr=tuple(r for r in state.last_known_elr if r in keep),
    )


def start(
    original: Sequence[int],
    current: Sequence[int],
    target: Sequence[int],
    state: PartitionState,
    live: Collection[int],
    controller_epoch: int,
) -> Move:
    """Begin (or redirect) a reassignment to ``target`` (validated by ``invalid_target``).

    ``original`` is what the partition had before any reassignment, ``current`` its
    replicas now (the same unless one is in progress). Replicas of ``current`` in
    neither ``original`` nor ``target`` (the adding replicas of a superseded target)
    leave the ISR now; if one of them led, leadership moves to the first live ISR
    member of the new union (none: the leader stays and the next step decides).
    """
    union = tuple(target) + tuple(r for r in original if r not in target)
    adding = tuple(r for r in target if r not in original)
    removing = tuple(r for r in original if r not in target)
    leader = state.leader
    if leader not in union:
        chosen = _leader_among(union, state, live)
        leader = chosen if chosen is not None else NO_LEADER
    new_state = _narrowed(state, union, leader, controller_epoch)
    del current  # the union is rebuilt from ``original``: what ``current`` had extra goes
    return Move(union, adding, removing, new_state)


def complete(
    replicas: Sequence[int],
    removing: Sequence[int],
    state: PartitionState,
    live: Collection[int],
    controller_epoch: int,
) -> Move | None:
    """Finish a reassignment whose target replicas (``replicas`` less ``removing``) are all
    in the ISR; None while they are not (or no target replica in the ISR is live to lead)."""
    target = tuple(r for r in replicas if r not in removing)
    if not all(r in state.isr for r in target):
        return None
    leader = _leader_among(target, state, live)
    if leader is None:
        return None
    return Move(target, (), (), _narrowed(state, target, leader, controller_epoch))


def cancel(
    replicas: Sequence[int],
    adding: Sequence[int],
    state: PartitionState,
    live: Collection[int],
    controller_epoch: int,
) -> Move:
    """Return to the replicas the partition had before its reassignment (``replicas``
    less ``adding``). If the leader is an adding replica, the first live original replica
    in the ISR leads; with none, the partition goes without a leader and the controller's
    offline election decides (``election.reconcile``)."""
    original = tuple(r for r in replicas if r not in adding)
    chosen = _leader_among(original, state, live)
    leader = chosen if chosen is not None else NO_LEADER
    return Move(original, (), (), _narrowed(state, original, leader, controller_epoch))
