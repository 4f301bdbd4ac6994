"""Transactions v2 (KIP-890) on the Kafka listener, as hand-built requests: no Python
client speaks v2 (librdkafka and kafka-python run v1; the Java 4.x client, which does,
is not on this machine), so each request is built and decoded by kafka-python's protocol
classes (a codec independent of the broker's kio) the way a Java 4.x producer or a
partition leader sends it; confluent-kafka reads the results back at read_committed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DescribeTransactionsRequest, DescribeTransactionsResponse
from kafka.protocol.consumer import OffsetFetchRequest, OffsetFetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

from tests.broker.cluster.waiting import eventually
from tests.kafka import raw
from tests.kafka.conftest import KafkaBroker, unique
from tests.kafka.test_transactions import read_all
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.transactions.state import TxnState
from tidelog.storage.records import BatchBuilder

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 30.0
NONE, INVALID_PRODUCER_EPOCH, INVALID_PRODUCER_ID_MAPPING, INVALID_TXN_STATE = 0, 47, 49, 48
PRODUCER_FENCED, TRANSACTION_ABORTABLE, NOT_ENOUGH_REPLICAS = 90, 120, 19
CLUSTER_AUTHORIZATION_FAILED = 31
OUT_OF_ORDER_SEQUENCE_NUMBER, CONCURRENT_TRANSACTIONS = 45, 51


class Wire:
    """One raw connection to the Kafka listener."""

    def __init__(self, sock: socket.socket) -> None:
        self._session = raw.SaslSession(sock, "tv2-client")

    def call(self, request: Any, response_class: Any) -> Any:
        return self._session.call(request, response_class)

    def init(self, tid: str) -> tuple[int, int]:
        answer = self.call(
            InitProducerIdRequest[5](
                transactional_id=tid,
                transaction_timeout_ms=60_000,
                producer_id=-1,
                producer_epoch=-1,
            ),
            InitProducerIdResponse,
        )
        assert answer.error_code == NONE
        return int(answer.producer_id), int(answer.producer_epoch)

    def produce(
        self,
        tid: str,
        identity: tuple[int, int],
        topic: str,
        partition: int,
        values: list[bytes],
        *,
        sequence: int = 0,
        version: int = 12,
    ) -> int:
        """One transactional batch; the partition's error code. Retried as clients retry
        ``NOT_ENOUGH_REPLICAS``: right after an EndTxn the coordinator answers the next
        transaction's add ``CONCURRENT_TRANSACTIONS`` until the markers are written."""
        for _ in range(100):
            code = self._produce_once(tid, identity, topic, partition, values, sequence, version)
            if code != NOT_ENOUGH_REPLICAS:
                return code
            time.sleep(0.05)
        raise AssertionError("the previous transaction never completed")

    def _produce_once(
        self,
        tid: str,
        identity: tuple[int, int],
        topic: str,
        partition: int,
        values: list[bytes],
        sequence: int,
        version: int,
    ) -> int:
        builder = BatchBuilder(
            producer_id=identity[0],
            producer_epoch=identity[1],
            base_sequence=sequence,
            is_transactional=True,
        )
        for value in values:
            builder.append(int(time.time() * 1000), None, value)
        request_class = ProduceRequest[version]
        data = request_class.TopicProduceData
        answer = self.call(
            request_class(
                transactional_id=tid,
                acks=-1,
                timeout_ms=5_000,
                topic_data=[
                    data(
                        name=topic,
                        partition_data=[
                            data.PartitionProduceData(index=partition, records=builder.build())
                        ],
                    )
                ],
            ),
            ProduceResponse,
        )
        return int(answer.responses[0].partition_responses[0].error_code)

    def end(self, tid: str, identity: tuple[int, int], *, commit: bool) -> Any:
        return self.call(
            EndTxnRequest[5](
                transactional_id=tid,
                producer_id=identity[0],
                producer_epoch=identity[1],
                committed=commit,
            ),
            EndTxnResponse,
        )

    def add_v1(self, tid: str, identity: tuple[int, int], topic: str, partition: int) -> int:
        """AddPartitionsToTxn v3 (a transactions v1 client's), the partition's error code;
        retried while the previous transaction completes (``CONCURRENT_TRANSACTIONS``)."""
        request_class = AddPartitionsToTxnRequest[3]
        for _ in range(100):
            answer = self.call(
                request_class(
                    v3_and_below_transactional_id=tid,
                    v3_and_below_producer_id=identity[0],
                    v3_and_below_producer_epoch=identity[1],
                    v3_and_below_topics=[
                        request_class.AddPartitionsToTxnTopic(name=topic, partitions=[partition])
                    ],
                ),
                AddPartitionsToTxnResponse,
            )
            (topic_result,) = answer.results_by_topic_v3_and_below
            code = int(topic_result.results_by_partition[0].partition_error_code)
            if code != CONCURRENT_TRANSACTIONS:
                return code
            time.sleep(0.05)
        raise AssertionError("the previous transaction never completed")

    def end_v1(self, tid: str, identity: tuple[int, int], *, commit: bool) -> int:
        """EndTxn v3 (transactions v1: the epoch stays); its error code."""
        answer = self.call(
            EndTxnRequest[3](
                transactional_id=tid,
                producer_id=identity[0],
                producer_epoch=identity[1],
                committed=commit,
            ),
            EndTxnResponse,
        )
        return int(answer.error_code)

    def describe(self, tid: str) -> Any:
        answer = self.call(
            DescribeTransactionsRequest[0](transactional_ids=[tid]), DescribeTransactionsResponse
        )
        (state,) = answer.transaction_states
        return state


