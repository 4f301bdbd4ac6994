"""The controller's elections written to ZooKeeper as one batch (issue #34, step 2).

A broker failure changes the state of every partition it led or followed: a third of a
three-broker cluster's partitions, 3,333 state znodes at 10,000 partitions. Written one
synchronous fenced transaction at a time, that is 3,333 round trips before the last
partition has a leader again; Kafka's ZooKeeper-era controller instead sends one
``MultiRequest`` (check ``/controller_epoch``, ``setData`` at the version read) per
partition, pipelined (``KafkaZkClient.updateLeaderAndIsr``), and waits for the answers
together. ``write_elections`` does the same through ``BatchOps.set_partition_states``:
every decision of one reconciliation, preferred election or controlled shutdown goes out
at once. Each partition is still its own transaction: one that another writer changed
meanwhile (``StaleStateError``) fails alone and is decided again from a fresh read, and
a deposed controller writes none of them (``ControllerMovedError``, raised after every
answer is in).

Logging is per partition, as Kafka's state-change log: an unclean election, a last-known
leader and an offline partition are warnings, a new leader is info, each logged once
written; more than ten written at once are summed up (``summed_log``: a failover at
10,000 partitions writes 10,000 states).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tidelog.broker.cluster.election import (
    Elected,
    crashed_replicas,
    leadership_predates_leader,
    reconcile,
)
from tidelog.broker.cluster.store import (
    ClusterStore,
    ControllerLease,
    LiveBrokers,
    StaleStateError,
    StateRead,
)
from tidelog.broker.cluster.summed_log import SummedLog
from tidelog.broker.cluster.znodes import NO_LEADER

if TYPE_CHECKING:
    from tidelog.broker.cluster.metadata import ClusterMetadata

__all__ = ["Decision", "ViewWait", "decide_reconcile", "wait_until_seen", "write_elections"]

log = logging.getLogger("tidelog.broker.cluster.controller")

# One election to write: topic, partition, what was elected, the state znode's version read.
Decision = tuple[str, int, Elected, int]
# ``MetadataWatcher.wait_for``: block until a check holds of the broker's view, or a
# timeout in ms passes; whether it held.
ViewWait = Callable[[Callable[["ClusterMetadata"], bool], int], bool]
_SEEN_SLICE_MS = 100  # ``wait_until_seen`` calls ``between`` this often


def decide_reconcile(
    topic: str,
    partition: int,
    replicas: tuple[int, ...],
    brokers: LiveBrokers,
    found: StateRead,
    *,
    min_isr: int,
    unclean_allowed: bool,
    controller_epoch: int,
) -> Elected | None:
    """The controller's reconcile decision for one partition (``election.reconcile``,
    None: nothing to write), with a restarted leader (``leadership_predates_leader``)
    and uncleanly restarted replicas (``crashed_replicas``) found and logged."""
    state = found.state
    bounced = leadership_predates_leader(state, found.written_zxid, brokers.epochs)
    if bounced:
        # The leader restarted since this was written: elect again, as for an
        # offline partition (it is live and may be chosen), at a new epoch.
        log.info(
            "%s-%d: leader %d registered again since epoch %d was granted",
            topic,
            partition,
            state.leader,
            state.leader_epoch,
        )
    crashed = crashed_replicas(
        replicas, state, found.written_zxid, brokers.epochs, brokers.uncleanly_restarted
    )
    if crashed:
        log.warning(
            "%s-%d: broker(s) %s restarted after an unclean shutdown (they may have "
            "lost unsynced records): out of the ISR and the ELR",
            topic,
            partition,
            sorted(crashed),
        )
    return reconcile(
        replicas,
        state,
        set(brokers.epochs),
        crashed=crashed,
        leader_bounced=bounced,
        min_isr=min_isr,
        unclean_allowed=unclean_allowed,
        controller_epoch=controller_epoch,
        brokers_zxid=brokers.brokers_zxid,
    )


def wait_until_seen(
    view_wait: ViewWait,
    decisions: Sequence[Decision],
    outcome: dict[tuple[str, int], Exception | None],
    timeout_ms: int,
    between: Callable[[], None] | None = None,
) -> bool:
    """Block until this broker's metadata view holds the leader epoch of every decision
    written (``outcome`` None; a topic deleted meanwhile counts as seen), up to
    ``timeout_ms``, calling ``between`` every ``_SEEN_SLICE_MS``; whether it did.

    The controller's reconcile writes a failover's elections, waits here, then its ISR
    shrinks: every broker learns the states by watching them (``broker.cluster.
    metadata``), one watch and one read each, so the shrinks written at once compete
    with the elections for the brokers' watchers (and this broker's CPU), while every
    partition waiting for its election has no leader. Its own view is the proxy for
    the others' (the same watch-and-read path, on the same machine's ZooKeeper).
    """
    wanted = [
        (t, p, e.state.leader_epoch)
        for t, p, e, _ in decisions
        if (t, p) in outcome and outcome[(t, p)] is None
    ]

    def seen(view: ClusterMetadata) -> bool:
        for topic, partition, epoch in wanted:
            found = view.topics.get(topic)
            state = None if found is None else found.states.get(partition)
            if found is not None and (state is None or state.leader_epoch < epoch):
                return False
        return True

    for _ in range(max(1, timeout_ms // _SEEN_SLICE_MS)):
        if view_wait(seen, _SEEN_SLICE_MS):
            return True
        if between is not None:
            between()
    log.info("%d new leader(s) not yet seen here after %d ms: going on", len(wanted), timeout_ms)
    return False


def write_elections(
    store: ClusterStore,
    lease: ControllerLease,
    decisions: Sequence[Decision],
    *,
    chunk: int = 0,
    between: Callable[[], None] | None = None,
) -> dict[tuple[str, int], Exception | None]:
    """Write every decision (pipelined fenced transactions); per partition None
    (written) or the ``StaleStateError`` / ``StoreError`` it got.

    ``chunk`` > 0: in rounds of that many, calling ``between`` after each round but the
    last (the controller serves its urgent calls there, ``controller_events``); a
    decision a ``between`` made stale fails its compare-and-set alone.

    Raises ``ControllerMovedError`` if the lease is no longer current.
    """
    if not decisions:
        return {}
    for topic, partition, elected, _ in decisions:
        _warn_before(topic, partition, elected)
    size = chunk if chunk > 0 else len(decisions)
    outcome: dict[tuple[str, int], Exception | None] = {}
    for start in range(0, len(decisions), size):
        if start and between is not None:
            between()
        outcome.update(
            store.set_partition_states(
                lease,
                [(t, p, e.state, version) for t, p, e, version in decisions[start : start + size]],
            )
        )
    written = SummedLog(log)
    for topic, partition, elected, _ in decisions:
        failure = outcome.get((topic, partition))
        if failure is None:
            line = _written(topic, partition, elected)
            if line is not None:
                written.add("partition states written", line)
        elif isinstance(failure, StaleStateError):
            log.info("%s-%d: changed meanwhile, decided again: %s", topic, partition, failure)
        else:
            log.warning("%s-%d: election not written: %s", topic, partition, failure)
    written.flush()
    return outcome


def _warn_before(topic: str, partition: int, elected: Elected) -> None:
    if elected.unclean:
        log.warning(
            "%s-%d: UNCLEAN election of broker %d: records acknowledged only by the old "
            "in-sync replicas may be lost",
            topic,
            partition,
            elected.state.leader,
        )
    if elected.last_known_leader:
        log.warning(
            "%s-%d: no in-sync or eligible replica left (all restarted uncleanly): "
            "electing the last known leader %d, which may have lost records too",
            topic,
            partition,
            elected.state.leader,
        )


def _written(topic: str, partition: int, elected: Elected) -> str | None:
    """The info line of a state written (None: an offline partition, warned here)."""
    state = elected.state
    if state.leader == NO_LEADER:
        log.warning(
            "%s-%d is offline (epoch %d): no live in-sync or eligible replica; isr %s "
            "elr %s last known elr %s",
            topic,
            partition,
            state.leader_epoch,
            list(state.isr),
            list(state.elr),
            list(state.last_known_elr),
        )
        return None
    elr = (
        f" elr {list(state.elr)} last known elr {list(state.last_known_elr)}"
        if state.elr or state.last_known_elr
        else ""
    )
    return (
        f"{topic}-{partition}: leader {state.leader} epoch {state.leader_epoch} "
        f"isr {list(state.isr)}{elr}"
    )
