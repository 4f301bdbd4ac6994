"""What a ``ShareConsumer`` reads from and writes into share fetch messages: the records
of an answer inside its acquired ranges, and pending acknowledgements as ranges.
"""

from __future__ import annotations

from typing import Any

from tidelog.client.types import ConsumerRecord, TopicPartition
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.records import decode_batch_as, iter_batch_headers

__all__ = ["Pending", "ack_messages", "acquired_records"]

Pending = dict[TopicPartition, dict[int, int]]  # partition -> offset -> kind


def acquired_records(part: Any) -> list[tuple[ConsumerRecord, int]]:
    """The records of ``part`` (a ``ShareFetchPartition``) inside its acquired ranges,
    with their delivery counts (the broker sends whole stored batches): a batch outside
    every range is not decoded, a batch inside one range is taken whole, and otherwise
    records are matched to ranges by one walk over both (both ascending), not a lookup
    an offset."""
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
        first, last, count = ranges[i]
        if first <= header.base_offset and last_offset <= last:
            out.extend([(record, count) for record in decoded])  # the whole batch
            continue
        for record in decoded:
            offset = record.offset
            while i < len(ranges) and ranges[i][1] < offset:
                i += 1
            if i == len(ranges):
                break
            first, _, count = ranges[i]
            if offset >= first:
                out.append((record, count))
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
