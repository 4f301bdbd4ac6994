"""Writing transaction markers to the partitions this broker leads (the leader's side of
Kafka's WriteTxnMarkers), for the coordinator's ``MarkerWriter`` seam.

For each partition: the marker is appended as the leader (``Partition.
append_marker_as_leader``: role and leader epoch checked, epoch stamped), fsynced, and in
cluster mode waited for until the in-sync replicas hold it (the high watermark passed
it), as an ``acks=all`` write; then the partition's readers are woken (``on_append``: a
read_committed fetch parked at the last stable offset may move on). A marker is
idempotent for the coordinator: a second COMMIT of a transaction the partition already
closed changes nothing but one more control record.

Per partition the answer is ``""`` (written, or the topic is gone: Kafka's coordinator
drops a deleted partition from the pending set too) or the error's Kafka name, which the
coordinator retries or gives up on (``broker.transactions.coordinator``).

Thread-safe (the partitions are).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.storage.errors import TidelogError, UnknownTopicOrPartitionError

__all__ = ["LocalMarkers"]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_REPLICATION_WAIT_MS = 30_000


class LocalMarkers:
    """Writes markers to this broker's own partitions (a single node leads them all)."""

    def __init__(
        self,
        registry: PartitionRegistry,
        on_append: Callable[[str, int], None],
        on_marker: Callable[[str, int, int, bool], None] | None = None,
    ) -> None:
        self._registry = registry
        self._on_append = on_append
        # (topic, partition, producer id, commit) once a marker is durable: the group
        # coordinator makes the transaction's pending offsets committed (or drops them).
        self._on_marker = on_marker

    def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Collection[TopicPartition],
    ) -> dict[TopicPartition, str]:
        out: dict[TopicPartition, str] = {}
        for topic, index in sorted(partitions):
            try:
                partition = self._registry.get(topic, index)
            except UnknownTopicOrPartitionError:
                out[(topic, index)] = ""  # deleted since: nothing left to mark
                continue
            try:
                offset = partition.append_marker_as_leader(
                    producer_id, producer_epoch, commit, coordinator_epoch
                )
                partition.log.flush(offset + 1)
                if partition.replicated:
                    self._on_append(topic, index)  # wakes the followers' fetches
                    partition.wait_replicated(offset + 1, _REPLICATION_WAIT_MS)
            except TidelogError as exc:
                log.info(
                    "%s-%d: %s marker of producer %d refused: %s",
                    topic,
                    index,
                    "COMMIT" if commit else "ABORT",
                    producer_id,
                    exc,
                )
                out[(topic, index)] = exc.code
                continue
            if self._on_marker is not None:
                self._on_marker(topic, index, producer_id, commit)
            self._on_append(topic, index)
            out[(topic, index)] = ""
        return out
