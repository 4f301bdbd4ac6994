"""Kafka's ConsumerProtocol bytes, read as far as describing a classic group needs.

A classic group's broker never interprets its members' metadata or assignments: they are
opaque bytes the leader's assignor chose. For ``protocol_type`` "consumer" they follow
Kafka's ConsumerProtocol, and ``tidelog groups describe`` (like Kafka's
``kafka-consumer-groups``) shows the subscribed topics and assigned partitions read from
them. Both structures are big-endian and never flexible; later versions only append
fields, so reading the v0 fields after the version works for every version::

    ConsumerProtocolSubscription: int16 version, topics: int32 count, then per topic
        int16 length + UTF-8; user_data: int32 length (-1: null) + bytes; (v1+ more)
    ConsumerProtocolAssignment: int16 version, assigned_partitions: int32 count, then
        per topic int16 length + UTF-8 and int32 count + int32 partitions;
        user_data: int32 length (-1: null) + bytes; (v1+ more)

Pure functions on bytes; anything that does not parse reads as empty (a client with its
own protocol under the "consumer" type is shown without topics, never refused).
"""

from __future__ import annotations

import struct

from tidelog.broker.groups.assignor import TopicPartition

__all__ = ["assigned_partitions", "parse_subscribed_topics", "subscribed_topics"]

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class _TruncatedError(Exception):
    pass


class _Reader:
    """A cursor over ``data``; every read past the end raises ``_TruncatedError``."""

    def __init__(self, data: bytes, position: int) -> None:
        self._data = data
        self._position = position

    def _take(self, size: int) -> bytes:
        if size < 0 or self._position + size > len(self._data):
            raise _TruncatedError
        chunk = self._data[self._position : self._position + size]
        self._position += size
        return chunk

    def int16(self) -> int:
        value: int = _INT16.unpack(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _INT32.unpack(self._take(4))[0]
        return value

    def string(self) -> str:
        return self._take(self.int16()).decode()

    def count(self) -> int:
        count = self.int32()
        if count < 0:
            raise _TruncatedError  # a null array where the protocol has none
        return count

    def nullable_bytes(self) -> None:
        size = self.int32()
        if size != -1:
            self._take(size)


def subscribed_topics(metadata: bytes) -> frozenset[str]:
    """The topics of a ConsumerProtocolSubscription; empty if it does not parse."""
    return parse_subscribed_topics(metadata) or frozenset()


def parse_subscribed_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics of a ConsumerProtocolSubscription; None if it does not parse (callers
    that must be safe, as OffsetDelete, read None as "every topic")."""
    try:
        reader = _Reader(metadata, 2)  # after the version
        topics = frozenset(reader.string() for _ in range(reader.count()))
        reader.nullable_bytes()
    except (_TruncatedError, UnicodeDecodeError):
        return None
    return topics


def assigned_partitions(assignment: bytes) -> frozenset[TopicPartition]:
    """The partitions of a ConsumerProtocolAssignment; empty if it does not parse."""
    try:
        reader = _Reader(assignment, 2)  # after the version
        assigned: set[TopicPartition] = set()
        for _ in range(reader.count()):
            topic = reader.string()
            assigned.update(TopicPartition(topic, reader.int32()) for _ in range(reader.count()))
        reader.nullable_bytes()
    except (_TruncatedError, UnicodeDecodeError):
        return frozenset()
    return frozenset(assigned)
