"""Transactions over the Kafka listener with confluent-kafka (librdkafka's transactional
producer, transactions v1) against a single node (issue #28): commit, abort, commit after
abort across partitions; read_committed consumers never see aborted records (nor the
markers); read_uncommitted ones see both kinds of data; a second producer with the same
transactional id fences the first; DescribeTransactions and ListTransactions."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.kafka.conftest import KafkaBroker, unique
from tidelog.broker.testing import InProcessBroker

pytestmark = pytest.mark.timeout(180)

TIMEOUT_S = 30.0


@pytest.fixture
def topic(kafka_broker: KafkaBroker) -> str:
    name = unique("txn")
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=3)])[name].result(timeout=TIMEOUT_S)
    return name


def producer(kafka_broker: KafkaBroker, transactional_id: str) -> Producer:
    made = Producer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 60_000,
        }
    )
    made.init_transactions(TIMEOUT_S)
    return made


def read_all(kafka_broker: KafkaBroker, topic: str, isolation: str, expected: int) -> list[bytes]:
    """Every data record of ``topic`` (3 partitions) from offset 0, as ``isolation`` sees
    them; stops once ``expected`` were read and the partitions are at their end."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": unique("reader"),
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    values: list[bytes] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end.add(message.partition())
                if len(at_end) == 3 and len(values) >= expected:
                    return values
                continue
            at_end.discard(message.partition())
            value = message.value()
            assert value is not None
            values.append(value)
    finally:
        consumer.close()
    raise AssertionError(f"read {len(values)} of {expected} ({isolation}) in time")


def test_commit_abort_and_commit_again(kafka_broker: KafkaBroker, topic: str) -> None:
    tx = producer(kafka_broker, unique("app"))
    try:
        tx.begin_transaction()
        for i in range(9):  # every partition
            tx.produce(topic, f"committed-{i}".encode(), partition=i % 3)
        tx.commit_transaction(TIMEOUT_S)
        tx.begin_transaction()
        for i in range(6):
            tx.produce(topic, f"aborted-{i}".encode(), partition=i % 3)
        tx.flush(TIMEOUT_S)  # they are in the log, then aborted
        tx.abort_transaction(TIMEOUT_S)
        tx.begin_transaction()
        for i in range(3):
            tx.produce(topic, f"after-{i}".encode(), partition=i % 3)
        tx.commit_transaction(TIMEOUT_S)
    finally:
        tx.flush(TIMEOUT_S)
    committed = read_all(kafka_broker, topic, "read_committed", 12)
    assert sorted(committed) == sorted(
        [f"committed-{i}".encode() for i in range(9)] + [f"after-{i}".encode() for i in range(3)]
    )
    everything = read_all(kafka_broker, topic, "read_uncommitted", 18)
    assert sorted(everything) == sorted(committed + [f"aborted-{i}".encode() for i in range(6)])


def test_an_open_transaction_is_invisible_to_read_committed(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    tx = producer(kafka_broker, unique("app"))
    tx.begin_transaction()
    tx.produce(topic, b"undecided", partition=0)
    tx.flush(TIMEOUT_S)
    # The last stable offset stops at the open transaction: read_committed sees nothing
    # of partition 0 yet, and its latest offset is that transaction's first.
    reader = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": unique("probe"),
            "isolation.level": "read_committed",
        }
    )
    try:
        low, high = reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)
        assert (low, high) == (0, 0)
    finally:
        reader.close()
    tx.commit_transaction(TIMEOUT_S)
    assert read_all(kafka_broker, topic, "read_committed", 1) == [b"undecided"]


def test_a_second_instance_fences_the_first(kafka_broker: KafkaBroker, topic: str) -> None:
    tid = unique("app")
    zombie = producer(kafka_broker, tid)
    zombie.begin_transaction()
    delivered: list[object] = []
    zombie.produce(
        topic, b"zombie", partition=1, on_delivery=lambda err, _msg: delivered.append(err)
    )
    zombie.flush(TIMEOUT_S)
    assert delivered == [None]  # in the log, in the zombie's transaction
    fresh = producer(kafka_broker, tid)  # aborts the zombie's transaction, bumps the epoch
    fresh.begin_transaction()
    fresh.produce(topic, b"fresh", partition=1)
    fresh.commit_transaction(TIMEOUT_S)
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(TIMEOUT_S)
    error = raised.value.args[0]
    assert error.fatal() or error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ), error
    assert read_all(kafka_broker, topic, "read_committed", 1) == [b"fresh"]


