"""A controlled shutdown's leadership and ISR moves, as the controller decides them.

``Controller.controlled_shutdown`` (asked by a stopping broker, ``ClusterNode.stop``)
moves leadership and ISR membership off that broker for every partition, in one batch of
writes (``election_writes``), and answers how many partitions it still leads.

The stopping broker waits for its leaderships only, so they are moved first and the
call answered (its partitions clients must leave); the ISRs of the partitions it
follows are shrunk right after, by an urgent call of the controller's own
(``controller_events``) that nobody waits for: at 10,000 partitions on three brokers
the stopping broker is in every ISR, and writing all 10,000 before answering took more
than its 15 s bound on a busy ZooKeeper. Kafka's controller shrinks them in the same
event before answering; here, if the broker is gone first, its session's end shrinks
them (the controller's reconcile), as for any broker that stops.

Decided from the controller's metadata image when it is current, as a failover's first
reconcile: reading every state again took most of the stopping broker's 15 s bound at
10,000 partitions (issue #34). Each write is a compare-and-set at the version decided
from, so an image behind ZooKeeper cannot write a stale state: the partitions whose
write failed are decided again from ZooKeeper, in a second round. A partition created
in the last milliseconds, not in the image yet, is not moved: its leadership moves when
the stopping broker's session ends, as for any broker that stops without a controlled
shutdown.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from tidelog.broker.cluster.election import (
    Elected,
    crashed_replicas,
    elect_for_shutdown,
    with_elr,
)
from tidelog.broker.cluster.election_writes import Decision
from tidelog.broker.cluster.store import ClusterStore, StateRead
from tidelog.broker.cluster.store_batch import ClusterRead
from tidelog.broker.cluster.znodes import PartitionState

__all__ = ["PartitionView", "move_off", "partition_views"]

log = logging.getLogger("tidelog.broker.cluster.controller")


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition as the controller's elections see it (``Controller._partitions``)."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    state: PartitionState
    version: int
    live: set[int]
    min_isr: int

    def with_elr(self, elected: Elected) -> Elected:
        """``elected`` with KIP-966's ELR bookkeeping for its ISR change."""
        return replace(elected, state=with_elr(self.state, elected.state, self.min_isr))


def partition_views(
    store: ClusterStore, cluster: ClusterRead | None, min_isr: Callable[[Mapping[str, str]], int]
) -> Iterator[PartitionView]:
    """Every partition with a state znode (in ``cluster``, else read from ZooKeeper),
    with what its elections need: the live brokers less those that restarted uncleanly
    since the state was last reconciled (``election.crashed_replicas``: the controller's
    reconcile handles them first; until then they are not candidates), and the topic's
    ``min.insync.replicas`` (``min_isr`` of its config)."""
    brokers = store.live_brokers_view()
    if cluster is None:
        cluster = store.read_cluster()
    for (topic, partition), read in cluster.states.items():
        assignment = cluster.assignments.get(topic)
        replicas = None if assignment is None else assignment.replicas.get(partition)
        if replicas is None:
            continue
        found = StateRead(*read)
        crashed = crashed_replicas(
            replicas, found.state, found.written_zxid, brokers.epochs, brokers.uncleanly_restarted
        )
        yield PartitionView(
            topic,
            partition,
            replicas,
            found.state,
            found.version,
            set(brokers.epochs) - crashed,
            min_isr(cluster.configs.get(topic, {})),
        )


def move_off(
    broker_id: int,
    controller_epoch: int,
    image: ClusterRead | None,
    partitions: Callable[[ClusterRead | None], Iterable[PartitionView]],
    write: Callable[[list[Decision]], Mapping[tuple[str, int], Exception | None]],
    *,
    leading: bool,
) -> int:
    """Move ``broker_id`` off the partitions it leads (``leading``) or off the ISRs of
    those it follows (not ``leading``): from ``image`` first if given, then from
    ZooKeeper (``partitions(None)``) for the partitions whose write failed. Logs each
    round and the time; returns how many partitions it still leads (of those considered).
    """
    started = time.monotonic()
    leaders: dict[tuple[str, int], int] = {}
    rounds: list[str] = []
    retry: set[tuple[str, int]] | None = None
    for cluster in (image, None) if image is not None else (None,):
        decisions: list[Decision] = []
        for p in partitions(cluster):
            key = (p.topic, p.partition)
            if (retry is not None and key not in retry) or (p.state.leader == broker_id) != leading:
                continue
            leaders[key] = p.state.leader
            elected = elect_for_shutdown(
                p.replicas, p.state, p.live, {broker_id}, controller_epoch=controller_epoch
            )
            if elected is not None:
                decisions.append((p.topic, p.partition, p.with_elr(elected), p.version))
        outcome = write(decisions)
        for topic, partition, elected, _ in decisions:
            if outcome.get((topic, partition)) is None:
                leaders[(topic, partition)] = elected.state.leader
        retry = {key for key, failure in outcome.items() if failure is not None}
        source = "zookeeper" if cluster is None else "image"
        rounds.append(f"{source}: {len(decisions)} written, {len(retry)} failed")
        if not retry:
            break
    still = sum(1 for leader in leaders.values() if leader == broker_id)
    log.info(
        "controlled shutdown of broker %d: %s %s; it still leads %d (%d ms)",
        broker_id,
        "leaderships" if leading else "followers",
        "; ".join(rounds),
        still,
        (time.monotonic() - started) * 1000,
    )
    return still
