"""Where a new topic's partition replicas go: Kafka's rack-unaware round robin.

Kafka's ``AdminUtils.assignReplicasToBrokersRackUnaware``: with the live broker ids sorted,
partition ``p``'s first replica (its preferred leader) is broker
``(p + start_index) % n``; the other replicas follow at a shift that grows by one every
``n`` partitions, so that the followers of one broker's partitions are spread over the
others instead of always being its neighbour::

    shift(j) = 1 + (replica_shift + j) % (n - 1)        for the j-th follower
    replica  = (first + shift(j)) % n

Kafka picks ``start_index`` and ``replica_shift`` at random for each topic, so that
leaders of many small topics do not all land on the first broker; callers pass them in
(the controller draws them), which keeps this module pure and testable.

**Racks** (``broker.rack``, Kafka's ``assignReplicasToBrokersRackAware``): when any broker
has a rack, the brokers are first ordered alternating between racks (the first broker of
each rack, then the second of each...), the first replica goes round robin over that
order as above, and each follower is the next broker at the shift that is on a rack with
no replica of the partition yet (once every rack has one, any broker not chosen yet). So
a partition's replicas cover ``min(replication factor, racks)`` racks and leaders spread
over racks. A broker without a rack counts as a rack of its own (Kafka refuses a mix;
Tidelog places it rather than fail a topic creation because one broker lacks the key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tidelog.storage.errors import InvalidReplicationFactorError

__all__ = ["assign_replicas", "rack_alternated", "rack_of"]


def assign_replicas(
    partitions: int,
    replication_factor: int,
    brokers: Sequence[int],
    *,
    start_index: int,
    replica_shift: int,
    first_partition: int = 0,
    racks: Mapping[int, str | None] | None = None,
) -> dict[int, list[int]]:
    """Replica lists (preferred leader first) of ``partitions`` new partitions.

    ``first_partition`` numbers them (a topic that grows continues from its old count);
    ``racks`` maps broker ids to their racks (rack-aware placement when any is set).

    Raises:
        InvalidReplicationFactorError: ``replication_factor`` is below 1 or above the
            number of brokers.
        ValueError: no brokers, or a negative partition count.
    """
    ids = sorted(set(brokers))
    count = len(ids)
    if partitions < 0:
        raise ValueError(f"partitions must be >= 0, got {partitions}")
    if count == 0:
        raise InvalidReplicationFactorError("no live brokers to place replicas on")
    if not 1 <= replication_factor <= count:
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} needs 1 to {count} brokers "
            f"({count} alive: {ids})"
        )
    start = start_index % count
    shift = replica_shift % count
    if racks and any(racks.get(b) for b in ids):
        return _rack_aware(
            partitions, replication_factor, ids, racks, start, shift, first_partition
        )
    out: dict[int, list[int]] = {}
    for partition in range(first_partition, first_partition + partitions):
        if partition > 0 and partition % count == 0:
            shift += 1
        first = (partition + start) % count
        replicas = [ids[first]]
        for j in range(replication_factor - 1):
            step = 1 + (shift + j) % (count - 1)
            replicas.append(ids[(first + step) % count])
        out[partition] = replicas
    return out


def rack_of(broker: int, racks: Mapping[int, str | None]) -> str:
    """``broker``'s rack; one without a rack is a rack of its own."""
    rack = racks.get(broker)
    return rack if rack else f"\0broker-{broker}"


def rack_alternated(brokers: Sequence[int], racks: Mapping[int, str | None]) -> list[int]:
    """``brokers`` ordered alternating between racks (racks and brokers in id order):
    the first of each rack, then the second of each..."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(set(brokers)):
        by_rack.setdefault(rack_of(broker, racks), []).append(broker)
    ordered_racks = sorted(by_rack)
    out: list[int] = []
    depth = max((len(v) for v in by_rack.values()), default=0)
    for i in range(depth):
        for rack in ordered_racks:
            if i < len(by_rack[rack]):
                out.append(by_rack[rack][i])
    return out


def _rack_aware(
    partitions: int,
    replication_factor: int,
    ids: list[int],
    racks: Mapping[int, str | None],
    start: int,
    shift: int,
    first_partition: int,
) -> dict[int, list[int]]:
    order = rack_alternated(ids, racks)
    count = len(order)
    rack_count = len({rack_of(b, racks) for b in order})
    out: dict[int, list[int]] = {}
    for partition in range(first_partition, first_partition + partitions):
        if partition > 0 and partition % count == 0:
            shift += 1
        first = (partition + start) % count
        replicas = [order[first]]
        used_racks = {rack_of(order[first], racks)}
        k = 0
        while len(replicas) < replication_factor:
            step = 1 + (shift + k) % max(count - 1, 1)
            k += 1
            candidate = order[(first + step) % count]
            rack = rack_of(candidate, racks)
            if candidate in replicas:
                pass
            elif rack not in used_racks or len(used_racks) >= rack_count:
                replicas.append(candidate)
                used_racks.add(rack)
                continue
            if k >= 2 * count:  # every broker seen twice: take any one not chosen yet
                candidate = next(b for b in order if b not in replicas)
                replicas.append(candidate)
                used_racks.add(rack_of(candidate, racks))
        out[partition] = replicas
    return out
