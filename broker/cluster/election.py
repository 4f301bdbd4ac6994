"""Leader elections, as Kafka's controller makes them (``PartitionStateMachine``, ``Election``).

Pure: a partition's assignment, its current state and the live brokers in, the new state
(or None: no change possible) out. The controller writes the result to ZooKeeper with a
fenced compare-and-set; every new leader bumps the leader epoch, so brokers and clients
holding the old epoch are fenced. Removing a dead follower from the ISR does not (KRaft's
rule since KAFKA-15021; the ZooKeeper-era controller bumped it): the epoch orders
leaderships, which log truncation relies on, and an ISR change is not one. The leader
takes the smaller ISR from its view (``Partition.update_isr``), ordered by the state
znode's version (the partition epoch), and its own ISR writes are refused while made
from an ISR that is no longer the znode's (``broker.cluster.isr_writes``). At 10,000
partitions on three brokers a broker's death shrinks 6,700 ISRs: with a bump each, every
survivor took a new leadership and re-followed at a new epoch for each (issue #34).

* **Offline** (the leader died, or the partition is new): the first replica in
  assignment order that is alive and in the ISR. With unclean election allowed and no
  such replica, the first live replica, whose log "becomes the source of truth even
  though it is not guaranteed to have every committed message". New ISR: the live members
  of the old ISR if the leader was one of them, else ``[leader]``.
* **Preferred**: the first replica of the assignment, if alive and in the ISR.
* **Controlled shutdown**: the first live ISR member that is not shutting down; the
  shutting-down broker leaves the ISR.
* **A follower died** (or restarted uncleanly, below): it leaves the ISR (the leader and
  its epoch stay).
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

**Eligible leader replicas** (Kafka's KIP-966, adapted to ZooKeeper; ``docs/replication.md``
"Last replica standing"). The problem: RF 3, ``min.insync.replicas`` 2, the ISR shrinks to
one broker, that broker loses its unsynced tail in an unclean shutdown, comes back as the
only ISR member, is elected, and every other replica truncates to its shorter log: a
local loss became a global one. The rules that close it:

1. *Strict min ISR* (``broker.cluster.replicas``): the high watermark advances only while
   the ISR has at least ``min.insync.replicas`` members. So a replica that leaves the ISR
   while it is below that size holds every committed record, for good.
2. *ELR* (``with_elr``, applied to every ISR change, the leader's and the controller's):
   while the new ISR is smaller than ``min.insync.replicas``, the old ISR and ELR members
   not in the new ISR become the ELR (dead ones included: that is the point); replicas
   that restarted uncleanly are left out and go to ``last_known_elr``. Once the ISR is at
   ``min.insync.replicas`` again both lists are emptied; the controller also empties
   them when ``min.insync.replicas`` changes. An ELR-only change (the controller moving a
   replica to ``last_known_elr``) keeps the leader epoch: the leader does not act on the
   ELR, and re-reads the state before each ISR write of its own.
3. *Unclean-shutdown detection*: a broker reports in its registration the broker epoch its
   clean-shutdown marker held, or -1 (``znodes.BrokerRegistration.shut_down_cleanly``).
   ``crashed_replicas``: a replica whose registration says -1 and was created after the
   registrations the state's last controller write took into account
   (``PartitionState.brokers_zxid``) has memberships from before a crash: the
   controller (``reconcile``) takes it out of the ISR and the ELR (into
   ``last_known_elr``), and records the registrations it saw, so each restart is handled
   once per partition. Kafka removes it from the ELR only; here it leaves the ISR too,
   because ZooKeeper mode keeps a dead last ISR member in the ISR (below) where KRaft
   moves it to the ELR, and that member is exactly the one that may have lost its tail.
4. *Election order* for a partition without a live leader (``reconcile``): a live ISR
   member; else a live ELR member (new ISR: just it); else, only if the ISR and the ELR
   are both empty (every eligible replica restarted uncleanly), the last known leader if
   live (KIP-966's "balanced recovery": it may have lost records, but so may every other
   replica; logged as such); else an unclean election if
   ``unclean.leader.election.enable``; else offline, remembering the last known leader.

The controller decides with ``reconcile``, which applies these rules together with the
offline election and the dead-follower rule above; preferred and controlled-shutdown
elections get ``with_elr`` applied to their result.

The result: the partition survives ``min.insync.replicas`` - 1 unclean shutdowns without
losing an acknowledged record, or stays offline until an ELR replica returns. Unlike
KRaft, a dead last ISR member stays in the ISR while the partition is offline (Kafka's
ZooKeeper rule); a live ELR member is elected when no ISR member is
live, which is KRaft's "ELR only when the ISR is empty" with dead members counted out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from tidelog.broker.cluster.znodes import NO_LEADER, PartitionState

__all__ = [
    "Elected",
    "crashed_replicas",
    "elect_for_shutdown",
    "elect_preferred",
    "leadership_predates_leader",
    "reconcile",
    "with_elr",
]


@dataclass(frozen=True, slots=True)
class Elected:
    """A new partition state and whether it came from an unclean election, or from
    KIP-966's last-known-leader rule (ISR and ELR empty: may have lost records too)."""

    state: PartitionState
    unclean: bool = False
    last_known_leader: bool = False


