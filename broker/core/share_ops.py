"""Share groups served (issue #32, step 3): the core's share operations, listener-neutral.

``ShareOps`` puts the two libraries of ``broker/share/`` behind the request pipeline: the
share-group coordinator (``ShareGroupManager``: membership and assignment, records in
``__consumer_offsets``) and the share partitions this broker leads
(``SharePartitionManager`` over ``ShareStateLog``, ``__share_group_state``). The core
(``broker.core.facade``) builds it with the rest (``open_share_parts``) and delegates; the
operations are:

* ``heartbeat``: ShareGroupHeartbeat, on the group's coordinator (the leader of its
  ``__consumer_offsets`` partition). A member that leaves gives back, at once, every
  record it holds on this broker.
* ``fetch``: ShareFetch, on the topic partitions' leader. Acknowledgements piggy-backed
  on the request are applied first (per partition, all or nothing, as
  ``SharePartitionManager.acknowledge``), then records are acquired for the member from
  the partitions it names (its assignment; the leader does not ask the coordinator, as
  Kafka's does not), at most ``max_records`` in all, round-robin from a rotating first
  partition so no partition starves. With nothing to hand out it waits up to
  ``max_wait_ms`` (a long poll): parked on the fetch purgatory under the partitions'
  keys, woken by an append (the high watermark moved), by records becoming available
  again here (a RELEASE, an expired lock, a member leaving), by an acknowledgement that
  moved the share-partition start offset (a full in-flight window has room again: as
  Kafka completes its delayed share fetches on acknowledgements; before, such a fetch
  slept out its whole wait while the window was free) or by the broker closing.
  The waiting occupies the calling thread (the gRPC executor's), so the wait is capped,
  by the broker's ``fetch.max.wait.ms`` as a Fetch's is, and never past
  ``MAX_SHARE_WAIT_MS``.
* ``acknowledge``: ShareAcknowledge (ACCEPT / RELEASE / REJECT / GAP per offset range;
  RETURN, Tidelog's own, from the gRPC listener).
  ``close_session`` (Kafka's share-session epoch -1): the member is done with this
  broker, so every record it still holds here is released now, not at its lock's expiry.
* ``describe``: ShareGroupDescribe's view, plus the state of each share partition
  assigned or with state, asked of its leader wherever it is (start and end offsets,
  records in flight by state; ``broker.core.share_admin``).
* ``list_groups``: every group with its type (ListGroups v5).
* the admin calls (``broker.core.share_admin``, mixed in): DescribeShareGroupOffsets,
  AlterShareGroupOffsets, DeleteShareGroupOffsets, DeleteGroups of a share group.
* ``serve_state``: the share coordinator's side of ReadShareGroupState,
  InitializeShareGroupState and WriteShareGroupState (another broker's share partition
  leader calls it; this broker's own calls it directly), ``broker.core.share_state_routing``;
  ``serve_summaries`` (ReadShareGroupStateSummary) and ``describe_partition_here`` (a
  share partition at its leader), the admin's calls between brokers.

Decisions:

* **The records of an answer are whole stored batches** covering the acquired ranges
  (as Kafka's ShareFetch): the client keeps only the records inside ``acquired`` and
  skips control batches. A range whose records retention removed meanwhile is simply
  absent (its records are archived when the share partition follows the log start).
* **Per-partition errors** (not the leader, unknown topic, a failed state write) answer
  that partition and let the others through; a whole-call error (the group id empty) is
  the call's.
* **Timers.** One thread (``share-timer``) expires members' sessions (their records are
  released here), expires acquisition locks, dead-letters the records to be
  dead-lettered (``SharePartitionManager.dead_letter_pass``), re-reads the group
  configs of the share partitions it leads (``refresh_group_configs``), prunes
  ``__share_group_state`` every
  ``share.coordinator.state.topic.prune.interval.ms``, and in a cluster unloads what this
  broker stopped leading (offsets partitions' share groups, state partitions, share
  partitions of topic partitions it no longer leads: ``internal_topic.unload_resigned``
  rules). It stops with the core (``close``), before the logs close.

Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tidelog.broker.cluster.share_peers import GrpcSharePeers
from tidelog.broker.config import BrokerConfig
from tidelog.broker.core.delayed import Purgatory
from tidelog.broker.core.errors import classify
from tidelog.broker.core.gate import OperationGate
from tidelog.broker.core.internal_topic import unload_resigned
from tidelog.broker.core.membership import Membership
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.core.share_admin import ShareAdminCalls
from tidelog.broker.core.share_group_configs import ShareGroupConfigCalls
from tidelog.broker.core.share_state_routing import RoutedShareState, StateCall
from tidelog.broker.core.share_wait import ShareFetchCancel, ShareWait
from tidelog.broker.core.topic_ids import topic_id
from tidelog.broker.groups.manager import GroupManager
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC
from tidelog.broker.share.dead_letter import DeadLetterSink
from tidelog.broker.share.groups import ShareGroupManager, TypedGroupListing, list_all_groups
from tidelog.broker.share.groups_coordinator import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    ShareGroupView,
    ShareHeartbeatAnswer,
    ShareHeartbeatRequest,
)
from tidelog.broker.share.partition import (
    RELEASE,
    RETURN,
    Acknowledgement,
    AcquiredRange,
)
from tidelog.broker.share.partition_manager import SharePartitionManager
from tidelog.broker.share.records import ShareSnapshot, ShareStateKey
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC, ShareStateLog
from tidelog.broker.tls import InterBrokerChannels
from tidelog.storage.clock import Clock
from tidelog.storage.errors import (
    CoordinatorLoadInProgressError,
    InvalidRequestError,
    LeaderNotAvailableError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
)
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import iter_batch_headers
from tidelog.storage.types import TopicPartition

__all__ = [
    "MAX_SHARE_WAIT_MS",
    "ShareAckRange",
    "ShareAcknowledged",
    "ShareFetchCancel",
    "ShareFetchSpec",
    "ShareFetched",
    "ShareGroupDescription",
    "ShareOps",
    "SharePartitionState",
    "ShareParts",
    "open_share_parts",
]

log = logging.getLogger(__name__)

MAX_SHARE_WAIT_MS = 30_000

# Acknowledgements appended, not yet known durable: per (topic, partition), the wait for
# their durability and whether waiting fetches should look again (records released, or
# the start offset moved: room in a full window; ``ShareOps._begin_acknowledge``).
_Durable = dict[tuple[str, int], tuple[Callable[[], None], bool]]
_READ_BYTES = 1 << 20
_TIMER_MAX_WAIT_S = 0.2


@dataclass(frozen=True, slots=True)
class ShareAckRange:
    """One acknowledgement: ``kind`` (``broker.share.partition`` GAP/ACCEPT/RELEASE/REJECT,
    or RETURN on the gRPC listener)
    for the offsets ``first_offset..last_offset`` of ``topic``-``partition``."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    kind: int


