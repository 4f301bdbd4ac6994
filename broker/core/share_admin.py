"""Share-group administration (issue #32): the core's side of Kafka's
DescribeShareGroupOffsets (90), AlterShareGroupOffsets (91), DeleteShareGroupOffsets (92)
and DeleteGroups (42) for share groups, plus describe's per-partition statistics.

``ShareAdminCalls`` is mixed into ``broker.core.share_ops.ShareOps`` (as
``facade_groups.GroupCalls`` is into ``BrokerCore``): every call runs inside the core's
shutdown gate at the group's coordinator (``NOT_COORDINATOR`` /
``COORDINATOR_LOAD_IN_PROGRESS`` elsewhere), and both listeners make the same call.

Decided, as Kafka 4.1 where it says:

* **Which share partitions a group has.** Those with state in ``__share_group_state``
  (initialized by a first fetch, an auto offset reset, or an admin's alter) or in memory
  here. Kafka keeps the list in the group's records (``ShareGroupStatePartitionMetadata``);
  Tidelog reads it off the state store's keys, which are the same set.
* **Describe offsets** answers, per share partition, its start offset (SPSO) and its lag:
  the high watermark minus SPSO minus the records of the window already done
  (acknowledged or archived, or waiting for their dead-letter copy); offsets that are no
  record (control batches, compacted-away offsets) count as lag until SPSO passes them.
  A partition named that the group never read answers start offset -1 and lag -1
  (Kafka's "uninitialized"), without creating it.
  ``leader_epoch`` is the topic partition's current epoch (0 on a single node).
* **Alter offsets** only while the group is empty (``NON_EMPTY_GROUP`` for the whole
  call, as Kafka): each share partition named starts over at the offset given (SPSO =
  SPEO = offset, every in-flight record dropped, a new snapshot with the next state
  epoch). A negative offset is ``INVALID_REQUEST`` for that partition; one below the log
  start is moved up to it on the next use (the records are gone); one past the log end
  waits for the log to reach it. A share group that does not exist is
  ``GROUP_ID_NOT_FOUND`` (Kafka 4.1 answers so too: an admin cannot create a share group);
  a consumer group's id is ``GROUP_ID_NOT_FOUND`` with a message saying so.
* **Delete offsets** only while the group is empty, per topic: every share partition of
  the topic forgets its state (tombstones in ``__share_group_state``, memory dropped), so
  the next member starts it afresh at ``share.auto.offset.reset``. A topic the group has
  no state for is answered without error (nothing to delete), an unknown topic
  ``UNKNOWN_TOPIC_OR_PARTITION``.
* **DeleteGroups** of a share group: empty groups only (``NON_EMPTY_GROUP``); its share
  state goes first, then its membership records and configs. A crash between leaves an
  empty group without state: deleting it again finishes the job.
* **Empty, then changed: not one step.** The check that the group has no member and the
  change of each share partition are separate (each share partition's change runs under
  its own lock). A member joining in between and fetching before the change sees its
  records dropped by it (its acknowledgements then fail ``INVALID_RECORD_STATE`` and the
  records come again from the new start): the admin asked for exactly that start.
* **Statistics** (``stats``): per share partition led here, ``SharePartition.stats``:
  start and end offsets, acquired (in flight), available, acknowledged and archived
  counts, the delivery-count histogram of the window and ``dead_lettered``.

Cluster mode, not yet: the group's coordinator answers for the share partitions whose
topic partition it leads and whose state partition it leads (on a single node, all of
them); the others answer ``NOT_LEADER_OR_FOLLOWER`` (retriable: a leader elsewhere).
Doing the rest needs Kafka's ReadShareGroupStateSummary and DeleteShareGroupState between
brokers, and the state-epoch fence that makes a remote leader drop its memory after a
reset (docs/share-groups.md, "What differs").

Thread-safe, as ``ShareOps``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidelog.broker.core.errors import classify
from tidelog.broker.core.share_state_routing import StateCall
from tidelog.broker.core.topic_ids import topic_id
from tidelog.broker.share.groups import ShareGroupManager, is_consumer_group
from tidelog.broker.share.partition import SharePartitionStats
from tidelog.broker.share.partition_manager import SharePartitionManager
from tidelog.broker.share.records import (
    ACKNOWLEDGED,
    ARCHIVED,
    DEAD_LETTER_STATES,
    ShareSnapshot,
    ShareStateKey,
)
from tidelog.broker.share.state_log import ShareStateLog
from tidelog.storage.errors import (
    GroupIdNotFoundError,
    GroupNotEmptyError,
    InvalidRequestError,
    NotLeaderOrFollowerError,
)
from tidelog.storage.types import TopicPartition

if TYPE_CHECKING:
    from tidelog.broker.core.gate import OperationGate
    from tidelog.broker.core.membership import Membership
    from tidelog.broker.groups.manager import GroupManager
    from tidelog.storage.log_manager import LogManager

__all__ = [
    "UNINITIALIZED",
    "ShareAdminCalls",
    "ShareOffset",
    "ShareOffsetResult",
    "ShareTopicResult",
]

UNINITIALIZED = -1  # Kafka's start offset (and lag) of a share partition never read


@dataclass(frozen=True, slots=True)
class ShareOffset:
    """One share partition's offset (DescribeShareGroupOffsets)."""

    tp: TopicPartition
    start_offset: int = UNINITIALIZED
    leader_epoch: int = -1
    lag: int = UNINITIALIZED
    error_code: str = ""
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class ShareOffsetResult:
    """One share partition's outcome (AlterShareGroupOffsets); ``error_code`` "" done."""

    tp: TopicPartition
    error_code: str = ""
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class ShareTopicResult:
    """One topic's outcome (DeleteShareGroupOffsets); ``error_code`` "" done."""

    topic: str
    error_code: str = ""
    error_message: str = ""


