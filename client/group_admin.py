"""Consumer-group administration across a cluster: where each call goes, and lag.

Thin functions over ``client.routing.ClusterConnections``, used by ``AdminClient``:

- group-scoped calls (``DescribeGroup``, ``DeleteGroup``, ``OffsetFetch``,
  ``OffsetCommit``) go to the group's coordinator (``FindCoordinator``) and follow it on
  ``NOT_COORDINATOR`` or a coordinator without a leader (``LEADER_NOT_AVAILABLE``, which
  Tidelog answers where Kafka says ``COORDINATOR_NOT_AVAILABLE``), within the call's
  timeout: a call of several steps shares one deadline among them;
- ``list_groups`` asks every live broker (each knows the groups it coordinates) and
  merges the answers;
- log offsets (a partition's log start and end, the first offset at a timestamp) come
  from each partition's leader, never from the coordinator: in a cluster the coordinator
  holds no records of the partitions it does not lead. So lag is computed here, as
  Kafka's ``kafka-consumer-groups`` tool does (committed offsets from the coordinator,
  log end offsets from the leaders), and an offset reset is resolved here into offsets
  that an admin commit (``OffsetCommit`` without a member id, refused while the group
  has members) then writes at the coordinator.

The pure part, ``reset_offset`` (a target plus a partition's log start and end to the
offset to commit) and ``partition_lag``, takes integers only.

Stateless and thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Literal

from tidelog.client.connection import Connection
from tidelog.client.offsets import commit_offsets, fetch_committed, list_offsets
from tidelog.client.routing import ROUTING_ERRORS, ClusterConnections
from tidelog.client.types import (
    GroupDescription,
    GroupMember,
    GroupPartitionLag,
    GroupSummary,
    TopicPartition,
)
from tidelog.storage.errors import TidelogError, UnknownTopicOrPartitionError

__all__ = [
    "GroupDescription",
    "GroupMember",
    "GroupPartitionLag",
    "GroupSummary",
    "ResetTarget",
    "alter_group_offsets",
    "delete_group",
    "describe_group",
    "list_group_offsets",
    "list_groups",
    "partition_lag",
    "reset_group_offsets",
    "reset_offset",
]

log = logging.getLogger(__name__)

_EARLIEST = -2
_LATEST = -1

ResetTarget = tuple[Literal["earliest", "latest", "offset", "timestamp"], int]
"""Where ``reset_group_offsets`` moves a group: ``(kind, value)``; value 0 for the ends."""


# --- pure -----------------------------------------------------------------------------------


def partition_lag(committed: int | None, log_start_offset: int, log_end_offset: int) -> int:
    """How far a group is behind on a partition: the log end minus the committed offset,
    or minus the log start when nothing is committed (the whole log is still to read).
    -1 when the log end is not known."""
    if log_end_offset < 0:
        return -1
    if committed is None:
        return max(log_end_offset - max(log_start_offset, 0), 0)
    return log_end_offset - committed


def reset_offset(
    target: ResetTarget, log_start_offset: int, log_end_offset: int, found: int | None
) -> int:
    """The offset a reset commits for one partition.

    ``found``: for a timestamp target, the first offset at or after it (None: no record
    that recent, so the log end). An offset target is clamped to [log start, log end], as
    Kafka's tool does.
    """
    kind, value = target
    if kind == "earliest":
        return log_start_offset
    if kind == "latest":
        return log_end_offset
    if kind == "offset":
        return min(max(value, log_start_offset), log_end_offset)
    return log_end_offset if found is None else found


# --- calls ----------------------------------------------------------------------------------


def list_groups(connections: ClusterConnections, timeout_ms: int | None) -> list[GroupSummary]:
    """Every group of every live broker, sorted by id.

    Each broker lists the groups it coordinates; one listed by two brokers (a broker that
    coordinated it before a move and still remembers it) is shown with the answer that
    has members, else the first.
    """

    def ask(connection: Connection, timeout: int) -> list[GroupSummary]:
        return connection.list_groups(timeout_ms=timeout)

    found: dict[str, GroupSummary] = {}
    answers = connections.run_on_every_broker(ask, what="ListGroups", timeout_ms=timeout_ms)
    for _, groups in sorted(answers.items()):
        for group in groups:
            seen = found.get(group.group_id)
            if seen is None or (seen.members == 0 and group.members > 0):
                found[group.group_id] = group
    return sorted(found.values(), key=lambda g: g.group_id)


def describe_group(
    connections: ClusterConnections, group_id: str, timeout_ms: int | None
) -> GroupDescription:
    """Members and assignment from the coordinator; lag against each partition's leader.

    The coordinator's own log end and lag figures are replaced: it holds records only of
    the partitions it leads. A partition whose leader cannot answer now (offline, its
    broker unreachable, a leader that moved during the call) shows log end and lag -1
    rather than holding the whole description up: it is a view, asked again at will.
    """
    left = connections.time_left(timeout_ms)
    described = connections.run(
        connections.route_coordinator(group_id),
        lambda connection, timeout: connection.describe_group(group_id, timeout_ms=timeout),
        what=f"DescribeGroup {group_id}",
        timeout_ms=left(),
        group_id=group_id,
    )
    tps = [p.tp for p in described.partitions]
    ends = _leader_offsets(connections, dict.fromkeys(tps, _LATEST), left())
    uncommitted = [p.tp for p in described.partitions if p.committed_offset is None]
    uncommitted = [tp for tp in uncommitted if tp in ends]
    starts = _leader_offsets(connections, dict.fromkeys(uncommitted, _EARLIEST), left())
    partitions = []
    for p in described.partitions:
        end = ends.get(p.tp, -1)
        lag = partition_lag(p.committed_offset, starts.get(p.tp, 0), end)
        partitions.append(replace(p, log_end_offset=end, lag=lag))
    return replace(described, partitions=tuple(partitions))


def delete_group(connections: ClusterConnections, group_id: str, timeout_ms: int | None) -> None:
    """Delete an empty group and its committed offsets, at its coordinator."""
    connections.run(
        connections.route_coordinator(group_id),
        lambda connection, timeout: connection.delete_group(group_id, timeout_ms=timeout),
        what=f"DeleteGroup {group_id}",
        timeout_ms=timeout_ms,
        group_id=group_id,
    )


def delete_offsets(
    connections: ClusterConnections,
    group_id: str,
    partitions: Sequence[TopicPartition],
    timeout_ms: int | None,
) -> dict[TopicPartition, TidelogError | None]:
    """Delete some of a group's committed offsets, at its coordinator (OffsetDelete):
    per partition None or its error."""
    return connections.run(
        connections.route_coordinator(group_id),
        lambda connection, timeout: connection.delete_offsets(
            group_id, partitions, timeout_ms=timeout
        ),
        what=f"OffsetDelete {group_id}",
        timeout_ms=timeout_ms,
        group_id=group_id,
    )


def list_group_offsets(
    connections: ClusterConnections,
    group_id: str,
    partitions: Iterable[TopicPartition] | None,
    timeout_ms: int,
) -> dict[TopicPartition, int]:
    """The group's committed offsets (``partitions`` None: every committed partition)."""
    wanted = [] if partitions is None else list(partitions)
    if partitions is not None and not wanted:
        return {}
    return dict(sorted(fetch_committed(connections, group_id, wanted, timeout_ms).items()))