@dataclass(frozen=True, slots=True)
class ShareFetchSpec:
    """One ShareFetch. ``cancel``: its caller may go away while it waits (a stream)."""

    group_id: str
    member_id: str
    partitions: tuple[TopicPartition, ...]
    acknowledgements: tuple[ShareAckRange, ...] = ()
    max_records: int = 500
    max_wait_ms: int = 0
    cancel: ShareFetchCancel | None = None


@dataclass(frozen=True, slots=True)
class ShareAcknowledged:
    """The outcome of one partition's acknowledgements (``error_code`` "" applied)."""

    topic: str
    partition: int
    error_code: str = ""
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class ShareFetched:
    """One partition's answer: the acquired ranges and whole batches covering them."""

    topic: str
    partition: int
    acquired: tuple[AcquiredRange, ...] = ()
    records: bytes = b""
    error_code: str = ""
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class SharePartitionState:
    """A share partition as describe shows it (``SharePartition.stats``)."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    acquired: int
    available: int
    archived: int
    acknowledged: int = 0
    delivery_counts: tuple[tuple[int, int], ...] = ()
    # Records archived by a committed dead-letter transaction since this leader loaded
    # the share partition (broker.share.dead_letter).
    dead_lettered: int = 0


@dataclass(frozen=True, slots=True)
class ShareGroupDescription:
    """ShareGroupDescribe's view plus the share partitions led here."""

    view: ShareGroupView
    partitions: tuple[SharePartitionState, ...]


