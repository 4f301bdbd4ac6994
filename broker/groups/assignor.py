"""The server-side assignor: who should own which partition. Pure, no I/O, no clock.

``assign`` turns the members' subscriptions, the subscribed topics' partition counts and
the group's current *target* assignment into the next target assignment. It is the
coordinator's only assignor (Kafka's ``uniform`` assignor plays this part; a client cannot
name another one here).

Guarantees, each checked by a property test (``tests/broker/test_groups_assignor.py``):

* **complete and exact**: every partition of every existing topic that someone subscribes
  to is assigned to exactly one member;
* **only to subscribers**: a member gets partitions of the topics it subscribes to only;
* **even**: if member A has two or more partitions more than member B, then none of A's
  partitions is of a topic B subscribes to (nothing could be moved from A to B). So members
  with the same subscription differ by at most one partition;
* **sticky**: a partition stays with its current owner unless balance needs it elsewhere.
  The result is a fixed point (assigning again changes nothing), and with identical
  subscriptions every member keeps at least ``min(kept before, floor(P / N))`` of the
  partitions it had.

Algorithm (deterministic, every tie broken by member id then partition order):

1. keep each member's current partitions that are still valid (the topic exists, has the
   partition, and the member still subscribes to it);
2. give each unassigned partition to its least-loaded subscriber, most constrained
   partitions first (those of topics with the fewest subscribers);
3. while some member has two or more partitions more than another member that could take
   one of them, move one (the highest-numbered) from the most loaded to the least loaded.
   Each move lowers the sum of squared counts, so the loop ends; moving only in this case
   is what keeps the result sticky.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Mapping

from tidelog.storage.types import TopicPartition

__all__ = ["Assignment", "TopicPartition", "assign", "partitions_of"]

log = logging.getLogger(__name__)


Assignment = frozenset[TopicPartition]


def partitions_of(topics: Mapping[str, int]) -> Assignment:
    """Every partition of ``topics`` (topic name -> partition count)."""
    return frozenset(TopicPartition(t, p) for t, count in topics.items() for p in range(count))


def assign(
    subscriptions: Mapping[str, frozenset[str]],
    partition_counts: Mapping[str, int],
    current: Mapping[str, Assignment],
) -> dict[str, Assignment]:
    """The next target assignment: even, sticky, complete (see the module docstring).

    Args:
        subscriptions: member id -> the topic names it subscribes to. Topics that do not
            exist (absent from ``partition_counts``) are ignored until they do.
        partition_counts: topic -> partition count of the topics that exist.
        current: member id -> its current target assignment. Entries of members no longer
            in ``subscriptions``, partitions that no longer exist or are no longer
            subscribed, and partitions listed for two members (only the first member in id
            order keeps it) are ignored.

    Returns:
        member id -> assignment, with an entry (possibly empty) for every member.
    """
    members = sorted(subscriptions)
    eligible = {
        m: frozenset(t for t in subscriptions[m] if partition_counts.get(t, 0) > 0) for m in members
    }
    subscribers: dict[str, list[str]] = {}
    for m in members:
        for topic in eligible[m]:
            subscribers.setdefault(topic, []).append(m)
    # owned[m][topic] is a sorted list of partition numbers; count[m] their total.
    owned: dict[str, dict[str, list[int]]] = {m: {} for m in members}
    count = dict.fromkeys(members, 0)
    taken: set[TopicPartition] = set()

    def give(member: str, tp: TopicPartition) -> None:
        bisect.insort(owned[member].setdefault(tp.topic, []), tp.partition)
        count[member] += 1
        taken.add(tp)

    # 1. Keep what is still valid.
    for m in members:
        for tp in sorted(current.get(m, ())):
            if (
                tp.topic in eligible[m]
                and 0 <= tp.partition < partition_counts[tp.topic]
                and tp not in taken
            ):
                give(m, tp)

    # 2. Place the rest, most constrained first, each on its least-loaded subscriber.
    unassigned = sorted(
        (
            TopicPartition(topic, p)
            for topic in subscribers
            for p in range(partition_counts[topic])
            if TopicPartition(topic, p) not in taken
        ),
        key=lambda tp: (len(subscribers[tp.topic]), tp),
    )
    for tp in unassigned:
        give(min(subscribers[tp.topic], key=lambda m: (count[m], m)), tp)

    # 3. Balance: move from the most loaded to the least loaded that can take it.
    moves = 0
    while True:
        moved = False
        for hi in sorted(members, key=lambda m: (-count[m], m)):
            receivers = sorted(
                (m for m in members if count[m] <= count[hi] - 2), key=lambda m: (count[m], m)
            )
            for lo in receivers:
                shared = sorted(t for t in owned[hi] if owned[hi][t] and t in eligible[lo])
                if shared:
                    topic = shared[-1]
                    partition = owned[hi][topic].pop()
                    count[hi] -= 1
                    bisect.insort(owned[lo].setdefault(topic, []), partition)
                    count[lo] += 1
                    moves += 1
                    moved = True
                    break
            if moved:
                break
        if not moved:
            break
    if moves:
        log.debug("assignor moved %d partition(s) to balance %d member(s)", moves, len(members))

    return {
        m: frozenset(TopicPartition(t, p) for t, parts in owned[m].items() for p in parts)
        for m in members
    }