def _next(
    state: PartitionState, leader: int, isr: Sequence[int], controller_epoch: int
) -> PartitionState:
    # ELR fields carried as they are: the controller applies ``with_elr`` to the result.
    return replace(
        state,
        leader=leader,
        leader_epoch=state.leader_epoch + 1,
        isr=tuple(isr),
        controller_epoch=controller_epoch,
        last_known_leader=NO_LEADER,
    )


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
    offline early). A follower leaving the ISR bumps the epoch here (unlike a dead one
    in ``reconcile``): the stopping broker still fetches, and its fetches at the old
    epoch are fenced rather than bring it back into the ISR (why the ZooKeeper-era
    controller bumped it; KRaft rejects a shutting-down broker's ISR join instead).
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


def leadership_predates_leader(
    state: PartitionState, written_zxid: int, broker_epochs: Mapping[int, int]
) -> bool:
    """True if the state names a live leader that registered after the state was written.

    ``broker_epochs``: live brokers' epochs (registration creation zxids). A leader not
    live is not "predating" (the ordinary offline case).
    """
    epoch = broker_epochs.get(state.leader)
    return state.leader != NO_LEADER and epoch is not None and epoch > written_zxid


# --- KIP-966: eligible leader replicas ---------------------------------------------------


def _unique_sorted(members: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(members)))


def with_elr(
    before: PartitionState,
    after: PartitionState,
    min_isr: int,
    crashed: Collection[int] = (),
) -> PartitionState:
    """``after`` (an ISR change of ``before``) with KIP-966's ELR bookkeeping.

    ``after.isr`` at least ``min_isr`` long: ELR and last known ELR empty. Else the ELR is
    every member of ``before``'s ISR and ELR not in the new ISR and not in ``crashed``
    (replicas that restarted uncleanly), and the last known ELR keeps its members plus
    those crashed ones, minus the new ISR and ELR (Kafka's ``maybePopulateTargetElr``).
    Sorted by broker id. Other fields are ``after``'s.
    """
    if len(after.isr) >= min_isr:
        return replace(after, elr=(), last_known_elr=())
    isr = set(after.isr)
    left_out = set(crashed)
    candidates = {*before.isr, *before.elr}
    elr = _unique_sorted(r for r in candidates if r not in isr and r not in left_out)
    last_known = _unique_sorted(
        r
        for r in (*before.last_known_elr, *candidates)
        if r not in isr and r not in elr and (r in left_out or r in before.last_known_elr)
    )
    return replace(after, elr=elr, last_known_elr=last_known)


def crashed_replicas(
    replicas: Sequence[int],
    state: PartitionState,
    written_zxid: int,
    broker_epochs: Mapping[int, int],
    unclean: Collection[int],
) -> set[int]:
    """Replicas of the partition that restarted uncleanly since the state's last
    controller write took the registrations into account.

    ``unclean``: live brokers whose registration reports an unclean last stop;
    ``broker_epochs``: live brokers' epochs. The state's ``brokers_zxid`` is the bound
    (``written_zxid``, the znode's last write, for a state that has none).
    """
    seen = state.brokers_zxid or written_zxid
    return {r for r in replicas if r in unclean and broker_epochs.get(r, -1) > seen}


