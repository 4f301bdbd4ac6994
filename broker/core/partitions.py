"""Every partition this broker hosts, as ``Partition`` objects: Kafka's ``allPartitions``.

The assembly (``broker.assembly``) builds one ``PartitionRegistry`` over the broker's
``LogManager`` before the core (``open_partitions``, with the purgatories it tells), and
hands the same registry to the core (its produce and fetch paths, the offset lookups and
the group offset store) and, in cluster mode, to the replica manager
(``broker.cluster.replicas``), which sets each partition's role from the cluster's views.
Neither needs the other to be built first.

Decisions where Kafka's shape meets this broker's:

* **Created on first use.** The ``LogManager`` creates, grows and deletes logs (topics
  are created and deleted through it, on a single node by the core, in cluster mode from
  each view), so the registry does not mirror its topic table: ``get`` wraps the current
  log of a partition in a ``Partition`` the first time it is asked, and again when the
  log it wrapped is no longer the manager's (the topic was deleted and created again, as
  Kafka's ``Partition`` is recreated with its topic id). A recreated partition starts
  without a role, so the next view makes it leader or follower afresh; the old object,
  still held by a request in flight, keeps answering from its own (closed) log, which
  refuses writes. ``partitions`` lists only partitions whose log is still current.
* **The mode is the registry's.** ``replicated`` False (a single node): every partition
  is an unreplicated leader from creation (``broker.core.partition``), so the produce,
  fetch and offset paths are one code path in both modes. True (cluster mode): a
  partition has no role until the replica manager gives it one; the offsets topic's
  partitions are ordinary replicated partitions.
* **Listeners at construction.** ``listeners`` are told (topic, partition) whenever a
  partition's high watermark, ISR or leadership moves: the purgatories re-check what is
  parked there (``broker.core.delayed.DelayedOperations``). Group loading when this broker
  becomes leader of an offsets partition is the replica manager's call, as in Kafka
  (``ReplicaManager`` calls ``onLeadershipChange`` after ``makeLeaders``): it is given to
  the replica manager's constructor. Unloading when it stops leading one is the group
  manager's own (``GroupManager.unload_resigned`` reads the roles), as the replica
  manager's constructor takes no second callback.
* **ISR changes go through an outbox** (Kafka's ``AlterPartitionManager``): a partition
  that wants its ISR changed puts itself here (``propose_isr``); the replica manager's ISR
  thread takes them (``next_isr_change``) and writes ZooKeeper. A single node never
  proposes one.

Thread-safe: one lock guards creation; ``get`` reads the table without it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tidelog.broker.core.delayed import DelayedOperations
from tidelog.broker.core.partition import Partition
from tidelog.storage.clock import Clock
from tidelog.storage.errors import UnknownTopicOrPartitionError
from tidelog.storage.log_manager import LogManager

if TYPE_CHECKING:  # broker.config imports the group manager, which imports this module
    from tidelog.broker.config import BrokerConfig

__all__ = ["PartitionListener", "PartitionRegistry", "open_partitions"]

# (topic, partition): its high watermark, ISR or leadership moved.
PartitionListener = Callable[[str, int], None]


class PartitionRegistry:
    """This broker's ``Partition`` objects over one ``LogManager``. Thread-safe."""

    def __init__(
        self,
        logs: LogManager,
        broker_id: int,
        clock: Clock,
        *,
        replicated: bool,
        listeners: Sequence[PartitionListener] = (),
    ) -> None:
        self.logs = logs
        self.broker_id = broker_id
        self.replicated = replicated
        self._clock = clock
        self._listeners = tuple(listeners)
        self._lock = threading.Lock()
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._isr_changes: queue.Queue[Partition | None] = queue.Queue()
        # The brokers registered in this broker's cluster view (None: no view, any
        # follower may join an ISR); set by the replica manager with each view.
        self.live_brokers: frozenset[int] | None = None

    def _isr_eligible(self, replica_id: int) -> bool:
        """KIP-841's rule: a follower joins an ISR only while registered. A broker back
        from a lost ZooKeeper session (a long pause) fetches before it registers again;
        taken back into the ISR then, it was dropped again by a controller that had read
        it as dead (``docs/cluster.md``, "Known gaps")."""
        live = self.live_brokers
        return live is None or replica_id in live

    def get(self, topic: str, partition: int) -> Partition:
        """The partition, wrapping its current log (created on first use).

        Raises:
            UnknownTopicOrPartitionError: no such topic or partition here.
        """
        plog = self.logs.get_log(topic, partition)
        found = self._partitions.get((topic, partition))
        if found is not None and found.log is plog:
            return found
        with self._lock:
            found = self._partitions.get((topic, partition))
            if found is None or found.log is not plog:
                found = Partition(
                    plog,
                    self.broker_id,
                    self._clock,
                    replicated=self.replicated,
                    on_progress=self._progress,
                    propose_isr=self._isr_changes.put,
                    checkpoint_log_start=self.logs.checkpoint_log_start_offsets,
                    isr_eligible=self._isr_eligible,
                )
                self._partitions[(topic, partition)] = found
            return found

    def partitions(self) -> list[Partition]:
        """The partitions made so far whose log is still current (a snapshot); those of
        deleted topics are forgotten here."""
        with self._lock:
            current = []
            for key, found in list(self._partitions.items()):
                try:
                    live = self.logs.get_log(*key) is found.log
                except UnknownTopicOrPartitionError:
                    live = False
                if live:
                    current.append(found)
                else:
                    del self._partitions[key]
            return current

    def _progress(self, topic: str, partition: int) -> None:
        for listener in self._listeners:
            listener(topic, partition)

    # --- the ISR outbox (cluster mode) ------------------------------------------------------

    def next_isr_change(self) -> Partition | None:
        """Block until a partition proposes an ISR change (None: ``wake_isr_changes``)."""
        return self._isr_changes.get()

    def next_isr_changes(self) -> list[Partition | None]:
        """Block until a partition proposes an ISR change, then take every proposal queued
        by then too (a None among them: ``wake_isr_changes``): the replica manager writes
        them as one batch (issue #34)."""
        taken = [self._isr_changes.get()]
        while True:
            try:
                taken.append(self._isr_changes.get_nowait())
            except queue.Empty:
                return taken

    def wake_isr_changes(self) -> None:
        """Make a ``next_isr_change`` waiting now return None (stopping)."""
        self._isr_changes.put(None)


def open_partitions(
    config: BrokerConfig, clock: Clock
) -> tuple[PartitionRegistry, DelayedOperations]:
    """Open (recovering) the data directory and build the broker's partitions over it,
    telling the purgatories of every move: what ``BrokerCore.open`` takes, built before it
    (``broker.assembly``). Replicated in cluster mode (``zookeeper.connect``): partitions
    then have no role until the replica manager gives them one.

    Raises:
        StorageError: the data directory is unusable.
    """
    logs = LogManager.open(config.data_dir, config.log_manager_config(), clock)
    delayed = DelayedOperations(clock)
    registry = PartitionRegistry(
        logs,
        config.broker_id,
        clock,
        replicated=config.zookeeper_connect is not None,
        listeners=(delayed.check_and_complete_all,),
    )
    return registry, delayed
