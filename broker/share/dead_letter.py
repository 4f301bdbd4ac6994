"""A share group's dead-letter topic (issue #32 step 5; Tidelog's own, Kafka 4.1 has none):
records archived because a consumer REJECTed them or they reached
``share.delivery.count.limit`` are copied to the topic the group names in
``errors.deadletterqueue.topic.name``, and **the copy and the archiving commit atomically**.

The name is KIP-1191's (Kafka's accepted design for share-group dead-letter queues,
not in 4.1). What Tidelog follows of it: the group config's name, and REJECT and the
delivery limit as the two causes. What it does not: KIP-1191's broker prefix rule
(``errors.deadletterqueue.topic.name.prefix``, ``dlq.``) and the topic's opt-in
(``errors.deadletterqueue.group.enable``) are not enforced; its ``__dlq.errors.*``
headers are not written: the header names are DESIGN.md's contract (below).

**How a record is dead-lettered** (``SharePartitionManager.dead_letter_pass``, run by the
share timer):

1. The REJECT (or the delivery that reached the limit) is written first, as a plain
   state write, in Tidelog's own persisted state *to be dead-lettered*
   (``records.DEAD_LETTER_REJECTED`` / ``DEAD_LETTER_LIMIT``, with the reason): the
   acknowledgement is answered then, and from then on the record is neither deliverable
   nor done (SPSO stays below it) until its transaction commits.
2. One Tidelog transaction per pass and share partition takes up to
   ``MAX_RECORDS_PER_TRANSACTION`` such records: its transactional id is the share
   partition's own (``transactional_id``), so InitProducerId fences and aborts whatever
   an earlier leader or attempt left open; the dead-letter partition and the share
   partition's ``__share_group_state`` partition join it; the copies are appended to the
   dead-letter topic as transactional batches, and the archiving of the same records as a
   transactional write to ``__share_group_state`` (``ShareStateLog.write``: pending at
   the share coordinator until the COMMIT marker, dropped on ABORT, reloaded
   read_committed); EndTxn commits.
3. Once EndTxn answered (the commit is decided: the coordinator finishes the markers
   whatever happens to this broker), the archiving is applied in memory and
   ``dead_lettered`` counts them.

An abort, a failure anywhere, or a crash before EndTxn leaves the records to be
dead-lettered, so the next pass (or the next leader) copies them again, in a new
transaction; the aborted copies are invisible to read_committed consumers of the
dead-letter topic. So each record ends dead-lettered **exactly once for read_committed
readers** (a read_uncommitted reader of the dead-letter topic may see an aborted copy
too, as with any Kafka transaction). While a transaction's archiving is pending at the
share coordinator, a leader loading the share partition is answered
``COORDINATOR_LOAD_IN_PROGRESS`` (and fences the transaction's id, so an open one is
aborted at once rather than at its timeout).

**The copy**: the original key, value, timestamp and headers, then the headers
``tidelog.dlq.group``, ``tidelog.dlq.topic``, ``tidelog.dlq.partition``,
``tidelog.dlq.offset``, ``tidelog.dlq.reason`` (``rejected`` | ``delivery-limit``) and
``tidelog.dlq.delivery.count`` (numbers as decimal text). It goes to the dead-letter
partition ``source partition % partitions`` (the topic's partitions are few: it is
created with one), so one share partition's copies keep their order.

**A missing dead-letter topic is created**, as Kafka Connect's dead-letter queue does
(``errors.deadletterqueue.topic.name`` there too): one partition, the broker's default
replication factor, no special configs. A record gone from the log (retention,
DeleteRecords) before its copy was written is archived with no copy: there is nothing
to copy.

**Failures do not stall the share partition.** A pass that fails (the dead-letter topic
cannot be created or written, the transaction coordinator is not available...) leaves
its records to be dead-lettered and retries after a backoff (``Backoff``: 200 ms
doubling to 30 s). After ``LOUD_AFTER_FAILURES`` failures in a row every further one is
logged at ERROR, naming the group, the partition, the offsets and the cause; the other
records of the partition are delivered meanwhile. The records waiting hold SPSO, and
count against ``share.partition.max.record.locks``, until they are copied: never lost.

Pure apart from ``read_originals`` (reads the log). Thread-safe: values and functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tidelog.broker.share.records import DEAD_LETTER_REJECTED
from tidelog.storage.batch_builder import BatchBuilder
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import Record, decode_batch, iter_batch_headers

__all__ = [
    "HEADER_DELIVERY_COUNT",
    "HEADER_GROUP",
    "HEADER_OFFSET",
    "HEADER_PARTITION",
    "HEADER_REASON",
    "HEADER_TOPIC",
    "LOUD_AFTER_FAILURES",
    "MAX_RECORDS_PER_TRANSACTION",
    "Backoff",
    "DeadLetter",
    "DeadLetterBatch",
    "DeadLetterSink",
    "copy_batches",
    "dead_letter_headers",
    "read_originals",
    "reason_of",
    "transactional_id",
]

HEADER_GROUP = "tidelog.dlq.group"
HEADER_TOPIC = "tidelog.dlq.topic"
HEADER_PARTITION = "tidelog.dlq.partition"
HEADER_OFFSET = "tidelog.dlq.offset"
HEADER_REASON = "tidelog.dlq.reason"
HEADER_DELIVERY_COUNT = "tidelog.dlq.delivery.count"
REJECTED = "rejected"
DELIVERY_LIMIT = "delivery-limit"

MAX_RECORDS_PER_TRANSACTION = 500
LOUD_AFTER_FAILURES = 5
_FIRST_BACKOFF_MS = 200
_MAX_BACKOFF_MS = 30_000
_READ_BYTES = 1 << 20
# Copies are cut into batches of about this size (as the internal topics' writes are),
# so many copies never make one batch past the topic's max.message.bytes.
_BATCH_TARGET_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record to copy: its source offset, why, its delivery count, and the record
    (None: gone from the log, archived with no copy)."""

    offset: int
    reason: str
    delivery_count: int
    record: Record | None


