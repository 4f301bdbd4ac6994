"""Manual replica assignments (Kafka's CreateTopics ``assignments`` and CreatePartitions
``assignments``): the rules a given assignment must keep, pure.

A manual assignment names, per partition, the brokers that hold its replicas; the first
of each list is the partition's preferred leader (and its first leader). The rules and
their messages are Kafka's KRaft controller's (``ReplicationControlManager.createTopic``,
``createPartitions`` and ``validateManualPartitionAssignment``), so a client sees the
same ``INVALID_REPLICA_ASSIGNMENT`` / ``INVALID_REQUEST`` text from Tidelog as from Kafka:

- a topic with an assignment gives neither a partition count nor a replication factor
  (Kafka's -1; ``INVALID_REQUEST``): both come from the assignment;
- no partition is named twice; the partitions are ``0..n-1`` (a topic) or continue the
  topic's count (growth, where the lists come in order, one per new partition);
- no list is empty, names a broker twice, or names a broker that is not registered;
- every list has the same length: the first list's (a topic) or the topic's replication
  factor (growth);
- growth gives exactly one list per new partition.

Decision (Kafka's too): a broker is checked in sorted order within a list, so the first
unknown or repeated broker by id is the one named. "Registered" is what the checking
broker knows: the controller checks against the live registrations in ZooKeeper (the
authoritative check); a broker answering ``validate_only`` checks against its own view of
the cluster; a single node against its own id.

Thread-safe: functions of their arguments only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from tidelog.storage.errors import InvalidReplicaAssignmentError, InvalidRequestError

__all__ = ["check_growth_assignment", "check_replicas", "check_topic_assignment"]


def check_replicas(
    replicas: Sequence[int], registered: Collection[int] | None, replication_factor: int | None
) -> tuple[int, ...]:
    """One partition's replica list, checked (Kafka's ``validateManualPartitionAssignment``).

    Args:
        replicas: the brokers, preferred leader first.
        registered: the broker ids that may hold replicas; None: not checked here (the
            controller checks it).
        replication_factor: the length every list must have; None: any (the first list
            of a new topic sets it).

    Returns:
        the list as a tuple, order kept.

    Raises:
        InvalidReplicaAssignmentError: empty, a broker twice, an unknown broker, or a
            length other than ``replication_factor``.
    """
    if not replicas:
        raise InvalidReplicaAssignmentError(
            "The manual partition assignment includes an empty replica list."
        )
    previous: int | None = None
    for broker in sorted(replicas):
        if registered is not None and broker not in registered:
            raise InvalidReplicaAssignmentError(
                f"The manual partition assignment includes broker {broker}, but no such "
                "broker is registered."
            )
        if broker == previous:
            raise InvalidReplicaAssignmentError(
                f"The manual partition assignment includes the broker {broker} more than once."
            )
        previous = broker
    if replication_factor is not None and len(replicas) != replication_factor:
        raise InvalidReplicaAssignmentError(
            f"The manual partition assignment includes a partition with {len(replicas)} "
            "replica(s), but this is not consistent with previous partitions, which have "
            f"{replication_factor} replica(s)."
        )
    return tuple(replicas)


def check_topic_assignment(
    assignment: Sequence[tuple[int, Sequence[int]]],
    registered: Collection[int] | None,
    *,
    partitions: int | None = None,
    replication_factor: int | None = None,
) -> dict[int, tuple[int, ...]]:
    """A new topic's manual assignment, checked in request order (Kafka's
    ``createTopic``).

    Args:
        assignment: (partition, replicas) pairs as the request lists them (non-empty).
        registered: as ``check_replicas``.
        partitions, replication_factor: what the request gave besides the assignment;
            None is Kafka's -1 (unset), the only value allowed with an assignment.

    Returns:
        partition -> replicas, for partitions ``0..n-1``.

    Raises:
        InvalidRequestError: a count or a factor given too.
        InvalidReplicaAssignmentError: any rule of the module docstring.
        ValueError: an empty ``assignment`` (the caller's bug: no assignment is None).
    """
    if not assignment:
        raise ValueError("an empty manual assignment: pass None for none")
    if replication_factor is not None:
        raise InvalidRequestError(
            "A manual partition assignment was specified, but replication factor was not set to -1."
        )
    if partitions is not None:
        raise InvalidRequestError(
            "A manual partition assignment was specified, but numPartitions was not set to -1."
        )
    placed: dict[int, tuple[int, ...]] = {}
    factor: int | None = None
    for partition, replicas in assignment:
        if partition in placed:
            raise InvalidReplicaAssignmentError(
                f"Found multiple manual partition assignments for partition {partition}"
            )
        placed[partition] = check_replicas(replicas, registered, factor)
        factor = len(replicas)
    if set(placed) != set(range(len(placed))):
        raise InvalidReplicaAssignmentError(
            "partitions should be a consecutive 0-based integer sequence"
        )
    return dict(sorted(placed.items()))


def check_growth_assignment(
    assignment: Sequence[Sequence[int]],
    registered: Collection[int] | None,
    *,
    current: int,
    total: int,
    replication_factor: int,
) -> dict[int, tuple[int, ...]]:
    """The replicas of a topic's new partitions ``current..total-1``, one list each in
    order (Kafka's ``createPartitions``). The caller has checked ``total > current``.

    Raises:
        InvalidReplicaAssignmentError: not one list per new partition, or any rule of
            ``check_replicas`` with the topic's ``replication_factor``.
    """
    additional = total - current
    if len(assignment) != additional:
        raise InvalidReplicaAssignmentError(
            f"Attempted to add {additional} additional partition(s), but only "
            f"{len(assignment)} assignment(s) were specified."
        )
    return {
        current + i: check_replicas(replicas, registered, replication_factor)
        for i, replicas in enumerate(assignment)
    }
