"""Every broker's view of the cluster, kept from ZooKeeper watches.

Design choice (issue 13 leaves it open): brokers learn partition state by watching
ZooKeeper, not from controller pushes (Kafka's LeaderAndIsr/UpdateMetadata). At this
project's scale (a handful of brokers, hundreds of partitions) a watch per state znode is
cheap (each topic's assignment and config znodes and each partition's state znode are
watched), and there is no push that can be lost or arrive out of order: kazoo re-arms every
watch and re-reads after a reconnect, and each change here triggers a full re-read of
the cluster, never a diff (the reference's rule for one-shot watches). What the
controller pushed in Kafka (leader, epoch, ISR) is exactly what the state znodes hold.

``MetadataWatcher`` keeps an immutable ``ClusterMetadata`` snapshot, replaced whole after
each re-read; ``listener(snapshot)`` is called on the watcher's own thread after every
change, in order. Fencing as Kafka: a partition state with an older leader epoch than
one already seen is ignored (a slow read never moves leadership backwards). A state that
names a leader registered after the state was written (the leader restarted since) is
shown without a leader until the controller elects again
(``broker.cluster.election.leadership_predates_leader``).

Thread-safe: the snapshot is replaced atomically; reading it needs no lock.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from tidelog.broker.cluster.election import leadership_predates_leader
from tidelog.broker.cluster.store import ClusterStore, StoreError
from tidelog.broker.cluster.znodes import (
    BROKER_IDS,
    CONTROLLER,
    NO_LEADER,
    TOPICS,
    BrokerRegistration,
    PartitionState,
    TopicAssignment,
    partition_state_path,
    topic_config_path,
    topic_path,
)

__all__ = ["ClusterMetadata", "MetadataWatcher", "TopicMetadata"]

log = logging.getLogger(__name__)

_RETRY_S = 1.0  # after a failed re-read, try again this soon


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """A topic's placement, partition states (None: not written yet) and config."""

    assignment: TopicAssignment
    states: Mapping[int, PartitionState | None]
    config: Mapping[str, str]

    def leader(self, partition: int) -> int:
        state = self.states.get(partition)
        return NO_LEADER if state is None else state.leader


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """One consistent-enough view: brokers, controller, topics."""

    brokers: Mapping[int, BrokerRegistration] = field(default_factory=dict)
    controller_id: int | None = None
    topics: Mapping[str, TopicMetadata] = field(default_factory=dict)

    def leader(self, topic: str, partition: int) -> int:
        found = self.topics.get(topic)
        return NO_LEADER if found is None else found.leader(partition)


