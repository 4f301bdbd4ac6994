"""What a ``ShareConsumer`` reads from and writes into share fetch messages: the records
of an answer inside its acquired ranges, and pending acknowledgements as ranges.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import itemgetter
from typing import Any

from tidelog.client.types import ConsumerRecord, TopicPartition
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.records import decode_batch_as, iter_batch_headers

__all__ = [
    "RETURN",
    "Pending",
    "ack_messages",
    "acquired_records",
    "returns_of",
    "topic_partitions",
    "with_returns",
]

Pending = dict[TopicPartition, dict[int, int]]  # partition -> offset -> kind
# Tidelog's own acknowledgement kind: a record fetched ahead given back unseen, its
# delivery not counted (``broker.share.partition``).
RETURN = 100


def topic_partitions(tps: list[TopicPartition]) -> list[pb.TopicPartitions]:
    """``tps`` as a request's per-topic partition lists."""
    by_topic: dict[str, list[int]] = {}
    for tp in tps:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return [pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]


def returns_of(records: list[tuple[ConsumerRecord, int]]) -> Pending:
    """RETURNs of records fetched ahead and never handed out."""
    out: Pending = {}
    for record, _count in records:
        out.setdefault(TopicPartition(record.topic, record.partition), {})[record.offset] = RETURN
    return out


def with_returns(pending: Pending, returns: Pending | None) -> Pending:
    """``pending`` with ``returns`` added (their offsets never overlap: a record fetched
    ahead was never handed out, so never acknowledged); ``pending`` itself unchanged."""
    if not returns:
        return pending
    out = {tp: dict(offsets) for tp, offsets in pending.items()}
    for tp, offsets in returns.items():
        out.setdefault(tp, {}).update(offsets)
    return out


_OFFSET = itemgetter(2)  # a ConsumerRecord's offset (topic, partition, offset, ...)


def acquired_records(part: Any) -> list[tuple[ConsumerRecord, int]]:
    """The records of ``part`` (a ``ShareFetchPartition``) inside its acquired ranges,
    with their delivery counts. The broker sends whole stored batches, which may hold
    many times the records acquired (a producer's batch of 2,000 records shared by four
    members taking 500 each): a batch outside every range is not decoded, and the
    records of each range are cut out of a decoded batch by two binary searches on the
    offsets (ascending in a batch), so the records of the batch that are not this
    member's cost no Python work."""
    topic, partition = part.topic, part.partition
    ranges = sorted((r.first_offset, r.last_offset, r.delivery_count) for r in part.acquired)
    if not ranges:
        return []
    out: list[tuple[ConsumerRecord, int]] = []
    data = part.records
    i = 0
    for position, header in iter_batch_headers(data):
        if header.is_control or header.records_count == 0:
            continue
        last_offset = header.base_offset + header.last_offset_delta
        while i < len(ranges) and ranges[i][1] < header.base_offset:
            i += 1
        if i == len(ranges):
            break
        if ranges[i][0] > last_offset:
            continue  # no acquired offset in this batch
        _, decoded = decode_batch_as(data, position, ConsumerRecord, (topic, partition))
        while i < len(ranges) and ranges[i][0] <= last_offset:
            first, last, count = ranges[i]
            low = bisect_left(decoded, first, key=_OFFSET)
            high = bisect_right(decoded, last, key=_OFFSET)
            out.extend([(record, count) for record in decoded[low:high]])
            if last > last_offset:
                break  # the range goes on in the next batch
            i += 1
    return out


def ack_messages(acks: Pending) -> list[pb.ShareAcknowledgement]:
    """Pending acknowledgements as ranges of consecutive offsets of one kind."""
    out: list[pb.ShareAcknowledgement] = []
    for tp, offsets in acks.items():
        first = last = kind = -1
        for offset in sorted(offsets):
            if offset == last + 1 and offsets[offset] == kind:
                last = offset
                continue
            if first >= 0:
                out.append(_ack(tp, first, last, kind))
            first = last = offset
            kind = offsets[offset]
        if first >= 0:
            out.append(_ack(tp, first, last, kind))
    return out


def _ack(tp: TopicPartition, first: int, last: int, kind: int) -> pb.ShareAcknowledgement:
    return pb.ShareAcknowledgement(
        topic=tp.topic, partition=tp.partition, first_offset=first, last_offset=last, kind=kind
    )