def reconcile(
    replicas: Sequence[int],
    state: PartitionState,
    live: Collection[int],
    *,
    crashed: Collection[int] = (),
    leader_bounced: bool = False,
    min_isr: int = 1,
    unclean_allowed: bool = False,
    controller_epoch: int,
    brokers_zxid: int = 0,
) -> Elected | None:
    """The controller's decision for one partition on a change of brokers (or None: no
    write needed). The module docstring's rules, in order:

    * ``crashed`` replicas (``crashed_replicas``) leave the ISR and the ELR; the write
      records ``brokers_zxid`` (the registrations read) even if nothing else changes,
      so each unclean restart is handled once;
    * a partition whose leader is dead, bounced (``leadership_predates_leader``),
      crashed or missing gets a leader by the election order, or goes (stays) offline
      with its last known leader remembered;
    * otherwise dead followers leave the ISR.

    Every change of leader bumps the leader epoch; an ISR shrink under the same leader,
    and a change of ELR, last known ELR or ``brokers_zxid`` alone, do not.
    """
    live = set(live)
    crashed = set(crashed)
    isr = [r for r in state.isr if r not in crashed]
    elr = [r for r in state.elr if r not in crashed]
    seen = max(brokers_zxid, state.brokers_zxid)
    last_known = state.leader if state.leader != NO_LEADER else state.last_known_leader

    def bumped(leader: int, new_isr: Sequence[int]) -> PartitionState:
        after = PartitionState(
            leader,
            state.leader_epoch + 1,
            tuple(new_isr),
            controller_epoch,
            state.elr,
            state.last_known_elr,
            NO_LEADER if leader != NO_LEADER else last_known,
            seen,
        )
        return with_elr(state, after, min_isr, crashed)

    def fresh(leader: int) -> PartitionState:
        # Last known leader or unclean: the log of ``leader`` is the truth from now on.
        return PartitionState(
            leader, state.leader_epoch + 1, (leader,), controller_epoch, (), (), NO_LEADER, seen
        )

    leader_gone = (
        state.leader == NO_LEADER
        or state.leader not in live
        or leader_bounced
        or state.leader in crashed
    )
    if leader_gone:
        for replica in replicas:
            if replica in live and replica in isr:
                return Elected(bumped(replica, [r for r in isr if r in live]))
        for replica in replicas:
            if replica in live and replica in elr:
                return Elected(bumped(replica, [replica]))
        if not isr and not elr and last_known in live:
            return Elected(fresh(last_known), last_known_leader=True)
        if unclean_allowed:
            for replica in replicas:
                if replica in live:
                    return Elected(fresh(replica), unclean=True)
        if state.leader == NO_LEADER and not crashed:
            return None  # offline already, nothing new
        if state.leader == NO_LEADER and tuple(isr) == state.isr:
            # Still offline, the ISR unchanged: the ELR change alone (same epoch).
            return Elected(_same_epoch(state, min_isr, crashed, controller_epoch, seen))
        return Elected(bumped(NO_LEADER, isr))
    new_isr = tuple(r for r in isr if r in live)
    if new_isr != state.isr:
        after = replace(state, isr=new_isr, controller_epoch=controller_epoch, brokers_zxid=seen)
        return Elected(with_elr(state, after, min_isr, crashed))
    if crashed:
        return Elected(_same_epoch(state, min_isr, crashed, controller_epoch, seen))
    return None


def _same_epoch(
    state: PartitionState,
    min_isr: int,
    crashed: Collection[int],
    controller_epoch: int,
    brokers_zxid: int,
) -> PartitionState:
    """The ISR unchanged, crashed replicas out of the ELR, the registrations recorded."""
    after = replace(state, controller_epoch=controller_epoch, brokers_zxid=brokers_zxid)
    return with_elr(state, after, min_isr, crashed)