def _failed(exc: Exception) -> tuple[str, str]:
    outcome = classify(exc)
    return outcome.code or "", outcome.message


class ShareAdminCalls:
    """``ShareOps``' admin operations (module docstring). Needs the attributes below,
    which ``ShareOps.__init__`` assigns."""

    partitions: SharePartitionManager
    share_groups: ShareGroupManager
    store: ShareStateLog
    _logs: LogManager
    _gate: OperationGate
    _groups: GroupManager
    _membership: Membership

    if TYPE_CHECKING:
        # ShareOps', used here.
        def _check_coordinator(self, group_id: str) -> None: ...

        def _leads(self, topic: str, partition: int) -> bool: ...

        def _leader_epoch(self, topic: str, partition: int) -> int | None: ...

        def _serve_state(self, key: ShareStateKey, call: StateCall) -> ShareSnapshot | None: ...

    # --- reads ----------------------------------------------------------------------------

    def share_partitions(self, group_id: str) -> list[TopicPartition]:
        """The share partitions ``group_id`` has state for here (module docstring)."""
        names = {topic_id(t.name): t.name for t in self._logs.topics()}
        stored = self.store.keys()
        found = {
            TopicPartition(names[k.topic_id], k.partition)
            for k in stored
            if k.group_id == group_id and k.topic_id in names
        }
        found.update(TopicPartition(t, p) for g, t, p in self.partitions.loaded() if g == group_id)
        return sorted(found)

    def stats(self, group_id: str, tp: TopicPartition) -> SharePartitionStats:
        """One share partition's statistics (this broker leads it)."""
        return self.partitions.stats(group_id, tp.topic, tp.partition)

    def describe_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition] | None
    ) -> list[ShareOffset]:
        """DescribeShareGroupOffsets: every share partition of the group (``partitions``
        None) or those named. Raises ``GroupIdNotFoundError`` for no share group of that
        id, ``NotCoordinatorError`` / ``CoordinatorLoadInProgressError`` off the
        coordinator."""
        with self._gate.operation():
            self._check_share_group(group_id)
            known = set(self.share_partitions(group_id))
            wanted = sorted(known) if partitions is None else list(dict.fromkeys(partitions))
            return [self._offset(group_id, tp, tp in known) for tp in wanted]

    def _offset(self, group_id: str, tp: TopicPartition, known: bool) -> ShareOffset:
        try:
            partition_log = self._logs.get_log(tp.topic, tp.partition)
            if not known:
                return ShareOffset(tp)
            epoch = self._leader_epoch(tp.topic, tp.partition)
            if epoch is None:
                epoch = max(partition_log.latest_epoch, 0)
            if self._leads(tp.topic, tp.partition):
                stats = self.stats(group_id, tp)
                start, done = stats.start_offset, stats.acknowledged + stats.archived
            else:
                snapshot = self.store.read(self._key(group_id, tp))
                if snapshot is None:
                    raise NotLeaderOrFollowerError(f"{tp}: led by another broker")
                start, done = snapshot.start_offset, _done(snapshot)
            lag = max(partition_log.high_watermark - start - done, 0)
            return ShareOffset(tp, start, epoch, lag)
        except Exception as exc:
            code, message = _failed(exc)
            return ShareOffset(tp, error_code=code, error_message=message)

    # --- changes ----------------------------------------------------------------------------

    def alter_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int]
    ) -> list[ShareOffsetResult]:
        """AlterShareGroupOffsets: each share partition named starts over at its offset.
        Raises ``GroupIdNotFoundError``, ``GroupNotEmptyError`` (members), the
        coordinator's errors; a partition's own error answers that partition."""
        with self._gate.operation():
            self._check_empty(group_id)
            results = []
            for tp, offset in offsets.items():
                try:
                    if offset < 0:
                        raise InvalidRequestError(f"{tp}: a start offset cannot be negative")
                    self._logs.get_log(tp.topic, tp.partition)  # UNKNOWN_TOPIC_OR_PARTITION
                    self._check_led(tp)
                    self.partitions.reset_start_offset(group_id, tp.topic, tp.partition, offset)
                except Exception as exc:
                    results.append(ShareOffsetResult(tp, *_failed(exc)))
                    continue
                results.append(ShareOffsetResult(tp))
            return results

    def delete_offsets(self, group_id: str, topics: Sequence[str]) -> list[ShareTopicResult]:
        """DeleteShareGroupOffsets: forget the group's state on every partition of each
        topic. Raises as ``alter_offsets``; a topic's own error answers that topic."""
        with self._gate.operation():
            self._check_empty(group_id)
            mine = self.share_partitions(group_id)
            results = []
            for name in dict.fromkeys(topics):
                try:
                    self._logs.topic(name)  # UNKNOWN_TOPIC_OR_PARTITION
                    for tp in [tp for tp in mine if tp.topic == name]:
                        self._delete_state(group_id, tp)
                except Exception as exc:
                    results.append(ShareTopicResult(name, *_failed(exc)))
                    continue
                results.append(ShareTopicResult(name))
            return results

    def delete_share_group(self, group_id: str) -> None:
        """DeleteGroups of a share group: its share state, then the group. Raises
        ``GroupIdNotFoundError``, ``GroupNotEmptyError``, the coordinator's errors and
        what the state writes raise (the group stays then)."""
        with self._gate.operation():
            self._check_empty(group_id)
            for tp in self.share_partitions(group_id):
                self._delete_state(group_id, tp)
            self.share_groups.delete_group(group_id)

    # --- helpers --------------------------------------------------------------------------

    def _check_share_group(self, group_id: str) -> None:
        if not group_id:
            raise InvalidRequestError("group_id must not be empty")
        self._check_coordinator(group_id)
        if not self.share_groups.is_share_group(group_id):
            if is_consumer_group(self._groups, group_id):
                raise GroupIdNotFoundError(f"group {group_id} is not a share group")
            raise GroupIdNotFoundError(f"no share group {group_id}")

    def _check_empty(self, group_id: str) -> None:
        self._check_share_group(group_id)
        members = self.share_groups.describe_group(group_id).members
        if members:
            raise GroupNotEmptyError(
                f"share group {group_id} has {len(members)} member(s); stop them first"
            )

    def _check_led(self, tp: TopicPartition) -> None:
        if not self._leads(tp.topic, tp.partition):
            raise NotLeaderOrFollowerError(
                f"{tp}: its share state is changed at its leader; this broker coordinates "
                "the group but does not lead the partition (not yet served in a cluster)"
            )

    def _key(self, group_id: str, tp: TopicPartition) -> ShareStateKey:
        return ShareStateKey(group_id, topic_id(tp.topic), tp.partition)

    def _delete_state(self, group_id: str, tp: TopicPartition) -> None:
        self._check_led(tp)
        key = self._key(group_id, tp)

        def delete(store: ShareStateLog) -> None:
            store.delete(key)

        # Memory first: the group is empty, so only the timer could write from it, and
        # it writes only what is loaded. Then at the key's share coordinator
        # (NOT_COORDINATOR when another broker is).
        self.partitions.forget(group_id, tp.topic, tp.partition)
        self._serve_state(key, delete)


def _done(snapshot: ShareSnapshot) -> int:
    return sum(
        b.last_offset - max(b.first_offset, snapshot.start_offset) + 1
        for b in snapshot.batches
        if b.delivery_state in (ACKNOWLEDGED, ARCHIVED, *DEAD_LETTER_STATES)
        and b.last_offset >= snapshot.start_offset
    )