def test_transactions_are_described_and_listed(kafka_broker: KafkaBroker, topic: str) -> None:
    """kafka-python's admin client (what ``kafka-transactions.sh`` does): DescribeTransactions
    and ListTransactions through FindCoordinator's transaction key type."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import TransactionalIdNotFoundError

    tid = unique("described")
    tx = producer(kafka_broker, tid)
    tx.begin_transaction()
    tx.produce(topic, b"x", partition=2)
    tx.flush(TIMEOUT_S)
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        described = admin.describe_transactions([tid])[tid]
        assert described.state.name.lower() == "ongoing", described
        assert {(tp.topic, tp.partition) for tp in described.topic_partitions} == {(topic, 2)}
        assert described.transaction_timeout_ms == 60_000
        assert described.transaction_start_time_ms > 0
        by_broker = admin.list_transactions(state_filters=["Ongoing"])
        ongoing = {t.transactional_id: t for listed in by_broker.values() for t in listed}
        assert ongoing[tid].producer_id == described.producer_id
        # The partition's side (what find-hanging reads): the open transaction's start.
        from kafka import TopicPartition as KafkaTopicPartition

        tp = KafkaTopicPartition(topic, 2)
        (active,) = admin.describe_producers([tp])[tp].active_producers
        assert active.producer_id == described.producer_id
        assert active.current_transaction_start_offset == 0
        idle = admin.list_transactions(state_filters=["CompleteCommit"])
        assert tid not in {t.transactional_id for listed in idle.values() for t in listed}
        with pytest.raises(TransactionalIdNotFoundError):
            admin.describe_transactions([unique("nobody")])
    finally:
        admin.close()
        tx.abort_transaction(TIMEOUT_S)


@pytest.fixture
def quick_aborts() -> Iterator[KafkaBroker]:
    """A broker that looks for timed-out transactions every 200 ms."""
    settings = {
        "kafka.listen": "127.0.0.1:0",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": 200,
    }
    with InProcessBroker(settings=settings) as running:
        port = running.server.kafka_port
        assert port is not None
        yield KafkaBroker(running, f"127.0.0.1:{port}", running.address)


def test_an_abandoned_transaction_is_aborted_at_its_timeout(quick_aborts: KafkaBroker) -> None:
    """A producer that stops mid-transaction (its process died) holds the last stable
    offset back only until its transaction.timeout.ms: the coordinator aborts it, and the
    partition's later committed records become readable."""
    name = unique("abandoned")
    admin = AdminClient({"bootstrap.servers": quick_aborts.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=3)])[name].result(timeout=TIMEOUT_S)
    abandoned = Producer(
        {
            "bootstrap.servers": quick_aborts.bootstrap,
            "transactional.id": unique("dies"),
            "transaction.timeout.ms": 1_000,
        }
    )
    abandoned.init_transactions(TIMEOUT_S)
    abandoned.begin_transaction()
    abandoned.produce(name, b"never-committed", partition=0)
    abandoned.flush(TIMEOUT_S)
    survivor = producer(quick_aborts, unique("lives"))
    survivor.begin_transaction()
    survivor.produce(name, b"committed-after", partition=0)
    survivor.commit_transaction(TIMEOUT_S)
    # Readable only once the abandoned transaction before it is aborted (about 1 s).
    assert read_all(quick_aborts, name, "read_committed", 1) == [b"committed-after"]
    assert sorted(read_all(quick_aborts, name, "read_uncommitted", 2)) == [
        b"committed-after",
        b"never-committed",
    ]


