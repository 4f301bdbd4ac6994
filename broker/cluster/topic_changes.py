"""The controller's topic changes: create, grow, configure and delete topics.

``TopicChanges`` places a topic's replicas (Kafka's round robin over the live brokers,
rack-aware, ``broker.cluster.assignment``) or checks a placement given by the caller
(``broker.core.replica_assignment``, Kafka's rules), and writes the assignment, the config
and the partitions' initial states in one fenced transaction of the store: a controller
that lost its lease cannot write (``ControllerMovedError``). A new partition starts with
its replicas as the ISR and the first one leading at epoch 0, as Kafka's (a registered
broker is a live one: registrations are ephemeral). A change of ``min.insync.replicas``
empties the topic's ELRs (KIP-966: they were chosen by the old value) without a new
leader epoch.

It owns no thread and no lease: ``broker.cluster.controller.Controller`` calls it on its
event thread with the lease it holds. ``min_isr`` reads a topic config's
``min.insync.replicas`` with the broker's current default; ``on_stale`` is called when an
ELR write met a concurrent one, so the controller decides again from a fresh read.

Thread-safety: not thread-safe; the controller's event thread is its only caller.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from tidelog.broker.cluster.assignment import assign_replicas
from tidelog.broker.cluster.store import ClusterStore, ControllerLease, StaleStateError
from tidelog.broker.cluster.store_batch import NewTopicWrite
from tidelog.broker.cluster.znodes import PartitionState, TopicAssignment
from tidelog.broker.core.placement import Growth, NewTopic
from tidelog.broker.core.replica_assignment import check_growth_assignment, check_topic_assignment
from tidelog.storage.errors import (
    InvalidPartitionsError,
    TidelogError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

__all__ = ["NewTopic", "TopicChanges"]

log = logging.getLogger(__name__)

_DELETE_TRIES = 3


class TopicChanges:
    """Topic creation, growth, configuration and deletion, written to ``store``."""

    def __init__(
        self,
        store: ClusterStore,
        rng: random.Random,
        *,
        min_isr: Callable[[Mapping[str, str]], int],
        on_stale: Callable[[], None],
    ) -> None:
        self._store = store
        self._rng = rng
        self._min_isr = min_isr
        self._on_stale = on_stale

    def create(
        self,
        lease: ControllerLease,
        name: str,
        partitions: int,
        replication_factor: int,
        config: dict[str, str],
        manual: list[tuple[int, tuple[int, ...]]] | None = None,
    ) -> TopicAssignment:
        """Place (Kafka's round robin over the live brokers, rack-aware) or check
        (``manual``) and create a topic, every replica in the ISR and the first leading.
        Raises ``TopicAlreadyExistsError``, ``InvalidReplicaAssignmentError``."""
        spec = NewTopic(name, partitions, replication_factor, config, manual)
        outcome = self.create_many(lease, [spec])[name]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def create_many(
        self, lease: ControllerLease, specs: Sequence[NewTopic]
    ) -> dict[str, TopicAssignment | Exception]:
        """Create every topic of ``specs`` in one batch (issue #34): one pipelined read
        of which exist, one read of the live brokers, then one fenced transaction per
        topic, all committed together (``store_batch``). Per topic its assignment or
        the error (``TopicAlreadyExistsError``, ``InvalidReplicaAssignmentError``,
        ``InvalidReplicationFactorError``...); a name given twice gets
        ``TopicAlreadyExistsError`` the second time. Raises ``ControllerMovedError``."""
        out: dict[str, TopicAssignment | Exception] = {}
        exists = self._store.read_topics(dict.fromkeys(s.name for s in specs))
        view = self._store.live_brokers_view()
        brokers = sorted(view.epochs)
        count = max(len(brokers), 1)
        racks = {b: r.rack for b, r in view.registrations.items()}
        writes: list[NewTopicWrite] = []
        placed_by_name: dict[str, TopicAssignment] = {}
        for spec in specs:
            if exists.get(spec.name) is not None or spec.name in placed_by_name:
                out[spec.name] = TopicAlreadyExistsError(f"topic {spec.name!r} already exists")
                continue
            placed: Mapping[int, Sequence[int]]
            try:
                if spec.manual:
                    # Registered is live here (registrations are ephemeral), so every
                    # replica starts in the ISR and the first leads, as Kafka's.
                    placed = check_topic_assignment(spec.manual, set(brokers))
                else:
                    placed = assign_replicas(
                        spec.partitions,
                        spec.replication_factor,
                        brokers,
                        start_index=self._rng.randrange(count),
                        replica_shift=self._rng.randrange(count),
                        racks=racks,
                    )
            except TidelogError as exc:
                out[spec.name] = exc
                continue
            assignment = TopicAssignment(
                spec.name, str(uuid.uuid4()), {p: tuple(r) for p, r in placed.items()}
            )
            states = {
                p: PartitionState(r[0], 0, tuple(r), lease.epoch, brokers_zxid=view.brokers_zxid)
                for p, r in placed.items()
            }
            placed_by_name[spec.name] = assignment
            writes.append((assignment, spec.config, states))
        for name, error in self._store.create_topics(lease, writes).items():
            if isinstance(error, StaleStateError):
                out[name] = TopicAlreadyExistsError(f"topic {name!r} already exists")
            elif error is not None:
                out[name] = error
            else:
                out[name] = placed_by_name[name]
                log.info("created topic %s: %s", name, dict(placed_by_name[name].replicas))
        return out

    def delete(self, lease: ControllerLease, name: str) -> None:
        """Delete a topic. Raises ``UnknownTopicOrPartitionError``."""
        outcome = self.delete_many(lease, [name])[name]
        if outcome is not None:
            raise outcome

    def delete_many(
        self, lease: ControllerLease, names: Sequence[str]
    ) -> dict[str, Exception | None]:
        """Delete every topic of ``names`` in one batch: one pipelined read of their
        assignments, one fenced transaction per topic, committed together. Per topic
        None or ``UnknownTopicOrPartitionError``; a topic that changed while being
        deleted (grown, reassigned) is read and deleted again, up to ``_DELETE_TRIES``
        times (then ``StoreError``). Raises ``ControllerMovedError``."""
        out: dict[str, Exception | None] = {}
        pending = list(dict.fromkeys(names))
        for _ in range(_DELETE_TRIES):
            if not pending:
                break
            found = self._store.read_topics(pending)
            assignments = []
            for name in pending:
                got = found.get(name)
                if got is None:
                    out.setdefault(
                        name, UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
                    )
                else:
                    assignments.append(got[0])
            pending = []
            for name, error in self._store.delete_topics(lease, assignments).items():
                out[name] = error
                if isinstance(error, StaleStateError):
                    pending.append(name)
                elif error is None:
                    log.info("deleted topic %s", name)
        return out

    def grow(
        self,
        lease: ControllerLease,
        name: str,
        total: int,
        manual: list[tuple[int, ...]] | None = None,
    ) -> TopicAssignment:
        """Grow a topic to ``total`` partitions, continuing the round robin from the first
        partition's leader, or as ``manual`` gives. Raises ``UnknownTopicOrPartitionError``,
        ``InvalidPartitionsError`` (not a growth, or the topic changed meanwhile)."""
        outcome = self.grow_many(lease, [Growth(name, total, manual)])[name]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def grow_many(
        self, lease: ControllerLease, growths: Sequence[Growth]
    ) -> dict[str, TopicAssignment | Exception]:
        """Grow every topic of ``growths`` in one batch: one pipelined read of their
        assignments, one of the live brokers, one fenced transaction per topic (its new
        assignment at the version read and its new states), committed together. Per
        topic the grown assignment or the error ``grow`` raises."""
        out: dict[str, TopicAssignment | Exception] = {}
        found = self._store.read_topics(dict.fromkeys(g.name for g in growths))
        view = self._store.live_brokers_view()
        brokers = sorted(view.epochs)
        racks = {b: r.rack for b, r in view.registrations.items()}
        writes = []
        grown_by_name: dict[str, TopicAssignment] = {}
        for growth in growths:
            name, total = growth.name, growth.total
            read = found.get(name)
            if read is None:
                out[name] = UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
                continue
            assignment, version = read[0], read[1]
            current = assignment.partition_count
            try:
                if total <= current or name in grown_by_name:
                    raise InvalidPartitionsError(
                        f"topic {name!r} has {current} partitions; it can only grow "
                        f"(asked for {total})"
                    )
                factor = len(assignment.replicas[0])
                placed: Mapping[int, Sequence[int]]
                if growth.manual is not None:
                    placed = check_growth_assignment(
                        growth.manual,
                        set(brokers),
                        current=current,
                        total=total,
                        replication_factor=factor,
                    )
                else:
                    # Kafka continues from the first partition's leader, so growth keeps
                    # the pattern.
                    first = assignment.replicas[0][0]
                    placed = assign_replicas(
                        total - current,
                        factor,
                        brokers,
                        start_index=brokers.index(first) if first in brokers else 0,
                        replica_shift=self._rng.randrange(max(len(brokers), 1)),
                        first_partition=current,
                        racks=racks,
                    )
            except TidelogError as exc:
                out[name] = exc
                continue
            grown = replace(  # keeps the lists of partitions being reassigned
                assignment,
                replicas={**assignment.replicas, **{p: tuple(r) for p, r in placed.items()}},
            )
            states = {
                p: PartitionState(r[0], 0, tuple(r), lease.epoch, brokers_zxid=view.brokers_zxid)
                for p, r in placed.items()
            }
            grown_by_name[name] = grown
            writes.append((grown, version, states))
        for name, error in self._store.add_partitions_many(lease, writes).items():
            if isinstance(error, StaleStateError):
                out[name] = InvalidPartitionsError(f"topic {name!r} changed meanwhile; retry")
            elif error is not None:
                out[name] = error
            else:
                out[name] = grown_by_name[name]
        return out

    def alter_config(self, lease: ControllerLease, name: str, config: dict[str, str]) -> None:
        """Replace a topic's config; a changed ``min.insync.replicas`` clears its ELRs.
        Raises ``UnknownTopicOrPartitionError``."""
        assignment = self._store.read_topic(name)
        if assignment is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        before = self._min_isr(self._store.read_topic_config(name))
        self._store.set_topic_config(lease, name, config)
        if self._min_isr(config) != before:
            self.clear_elr(lease, name, assignment)

    def clear_elr(self, lease: ControllerLease, name: str, assignment: TopicAssignment) -> None:
        """KIP-966: a change of ``min.insync.replicas`` empties every ELR and last known
        ELR of the topic (they were chosen by the old value). No epoch bump: the ISR and
        the leader stay."""
        for partition in assignment.replicas:
            found = self._store.read_partition_state(name, partition)
            if found is None or not (found[0].elr or found[0].last_known_elr):
                continue
            cleared = replace(found[0], elr=(), last_known_elr=(), controller_epoch=lease.epoch)
            try:
                self._store.set_partition_state(lease, name, partition, cleared, found[1])
            except StaleStateError:
                self._on_stale()
                continue
            log.info("%s-%d: min.insync.replicas changed: ELR cleared", name, partition)