def alter_group_offsets(
    connections: ClusterConnections,
    group_id: str,
    offsets: Mapping[TopicPartition, int],
    timeout_ms: int,
) -> None:
    """Commit ``offsets`` for an empty group (an admin commit at the coordinator).

    Raises ``GroupNotEmptyError`` while the group has members, or the first partition's
    error (``UnknownTopicOrPartitionError``...) after the others were committed.
    """
    if not offsets:
        return
    failed = commit_offsets(
        connections, group_id, offsets, member_id="", member_epoch=-1, timeout_ms=timeout_ms
    )
    if failed:
        raise next(iter(failed.values()))


def reset_group_offsets(
    connections: ClusterConnections,
    group_id: str,
    partitions: str | Iterable[TopicPartition] | None,
    target: ResetTarget,
    timeout_ms: int,
) -> dict[TopicPartition, int]:
    """Move an empty group's committed offsets to ``target``; the new offset per partition.

    ``partitions``: a topic (all its partitions), some partitions, or None (every
    partition the group has committed). The offsets are resolved at each partition's
    leader and committed at the coordinator. A partition the cluster does not know is
    left out and its ``UnknownTopicOrPartitionError`` raised after the others were moved.

    Raises ``GroupNotEmptyError`` while the group has members (nothing moves).
    """
    left = connections.time_left(timeout_ms)
    chosen: str | list[TopicPartition]
    if partitions is None:
        chosen = sorted(fetch_committed(connections, group_id, [], left()))
    else:
        chosen = partitions if isinstance(partitions, str) else list(partitions)
    offsets, unknown = _resolve(connections, chosen, target, left())
    alter_group_offsets(connections, group_id, offsets, left())
    if unknown is not None:
        raise unknown
    return dict(sorted(offsets.items()))


