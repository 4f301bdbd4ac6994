"""One producer's records stay in send order within a partition, even when it starts cold.

Issue 11: a producer that did not know a topic's partition count yet parked the records
sent meanwhile; a ``send`` that looked the count up just before it arrived parked its
record after the parked ones had been placed, so that record waited for the next metadata
refresh and was stored behind records sent after it. The window is a few microseconds
wide; about one cold run in three hit it with 20,000 keyed records, so this test makes
several cold runs (each on a new topic, with a new producer) per acks setting.
"""

from __future__ import annotations

import pytest

from tests.client.conftest import TopicFactory
from tidelog.broker.testing import InProcessBroker
from tidelog.client import Consumer, Producer, TopicPartition

RUNS = 6
RECORDS = 20_000
KEYS = 50


@pytest.mark.slow
@pytest.mark.parametrize("acks", [1, "all"])
def test_a_cold_producer_keeps_send_order_per_partition(
    broker: InProcessBroker, new_topic: TopicFactory, acks: int | str
) -> None:
    for _ in range(RUNS):
        topic = new_topic(partitions=3)
        with Producer(broker.address, acks=acks) as producer:
            futures = [
                producer.send(topic, key=b"k%d" % (i % KEYS), value=b"v%d" % i)
                for i in range(RECORDS)
            ]
            producer.flush(timeout_ms=60_000)
        offsets: dict[int, list[int]] = {}
        for future in futures:
            metadata = future.result(timeout=0)
            offsets.setdefault(metadata.partition, []).append(metadata.offset)
        for partition, in_send_order in offsets.items():
            assert in_send_order == sorted(in_send_order), f"partition {partition} reordered"
        # What a reader sees: every key's values in the order they were sent.
        with Consumer(broker.address, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition(topic, p) for p in range(3)])
            seen: dict[bytes, list[int]] = {}
            read = 0
            while read < RECORDS:
                records = consumer.poll(timeout_ms=5_000)
                assert records, f"only {read} of {RECORDS} records came back"
                for record in records:
                    assert record.key is not None
                    assert record.value is not None
                    seen.setdefault(record.key, []).append(int(record.value[1:]))
                read += len(records)
        for key, values in seen.items():
            assert values == sorted(values), f"key {key!r} out of order"
