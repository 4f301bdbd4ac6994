"""The consumer-group operations of ``BrokerCore`` (``broker.core.facade``): heartbeats,
offset commits (plain and transactional) and fetches, listing, describing, resetting and
deleting groups and offsets, and the coordinator checks in front of them.

``GroupCalls`` is mixed into ``BrokerCore`` and is not used alone. Each operation runs
inside the core's shutdown gate, checks that this broker coordinates the group (in a
cluster: leads the group's ``__consumer_offsets`` partition and has loaded it), then
calls the group coordinator (``broker.groups.manager``, which documents each). It is
apart because the groups are a concept of their own next to the data path and topic
administration (Kafka's ``GroupCoordinator`` behind ``KafkaApis``).

Thread-safe, as ``BrokerCore`` is.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from tidelog.broker.groups.coordinator import GroupView, HeartbeatAnswer, HeartbeatRequest
from tidelog.broker.groups.manager import (
    GroupDescription,
    GroupListing,
    GroupManager,
    OffsetCommitEntry,
    OffsetResult,
    ResetTarget,
    Selection,
)
from tidelog.broker.groups.offset_records import partition_for
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC
from tidelog.storage.errors import (
    LeaderNotAvailableError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    UnstableOffsetCommitError,
)
from tidelog.storage.log_manager import LogManager
from tidelog.storage.types import TopicPartition

if TYPE_CHECKING:
    from tidelog.broker.core.membership import TopicAdmin
    from tidelog.broker.core.placement import Placement
    from tidelog.broker.core.share_ops import ShareOps

__all__ = ["GroupCalls"]


class GroupCalls:
    """``BrokerCore``'s group operations. Thread-safe; needs the attributes below, which
    ``BrokerCore.__init__`` assigns."""

    _groups: GroupManager
    _logs: LogManager
    shares: ShareOps | None

    if TYPE_CHECKING:
        # BrokerCore's, used here.
        @property
        def placement(self) -> Placement: ...

        @property
        def topic_admin(self) -> TopicAdmin | None: ...

        def _operation(self) -> AbstractContextManager[None]: ...

    def check_group_loaded(self, group_id: str) -> None:
        """Raise ``CoordinatorLoadInProgressError`` while this broker, leading the group's
        offsets partition, still loads its groups (the classic protocol's handlers ask
        before serving a member: until then its group is unknown here). A no-op on a
        single node."""
        if self.topic_admin is None:
            return
        self._groups.store.check_loaded(self._groups.store.partition_for(group_id))

    def _check_coordinator(self, group_id: str, *, confirm: bool = False) -> None:
        """Raise ``NotCoordinatorError`` unless this broker leads the group's offsets
        partition (always true on a single node), ``CoordinatorLoadInProgressError`` while
        it is still loading that partition's groups. ``confirm``: ask ZooKeeper too, not
        only this broker's view (committed offsets must never be read stale: a consumer
        resuming from an old one would commit backwards)."""
        if self.topic_admin is None:
            return
        partition = partition_for(group_id, self._logs.topic(OFFSETS_TOPIC).partitions)
        try:
            if confirm:
                self.placement.confirm_leader(OFFSETS_TOPIC, partition)
            else:
                self.placement.check_leader(OFFSETS_TOPIC, partition)
        except (NotLeaderOrFollowerError, LeaderNotAvailableError) as exc:
            raise NotCoordinatorError(f"group {group_id!r}: {exc}") from None
        # Leading is not enough: the groups must be loaded at this epoch and what was
        # loaded replicated (COORDINATOR_LOAD_IN_PROGRESS until then; offset_store).
        self._groups.store.check_loaded(partition)

    def consumer_group_heartbeat(self, request: HeartbeatRequest) -> HeartbeatAnswer:
        """Join, heartbeat or leave a group; answers epoch, interval and assignment."""
        with self._operation():
            self._check_coordinator(request.group_id)
            return self._groups.heartbeat(request)

    def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        entries: Sequence[OffsetCommitEntry],
    ) -> list[OffsetResult]:
        """Commit offsets as a member, or as an admin of an empty group (no member id)."""
        with self._operation():
            self._check_coordinator(group_id)
            return self._groups.commit_offsets(group_id, member_id, member_epoch, entries)

    def commit_transactional_offsets(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        entries: Sequence[OffsetCommitEntry],
    ) -> list[OffsetResult]:
        """TxnOffsetCommit: offsets pending in the producer's transaction (issue #28)."""
        with self._operation():
            self._check_coordinator(group_id)
            return self._groups.commit_transactional_offsets(
                group_id, producer_id, producer_epoch, entries
            )

    def fetch_offsets(
        self, group_id: str, selection: Selection | None, require_stable: bool = False
    ) -> list[OffsetResult]:
        """Committed offsets of a group (-1 where none). ``require_stable`` (KIP-447, what
        a read_committed consumer asks): a partition whose offset is pending in an
        undecided transaction answers ``UNSTABLE_OFFSET_COMMIT`` (retriable) instead of
        the offset before the transaction's. The pending partitions are read before the
        offsets: a marker landing between the two reads shows as unstable (the client
        asks again), never as the older offset."""
        with self._operation():
            self._check_coordinator(group_id, confirm=True)
            pending = self._groups.store.pending_partitions(group_id) if require_stable else ()
            results = self._groups.fetch_offsets(group_id, selection)
            if not pending:
                return results
            return [
                OffsetResult(
                    r.tp,
                    error_code=UnstableOffsetCommitError.code,
                    error_message=f"{r.tp}: the group's offset is pending in a transaction",
                )
                if r.tp in pending and not r.error_code
                else r
                for r in results
            ]

    def list_groups(self) -> list[GroupListing]:
        """Every group this broker coordinates with members or committed offsets;
        ``CoordinatorLoadInProgressError`` while it still loads an offsets partition it
        leads (cluster mode), as Kafka answers ListGroups then."""
        with self._operation():
            self._groups.store.check_led_loaded()
            return self._groups.list_groups()

    def describe_group(self, group_id: str) -> GroupDescription:
        """Members, assignment and per-partition lag of a group."""
        with self._operation():
            self._check_coordinator(group_id)
            return self._groups.describe_group(group_id)

    def describe_consumer_group(self, group_id: str) -> GroupView:
        """A KIP-848 group as Kafka's ConsumerGroupDescribe shows it
        (``GroupManager.describe_consumer_group``), on its coordinator."""
        with self._operation():
            self._check_coordinator(group_id)
            return self._groups.describe_consumer_group(group_id)

    def reset_group_offsets(
        self, group_id: str, selection: Selection | None, target: ResetTarget
    ) -> list[OffsetResult]:
        """Move an empty group's committed offsets."""
        with self._operation():
            self._check_coordinator(group_id)
            return self._groups.reset_offsets(group_id, selection, target)

    def delete_group(self, group_id: str) -> None:
        """Delete an empty group's committed offsets; a share group (issue #32) with its
        share state (``ShareOps.delete_share_group``)."""
        if self.shares is not None and self.shares.share_groups.is_share_group(group_id):
            self.shares.delete_share_group(group_id)
            return
        with self._operation():
            self._check_coordinator(group_id)
            self._groups.delete_group(group_id)

    def delete_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition]
    ) -> list[OffsetResult]:
        """Delete some of a group's committed offsets (OffsetDelete, KIP-496)."""
        with self._operation():
            self._check_coordinator(group_id)
            return self._groups.delete_offsets(group_id, partitions)
