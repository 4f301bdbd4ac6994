"""Words every layer shares, defined once: ``TopicPartition``.

The broker's group coordinator, its listeners and the client library all name partitions
with this one class (the client re-exports it as ``client.TopicPartition``; Kafka's
``org.apache.kafka.common.TopicPartition`` plays the same part). It sits in ``storage``,
the bottom of the dependency graph, beside the other shared vocabulary
(``storage.errors``, the record format); it imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TopicPartition"]


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """One partition of one topic. Frozen, hashable, ordered by (topic, partition)."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"