@pytest.fixture
def wire(kafka_broker: KafkaBroker) -> Iterator[Wire]:
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        yield Wire(sock)


@pytest.fixture
def topic(kafka_broker: KafkaBroker) -> str:
    name = unique("tv2")
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=3)])[name].result(timeout=TIMEOUT_S)
    return name


def _in_transaction(state: Any) -> set[tuple[str, int]]:
    return {(t.topic, p) for t in state.topics for p in t.partitions}


def test_api_versions_finalize_transaction_version_2(wire: Wire) -> None:
    """What a Java 4.x producer reads to switch to v2 (``TransactionManager``): the
    finalized ``transaction.version`` with a features epoch it has not seen (>= 0)."""
    answer = wire.call(
        ApiVersionsRequest[3](client_software_name="t", client_software_version="1"),
        ApiVersionsResponse,
    )
    assert answer.error_code == NONE
    finalized = {f.name: f.max_version_level for f in answer.finalized_features}
    assert finalized == {"transaction.version": 2}
    assert answer.finalized_features_epoch >= 0
    supported = {f.name: (f.min_version, f.max_version) for f in answer.supported_features}
    assert supported["transaction.version"] == (0, 2)
    ranges = {k.api_key: k.max_version for k in answer.api_keys}
    # Produce 12, AddPartitionsToTxn 5, EndTxn 5, TxnOffsetCommit 5: what v2 needs.
    assert (ranges[0], ranges[24], ranges[26], ranges[28]) == (12, 5, 5, 5)


