"""Reassignment plans that move only what must move (``tidelog reassign generate``).

Kafka's ``kafka-reassign-partitions --generate`` computes a fresh placement of every
partition over the new broker list, so adding or removing one broker moves most replicas
of the cluster. Users ask for the opposite: move the replicas that have to move, and no
more. Given the current replicas of some partitions, the brokers they should live on
(``brokers``) and the brokers' racks, ``plan`` does two things, in order:

1. **Replace**: every replica on a broker that is not in ``brokers`` (removed, or being
   decommissioned) is replaced, in the same position of the list (so the preferred
   leader stays first unless it was the one removed), by a broker of ``brokers`` that is
   not already a replica: one on a rack the partition has no replica on if there is
   such a broker, then the least loaded (fewest replicas in the plan so far), then the
   lowest id.
2. **Balance**: while a broker holds at least two replicas more than another (a broker
   just added holds none), one replica moves from the most loaded to the least loaded
   broker: in a partition that does not have the least loaded broker yet, and only if
   the partition's racks stay as spread as before. Each move brings both brokers one
   step closer to each other, and none happens once every broker is within one replica
   of every other: a partition that already sits on listed brokers with such a load
   never moves. Stops when no move is left (rack rules may block one).

Loads count replicas of the partitions passed in (the topics asked for), as Kafka's tool
does. Pure: replica lists in, the changed partitions' new lists out; a property test
(hypothesis, ``tests/client/test_reassign_plan.py``) checks it over random clusters.
The JSON helpers read and write Kafka's reassignment file format::

    {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2]}]}
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from tidelog.client.types import TopicPartition

__all__ = ["plan", "plan_from_json", "plan_to_json", "rack_of"]


def rack_of(broker: int, racks: Mapping[int, str | None]) -> str:
    """``broker``'s rack; a broker without one is a rack of its own."""
    rack = racks.get(broker)
    return rack if rack else f"\0broker-{broker}"


def _rack_count(replicas: Sequence[int], racks: Mapping[int, str | None]) -> int:
    return len({rack_of(r, racks) for r in replicas})


def plan(
    current: Mapping[TopicPartition, Sequence[int]],
    brokers: Sequence[int],
    racks: Mapping[int, str | None] | None = None,
    *,
    balance: bool = True,
) -> dict[TopicPartition, tuple[int, ...]]:
    """The partitions of ``current`` whose replicas change, with their new lists
    (``balance`` False: step 1 only, as a decommission wants).

    Raises:
        ValueError: ``brokers`` is empty, or a partition has more replicas than there
            are brokers to put them on.
    """
    racks = racks or {}
    live = sorted(set(brokers))
    if not live:
        raise ValueError("no brokers to place replicas on")
    placed: dict[TopicPartition, list[int]] = {tp: list(r) for tp, r in sorted(current.items())}
    for tp, replicas in placed.items():
        if len(set(replicas)) > len(live):
            raise ValueError(
                f"{tp.topic}-{tp.partition} has {len(set(replicas))} replicas; only "
                f"{len(live)} broker(s) to put them on: {live}"
            )
    load = dict.fromkeys(live, 0)
    for replicas in placed.values():
        for r in replicas:
            if r in load:
                load[r] += 1
    # 1. Replace the replicas on brokers that are not in the list.
    for replicas in placed.values():
        for index, replica in enumerate(replicas):
            if replica in load:
                continue
            kept = [r for r in replicas if r in load]
            covered = {rack_of(r, racks) for r in kept}
            candidates = [b for b in live if b not in replicas]
            chosen = min(
                candidates,
                key=lambda b: (rack_of(b, racks) in covered, load[b], b),
            )
            replicas[index] = chosen
            load[chosen] += 1
    # 2. Balance: move one replica at a time from a broker to one holding at least two
    # fewer (each move narrows the spread; the sum of squared loads falls, so it ends).
    while balance and _move_one(placed, live, load, racks):
        pass
    return {
        tp: tuple(replicas)
        for tp, replicas in placed.items()
        if tuple(replicas) != tuple(current[tp])
    }


def _move_one(
    placed: dict[TopicPartition, list[int]],
    live: Sequence[int],
    load: dict[int, int],
    racks: Mapping[int, str | None],
) -> bool:
    """Move one replica from a broker to one with at least two fewer replicas, the most
    loaded and least loaded pair first, in a partition that keeps its rack spread;
    whether one moved."""
    donors = sorted(live, key=lambda b: (-load[b], b))
    takers = sorted(live, key=lambda b: (load[b], b))
    for donor in donors:
        for taker in takers:
            if load[donor] - load[taker] < 2:
                break
            for replicas in placed.values():
                if donor not in replicas or taker in replicas:
                    continue
                moved = [taker if r == donor else r for r in replicas]
                if _rack_count(moved, racks) < _rack_count(replicas, racks):
                    continue
                replicas[:] = moved
                load[donor] -= 1
                load[taker] += 1
                return True
    return False


def plan_to_json(moves: Mapping[TopicPartition, Sequence[int]]) -> str:
    """Kafka's reassignment file for ``moves``."""
    return json.dumps(
        {
            "version": 1,
            "partitions": [
                {"topic": tp.topic, "partition": tp.partition, "replicas": list(r)}
                for tp, r in sorted(moves.items())
            ],
        },
        indent=2,
    )


def plan_from_json(text: str) -> dict[TopicPartition, tuple[int, ...]]:
    """Parse Kafka's reassignment file (``log_dirs`` entries are accepted and ignored).

    Raises ``ValueError`` with what is wrong."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the plan is not JSON: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("partitions"), list):
        raise ValueError('the plan has no "partitions" list')
    out: dict[TopicPartition, tuple[int, ...]] = {}
    for entry in document["partitions"]:
        if not isinstance(entry, dict):
            raise ValueError(f"a plan entry is not an object: {entry!r}")
        topic, partition, replicas = (
            entry.get("topic"),
            entry.get("partition"),
            entry.get("replicas"),
        )
        if (
            not isinstance(topic, str)
            or not isinstance(partition, int)
            or isinstance(partition, bool)
            or not isinstance(replicas, list)
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in replicas)
        ):
            raise ValueError(f"a plan entry needs topic, partition and replicas: {entry!r}")
        out[TopicPartition(topic, partition)] = tuple(replicas)
    return out
