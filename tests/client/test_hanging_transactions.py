"""Hanging transactions found and aborted by an operator (issue #28: ``tidelog transactions
find-hanging|abort``, ``AdminClient.abort_transaction``, Kafka's ``kafka-transactions.sh``).

A transaction hangs when a partition holds it open while no coordinator runs it: here
the broker is SIGKILLed with a transaction open and restarted without its
``__transaction_state`` (the coordinator's state lost), so the partition's recovered
producer state has the transaction open and nobody will ever end it: the last stable
offset is stuck and read_committed readers stall. ``find-hanging`` lists it (and not a
live transaction its coordinator runs), ``abort --start-offset`` writes its ABORT marker,
and the partition moves on: its records are never read committed."""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from confluent_kafka import Producer as KafkaProducer

from tests.kafka.broker_process import BrokerProcess
from tests.kafka.conftest import wait_until_decided
from tidelog import AdminClient, Consumer, TopicPartition
from tidelog.client.cli import main
from tidelog.client.types import AbortTransactionSpec
from tidelog.storage.errors import InvalidProducerEpochError

pytestmark = pytest.mark.timeout(240)

TOPIC = "orders"
TIMEOUT_S = 30.0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    running = BrokerProcess(tmp_path / "data")
    running.start()
    try:
        yield running
    finally:
        running.stop()


def cli(address: str, *argv: str) -> tuple[int, str]:
    """Run ``tidelog`` against ``address``: its status and what it printed (the table on
    stdout, the notes on stderr, together)."""
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        status = main(["--bootstrap", address, *argv])
    return status, out.getvalue()


def transactional(bootstrap: str, transactional_id: str) -> KafkaProducer:
    producer = KafkaProducer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 600_000,  # its coordinator would wait long
        }
    )
    producer.init_transactions(TIMEOUT_S)
    return producer


def open_transaction(producer: KafkaProducer, partition: int, count: int) -> None:
    producer.begin_transaction()
    for i in range(count):
        producer.produce(TOPIC, b"p%d-%d" % (partition, i), partition=partition)
    assert producer.flush(TIMEOUT_S) == 0


def read(address: str, tp: TopicPartition, isolation: str) -> list[bytes]:
    with Consumer(address, isolation_level=isolation) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        values: list[bytes] = []
        while consumer.position(tp) < end:
            values += [r.value or b"" for r in consumer.poll(500)]
        return values


def test_a_hanging_transaction_is_found_and_aborted(broker: BrokerProcess) -> None:
    with AdminClient(broker.address) as admin:
        admin.create_topic(TOPIC, 2)
    lost = transactional(broker.bootstrap, "lost-app")
    open_transaction(lost, 0, 3)
    broker.kill()
    for path in broker.data_dir.glob("__transaction_state-*"):
        shutil.rmtree(path)  # the coordinator's state is gone
    broker.start()
    live = transactional(broker.bootstrap, "live-app")
    open_transaction(live, 1, 2)  # open too, but its coordinator runs it
    hung, running = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
    with AdminClient(broker.address) as admin:
        stuck = admin.list_offsets({hung: "latest"}, isolation_level="read_committed")[hung]
        assert stuck is not None
        assert stuck.offset == 0  # the LSO is held at its start

    status, out = cli(
        broker.address, "transactions", "find-hanging", "--max-transaction-timeout", "0"
    )
    assert status == 0
    rows = [line.split() for line in out.splitlines()[1:] if line.strip()]
    assert [(r[0], r[1], r[5]) for r in rows] == [(TOPIC, "0", "0")], out
    status, out = cli(
        broker.address, "transactions", "find-hanging", "--topic", TOPIC, "--partition", "1",
        "--max-transaction-timeout", "0",
    )  # fmt: skip
    assert status == 0, out
    assert "No hanging transactions" in out, out

    status, out = cli(
        broker.address, "transactions", "abort", "--topic", TOPIC, "--partition", "0",
        "--start-offset", "0",
    )  # fmt: skip
    assert status == 0, out
    assert wait_until_decided(broker.address, hung) == 4  # three records and the marker
    assert read(broker.address, hung, "read_committed") == []
    assert read(broker.address, hung, "read_uncommitted") == [b"p0-0", b"p0-1", b"p0-2"]
    status, out = cli(
        broker.address, "transactions", "find-hanging", "--max-transaction-timeout", "0"
    )
    assert status == 0, out
    assert "No hanging transactions" in out, out

    # An abort of a producer with nothing open there is answered as done, changes nothing.
    with AdminClient(broker.address) as admin:
        admin.abort_transaction(AbortTransactionSpec(running, 4242, 0, 0))

    # The live one is untouched by all this, and commits.
    live.commit_transaction(TIMEOUT_S)
    wait_until_decided(broker.address, running)
    assert read(broker.address, running, "read_committed") == [b"p1-0", b"p1-1"]


def test_abort_refuses_a_stale_producer_epoch_and_bad_arguments(broker: BrokerProcess) -> None:
    with AdminClient(broker.address) as admin:
        admin.create_topic(TOPIC, 1)
        transactional(broker.bootstrap, "app")  # epoch 0, fenced by the next instance
        producer = transactional(broker.bootstrap, "app")
        open_transaction(producer, 0, 1)
        tp = TopicPartition(TOPIC, 0)
        (state,) = admin.describe_producers([tp])[tp]
        assert state.current_txn_start_offset == 0
        assert state.producer_epoch >= 1
        stale = AbortTransactionSpec(
            tp, state.producer_id, state.producer_epoch - 1, state.coordinator_epoch
        )
        with pytest.raises(InvalidProducerEpochError):
            admin.abort_transaction(stale)
        producer.abort_transaction(TIMEOUT_S)
    abort = ("transactions", "abort", "--topic", TOPIC, "--partition", "0")
    status, out = cli(broker.address, *abort)
    assert status != 0, out
    assert "--start-offset" in out, out
    status, out = cli(broker.address, *abort, "--start-offset", "7")
    assert status != 0, out
    assert "no transaction open" in out, out