def test_a_v2_producer_adds_partitions_by_producing_and_bumps_its_epoch_each_time(
    kafka_broker: KafkaBroker, wire: Wire, topic: str
) -> None:
    tid = unique("tv2")
    pid, epoch = wire.init(tid)
    # No AddPartitionsToTxn: Produce v12 joins the partitions to the transaction.
    assert wire.produce(tid, (pid, epoch), topic, 0, [b"c1"]) == NONE
    assert wire.produce(tid, (pid, epoch), topic, 1, [b"c2"]) == NONE
    assert wire.produce(tid, (pid, epoch), topic, 1, [b"c3"], sequence=1) == NONE
    state = wire.describe(tid)
    assert state.transaction_state == "Ongoing"
    assert _in_transaction(state) == {(topic, 0), (topic, 1)}

    committed = wire.end(tid, (pid, epoch), commit=True)
    assert committed.error_code == NONE
    assert (committed.producer_id, committed.producer_epoch) == (pid, epoch + 1)
    # The next transaction runs under the bumped epoch, from sequence 0.
    bumped = (pid, epoch + 1)
    assert wire.produce(tid, bumped, topic, 2, [b"aborted"]) == NONE
    aborted = wire.end(tid, bumped, commit=False)
    assert aborted.error_code == NONE
    assert (aborted.producer_id, aborted.producer_epoch) == (pid, epoch + 2)
    again = (pid, epoch + 2)
    assert wire.produce(tid, again, topic, 2, [b"c4"]) == NONE
    assert wire.end(tid, again, commit=True).error_code == NONE

    assert sorted(read_all(kafka_broker, topic, "read_committed", 4)) == [
        b"c1",
        b"c2",
        b"c3",
        b"c4",
    ]


def test_a_zombies_late_produce_and_end_txn_are_refused(
    kafka_broker: KafkaBroker, wire: Wire, topic: str
) -> None:
    """The holes v2 closes: a Produce or an EndTxn of a finished transaction, arriving
    late, can never join the next one (same producer id, older epoch)."""
    tid = unique("tv2")
    first = wire.init(tid)
    assert wire.produce(tid, first, topic, 0, [b"one"]) == NONE
    assert wire.end(tid, first, commit=True).error_code == NONE
    second = (first[0], first[1] + 1)
    assert wire.produce(tid, second, topic, 0, [b"two"]) == NONE
    # The first transaction's late write (a retry stuck in the network, say), to the
    # partition the second transaction holds and to one it does not:
    assert wire.produce(tid, first, topic, 0, [b"late"], sequence=1) == INVALID_PRODUCER_EPOCH
    assert wire.produce(tid, first, topic, 1, [b"late"]) == INVALID_PRODUCER_EPOCH
    # A late EndTxn of the first transaction, after the second one began, ends nothing:
    # its epoch names the transaction before (a retry of that one's EndTxn), which is
    # over (the state machine answers INVALID_TXN_STATE, fatal for that producer).
    assert wire.end(tid, first, commit=False).error_code == INVALID_TXN_STATE
    assert wire.describe(tid).transaction_state == "Ongoing"
    assert wire.end(tid, second, commit=True).error_code == NONE
    # Once the second transaction is over too (its markers written: CONCURRENT_TRANSACTIONS
    # until then), the first epoch is simply fenced.
    eventually(lambda: wire.describe(tid).transaction_state == "CompleteCommit")
    assert wire.end(tid, first, commit=True).error_code == PRODUCER_FENCED
    assert sorted(read_all(kafka_broker, topic, "read_committed", 2)) == [b"one", b"two"]
    assert wire.describe(tid).producer_epoch == first[1] + 2


def test_a_v1_style_produce_without_add_is_refused_as_its_version_spells_it(
    wire: Wire, topic: str
) -> None:
    """Produce v11 and below only verify (KIP-890 part 1): a partition the transaction
    does not hold is TRANSACTION_ABORTABLE from v11, INVALID_TXN_STATE before."""
    tid = unique("tv1")
    identity = wire.init(tid)
    assert wire.produce(tid, identity, topic, 0, [b"x"], version=11) == TRANSACTION_ABORTABLE
    assert wire.produce(tid, identity, topic, 0, [b"x"], version=10) == INVALID_TXN_STATE
    assert wire.describe(tid).transaction_state == "Empty"


def test_end_txn_before_v5_keeps_the_epoch(wire: Wire, topic: str) -> None:
    tid = unique("tv1")
    pid, epoch = wire.init(tid)
    assert wire.add_v1(tid, (pid, epoch), topic, 0) == NONE
    assert wire.produce(tid, (pid, epoch), topic, 0, [b"v1"], version=9) == NONE
    assert wire.end_v1(tid, (pid, epoch), commit=True) == NONE
    assert wire.describe(tid).producer_epoch == epoch