def reset_target(
    *,
    to_earliest: bool = False,
    to_latest: bool = False,
    to_offset: int | None = None,
    to_timestamp_ms: int | None = None,
) -> ResetTarget:
    """The one reset target given. Raises ``ValueError`` for none, several, or a negative
    offset or timestamp."""
    targets = {
        "to_earliest": to_earliest or None,
        "to_latest": to_latest or None,
        "to_offset": to_offset,
        "to_timestamp_ms": to_timestamp_ms,
    }
    chosen = {k: v for k, v in targets.items() if v is not None}
    if len(chosen) != 1:
        raise ValueError(
            "a reset takes exactly one of to_earliest, to_latest, to_offset, "
            f"to_timestamp_ms; got {sorted(chosen) or 'none'}"
        )
    for name in ("to_offset", "to_timestamp_ms"):
        value = chosen.get(name)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if to_earliest:
        return ("earliest", 0)
    if to_latest:
        return ("latest", 0)
    if to_offset is not None:
        return ("offset", to_offset)
    assert to_timestamp_ms is not None
    return ("timestamp", to_timestamp_ms)


def resolve_reset(
    connections: ClusterConnections,
    partitions: str | list[TopicPartition],
    target: ResetTarget,
    timeout_ms: int,
) -> dict[TopicPartition, int]:
    """The offset ``target`` means on each partition (a topic: all of its partitions),
    resolved at the partitions' leaders, sorted. Raises ``UnknownTopicOrPartitionError``
    for a partition the cluster does not know."""
    offsets, unknown = _resolve(connections, partitions, target, timeout_ms)
    if unknown is not None:
        raise unknown
    return offsets


def _resolve(
    connections: ClusterConnections,
    partitions: str | list[TopicPartition],
    target: ResetTarget,
    timeout_ms: int,
) -> tuple[dict[TopicPartition, int], TidelogError | None]:
    left = connections.time_left(timeout_ms)
    unknown: TidelogError | None = None
    if isinstance(partitions, str):
        count = connections.metadata(timeout_ms=left(), force=True).partition_count(partitions)
        if count is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {partitions!r}")
        chosen = [TopicPartition(partitions, p) for p in range(count)]
    else:
        wanted = list(dict.fromkeys(partitions))
        metadata = connections.metadata(timeout_ms=left(), force=True)
        chosen = [tp for tp in wanted if metadata.partition(tp) is not None]
        missing = [tp for tp in wanted if metadata.partition(tp) is None]
        if missing:
            unknown = UnknownTopicOrPartitionError(f"{missing[0]}: unknown topic or partition")
    kind, value = target
    starts: dict[TopicPartition, int] = {}
    ends: dict[TopicPartition, int] = {}
    found: dict[TopicPartition, int] = {}
    if kind in ("earliest", "offset"):
        starts = _log_offsets(connections, dict.fromkeys(chosen, _EARLIEST), left())
    if kind in ("latest", "offset", "timestamp"):
        ends = _log_offsets(connections, dict.fromkeys(chosen, _LATEST), left())
    if kind == "timestamp":
        found = _log_offsets(connections, dict.fromkeys(chosen, value), left())
    offsets = {
        tp: reset_offset(
            target,
            starts.get(tp, 0),
            ends.get(tp, 0),
            found[tp] if found.get(tp, -1) >= 0 else None,
        )
        for tp in chosen
    }
    return dict(sorted(offsets.items())), unknown


def _leader_offsets(
    connections: ClusterConnections, queries: Mapping[TopicPartition, int], timeout_ms: int
) -> dict[TopicPartition, int]:
    """``ListOffsets`` once at each partition's leader (fresh metadata), the time shared
    among the leaders; a partition whose leader cannot answer is left out."""
    if not queries:
        return {}
    left = connections.time_left(timeout_ms)
    metadata = connections.metadata(timeout_ms=left(), force=True)
    by_leader: dict[int, dict[TopicPartition, int]] = {}
    for tp, query in queries.items():
        node = metadata.leader_for(tp)
        if node is not None:
            by_leader.setdefault(node.id, {})[tp] = query
    out: dict[TopicPartition, int] = {}
    for index, (leader, batch) in enumerate(sorted(by_leader.items())):
        share = max(left() // (len(by_leader) - index), 1)
        try:
            answers = connections.broker(leader, share).list_offsets(batch, timeout_ms=share)
        except ROUTING_ERRORS as exc:
            log.info("ListOffsets at broker %d: %s; its partitions show -1", leader, exc)
            connections.mark_stale()
            continue
        for tp, answer in answers.items():
            if answer.error is None:
                out[tp] = answer.offset
            elif isinstance(answer.error, ROUTING_ERRORS):
                connections.mark_stale()
            else:
                raise answer.error
    return out


def _log_offsets(
    connections: ClusterConnections, queries: Mapping[TopicPartition, int], timeout_ms: int | None
) -> dict[TopicPartition, int]:
    """``ListOffsets`` at each partition's leader: the offset per partition (-1: none)."""
    if not queries:
        return {}
    answers = list_offsets(connections, queries, timeout_ms)
    return {tp: offset for tp, (offset, _) in answers.items()}