@dataclass(frozen=True, slots=True)
class ShareParts:
    """What ``BrokerCore.open`` builds for the share groups (before the core exists)."""

    store: ShareStateLog
    groups: ShareGroupManager


def open_share_parts(
    config: BrokerConfig,
    registry: PartitionRegistry,
    clock: Clock,
    groups: GroupManager,
    on_append: Callable[[str, int], None],
) -> ShareParts:
    """Open ``__share_group_state`` (created on the first start) and rebuild the share
    groups from the offset store's records. Raises ``StorageError``."""
    store = ShareStateLog.open(
        registry.logs, config.share.state_log, registry=registry, on_append=on_append
    )
    share_groups = ShareGroupManager.open(registry.logs, clock, groups, config.share.groups)
    return ShareParts(store, share_groups)


@dataclass(slots=True)
class _Generations:
    """Per topic partition, how often records became available again here."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: dict[tuple[str, int], int] = field(default_factory=dict)

    def bump(self, key: tuple[str, int]) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def get(self, key: tuple[str, int]) -> int:
        with self.lock:
            return self.counts.get(key, 0)


class ShareOps(ShareAdminCalls, ShareGroupConfigCalls):
    """The share operations of one broker. Starts its timer thread when built; ``close``
    once (the core's close does)."""

    def __init__(
        self,
        parts: ShareParts,
        config: BrokerConfig,
        registry: PartitionRegistry,
        membership: Membership,
        groups: GroupManager,
        gate: OperationGate,
        purgatory: Purgatory[tuple[str, int]],
        clock: Clock,
        *,
        dead_letters: DeadLetterSink | None = None,
    ) -> None:
        """``dead_letters``: runs the share groups' dead-letter transactions
        (``broker.core.share_dlq``); None: records to be dead-lettered wait."""
        self._config = config
        self._registry = registry
        self._logs = registry.logs
        self._membership = membership
        self._groups = groups
        self._gate = gate
        self._purgatory = purgatory
        self._clock = clock
        self.store = parts.store
        self.share_groups = parts.groups
        replicated = registry.replicated
        # Cluster mode: state calls to the other brokers' share coordinators.
        self._peers = (
            GrpcSharePeers(config.broker_id, InterBrokerChannels(config.security), self._address)
            if replicated
            else None
        )
        routed = RoutedShareState(
            parts.store,
            config.broker_id,
            self._leader_of,
            self._serve_state,
            self._peers,
            summarize=self._summarize,
        )
        self._routed = routed
        self._init_admin()
        self.partitions = SharePartitionManager(
            self._logs,
            routed,
            topic_id=topic_id,
            group_config=lambda g: config.share.partition_config(self._group_settings(g)),
            leader_epoch=self._leader_epoch if replicated else None,
            dead_letters=dead_letters,
        )
        self._generations = _Generations()
        self._rotation = 0
        self._roles_lock = threading.Lock()
        self._config_refreshed: dict[str, int] = {}
        # Cluster mode: what this broker loaded as a leader (unloaded when it resigns).
        offsets_partitions = self._logs.topic(OFFSETS_TOPIC).partitions
        self._offsets_loaded: set[int] = set() if replicated else set(range(offsets_partitions))
        self._state_loaded: set[int] = set() if replicated else set(range(self.store.partitions))
        self._stop = threading.Event()
        self._next_prune_ms = clock.monotonic_ms() + config.share.prune_interval_ms
        self._thread = threading.Thread(target=self._run, name="share-timer", daemon=True)
        self._thread.start()

    # --- membership (on the group's coordinator) ----------------------------------------

    def heartbeat(self, request: ShareHeartbeatRequest) -> ShareHeartbeatAnswer:
        """ShareGroupHeartbeat (``ShareGroupManager.heartbeat``'s errors, plus
        ``NotCoordinatorError`` / ``CoordinatorLoadInProgressError`` off the coordinator)."""
        with self._gate.operation():
            self._check_coordinator(request.group_id)
            if request.member_epoch == JOIN_EPOCH:
                # Not while an admin changes the group's offsets (share_admin: one step).
                lock = self._wait_admin(request.group_id)
                try:
                    answer = self.share_groups.heartbeat(request)
                finally:
                    lock.release()
            else:
                answer = self.share_groups.heartbeat(request)
            if request.member_epoch == LEAVE_EPOCH:
                self._release(request.group_id, request.member_id)
            return answer

    def describe(self, group_id: str, statistics: bool = True) -> ShareGroupDescription:
        """ShareGroupDescribe, with (``statistics``) those of each share partition that is
        assigned or has state (an empty group still shows where it stands), from its
        leader; one whose leader cannot answer is left out. The Kafka listener's
        ShareGroupDescribe carries none, so asks none (in a cluster they cost a call per
        state partition and per partition)."""
        with self._gate.operation():
            self._check_coordinator(group_id)
            view = self.share_groups.describe_group(group_id)
            if not statistics:
                return ShareGroupDescription(view, ())
            assigned = {tp for m in view.members for tp in m.assignment}
            states = []
            for tp, stats in self.partition_stats(group_id, assigned):
                states.append(
                    SharePartitionState(
                        tp.topic,
                        tp.partition,
                        stats.start_offset,
                        stats.end_offset,
                        stats.acquired,
                        stats.available,
                        stats.archived,
                        stats.acknowledged,
                        stats.delivery_counts,
                        stats.dead_lettered,
                    )
                )
            return ShareGroupDescription(view, tuple(states))

    def lock_duration_ms(self, group_id: str) -> int:
        """The acquisition lock duration of ``group_id``'s records (its settings')."""
        settings = self.share_groups.settings(group_id)
        return self._config.share.partition_config(settings).record_lock_duration_ms

    def list_groups(self) -> list[TypedGroupListing]:
        """Every group coordinated here, of every type (ListGroups v5)."""
        with self._gate.operation():
            self._groups.store.check_led_loaded()
            return list_all_groups(self._groups, self.share_groups)

    # --- the share coordinator (on the state partitions' leaders) -----------------------

    def serve_state(self, key: ShareStateKey, call: StateCall) -> ShareSnapshot | None:
        """Another broker's Read/Initialize/WriteShareGroupState for ``key``: ``call`` on
        the local store once this broker is the key's coordinator (``_serve_state``)."""
        with self._gate.operation():
            return self._serve_state(key, call)

    def _serve_state(self, key: ShareStateKey, call: StateCall) -> ShareSnapshot | None:
        partition = self.store.partition_for(key)
        self._check_state_coordinator(partition, f"share-group state of {key.group_id!r}")
        return call(self.store)

    def _check_state_coordinator(self, partition: int, what: str) -> None:
        """Raise unless this broker is the share coordinator of state partition
        ``partition`` (leads it, loaded at the current epoch)."""
        try:
            self._check_leader(SHARE_STATE_TOPIC, partition)
        except (NotLeaderOrFollowerError, LeaderNotAvailableError) as exc:
            raise NotCoordinatorError(f"{what}: {exc}") from None
        self.store.check_loaded(partition)
        with self._roles_lock:
            if partition not in self._state_loaded:
                raise CoordinatorLoadInProgressError(
                    f"{SHARE_STATE_TOPIC}-{partition}: still loading its share-group state"
                )

    def _leader_of(self, topic: str, partition: int) -> int:
        try:
            return self._membership.placement.partition(topic, partition).leader
        except Exception:  # not in the view yet: no coordinator known
            return -1

    def _leader_epoch(self, topic: str, partition: int) -> int | None:
        return self._registry.get(topic, partition).leader_epoch

    def _address(self, broker_id: int) -> str | None:
        for broker in self._membership.placement.cluster().brokers:
            if broker.broker_id == broker_id:
                return f"{broker.host}:{broker.port}"
        return None

    # --- records (on the partitions' leaders) -----------------------------------------

    def acknowledge(
        self,
        group_id: str,
        member_id: str,
        acknowledgements: Sequence[ShareAckRange],
        *,
        close_session: bool = False,
    ) -> list[ShareAcknowledged]:
        """ShareAcknowledge: one outcome per partition named. ``close_session``: release
        every record the member still holds here afterwards."""
        _check_ids(group_id, member_id)
        with self._gate.operation():
            results = self._acknowledge(group_id, member_id, acknowledgements)
            if close_session:
                self._release(group_id, member_id)
            return results

    def fetch(self, spec: ShareFetchSpec) -> tuple[list[ShareFetched], list[ShareAcknowledged]]:
        """ShareFetch: acknowledgements first, then records for the member (long poll up
        to ``max_wait_ms``, capped at ``MAX_SHARE_WAIT_MS``)."""
        _check_ids(spec.group_id, spec.member_id)
        if spec.max_records < 1:
            raise InvalidRequestError("max_records must be at least 1")
        with self._gate.operation():
            # The acknowledgements' appends first, their durability after the first
            # acquisitions' appends: one fsync serves both (group commit).
            acks, durable = self._begin_acknowledge(
                spec.group_id, spec.member_id, spec.acknowledgements
            )
            tps = list(dict.fromkeys(spec.partitions))
            # Capped as a Fetch's long poll is (``fetch.max.wait.ms``) and never past
            # ``MAX_SHARE_WAIT_MS``: the wait holds a thread.
            cap = min(self._config.fetch_max_wait_ms, MAX_SHARE_WAIT_MS)
            deadline = self._clock.monotonic_ms() + max(min(spec.max_wait_ms, cap), 0)
            cancel = spec.cancel
            while True:
                baseline = self._marks(tps)
                # The caller gone (its stream ended): its acknowledgements stand, and
                # nothing more is acquired for it.
                gone = cancel is not None and cancel.cancelled
                fetched = [] if gone else self._acquire(spec, tps)
                if durable:
                    acks, durable = self._await_acknowledged(acks, durable), {}
                now = self._clock.monotonic_ms()
                if (
                    gone
                    or any(f.acquired for f in fetched)
                    or now >= deadline
                    or self._purgatory.closed
                ):
                    return fetched, acks
                wait = ShareWait(deadline, self._moved(tps, baseline))
                if not self._purgatory.try_complete_else_watch(
                    wait, [(tp.topic, tp.partition) for tp in tps]
                ):
                    if cancel is None or cancel.watch(wait):
                        wait.wait((deadline - now) / 1000.0 + 0.05)
                    self._purgatory.cancel(wait)

    def _acknowledge(
        self, group_id: str, member_id: str, acknowledgements: Sequence[ShareAckRange]
    ) -> list[ShareAcknowledged]:
        begun, durable = self._begin_acknowledge(group_id, member_id, acknowledgements)
        return self._await_acknowledged(begun, durable)

    def _begin_acknowledge(
        self, group_id: str, member_id: str, acknowledgements: Sequence[ShareAckRange]
    ) -> tuple[list[ShareAcknowledged], _Durable]:
        """Each partition's acknowledgements applied and appended, not yet known durable:
        the outcomes so far, and per partition appended, its wait and whether it released
        records (``_await_acknowledged`` finishes them)."""
        by_partition: dict[tuple[str, int], list[Acknowledgement]] = {}
        for a in acknowledgements:
            by_partition.setdefault((a.topic, a.partition), []).append(
                Acknowledgement(a.first_offset, a.last_offset, a.kind)
            )
        results = []
        durable: _Durable = {}
        for (topic, partition), acks in by_partition.items():
            try:
                self._check_leader(topic, partition)
                wait, moved = self.partitions.begin_acknowledge(
                    group_id, topic, partition, member_id, acks
                )
            except Exception as exc:
                outcome = classify(exc)
                results.append(
                    ShareAcknowledged(topic, partition, outcome.code or "", outcome.message)
                )
                continue
            results.append(ShareAcknowledged(topic, partition))
            # Records available again, or room in a full window: waiting fetches look.
            durable[(topic, partition)] = (
                wait,
                moved or any(a.kind in (RELEASE, RETURN) for a in acks),
            )
        return results, durable

    def _await_acknowledged(
        self, begun: list[ShareAcknowledged], durable: _Durable
    ) -> list[ShareAcknowledged]:
        """The outcomes of ``_begin_acknowledge`` once durable: a partition whose wait
        fails answers its error (its share partition was dropped from memory)."""
        results = []
        for result in begun:
            pending = durable.get((result.topic, result.partition))
            if pending is None:
                results.append(result)
                continue
            wait, released = pending
            try:
                wait()
            except Exception as exc:
                outcome = classify(exc)
                results.append(
                    ShareAcknowledged(
                        result.topic, result.partition, outcome.code or "", outcome.message
                    )
                )
                continue
            results.append(result)
            if released:
                self._available_again(result.topic, result.partition)
        return results

    def _acquire(self, spec: ShareFetchSpec, tps: list[TopicPartition]) -> list[ShareFetched]:
        if not tps:
            return []
        start = self._rotation % len(tps)
        self._rotation += 1
        order = tps[start:] + tps[:start]
        budget = spec.max_records
        out: dict[TopicPartition, ShareFetched] = {}
        for tp in order:
            if budget <= 0:
                out[tp] = ShareFetched(tp.topic, tp.partition)
                continue
            try:
                self._check_leader(tp.topic, tp.partition)
                ranges = self.partitions.acquire(
                    spec.group_id, tp.topic, tp.partition, spec.member_id, budget
                )
                records = _read_ranges(self._logs.get_log(tp.topic, tp.partition), ranges)
            except Exception as exc:
                outcome = classify(exc)
                out[tp] = ShareFetched(
                    tp.topic,
                    tp.partition,
                    error_code=outcome.code or "",
                    error_message=outcome.message,
                )
                continue
            budget -= sum(r.last_offset - r.first_offset + 1 for r in ranges)
            out[tp] = ShareFetched(tp.topic, tp.partition, ranges, records)
        return [out[tp] for tp in tps]

    def _marks(self, tps: list[TopicPartition]) -> list[tuple[int, int]]:
        """What a waiting fetch watches: each partition's high watermark and how often
        its records became available again here."""
        marks = []
        for tp in tps:
            try:
                high_watermark = self._logs.get_log(tp.topic, tp.partition).high_watermark
            except Exception:
                high_watermark = -1
            marks.append((high_watermark, self._generations.get((tp.topic, tp.partition))))
        return marks

    def _moved(
        self, tps: list[TopicPartition], baseline: list[tuple[int, int]]
    ) -> Callable[[], bool]:
        return lambda: self._marks(tps) != baseline

    def _available_again(self, topic: str, partition: int) -> None:
        self._generations.bump((topic, partition))
        self._purgatory.check_and_complete((topic, partition))

    def _release(self, group_id: str, member_id: str) -> None:
        try:
            changed = self.partitions.release_member(group_id, member_id)
        except Exception:  # a failed state write: the locks expire instead
            log.warning("share group %s: releasing %s failed", group_id, member_id, exc_info=True)
            return
        for topic, partition in changed:
            self._available_again(topic, partition)

    # --- checks -------------------------------------------------------------------------

    def _check_leader(self, topic: str, partition: int) -> None:
        self._membership.placement.check_leader(topic, partition)

    def _check_coordinator(self, group_id: str) -> None:
        if self._membership.topic_admin is None:
            return
        store = self._groups.store
        partition = store.partition_for(group_id)
        try:
            self._membership.placement.check_leader(OFFSETS_TOPIC, partition)
        except (NotLeaderOrFollowerError, LeaderNotAvailableError) as exc:
            raise NotCoordinatorError(f"group {group_id!r}: {exc}") from None
        store.check_loaded(partition)
        with self._roles_lock:
            if partition not in self._offsets_loaded:
                raise CoordinatorLoadInProgressError(
                    f"group {group_id!r}: its share groups are still loading"
                )

    # --- leadership (cluster mode) ------------------------------------------------------

    def became_leader(self, topic: str, partition: int) -> None:
        """This broker now leads ``topic``-``partition``: an offsets partition's share
        groups are rebuilt from the records the group store just reloaded; a state
        partition's share-partition states are reloaded from its log."""
        with self._roles_lock:
            if topic == OFFSETS_TOPIC:
                loaded = self.share_groups.load_partition(partition)
                self._offsets_loaded.add(partition)
                if loaded:
                    log.info("%s-%d: %d share group(s) loaded", topic, partition, loaded)
            elif topic == SHARE_STATE_TOPIC:
                # The share partitions whose state lives there stay loaded: their leader's
                # memory holds only what a write made durable, which the reload reads.
                self.store.reload_partition(partition)
                self._state_loaded.add(partition)

    def _unload_resigned(self) -> None:
        if not self._registry.replicated:
            return

        def leads_offsets(partition: int) -> bool:
            return self._registry.get(OFFSETS_TOPIC, partition).is_leader

        def leads_state(partition: int) -> bool:
            return self._registry.get(SHARE_STATE_TOPIC, partition).is_leader

        def unload_offsets(partition: int) -> list[str]:
            self._offsets_loaded.discard(partition)
            return self.share_groups.unload_partition(partition)

        def unload_state(partition: int) -> None:
            self._state_loaded.discard(partition)
            self.store.unload_partition(partition)

        unload_resigned(
            lambda: sorted(self._offsets_loaded), leads_offsets, self._roles_lock, unload_offsets
        )
        unload_resigned(
            lambda: sorted(self._state_loaded), leads_state, self._roles_lock, unload_state
        )
        for _, topic, partition in self.partitions.loaded():
            if not self._registry.get(topic, partition).is_leader:
                self.partitions.unload(topic, partition)

    # --- the timer ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._unload_resigned()
                for removal in self.share_groups.expire():
                    self._release(removal.group_id, removal.member_id)
            except Exception:
                log.exception("share group session expiry failed")
            try:
                for _, topic, partition in self.partitions.expire_locks():
                    self._available_again(topic, partition)
            except Exception:
                log.exception("share partition lock expiry failed")
            self.partitions.dead_letter_pass()  # never raises: logs and retries
            self.refresh_group_configs(self._clock.monotonic_ms())  # never raises
            if self._clock.monotonic_ms() >= self._next_prune_ms:
                self._prune()
            self._stop.wait(_TIMER_MAX_WAIT_S)

    def _prune(self) -> None:
        self._next_prune_ms = self._clock.monotonic_ms() + self._config.share.prune_interval_ms
        with self._roles_lock:
            partitions = sorted(self._state_loaded)
        for partition in partitions:
            try:
                self.store.prune(partition)
            except Exception:
                log.warning("%s-%d: pruning failed", SHARE_STATE_TOPIC, partition, exc_info=True)

    def close(self) -> None:
        """Stop the timer. Idempotent."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._peers is not None:
            self._peers.close()


def _check_ids(group_id: str, member_id: str) -> None:
    if not group_id:
        raise InvalidRequestError("group_id must not be empty")
    if not member_id:
        raise InvalidRequestError("member_id must not be empty")


def _read_ranges(partition_log: PartitionLog, ranges: Sequence[AcquiredRange]) -> bytes:
    """Whole stored batches covering every offset of ``ranges`` (each batch once)."""
    out: list[bytes] = []
    covered = -1
    for r in sorted(ranges, key=lambda r: r.first_offset):
        offset = max(r.first_offset, covered)
        while offset <= r.last_offset:
            try:
                data = partition_log.read(offset, _READ_BYTES, max_offset=r.last_offset + 1).records
            except OffsetOutOfRangeError:
                break  # retention removed them: the share partition follows the log start
            if not data:
                break
            next_offset = offset
            for _, header in iter_batch_headers(data):
                next_offset = max(next_offset, header.next_offset)
            if next_offset <= offset:
                break
            out.append(data)
            offset = covered = next_offset
    return b"".join(out)