class MetadataWatcher:
    """Keeps ``snapshot`` current from ZooKeeper watches. Build, ``start``, ``stop``."""

    def __init__(
        self, store: ClusterStore, listener: Callable[[ClusterMetadata], None] | None = None
    ) -> None:
        self._store = store
        self._listener = listener
        self._snapshot = ClusterMetadata()
        self._wakeups: queue.Queue[str] = queue.Queue()
        self._watched: set[str] = set()
        self._watched_lock = threading.Lock()
        self._changed = threading.Condition()
        # Under _changed, for ``refresh_and_wait``: re-reads started so far, and the
        # number of the last one whose result was published.
        self._reads_started = 0
        self._read_published = 0
        self._thread = threading.Thread(target=self._run, name="tidelog-metadata", daemon=True)

    @property
    def snapshot(self) -> ClusterMetadata:
        return self._snapshot

    def start(self) -> None:
        self._thread.start()
        self._watch_children(BROKER_IDS)
        self._watch_children(TOPICS)
        self._watch_data(CONTROLLER)

    def stop(self, timeout_ms: int = 5_000) -> None:
        self._wakeups.put("stop")
        self._thread.join(timeout_ms / 1000)

    def refresh(self, *, force: bool = False) -> None:
        """Ask for a re-read now (after a session was re-established, say); ``force``
        hands the result to the listener even if nothing changed."""
        self._wakeups.put("force" if force else "refresh")

    def refresh_and_wait(self, timeout_ms: int) -> bool:
        """``refresh(force=True)``, then block until a re-read that started after this
        call was published (the listener has run on it) or ``timeout_ms`` passed;
        whether it was."""
        with self._changed:
            started = self._reads_started  # a re-read under way now may predate the call
        self.refresh(force=True)
        with self._changed:
            return self._changed.wait_for(lambda: self._read_published > started, timeout_ms / 1000)

    def wait_for(self, check: Callable[[ClusterMetadata], bool], timeout_ms: int) -> bool:
        """Block until ``check(snapshot)`` holds or ``timeout_ms`` passes; whether it held."""
        with self._changed:
            return self._changed.wait_for(lambda: check(self._snapshot), timeout_ms / 1000)

    # --- watches (kazoo's thread: only enqueue) ------------------------------------------

    def _watch_children(self, path: str) -> None:
        with self._watched_lock:
            if path in self._watched:
                return
            self._watched.add(path)
        self._store.watch_children(path, lambda _children: self._wakeups.put("refresh"))

    def _watch_data(self, path: str) -> None:
        with self._watched_lock:
            if path in self._watched:
                return
            self._watched.add(path)
        self._store.watch_data(path, lambda _data: self._wakeups.put("refresh"))

    # --- the re-read thread --------------------------------------------------------------

    def _run(self) -> None:
        failed = False
        pending_force = False
        while True:
            try:
                reason = self._wakeups.get(timeout=_RETRY_S if failed else None)
            except queue.Empty:
                reason = "retry"
            if reason == "stop":
                return
            force = pending_force or reason == "force"
            while not self._wakeups.empty():  # coalesce a burst of changes into one read
                reason = self._wakeups.get_nowait()
                if reason == "stop":
                    return
                force = force or reason == "force"
            with self._changed:
                self._reads_started += 1
                read = self._reads_started
            try:
                snapshot = self._read()
                failed = False
            except StoreError as exc:
                log.warning("cluster metadata re-read failed (retrying): %s", exc)
                failed = True
                pending_force = force  # the retry still owes the listener a view
                continue
            pending_force = False
            self._publish(snapshot, force=force, read=read)

    def _read(self) -> ClusterMetadata:
        store = self._store
        previous = self._snapshot
        topics: dict[str, TopicMetadata] = {}
        # Read before the states: a broker registering after this read has epoch greater
        # than any state read below, and its leaderships are caught on the next re-read
        # (its registration is a child change of /brokers/ids: a watch fires).
        brokers, broker_epochs = store.live_brokers_with_epochs()
        for name in store.topics():
            assignment = store.read_topic(name)
            if assignment is None:
                continue
            self._watch_data(topic_path(name))
            # The config is a znode of its own (/config/topics/NAME): unwatched, an altered
            # config reached no broker's view (the controller's included) until some other
            # change forced a re-read.
            self._watch_data(topic_config_path(name))
            states: dict[int, PartitionState | None] = {}
            for partition in assignment.replicas:
                self._watch_data(partition_state_path(name, partition))
                found = store.read_partition_state_written(name, partition)
                state = None if found is None else found.state
                if found is not None and leadership_predates_leader(
                    found.state, found.written_zxid, broker_epochs
                ):
                    # Granted to the leader's previous life: no leader until the
                    # controller elects again (broker.cluster.election).
                    state = replace(found.state, leader=NO_LEADER)
                old = previous.topics.get(name)
                same_topic = old is not None and old.assignment.topic_id == assignment.topic_id
                old_state = old.states.get(partition) if old is not None and same_topic else None
                if (
                    state is not None
                    and old_state is not None
                    and state.leader_epoch < old_state.leader_epoch
                ):
                    state = old_state  # a stale read: never move leadership backwards
                states[partition] = state
            topics[name] = TopicMetadata(assignment, states, store.read_topic_config(name))
        return ClusterMetadata(brokers, store.controller_id(), topics)

    def _publish(self, snapshot: ClusterMetadata, *, force: bool = False, read: int = 0) -> None:
        if snapshot == self._snapshot and not force:
            with self._changed:
                self._read_published = max(self._read_published, read)
                self._changed.notify_all()
            return
        # The listener first: whoever waits for a view (``wait_for``) then finds what the
        # listener does for it (the local logs of a new topic) already done.
        if self._listener is not None:
            try:
                self._listener(snapshot)
            except Exception:
                log.exception("cluster metadata listener failed")
        with self._changed:
            self._snapshot = snapshot
            self._read_published = max(self._read_published, read)
            self._changed.notify_all()
