"""Replication on one broker: leading and following partitions, ISR, high watermark.

Kafka's ``ReplicaManager`` in the ZooKeeper era (``reference/replication.md`` sections 1
and 4), for the partitions this broker hosts. Each partition's log, role, leader epoch,
ISR, follower progress and high watermark live in its ``Partition``
(``broker.core.partition``, Kafka's ``Partition``), in the ``PartitionRegistry`` the core
was built with too; this manager sets the roles from the cluster's views, runs the
fetchers of the partitions it follows, and writes the ISR changes the partitions propose
to ZooKeeper. What follows is the behaviour of the two together:

* **Roles from the cluster's view.** Every metadata snapshot (ZooKeeper watches,
  ``broker.cluster.metadata``) says who leads each partition at which leader epoch, and
  its ISR. ``apply`` makes this broker leader (``Partition.make_leader``: record the epoch
  at the log end, track the high watermark, forget old follower progress, under the
  partition's one lock, so no produce sees the new epoch in the log without the role) or
  follower (``Partition.make_follower``, and hand the partition to the replica fetcher of
  its leader, ``broker.cluster.fetcher``) of every partition it is a replica of, and
  neither of the others (``Partition.resign``). A partition whose topic is still there
  but whose replicas no longer include this broker (a reassignment moved it away) also
  has its records deleted (``Partition.delete_replica_data``, Kafka's StopReplica with
  delete), also when it was removed while this broker was down (at its first view).
* **Leader: follower progress.** Each follower fetch (``Partition.on_follower_fetch``,
  called by the fetch path before it reads) names the follower's log end offset (its
  fetch offset) and the epoch of its last batch. If that epoch's end on the leader is
  below the fetch offset, or the leader has no such epoch, the answer is the divergence
  (``(epoch, end offset)``, KIP-279/KIP-320) and the follower truncates. Otherwise the
  follower's log end offset and "caught up" time are recorded as Kafka does: caught up
  now if it fetched from the leader's log end, else as of its previous fetch if it
  reached the log end the leader had then.
* **High watermark** = the smallest log end offset among the ISR (the leader's own
  included); it only moves up. A move completes parked consumer fetches and ``acks=all``
  produces (the registry's listeners). **Strict min ISR** (KIP-966, as Kafka 4.x): it moves only
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
  names it leader at its epoch (so a deposed leader cannot write) and holds the ISR the
  change was made from, on one thread of its own so no request waits for ZooKeeper. The
  new ISR takes effect locally once written. The controller, too, removes dead followers
  from the ISR, at the same leader epoch (KRaft's rule since KAFKA-15021,
  ``broker.cluster.election``): ``apply`` hands a leader the ISR of a view of its own
  epoch when the view is newer than what it knows (``Partition.update_isr``, ordered by
  the partition epoch, the znode's version).
* **acks=all** (``ack_status``): answered once the high watermark passed the batch; with
  fewer in-sync replicas than ``min.insync.replicas`` at any point before that answer,
  ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` at once (the high watermark would not move:
  Kafka 4.x lets such a produce wait for its timeout instead); refused before the append
  with ``NOT_ENOUGH_REPLICAS`` when the ISR is already too small.
* **ELR.** The leader's ISR writes (``IsrWriter``, ``broker.cluster.node``) also keep the
  state's eligible leader replicas (``election.with_elr``). An ELR-only change at the same
  leader epoch (the controller moving a replica from the ELR to the last known ELR, or
  emptying both) moves only the partition epoch the leader knows.

A leader cut off from ZooKeeper cannot change the ISR, so once its followers stop fetching
(they follow the new leader) its high watermark cannot pass what they had, and ``acks=all``
writes it takes are never acknowledged: Kafka's guarantee too. Unlike Kafka's, it does not
keep its role until it hears that its session expired: the node resigns everything
(``resign_all``) once the session may have expired (``broker.cluster.session``), so its
parked produces fail at once and its clients move on (issue #33).

Thread-safe: one lock over the followed table; the roles are the partitions' (each under
its own lock); storage calls and callbacks run outside both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tidelog.broker.cluster.fetcher import FetcherPool, FetchTarget
from tidelog.broker.cluster.metadata import ClusterMetadata
from tidelog.broker.cluster.summed_log import SummedLog
from tidelog.broker.cluster.znodes import NO_LEADER, PartitionState
from tidelog.broker.core.fetch import PartitionFetchSpec
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.storage.clock import Clock
from tidelog.storage.errors import StorageError
from tidelog.storage.files import sync_file_system
from tidelog.storage.partition_log import PartitionLog

__all__ = ["IsrProposal", "IsrWriter", "ReplicaManager", "ReplicaSettings"]

log = logging.getLogger(__name__)
_ROLE_THREADS = 8  # new leaderships of one view taken at once (their fsyncs overlap)

TopicPartition = tuple[str, int]
# A proposed ISR change: (topic, partition, leader id, leader epoch, new ISR, the ISR it
# changes).
IsrProposal = tuple[str, int, int, int, tuple[int, ...], tuple[int, ...]]
# Writes a batch of proposals; -> the znode version each written one got (absent: not).
IsrWriter = Callable[[Sequence[IsrProposal]], Mapping[TopicPartition, int]]


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """The broker's replication settings (Kafka's names in ``broker.config``)."""

    broker_id: int
    replica_lag_time_max_ms: int = 30_000
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_max_bytes: int = 1024 * 1024
    replica_fetch_backoff_ms: int = 1_000
    num_replica_fetchers: int = 1


_SLOW_ROLES_S = 1.0  # a batch of new leaderships taking longer logs where its time went
_LED, _FOLLOWING, _LEADERLESS = "leaderships taken", "followerships taken", "leaderless"
_ISR_TAKEN = "ISRs taken from the controller"


class ReplicaManager:
    """This broker's replicas. Build, ``start``, feed ``apply`` every view, ``stop``.

    ``partitions`` is the broker's registry (replicated), shared with the core from
    construction. ``on_leader`` is told (topic, partition) once this broker became its
    leader (Kafka's ``onLeadershipChange``: the group coordinator loads an offsets
    partition); ``on_isr_change`` counts each written change (members dropped, added).
    """

    def __init__(
        self,
        settings: ReplicaSettings,
        partitions: PartitionRegistry,
        clock: Clock,
        write_isr: IsrWriter,
        fetchers: FetcherPool,
        on_leader: Callable[[str, int], None] = lambda _t, _p: None,
        on_isr_change: Callable[[int, int], None] = lambda _shrunk, _expanded: None,
    ) -> None:
        if not partitions.replicated:
            raise ValueError("ReplicaManager: the partition registry is not replicated")
        self._settings = settings
        self._partitions = partitions
        self._clock = clock
        self._write_isr = write_isr
        self._fetchers = fetchers
        self._on_leader = on_leader
        self._on_isr_change = on_isr_change
        self._lock = threading.Lock()
        # Serialises ``apply`` (the metadata watcher) with its retries (the lag thread),
        # so a retry never applies a view older than one applied since.
        self._apply_lock = threading.Lock()
        # The latest view, while a role it gives could not be taken (``apply``).
        self._retry_view: ClusterMetadata | None = None
        # What the fetchers were told: -> (leader, epoch, whether it was live: fetching,
        # whether throttled: an adding replica of a reassignment)
        self._following: dict[TopicPartition, tuple[int, int, bool, bool]] = {}
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

    def set_follower_throttle(self, rate_bytes: int) -> None:
        """A new ``follower.replication.throttled.rate`` for this broker's fetchers (0:
        off; a dynamic broker config)."""
        self._fetchers.set_throttle_rate(rate_bytes)

    def stop(self) -> None:
        self._stopped.set()
        self._partitions.wake_isr_changes()
        self._fetchers.stop()
        self._isr_thread.join(5)
        self._lag_thread.join(5)

    # --- roles -----------------------------------------------------------------------------

    def apply(self, view: ClusterMetadata) -> None:
        """Take the roles ``view`` gives this broker (the metadata watcher's thread).

        Errors are logged per partition; a partition whose role cannot be taken (its log
        cannot be opened, or a full disk refuses the new leader's epoch checkpoint) is
        tried again with the same view every lag check (``retry_failed_roles``) until it
        is taken or a newer view comes: the view that made this broker leader may be the
        last for a long time, and a leader that never took its role leaves the partition
        without one while the controller believes it has (issue #29, disk-full). A
        partition this broker is no longer a replica of (or whose topic is gone) resigns:
        its parked ``acks=all`` produces answer ``NOT_LEADER_OR_FOLLOWER``.
        """
        with self._apply_lock:
            failed = self._apply_locked(view)
            self._retry_view = view if failed else None

    def retry_failed_roles(self) -> None:
        """Apply the latest view again if a role it gives was not taken (``apply``)."""
        with self._apply_lock:
            view = self._retry_view
            if view is None:
                return
            failed = self._apply_locked(view)
            self._retry_view = view if failed else None
        if not failed:
            log.info("every role of the latest view is taken now")

    def _apply_locked(self, view: ClusterMetadata) -> bool:
        """``apply``'s work, under ``_apply_lock``; whether a role could not be taken."""
        failed = False
        me = self._settings.broker_id
        self._partitions.live_brokers = frozenset(view.brokers)
        wanted: dict[TopicPartition, PartitionState] = {}
        for name, topic in view.topics.items():
            for partition, replicas in topic.assignment.replicas.items():
                state = topic.states.get(partition)
                if me in replicas and state is not None:
                    wanted[(name, partition)] = state
        taken = self._take_leads(
            {tp: state for tp, state in wanted.items() if state.leader == me}, view
        )
        roles = SummedLog(log)
        for tp, state in wanted.items():
            replicas = view.topics[tp[0]].assignment.replicas[tp[1]]
            try:
                if state.leader == me:
                    adding = view.topics[tp[0]].assignment.adding.get(tp[1], ())
                    outcome = taken.get(tp)
                    if isinstance(outcome, Exception):
                        raise outcome
                    self._lead(tp, state, replicas, roles, adding, taken=outcome)
                else:
                    self._follow(tp, state, view, roles)
            except Exception:
                failed = True
                log.exception("%s-%d: cannot take the role the cluster gives", *tp)
        roles.flush()
        with self._lock:
            gone = [tp for tp in self._following if tp not in wanted]
            for tp in gone:
                del self._following[tp]
        self._fetchers.remove_many(gone)
        for hosted in self._partitions.partitions():
            if (hosted.topic, hosted.partition) not in wanted:
                hosted.resign()
        self._delete_former_replicas(view, wanted)
        return failed

    def _delete_former_replicas(
        self, view: ClusterMetadata, wanted: dict[TopicPartition, PartitionState]
    ) -> None:
        """Delete the records of every local log whose partition is assigned to other
        brokers only (a reassignment moved it away, maybe while this broker was down)."""
        logs = self._partitions.logs
        me = self._settings.broker_id
        for name, topic in view.topics.items():
            for partition, replicas in topic.assignment.replicas.items():
                if me in replicas or (name, partition) in wanted:
                    continue
                try:
                    plog = logs.get_log(name, partition)
                    if plog.log_end_offset == 0 and plog.log_start_offset == 0:
                        continue
                    if self._partitions.get(name, partition).delete_replica_data():
                        log.info(
                            "%s-%d: no longer a replica here; its log was deleted", name, partition
                        )
                except Exception:
                    log.exception(
                        "%s-%d: cannot delete the log of a former replica", name, partition
                    )

    def _take_leads(
        self, leads: dict[TopicPartition, PartitionState], view: ClusterMetadata
    ) -> dict[TopicPartition, bool | Exception]:
        """LeaderAndIsr-style (issue #34): the new leaderships of one view taken at once,
        ``Partition.make_leader`` (its leader-epoch checkpoint's fsyncs) on up to
        ``_ROLE_THREADS`` threads, each partition under its own lock. Per partition what
        ``make_leader`` answered (or raised); ``_lead`` does the rest in order (the
        core's ``became_leader`` loads groups and transactions: one at a time). Only
        for two or more: one is taken in ``_lead`` itself."""
        todo = []
        refused: dict[TopicPartition, bool | Exception] = {}
        for tp, state in leads.items():
            try:
                if self._partitions.get(*tp).leader_epoch != state.leader_epoch:
                    todo.append((tp, state))
            except Exception as exc:
                # No local log (it could not be created: a full disk, the open-file
                # limit): this partition's role fails alone and is retried with the view
                # (``retry_failed_roles``); the others are taken. Raised here, it ended
                # the whole view's apply.
                refused[tp] = exc
        if len(todo) < 2:
            return refused
        # Stopped fetching first, all at once (``FetcherPool.remove_many``: one wait per
        # fetcher thread for an answer it is applying, not one per partition).
        self._fetchers.remove_many(tp for tp, _ in todo)

        def record(item: tuple[TopicPartition, PartitionState]) -> None:
            tp, state = item
            try:
                self._partitions.get(*tp).log.begin_leader_epoch(state.leader_epoch, sync=False)
            except Exception as exc:  # taken again below, synced, and failed there
                log.debug("%s-%d: epoch %d not recorded ahead: %r", *tp, state.leader_epoch, exc)

        def take(item: tuple[TopicPartition, PartitionState]) -> bool | Exception:
            tp, state = item
            assignment = view.topics[tp[0]].assignment
            try:
                return self._partitions.get(*tp).make_leader(
                    state.leader_epoch,
                    assignment.replicas[tp[1]],
                    state.isr,
                    assignment.adding.get(tp[1], ()),
                    state.partition_epoch,
                )
            except Exception as exc:
                return exc

        with ThreadPoolExecutor(min(_ROLE_THREADS, len(todo))) as pool:
            # Every new epoch's checkpoint written, then made durable by one flush of the
            # file system, then the roles taken (whose own epoch writes find the epoch
            # there): two fsyncs per partition were most of a failover at 10,000
            # partitions. The checkpoint is durable before the role lets a record of its
            # epoch in, as before; meanwhile an append under an old leadership is refused
            # by the log's stamp check (``Partition``: NOT_LEADER_OR_FOLLOWER, retried).
            started = time.monotonic()
            list(pool.map(record, todo))
            recorded = time.monotonic()
            try:
                sync_file_system(self._partitions.logs.data_dir)
            except OSError as exc:
                failed = StorageError(f"cannot make the new leader epochs durable: {exc}")
                return {**refused, **dict.fromkeys((tp for tp, _ in todo), failed)}
            synced = time.monotonic()
            taken = dict(zip([tp for tp, _ in todo], pool.map(take, todo), strict=True))
        if time.monotonic() - started >= _SLOW_ROLES_S:
            log.info(
                "%d new leadership(s): epochs written in %.0f ms, flushed in %.0f ms, "
                "roles taken in %.0f ms",
                len(todo),
                (recorded - started) * 1000,
                (synced - recorded) * 1000,
                (time.monotonic() - synced) * 1000,
            )
        return {**refused, **taken}

    def _lead(
        self,
        tp: TopicPartition,
        state: PartitionState,
        replicas: tuple[int, ...],
        roles: SummedLog,
        adding: tuple[int, ...] = (),
        *,
        taken: bool | None = None,
    ) -> None:
        """Lead ``tp`` at ``state``'s epoch; ``taken``: ``make_leader``'s answer when
        ``_take_leads`` called it already."""
        partition = self._partitions.get(*tp)
        if taken is False:
            return
        if taken is None and partition.leader_epoch == state.leader_epoch:
            # Same term (``make_leader`` checks again under the partition's lock). The
            # replica list may still arrive after the epoch (a reassignment's topic znode
            # read after its state): take it. The controller may have shrunk the ISR at
            # this epoch (a follower died): taken if the view is newer than the leader's
            # own last write.
            if partition.update_replicas(state.leader_epoch, replicas, adding):
                log.info("%s-%d: replicas now %s", *tp, list(replicas))
            if partition.update_isr(state.leader_epoch, state.isr, state.partition_epoch):
                roles.add(_ISR_TAKEN, f"{tp[0]}-{tp[1]}: ISR now {sorted(state.isr)}")
            return
        if taken is None:
            self._fetchers.remove(tp)
            if not partition.make_leader(
                state.leader_epoch, replicas, state.isr, adding, state.partition_epoch
            ):
                return
        with self._lock:
            self._following.pop(tp, None)
        roles.add(
            _LED,
            f"{tp[0]}-{tp[1]}: leader at epoch {state.leader_epoch} "
            f"(log end {partition.log.log_end_offset}, ISR {sorted(state.isr)})",
        )
        try:
            self._on_leader(*tp)
        except Exception:
            log.exception("%s-%d: taking over as leader failed", *tp)
        partition.maybe_advance_high_watermark()
        partition.notify_progress()

    def _follow(
        self, tp: TopicPartition, state: PartitionState, view: ClusterMetadata, roles: SummedLog
    ) -> None:
        # The leader's liveness is part of what is followed: a view that named the leader
        # before this broker's view had its registration (a cluster starting, a leader
        # re-registering) must not leave the partition unfetched at that epoch forever.
        # It did: the followers never fetched, the high watermark never moved, and every
        # acks=all write to the partition (a group's offset commit) timed out (CI).
        live = state.leader != NO_LEADER and state.leader in view.brokers
        # An adding replica of a reassignment fetches under the follower throttle.
        throttled = self._settings.broker_id in view.topics[tp[0]].assignment.adding.get(tp[1], ())
        followed = (state.leader, state.leader_epoch, live, throttled)
        partition = self._partitions.get(*tp)
        # Parked acks=all produces answer NOT_LEADER now if it led (Partition's progress).
        was_leading = partition.make_follower(state.leader, state.leader_epoch)
        with self._lock:
            if self._following.get(tp) == followed and not was_leading:
                return
            self._following[tp] = followed
        if not live:
            self._fetchers.remove(tp)
            roles.add(
                _LEADERLESS,
                f"{tp[0]}-{tp[1]}: no live leader (epoch {state.leader_epoch}); not fetching",
            )
        else:
            self._fetchers.add(
                FetchTarget(tp[0], tp[1], state.leader, state.leader_epoch, throttled)
            )
            roles.add(
                _FOLLOWING,
                f"{tp[0]}-{tp[1]}: follower of broker {state.leader} at epoch {state.leader_epoch}",
            )

    def resign_all(self, reason: str) -> None:
        """Lead and follow nothing until the next view (the ZooKeeper session is gone or
        presumed gone). Parked ``acks=all`` produces answer ``NOT_LEADER_OR_FOLLOWER``."""
        with self._lock:
            followed = list(self._following)
            self._following.clear()
        self._fetchers.remove_many(followed)
        led = [p for p in self._partitions.partitions() if p.resign()]
        if led or followed:
            log.warning(
                "resigning %d leadership(s) and %d followership(s): %s",
                len(led),
                len(followed),
                reason,
            )

    # --- the partitions' leader side, by name (tools and tests; the core calls the
    # partitions themselves) --------------------------------------------------------------

    def leader_epoch_for_append(
        self, topic: str, partition: int, *, acks_all: bool, current_leader_epoch: int
    ) -> int | None:
        """``Partition.leader_epoch_for_append``."""
        return self._partitions.get(topic, partition).leader_epoch_for_append(
            acks_all=acks_all, current_leader_epoch=current_leader_epoch
        )

    def after_append(self, topic: str, partition: int) -> None:
        """Records were appended to the log directly: ``maybe_advance_high_watermark``."""
        self._partitions.get(topic, partition).maybe_advance_high_watermark()

    def ack_status(self, plog: PartitionLog, end_offset: int) -> str | BaseException:
        """``Partition.ack_status``."""
        return self._partitions.get(plog.topic, plog.partition).ack_status(end_offset)

    def wait_replicated(self, plog: PartitionLog, end_offset: int, timeout_ms: int) -> None:
        """``Partition.wait_replicated``."""
        self._partitions.get(plog.topic, plog.partition).wait_replicated(end_offset, timeout_ms)

    def check_epoch(self, topic: str, partition: int, current_leader_epoch: int) -> None:
        """``Partition.check_epoch``."""
        self._partitions.get(topic, partition).check_epoch(current_leader_epoch)

    def on_follower_fetch(
        self, replica_id: int, spec: PartitionFetchSpec, plog: PartitionLog
    ) -> tuple[int, int] | None:
        """``Partition.on_follower_fetch``."""
        return self._partitions.get(plog.topic, plog.partition).on_follower_fetch(
            replica_id, spec.fetch_offset, spec.current_leader_epoch, spec.last_fetched_epoch
        )

    # --- ISR changes -----------------------------------------------------------------------

    def _run_lag_checks(self) -> None:
        interval = max(self._settings.replica_lag_time_max_ms / 2000, 0.05)
        while not self._stopped.wait(interval):
            try:
                self.check_lagging()
            except Exception:
                log.exception("ISR lag check failed")
            try:
                self.retry_failed_roles()
            except Exception:
                log.exception("retrying the roles of the latest view failed")

    def check_lagging(self) -> None:
        """Ask to drop ISR members not caught up for ``replica.lag.time.max.ms``."""
        now = self._clock.monotonic_ms()
        limit = self._settings.replica_lag_time_max_ms
        for partition in self._partitions.partitions():
            partition.maybe_shrink_isr(now, limit)

    def _run_isr_changes(self) -> None:
        """Write the ISR changes the partitions propose, everything queued at once as one
        batch (``IsrWriter``: pipelined reads and compare-and-sets): a broker coming back
        rejoins thousands of ISRs within moments, which one round trip each would
        serialise (issue #34)."""
        while True:
            taken = self._partitions.next_isr_changes()
            if None in taken or self._stopped.is_set():
                return
            changes = []
            for partition in dict.fromkeys(p for p in taken if p is not None):
                change = partition.begin_isr_write()
                if change is not None:
                    changes.append((partition, change))
            if not changes:
                continue
            me = self._settings.broker_id
            proposals = [
                (p.topic, p.partition, me, c.epoch, c.isr, tuple(sorted(c.base)))
                for p, c in changes
            ]
            try:
                written = self._write_isr(proposals)
            except Exception as exc:
                log.warning("%d ISR change(s) failed: %s", len(changes), exc)
                written = {}
            isr_log = SummedLog(log)
            for partition, change in changes:
                tp = (partition.topic, partition.partition)
                version = written.get(tp)
                moved = partition.finish_isr_write(
                    change, version is not None, -1 if version is None else version
                )
                if moved is not None:
                    self._on_isr_change(*moved)
                    isr_log.add("ISR changes", f"{tp[0]}-{tp[1]}: ISR now {list(change.isr)}")
            isr_log.flush()

    # --- observability ---------------------------------------------------------------------

    def counts(self) -> tuple[int, int]:
        """(under-replicated, led) partitions: led ones whose ISR is below their replicas."""
        under = led = 0
        for partition in self._partitions.partitions():
            leading, short = partition.replication_state()
            led += leading
            under += short
        return under, led

    def follower_lag(self) -> dict[tuple[str, int, int], int]:
        """Leader side: ``(topic, partition, follower) -> records behind`` (-1: unknown)."""
        out = {}
        for partition in self._partitions.partitions():
            for follower, lag in partition.follower_lag().items():
                out[(partition.topic, partition.partition, follower)] = lag
        return out
