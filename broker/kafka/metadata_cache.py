"""Metadata's topic entries, encoded once and served as bytes (issue #34, step 3).

A Metadata answer for every topic was about 90 us per partition on this machine: a kio
entity built per partition (``broker.kafka.codec.build``) and serialised, on the
listener's event loop, for every request, although the entries change only when a
topic's placement does. ``TopicEntries`` keeps each topic's encoded entry and serves it
again while everything the bytes depend on is unchanged; the answer is then the cached
pieces joined (``codec.EncodedItems``, spliced into the frame by ``encode_response``).

What an entry's bytes depend on, all of it in the cache key, so a stale entry cannot be
served (decided: content, not a version number, is the key; a version would have to be
threaded from the ZooKeeper image through the listener-neutral core, and every way to
forget bumping it would serve stale leaders):

- the request's **api version** (fields appear by version; ``LISTENER_NOT_FOUND`` needs
  v6+);
- the **topic as the core answered it** (``MetadataTopic``: name, error, internal flag and
  every partition's leader, epoch, replicas and ISR), compared by value on every request
  (a tuple comparison per partition: about a microsecond, not ninety);
- the **live brokers' Kafka endpoints** (``KafkaBrokers``: a partition's error, leader and
  offline replicas follow from them);
- the caller's **topic authorized operations** bits (KIP-430): computed per request and
  per topic by ``handlers.metadata`` from the caller's ACLs, as before; only the encoding
  of an identical value is shared. Authorization itself (which topics a listing shows,
  ``TOPIC_AUTHORIZATION_FAILED``) is applied per request before the cache is asked.

Entries are keyed by (topic name, api version, operations bits) with the rest compared on
lookup: a changed topic replaces its entry. A deleted topic's entries stay until the
cache holds ``MAX_ENTRIES``, when it is emptied (the next answer encodes everything
once). ``enabled=False`` encodes every entry afresh (the reference the byte-equality
test compares against, ``tests/kafka/test_metadata_cache.py``). Loop's thread only, like
the listener's other per-connection state.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from tidelog.broker.core.topic_ids import topic_id
from tidelog.broker.core.topics import MetadataTopic
from tidelog.broker.kafka.cluster import KafkaBrokers, partition_entry
from tidelog.broker.kafka.codec import EncodedItems, Plain, encode_item
from tidelog.broker.kafka.errors import kafka_code

__all__ = ["MAX_ENTRIES", "TopicEntries", "topic_entry"]

MAX_ENTRIES = 50_000
_METADATA = 3

_NO_ID = uuid.UUID(int=0)  # a topic answered with an error has no id


def topic_entry(
    topic: MetadataTopic, brokers: KafkaBrokers, api_version: int, operations: int
) -> Plain:
    """One topic of a Metadata answer as plain values (its partitions by
    ``cluster.partition_entry``; ``operations``: the caller's authorized operations bits,
    or ``authz.UNKNOWN_OPERATIONS``)."""
    return {
        "error_code": kafka_code(topic.error_code),
        "name": topic.name,
        "topic_id": _NO_ID if topic.error_code else topic_id(topic.name),
        "is_internal": topic.internal,
        "partitions": [
            partition_entry(index, p, brokers, api_version)
            for index, p in enumerate(topic.partitions)
        ],
        "topic_authorized_operations": operations,
    }


class TopicEntries:
    """Encoded Metadata topic entries (module docstring)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        # (name, api version, operations) -> ((brokers, topic), the entry's bytes)
        self._entries: dict[tuple[str, int, int], tuple[tuple[object, MetadataTopic], bytes]] = {}
        self.hits = 0  # read by tests and the bench
        self.misses = 0

    def answer(
        self,
        topics: Sequence[MetadataTopic],
        operations: Sequence[int],
        brokers: KafkaBrokers,
        api_version: int,
    ) -> EncodedItems | list[Plain]:
        """The ``topics`` field of a Metadata answer of ``api_version``: topic ``i`` with
        authorized operations ``operations[i]``. Disabled: the plain entries."""
        if not self.enabled:
            return [
                topic_entry(t, brokers, api_version, ops)
                for t, ops in zip(topics, operations, strict=True)
            ]
        view = tuple(sorted(brokers.items()))
        entries = self._entries
        if len(entries) > MAX_ENTRIES:
            entries.clear()
        out = []
        for topic, ops in zip(topics, operations, strict=True):
            key = (topic.name, api_version, ops)
            found = entries.get(key)
            if found is not None and found[0][1] == topic and found[0][0] == view:
                self.hits += 1
                out.append(found[1])
                continue
            self.misses += 1
            encoded = encode_item(
                _METADATA, api_version, "topics", topic_entry(topic, brokers, api_version, ops)
            )
            entries[key] = ((view, topic), encoded)
            out.append(encoded)
        return EncodedItems(tuple(out))
