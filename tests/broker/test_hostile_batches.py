"""Batches a producer may send that readers must survive, end to end (issue 11).

The broker does not decode records on the produce path, so a hostile LZ4 batch whose
frame expands ~255x is stored; every reader then refuses it with ``CorruptRecordError``
instead of allocating what it claims. So is a gzip, snappy or zstd bomb, and a batch that
only claims a codec: stored, refused by readers, and the broker keeps serving.
"""

from __future__ import annotations

import pytest

from tests.broker.conftest import create_topic, make_batch, produce
from tests.storage.conftest import lz4_batch, with_codec
from tidelog.broker.testing import InProcessBroker
from tidelog.client import Consumer, TopicPartition
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.records import MAX_DECOMPRESSED_BYTES, BatchBuilder, Compression


def test_a_consumer_refuses_an_lz4_bomb_and_the_broker_keeps_serving(
    broker: InProcessBroker,
) -> None:
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "bomb")
        assert (
            produce(stub, "bomb", 0, lz4_batch(bytes(MAX_DECOMPRESSED_BYTES + 1))).error_code == ""
        )
        assert produce(stub, "bomb", 0, make_batch([b"after"])).error_code == ""
    with Consumer(broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("bomb", 0)])
        with pytest.raises(CorruptRecordError, match="over the limit of"):
            _poll_until_something(consumer)
        consumer.seek(TopicPartition("bomb", 0), 1)  # skip it, as a user would
        records = consumer.poll(timeout_ms=5_000)
        assert [r.value for r in records] == [b"after"]


def _poll_until_something(consumer: Consumer) -> None:
    for _ in range(20):
        if consumer.poll(timeout_ms=500):
            return


@pytest.mark.parametrize(
    "codec", [Compression.GZIP, Compression.SNAPPY, Compression.ZSTD], ids=lambda c: c.name.lower()
)
def test_a_consumer_refuses_a_bomb_or_a_false_codec_and_the_broker_keeps_serving(
    broker: InProcessBroker, codec: Compression
) -> None:
    # Once refused at produce (the log could not read them); now stored as sent, and a
    # hostile one is the reader's to refuse, as an LZ4 bomb is.
    topic = f"codec-{codec.name.lower()}"
    tp = TopicPartition(topic, 0)
    bomb = BatchBuilder(compression=codec)
    bomb.append(0, None, bytes(MAX_DECOMPRESSED_BYTES))  # zeros: a few hundred KiB at most
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, topic, **{"max.message.bytes": str(4 << 20)})
        assert produce(stub, topic, 0, bomb.build()).base_offset == 0
        assert produce(stub, topic, 0, with_codec(make_batch([b"a"]), codec)).base_offset == 1
        good = BatchBuilder(compression=codec)
        good.append(0, b"k", b"fine")
        assert produce(stub, topic, 0, good.build()).base_offset == 2
    with Consumer(broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        with pytest.raises(CorruptRecordError, match="limit"):
            _poll_until_something(consumer)
        consumer.seek(tp, 1)
        with pytest.raises(CorruptRecordError, match=f"bad {codec.name.lower()} data"):
            _poll_until_something(consumer)
        consumer.seek(tp, 2)
        records = consumer.poll(timeout_ms=5_000)
        assert [(r.key, r.value) for r in records] == [(b"k", b"fine")]