def _brokers_add(
    transactions: list[tuple[str, tuple[int, int], bool, list[tuple[str, int]]]], version: int
) -> Any:
    request_class = AddPartitionsToTxnRequest[version]
    txn_class = request_class.AddPartitionsToTxnTransaction
    return request_class(
        transactions=[
            txn_class(
                transactional_id=tid,
                producer_id=identity[0],
                producer_epoch=identity[1],
                verify_only=verify_only,
                topics=[
                    txn_class.AddPartitionsToTxnTopic(name=name, partitions=[index])
                    for name, index in partitions
                ],
            )
            for tid, identity, verify_only, partitions in transactions
        ]
    )


def _codes(answer: Any) -> dict[str, dict[tuple[str, int], int]]:
    return {
        result.transactional_id: {
            (t.name, p.partition_index): p.partition_error_code
            for t in result.topic_results
            for p in t.results_by_partition
        }
        for result in answer.results_by_transaction
    }


@pytest.mark.parametrize("version", [4, 5])
def test_the_brokers_batched_add_partitions_answers_each_transaction(
    wire: Wire, topic: str, version: int
) -> None:
    """AddPartitionsToTxn v4-5 as partition leaders send it (KIP-890): several ids in
    one request, each verified (``verify_only``) or added, each answered by itself."""
    ongoing, other, unknown = unique("a"), unique("b"), unique("nobody")
    a = wire.init(ongoing)
    b = wire.init(other)
    assert wire.produce(ongoing, a, topic, 0, [b"x"]) == NONE  # v2: partition 0 joins
    answer = wire.call(
        _brokers_add(
            [
                (ongoing, a, True, [(topic, 0), (topic, 1)]),
                (other, b, False, [(topic, 2)]),
                (unknown, (12345, 0), True, [(topic, 0)]),
            ],
            version,
        ),
        AddPartitionsToTxnResponse,
    )
    assert answer.error_code == NONE
    not_added = TRANSACTION_ABORTABLE if version >= 5 else INVALID_TXN_STATE
    assert _codes(answer) == {
        ongoing: {(topic, 0): NONE, (topic, 1): not_added},
        other: {(topic, 2): NONE},
        unknown: {(topic, 0): INVALID_PRODUCER_ID_MAPPING},
    }
    assert _in_transaction(wire.describe(other)) == {(topic, 2)}
    assert _in_transaction(wire.describe(ongoing)) == {(topic, 0)}  # verifying adds nothing
    fenced = wire.call(
        _brokers_add([(ongoing, (a[0], a[1] - 1), True, [(topic, 0)])], version),
        AddPartitionsToTxnResponse,
    )
    assert _codes(fenced) == {ongoing: {(topic, 0): PRODUCER_FENCED}}


def _txn_offset_commit(
    tid: str, identity: tuple[int, int], group: str, topic: str, offset: int, version: int
) -> Any:
    request_class = TxnOffsetCommitRequest[version]
    topic_class = request_class.TxnOffsetCommitRequestTopic
    return request_class(
        transactional_id=tid,
        group_id=group,
        producer_id=identity[0],
        producer_epoch=identity[1],
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        topics=[
            topic_class(
                name=topic,
                partitions=[
                    topic_class.TxnOffsetCommitRequestPartition(
                        partition_index=0,
                        committed_offset=offset,
                        committed_leader_epoch=-1,
                        committed_metadata="",
                    )
                ],
            )
        ],
    )


def _committed(wire: Wire, group: str, topic: str) -> int:
    """The group's stable offset of partition 0 once its transaction's marker landed
    (``require_stable``: UNSTABLE_OFFSET_COMMIT until then)."""
    found: list[int] = []

    def stable() -> bool:
        code, offset = _fetch_offset(wire, group, topic)
        found.append(offset)
        return code == NONE

    eventually(stable)
    return found[-1]


