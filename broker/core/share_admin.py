"""Share-group administration (issue #32): the core's side of Kafka's
DescribeShareGroupOffsets (90), AlterShareGroupOffsets (91), DeleteShareGroupOffsets (92)
and DeleteGroups (42) for share groups, plus describe's per-partition statistics.

``ShareAdminCalls`` is mixed into ``broker.core.share_ops.ShareOps`` (as
``facade_groups.GroupCalls`` is into ``BrokerCore``): every call runs inside the core's
shutdown gate at the group's coordinator (``NOT_COORDINATOR`` /
``COORDINATOR_LOAD_IN_PROGRESS`` elsewhere), and both listeners make the same call.

Decided, as Kafka 4.1 where it says:

* **Which share partitions a group has.** Those with state in ``__share_group_state``
  (initialized by a first fetch, an auto offset reset, or an admin's alter).
* **Describe offsets** answers, per share partition, its start offset (SPSO) and its lag:
  the high watermark minus SPSO minus the records of the window already done
  (acknowledged or archived, or waiting for their dead-letter copy); offsets that are no
  record (control batches, compacted-away offsets) count as lag until SPSO passes them.
  A partition named that the group never read answers start offset -1 and lag -1
  (Kafka's "uninitialized"), without creating it.
  ``leader_epoch`` is the topic partition's current epoch (0 on a single node).
* **Alter offsets** only while the group is empty (``NON_EMPTY_GROUP`` for the whole
  call, as Kafka): each share partition named starts over at the offset given (SPSO =
  SPEO = offset, every in-flight record dropped). A negative offset is ``INVALID_REQUEST``
  for that partition; one below the log start is moved up to it on the next use (the
  records are gone); one past the log end waits for the log to reach it. A share group
  that does not exist is ``GROUP_ID_NOT_FOUND`` (Kafka 4.1 answers so too: an admin
  cannot create a share group); a consumer group's id is ``GROUP_ID_NOT_FOUND`` with a
  message saying so.
* **Delete offsets** only while the group is empty, per topic: every share partition of
  the topic forgets its state, so the next member starts it afresh at
  ``share.auto.offset.reset``. A topic the group has no state for is answered without
  error (nothing to delete), an unknown topic ``UNKNOWN_TOPIC_OR_PARTITION``.
* **DeleteGroups** of a share group: empty groups only (``NON_EMPTY_GROUP``); its share
  state goes first, then its membership records and configs. A crash between leaves an
  empty group without state: deleting it again finishes the job.

In a cluster, as Kafka's (the group's coordinator, each share partition's share
coordinator and its topic partition's leader may be three brokers):

* **Which share partitions a group has**: asked of the share coordinator of every
  ``__share_group_state`` partition (ReadShareGroupStateSummary, one call per state
  partition led elsewhere); a coordinator that cannot answer fails the call with its
  retriable error (``NOT_COORDINATOR``, ``COORDINATOR_LOAD_IN_PROGRESS``,
  ``COORDINATOR_NOT_AVAILABLE``). Kafka keeps the same list in the group's records
  (``ShareGroupStatePartitionMetadata``); Tidelog's state store is the one source.
* **Describe offsets**: SPSO and the records done come from the summary; the high
  watermark and the leader epoch from the partition's leader (DescribeSharePartition;
  local when this broker leads it).
* **Alter** is Kafka's: the share coordinator writes a fresh snapshot with the next state
  epoch (InitializeShareGroupState naming the epoch the summary gave plus one; a race
  with a leader's first use or another admin is ``FENCED_STATE_EPOCH``, retried twice).
  **Delete** is DeleteShareGroupState. Then the partition's leader is told to drop memory
  loaded at another state epoch (DescribeSharePartition naming the new one; -1 for a
  delete), so its next fetch reloads. Should that call fail, the partition (alter) or
  topic (delete) answers its retriable error, the state being changed already; the
  leader's memory is then fenced at its next write (``FENCED_STATE_EPOCH``, it reloads:
  ``broker.share.partition_manager``), and until then can hand out only what it held.
  An alter of a share partition with no state (never read, or deleted) starts state
  epochs over at 0, so it first has the leader drop whatever it holds (memory from
  before a delete could be at epoch 0 too), and changes nothing if that fails.
* **Statistics** (describe): each share partition's are asked of its leader, naming the
  state epoch the summary gave (memory older than a reset is reloaded first); a
  partition whose leader cannot answer is left out of the answer (logged), as before
  for partitions led elsewhere.
* **Empty, then changed: one step.** An alter, a delete of offsets or of the group holds
  the group's admin lock from its emptiness check to its last change, and a joining
  member's heartbeat (epoch 0) takes the same lock (``ShareOps.heartbeat``): a member
  cannot join in between, so it never fetches records the change then drops. A join
  waits up to ``ADMIN_WAIT_MS`` for the admin to finish, then answers
  ``COORDINATOR_LOAD_IN_PROGRESS`` (retriable). The lock is striped (64 by group id):
  groups that share a stripe wait for each other's admin calls, never for long.
* **An open dead-letter transaction** on a share partition (its archiving pending at the
  share coordinator, ``broker.share.state_log``) refuses an alter or a delete of that
  share partition with ``CONCURRENT_TRANSACTIONS`` (retriable: the transaction commits
  or aborts within its timeout; the admin retries). Waiting for it instead would hold the
  group's admin lock, and a join, for a transaction timeout; refusing says what is in
  the way. A transaction that begins after the reset finds its archiving fenced (the
  state epoch moved on): it aborts and the leader reloads the reset state.

Thread-safe, as ``ShareOps``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidelog.broker.cluster.share_peers import (
    GrpcSharePeers,
    SharePartitionAtLeader,
    ShareStateSummary,
    summary_of,
)
from tidelog.broker.core.errors import classify
from tidelog.broker.core.share_state_routing import RoutedShareState
from tidelog.broker.core.topic_ids import topic_id
from tidelog.broker.share.groups import ShareGroupManager, is_consumer_group
from tidelog.broker.share.partition import SharePartitionStats
from tidelog.broker.share.partition_manager import SharePartitionManager
from tidelog.broker.share.records import ShareStateKey
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC, ShareStateLog
from tidelog.storage.errors import (
    CoordinatorLoadInProgressError,
    FencedLeaderEpochError,
    FencedStateEpochError,
    GroupIdNotFoundError,
    GroupNotEmptyError,
    InvalidRequestError,
    LeaderNotAvailableError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.types import TopicPartition

if TYPE_CHECKING:
    from tidelog.broker.config import BrokerConfig
    from tidelog.broker.core.gate import OperationGate
    from tidelog.broker.core.membership import Membership
    from tidelog.broker.core.partitions import PartitionRegistry
    from tidelog.broker.groups.manager import GroupManager
    from tidelog.storage.log_manager import LogManager

__all__ = [
    "ADMIN_WAIT_MS",
    "UNINITIALIZED",
    "ShareAdminCalls",
    "ShareOffset",
    "ShareOffsetResult",
    "ShareTopicResult",
]

log = logging.getLogger(__name__)

UNINITIALIZED = -1  # Kafka's start offset (and lag) of a share partition never read
ADMIN_WAIT_MS = 5_000  # how long a joining member waits for a group's admin call
_ADMIN_LOCKS = 64  # striped by group id: a bounded table, contention only on a collision
_RESET_ATTEMPTS = 3


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
    _config: BrokerConfig
    _registry: PartitionRegistry
    _logs: LogManager
    _gate: OperationGate
    _groups: GroupManager
    _membership: Membership
    _routed: RoutedShareState
    _peers: GrpcSharePeers | None
    _admin_locks: list[threading.Lock]

    if TYPE_CHECKING:
        # ShareOps', used here.
        def _check_coordinator(self, group_id: str) -> None: ...

        def _check_leader(self, topic: str, partition: int) -> None: ...

        def _check_state_coordinator(self, partition: int, what: str) -> None: ...

        def _leader_of(self, topic: str, partition: int) -> int: ...

        def _leader_epoch(self, topic: str, partition: int) -> int | None: ...

    # --- reads ----------------------------------------------------------------------------

    def share_partitions(self, group_id: str) -> list[TopicPartition]:
        """The share partitions ``group_id`` has state for (module docstring). Raises the
        share coordinators' errors."""
        return sorted(self._summaries(group_id))

    def describe_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition] | None
    ) -> list[ShareOffset]:
        """DescribeShareGroupOffsets: every share partition of the group (``partitions``
        None) or those named. Raises ``GroupIdNotFoundError`` for no share group of that
        id, ``NotCoordinatorError`` / ``CoordinatorLoadInProgressError`` off the
        coordinator, and a share coordinator's error listing the share partitions."""
        with self._gate.operation():
            self._check_share_group(group_id)
            summaries = self._summaries(group_id)
            wanted = sorted(summaries) if partitions is None else list(dict.fromkeys(partitions))
            return [self._offset(group_id, tp, summaries.get(tp)) for tp in wanted]

    def _offset(
        self, group_id: str, tp: TopicPartition, summary: ShareStateSummary | None
    ) -> ShareOffset:
        try:
            self._check_partition(tp)
            if summary is None:
                return ShareOffset(tp)
            at = self._at_leader(group_id, tp, None, with_stats=False)
            lag = max(at.high_watermark - summary.start_offset - summary.done_records, 0)
            return ShareOffset(tp, summary.start_offset, at.leader_epoch, lag)
        except Exception as exc:
            code, message = _failed(exc)
            return ShareOffset(tp, error_code=code, error_message=message)

    def partition_stats(
        self, group_id: str, assigned: set[TopicPartition]
    ) -> list[tuple[TopicPartition, SharePartitionStats]]:
        """Describe's statistics: those of each share partition of ``group_id`` assigned or
        with state, from its leader; one that cannot be had is left out (logged)."""
        try:
            summaries = self._summaries(group_id)
        except Exception as exc:
            log.info("share group %s: its share partitions not listed: %s", group_id, exc)
            summaries = {}
        out = []
        for tp in sorted(assigned.union(summaries)):
            summary = summaries.get(tp)
            try:
                state_epoch = None if summary is None else summary.state_epoch
                stats = self._at_leader(group_id, tp, state_epoch, with_stats=True).stats
            except Exception as exc:
                log.info("share group %s: %s statistics not had: %s", group_id, tp, exc)
                continue
            if stats is not None:
                out.append((tp, stats))
        return out

    # --- changes ----------------------------------------------------------------------------

    def alter_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int]
    ) -> list[ShareOffsetResult]:
        """AlterShareGroupOffsets: each share partition named starts over at its offset.
        Raises ``GroupIdNotFoundError``, ``GroupNotEmptyError`` (members), the
        coordinator's errors; a partition's own error answers that partition."""
        with self._gate.operation(), self._admin(group_id):
            self._check_empty(group_id)
            results = []
            for tp, offset in offsets.items():
                try:
                    if offset < 0:
                        raise InvalidRequestError(f"{tp}: a start offset cannot be negative")
                    self._check_partition(tp)
                    self._reset_state(group_id, tp, offset)
                except Exception as exc:
                    results.append(ShareOffsetResult(tp, *_failed(exc)))
                    continue
                results.append(ShareOffsetResult(tp))
            return results

    def delete_offsets(self, group_id: str, topics: Sequence[str]) -> list[ShareTopicResult]:
        """DeleteShareGroupOffsets: forget the group's state on every partition of each
        topic. Raises as ``alter_offsets``; a topic's own error answers that topic."""
        with self._gate.operation(), self._admin(group_id):
            self._check_empty(group_id)
            mine = self.share_partitions(group_id)
            results = []
            for name in dict.fromkeys(topics):
                try:
                    self._partition_count(name)  # UNKNOWN_TOPIC_OR_PARTITION
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
        what the state calls raise (the group stays then)."""
        with self._gate.operation(), self._admin(group_id):
            self._check_empty(group_id)
            for tp in self.share_partitions(group_id):
                self._delete_state(group_id, tp)
            self.share_groups.delete_group(group_id)

    # --- served here for another broker ----------------------------------------------------

    def serve_summaries(self, group_id: str, state_partition: int) -> list[ShareStateSummary]:
        """ReadShareGroupStateSummary at this share coordinator (another broker's group
        coordinator, or this one's): the checks of ``serve_state``, then the states."""
        with self._gate.operation():
            return self._summarize(group_id, state_partition)

    def _summarize(self, group_id: str, state_partition: int) -> list[ShareStateSummary]:
        if not 0 <= state_partition < self.store.partitions:
            raise InvalidRequestError(f"no {SHARE_STATE_TOPIC} partition {state_partition}")
        self._check_state_coordinator(state_partition, f"share-group state of {group_id!r}")
        return [summary_of(k, s) for k, s in self.store.group_states(group_id, state_partition)]

    def describe_partition_here(
        self,
        group_id: str,
        topic: str,
        partition: int,
        state_epoch: int | None,
        with_stats: bool,
    ) -> SharePartitionAtLeader:
        """DescribeSharePartition at this leader: the high watermark, the leader epoch
        and, ``with_stats``, the share partition's statistics. ``state_epoch``: memory
        loaded at another is dropped first (an admin reset or, -1, deleted the state).
        Raises ``NotLeaderOrFollowerError`` elsewhere."""
        if not group_id:
            raise InvalidRequestError("group_id must not be empty")
        with self._gate.operation():
            self._check_leader(topic, partition)
            partition_log = self._logs.get_log(topic, partition)
            if state_epoch is not None:
                self.partitions.invalidate(group_id, topic, partition, state_epoch)
            stats = self.partitions.stats(group_id, topic, partition) if with_stats else None
            epoch = self._leader_epoch(topic, partition)
            if epoch is None:
                epoch = max(partition_log.latest_epoch, 0)
            return SharePartitionAtLeader(partition_log.high_watermark, epoch, stats)

    # --- helpers --------------------------------------------------------------------------

    def _init_admin(self) -> None:
        """``ShareOps.__init__`` calls it: the groups' admin locks."""
        self._admin_locks = [threading.Lock() for _ in range(_ADMIN_LOCKS)]

    @contextmanager
    def _admin(self, group_id: str) -> Iterator[None]:
        """The group's admin lock (module docstring: empty, then changed)."""
        with self._admin_locks[hash(group_id) % _ADMIN_LOCKS]:
            yield

    def _wait_admin(self, group_id: str) -> threading.Lock:
        """The group's admin lock, acquired for a joining member (the caller releases
        it); ``CoordinatorLoadInProgressError`` after ``ADMIN_WAIT_MS``."""
        lock = self._admin_locks[hash(group_id) % _ADMIN_LOCKS]
        if not lock.acquire(timeout=ADMIN_WAIT_MS / 1000):
            raise CoordinatorLoadInProgressError(
                f"share group {group_id}: an admin is changing its offsets; retry"
            )
        return lock

    def _summaries(self, group_id: str) -> dict[TopicPartition, ShareStateSummary]:
        names = {topic_id(name): name for name in self._topic_names()}
        found: dict[TopicPartition, ShareStateSummary] = {}
        for state_partition in range(self.store.partitions):
            for summary in self._routed.summaries(group_id, state_partition):
                name = names.get(summary.key.topic_id)
                if name is not None:  # a deleted topic's state: not the group's any more
                    found[TopicPartition(name, summary.key.partition)] = summary
        return found

    def _topic_names(self) -> list[str]:
        topics = self._membership.placement.topics()
        if topics is None:
            return [t.name for t in self._logs.topics()]
        return list(topics)

    def _partition_count(self, topic: str) -> int:
        topics = self._membership.placement.topics()
        if topics is None:
            return self._logs.topic(topic).partitions
        if topic not in topics:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic}")
        return topics[topic]

    def _check_partition(self, tp: TopicPartition) -> None:
        if not 0 <= tp.partition < self._partition_count(tp.topic):
            raise UnknownTopicOrPartitionError(f"unknown partition {tp}")

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

    def _key(self, group_id: str, tp: TopicPartition) -> ShareStateKey:
        return ShareStateKey(group_id, topic_id(tp.topic), tp.partition)

    def _summary(self, key: ShareStateKey) -> ShareStateSummary | None:
        state_partition = self.store.partition_for(key)
        for summary in self._routed.summaries(key.group_id, state_partition):
            if summary.key == key:
                return summary
        return None

    def _reset_state(self, group_id: str, tp: TopicPartition, offset: int) -> None:
        """Alter one share partition at its share coordinator, then its leader."""
        key = self._key(group_id, tp)
        for attempt in range(1, _RESET_ATTEMPTS + 1):
            summary = self._summary(key)
            state_epoch = 0 if summary is None else summary.state_epoch + 1
            leader_epoch = 0 if summary is None else summary.leader_epoch
            if summary is None:
                # No state (never read, or deleted): state epochs start over at 0, so
                # memory the leader may still hold from before a delete, at any epoch,
                # goes first; the alter is refused if the leader cannot be told.
                self._tell_leader(group_id, tp, -1, changed=False)
            try:
                self._routed.initialize(key, offset, leader_epoch, state_epoch)
            except (FencedStateEpochError, FencedLeaderEpochError):
                if attempt == _RESET_ATTEMPTS:
                    raise
                continue  # a leader or another admin wrote meanwhile: read again
            self._tell_leader(group_id, tp, state_epoch)
            return

    def _delete_state(self, group_id: str, tp: TopicPartition) -> None:
        self._routed.delete(self._key(group_id, tp))
        self._tell_leader(group_id, tp, -1)

    def _tell_leader(
        self, group_id: str, tp: TopicPartition, state_epoch: int, *, changed: bool = True
    ) -> None:
        """The leader drops memory loaded at another state epoch (module docstring)."""
        try:
            self._at_leader(group_id, tp, state_epoch, with_stats=False)
        except Exception as exc:
            code, message = _failed(exc)
            if not changed:
                raise LeaderNotAvailableError(
                    f"{tp}: its leader could not be told to drop its memory ({code}: "
                    f"{message}); nothing was changed"
                ) from None
            raise LeaderNotAvailableError(
                f"{tp}: its share state was changed, but its leader could not be told "
                f"({code}: {message}); it reloads at its next write"
            ) from None

    def _at_leader(
        self, group_id: str, tp: TopicPartition, state_epoch: int | None, *, with_stats: bool
    ) -> SharePartitionAtLeader:
        leader = self._leader_of(tp.topic, tp.partition)
        if self._peers is None or leader == self._config.broker_id:
            return self.describe_partition_here(
                group_id, tp.topic, tp.partition, state_epoch, with_stats
            )
        if leader < 0:
            raise LeaderNotAvailableError(f"{tp} has no leader")
        return self._peers.describe_partition(
            leader, group_id, tp.topic, tp.partition, state_epoch, with_stats
        )
