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

from tidelog.broker.cluster.election import Elected
from tidelog.broker.cluster.store import ClusterStore, ControllerLease, StaleStateError
from tidelog.broker.cluster.summed_log import SummedLog
from tidelog.broker.cluster.znodes import NO_LEADER

__all__ = ["Decision", "write_elections"]

log = logging.getLogger("tidelog.broker.cluster.controller")

# One election to write: topic, partition, what was elected, the state znode's version read.
Decision = tuple[str, int, Elected, int]


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