def _fetch_offset(wire: Wire, group: str, topic: str) -> tuple[int, int]:
    request_class = OffsetFetchRequest[7]
    answer = wire.call(
        request_class(
            group_id=group,
            topics=[request_class.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])],
            require_stable=True,
        ),
        OffsetFetchResponse,
    )
    (partition,) = answer.topics[0].partitions
    return int(partition.error_code), int(partition.committed_offset)


def _offset_code(answer: Any) -> int:
    return int(answer.topics[0].partitions[0].error_code)


def test_txn_offset_commit_v5_adds_the_offsets_partition_itself(wire: Wire, topic: str) -> None:
    """Transactions v2 send no AddOffsetsToTxn: TxnOffsetCommit v5 joins the group's
    offsets partition to the transaction; the offsets show once it commits."""
    tid, group = unique("tv2"), unique("group")
    identity = wire.init(tid)
    assert wire.produce(tid, identity, topic, 1, [b"out"]) == NONE
    answer = wire.call(
        _txn_offset_commit(tid, identity, group, topic, 7, 5), TxnOffsetCommitResponse
    )
    assert _offset_code(answer) == NONE
    assert any(t.topic == "__consumer_offsets" for t in wire.describe(tid).topics)
    assert wire.end(tid, identity, commit=True).error_code == NONE
    assert _committed(wire, group, topic) == 7
    # The next transaction (bumped epoch) does it again; an abort drops its offsets.
    bumped = (identity[0], identity[1] + 1)
    answer = wire.call(_txn_offset_commit(tid, bumped, group, topic, 9, 5), TxnOffsetCommitResponse)
    assert _offset_code(answer) == NONE
    assert wire.end(tid, bumped, commit=False).error_code == NONE
    assert _committed(wire, group, topic) == 7


@pytest.mark.parametrize(
    ("version", "expected"), [(3, INVALID_TXN_STATE), (4, TRANSACTION_ABORTABLE)]
)
def test_txn_offset_commit_before_v5_needs_add_offsets_first(
    wire: Wire, topic: str, version: int, expected: int
) -> None:
    tid, group = unique("tv1"), unique("group")
    identity = wire.init(tid)
    refused = wire.call(
        _txn_offset_commit(tid, identity, group, topic, 3, version), TxnOffsetCommitResponse
    )
    assert _offset_code(refused) == expected
    added = wire.call(
        AddOffsetsToTxnRequest[3](
            transactional_id=tid,
            producer_id=identity[0],
            producer_epoch=identity[1],
            group_id=group,
        ),
        AddOffsetsToTxnResponse,
    )
    assert added.error_code == NONE
    accepted = wire.call(
        _txn_offset_commit(tid, identity, group, topic, 3, version), TxnOffsetCommitResponse
    )
    assert _offset_code(accepted) == NONE


