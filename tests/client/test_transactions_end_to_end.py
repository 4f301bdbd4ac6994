"""Exactly-once consume-transform-produce with nothing but Tidelog's client (issue #28):
a group member reads an input topic read_committed, a transactional producer writes the
transformed records and the member's positions in one transaction, every third
transaction is aborted and its input read again. The output read read_committed holds
every input once, in input order per partition; read_uncommitted shows the aborted copies
too; the group's committed offsets are the input's end. Against a real single node, over
the gRPC listener only."""

from __future__ import annotations

import threading
import time

import pytest

from tests.kafka.conftest import KafkaBroker, kafka_broker, unique, wait_until_decided
from tidelog import AdminClient, Consumer, Producer, TopicPartition
from tidelog.storage.errors import UnstableOffsetCommitError

pytestmark = pytest.mark.timeout(180)

__all__ = ["kafka_broker"]

TIMEOUT_MS = 30_000
INPUTS = 60


def read_everything(address: str, topic: str, isolation: str) -> dict[int, list[bytes]]:
    """Every record handed out of ``topic``'s two partitions from offset 0 up to the
    read_committed or read_uncommitted end, per partition."""
    with Consumer(address, isolation_level=isolation) as consumer:
        tps = [TopicPartition(topic, p) for p in range(2)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: dict[int, list[bytes]] = {0: [], 1: []}
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{topic} not read to {ends} in 30 s"
            for record in consumer.poll(500):
                assert record.value is not None
                out[record.partition].append(record.value)
        return out


def test_consume_transform_produce_with_aborts_holds_every_input_once(
    kafka_broker: KafkaBroker,
) -> None:
    address = kafka_broker.address
    source, sink, group = unique("eos-in"), unique("eos-out"), unique("eos-group")
    with AdminClient(address) as admin:
        admin.create_topic(source, 2)
        admin.create_topic(sink, 2)
    with Producer(address) as plain:
        for i in range(INPUTS):
            plain.send(source, b"%03d" % i, partition=i % 2)
        plain.flush(TIMEOUT_MS)

    transactions = aborted = 0
    with (
        Consumer(
            address,
            group_id=group,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        ) as consumer,
        Producer(address, transactional_id=unique("eos-app")) as producer,
    ):
        producer.init_transactions(TIMEOUT_MS)
        consumer.subscribe([source])
        done = 0
        deadline = time.monotonic() + 90
        while done < INPUTS:
            assert time.monotonic() < deadline, f"{done} of {INPUTS} inputs done in 90 s"
            records = consumer.poll(500, max_records=7)
            if not records:
                continue
            producer.begin_transaction()
            for record in records:
                assert record.value is not None
                producer.send(sink, b"out-" + record.value, partition=record.partition)
            positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
            producer.send_offsets_to_transaction(positions, consumer.group_metadata())
            transactions += 1
            if transactions % 3 == 0:
                producer.flush(TIMEOUT_MS)  # the aborted copies are in the log
                producer.abort_transaction(TIMEOUT_MS)
                aborted += 1
                for tp in positions:  # read again from the last committed position
                    committed = consumer.committed(tp, TIMEOUT_MS)
                    consumer.seek(tp, 0 if committed is None else committed)
                continue
            producer.commit_transaction(TIMEOUT_MS)
            done += len(records)
        assert aborted >= 2

    for p in range(2):
        wait_until_decided(address, TopicPartition(sink, p))
    committed_view = read_everything(address, sink, "read_committed")
    for p in range(2):
        expected = [b"out-%03d" % i for i in range(p, INPUTS, 2)]
        assert committed_view[p] == expected
    uncommitted_view = read_everything(address, sink, "read_uncommitted")
    copies = sum(len(values) for values in uncommitted_view.values())
    assert copies > INPUTS  # the aborted transactions' records are in the log
    for p in range(2):
        assert set(uncommitted_view[p]) == set(committed_view[p])

    with Consumer(address, group_id=group) as reader:
        for p in range(2):
            assert reader.committed(TopicPartition(source, p), TIMEOUT_MS) == INPUTS // 2


def test_a_read_committed_consumer_waits_for_an_offset_pending_in_a_transaction(
    kafka_broker: KafkaBroker,
) -> None:
    """KIP-447's require_stable over gRPC: while a transaction holds a group's offset, a
    read_committed member's committed offset is neither the old one nor the new one: it
    waits (UnstableOffsetCommitError at its timeout); read_uncommitted answers the old
    one. Once the transaction commits the read_committed member gets the new one."""
    address = kafka_broker.address
    source, group = unique("stable-in"), unique("stable-group")
    tp = TopicPartition(source, 0)
    with AdminClient(address) as admin:
        admin.create_topic(source, 1)
    with Producer(address, transactional_id=unique("stable-app")) as producer:
        producer.init_transactions(TIMEOUT_MS)
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: 7}, group)
        with (
            Consumer(address, group_id=group, isolation_level="read_committed") as committed,
            Consumer(address, group_id=group) as uncommitted,
        ):
            with pytest.raises(UnstableOffsetCommitError):
                committed.committed(tp, 600)
            assert uncommitted.committed(tp, TIMEOUT_MS) is None
            answers: list[int | None] = []
            waiting = threading.Thread(
                target=lambda: answers.append(committed.committed(tp, TIMEOUT_MS))
            )
            waiting.start()
            time.sleep(0.3)  # let it ask while the offset is still pending
            producer.commit_transaction(TIMEOUT_MS)
            waiting.join(TIMEOUT_MS / 1000)
            assert answers == [7]
