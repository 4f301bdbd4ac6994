"""Every broker's view of the cluster, kept from ZooKeeper watches.

Design choice (issue 13 leaves it open): brokers learn partition state by watching
ZooKeeper, not from controller pushes (Kafka's LeaderAndIsr/UpdateMetadata): there is no
push that can be lost or arrive out of order. What the controller pushed in Kafka
(leader, epoch, ISR) is exactly what the state znodes hold.

An in-memory image, updated by watches (issue #34): every topic's assignment, config and
partition state znode is read with a one-shot ZooKeeper watch and kept until that watch
fires; a change then re-reads only the topics whose znodes' watches fired (a topic's
assignment and states together: one transaction writes them) and what was not yet read
(new topics, new partitions), each level in one pipelined round of asynchronous reads
(``broker.cluster.store_batch``), never one synchronous round trip per znode. The
registrations, the topic list and ``/controller`` are read on every re-read (a handful
of round trips). A burst of changes is coalesced into one re-read. What is re-read is
read whole, never patched with a diff (the reference's rule for one-shot watches), and
``refresh(force=True)`` (after a reconnect) or a lost session (kazoo drops every watch
and calls each once without a path) drops the image: everything is read again. Before,
every change re-read the whole cluster one znode at a time, so N topics created one
after another cost each broker O(N^2) round trips (60 topics of 4 partitions: 49 s).

``MetadataWatcher`` keeps an immutable ``ClusterMetadata`` snapshot, replaced whole after
each re-read; ``listener(snapshot)`` is called on the watcher's own thread after every
change, in order. Fencing as Kafka: a partition state with an older leader epoch than
one already seen, or the same epoch at an older znode version (partition epoch), is
ignored (a slow read never moves leadership or the ISR backwards). A state that
names a leader registered after the state was written (the leader restarted since) is
shown without a leader until the controller elects again
(``broker.cluster.election.leadership_predates_leader``).

The image also serves the controller (``image_read``): a broker that becomes controller
reconciles from what its watcher already holds (every state with its znode version and
last write's zxid, exactly what ``store_batch.read_cluster`` would read) instead of
reading every znode again (issue #34, step 3: at 9,000 partitions that read was 8-15 s of
a failover). Only when the image is as current as the watches say: no wake-up pending and
no re-read under way (waited for, briefly); otherwise None and the controller reads
ZooKeeper. Its writes are compare-and-sets at the versions in it, so an entry older than
ZooKeeper fails alone and is decided again from a fresh read.

Thread-safe: the snapshot is replaced atomically; reading it needs no lock.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tidelog.broker.cluster.election import leadership_predates_leader
from tidelog.broker.cluster.store import ClusterStore, StoreError
from tidelog.broker.cluster.store_batch import ClusterRead
from tidelog.broker.cluster.znodes import (
    BROKER_IDS,
    CONTROLLER,
    NO_LEADER,
    TOPIC_CONFIGS,
    TOPICS,
    BrokerRegistration,
    PartitionState,
    TopicAssignment,
    decode_topic,
    decode_topic_config,
    topic_config_path,
    topic_path,
)

__all__ = ["ClusterMetadata", "MetadataWatcher", "TopicMetadata"]

log = logging.getLogger(__name__)

_RETRY_S = 1.0  # after a failed re-read, try again this soon
_DIRTY = "dirty:"  # a wake-up naming a znode whose watch fired


class _Image:
    """The znodes of topics as last read, each valid until its one-shot watch fires
    (then ``forget``): the watcher thread's own, never shared."""

    def __init__(self) -> None:
        self.assignments: dict[str, TopicAssignment] = {}
        self.configs: dict[str, dict[str, str]] = {}
        self.states: dict[tuple[str, int], tuple[PartitionState, int, int]] = {}

    def clear(self) -> None:
        self.assignments.clear()
        self.configs.clear()
        self.states.clear()

    def keep_topics(self, names: set[str]) -> None:
        """Drop what is cached of topics no longer listed."""
        for name in [n for n in self.assignments if n not in names]:
            del self.assignments[name]
        for name in [n for n in self.configs if n not in names]:
            del self.configs[name]
        for key in [k for k in self.states if k[0] not in names]:
            del self.states[key]

    def forget(self, paths: set[str]) -> None:
        """The znodes at ``paths`` changed (or went): read them again. A topic's
        assignment and its states are forgotten together, whichever fired: the
        controller writes them in one transaction (a reassignment's replica lists with
        the states that go with them, ``ClusterStore.write_reassignment``), and a view
        must not pair a new replica list with a cached old state, or the reverse.

        Each topic once, however many of its paths fired: a topic already forgotten has
        no assignment cached, and forgetting it again scanned every cached state (a
        failover at 10,000 partitions fired 3,333 state paths of 200 topics: 33 million
        key comparisons before the new view, issue #34)."""
        topics: set[str] = set()
        for path in paths:
            if path.startswith(TOPIC_CONFIGS + "/"):
                self.configs.pop(path[len(TOPIC_CONFIGS) + 1 :], None)
            elif path.startswith(TOPICS + "/"):
                topics.add(path[len(TOPICS) + 1 :].split("/")[0])
        for name in topics:
            self._forget_topic(name)

    def _forget_topic(self, name: str) -> None:
        assignment = self.assignments.pop(name, None)
        if assignment is not None:  # partitions are never removed but with their topic
            for partition in assignment.replicas:
                self.states.pop((name, partition), None)
            return
        for key in [k for k in self.states if k[0] == name]:
            del self.states[key]


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
        self._image = _Image()
        # The image as of the last published read (``image_read``), and the one the
        # re-read under way built (the watcher thread's).
        self._reads: ClusterRead | None = None
        self._built: ClusterRead | None = None
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

    def image_read(self, timeout_ms: int) -> ClusterRead | None:
        """Every topic's assignment, config and partition states (with version and
        zxid) as the image holds them, once it is as current as the watches say (no
        wake-up pending, no re-read under way; waited for up to ``timeout_ms``); None
        if it is not by then, or nothing was read yet (module docstring)."""

        def settled() -> bool:
            return self._wakeups.empty() and self._reads_started == self._read_published

        with self._changed:
            if not self._changed.wait_for(settled, timeout_ms / 1000):
                return None
            return self._reads

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

    def _on_znode(self, event: Any) -> None:
        """A one-shot watch of the image fired (kazoo's thread: only enqueue). No path:
        the session was lost and kazoo dropped every watch: read everything again."""
        path = getattr(event, "path", None)
        self._wakeups.put(f"{_DIRTY}{path}" if path else "force")

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
            dirty = {reason[len(_DIRTY) :]} if reason.startswith(_DIRTY) else set()
            while not self._wakeups.empty():  # coalesce a burst of changes into one read
                reason = self._wakeups.get_nowait()
                if reason == "stop":
                    return
                force = force or reason == "force"
                if reason.startswith(_DIRTY):
                    dirty.add(reason[len(_DIRTY) :])
            if force:
                self._image.clear()
            else:
                self._image.forget(dirty)
            with self._changed:
                self._reads_started += 1
                read = self._reads_started
            try:
                snapshot = self._read()
                failed = False
            except StoreError as exc:
                log.warning("cluster metadata re-read failed (retrying): %s", exc)
                self._image.clear()  # which reads set their watches is unknown: all again
                failed = True
                pending_force = force  # the retry still owes the listener a view
                continue
            pending_force = False
            self._publish(snapshot, force=force, read=read)

    def _read(self) -> ClusterMetadata:
        """The whole view from the image, reading (in one pipelined round per level,
        ``store_batch``) only what it lacks: new topics and partitions, and the znodes
        whose watches fired since they were read."""
        store = self._store
        image = self._image
        previous = self._snapshot
        topics: dict[str, TopicMetadata] = {}
        # Read before the states: a broker registering after this read has epoch greater
        # than any state read below, and its leaderships are caught on the next re-read
        # (its registration is a child change of /brokers/ids: a watch fires).
        roots = store.read_roots()
        brokers, broker_epochs, names = roots.registrations, roots.epochs, roots.topics
        image.keep_topics(set(names))
        wanted_topics = [n for n in names if n not in image.assignments]
        wanted_configs = [n for n in names if n not in image.configs]
        if wanted_topics or wanted_configs:
            found = store.get_many(
                [topic_path(n) for n in wanted_topics]
                + [topic_config_path(n) for n in wanted_configs],
                self._on_znode,
            )
            for name in wanted_topics:
                got = found[topic_path(name)]
                if got is not None:
                    image.assignments[name] = decode_topic(name, got[0])
            for name in wanted_configs:
                got = found[topic_config_path(name)]
                if got is not None:  # a config znode comes with its topic (one transaction)
                    image.configs[name] = decode_topic_config(name, got[0])
        wanted_states = [
            (name, partition)
            for name in names
            if name in image.assignments
            for partition in image.assignments[name].replicas
            if (name, partition) not in image.states
        ]
        if wanted_states:
            read = store.read_partition_states(wanted_states, self._on_znode)
            for key, state_read in read.items():
                if state_read is not None:
                    image.states[key] = state_read
        for name in names:
            assignment = image.assignments.get(name)
            if assignment is None:
                continue
            states: dict[int, PartitionState | None] = {}
            old = previous.topics.get(name)
            same_topic = old is not None and old.assignment.topic_id == assignment.topic_id
            for partition in assignment.replicas:
                found_state = image.states.get((name, partition))
                state = None if found_state is None else found_state[0]
                if found_state is not None and leadership_predates_leader(
                    found_state[0], found_state[2], broker_epochs
                ):
                    # Granted to the leader's previous life: no leader until the
                    # controller elects again (broker.cluster.election).
                    state = replace(found_state[0], leader=NO_LEADER)
                old_state = old.states.get(partition) if old is not None and same_topic else None
                if (
                    state is not None
                    and old_state is not None
                    and (state.leader_epoch, state.partition_epoch)
                    < (old_state.leader_epoch, old_state.partition_epoch)
                ):
                    state = old_state  # a stale read: never move leadership or ISR backwards
                states[partition] = state
            topics[name] = TopicMetadata(assignment, states, image.configs.get(name, {}))
        self._built = ClusterRead(
            {n: image.assignments[n] for n in names if n in image.assignments},
            {n: image.configs.get(n, {}) for n in names if n in image.assignments},
            {k: v for k, v in image.states.items() if k[0] in topics},
        )
        return ClusterMetadata(brokers, roots.controller_id, topics)

    def _publish(self, snapshot: ClusterMetadata, *, force: bool = False, read: int = 0) -> None:
        if snapshot == self._snapshot and not force:
            with self._changed:
                self._reads = self._built  # versions may move with the content unchanged
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
            self._reads = self._built
            self._read_published = max(self._read_published, read)
            self._changed.notify_all()
