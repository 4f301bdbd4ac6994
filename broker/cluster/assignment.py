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
"""

from __future__ import annotations

from collections.abc import Sequence

from tidelog.storage.errors import InvalidReplicationFactorError

__all__ = ["assign_replicas"]


def assign_replicas(
    partitions: int,
    replication_factor: int,
    brokers: Sequence[int],
    *,
    start_index: int,
    replica_shift: int,
    first_partition: int = 0,
) -> dict[int, list[int]]:
    """Replica lists (preferred leader first) of ``partitions`` new partitions.

    ``first_partition`` numbers them (a topic that grows continues from its old count).

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