def test_a_marker_landing_between_verification_and_append_voids_the_verification(
    kafka_broker: KafkaBroker, wire: Wire, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KIP-890's verification guard, the race driven deterministically: the coordinator
    confirms the partition is in the transaction, then (before the batch reaches the log)
    the transaction is aborted and its marker written. The append must refuse the batch:
    stored, it would open a transaction nobody will ever end, holding the partition's
    last stable offset back for good."""
    core = kafka_broker.broker.server.core
    coordinator = core.transactions
    assert coordinator is not None
    tid = unique("race")
    pid, epoch = wire.init(tid)
    added = wire.call(
        AddPartitionsToTxnRequest[3](
            v3_and_below_transactional_id=tid,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[
                AddPartitionsToTxnRequest[3].AddPartitionsToTxnTopic(name=topic, partitions=[0])
            ],
        ),
        AddPartitionsToTxnResponse,
    )
    assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
    real_verify = core._produce._verify
    assert real_verify is not None

    def verify_then_abort(*args: Any) -> str:
        answer = real_verify(*args)
        assert answer == ""  # the partition is in the ongoing transaction
        coordinator.end_transaction(tid, pid, epoch, False)
        eventually(lambda: _state(coordinator.describe([tid])[tid]) is TxnState.COMPLETE_ABORT)
        return answer

    monkeypatch.setattr(core._produce, "_verify", verify_then_abort)
    assert wire.produce(tid, (pid, epoch), topic, 0, [b"late"], version=9) == INVALID_TXN_STATE
    monkeypatch.undo()
    # Nothing was stored and nothing is left open: read_committed reaches the end.
    assert read_all(kafka_broker, topic, "read_uncommitted", 0) == []
    assert read_all(kafka_broker, topic, "read_committed", 0) == []
    (partition,) = core.describe_producers([(topic, 0)], None)
    assert [s.current_txn_start_offset for s in partition.producers] == [-1]


def _state(described: object) -> TxnState | None:
    return getattr(described, "state", None)


def test_the_brokers_form_needs_cluster_action(tmp_path: Path) -> None:
    """AddPartitionsToTxn v4+ is a broker's request: a client without CLUSTER_ACTION on
    the cluster is refused as a whole (CLUSTER_AUTHORIZATION_FAILED, no results), as by
    Kafka; a super user (brokers run as one) is answered per transaction."""
    users = FileUserStore.open(tmp_path)
    for name in ("admin", "bob"):
        users.upsert(name, credential_from_password("SCRAM-SHA-256", f"{name}-secret"))
    settings = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256",
        "authorizer.enabled": "true",
        "super.users": "User:admin",
        "kafka.listen": "127.0.0.1:0",
    }
    request = _brokers_add([("any", (1, 0), True, [("some-topic", 0)])], 5)
    with InProcessBroker(tmp_path, settings=settings) as broker:
        codes = {}
        for user in ("bob", "admin"):
            sock = socket.create_connection(("127.0.0.1", broker.server.kafka_port), TIMEOUT_S)
            session = raw.SaslSession(sock, "tv2-authz")
            try:
                assert session.login(user, f"{user}-secret").error_code == NONE
                answer = session.call(request, AddPartitionsToTxnResponse)
            finally:
                session.close()
            codes[user] = (answer.error_code, len(answer.results_by_transaction))
    assert codes == {"bob": (CLUSTER_AUTHORIZATION_FAILED, 0), "admin": (NONE, 1)}


def test_a_v1_transaction_reusing_an_ended_batchs_sequences_is_refused_not_lost(
    wire: Wire, topic: str, kafka_broker: KafkaBroker
) -> None:
    """What librdkafka 2.16 (transactions v1) sends after aborting a transaction whose
    batch a broker restart left "possibly persisted": the same epoch, the batch's
    sequences again, in the next transaction. Answered as a duplicate of the aborted
    batch (Kafka's answer), the next transaction would commit without these records and
    no one would know; a transaction's end closes its duplicate window
    (``storage.producer_state``), so the batch is out of order and the client fails the
    transaction instead."""
    tid = unique("tv1")
    identity = wire.init(tid)
    assert wire.add_v1(tid, identity, topic, 0) == NONE
    assert wire.produce(tid, identity, topic, 0, [b"aborted-1", b"aborted-2"], version=9) == NONE
    assert wire.end_v1(tid, identity, commit=False) == NONE
    assert wire.add_v1(tid, identity, topic, 0) == NONE
    reused = wire.produce(tid, identity, topic, 0, [b"lost-1", b"lost-2"], version=9)
    assert reused == OUT_OF_ORDER_SEQUENCE_NUMBER
    # The client aborts; sequences that follow on are taken, and commit.
    assert wire.end_v1(tid, identity, commit=False) == NONE
    assert wire.add_v1(tid, identity, topic, 0) == NONE
    assert wire.produce(tid, identity, topic, 0, [b"kept"], sequence=2, version=9) == NONE
    assert wire.end_v1(tid, identity, commit=True) == NONE
    assert read_all(kafka_broker, topic, "read_committed", 1) == [b"kept"]
