"""Review of KeyedProducer: fencing between units of work, and a broker that is down."""

from __future__ import annotations

import socket
import time

import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, BrokerUnavailableError, TopicPartition
from tidelog.client.keyed_producer import KeyedProducer, ProducerRecord
from tidelog.storage.errors import InvalidProducerEpochError, OutOfOrderSequenceError


def test_a_straggler_of_an_earlier_epoch_is_fenced() -> None:
    """Once micro-batch 4 wrote a partition, a straggling attempt of batch 3 can neither
    resume (DescribeProducers shows the newer epoch) nor send a batch."""
    with InProcessBroker() as broker, AdminClient(broker.address) as admin:
        admin.create_topic("out", 1)
        tp = TopicPartition("out", 0)
        rows = {tp: [ProducerRecord(None, b"%d" % i) for i in range(6)]}
        with KeyedProducer(broker.address, "task", max_batch_records=2) as straggler:
            assert straggler.write_once({tp: rows[tp][:2]}, epoch=3).written == 2
            with KeyedProducer(broker.address, "task") as newer:
                assert newer.write_once(rows, epoch=4).written == 6
            with pytest.raises(OutOfOrderSequenceError, match="fenced"):
                straggler.write_once(rows, epoch=3)
            # The batch it would send next (sequence 2 of epoch 3) is refused too.
            with pytest.raises(InvalidProducerEpochError):
                straggler._send_plans(rows, {tp: [(2, 4)]}, 3)
        assert admin.describe_topic("out").partitions[0].high_watermark == 8


def test_every_call_gives_up_within_the_request_timeout() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    with KeyedProducer(address, "down", request_timeout_ms=1_000) as producer:
        began = time.monotonic()
        with pytest.raises(BrokerUnavailableError):
            producer.write_once({TopicPartition("t", 0): [ProducerRecord(None, b"x")]}, 0)
        assert time.monotonic() - began < 3


def test_a_rerun_with_fewer_records_than_stored_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A non-deterministic input can not be repaired, but it used to pass in silence."""
    with InProcessBroker() as broker, AdminClient(broker.address) as admin:
        admin.create_topic("out", 1)
        tp = TopicPartition("out", 0)
        rows = [ProducerRecord(None, b"%d" % i) for i in range(5)]
        with KeyedProducer(broker.address, "task") as producer:
            assert producer.write_once({tp: rows}, epoch=0).written == 5
            with caplog.at_level("WARNING", logger="tidelog.client.keyed_producer"):
                summary = producer.write_once({tp: rows[:3]}, epoch=0)
        assert (summary.written, summary.skipped) == (0, 3)
        assert "input differs" in caplog.text
