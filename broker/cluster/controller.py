"""The controller: one broker at a time decides topics, placements and leaders.

Every broker runs a ``Controller``; it acts only while it holds the lease won in
``ClusterStore.try_become_controller`` (Kafka's ``/controller`` + ``/controller_epoch``).
Its duties, as Kafka's ZooKeeper-era controller:

* create, grow, configure and delete topics (``broker.cluster.topic_changes``): placement
  by Kafka's round robin over the live brokers (``assignment``), a fenced write of
  assignment, config and initial states;
* keep every partition led: when brokers come and go, elect leaders for partitions whose
  leader died (``election.reconcile``; offline with leader -1 when no replica may
  lead), take dead followers out of ISRs, and elect again when a broker returns;
* eligible leader replicas (KIP-966, ``election``'s docstring): keep the ELR and last
  known ELR with every ISR change it makes; take a broker that registered after an
  unclean shutdown (``previous_broker_epoch`` -1) out of every ISR and ELR it was in
  before, once (the state records the registrations read, ``brokers_zxid``); elect from
  the ELR when no ISR member is live; empty the ELR when ``min.insync.replicas`` changes;
* preferred-leader election on demand, and controlled shutdown (move leadership off a
  broker that is stopping);
* partition reassignment (KIP-455, ``broker.cluster.reassignment`` decides,
  ``broker.cluster.reassignment_driver`` reads and writes): start, complete and cancel,
  with the state in the topic znodes, so a new controller resumes where the old one
  stopped. While any is in progress a timer posts ``reassign`` events
  (``_REASSIGN_CHECK_S``): the controller does not watch every state znode for the ISR
  changes that let a reassignment complete, it re-reads the moving partitions' states.

Threading, as Kafka's ``ControllerEventManager``: kazoo's watch callbacks and the admin
calls only put events on a queue; one event thread takes them in order and, for each,
re-reads what it needs from ZooKeeper and decides again (never applying a diff). A write
that fails with ``ControllerMovedError`` means another broker is controller now: the
lease is dropped and the admin call gets ``NotControllerError``. Admin calls wait for
their event with a timeout.

Thread-safe: state is owned by the event thread; callers only enqueue.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

from tidelog.broker.cluster.controller_events import (
    BATCHED,
    Event,
    UrgentLane,
    answer_merged,
    coalesce,
    take_burst,
)
from tidelog.broker.cluster.election import (
    Elected,
    elect_preferred,
    reconcile,
)
from tidelog.broker.cluster.election_writes import (
    Decision,
    ViewWait,
    decide_reconcile,
    wait_until_seen,
    write_elections,
)
from tidelog.broker.cluster.reassignment_driver import ReassignmentDriver, Reassignments
from tidelog.broker.cluster.session import SessionFence
from tidelog.broker.cluster.shutdown_moves import PartitionView, move_off, partition_views
from tidelog.broker.cluster.store import (
    ClusterStore,
    ControllerLease,
    ControllerMovedError,
    StaleStateError,
    StateRead,
    StoreError,
)
from tidelog.broker.cluster.store_batch import ClusterRead
from tidelog.broker.cluster.topic_changes import TopicChanges
from tidelog.broker.cluster.znodes import NO_LEADER, TopicAssignment
from tidelog.broker.core.placement import Growth, NewTopic
from tidelog.storage.clock import Clock
from tidelog.storage.errors import (
    BrokerUnavailableError,
    NotControllerError,
    TopicAlreadyExistsError,
)

__all__ = ["Controller", "ControllerSettings", "InternalTopic", "Reassignments"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_ELECTION_RETRY_S = 1.0  # without a lease, try again this often (the watch usually fires first)
# Election writes per round; the urgent calls are served between rounds (about 0.7 s
# apart at 10,000 partitions here).
_WRITE_CHUNK = 1_000
_SLOW_EVENT_MS = 1_000  # an event taking this long is logged with its time
_IMAGE_WAIT_MS = 2_000  # how long a new controller waits for its image to settle
_SEEN_WAIT_MS = 5_000  # how long a reconcile's ISR shrinks wait for its elections to be seen
_Write = Callable[[list[Decision]], Mapping[tuple[str, int], Exception | None]]
_INTERNAL_TOPIC_GRACE_MS = 10_000  # how long a new controller waits for enough brokers
_REASSIGN_CHECK_S = 0.25  # while a reassignment is in progress, re-read its ISRs this often


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """What the controller needs of the broker's configuration."""

    broker_id: int
    unclean_leader_election: bool = False
    admin_timeout_ms: int = 30_000
    # Replicas of the internal topics, capped at the live brokers when they are created
    # (Kafka's offsets.topic.replication.factor, default 3).
    internal_replication_factor: int = 3
    # Kafka's auto.leader.rebalance.enable and leader.imbalance.check.interval.seconds:
    # every interval, partitions whose preferred replica is alive and in sync but not
    # leading get it back as leader (0 disables).
    leader_rebalance_interval_ms: int = 300_000
    # The broker default of min.insync.replicas, for topics that do not set it: the ELR
    # rules (KIP-966, ``broker.cluster.election``) depend on it.
    min_insync_replicas: int = 1


