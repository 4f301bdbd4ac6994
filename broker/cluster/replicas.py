"""Replication on one broker: leading and following partitions, ISR, high watermark.

Kafka's ``ReplicaManager`` and ``Partition`` in the ZooKeeper era
(``reference/replication.md`` sections 1 and 4), for the partitions this broker hosts:

* **Roles from the cluster's view.** Every metadata snapshot (ZooKeeper watches,
  ``broker.cluster.metadata``) says who leads each partition at which leader epoch, and
  its ISR. ``apply`` makes this broker leader (``become_leader``: record the epoch at the
  log end, track the high watermark, forget old follower progress) or follower (hand the
  partition to the replica fetcher of its leader, ``broker.cluster.fetcher``) of every
  partition it is a replica of, and neither of the others.
* **Leader: follower progress.** Each follower fetch (``on_follower_fetch``, called by the
  fetch path before it reads) names the follower's log end offset (its fetch offset) and
  the epoch of its last batch. If that epoch's end on the leader is below the fetch
  offset, or the leader has no such epoch, the answer is the divergence (``(epoch, end
  offset)``, KIP-279/KIP-320) and the follower truncates. Otherwise the follower's log end
  offset and "caught up" time are recorded as Kafka does: caught up now if it fetched from
  the leader's log end, else as of its previous fetch if it reached the log end the
  leader had then.
* **High watermark** = the smallest log end offset among the ISR (the leader's own
  included); it only moves up. A move completes parked consumer fetches and ``acks=all``
  produces (``on_progress``). **Strict min ISR** (KIP-966, as Kafka 4.x): it moves only
  while the written ISR has at least ``min.insync.replicas`` members. Below that,
  ``acks=all`` produces are refused (``NOT_ENOUGH_REPLICAS``) or wait, ``acks=1`` (and
  ``acks=0``) produces are still appended and answered, but consumers do not see them
  (nor anything else past the high watermark) until the ISR is large enough again; a
  leader elected below min ISR answers consumers ``OFFSET_NOT_AVAILABLE`` until then
  (``check_epoch``). The replicas that left the ISR meanwhile (the ELR,
  ``broker.cluster.election``) therefore hold every record a consumer saw or an
  ``acks=all`` producer was told of.
* **ISR.** A follower joins the ISR once its log end offset reaches the high watermark and
  the start of the current leader epoch; an ISR member not caught up for
  ``replica.lag.time.max.ms`` is removed. The leader writes each change to the partition's
  state znode by compare-and-set at the version it read, only while that znode still
  names it leader at its epoch (so a deposed leader cannot write), on one thread of its
  own so no request waits for ZooKeeper. The new ISR takes effect locally once written.
* **acks=all** (``ack_status``): answered once the high watermark passed the batch; with
  fewer in-sync replicas than ``min.insync.replicas`` at any point before that answer,
  ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` at once (the high watermark would not move:
  Kafka 4.x lets such a produce wait for its timeout instead); refused before the append
  with ``NOT_ENOUGH_REPLICAS`` when the ISR is already too small.
* **ELR.** The leader's ISR writes (``IsrWriter``, ``broker.cluster.node``) also keep the
  state's eligible leader replicas (``election.with_elr``). A state change at the same
  leader epoch (the controller moving a replica from the ELR to the last known ELR, or
  emptying both) changes nothing here: ``apply`` ignores a view at the epoch it leads.

A leader cut off from ZooKeeper cannot change the ISR, so once its followers stop fetching
(they follow the new leader) its high watermark cannot pass what they had, and ``acks=all``
writes it takes are never acknowledged: Kafka's guarantee too. Unlike Kafka's, it does not
keep its role until it hears that its session expired: the node resigns everything
(``resign_all``) once the session may have expired (``broker.cluster.session``), so its
parked produces fail at once and its clients move on (issue #33).

Thread-safe: one lock over the role tables; storage calls and callbacks run outside it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tidelog.broker.cluster.fetcher import FetcherPool, FetchTarget
from tidelog.broker.cluster.metadata import ClusterMetadata
from tidelog.broker.cluster.znodes import NO_LEADER, PartitionState
from tidelog.broker.core.fetch import PartitionFetchSpec
from tidelog.broker.core.group_fsync import DURABLE, PENDING
from tidelog.storage.clock import Clock
from tidelog.storage.errors import (
    FencedLeaderEpochError,
    KafkaTimeoutError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetNotAvailableError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.log_manager import LogManager
from tidelog.storage.partition_log import PartitionLog

__all__ = ["IsrWriter", "ReplicaManager", "ReplicaSettings"]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# (topic, partition, leader id, leader epoch, new ISR) -> whether it was written.
IsrWriter = Callable[[str, int, int, int, tuple[int, ...]], bool]


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """The broker's replication settings (Kafka's names in ``broker.config``)."""

    broker_id: int
    replica_lag_time_max_ms: int = 30_000
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_max_bytes: int = 1024 * 1024
    replica_fetch_backoff_ms: int = 1_000
    num_replica_fetchers: int = 1


@dataclass(slots=True)
class _Progress:
    """What the leader knows of one follower."""

    log_end_offset: int = -1
    caught_up_ms: int = 0
    last_fetch_ms: int = 0
    last_fetch_leader_end: int = -1


@dataclass(slots=True)
class _Leading:
    epoch: int
    replicas: tuple[int, ...]
    isr: frozenset[int]
    epoch_start: int
    followers: dict[int, _Progress] = field(default_factory=dict)
    pending_isr: tuple[int, ...] | None = None
    isr_before: frozenset[int] | None = None


class ReplicaManager:
    """This broker's replicas. Build, ``start``, feed ``apply`` every view, ``stop``."""

    def __init__(
        self,
        settings: ReplicaSettings,
        logs: LogManager,
        clock: Clock,
        write_isr: IsrWriter,
        on_progress: Callable[[str, int], None],
        fetchers: FetcherPool,
        on_leader: Callable[[str, int], None] = lambda _t, _p: None,
        on_isr_change: Callable[[int, int], None] = lambda _shrunk, _expanded: None,
    ) -> None:
        self._settings = settings
        self._logs = logs
        self._clock = clock
        self._write_isr = write_isr
        self._on_progress = on_progress
        self._fetchers = fetchers
        self._on_leader = on_leader
        self._on_isr_change = on_isr_change
        self._lock = threading.Lock()
        self._moved = threading.Condition()  # notified whenever a high watermark or ISR moves
        self._leading: dict[TopicPartition, _Leading] = {}
        # -> (leader, epoch, whether it was live: fetching)
        self._following: dict[TopicPartition, tuple[int, int, bool]] = {}
        self._isr_changes: queue.Queue[TopicPartition | None] = queue.Queue()
        self._stopped = threading.Event()
        self._isr_thread = threading.Thread(
            target=self._run_isr_changes, name="tidelog-isr", daemon=True
        )
        self._lag_thread = threading.Thread(
            target=self._run_lag_checks, name="tidelog-isr-lag", daemon=True
        )

    def start(self) -> None:
        self._isr_thread.start()
        self._lag_thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._isr_changes.put(None)
        self._fetchers.stop()
        self._isr_thread.join(5)
        self._lag_thread.join(5)

    # --- roles -----------------------------------------------------------------------------

    def apply(self, view: ClusterMetadata) -> None:
        """Take the roles ``view`` gives this broker (the metadata watcher's thread).

        Errors are logged per partition; a partition whose log cannot be opened is skipped
        until the next view.
        """
        me = self._settings.broker_id
        wanted: dict[TopicPartition, PartitionState] = {}
        for name, topic in view.topics.items():
            for partition, replicas in topic.assignment.replicas.items():
                state = topic.states.get(partition)
                if me in replicas and state is not None:
                    wanted[(name, partition)] = state
        for tp, state in wanted.items():
            replicas = view.topics[tp[0]].assignment.replicas[tp[1]]
            try:
                if state.leader == me:
                    self._lead(tp, state, replicas)
                else:
                    self._follow(tp, state, view)
            except Exception:
                log.exception("%s-%d: cannot take the role the cluster gives", *tp)
        with self._lock:
            gone = [tp for tp in (*self._leading, *self._following) if tp not in wanted]
            for tp in gone:
                self._leading.pop(tp, None)
                self._following.pop(tp, None)
        for tp in gone:
            self._fetchers.remove(tp)

    def _lead(self, tp: TopicPartition, state: PartitionState, replicas: tuple[int, ...]) -> None:
        with self._lock:
            current = self._leading.get(tp)
            if current is not None and current.epoch == state.leader_epoch:
                # Same term: this leader owns the ISR (the controller bumps the epoch when
                # it changes it). A view's ISR may be older than our own last write, and
                # adopting a smaller one would let the high watermark pass a member the
                # controller may still elect.
                return
        self._fetchers.remove(tp)
        plog = self._logs.get_log(*tp)
        plog.track_high_watermark()
        plog.begin_leader_epoch(state.leader_epoch)
        now = self._clock.monotonic_ms()
        leading = _Leading(
            state.leader_epoch,
            replicas,
            frozenset(state.isr),
            plog.log_end_offset,
            {
                r: _Progress(caught_up_ms=now if r in state.isr else 0)
                for r in replicas
                if r != self._settings.broker_id
            },
        )
        with self._lock:
            self._following.pop(tp, None)
            self._leading[tp] = leading
        log.info(
            "%s-%d: leader at epoch %d (log end %d, ISR %s)",
            *tp,
            state.leader_epoch,
            plog.log_end_offset,
            sorted(state.isr),
        )
        try:
            self._on_leader(*tp)
        except Exception:
            log.exception("%s-%d: taking over as leader failed", *tp)
        self._maybe_advance(tp)
        self._progress(tp)

    def _progress(self, tp: TopicPartition) -> None:
        with self._moved:
            self._moved.notify_all()
        self._on_progress(*tp)

    def wait_replicated(self, plog: PartitionLog, end_offset: int, timeout_ms: int) -> None:
        """Block until ``ack_status`` is final for ``end_offset``: return when durable,
        raise its error, or ``KafkaTimeoutError`` after ``timeout_ms``."""
        deadline = time.monotonic() + timeout_ms / 1000
        with self._moved:
            while True:
                status = self.ack_status(plog, end_offset)
                if isinstance(status, BaseException):
                    raise status
                if status == DURABLE:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise KafkaTimeoutError(
                        f"{plog.topic}-{plog.partition}: not replicated within {timeout_ms} ms"
                    )
                self._moved.wait(min(remaining, 1.0))

    def _follow(self, tp: TopicPartition, state: PartitionState, view: ClusterMetadata) -> None:
        # The leader's liveness is part of what is followed: a view that named the leader
        # before this broker's view had its registration (a cluster starting, a leader
        # re-registering) must not leave the partition unfetched at that epoch forever.
        # It did: the followers never fetched, the high watermark never moved, and every
        # acks=all write to the partition (a group's offset commit) timed out (CI).
        live = state.leader != NO_LEADER and state.leader in view.brokers
        followed = (state.leader, state.leader_epoch, live)
        with self._lock:
            was_leading = self._leading.pop(tp, None) is not None
            if self._following.get(tp) == followed and not was_leading:
                return
            self._following[tp] = followed
        plog = self._logs.get_log(*tp)
        plog.track_high_watermark()
        if not live:
            self._fetchers.remove(tp)
            log.info("%s-%d: no live leader (epoch %d); not fetching", *tp, state.leader_epoch)
        else:
            self._fetchers.add(FetchTarget(tp[0], tp[1], state.leader, state.leader_epoch))
            log.info(
                "%s-%d: follower of broker %d at epoch %d", *tp, state.leader, state.leader_epoch
            )
        if was_leading:
            self._progress(tp)  # parked acks=all produces answer NOT_LEADER now

    def resign_all(self, reason: str) -> None:
        """Lead and follow nothing until the next view (the ZooKeeper session is gone or
        presumed gone). Parked ``acks=all`` produces answer ``NOT_LEADER_OR_FOLLOWER``."""
        with self._lock:
            led = list(self._leading)
            followed = list(self._following)
            self._leading.clear()
            self._following.clear()
        for tp in followed:
            self._fetchers.remove(tp)
        if led or followed:
            log.warning(
                "resigning %d leadership(s) and %d followership(s): %s",
                len(led),
                len(followed),
                reason,
            )
        for tp in led:
            self._progress(tp)

    # --- the produce path (broker.core.produce.ReplicationHooks) --------------------------------

    def leader_epoch_for_append(
        self, topic: str, partition: int, *, acks_all: bool, current_leader_epoch: int
    ) -> int | None:
        with self._lock:
            leading = self._leading.get((topic, partition))
            if leading is None:
                raise NotLeaderOrFollowerError(
                    f"broker {self._settings.broker_id} does not lead {topic}-{partition}"
                )
            _check_epoch(topic, partition, leading.epoch, current_leader_epoch)
            isr_size = len(leading.isr)
        if acks_all:
            needed = self._logs.get_log(topic, partition).config.min_insync_replicas
            if isr_size < needed:
                raise NotEnoughReplicasError(
                    f"{topic}-{partition} has {isr_size} in-sync replica(s); "
                    f"min.insync.replicas is {needed}"
                )
        return leading.epoch

    def after_append(self, topic: str, partition: int) -> None:
        self._maybe_advance((topic, partition))

    def ack_status(self, plog: PartitionLog, end_offset: int) -> str | BaseException:
        tp = (plog.topic, plog.partition)
        with self._lock:
            leading = self._leading.get(tp)
            isr_size = 0 if leading is None else len(leading.isr)
        if leading is None:
            return NotLeaderOrFollowerError(
                f"broker {self._settings.broker_id} stopped leading {tp[0]}-{tp[1]} before "
                "the write was replicated; it may or may not be stored"
            )
        # Below min ISR first: the high watermark stays there (strict min ISR), so waiting
        # would only end in a timeout; the answer is the one a leader gave before strict
        # min ISR, when the high watermark passed the batch with too few replicas.
        if isr_size < plog.config.min_insync_replicas:
            return NotEnoughReplicasAfterAppendError(
                f"{tp[0]}-{tp[1]}: appended, but only {isr_size} in-sync replica(s) remain; "
                f"min.insync.replicas is {plog.config.min_insync_replicas}"
            )
        if plog.high_watermark < end_offset:
            return PENDING
        return DURABLE

    def check_epoch(self, topic: str, partition: int, current_leader_epoch: int) -> None:
        """Check a consumer's read or offset lookup: fenced if it names another leader
        epoch than ours (-1: not named); ``OffsetNotAvailableError`` while this broker, a
        new leader, has not yet moved its high watermark up to where its log ended when it
        took over (Kafka answers OFFSET_NOT_AVAILABLE then too). Before that the high
        watermark may be below one an earlier leader already exposed, and a reader would
        take the difference for lost records."""
        with self._lock:
            leading = self._leading.get((topic, partition))
        if leading is None:
            return
        _check_epoch(topic, partition, leading.epoch, current_leader_epoch)
        try:
            high_watermark = self._logs.get_log(topic, partition).high_watermark
        except UnknownTopicOrPartitionError:
            return
        if high_watermark < leading.epoch_start:
            raise OffsetNotAvailableError(
                f"{topic}-{partition}: the new leader's high watermark ({high_watermark}) "
                f"has not reached {leading.epoch_start} yet; retry"
            )

    # --- the fetch path: follower reads ----------------------------------------------------

    def on_follower_fetch(
        self, replica_id: int, spec: PartitionFetchSpec, plog: PartitionLog
    ) -> tuple[int, int] | None:
        """Check and record one follower read (``broker.core.fetch.ReplicaFetchHook``)."""
        tp = (spec.topic, spec.partition)
        with self._lock:
            leading = self._leading.get(tp)
            if leading is None:
                raise NotLeaderOrFollowerError(
                    f"broker {self._settings.broker_id} does not lead {tp[0]}-{tp[1]}"
                )
            _check_epoch(tp[0], tp[1], leading.epoch, spec.current_leader_epoch)
            progress = leading.followers.get(replica_id)
            if progress is None:
                raise UnknownTopicOrPartitionError(
                    f"broker {replica_id} is not a replica of {tp[0]}-{tp[1]}"
                )
        if spec.last_fetched_epoch >= 0:
            epoch, end = plog.end_offset_for_epoch(spec.last_fetched_epoch)
            if epoch != spec.last_fetched_epoch or end < spec.fetch_offset:
                return epoch, end
        leader_end = plog.log_end_offset
        now = self._clock.monotonic_ms()
        expand = False
        with self._lock:
            if self._leading.get(tp) is not leading:
                raise NotLeaderOrFollowerError(f"leadership of {tp[0]}-{tp[1]} moved")
            if spec.fetch_offset >= leader_end:
                progress.caught_up_ms = now
            elif spec.fetch_offset >= progress.last_fetch_leader_end >= 0:
                progress.caught_up_ms = max(progress.caught_up_ms, progress.last_fetch_ms)
            progress.last_fetch_leader_end = leader_end
            progress.last_fetch_ms = now
            progress.log_end_offset = spec.fetch_offset
            if (
                replica_id not in leading.isr
                and leading.pending_isr is None
                and spec.fetch_offset >= plog.high_watermark
                and spec.fetch_offset >= leading.epoch_start
            ):
                leading.pending_isr = _ordered(leading.replicas, leading.isr | {replica_id})
                expand = True
        if expand:
            self._isr_changes.put(tp)
        self._maybe_advance(tp)
        return None

    # --- high watermark --------------------------------------------------------------------

    def _maybe_advance(self, tp: TopicPartition) -> None:
        with self._lock:
            leading = self._leading.get(tp)
            if leading is None:
                return
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
                if r != self._settings.broker_id and r in leading.followers
            ]
        try:
            plog = self._logs.get_log(*tp)
        except UnknownTopicOrPartitionError:
            return
        if isr_size < plog.config.min_insync_replicas:
            # Strict min ISR (KIP-966): below min.insync.replicas the high watermark stays,
            # so every replica that left the ISR meanwhile (the ELR) holds every committed
            # record. The written ISR counts, not the maximal one: a member still being
            # added is not yet one the controller may elect.
            return
        target = min([plog.log_end_offset, *ends])
        if target >= 0 and plog.set_high_watermark(target):
            self._progress(tp)

    # --- ISR changes -----------------------------------------------------------------------

    def _run_lag_checks(self) -> None:
        interval = max(self._settings.replica_lag_time_max_ms / 2000, 0.05)
        while not self._stopped.wait(interval):
            try:
                self.check_lagging()
            except Exception:
                log.exception("ISR lag check failed")

    def check_lagging(self) -> None:
        """Ask to drop ISR members not caught up for ``replica.lag.time.max.ms``."""
        now = self._clock.monotonic_ms()
        limit = self._settings.replica_lag_time_max_ms
        shrink = []
        with self._lock:
            for tp, leading in self._leading.items():
                if leading.pending_isr is not None:
                    continue
                lagging = {
                    r
                    for r in leading.isr
                    if r in leading.followers and now - leading.followers[r].caught_up_ms > limit
                }
                if lagging:
                    leading.pending_isr = _ordered(leading.replicas, leading.isr - lagging)
                    shrink.append(tp)
                    log.warning(
                        "%s-%d: shrinking the ISR: %s not caught up for %d ms",
                        *tp,
                        sorted(lagging),
                        limit,
                    )
        for tp in shrink:
            self._isr_changes.put(tp)

    def _run_isr_changes(self) -> None:
        while True:
            tp = self._isr_changes.get()
            if tp is None or self._stopped.is_set():
                return
            with self._lock:
                leading = self._leading.get(tp)
                change = None if leading is None else leading.pending_isr
                epoch = -1 if leading is None else leading.epoch
                if leading is not None:
                    leading.isr_before = leading.isr
            if leading is None or change is None:
                continue
            written = False
            try:
                written = self._write_isr(tp[0], tp[1], self._settings.broker_id, epoch, change)
            except Exception as exc:
                log.warning("%s-%d: ISR change to %s failed: %s", *tp, list(change), exc)
            with self._lock:
                if self._leading.get(tp) is leading:
                    leading.pending_isr = None
                    if written:
                        leading.isr = frozenset(change)
                        now = self._clock.monotonic_ms()
                        for r in change:
                            if r in leading.followers:
                                leading.followers[r].caught_up_ms = max(
                                    leading.followers[r].caught_up_ms, now
                                )
            if written:
                before = leading.isr_before if leading.isr_before is not None else frozenset()
                self._on_isr_change(len(before - set(change)), len(set(change) - before))
                log.info("%s-%d: ISR now %s", *tp, list(change))
                self._maybe_advance(tp)
                self._progress(tp)

    # --- observability ---------------------------------------------------------------------

    def counts(self) -> tuple[int, int]:
        """(under-replicated, led) partitions: led ones whose ISR is below their replicas."""
        with self._lock:
            under = sum(1 for lead in self._leading.values() if len(lead.isr) < len(lead.replicas))
            return under, len(self._leading)

    def follower_lag(self) -> dict[tuple[str, int, int], int]:
        """Leader side: ``(topic, partition, follower) -> records behind`` (-1: unknown)."""
        out = {}
        with self._lock:
            snapshot = [(tp, dict(lead.followers)) for tp, lead in self._leading.items()]
        for tp, followers in snapshot:
            try:
                end = self._logs.get_log(*tp).log_end_offset
            except UnknownTopicOrPartitionError:
                continue
            for r, progress in followers.items():
                out[(tp[0], tp[1], r)] = (
                    -1 if progress.log_end_offset < 0 else end - progress.log_end_offset
                )
        return out


def _check_epoch(topic: str, partition: int, mine: int, theirs: int) -> None:
    if theirs < 0 or theirs == mine:
        return
    if theirs < mine:
        raise FencedLeaderEpochError(
            f"{topic}-{partition}: leader epoch {theirs} is stale; the leader is at {mine}"
        )
    raise UnknownLeaderEpochError(
        f"{topic}-{partition}: leader epoch {theirs} is newer than this broker's {mine}"
    )


def _ordered(replicas: tuple[int, ...], members: frozenset[int]) -> tuple[int, ...]:
    return tuple(r for r in replicas if r in members)
