"""Tidelog's own transactional producer (``Producer(transactional_id=...)``, issue #28)
against a real single node, over the gRPC listener, read back by confluent-kafka's
read_committed and read_uncommitted consumers on the Kafka listener of the same broker:
commit, abort, commit after abort across partitions; a consumer group's offsets committed
only with the transaction; zombie fencing; an abandoned transaction aborted at its
timeout; the admin calls and the command line that show transactions."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import redirect_stdout

import pytest

from tests.broker.cluster.waiting import eventually
from tests.kafka.conftest import KafkaBroker, kafka_broker, unique
from tests.kafka.test_transactions import quick_aborts, read_all
from tidelog import (
    AdminClient,
    Consumer,
    ConsumerGroupMetadata,
    InvalidTxnStateError,
    Producer,
    ProducerFencedError,
    TopicPartition,
    TransactionAbortedError,
)
from tidelog.client.cli import main
from tidelog.storage.errors import (
    InvalidProducerEpochError,
    StaleMemberEpochError,
    TransactionAbortableError,
    TransactionalIdNotFoundError,
)

pytestmark = pytest.mark.timeout(180)

# The brokers of tests/kafka: the shared one, and one that aborts timed-out transactions soon.
__all__ = ["kafka_broker", "quick_aborts"]

TIMEOUT_MS = 30_000


@pytest.fixture
def topic(kafka_broker: KafkaBroker) -> str:
    """A fresh three-partition topic (read back by ``read_all``)."""
    name = unique("ttx")
    with AdminClient(kafka_broker.address) as admin:
        admin.create_topic(name, 3)
    return name


@pytest.fixture
def producer(kafka_broker: KafkaBroker) -> Iterator[Producer]:
    with Producer(kafka_broker.address, transactional_id=unique("app")) as made:
        made.init_transactions(TIMEOUT_MS)
        yield made


def send_all(producer: Producer, topic: str, prefix: str, count: int) -> None:
    for i in range(count):
        producer.send(topic, f"{prefix}-{i}".encode(), partition=i % 3)


def test_commit_abort_and_commit_again_across_partitions(
    kafka_broker: KafkaBroker, topic: str, producer: Producer
) -> None:
    producer.begin_transaction()
    send_all(producer, topic, "committed", 9)
    producer.commit_transaction(TIMEOUT_MS)
    producer.begin_transaction()
    send_all(producer, topic, "aborted", 6)
    producer.flush(TIMEOUT_MS)  # in the log, then aborted
    producer.abort_transaction(TIMEOUT_MS)
    producer.begin_transaction()
    send_all(producer, topic, "after", 3)
    producer.commit_transaction(TIMEOUT_MS)

    committed = read_all(kafka_broker, topic, "read_committed", 12)
    expected = {f"committed-{i}" for i in range(9)} | {f"after-{i}" for i in range(3)}
    assert sorted(v.decode() for v in committed) == sorted(expected)
    everything = read_all(kafka_broker, topic, "read_uncommitted", 18)
    assert {v.decode() for v in everything} == expected | {f"aborted-{i}" for i in range(6)}


def test_records_not_sent_yet_fail_when_the_transaction_aborts(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    """Records still lingering when the transaction aborts are never sent (Kafka's
    ``TransactionAbortedException``); the next transaction works as usual."""
    with Producer(kafka_broker.address, transactional_id=unique("linger"), linger_ms=60_000) as p:
        p.init_transactions(TIMEOUT_MS)
        p.begin_transaction()
        lingering = p.send(topic, b"never-sent", partition=0)
        p.abort_transaction(TIMEOUT_MS)
        with pytest.raises(TransactionAbortedError):
            lingering.result(timeout=TIMEOUT_MS / 1000)
        p.begin_transaction()
        stored = p.send(topic, b"kept", partition=1)
        p.commit_transaction(TIMEOUT_MS)
        assert stored.result(timeout=TIMEOUT_MS / 1000).offset == 0
    assert read_all(kafka_broker, topic, "read_uncommitted", 1) == [b"kept"]


def test_calls_out_of_order_are_refused(kafka_broker: KafkaBroker, topic: str) -> None:
    with Producer(kafka_broker.address, transactional_id=unique("order")) as p:
        with pytest.raises(InvalidTxnStateError):
            p.begin_transaction()  # before init_transactions
        p.init_transactions(TIMEOUT_MS)
        with pytest.raises(InvalidTxnStateError):
            p.send(topic, b"outside")  # outside a transaction
        with pytest.raises(InvalidTxnStateError):
            p.commit_transaction(TIMEOUT_MS)
        p.begin_transaction()
        with pytest.raises(InvalidTxnStateError):
            p.begin_transaction()
        p.commit_transaction(TIMEOUT_MS)  # an empty transaction commits
    with Producer(kafka_broker.address) as plain, pytest.raises(InvalidTxnStateError):
        plain.init_transactions(TIMEOUT_MS)


def test_a_second_instance_fences_the_first(kafka_broker: KafkaBroker, topic: str) -> None:
    tid = unique("zombie")
    with Producer(kafka_broker.address, transactional_id=tid) as old:
        old.init_transactions(TIMEOUT_MS)
        old.begin_transaction()
        send_all(old, topic, "zombie", 3)
        old.flush(TIMEOUT_MS)
        with Producer(kafka_broker.address, transactional_id=tid) as new:
            new.init_transactions(TIMEOUT_MS)  # aborts the old one's open transaction
            with pytest.raises(ProducerFencedError):
                old.commit_transaction(TIMEOUT_MS)
            with pytest.raises(ProducerFencedError):
                old.send(topic, b"after-fenced")  # fatal: every later call fails
            new.begin_transaction()
            send_all(new, topic, "new", 3)
            new.commit_transaction(TIMEOUT_MS)
    assert sorted(read_all(kafka_broker, topic, "read_committed", 3)) == [
        b"new-0",
        b"new-1",
        b"new-2",
    ]


def test_a_zombies_late_writes_are_refused(kafka_broker: KafkaBroker, topic: str) -> None:
    """A zombie that goes on writing after the new instance initialised: a batch to a
    partition already in its (now aborted) transaction is refused by the partition
    (``INVALID_PRODUCER_EPOCH``: abortable, as Kafka's client since 2.7), one to a new
    partition by the coordinator (fatal); either way the abort learns it was fenced, and
    nothing of it is stored after the fence."""
    tid = unique("late-zombie")
    with Producer(kafka_broker.address, transactional_id=tid) as old:
        old.init_transactions(TIMEOUT_MS)
        old.begin_transaction()
        old.send(topic, b"early", partition=0).result(timeout=TIMEOUT_MS / 1000)
        with Producer(kafka_broker.address, transactional_id=tid) as new:
            new.init_transactions(TIMEOUT_MS)
            late = old.send(topic, b"late", partition=0)
            assert isinstance(late.exception(timeout=TIMEOUT_MS / 1000), InvalidProducerEpochError)
            with pytest.raises(TransactionAbortableError) as failed:
                old.commit_transaction(TIMEOUT_MS)  # abortable: the transaction failed
            assert isinstance(failed.value.__cause__, InvalidProducerEpochError)
            with pytest.raises(ProducerFencedError):
                old.abort_transaction(TIMEOUT_MS)
            with pytest.raises(ProducerFencedError):
                old.begin_transaction()  # fatal from now on
            new.begin_transaction()
            new.send(topic, b"fresh", partition=0)
            new.commit_transaction(TIMEOUT_MS)
    with Producer(kafka_broker.address, transactional_id=tid) as old:
        old.init_transactions(TIMEOUT_MS)
        old.begin_transaction()
        with Producer(kafka_broker.address, transactional_id=tid) as new:
            new.init_transactions(TIMEOUT_MS)
            elsewhere = old.send(topic, b"elsewhere", partition=2)  # AddPartitionsToTxn first
            with pytest.raises(ProducerFencedError):
                old.commit_transaction(TIMEOUT_MS)
            assert isinstance(
                elsewhere.exception(timeout=TIMEOUT_MS / 1000), TransactionAbortedError
            )
    assert sorted(read_all(kafka_broker, topic, "read_uncommitted", 2)) == [b"early", b"fresh"]


def test_offsets_are_committed_only_with_the_transaction(
    kafka_broker: KafkaBroker, topic: str, producer: Producer
) -> None:
    """Consume-transform-produce: the group's committed offset moves only when the
    transaction commits; an aborted one leaves it where it was."""
    source = unique("source")
    group = unique("copier")
    with AdminClient(kafka_broker.address) as admin:
        admin.create_topic(source, 1)
    with Producer(kafka_broker.address) as seed:
        for i in range(4):
            seed.send(source, f"in-{i}".encode(), partition=0)
        seed.flush(TIMEOUT_MS)
    tp = TopicPartition(source, 0)
    with Consumer(
        kafka_broker.address, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
    ) as consumer:
        consumer.subscribe([source])
        records = []
        while len(records) < 4:
            records += consumer.poll(timeout_ms=1_000)
        metadata = consumer.group_metadata()
        assert metadata.group_id == group
        assert metadata.member_id
        assert metadata.generation_id > 0

        producer.begin_transaction()
        send_all(producer, topic, "copied-aborted", 2)
        producer.send_offsets_to_transaction({tp: 2}, metadata, TIMEOUT_MS)
        producer.abort_transaction(TIMEOUT_MS)  # returns once its markers are written
        assert consumer.committed(tp) is None

        producer.begin_transaction()
        send_all(producer, topic, "copied", 4)
        producer.send_offsets_to_transaction({tp: 4}, metadata, TIMEOUT_MS)
        assert consumer.committed(tp) is None  # pending until the commit
        producer.commit_transaction(TIMEOUT_MS)
        # Answered once the decision is durable; the COMMIT marker that makes the
        # offsets visible follows (Kafka's too: its consumers ask with require_stable).
        eventually(lambda: consumer.committed(tp) == 4)

        # A zombie's group metadata (an epoch the member no longer has) is refused, and
        # the transaction can only be aborted.
        stale = ConsumerGroupMetadata(group, metadata.generation_id + 7, metadata.member_id)
        producer.begin_transaction()
        with pytest.raises(StaleMemberEpochError):
            producer.send_offsets_to_transaction({tp: 4}, stale, TIMEOUT_MS)
        with pytest.raises(TransactionAbortableError):
            producer.commit_transaction(TIMEOUT_MS)
        producer.abort_transaction(TIMEOUT_MS)
    assert sorted(read_all(kafka_broker, topic, "read_committed", 4)) == [
        f"copied-{i}".encode() for i in range(4)
    ]


def test_an_abandoned_transaction_is_aborted_at_its_timeout(quick_aborts: KafkaBroker) -> None:
    """A producer that stops mid-transaction holds the last stable offset back only
    until its transaction_timeout_ms: the coordinator aborts it under a bumped epoch, the
    records after it become readable, and the abandoned producer is fenced."""
    name = unique("abandoned")
    with AdminClient(quick_aborts.address) as admin:
        admin.create_topic(name, 3)
    abandoned = Producer(
        quick_aborts.address, transactional_id=unique("dies"), transaction_timeout_ms=1_000
    )
    try:
        abandoned.init_transactions(TIMEOUT_MS)
        abandoned.begin_transaction()
        abandoned.send(name, b"never-committed", partition=0)
        abandoned.flush(TIMEOUT_MS)
        with Producer(quick_aborts.address, transactional_id=unique("lives")) as survivor:
            survivor.init_transactions(TIMEOUT_MS)
            survivor.begin_transaction()
            survivor.send(name, b"committed-after", partition=0)
            survivor.commit_transaction(TIMEOUT_MS)
        # Readable only once the abandoned transaction before it is aborted (about 1 s).
        assert read_all(quick_aborts, name, "read_committed", 1) == [b"committed-after"]
        with pytest.raises(ProducerFencedError):
            abandoned.commit_transaction(TIMEOUT_MS)
    finally:
        abandoned.close()


def test_admin_and_command_line_show_transactions(
    kafka_broker: KafkaBroker, topic: str, producer: Producer
) -> None:
    tid = producer.config.transactional_id
    assert tid is not None
    producer.begin_transaction()
    producer.send(topic, b"open", partition=1)
    producer.flush(TIMEOUT_MS)
    try:
        with AdminClient(kafka_broker.address) as admin:
            (described,) = admin.describe_transactions([tid]).values()
            assert described.state == "Ongoing"
            assert described.partitions == (TopicPartition(topic, 1),)
            assert described.transaction_timeout_ms == 60_000
            assert described.transaction_start_time_ms > 0
            ongoing = {t.transactional_id: t for t in admin.list_transactions(["Ongoing"])}
            assert ongoing[tid].producer_id == described.producer_id
            assert tid not in {t.transactional_id for t in admin.list_transactions(["Empty"])}
            with pytest.raises(ValueError, match="unknown transaction states"):
                admin.list_transactions(["Sleeping"])
            with pytest.raises(TransactionalIdNotFoundError):
                admin.describe_transactions([unique("nobody")])
        listed = _run_cli(kafka_broker, "transactions", "list", "--state", "Ongoing")
        header, *rows = listed.splitlines()
        assert header.split() == [
            "TransactionalId",
            "Coordinator",
            "ProducerId",
            "TransactionState",
        ]
        assert [tid, "0", str(described.producer_id), "Ongoing"] in [r.split() for r in rows]
        shown = _run_cli(kafka_broker, "transactions", "describe", tid)
        header, row = shown.splitlines()
        assert header.split()[-1] == "TopicPartitions"
        cells = row.split()
        assert cells[1:5] == [
            tid,
            str(described.producer_id),
            str(described.producer_epoch),
            "Ongoing",
        ]
        assert cells[-1] == f"{topic}-1"
    finally:
        producer.abort_transaction(TIMEOUT_MS)


def _run_cli(kafka_broker: KafkaBroker, *argv: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        status = main(["--bootstrap", kafka_broker.address, *argv])
    assert status == 0, out.getvalue()
    return out.getvalue()