def test_a_transactional_batch_outside_the_transaction_is_refused(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    """KIP-890 part 1: a transactional batch for a partition the producer's transaction
    does not hold (a late write, or a client that skipped AddPartitionsToTxn) is refused
    and stored nowhere, so it cannot hold the last stable offset back; control batches
    from a producer are refused too."""
    import socket

    from kafka.protocol.producer import ProduceRequest, ProduceResponse

    from tests.kafka import raw
    from tidelog.storage.records import BatchBuilder

    tid = unique("app")
    tx = producer(kafka_broker, tid)
    tx.begin_transaction()
    tx.produce(topic, b"in", partition=0)
    tx.flush(TIMEOUT_S)  # the transaction holds partition 0 only
    from kafka.admin import KafkaAdminClient

    described = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        state = described.describe_transactions([tid])[tid]
    finally:
        described.close()

    def send(partition: int, *, control: bool = False) -> int:
        builder = BatchBuilder(
            producer_id=state.producer_id,
            producer_epoch=state.producer_epoch,
            base_sequence=0 if not control else -1,
            is_transactional=True,
            is_control=control,
        )
        builder.append(int(time.time() * 1000), b"k", b"sneaked")
        request = ProduceRequest[7](
            transactional_id=tid,
            acks=-1,
            timeout_ms=5_000,
            topic_data=[
                ProduceRequest.TopicProduceData(
                    name=topic,
                    partition_data=[
                        ProduceRequest.TopicProduceData.PartitionProduceData(
                            index=partition, records=builder.build()
                        )
                    ],
                )
            ],
        )
        host, port = kafka_broker.bootstrap.split(":")
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
            answer = raw.call(sock, request, "sneaky")
        assert answer is not None
        decoded = ProduceResponse[7].decode(answer, header=True)
        return int(decoded.responses[0].partition_responses[0].error_code)

    assert send(1) == 48  # INVALID_TXN_STATE: partition 1 was never added
    assert send(0, control=True) == 42  # INVALID_REQUEST: markers are the broker's
    tx.abort_transaction(TIMEOUT_S)
    assert read_all(kafka_broker, topic, "read_uncommitted", 1) == [b"in"]


def test_the_grpc_listener_reads_committed_too(kafka_broker: KafkaBroker, topic: str) -> None:
    """The same partition through Tidelog's gRPC Fetch and ListOffsets: read_committed
    stops at the last stable offset and names the aborted transaction the records
    overlap, read_uncommitted reads to the high watermark (both listeners, one core)."""
    import grpc

    from tidelog.proto.tidelog.v1 import broker_pb2 as pb
    from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

    tx = producer(kafka_broker, unique("app"))
    tx.begin_transaction()
    tx.produce(topic, b"aborted", partition=0)
    tx.flush(TIMEOUT_S)
    tx.abort_transaction(TIMEOUT_S)  # offsets 0 (data) and 1 (ABORT marker)
    tx.begin_transaction()
    tx.produce(topic, b"open", partition=0)  # offset 2, undecided
    tx.flush(TIMEOUT_S)
    with grpc.insecure_channel(kafka_broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)

        def fetch(isolation: int) -> pb.FetchPartitionResult:
            request = pb.FetchRequest(
                partitions=[pb.FetchPartition(topic=topic, partition=0, fetch_offset=0)],
                isolation_level=isolation,
            )
            (result,) = stub.Fetch(request, timeout=TIMEOUT_S).results
            return result

        def latest(isolation: int) -> int:
            request = pb.ListOffsetsRequest(
                partitions=[pb.ListOffsetsPartition(topic=topic, partition=0, timestamp_ms=-1)],
                isolation_level=isolation,
            )
            return int(stub.ListOffsets(request, timeout=TIMEOUT_S).results[0].offset)

        committed, uncommitted = fetch(1), fetch(0)
        assert (committed.high_watermark, committed.last_stable_offset) == (3, 2)
        producer_id = committed.aborted_transactions[0].producer_id
        assert [(a.producer_id, a.first_offset) for a in committed.aborted_transactions] == [
            (producer_id, 0)
        ]
        assert uncommitted.aborted_transactions == []
        assert len(uncommitted.records) > len(committed.records)  # the open batch too
        assert (latest(1), latest(0)) == (2, 3)
    tx.commit_transaction(TIMEOUT_S)


def test_kafka_pythons_transactional_producer(kafka_broker: KafkaBroker, topic: str) -> None:
    """kafka-python's transactional producer (its own InitProducerId, AddPartitionsToTxn
    and EndTxn versions): an abort then a commit; read_committed sees the commit only."""
    from kafka import KafkaProducer

    tx = KafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap, transactional_id=unique("kafka-python")
    )
    try:
        tx.init_transactions()
        tx.begin_transaction()
        for i in range(3):
            tx.send(topic, f"dropped-{i}".encode(), partition=i)
        tx.flush()
        tx.abort_transaction()
        tx.begin_transaction()
        for i in range(3):
            tx.send(topic, f"kept-{i}".encode(), partition=i)
        tx.commit_transaction()
    finally:
        tx.close()
    assert sorted(read_all(kafka_broker, topic, "read_committed", 3)) == [
        f"kept-{i}".encode() for i in range(3)
    ]


