"""The consumer-group calls of ``AdminClient`` (``client.admin``): list, describe, delete,
and a group's committed offsets (list, alter, reset, delete).

``GroupAdminCalls`` is mixed into ``AdminClient`` and is not used alone: it checks the
arguments (a ``TypeError`` or ``ValueError`` before any call) and runs the calls of
``client.group_admin`` over the client's ``ClusterConnections``: to the group's
coordinator (found with ``FindCoordinator``, followed when it moves), with lag and reset
targets read from the partitions' leaders; ``list_groups`` asks every live broker.
Changing a group's offsets is refused while it has members (``GroupNotEmptyError``);
deleting some of them only for topics a live member subscribes to
(``GroupSubscribedToTopicError``).

Thread-safe, as ``AdminClient`` is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tidelog.client import group_admin
from tidelog.client.config import AdminConfig
from tidelog.client.routing import ClusterConnections
from tidelog.client.types import (
    GroupDescription,
    GroupSummary,
    TopicPartition,
)

__all__ = ["GroupAdminCalls"]


class GroupAdminCalls:
    """``AdminClient``'s group calls. Thread-safe; needs the two attributes below."""

    config: AdminConfig
    _connections: ClusterConnections

    def list_groups(
        self, *, types: Iterable[str] | None = None, timeout_ms: int | None = None
    ) -> list[GroupSummary]:
        """Every group with its state, member count and type (``consumer``, ``classic``,
        ``share``), sorted by id; ``types``: only groups of those types (Kafka's
        ``ListGroupsOptions.withTypes``).

        Each broker knows the groups it coordinates: every live broker is asked (a broker
        that cannot be reached is asked again after a metadata refresh, until the timeout)
        and the answers merged.
        """
        wanted = None
        if types is not None:
            wanted = {t.lower() for t in types}
            unknown = wanted - {"consumer", "classic", "share"}
            if unknown:
                raise ValueError(f"unknown group types {sorted(unknown)}")
        groups = group_admin.list_groups(self._connections, timeout_ms)
        return [g for g in groups if wanted is None or g.group_type in wanted]

    def describe_group(self, group_id: str, *, timeout_ms: int | None = None) -> GroupDescription:
        """Members and assignment (from the group's coordinator), and per partition the
        committed offset, the log end offset and the lag (from the partition's leader).

        Raises ``GroupIdNotFoundError`` for a group with neither members nor committed
        offsets. A partition without a leader shows log end and lag -1.
        """
        return group_admin.describe_group(self._connections, group_id, timeout_ms)

    def list_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, int]:
        """The group's committed offsets, sorted: of ``partitions`` (those without one are
        left out), or of every partition it has committed (None). Kafka's
        ``listConsumerGroupOffsets``; an unknown group has none."""
        return group_admin.list_group_offsets(
            self._connections, group_id, partitions, self._timeout(timeout_ms)
        )

    def alter_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, int],
        *,
        timeout_ms: int | None = None,
    ) -> None:
        """Set an empty group's committed offsets (Kafka's ``alterConsumerGroupOffsets``).

        Raises ``ValueError`` for a negative offset; ``GroupNotEmptyError`` while the group
        has members; the first failed partition's error (``UnknownTopicOrPartitionError``)
        after the others were committed.
        """
        for tp, offset in offsets.items():
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"expected TopicPartition keys, got {tp!r}")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"offset for {tp} must be a non-negative int, got {offset!r}")
        group_admin.alter_group_offsets(
            self._connections, group_id, dict(offsets), self._timeout(timeout_ms)
        )

    def reset_group_offsets(
        self,
        group_id: str,
        partitions: str | Iterable[TopicPartition] | None = None,
        *,
        to_earliest: bool = False,
        to_latest: bool = False,
        to_offset: int | None = None,
        to_timestamp_ms: int | None = None,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, int]:
        """Move an empty group's committed offsets; returns the new offset per partition.

        The targets are looked up at each partition's leader and committed at the group's
        coordinator (Kafka's ``kafka-consumer-groups --reset-offsets`` works the same way).

        Args:
            group_id: the group; it must have no members.
            partitions: a topic name (all of its partitions), some partitions, or None
                (every partition the group has committed).
            to_earliest, to_latest, to_offset, to_timestamp_ms: exactly one target: the
                log start, the log end, an offset (clamped to [log start, log end], as
                Kafka's tool does), or the first offset with a timestamp at or after the
                one given in ms (the log end if there is none).

        Raises ``ValueError`` for no target, several, or a negative one;
        ``GroupNotEmptyError`` while the group has members; a partition's error
        (``UnknownTopicOrPartitionError``) after the other partitions were moved.
        """
        target = group_admin.reset_target(
            to_earliest=to_earliest,
            to_latest=to_latest,
            to_offset=to_offset,
            to_timestamp_ms=to_timestamp_ms,
        )
        if partitions is not None and not isinstance(partitions, str):
            partitions = list(partitions)
            for tp in partitions:
                if not isinstance(tp, TopicPartition):
                    raise TypeError(f"expected TopicPartitions or a topic name, got {tp!r}")
            if not partitions:
                raise ValueError("no partitions given (None means every committed partition)")
        return group_admin.reset_group_offsets(
            self._connections, group_id, partitions, target, self._timeout(timeout_ms)
        )

    def delete_group(self, group_id: str, *, timeout_ms: int | None = None) -> None:
        """Delete an empty group and its committed offsets.

        Raises ``GroupNotEmptyError`` while it has members, ``GroupIdNotFoundError`` if
        it has no committed offsets.
        """
        group_admin.delete_group(self._connections, group_id, timeout_ms)

    def delete_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition],
        *,
        timeout_ms: int | None = None,
    ) -> None:
        """Delete some of a group's committed offsets (Kafka's
        ``deleteConsumerGroupOffsets``, KIP-496). The group may have members, as long as
        none subscribes to the topic of a partition given; a partition without a
        committed offset is not an error.

        Raises ``ValueError`` for no partitions, ``TypeError`` for anything but
        ``TopicPartition``s; ``GroupIdNotFoundError`` for a group with neither members nor
        committed offsets; the first failed partition's error, after the others were
        deleted: ``GroupSubscribedToTopicError`` (a live member subscribes to its topic),
        ``UnknownTopicOrPartitionError``.
        """
        wanted = list(dict.fromkeys(partitions))
        for tp in wanted:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"expected TopicPartitions, got {tp!r}")
        if not wanted:
            raise ValueError("no partitions given")
        answers = group_admin.delete_offsets(
            self._connections, group_id, wanted, self._timeout(timeout_ms)
        )
        for tp in wanted:
            error = answers.get(tp)
            if error is not None:
                raise error

    def _timeout(self, timeout_ms: int | None) -> int:
        return self.config.request_timeout_ms if timeout_ms is None else timeout_ms