@dataclass(frozen=True, slots=True)
class DeadLetterBatch:
    """One pass's transaction for one share partition."""

    group_id: str
    topic: str
    partition: int
    dead_letter_topic: str
    letters: tuple[DeadLetter, ...]
    state_partition: int  # the share partition's __share_group_state partition

    @property
    def transactional_id(self) -> str:
        return transactional_id(self.group_id, self.topic, self.partition)


class DeadLetterSink(Protocol):
    """Runs a dead-letter transaction (``broker.core.share_dlq`` over the broker's own
    transaction coordinator and produce path)."""

    def write(self, batch: DeadLetterBatch, archive: Callable[[tuple[int, int]], None]) -> None:
        """One transaction: the copies of ``batch.letters`` (those with a record) to the
        dead-letter topic, ``archive`` (producer id, epoch) writing the archiving, then
        the commit. Returns once the commit is decided; raises (having aborted what it
        could) otherwise: nothing of it is then visible to read_committed readers, or
        will be."""
        ...

    def fence(self, transactional_id: str) -> None:
        """Fence ``transactional_id`` (InitProducerId), so an open transaction of it is
        aborted now. Never raises."""
        ...


def transactional_id(group_id: str, topic: str, partition: int) -> str:
    """The transactional id of one share partition's dead-letter transactions."""
    return f"__tidelog.dlq:{group_id}:{topic}:{partition}"


def reason_of(state: int) -> str:
    """``rejected`` or ``delivery-limit`` for a to-be-dead-lettered state."""
    return REJECTED if state == DEAD_LETTER_REJECTED else DELIVERY_LIMIT


def dead_letter_headers(
    group_id: str, topic: str, partition: int, letter: DeadLetter
) -> list[tuple[str, bytes | None]]:
    """The headers Tidelog adds to a copy (after the original's)."""
    return [
        (HEADER_GROUP, group_id.encode()),
        (HEADER_TOPIC, topic.encode()),
        (HEADER_PARTITION, str(partition).encode()),
        (HEADER_OFFSET, str(letter.offset).encode()),
        (HEADER_REASON, letter.reason.encode()),
        (HEADER_DELIVERY_COUNT, str(letter.delivery_count).encode()),
    ]


def copy_batches(
    batch: DeadLetterBatch, producer_id: int, producer_epoch: int, base_sequence: int
) -> bytes:
    """Concatenated transactional RecordBatches of ``batch``'s copies (those with a
    record), each about ``_BATCH_TARGET_BYTES`` at most, sequences consecutive from
    ``base_sequence``; empty bytes when no letter has a record. The copies keep the
    originals' timestamps."""
    out: list[bytes] = []
    sequence = base_sequence

    def builder() -> BatchBuilder:
        return BatchBuilder(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=sequence,
            is_transactional=True,
        )

    current = builder()
    for letter in batch.letters:
        record = letter.record
        if record is None:
            continue
        if current.record_count and current.estimated_size_bytes() >= _BATCH_TARGET_BYTES:
            out.append(current.build())
            sequence += current.record_count
            current = builder()
        headers = [
            *record.headers,
            *dead_letter_headers(batch.group_id, batch.topic, batch.partition, letter),
        ]
        current.append(record.timestamp_ms, record.key, record.value, headers)
    if current.record_count:
        out.append(current.build())
    return b"".join(out)


def read_originals(partition_log: PartitionLog, offsets: Sequence[int]) -> dict[int, Record]:
    """The records at ``offsets`` still in ``partition_log`` (gone ones are absent)."""
    wanted = set(offsets)
    found: dict[int, Record] = {}
    position = max(min(wanted), partition_log.log_start_offset) if wanted else 0
    last = max(wanted) if wanted else -1
    while wanted and position <= last:
        data = partition_log.read(position, _READ_BYTES).records
        if not data:
            break
        moved = position
        for at, header in iter_batch_headers(data):
            moved = max(moved, header.next_offset)
            if header.is_control or header.next_offset <= position:
                continue
            try:
                _, records = decode_batch(data, at)
            except CorruptRecordError:
                continue  # unreadable: as gone (its CRC passed on append; only a bug)
            for record in records:
                if record.offset in wanted:
                    found[record.offset] = record
                    wanted.discard(record.offset)
        if moved <= position:
            break
        position = moved
    return found


@dataclass(slots=True)
class Backoff:
    """One share partition's dead-letter retries (module docstring). Not thread-safe:
    used under the share partition's lock."""

    failures: int = 0
    next_ms: int = 0

    def due(self, now_ms: int) -> bool:
        return now_ms >= self.next_ms

    def failed(self, now_ms: int) -> int:
        """Count a failure; returns the failures in a row."""
        self.failures += 1
        delay = min(_FIRST_BACKOFF_MS << min(self.failures - 1, 16), _MAX_BACKOFF_MS)
        self.next_ms = now_ms + delay
        return self.failures

    def succeeded(self) -> None:
        self.failures = 0
        self.next_ms = 0
