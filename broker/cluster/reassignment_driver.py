"""The controller's reassignment handling (KIP-455): start, cancel, complete and list.

``ReassignmentDriver`` runs the pure decisions of ``broker.cluster.reassignment``
(``start``, ``cancel``, ``complete``) against the store: it reads a topic's assignment and
its partitions' states, and writes the moved assignment with the partitions' new states
in one fenced transaction (``ClusterStore.write_reassignment``). The state lives in the
topic znodes (``adding``/``removing`` beside the replicas), so a new controller resumes
what the old one started; nothing is kept here between calls.

It owns no thread and no lease: ``broker.cluster.controller.Controller`` calls it on its
event thread with the lease it holds, and keeps what follows from the answers (whether a
reassignment may still be pending, for its ``reassign`` timer; dropping a superseded
lease). A write that meets a concurrent ISR write (``StaleStateError``) is retried from a
fresh read (``alter``) or left for the next step (``progress``); ``ControllerMovedError``
ends a step (``Progress.superseded``).

Thread-safety: not thread-safe; the controller's event thread is its only caller.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tidelog.broker.cluster.reassignment import Move, cancel, complete, invalid_target, start
from tidelog.broker.cluster.store import (
    ClusterStore,
    ControllerLease,
    ControllerMovedError,
    StaleStateError,
)
from tidelog.broker.cluster.znodes import TopicAssignment

__all__ = ["Progress", "ReassignmentDriver", "Reassignments"]

log = logging.getLogger(__name__)

_REASSIGN_ATTEMPTS = 3  # a topic's reassignment write retried after a concurrent ISR write

# (topic, partition) -> (replicas, adding, removing), ListPartitionReassignments' answer.
Reassignments = dict[tuple[str, int], tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


@dataclass(frozen=True, slots=True)
class Progress:
    """What one ``ReassignmentDriver.progress`` step found."""

    # A reassignment is still waiting for its target replicas to join the ISR, or its
    # write met a concurrent one: step again later.
    pending: bool
    # A write found a newer controller: the caller's lease is gone.
    superseded: bool


class ReassignmentDriver:
    """Partition reassignments, read from and written to ``store`` by the controller."""

    def __init__(self, store: ClusterStore) -> None:
        self._store = store

    def alter(
        self, lease: ControllerLease, wanted: Mapping[tuple[str, int], tuple[int, ...] | None]
    ) -> dict[tuple[str, int], str]:
        """Start or (None) cancel the reassignment of each partition of ``wanted``; per
        partition "" or Kafka's error name (``Controller.alter_partition_reassignments``).
        A topic's write that meets a concurrent ISR write is retried from a fresh read,
        ``_REASSIGN_ATTEMPTS`` times, then answered REQUEST_TIMED_OUT."""
        by_topic: dict[str, dict[int, tuple[int, ...] | None]] = {}
        for (topic, partition), target in wanted.items():
            by_topic.setdefault(topic, {})[partition] = target
        out: dict[tuple[str, int], str] = {}
        for topic, targets in by_topic.items():
            for attempt in range(_REASSIGN_ATTEMPTS):
                try:
                    out.update(self._alter_topic(lease, topic, targets))
                    break
                except StaleStateError:
                    if attempt == _REASSIGN_ATTEMPTS - 1:
                        out.update(
                            dict.fromkeys(((topic, p) for p in targets), "REQUEST_TIMED_OUT")
                        )
        return out

    def _alter_topic(
        self,
        lease: ControllerLease,
        topic: str,
        targets: Mapping[int, tuple[int, ...] | None],
    ) -> dict[tuple[str, int], str]:
        found = self._store.read_topic_versioned(topic)
        if found is None:
            return {(topic, p): "UNKNOWN_TOPIC_OR_PARTITION" for p in targets}
        assignment, version = found
        live = set(self._store.live_brokers())
        out: dict[tuple[str, int], str] = {}
        moves: dict[int, tuple[Move, int]] = {}
        for partition, target in targets.items():
            key = (topic, partition)
            read = (
                self._store.read_partition_state(topic, partition)
                if partition in assignment.replicas
                else None
            )
            if read is None:
                out[key] = "UNKNOWN_TOPIC_OR_PARTITION"
                continue
            state, state_version = read
            replicas = assignment.replicas[partition]
            if target is None:
                if not assignment.reassigning(partition):
                    out[key] = "NO_REASSIGNMENT_IN_PROGRESS"
                    continue
                move = cancel(
                    replicas, assignment.adding.get(partition, ()), state, live, lease.epoch
                )
            else:
                reason = invalid_target(target, live)
                if reason is not None:
                    log.info("%s-%d: reassignment refused: %s", topic, partition, reason)
                    out[key] = "INVALID_REPLICA_ASSIGNMENT"
                    continue
                original = assignment.original(partition)
                if tuple(target) == replicas and not assignment.reassigning(partition):
                    out[key] = ""  # already there: nothing to move (Kafka answers success)
                    continue
                move = start(original, replicas, target, state, live, lease.epoch)
            moves[partition] = (move, state_version)
            out[key] = ""
        if moves:
            self._write_moves(lease, assignment, version, moves)
        return out

    def _write_moves(
        self,
        lease: ControllerLease,
        assignment: TopicAssignment,
        version: int,
        moves: Mapping[int, tuple[Move, int]],
    ) -> None:
        adding = dict(assignment.adding)
        removing = dict(assignment.removing)
        replicas = dict(assignment.replicas)
        for partition, (move, _) in moves.items():
            replicas[partition] = move.replicas
            adding.pop(partition, None)
            removing.pop(partition, None)
            if move.adding or move.removing:
                adding[partition] = move.adding
                removing[partition] = move.removing
        changed = replace(assignment, replicas=replicas, adding=adding, removing=removing)
        self._store.write_reassignment(
            lease,
            changed,
            version,
            {p: (move.state, state_version) for p, (move, state_version) in moves.items()},
        )
        for partition, (move, _) in moves.items():
            state = move.state
            if move.adding or move.removing:
                log.info(
                    "%s-%d: reassigning: replicas %s (adding %s, removing %s), leader %d epoch %d",
                    assignment.name,
                    partition,
                    list(move.replicas),
                    list(move.adding),
                    list(move.removing),
                    state.leader,
                    state.leader_epoch,
                )
            else:
                log.info(
                    "%s-%d: reassignment done: replicas %s, leader %d epoch %d isr %s",
                    assignment.name,
                    partition,
                    list(move.replicas),
                    state.leader,
                    state.leader_epoch,
                    list(state.isr),
                )

    def progress(self, lease: ControllerLease) -> Progress:
        """Complete every reassignment whose target replicas are all in the ISR."""
        live = set(self._store.live_brokers())
        pending = False
        try:
            # Every assignment in one pipelined round: a round trip per topic held each
            # brokers event 7 s at 200 topics on a busy ZooKeeper (issue #34).
            for topic, found in self._store.read_topics(self._store.topics()).items():
                if found is None:
                    continue
                assignment, version, _ = found
                moving = [p for p in assignment.replicas if assignment.reassigning(p)]
                if not moving:
                    continue
                moves: dict[int, tuple[Move, int]] = {}
                for partition in moving:
                    read = self._store.read_partition_state(topic, partition)
                    if read is None:
                        continue
                    move = complete(
                        assignment.replicas[partition],
                        assignment.removing.get(partition, ()),
                        read[0],
                        live,
                        lease.epoch,
                    )
                    if move is None:
                        pending = True
                    else:
                        moves[partition] = (move, read[1])
                if moves:
                    try:
                        self._write_moves(lease, assignment, version, moves)
                    except StaleStateError:
                        pending = True  # an ISR write in between: next time
        except ControllerMovedError:
            log.info("controller epoch was superseded during a reassignment step")
            return Progress(pending, superseded=True)
        return Progress(pending, superseded=False)

    def in_progress(self, wanted: Sequence[tuple[str, int]] | None) -> Reassignments:
        """The partitions being reassigned among ``wanted`` (None: all), each with its
        replicas (the union), adding and removing replicas."""
        names = self._store.topics() if wanted is None else sorted({t for t, _ in wanted})
        keys = None if wanted is None else set(wanted)
        out: Reassignments = {}
        for topic in names:
            assignment = self._store.read_topic(topic)
            if assignment is None:
                continue
            for partition, replicas in assignment.replicas.items():
                if keys is not None and (topic, partition) not in keys:
                    continue
                if assignment.reassigning(partition):
                    out[(topic, partition)] = (
                        replicas,
                        assignment.adding.get(partition, ()),
                        assignment.removing.get(partition, ()),
                    )
        return out
