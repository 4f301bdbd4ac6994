"""Leaders' ISR changes written to ZooKeeper in batches (issue #34, step 2).

A broker that comes back after a restart catches up on every partition it follows and
asks each leader to put it back into the ISR: at 10,000 partitions on three brokers each
other broker leads about 1,700 of its partitions, and writing their ISR changes one
synchronous read and one compare-and-set at a time kept the restarted broker out of the
ISRs for seconds after it had caught up. Kafka batches the same changes (the ZooKeeper-era
``isr_change_notification`` sequence znodes, then KIP-497's ``AlterPartition`` with many
partitions per request); here the replica manager hands every proposal queued at once to
``write_isr_batch``, which reads their state znodes in one pipelined round and writes
them in another (``BatchOps.read_partition_states``, ``BatchOps.update_isr_many``).

Per partition the rules are the single write's (``broker.cluster.replicas``): only while
the znode still names this broker leader at the proposal's epoch (a leader the
controller replaced must not write) and holds the ISR the proposal changes (the
controller removes dead followers from the ISR at the same leader epoch,
``broker.cluster.election``: a leader that has not seen that yet must not write them
back), at the version read (compare-and-set), with
KIP-966's ELR following the ISR (``election.with_elr``); a partition whose znode moved on
is not written and proposes again at the next check. The registrations bound in the state
is carried, never advanced: only the controller, which handles unclean restarts, may say
it has seen a registration (a state from before the bound existed gets its last write's
zxid, what it meant then).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from tidelog.broker.cluster.election import with_elr
from tidelog.broker.cluster.replicas import IsrProposal
from tidelog.broker.cluster.store import ClusterStore
from tidelog.broker.cluster.znodes import PartitionState
from tidelog.storage.errors import UnknownTopicOrPartitionError

__all__ = ["write_isr_batch"]


def write_isr_batch(
    store: ClusterStore,
    min_isr_of: Callable[[str, int], int],
    proposals: Sequence[IsrProposal],
) -> dict[tuple[str, int], int]:
    """Write every proposal that still applies; per partition written, the znode version
    written (its new partition epoch; absent: not written).

    ``min_isr_of(topic, partition)`` is the partition's ``min.insync.replicas`` (the ELR
    rules depend on it). Raises ``StoreError`` when the reads fail (nothing written).
    """
    found = store.read_partition_states((t, p) for t, p, *_ in proposals)
    writes: list[tuple[str, int, PartitionState, int]] = []
    for topic, partition, leader, epoch, isr, base in proposals:
        read = found.get((topic, partition))
        if read is None:
            continue
        state, version, written_zxid = read
        if state.leader != leader or state.leader_epoch != epoch or set(state.isr) != set(base):
            continue
        try:
            min_isr = min_isr_of(topic, partition)
        except UnknownTopicOrPartitionError:  # deleted meanwhile: nothing to write
            continue
        after = replace(state, isr=isr, brokers_zxid=state.brokers_zxid or written_zxid)
        writes.append((topic, partition, with_elr(state, after, min_isr), version))
    return {
        key: written
        for key, written in store.update_isr_many(writes).items()
        if isinstance(written, int)
    }
