"""The share-group assignor: which members may fetch which partitions. Pure, no I/O.

In a share group a partition is not owned: every member it is assigned to fetches from it,
and the share-partition hands each record to one of them (``broker.share.partition``).
So the assignor's job differs from the consumer groups' (``broker.groups.assignor``): it
spreads the members over the partitions so that every partition has members fetching it and
every member has partitions to fetch, even when the members outnumber the partitions.
After Kafka's share ``SimpleAssignor`` (KIP-932), each topic on its own, with the members
that subscribe to it (``n`` of them) and its ``P`` partitions:

* **sharing**: every partition gets exactly ``s = ceil(n / P)`` members (1 while the
  members do not outnumber the partitions);
* **balance**: the ``s * P`` (member, partition) pairs are spread so that the members'
  counts differ by at most one; so every subscriber gets at least one partition of every
  subscribed topic that has partitions, and at most ``P``;
* **only to subscribers**, every partition of a subscribed, existing topic assigned;
* **sticky**: a member keeps what it had as far as the two rules above allow; the result is
  a fixed point (assigning it again changes nothing), and while ``s`` does not change, a
  member leaving moves nobody else's partitions.

With 3 members on 2 partitions, both partitions get 2 members and one member fetches from
both: each partition is read by as many members as the other (a partition left with one
member would drain at half the rate), which is why Kafka shares partitions equally rather
than giving each member one partition. Balance is per topic, as Kafka's heterogeneous
builder does it, also when every member subscribes to the same topics (Kafka's homogeneous
builder balances over all of them at once); the difference shows only with several topics,
where a member may get one partition of each.

Algorithm per topic (deterministic; ties broken by member id, then partition number):

1. quotas: with ``base, extra = divmod(s * P, n)``, every member gets ``base`` pairs and
   ``extra`` of them one more;
2. keep: each member keeps its current partitions (lowest first) up to ``base``, then those
   that had more keep one more while extra slots remain (most holdings first), a partition
   never past ``s`` members;
3. fill: the partition with the fewest members gets the member with the fewest partitions
   that lacks it and has room (under ``base``; or at it, taking an extra slot). This never
   runs out of takers: with ``n <= P`` a short partition has no member at all (``s`` is 1);
   with ``n > P``, ``base`` is 1, so a member with room has nothing yet (and lacks the
   partition) or has one partition with an extra slot left, and if every such member were
   on the short partition, the members with two (``n - s + 1`` at least) would have
   used more extra slots than there are (``s * P - n``, one still unused): that needs
   ``2n + 2 <= s * (P + 1)``, impossible for ``s = ceil(n / P)``. An exhaustive check
   of every current assignment (up to 6 members on 3 partitions, 4 on 4) agreed; the
   code asserts it.

Thread-safe (no state).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from tidelog.storage.types import TopicPartition

__all__ = ["Assignment", "assign", "sharing"]

log = logging.getLogger(__name__)

Assignment = frozenset[TopicPartition]


def sharing(members: int, partitions: int) -> int:
    """How many members every partition of a topic gets: ``ceil(members / partitions)``
    (0 without members or partitions)."""
    if members <= 0 or partitions <= 0:
        return 0
    return -(-members // partitions)


def assign(
    subscriptions: Mapping[str, frozenset[str]],
    partition_counts: Mapping[str, int],
    current: Mapping[str, Assignment],
) -> dict[str, Assignment]:
    """The next target assignment (see the module docstring).

    Args:
        subscriptions: member id -> the topic names it subscribes to. Topics absent from
            ``partition_counts`` (or with no partitions) are ignored until they exist.
        partition_counts: topic -> partition count of the topics that exist.
        current: member id -> its current target. Entries of unknown members, partitions
            that no longer exist or are no longer subscribed are ignored.

    Returns:
        member id -> assignment, with an entry (possibly empty) for every member.
    """
    out: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    subscribers: dict[str, list[str]] = {}
    for member in sorted(subscriptions):
        for topic in subscriptions[member]:
            if partition_counts.get(topic, 0) > 0:
                subscribers.setdefault(topic, []).append(member)
    for topic in sorted(subscribers):
        members = subscribers[topic]
        count = partition_counts[topic]
        held = {
            m: {tp.partition for tp in current.get(m, ()) if tp.topic == topic} for m in members
        }
        for member, partitions in _assign_topic(members, count, held).items():
            out[member].update(TopicPartition(topic, p) for p in partitions)
    return {m: frozenset(tps) for m, tps in out.items()}


def _assign_topic(
    members: list[str], count: int, held: Mapping[str, set[int]]
) -> dict[str, set[int]]:
    """One topic's assignment: ``members`` sorted, ``count`` partitions, ``held`` the
    partition numbers each member has now (out-of-range ones are ignored)."""
    share = sharing(len(members), count)
    base, extras = divmod(share * count, len(members))
    valid = {m: sorted(p for p in held.get(m, ()) if 0 <= p < count) for m in members}
    assigned: dict[str, set[int]] = {m: set() for m in members}
    holders: list[set[str]] = [set() for _ in range(count)]

    # 2. Keep: up to the base quota each, then one more for those who had more, while
    # extra slots remain (most holdings first).
    by_holding = sorted(members, key=lambda m: (-len(valid[m]), m))
    for limit in (base, base + 1):
        for member in by_holding:
            if limit > base and extras == 0:
                break
            for partition in valid[member]:
                if len(assigned[member]) >= limit:
                    break
                if partition not in assigned[member] and len(holders[partition]) < share:
                    _give(assigned, holders, member, partition)
            if limit > base and len(assigned[member]) == base + 1:
                extras -= 1

    # 3. Fill, each step adding one pair, so it ends after at most share * count steps.
    while True:
        short = [p for p in range(count) if len(holders[p]) < share]
        if not short:
            break
        partition = min(short, key=lambda p: (len(holders[p]), p))
        chosen = _taker(members, assigned, base, extras, holders[partition])
        assert chosen is not None, "share assignor: no member can take a short partition"
        extras -= len(assigned[chosen]) == base
        _give(assigned, holders, chosen, partition)
    return assigned


def _taker(
    members: list[str],
    assigned: Mapping[str, set[int]],
    base: int,
    extras: int,
    excluded: set[str],
) -> str | None:
    """The member not in ``excluded`` with room that has the fewest partitions (under
    the base quota first; at it, while extra slots remain); None if there is none."""
    room = [m for m in members if m not in excluded and len(assigned[m]) < base]
    if not room and extras > 0:
        room = [m for m in members if m not in excluded and len(assigned[m]) == base]
    return min(room, key=lambda m: (len(assigned[m]), m), default=None)


def _give(assigned: dict[str, set[int]], holders: list[set[str]], member: str, p: int) -> None:
    assigned[member].add(p)
    holders[p].add(member)