def _stable_offset_code(kafka_broker: KafkaBroker, group: str, topic: str) -> int:
    """OffsetFetch v7 with require_stable, raw: partition 0's error code."""
    import socket

    from kafka.protocol.consumer import OffsetFetchResponse

    from tests.kafka import raw

    request = raw.offset_fetch_request(group, topic, [0], version=7)
    request.require_stable = True
    host, port = kafka_broker.bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        answer = raw.call(sock, request, "stable")
    assert answer is not None
    decoded = OffsetFetchResponse[7].decode(answer, header=True)
    return int(decoded.topics[0].partitions[0].error_code)


def test_consume_transform_produce_commits_offsets_in_the_transaction(
    kafka_broker: KafkaBroker, topic: str
) -> None:
    """Exactly once, Kafka's way: a consumer's offsets go into the producer's transaction
    (AddOffsetsToTxn, TxnOffsetCommit): committed with its output, or not at all. While
    the transaction is open they are pending: OffsetFetch with require_stable answers
    UNSTABLE_OFFSET_COMMIT (88), a plain OffsetFetch the offset before it."""
    source = topic
    sink = unique("sink")
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(sink, num_partitions=1)])[sink].result(timeout=TIMEOUT_S)
    plain = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i in range(6):
        plain.produce(source, f"in-{i}".encode(), partition=0)
    plain.flush(TIMEOUT_S)
    group = unique("copier")
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(source, 0, 0)])
    tx = producer(kafka_broker, unique("copier"))
    try:
        taken: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(taken) < 6 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                taken.append(message.value())
        assert len(taken) == 6
        # Aborted: the output goes and so do the offsets.
        tx.begin_transaction()
        for value in taken[:3]:
            tx.produce(sink, value.upper(), partition=0)
        tx.send_offsets_to_transaction(
            [TopicPartition(source, 0, 3)], consumer.consumer_group_metadata(), TIMEOUT_S
        )
        assert _stable_offset_code(kafka_broker, group, source) == 88  # pending
        tx.abort_transaction(TIMEOUT_S)
        # Stable once the ABORT marker landed (the abort is answered before the markers,
        # as Kafka's): a client retries 88 until then.
        deadline = time.monotonic() + TIMEOUT_S
        while _stable_offset_code(kafka_broker, group, source) == 88:
            assert time.monotonic() < deadline, "the abort's marker never landed"
            time.sleep(0.05)
        assert _stable_offset_code(kafka_broker, group, source) == 0
        (nothing,) = consumer.committed([TopicPartition(source, 0)], timeout=TIMEOUT_S)
        assert nothing.offset < 0
        # Committed: the output and the offsets together.
        tx.begin_transaction()
        for value in taken:
            tx.produce(sink, value.upper(), partition=0)
        tx.send_offsets_to_transaction(
            [TopicPartition(source, 0, 6)], consumer.consumer_group_metadata(), TIMEOUT_S
        )
        tx.commit_transaction(TIMEOUT_S)
        deadline = time.monotonic() + TIMEOUT_S
        while True:  # the markers, then the offsets, follow the commit's answer
            (done,) = consumer.committed([TopicPartition(source, 0)], timeout=TIMEOUT_S)
            if done.offset == 6 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert done.offset == 6
    finally:
        consumer.close()
    copied = Consumer(
        {
            "bootstrap.servers": kafka_broker.bootstrap,
            "group.id": unique("check"),
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    copied.assign([TopicPartition(sink, 0, 0)])
    values: list[bytes] = []
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            message = copied.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                break  # end of the partition
            values.append(message.value())
    finally:
        copied.close()
    assert values == [f"IN-{i}".encode() for i in range(6)]