# An internal topic the controller creates when missing: its partition count, its
# replication factor (None: ``ControllerSettings.internal_replication_factor``) and its
# config.
InternalTopic = tuple[int, int | None, Mapping[str, str]]


class Controller:
    """Controller duties of one broker. Build, ``start``, ``stop``."""

    def __init__(
        self,
        store: ClusterStore,
        settings: ControllerSettings,
        clock: Clock,
        *,
        rng: random.Random | None = None,
        internal_topics: Mapping[str, InternalTopic] | None = None,
        fence: SessionFence | None = None,
        image: Callable[[int], ClusterRead | None] | None = None,
        view_wait: ViewWait | None = None,
    ) -> None:
        """``image``: the broker's metadata image (``MetadataWatcher.image_read``), which
        a newly elected controller reconciles from instead of reading every znode;
        ``view_wait``: the broker's ``MetadataWatcher.wait_for`` (``_reconcile``)."""
        self._store = store
        self._image = image
        self._view_wait = view_wait
        self._fence = fence or SessionFence()
        self._internal_topics = dict(internal_topics or {})
        self._settings = settings
        self._clock = clock
        self._rng = rng or random.Random()
        self._events: queue.Queue[Event] = queue.Queue()
        self._urgent = UrgentLane(self._events)
        self._serving_urgent = False
        self._lease: ControllerLease | None = None
        self._topic_changes = TopicChanges(
            store, self._rng, min_isr=self._min_isr, on_stale=lambda: self._post("brokers")
        )
        self._reassignments = ReassignmentDriver(store)
        # Whether a reassignment may be in progress (the event thread's; read by the timer).
        self._reassigning = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"tidelog-controller-{settings.broker_id}", daemon=True
        )

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the event thread and the watches that feed it."""
        self._thread.start()
        if self._settings.leader_rebalance_interval_ms > 0:
            threading.Thread(
                target=self._run_rebalance_timer,
                name=f"tidelog-leader-rebalance-{self._settings.broker_id}",
                daemon=True,
            ).start()
        threading.Thread(
            target=self._run_reassign_timer,
            name=f"tidelog-reassign-{self._settings.broker_id}",
            daemon=True,
        ).start()
        self._store.watch_data("/controller", lambda _data: self._post("election"))
        self._store.watch_children("/brokers/ids", lambda _ids: self._post("brokers"))

    def stop(self, timeout_ms: int = 5_000) -> None:
        """Resign (if controller) and end the event thread."""
        self._stopped.set()
        self._events.put(Event("stop"))
        self._thread.join(timeout_ms / 1000)

    def _run_rebalance_timer(self) -> None:
        interval_s = self._settings.leader_rebalance_interval_ms / 1000
        while not self._stopped.wait(interval_s):
            self._post("rebalance")

    def _run_reassign_timer(self) -> None:
        while not self._stopped.wait(_REASSIGN_CHECK_S):
            if self._reassigning and self._lease is not None:
                self._post("reassign")

    def session_lost(self) -> None:
        """The ZooKeeper session expired: ``/controller`` went with it, so stop acting.

        The lease is dropped without resigning (the node is gone already); the next
        event tries an election on the new session.
        """
        if self._lease is not None:
            log.warning("controller epoch %d: ZooKeeper session lost", self._lease.epoch)
        self._lease = None
        self._post("election")

    def session_restored(self) -> None:
        """Back on ZooKeeper after being cut off (``SessionFence`` lifted): decide again
        from a fresh read, as on any change (with the lease if the session survived)."""
        self._post("election")

    @property
    def is_controller(self) -> bool:
        """Holding the lease and not cut off from ZooKeeper (issue #33: a controller that
        cannot reach ZooKeeper cannot write, so it does not act as one)."""
        return self._lease is not None and not self._fence.cut_off

    @property
    def epoch(self) -> int:
        """The epoch this broker controls with, or -1 when it is not the controller."""
        lease = self._lease
        return lease.epoch if lease is not None else -1

    # --- admin operations (any thread; run on the event thread) --------------------------

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str],
        *,
        assignment: Mapping[int, Sequence[int]] | None = None,
    ) -> TopicAssignment:
        """Place and create a topic. Raises ``NotControllerError``, ``TopicAlreadyExistsError``,
        ``InvalidReplicationFactorError``, ``BrokerUnavailableError`` (timeout).

        ``assignment`` (partition -> replicas, preferred leader first): written as given
        instead of placed, once its brokers are checked against the live registrations
        (``InvalidReplicaAssignmentError``, Kafka's rules: ``broker.core.replica_assignment``);
        ``partitions`` and ``replication_factor`` are then the assignment's."""
        manual = None if assignment is None else [(p, tuple(r)) for p, r in assignment.items()]
        return self._call(
            lambda: self._topic_changes.create(
                self._require_lease(), name, partitions, replication_factor, dict(config), manual
            )
        )

    def delete_topic(self, name: str) -> None:
        self._call(lambda: self._topic_changes.delete(self._require_lease(), name))

    def create_topics(self, specs: Sequence[NewTopic]) -> dict[str, TopicAssignment | Exception]:
        """Create many topics in one batch (``TopicChanges.create_many``), merged with
        other callers' creations queued beside it (``controller_events``). Per topic its
        assignment or its error; a topic another caller of the same batch named first
        gets ``TopicAlreadyExistsError``. Raises ``NotControllerError``,
        ``BrokerUnavailableError`` (no answer within the admin timeout)."""
        return cast(
            "dict[str, TopicAssignment | Exception]", self._batch("create_topics", list(specs))
        )

    def delete_topics(self, names: Sequence[str]) -> dict[str, Exception | None]:
        """Delete many topics in one batch (``TopicChanges.delete_many``), merged as
        ``create_topics``. Per topic None or its error (``UnknownTopicOrPartitionError``)."""
        return cast("dict[str, Exception | None]", self._batch("delete_topics", list(names)))

    def create_partitions_many(
        self, growths: Sequence[Growth]
    ) -> dict[str, TopicAssignment | Exception]:
        """Grow many topics in one batch (``TopicChanges.grow_many``), merged as
        ``create_topics``."""
        return self._batch("create_partitions", list(growths))

    def _batch(self, kind: str, items: list[Any]) -> dict[str, Any]:
        return cast("dict[str, Any]", self._wait(Event(kind, items=items)))

    def _run_batch(self, event: Event) -> None:
        """Run a (merged) batched event; each caller gets its own items' answers."""
        lease = self._require_lease()
        results: Mapping[str, Any]
        if event.kind == "create_topics":
            results = self._topic_changes.create_many(lease, event.items)
        elif event.kind == "create_partitions":
            results = self._topic_changes.grow_many(lease, event.items)
        else:
            results = self._topic_changes.delete_many(lease, event.items)
        answer_merged(event, results)

    def create_partitions(
        self, name: str, total: int, *, assignment: Sequence[Sequence[int]] | None = None
    ) -> TopicAssignment:
        """Grow a topic to ``total`` partitions, placed by the round robin or (``assignment``,
        one replica list per new partition) as given, checked as Kafka's
        (``InvalidReplicaAssignmentError``)."""
        manual = None if assignment is None else [tuple(r) for r in assignment]
        return self._call(
            lambda: self._topic_changes.grow(self._require_lease(), name, total, manual)
        )

    def alter_topic_config(self, name: str, config: Mapping[str, str]) -> None:
        self._call(
            lambda: self._topic_changes.alter_config(self._require_lease(), name, dict(config))
        )

    def elect_leaders(
        self, unclean: bool, partitions: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], str]:
        """Kafka's ElectLeaders (KIP-460) for ``partitions`` (None: every partition): the
        preferred replica where it can lead and does not, or (``unclean``) any live replica
        of a partition with no leader, whatever the topic's
        ``unclean.leader.election.enable``. Per partition "" (elected) or Kafka's error
        name: ``ELECTION_NOT_NEEDED``, ``PREFERRED_LEADER_NOT_AVAILABLE``,
        ``ELIGIBLE_LEADERS_NOT_AVAILABLE``, ``UNKNOWN_TOPIC_OR_PARTITION``. Asked for every
        partition, those that needed no election are left out, as Kafka does."""
        return self._call(lambda: self._elect_leaders(unclean, partitions))

    def elect_preferred_leaders(self) -> int:
        """Move leadership back to preferred replicas where possible; returns how many moved."""
        return sum(1 for code in self.elect_leaders(False, None).values() if not code)

    def alter_partition_reassignments(
        self, targets: Mapping[tuple[str, int], Sequence[int] | None]
    ) -> dict[tuple[str, int], str]:
        """Kafka's AlterPartitionReassignments (KIP-455): move each partition to its target
        replicas, or (None) cancel its reassignment. Per partition "" (started or
        cancelled; the move completes in the background) or Kafka's error name:
        ``INVALID_REPLICA_ASSIGNMENT``, ``NO_REASSIGNMENT_IN_PROGRESS``,
        ``UNKNOWN_TOPIC_OR_PARTITION``, ``REQUEST_TIMED_OUT`` (written in between too often;
        ask again)."""
        wanted = {key: None if t is None else tuple(t) for key, t in targets.items()}
        return self._call(lambda: self._alter_reassignments(wanted))

    def list_partition_reassignments(
        self, partitions: Sequence[tuple[str, int]] | None
    ) -> Reassignments:
        """The partitions being reassigned among ``partitions`` (None: all), each with its
        replicas (the union), adding and removing replicas."""
        return self._call(lambda: self._list_reassignments(partitions))

    def controlled_shutdown(self, broker_id: int) -> int:
        """Move leadership off ``broker_id``; returns the partitions it still leads."""
        return self._call(lambda: self._controlled_shutdown(broker_id), urgent=True)

    def set_topic_defaults(self, min_insync_replicas: int, unclean_leader_election: bool) -> None:
        """This broker's topic defaults changed (dynamic broker configs,
        ``broker.core.configs``): the elections this controller runs read them from now on
        for topics without their own value, as Kafka's controller reads its broker's
        current config. A partition left without a leader gets another election at once
        (unclean election may now be allowed: Kafka's ``UncleanLeaderElectionEnable``
        event); a changed ``min.insync.replicas`` empties the ELRs of those topics
        (KIP-966, as a topic's own change does). Any thread; the work is the event
        thread's, and only while this broker is the controller."""
        before = self._settings
        if (before.min_insync_replicas, before.unclean_leader_election) == (
            min_insync_replicas,
            unclean_leader_election,
        ):
            return
        # One reference swap: the event thread reads whole settings, old or new.
        self._settings = replace(
            before,
            min_insync_replicas=min_insync_replicas,
            unclean_leader_election=unclean_leader_election,
        )
        if min_insync_replicas != before.min_insync_replicas:
            self._post("min_isr_default")
        self._post("brokers")

    def _call(self, operation: Callable[[], _T], *, urgent: bool = False) -> _T:
        return cast(_T, self._wait(Event("call", operation), urgent=urgent))

    def _wait(self, event: Event, *, urgent: bool = False) -> Any:
        reason = self._fence.reason
        if reason is not None:  # at once: the event thread may be stuck on ZooKeeper
            raise NotControllerError(
                f"broker {self._settings.broker_id} cannot act as controller: {reason}"
            )
        if urgent:
            self._urgent.put(event)
        else:
            self._events.put(event)
        try:
            return event.result.result(timeout=self._settings.admin_timeout_ms / 1000)
        except TimeoutError:
            raise BrokerUnavailableError(
                f"the controller did not answer within {self._settings.admin_timeout_ms} ms"
            ) from None

    def _post(self, kind: str) -> None:
        if not self._stopped.is_set():
            self._events.put(Event(kind))

    # --- the event thread ----------------------------------------------------------------

    def _run(self) -> None:
        self._post("election")
        while True:
            try:
                first = self._events.get(timeout=_ELECTION_RETRY_S)
            except queue.Empty:
                if self._lease is None:
                    first = Event("election")
                else:
                    continue
            # Everything queued now, coalesced (``controller_events``): a burst of topic
            # calls is one batch, a burst of broker changes one re-read.
            burst = coalesce(take_burst(self._events, first))
            if self._handle_burst(burst):
                break
            self._serve_urgent()  # a burst of wake-ups alone
        lease, self._lease = self._lease, None
        if lease is not None:
            try:
                self._store.resign(lease)
            except StoreError as exc:
                log.warning("controller: could not resign: %s", exc)

    def _handle_burst(self, burst: list[Event]) -> bool:
        """Handle each event in order; whether a ``stop`` ended the burst."""
        for event in burst:
            if event.kind == "stop":
                return True
            self._serve_urgent()
            started_ms = self._clock.monotonic_ms()
            try:
                self._handle(event)
            except BaseException as exc:  # the thread must survive anything
                if event.kind == "call" or event.kind in BATCHED:
                    for each in event.merged or [event]:
                        if not each.result.done():
                            each.result.set_exception(exc)
                elif isinstance(exc, StoreError):
                    log.warning("controller: %s failed: %s", event.kind, exc)
                else:
                    log.exception("controller: %s failed", event.kind)
            took_ms = self._clock.monotonic_ms() - started_ms
            if took_ms >= _SLOW_EVENT_MS:  # what a queued call waited behind
                log.info("controller: %s event took %d ms", event.kind, took_ms)
        return False

    def _serve_urgent(self) -> None:
        """Handle the urgent calls queued now (``controller_events.UrgentLane``): before
        each event, and between the write rounds of a long one (``_write_all``)."""
        if self._serving_urgent:
            return  # an urgent call's own writes
        self._serving_urgent = True
        try:
            for event in self._urgent.take():
                self._handle_burst([event])
        finally:
            self._serving_urgent = False

    def _handle(self, event: Event) -> None:
        reason = self._fence.reason
        if reason is not None:
            # Cut off: every ZooKeeper call would fail or hang; ``session_restored`` posts
            # an election once back, which re-reads everything.
            if event.kind == "call" or event.kind in BATCHED:
                raise NotControllerError(
                    f"broker {self._settings.broker_id} cannot act as controller: {reason}"
                )
            return
        if event.kind in BATCHED:
            event.run = lambda: self._run_batch(event)
        if event.kind == "call" or event.kind in BATCHED:
            if self._lease is None:
                try:
                    self._try_elect()
                except StoreError as exc:
                    raise NotControllerError(f"no controller here: {exc}") from None
            if self._lease is None:
                raise NotControllerError(
                    f"broker {self._settings.broker_id} is not the controller"
                    f" (the controller is {self._store.controller_id()})"
                )
            assert event.run is not None
            try:
                answer = event.run()
                if event.kind == "call":
                    event.result.set_result(answer)
            except ControllerMovedError:
                self._lease = None
                raise NotControllerError("the controller moved during the operation") from None
            except StoreError as exc:
                # The session is broken or expiring: this broker cannot act as controller
                # now (a fenced write could not have happened); the client retries.
                raise NotControllerError(f"the controller cannot reach ZooKeeper: {exc}") from None
            return
        if self._lease is None:
            self._try_elect()
            return
        if event.kind in ("brokers", "election"):
            self._ensure_internal_topics()
            self._reconcile()
            self._progress_reassignments()
        elif event.kind == "reassign":
            self._progress_reassignments()
        elif event.kind == "min_isr_default":
            lease = self._require_lease()
            for topic in self._store.topics():
                assignment = self._store.read_topic(topic)
                config = self._store.read_topic_config(topic)
                if assignment is not None and "min.insync.replicas" not in config:
                    self._topic_changes.clear_elr(lease, topic, assignment)
        elif event.kind == "rebalance":
            moved = sum(1 for code in self._elect_leaders(False, None).values() if not code)
            if moved:
                log.info("leader rebalance: %d partition(s) back on their preferred replica", moved)

    def _try_elect(self) -> None:
        lease = self._store.try_become_controller(self._settings.broker_id, self._clock.wall_ms())
        if lease is None:
            return
        self._lease = lease
        self._lease_ms = self._clock.monotonic_ms()
        log.info("broker %d is the controller (epoch %d)", lease.broker_id, lease.epoch)
        self._ensure_internal_topics()
        self._reconcile(from_image=True)
        # A reassignment the previous controller started resumes from ZooKeeper.
        self._progress_reassignments()

    def _ensure_internal_topics(self) -> None:
        """Create the internal topics (the offsets topic, ``__transaction_state``) if they
        are missing.

        Each with its full replication factor (``InternalTopic.replication_factor``, or
        ``internal_replication_factor``) once that many brokers are live; a controller
        that has waited ``_INTERNAL_TOPIC_GRACE_MS`` for them creates them with the brokers
        it has (a cluster smaller than the factor still gets its groups working).
        """
        missing = [n for n in self._internal_topics if self._store.read_topic(n) is None]
        if not missing:
            return
        live = len(self._live())
        wanted = max(self._factor(name) for name in missing)
        waited = self._clock.monotonic_ms() - self._lease_ms
        if live < wanted and waited < _INTERNAL_TOPIC_GRACE_MS:
            delay = (_INTERNAL_TOPIC_GRACE_MS - waited) / 1000 + 0.1
            timer = threading.Timer(delay, self._post, ("brokers",))
            timer.daemon = True
            timer.start()
            return
        for name in missing:
            partitions, _, config = self._internal_topics[name]
            factor = max(1, min(self._factor(name), live))
            try:
                self._topic_changes.create(
                    self._require_lease(), name, partitions, factor, dict(config)
                )
            except TopicAlreadyExistsError:
                continue

    def _factor(self, internal_topic: str) -> int:
        own = self._internal_topics[internal_topic][1]
        return own if own is not None else self._settings.internal_replication_factor

    # --- duties --------------------------------------------------------------------------

    _lease_ms = 0

    def _live(self) -> set[int]:
        return set(self._store.live_brokers())

    def _write_all(self, decisions: list[Decision]) -> dict[tuple[str, int], Exception | None]:
        """Every decision written at once (``election_writes``); a partition another
        writer changed meanwhile gets a fresh read and decision (a ``brokers`` event)."""
        outcome = write_elections(
            self._store,
            self._require_lease(),
            decisions,
            chunk=_WRITE_CHUNK,
            between=self._serve_urgent,
        )
        if any(isinstance(failure, StaleStateError) for failure in outcome.values()):
            self._post("brokers")
        return outcome

    def _require_lease(self) -> ControllerLease:
        if self._lease is None:
            raise NotControllerError(f"broker {self._settings.broker_id} is not the controller")
        return self._lease

    def _reconcile(self, *, from_image: bool = False) -> None:
        """Re-read everything (three pipelined rounds, ``store_batch.read_cluster``);
        elect where a leader is gone; drop dead followers and replicas that restarted
        uncleanly (``election.reconcile``); write every change at once, new leaders first.

        ``from_image`` (the first reconcile of a new controller, a failover): the
        partitions as this broker's metadata image holds them, when it is current
        (``MetadataWatcher.image_read``), instead of reading them all again; Kafka's
        controller, too, decides a failover from its in-memory context. Only then:
        leaders are moved by the controller alone, and a crashed previous one has been
        gone for a session timeout, so the image has every leader it wrote (a watch
        fires within milliseconds). The live brokers are read fresh either way.
        Each write is a compare-and-set at the image's version: an ISR a leader changed
        since fails alone, and the ``brokers`` event that failure posts reads ZooKeeper.
        A ``brokers`` event is posted anyway, so a reconcile from ZooKeeper follows the
        failover's writes (an entry the image lacked, or a previous controller that
        resigned milliseconds ago, is then caught); it no longer holds the elections up.
        Later reconciles read ZooKeeper: this controller's own recent writes may not be
        in the image yet."""
        lease = self._require_lease()
        started_ms = self._clock.monotonic_ms()
        brokers = self._store.live_brokers_view()
        cluster = None
        if from_image and self._image is not None:
            cluster = self._image(_IMAGE_WAIT_MS)
            if cluster is None:
                log.info("the metadata image is not current: reading every partition")
            else:
                self._post("brokers")
        if cluster is None:
            cluster = self._store.read_cluster()
        read_ms = self._clock.monotonic_ms()
        decisions: list[Decision] = []
        shrinks: list[Decision] = []  # the same leader: written after every new leader
        for (topic, partition), found in cluster.states.items():
            assignment = cluster.assignments[topic]
            replicas = assignment.replicas.get(partition)
            if replicas is None:
                continue
            config = cluster.configs.get(topic, {})
            read = StateRead(*found)
            elected = decide_reconcile(
                topic,
                partition,
                replicas,
                brokers,
                read,
                min_isr=self._min_isr(config),
                unclean_allowed=self._unclean_allowed(config),
                controller_epoch=lease.epoch,
            )
            if elected is not None:
                moved = elected.state.leader != read.state.leader
                (decisions if moved else shrinks).append((topic, partition, elected, read.version))
        decided_ms = elected_ms = seen_ms = self._clock.monotonic_ms()
        try:
            # Kafka's order: offline partitions elected, then ISRs shrunk; the shrinks
            # wait (bounded) until this broker's view holds the new leaders, which the
            # other brokers' watchers are then reading without them (``election_writes.
            # wait_until_seen``; a failover at 10,000 partitions writes 3,300 elections
            # and 6,700 shrinks, and until its election is seen a partition has no
            # leader, while a shrink's partition is led and only its acks=all waits).
            outcome = self._write_all(decisions)
            elected_ms = seen_ms = self._clock.monotonic_ms()
            if shrinks:
                if decisions and self._view_wait is not None:
                    wait_until_seen(
                        self._view_wait, decisions, outcome, _SEEN_WAIT_MS, self._serve_urgent
                    )
                    seen_ms = self._clock.monotonic_ms()
                self._serve_urgent()  # between two rounds of writes, as ``_write_all``'s
                self._write_all(shrinks)
        except ControllerMovedError:
            log.info("controller epoch %d was superseded", lease.epoch)
            self._lease = None
        if self._clock.monotonic_ms() - started_ms >= _SLOW_EVENT_MS:
            log.info(
                "reconcile: %d states read in %d ms, decided in %d ms; %d elections written "
                "in %d ms, seen here in %d ms; %d other changes written in %d ms",
                len(cluster.states),
                read_ms - started_ms,
                decided_ms - read_ms,
                len(decisions),
                elected_ms - decided_ms,
                seen_ms - elected_ms,
                len(shrinks),
                self._clock.monotonic_ms() - seen_ms,
            )

    def _min_isr(self, config: Mapping[str, str]) -> int:
        value = config.get("min.insync.replicas")
        try:
            return int(value) if value is not None else self._settings.min_insync_replicas
        except ValueError:
            return self._settings.min_insync_replicas

    def _unclean_allowed(self, config: Mapping[str, str]) -> bool:
        value = config.get("unclean.leader.election.enable")
        if value is None:
            return self._settings.unclean_leader_election
        return value.lower() == "true"

    def _partitions(self, cluster: ClusterRead | None = None) -> Iterator[PartitionView]:
        """``shutdown_moves.partition_views`` (read from ZooKeeper unless ``cluster``)."""
        return partition_views(self._store, cluster, self._min_isr)

    def _elect_leaders(
        self, unclean: bool, wanted: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], str]:
        lease = self._require_lease()
        found = {(p.topic, p.partition): p for p in self._partitions()}
        keys = list(found) if wanted is None else list(dict.fromkeys(wanted))
        out: dict[tuple[str, int], str] = {}
        decisions: list[Decision] = []
        for key in keys:
            p = found.get(key)
            if p is None:
                out[key] = "UNKNOWN_TOPIC_OR_PARTITION"
                continue
            code, elected = self._election_for(p, unclean, lease)
            if elected is not None:
                decisions.append((p.topic, p.partition, elected, p.version))
            if wanted is None and code == "ELECTION_NOT_NEEDED":
                continue
            out[key] = code
        for key, failure in self._write_all(decisions).items():
            if failure is not None:
                # Written in between (a broker came or went): the next reconcile decides
                # from a fresh read; the caller may ask again.
                out[key] = "NOT_CONTROLLER" if self._lease is None else "REQUEST_TIMED_OUT"
        return out

    @staticmethod
    def _election_for(
        p: PartitionView, unclean: bool, lease: ControllerLease
    ) -> tuple[str, Elected | None]:
        """(Kafka's error name or "", the state to write) for one partition."""
        if unclean:
            if p.state.leader != NO_LEADER and p.state.leader in p.live:
                return "ELECTION_NOT_NEEDED", None
            elected = reconcile(
                p.replicas,
                p.state,
                p.live,
                min_isr=p.min_isr,
                unclean_allowed=True,
                controller_epoch=lease.epoch,
            )
            if elected is None or elected.state.leader == NO_LEADER:
                return "ELIGIBLE_LEADERS_NOT_AVAILABLE", None
            return "", elected
        if p.state.leader == p.replicas[0]:
            return "ELECTION_NOT_NEEDED", None
        elected = elect_preferred(p.replicas, p.state, p.live, controller_epoch=lease.epoch)
        if elected is None:
            return "PREFERRED_LEADER_NOT_AVAILABLE", None
        return "", p.with_elr(elected)

    # --- reassignment (``broker.cluster.reassignment_driver``) -----------------------------

    def _alter_reassignments(
        self, wanted: Mapping[tuple[str, int], tuple[int, ...] | None]
    ) -> dict[tuple[str, int], str]:
        out = self._reassignments.alter(self._require_lease(), wanted)
        self._reassigning = True
        self._post("reassign")
        return out

    def _progress_reassignments(self) -> None:
        """Complete every reassignment whose target replicas are all in the ISR."""
        if self._lease is None:
            return
        progress = self._reassignments.progress(self._lease)
        if progress.superseded:
            self._lease = None
        self._reassigning = progress.pending

    def _list_reassignments(self, wanted: Sequence[tuple[str, int]] | None) -> Reassignments:
        self._require_lease()
        return self._reassignments.in_progress(wanted)

    def _controlled_shutdown(self, broker_id: int) -> int:
        """``shutdown_moves``: the leaderships now, the followed ISRs right after. The
        stopping broker is answered once this broker's view holds the new leaders
        (bounded, ``wait_until_seen``), as Kafka's controller tells every broker before
        it answers: at 10,000 partitions views lagged the writes by a second or more,
        and clients were sent to the stopped broker meanwhile."""
        written: list[tuple[list[Decision], dict[tuple[str, int], Exception | None]]] = []

        def write(decisions: list[Decision]) -> dict[tuple[str, int], Exception | None]:
            written.append((decisions, self._write_all(decisions)))
            return written[-1][1]

        still = self._shutdown_round(broker_id, True, write)
        for decisions, outcome in written:
            if self._view_wait is not None:
                wait_until_seen(self._view_wait, decisions, outcome, _SEEN_WAIT_MS)
        self._urgent.put(Event("call", lambda: self._shutdown_round(broker_id, False)))
        return still

    def _shutdown_round(self, broker_id: int, leading: bool, write: _Write | None = None) -> int:
        lease = self._require_lease()
        image = None if self._image is None else self._image(_IMAGE_WAIT_MS)
        write = write or self._write_all
        return move_off(broker_id, lease.epoch, image, self._partitions, write, leading=leading)
