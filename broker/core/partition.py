"""One partition as this broker hosts it: its log, its role, and the one lock over the role.

Kafka's ``cluster/Partition.scala``. A ``Partition`` owns one partition's ``PartitionLog``
and what this broker is for it:

* **leader** at a leader epoch, with the replicas, the ISR, each follower's progress and
  the start offset of the epoch (``make_leader``);
* **follower** of a leader at an epoch (``make_follower``); its fetcher, which copies the
  leader's log, is the replica manager's (``broker.cluster.replicas``), and writes only
  through this object (``append_as_follower``, ``truncate_diverged``, ``start_over_at``),
  each refused unless the role is still that leader at that epoch;
* **none** (``resign``, or not yet told).

The role changes under one lock (``_lock``, Kafka's ``leaderIsrUpdateLock``), and so do
the things that read it to decide: ``make_leader`` records the new epoch in the log
(``PartitionLog.begin_leader_epoch``) *and* sets the role under it, so an append that
reads the role sees either the old role with the log at the old epoch or the new role with
the log at the new epoch: once ``make_leader`` returns, every produce is checked against
the new epoch. (A view's batch of new leaderships records the epochs in the logs first,
for one flush of them all, ``broker.cluster.replicas``.) An append that read the old role
is refused by the log's own check of the epoch it stamps (``FencedLeaderEpochError``,
answered ``NOT_LEADER_OR_FOLLOWER``, which clients retry), never stored under the old
epoch past the new one's start.

A plain lock, held briefly, not Kafka's read-write lock: nothing slow runs under it on a
leader (a follower's fetched batches are written under it: no producer appends there). The
leader's append itself runs outside it (the log has its own lock), as the replica manager's did
before this object existed: holding a lock across an append would serialise the CRC
checks of concurrent producers for no safety gain, since the log refuses a stale stamp.
An append racing ``make_follower`` may land in the log of a broker that just stopped
leading; the fetcher truncates it as any unreplicated tail, and its ``acks=all`` waiter
is answered ``NOT_LEADER_OR_FOLLOWER`` (``ack_status``).

Leader duties, as the replica manager had them (``docs/replication.md``):

* **Follower progress** (``on_follower_fetch``): a divergence answer (KIP-279/KIP-320) or
  the follower's log end and "caught up" time; a caught-up follower is proposed for the
  ISR. **High watermark** (``maybe_advance_high_watermark``): the smallest log end of the
  maximal ISR (the written one plus a member whose joining is being written, KIP-497),
  moved only while the written ISR has ``min.insync.replicas`` members (strict min ISR,
  KIP-966).
* **ISR changes** are proposed here (a follower caught up; ``maybe_shrink_isr``) and
  handed to the registry's outbox; the replica manager writes them to ZooKeeper
  (``begin_isr_write`` / ``finish_isr_write``) and the new ISR takes effect once written.
* **acks=all** (``ack_status``, ``wait_replicated``) and the consumer's epoch check
  (``check_epoch``, with the new leader's ``OFFSET_NOT_AVAILABLE`` window).
* **DeleteRecords** (KIP-107, ``delete_records``, then ``low_watermark`` until it is
  reached: ``broker.core.delete_records``): the leader moves its log start offset and
  tells the listeners, which wakes the followers' parked fetches; each follower learns it
  from that fetch answer (``append_as_follower``'s ``leader_log_start``), moves its own,
  checkpoints it (``checkpoint_log_start``) and reports it in its next fetch
  (``on_follower_fetch``'s ``log_start_offset``, which tells the listeners again); the
  low watermark is the smallest log start of the leader and the ISR's followers
  (Kafka's ``lowWatermarkIfLeader`` counts every replica on a live broker; the ISR is
  what this object knows of liveness, and a replica outside it learns the new start
  when it fetches again).

Every move of the high watermark, ISR or log start offset and every loss of leadership
calls ``on_progress`` (the registry's listeners: the purgatories re-check what is parked
on the partition).

A single node's partitions are *unreplicated* leaders (``replicated`` False), fixed at
construction: they lead at epoch 0 with ISR {this broker} and never change role. So that
nothing a single node stores or answers changes, they stamp no epoch into batches (the
producer's value stays, as before), check no client epoch, track no high watermark (it is
the log end) and answer ``acks=all`` once fsynced (``ack_status`` is ``DURABLE``); they
take no lock on those paths. Follower fetches are refused (no replicas to serve).

Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from tidelog.broker.core.group_fsync import DURABLE, PENDING
from tidelog.broker.core.partition_isr import IsrChanges, ordered
from tidelog.broker.core.partition_roles import Follower, FollowerProgress, IsrChange, Leading
from tidelog.storage.batch_times import BatchTimes
from tidelog.storage.clock import Clock
from tidelog.storage.errors import (
    FencedLeaderEpochError,
    InvalidRequestError,
    KafkaTimeoutError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetNotAvailableError,
    OffsetOutOfRangeError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.partition_log import AppendResult, PartitionLog
from tidelog.storage.producer_state import VerificationGuard
from tidelog.storage.segment import BatchPosition

__all__ = ["Follower", "IsrChange", "Partition"]

log = logging.getLogger(__name__)


class Partition(IsrChanges):
    """One hosted partition: log, role, epoch, ISR, high watermark. Thread-safe.

    Built by ``broker.core.partitions.PartitionRegistry``.
    """

    def __init__(
        self,
        log: PartitionLog,
        broker_id: int,
        clock: Clock,
        *,
        replicated: bool,
        on_progress: Callable[[str, int], None],
        propose_isr: Callable[[Partition], None],
        checkpoint_log_start: Callable[[], None] = lambda: None,
        isr_eligible: Callable[[int], bool] = lambda _replica: True,
    ) -> None:
        self.log = log
        self.topic = log.topic
        self.partition = log.partition
        self.broker_id = broker_id
        self.replicated = replicated
        self._clock = clock
        self._on_progress = on_progress
        self._propose_isr = propose_isr
        # Makes a moved log start durable (the log manager's checkpoint; DeleteRecords).
        self._checkpoint_log_start = checkpoint_log_start
        # Whether a follower may join the ISR: registered in this broker's view (KIP-841).
        self._isr_eligible = isr_eligible
        self._lock = threading.Lock()
        self._moved = threading.Condition()  # notified whenever the high watermark or ISR moves
        self._role: Leading | Follower | None = (
            None
            if replicated
            else Leading(0, (broker_id,), frozenset((broker_id,)), log.log_start_offset)
        )

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.partition}, {self._role!r})"

    # --- roles ---------------------------------------------------------------------------

    @property
    def leader_epoch(self) -> int | None:
        """The epoch this broker leads at; None unless it is a replicated partition's
        leader."""
        role = self._role
        return role.epoch if self.replicated and isinstance(role, Leading) else None

    @property
    def is_leader(self) -> bool:
        return isinstance(self._role, Leading)

    def make_leader(
        self,
        epoch: int,
        replicas: tuple[int, ...],
        isr: tuple[int, ...],
        adding: tuple[int, ...] = (),
        partition_epoch: int = -1,
    ) -> bool:
        """Lead at ``epoch``: record it at the log end and take the role, under the one
        lock. False (nothing done) if already leading at ``epoch``: the same term, whose
        ISR changes only as ``update_isr`` allows. Old follower progress is forgotten;
        the ISR members count as caught up now. ``partition_epoch``: the state znode's
        version ``isr`` was read at.

        Raises:
            StorageError: the leader-epoch checkpoint cannot be written (role unchanged).
            ValueError: an unreplicated partition.
        """
        self._check_replicated()
        with self._lock:
            current = self._role
            if isinstance(current, Leading) and current.epoch == epoch:
                return False
            self.log.track_high_watermark()
            self.log.begin_leader_epoch(epoch)
            now = self._clock.monotonic_ms()
            self._role = Leading(
                epoch,
                replicas,
                frozenset(isr),
                self.log.log_end_offset,
                {
                    r: FollowerProgress(caught_up_ms=now if r in isr else 0)
                    for r in replicas
                    if r != self.broker_id
                },
                adding=frozenset(adding),
                partition_epoch=partition_epoch,
            )
        return True

    def update_replicas(
        self, epoch: int, replicas: tuple[int, ...], adding: tuple[int, ...] = ()
    ) -> bool:
        """Leading at ``epoch``, take ``replicas`` as the replica list if it differs (a
        reassignment changed it: the metadata watcher may deliver a partition's new leader
        epoch before the topic's new replica list, which the leader must not miss, or an
        adding replica's fetches are refused for good). New followers start with no
        progress; removed ones are forgotten (the controller takes them out of the ISR).
        Whether anything changed."""
        self._check_replicated()
        with self._lock:
            role = self._role
            if not isinstance(role, Leading) or role.epoch != epoch:
                return False
            if role.replicas == replicas and role.adding == frozenset(adding):
                return False
            role.replicas = replicas
            role.adding = frozenset(adding)
            for r in replicas:
                if r != self.broker_id and r not in role.followers:
                    role.followers[r] = FollowerProgress()
            for r in list(role.followers):
                if r not in replicas:
                    del role.followers[r]
        return True

    def throttled_follower(self, replica_id: int) -> bool:
        """Whether ``replica_id`` is an adding replica of a reassignment of this partition,
        which this broker leads (its reads go through ``leader.replication.throttled.rate``)."""
        role = self._role
        return isinstance(role, Leading) and replica_id in role.adding

    def make_follower(self, leader: int, epoch: int) -> bool:
        """Follow ``leader`` at ``epoch`` (the high watermark is tracked from now on);
        whether this broker led it until now (its parked ``acks=all`` produces are told
        through ``on_progress``). Raises ``ValueError`` on an unreplicated partition."""
        self._check_replicated()
        followed = Follower(leader, epoch)
        with self._lock:
            current = self._role
            if current == followed:
                return False
            self._role = followed
            self.log.track_high_watermark()
        was_leading = isinstance(current, Leading)
        if was_leading:
            self.notify_progress()
        return was_leading

    def resign(self) -> bool:
        """Neither lead nor follow; whether this broker led it (then ``on_progress``)."""
        if not self.replicated:
            return False
        with self._lock:
            current = self._role
            self._role = None
        was_leading = isinstance(current, Leading)
        if was_leading:
            self.notify_progress()
        return was_leading

    def delete_replica_data(self) -> bool:
        """This broker is no longer a replica (a reassignment moved the partition away):
        drop the log's records (Kafka's StopReplica with ``delete``), leaving an empty log
        at offset 0 so a later reassignment back starts as any new replica. Only while
        neither leading nor following (``resign`` first), under the one lock, so no
        fetched batch can land after it; whether anything was deleted."""
        if not self.replicated:
            return False
        with self._lock:
            if self._role is not None:
                return False
            plog = self.log
            if plog.log_end_offset == 0 and plog.log_start_offset == 0:
                return False
            plog.truncate_fully_and_start_at(0)
        return True

    def _check_replicated(self) -> None:
        if not self.replicated:
            raise ValueError(f"{self.topic}-{self.partition}: an unreplicated partition leads")

    def _leading_locked(self) -> Leading:
        role = self._role
        if not isinstance(role, Leading):
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} does not lead {self.topic}-{self.partition}"
            )
        return role

    # --- produce -------------------------------------------------------------------------

    def leader_epoch_for_append(self, *, acks_all: bool, current_leader_epoch: int) -> int | None:
        """The epoch to stamp into appended batches (None: unreplicated, the producer's
        value stays).

        Raises:
            NotLeaderOrFollowerError: this broker does not lead the partition.
            FencedLeaderEpochError, UnknownLeaderEpochError: ``current_leader_epoch``
                (-1: unchecked) is not this leader's.
            NotEnoughReplicasError: ``acks_all`` with fewer in-sync replicas than
                ``min.insync.replicas``.
        """
        if not self.replicated:
            return None
        with self._lock:
            leading = self._leading_locked()
            _check_epoch(self, leading.epoch, current_leader_epoch)
            epoch, isr_size = leading.epoch, len(leading.isr)
        if acks_all:
            needed = self.log.config.min_insync_replicas
            if isr_size < needed:
                raise NotEnoughReplicasError(
                    f"{self.topic}-{self.partition} has {isr_size} in-sync replica(s); "
                    f"min.insync.replicas is {needed}"
                )
        return epoch

    def append_as_leader(
        self,
        records: bytes,
        times: BatchTimes | None = None,
        *,
        acks_all: bool,
        current_leader_epoch: int = -1,
        verification: Mapping[int, VerificationGuard | None] | None = None,
        blocking: bool = True,
        batches: list[BatchPosition] | None = None,
    ) -> AppendResult:
        """Check the role (``leader_epoch_for_append``), append stamped with this leader's
        epoch, and move the high watermark if the ISR allows it. ``verification``: the
        transactional batches' guards, ``blocking`` and ``batches`` (the headers read
        already): as ``PartitionLog.append``.

        Raises what ``leader_epoch_for_append`` and ``PartitionLog.append`` raise, except
        that a stamp the log refuses as stale (this broker's leadership moved to a newer
        epoch between the check and the append) is ``NotLeaderOrFollowerError``: nothing
        was appended. Not the client's stale epoch (checked before): "not the leader (of
        that epoch)", which every client retries; a Kafka producer treats
        FENCED_LEADER_EPOCH on produce as final, since Kafka's produce never answers it.
        """
        epoch = self.leader_epoch_for_append(
            acks_all=acks_all, current_leader_epoch=current_leader_epoch
        )
        try:
            result = self.log.append(
                records,
                times,
                leader_epoch=epoch,
                verification=verification,
                blocking=blocking,
                batches=batches,
            )
        except FencedLeaderEpochError as exc:
            raise NotLeaderOrFollowerError(
                f"{self.topic}-{self.partition}: the leader epoch moved during the "
                "append; nothing appended, retry"
            ) from exc
        if self.replicated and not result.duplicate:
            self.maybe_advance_high_watermark()
        return result

    def append_marker_as_leader(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> int:
        """Write a transaction marker as the leader, checked and stamped as an ``acks=all``
        append (``PartitionLog.append_marker``); its offset. Raises as ``append_as_leader``."""
        epoch = self.leader_epoch_for_append(acks_all=True, current_leader_epoch=-1)
        try:
            offset = self.log.append_marker(
                producer_id, producer_epoch, commit, coordinator_epoch, leader_epoch=epoch
            )
        except FencedLeaderEpochError as exc:
            raise NotLeaderOrFollowerError(
                f"{self.topic}-{self.partition}: the leader epoch moved; no marker appended"
            ) from exc
        if self.replicated:
            self.maybe_advance_high_watermark()
        return offset

    def ack_status(self, end_offset: int) -> str | BaseException:
        """``DURABLE`` once the high watermark reached ``end_offset`` with at least
        ``min.insync.replicas`` in sync, ``PENDING`` before, or the error to answer an
        ``acks=all`` produce with (``NOT_LEADER_OR_FOLLOWER`` once this broker stopped
        leading, ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` below min ISR). An unreplicated
        partition: ``DURABLE`` (the caller waits for the fsync)."""
        if not self.replicated:
            return DURABLE
        with self._lock:
            role = self._role
            isr_size = len(role.isr) if isinstance(role, Leading) else 0
        if not isinstance(role, Leading):
            return NotLeaderOrFollowerError(
                f"broker {self.broker_id} stopped leading {self.topic}-{self.partition} "
                "before the write was replicated; it may or may not be stored"
            )
        # Below min ISR first: the high watermark stays there (strict min ISR), so waiting
        # would only end in a timeout; the answer is the one a leader gave before strict
        # min ISR, when the high watermark passed the batch with too few replicas.
        needed = self.log.config.min_insync_replicas
        if isr_size < needed:
            return NotEnoughReplicasAfterAppendError(
                f"{self.topic}-{self.partition}: appended, but only {isr_size} in-sync "
                f"replica(s) remain; min.insync.replicas is {needed}"
            )
        if self.log.high_watermark < end_offset:
            return PENDING
        return DURABLE

    def wait_replicated(self, end_offset: int, timeout_ms: int) -> None:
        """Block until ``ack_status`` is final for ``end_offset``: return when durable,
        raise its error, or ``KafkaTimeoutError`` after ``timeout_ms``."""
        deadline = time.monotonic() + timeout_ms / 1000
        with self._moved:
            while True:
                status = self.ack_status(end_offset)
                if isinstance(status, BaseException):
                    raise status
                if status == DURABLE:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise KafkaTimeoutError(
                        f"{self.topic}-{self.partition}: not replicated within {timeout_ms} ms"
                    )
                self._moved.wait(min(remaining, 1.0))

    # --- follower: the fetcher's writes ---------------------------------------------------

    def append_as_follower(
        self,
        leader: int,
        epoch: int,
        records: bytes,
        batch_times: bytes,
        high_watermark: int,
        leader_log_start: int = -1,
    ) -> bool:
        """Append what ``leader`` sent at ``epoch`` (the leader's offsets and epochs kept)
        and move the high watermark to the leader's, capped at this log's end; False, and
        nothing written, unless this broker still follows ``leader`` at ``epoch``.

        The log start moves up to ``leader_log_start`` (DeleteRecords or retention on the
        leader; -1: not known), capped at the new high watermark as Kafka's follower does,
        and is checkpointed before this returns when it moved: the next fetch reports it
        to the leader, whose DeleteRecords answer counts on it.

        Under the partition's lock, as Kafka appends a follower's records under
        ``leaderIsrUpdateLock``: no fetched batch lands after ``make_leader`` or
        ``make_follower`` of another epoch has returned. The lock is this partition's
        alone and nothing leads it meanwhile, so no producer waits on it.
        """
        with self._lock:
            if self._role != Follower(leader, epoch):
                return False
            log = self.log
            if records:
                log.append_as_follower(records, batch_times)
            log.set_high_watermark(min(high_watermark, log.log_end_offset))
            moved = leader_log_start > log.log_start_offset and log.increase_log_start_offset(
                min(leader_log_start, log.high_watermark)
            )
        if moved:
            self._checkpoint_log_start()
        return True

    def truncate_diverged(
        self, leader: int, epoch: int, diverging_epoch: int, diverging_end_offset: int
    ) -> tuple[int, int] | None:
        """The leader answered that this log diverged (KIP-279/KIP-320): cut it where
        ``diverging_epoch`` ends on the leader; ``(log end before, cut)``, or None (and
        nothing cut) unless this broker still follows ``leader`` at ``epoch``."""
        with self._lock:
            if self._role != Follower(leader, epoch):
                return None
            log = self.log
            end = log.log_end_offset
            cut = log.divergence_offset(diverging_epoch, diverging_end_offset)
            log.truncate_to(cut)
            return end, cut

    def start_over_at(self, leader: int, epoch: int, leader_log_start: int) -> int | None:
        """The leader's retention removed what this log needs next: empty it and start at
        the leader's log start; the log end before, or None (nothing changed) unless this
        broker still follows ``leader`` at ``epoch``."""
        with self._lock:
            if self._role != Follower(leader, epoch):
                return None
            end = self.log.log_end_offset
            self.log.truncate_fully_and_start_at(leader_log_start)
            return end

    # --- fetch ---------------------------------------------------------------------------

    def check_epoch(self, current_leader_epoch: int) -> None:
        """Check a consumer's read or offset lookup: fenced if it names another leader
        epoch than ours (-1: not named); ``OffsetNotAvailableError`` while this broker, a
        new leader, has not yet moved its high watermark up to where its log ended when it
        took over (Kafka answers OFFSET_NOT_AVAILABLE then too). Before that the high
        watermark may be below one an earlier leader already exposed, and a reader would
        take the difference for lost records. Nothing to check unless leading (the
        placement routes reads) or on an unreplicated partition."""
        if not self.replicated:
            return
        with self._lock:
            role = self._role
            if not isinstance(role, Leading):
                return
            epoch, epoch_start = role.epoch, role.epoch_start
        _check_epoch(self, epoch, current_leader_epoch)
        high_watermark = self.log.high_watermark
        if high_watermark < epoch_start:
            raise OffsetNotAvailableError(
                f"{self.topic}-{self.partition}: the new leader's high watermark "
                f"({high_watermark}) has not reached {epoch_start} yet; retry"
            )

    def on_follower_fetch(
        self,
        replica_id: int,
        fetch_offset: int,
        current_leader_epoch: int = -1,
        last_fetched_epoch: int = -1,
        log_start_offset: int = -1,
    ) -> tuple[int, int] | None:
        """Check and record one follower read: the divergence ``(epoch, end offset)`` to
        answer instead of records (the follower truncates), or None to read.
        ``log_start_offset``: the follower's (-1: not reported), which DeleteRecords
        waits on (``broker.core.delete_records``).

        The follower's log end offset is its fetch offset. It counts as caught up now if
        it fetched from the leader's log end, else as of its previous fetch if it reached
        the log end the leader had then (Kafka's rule). A follower outside the ISR whose
        log end reached the high watermark and the start of this epoch is proposed for the
        ISR.

        Raises:
            InvalidRequestError: an unreplicated partition (no replicas to serve).
            NotLeaderOrFollowerError: not (or no longer) the leader.
            FencedLeaderEpochError, UnknownLeaderEpochError: another epoch named.
            UnknownTopicOrPartitionError: ``replica_id`` is not a replica.
        """
        if not self.replicated:
            raise InvalidRequestError("this broker has no replicas to serve")
        with self._lock:
            leading = self._leading_locked()
            _check_epoch(self, leading.epoch, current_leader_epoch)
            progress = leading.followers.get(replica_id)
            if progress is None:
                raise UnknownTopicOrPartitionError(
                    f"broker {replica_id} is not a replica of {self.topic}-{self.partition}"
                )
        plog = self.log
        if last_fetched_epoch >= 0:
            epoch, end = plog.end_offset_for_epoch(last_fetched_epoch)
            if epoch != last_fetched_epoch or end < fetch_offset:
                return epoch, end
        leader_end = plog.log_end_offset
        now = self._clock.monotonic_ms()
        expand = False
        with self._lock:
            if self._role is not leading:
                raise NotLeaderOrFollowerError(f"leadership of {self.topic}-{self.partition} moved")
            if fetch_offset >= leader_end:
                progress.caught_up_ms = now
            elif fetch_offset >= progress.last_fetch_leader_end >= 0:
                progress.caught_up_ms = max(progress.caught_up_ms, progress.last_fetch_ms)
            progress.last_fetch_leader_end = leader_end
            progress.last_fetch_ms = now
            progress.log_end_offset = fetch_offset
            start_moved = log_start_offset > progress.log_start_offset
            if start_moved:
                progress.log_start_offset = log_start_offset
            if (
                replica_id not in leading.isr
                and leading.pending_isr is None
                and fetch_offset >= plog.high_watermark
                and fetch_offset >= leading.epoch_start
                and self._isr_eligible(replica_id)
            ):
                leading.pending_isr = ordered(leading.replicas, leading.isr | {replica_id})
                expand = True
        if expand:
            self._propose_isr(self)
        if start_moved:
            self.notify_progress()  # a DeleteRecords may be parked on it
        self.maybe_advance_high_watermark()
        return None

    def follower_idle(
        self, replica_id: int, fetch_offset: int, epoch: int, high_watermark: int, start: int
    ) -> PartitionLog | None:
        """A session's shortcut for ``on_follower_fetch`` (``broker.core.fetch``): if
        ``replica_id`` is in the ISR of this leadership at ``epoch``, fetches from the log
        end and was last answered this ``high_watermark`` and log ``start``, record it
        caught up now, as that fetch would, and return the log (nothing to read); else None.
        No lock: a role replaced meanwhile only gets its old progress refreshed."""
        role = self._role
        if not isinstance(role, Leading) or role.epoch != epoch or replica_id not in role.isr:
            return None
        progress = role.followers.get(replica_id)
        plog = self.log
        end = plog.log_end_offset
        if progress is None or fetch_offset != end or plog.high_watermark != high_watermark:
            return None
        if plog.log_start_offset != start:
            return None
        progress.caught_up_ms = progress.last_fetch_ms = self._clock.monotonic_ms()
        progress.last_fetch_leader_end = end
        return plog

    # --- DeleteRecords (KIP-107) ------------------------------------------------------------

    def delete_records(self, offset: int) -> int:
        """Leader: move the log start offset to ``offset`` (-1: the high watermark) and
        checkpoint it; the offset the low watermark must reach (``low_watermark``).
        An offset at or below the log start changes nothing (and is answered at once).

        Raises:
            NotLeaderOrFollowerError: this broker does not lead the partition.
            OffsetOutOfRangeError: ``offset`` is below -1 or above the high watermark.
            StorageError: a checkpoint cannot be written.
        """
        with self._lock:
            self._leading_locked()
        log = self.log
        target = log.high_watermark if offset == -1 else offset
        if target < 0:
            raise OffsetOutOfRangeError(
                f"{self.topic}-{self.partition}: cannot delete records before offset "
                f"{offset}: give an offset >= 0, or -1 for the high watermark"
            )
        if log.increase_log_start_offset(target):
            self._checkpoint_log_start()
            # Wakes the followers' parked fetches (broker.core.fetch): their answer
            # carries the new start, which they report back in their next fetch.
            self.notify_progress()
        return target

    def low_watermark(self) -> int:
        """Leader: the smallest log start offset of this log and of the ISR's followers
        as they last reported it (-1 while one has not). Raises
        ``NotLeaderOrFollowerError``."""
        with self._lock:
            leading = self._leading_locked()
            starts = [
                leading.followers[r].log_start_offset
                for r in leading.isr
                if r != self.broker_id and r in leading.followers
            ]
        return min([self.log.log_start_offset, *starts])

    # --- high watermark ------------------------------------------------------------------

    def maybe_advance_high_watermark(self) -> bool:
        """Move the high watermark up to the smallest log end of the maximal ISR, if the
        written ISR has ``min.insync.replicas`` members; whether it moved (then
        ``on_progress``)."""
        if not self.replicated:
            return False
        plog = self.log
        if plog.high_watermark >= plog.log_end_offset:
            # Nothing to advance (the high watermark never passes the log end): every
            # follower fetch of an idle partition lands here, thousands a second at scale
            # (issue #34), so it returns before the lock and the ISR's ends. Read in this
            # order, an append in between only makes the test fail and the full check run.
            return False
        with self._lock:
            leading = self._role
            if not isinstance(leading, Leading):
                return False
            # The maximal ISR (Kafka's, KIP-497): the written ISR plus a member whose
            # joining is being written. Once that write lands, the controller may elect
            # the new member; had the high watermark passed its log end meanwhile, an
            # acknowledged record would be missing from a leader it may elect. (A member
            # being dropped is still in ``isr`` until its write lands: the same rule.)
            members = leading.isr | set(leading.pending_isr or ())
            isr_size = len(leading.isr)
            ends = [
                leading.followers[r].log_end_offset
                for r in members
                if r != self.broker_id and r in leading.followers
            ]
        if isr_size < plog.config.min_insync_replicas:
            # Strict min ISR (KIP-966): below min.insync.replicas the high watermark stays,
            # so every replica that left the ISR meanwhile (the ELR) holds every committed
            # record. The written ISR counts, not the maximal one: a member still being
            # added is not yet one the controller may elect.
            return False
        target = min([plog.log_end_offset, *ends])
        if target >= 0 and plog.set_high_watermark(target):
            self.notify_progress()
            return True
        return False

    def notify_progress(self) -> None:
        """Wake ``wait_replicated`` and tell the listeners (the high watermark, ISR or
        role moved)."""
        with self._moved:
            self._moved.notify_all()
        self._on_progress(self.topic, self.partition)

    # --- observability -------------------------------------------------------------------

    def replication_state(self) -> tuple[bool, bool]:
        """(leading, under-replicated: its ISR is below its replicas)."""
        with self._lock:
            role = self._role
            if not isinstance(role, Leading):
                return False, False
            return True, len(role.isr) < len(role.replicas)

    def follower_lag(self) -> dict[int, int]:
        """Leader side: ``follower -> records behind`` (-1: unknown); empty unless leading."""
        with self._lock:
            role = self._role
            if not isinstance(role, Leading):
                return {}
            ends = {r: p.log_end_offset for r, p in role.followers.items()}
        end = self.log.log_end_offset
        return {r: -1 if e < 0 else end - e for r, e in ends.items()}


def _check_epoch(partition: Partition, mine: int, theirs: int) -> None:
    if theirs < 0 or theirs == mine:
        return
    if theirs < mine:
        raise FencedLeaderEpochError(
            f"{partition.topic}-{partition.partition}: leader epoch {theirs} is stale; "
            f"the leader is at {mine}"
        )
    raise UnknownLeaderEpochError(
        f"{partition.topic}-{partition.partition}: leader epoch {theirs} is newer than "
        f"this broker's {mine}"
    )
