"""Offsets committed inside a transaction (TxnOffsetCommit, issue #28), pending until the
transaction ends.

Kafka's rule (``reference/transactions.md`` 5): a transactional producer's offsets are
written to the group's ``__consumer_offsets`` partition as transactional records of that
producer (``OffsetStore.commit_transactional``), and held here as *pending*, per producer
id, invisible to OffsetFetch. The COMMIT marker the transaction coordinator writes to that
partition makes them the group's committed offsets (in the order they were written, later
ones winning); an ABORT marker drops them. A reload replays the log the same way
(``broker.core.internal_topic.replay``): offsets of a transaction still undecided at the log
end come back pending. OffsetFetch with ``require_stable`` (KIP-447) answers
``UNSTABLE_OFFSET_COMMIT`` for a partition with a pending offset, so a consumer resuming
from it waits for the decision instead of reading a stale position.

Not thread-safe: ``OffsetStore`` calls it under its cache lock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.offset_records import OffsetValue

__all__ = ["PendingOffsets"]

# group -> partition -> value
Offsets = dict[str, dict[TopicPartition, OffsetValue]]


class PendingOffsets:
    """Producer id -> the offsets its ongoing transaction committed, by group."""

    def __init__(self) -> None:
        self._by_producer: dict[int, Offsets] = {}

    def add(
        self, producer_id: int, group_id: str, offsets: Mapping[TopicPartition, OffsetValue]
    ) -> None:
        self._by_producer.setdefault(producer_id, {}).setdefault(group_id, {}).update(offsets)

    def end(self, producer_id: int, in_partition: Callable[[str], bool], commit: bool) -> Offsets:
        """The transaction of ``producer_id`` ended on the partition whose groups
        ``in_partition`` names: its offsets there leave the pending set; returned (to be
        committed) if ``commit``, else dropped (empty)."""
        held = self._by_producer.get(producer_id)
        if held is None:
            return {}
        ended = {group: offsets for group, offsets in held.items() if in_partition(group)}
        for group in ended:
            del held[group]
        if not held:
            del self._by_producer[producer_id]
        return ended if commit else {}

    def partitions_of(self, group_id: str) -> set[TopicPartition]:
        """The partitions of ``group_id`` with an offset pending in some transaction."""
        return {tp for held in self._by_producer.values() for tp in held.get(group_id, {})}

    def merge(self, other: PendingOffsets) -> None:
        """Take in what ``other`` holds (a reloaded partition's pending offsets)."""
        for producer_id, held in other._by_producer.items():
            for group_id, offsets in held.items():
                self.add(producer_id, group_id, offsets)

    def forget(self, in_partition: Callable[[str], bool]) -> None:
        """Drop everything held for the groups ``in_partition`` names (an unload, or a
        reload about to replace them)."""
        for producer_id in list(self._by_producer):
            held = self._by_producer[producer_id]
            for group in [g for g in held if in_partition(g)]:
                del held[group]
            if not held:
                del self._by_producer[producer_id]
