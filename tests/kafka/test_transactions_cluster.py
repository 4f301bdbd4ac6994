"""Transactions in a cluster (issue #28, step 4b): three broker processes with Kafka
listeners on a real ZooKeeper, RF=3 topics, confluent-kafka's transactional producer and
read_committed consumers.

- Commit and abort across partitions led by different brokers: the coordinator (leader
  of the id's ``__transaction_state`` partition) sends WriteTxnMarkers to the other
  leaders, and each leader verifies the transactional batches with the coordinator
  (KIP-890 part 1, another broker's answer); a group's offsets sent in the transaction
  are committed by its group coordinator's marker. Only the coordinator serves the id;
  the others answer ``NOT_COORDINATOR``.
- The coordinator SIGKILLed between its PrepareCommit and the markers: the markers cannot
  be written while a replica of every data partition is SIGSTOPped (the topic's
  ``min.insync.replicas`` is 3), so the transaction is held in PrepareCommit; the
  coordinator is killed there, and the broker that takes over its ``__transaction_state``
  partition loads it and completes the commit once the replicas are back.
- A data partition's leader SIGKILLed mid-transaction: the transaction commits or aborts
  as a whole; a read_committed reader sees all of it or none.

Every wait is bounded (``eventually``); the kill tests restore the cluster before they
end.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DescribeTransactionsRequest, DescribeTransactionsResponse
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.kafka import raw
from tests.kafka.conftest import unique
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.broker.transactions.log_records import partition_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TIMEOUT_S = 30.0
_NOT_COORDINATOR = 16
_NOT_ENOUGH_REPLICAS = 19
_TRANSACTION_COORDINATOR_FENCED = 52


# kafka-python ships WriteTxnMarkers' schema but no classes for it (a broker-only API).
class WriteTxnMarkersRequest(ApiMessage):
    pass


class WriteTxnMarkersResponse(ApiMessage):
    pass


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {
        # A stopped follower leaves the in-sync replicas soon (Kafka: 30 s).
        "replica.lag.time.max.ms": 2_000,
        # Leaders move only where the tests move them.
        "auto.leader.rebalance.enable": "false",
    }
    with LocalCluster(
        brokers=3, kafka=True, session_timeout_ms=3_000, settings=settings
    ) as running:
        yield running


# --- helpers ----------------------------------------------------------------------------


def ask(cluster: LocalCluster, broker_id: int, request: Any, response: Any) -> Any:
    """One request to ``broker_id``'s Kafka listener on a new connection, decoded."""
    host, port = cluster.kafka_address(broker_id).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        answer = raw.call(sock, request, "test-txn-cluster")
    assert answer is not None, "the broker closed the connection"
    return response[request.version].decode(answer, header=True)


def create_topic(cluster: LocalCluster, name: str, partitions: int, min_isr: int) -> None:
    """RF=3; returns once every running broker shows every partition with a leader and
    all three replicas in sync."""
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    topic = NewTopic(name, partitions, 3, config={"min.insync.replicas": str(min_isr)})
    admin.create_topics([topic], operation_timeout=TIMEOUT_S)[name].result(TIMEOUT_S)

    def everywhere() -> bool:
        for broker_id in cluster.broker_ids:
            found = placement(cluster, broker_id, name)
            if len(found) != partitions or any(len(isr) != 3 for _, isr in found.values()):
                return False
        return True

    eventually(everywhere, TIMEOUT_S)


def placement(
    cluster: LocalCluster, broker_id: int, topic: str
) -> dict[int, tuple[int, list[int]]]:
    """Partition -> (leader, ISR) in ``broker_id``'s Metadata (empty while its view does
    not have the topic yet)."""
    request = MetadataRequest[7](topics=[MetadataRequest.MetadataRequestTopic(name=topic)])
    (found,) = ask(cluster, broker_id, request, MetadataResponse).topics
    if found.error_code:
        return {}
    return {p.partition_index: (p.leader_id, list(p.isr_nodes)) for p in found.partitions}


def leader_epoch(cluster: LocalCluster, broker_id: int, topic: str, partition: int) -> int:
    request = MetadataRequest[7](topics=[MetadataRequest.MetadataRequestTopic(name=topic)])
    (found,) = ask(cluster, broker_id, request, MetadataResponse).topics
    return int(next(p.leader_epoch for p in found.partitions if p.partition_index == partition))


def write_marker(
    cluster: LocalCluster,
    broker_id: int,
    producer_id: int,
    producer_epoch: int,
    tp: tuple[str, int],
    coordinator_epoch: int,
) -> int:
    """An ABORT marker for ``tp`` sent as a coordinator would (WriteTxnMarkers v1 to the
    Kafka listener of ``broker_id``, its leader); the partition's error code.

    Markers are written with acks=all, and the leader checks the partition's ISR against
    ``min.insync.replicas`` before the producer's state (as Kafka's
    ``Partition.appendRecordsToLeader`` does before ``appendAsLeader``): while a restarted
    replica is not back in the ISR the answer is NOT_ENOUGH_REPLICAS whatever the epochs.
    A refused marker writes nothing, so it is sent again until the ISR is back.
    """
    marker = WriteTxnMarkersRequest[1].WritableTxnMarker
    request = WriteTxnMarkersRequest[1](
        markers=[
            marker(
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                transaction_result=False,
                topics=[marker.WritableTxnMarkerTopic(name=tp[0], partition_indexes=[tp[1]])],
                coordinator_epoch=coordinator_epoch,
            )
        ]
    )
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        (answer,) = ask(cluster, broker_id, request, WriteTxnMarkersResponse).markers
        code = int(answer.topics[0].partitions[0].error_code)
        if code != _NOT_ENOUGH_REPLICAS or time.monotonic() > deadline:
            return code
        time.sleep(0.2)


def coordinator_of(cluster: LocalCluster, broker_id: int, transactional_id: str) -> int:
    """The transaction coordinator ``broker_id`` names for the id (FindCoordinator key
    type 1); -1 while it names none."""
    request = FindCoordinatorRequest[1](key=transactional_id, key_type=1)
    answer = ask(cluster, broker_id, request, FindCoordinatorResponse)
    return int(answer.node_id) if answer.error_code == 0 else -1


def new_id(cluster: LocalCluster) -> tuple[str, int]:
    """A fresh transactional id and its coordinator, once one is named."""
    tid = unique("txn")
    eventually(lambda: coordinator_of(cluster, cluster.broker_ids[0], tid) >= 0, TIMEOUT_S)
    return tid, coordinator_of(cluster, cluster.broker_ids[0], tid)


def transaction_state(cluster: LocalCluster, broker_id: int, transactional_id: str) -> str:
    """DescribeTransactions at ``broker_id``: the id's state name ("" if it errs)."""
    request = DescribeTransactionsRequest[0](transactional_ids=[transactional_id])
    (state,) = ask(cluster, broker_id, request, DescribeTransactionsResponse).transaction_states
    return str(state.transaction_state) if state.error_code == 0 else ""


def producer(bootstrap: str, transactional_id: str) -> Producer:
    made = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 60_000,
        }
    )
    made.init_transactions(TIMEOUT_S)
    return made


def read_all(
    bootstrap: str, topic: str, partitions: int, isolation: str, expected: int
) -> list[bytes]:
    """Every data record of ``topic`` from offset 0 as ``isolation`` sees them, once at
    least ``expected`` were read and every partition is at its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + TIMEOUT_S * 2
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    if len(at_end) == partitions and len(values) >= expected:
                        return values
                continue  # leaders moving: the client retries
            at_end.discard(message.partition())
            value = message.value()
            assert value is not None
            values.append(value)
    finally:
        consumer.close()
    raise AssertionError(f"read {len(values)} of {expected} ({isolation}) in time")


# --- the tests --------------------------------------------------------------------------


def test_commit_and_abort_across_partitions_led_by_different_brokers(
    cluster: LocalCluster,
) -> None:
    topic = unique("spread")
    create_topic(cluster, topic, 3, 2)
    leaders = {p: leader for p, (leader, _) in placement(cluster, 1, topic).items()}
    assert len(set(leaders.values())) == 3, leaders  # one partition per broker
    tid, coordinator = new_id(cluster)  # the other two leaders get its markers
    for broker_id in cluster.broker_ids:  # every broker names the same coordinator
        assert coordinator_of(cluster, broker_id, tid) == coordinator
    tx = producer(cluster.kafka_bootstrap, tid)
    group = unique("copier")  # its offsets commit with the first transaction
    offsets = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group})
    try:
        tx.begin_transaction()
        for i in range(9):
            tx.produce(topic, f"committed-{i}".encode(), partition=i % 3)
        tx.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 7)], offsets.consumer_group_metadata(), TIMEOUT_S
        )
        tx.commit_transaction(TIMEOUT_S)
        tx.begin_transaction()
        for i in range(6):
            tx.produce(topic, f"aborted-{i}".encode(), partition=i % 3)
        tx.flush(TIMEOUT_S)  # in the logs (verified by the coordinator), then aborted
        tx.abort_transaction(TIMEOUT_S)
        tx.begin_transaction()
        for i in range(3):
            tx.produce(topic, f"after-{i}".encode(), partition=i % 3)
        tx.commit_transaction(TIMEOUT_S)
        # The group's coordinator got the COMMIT marker of its __consumer_offsets
        # partition from the transaction's coordinator (maybe another broker).
        eventually(
            lambda: offsets.committed([TopicPartition(topic, 0)], TIMEOUT_S)[0].offset == 7,
            TIMEOUT_S,
        )
    finally:
        tx.flush(TIMEOUT_S)
        offsets.close()
    committed = read_all(cluster.kafka_bootstrap, topic, 3, "read_committed", 12)
    assert sorted(committed) == sorted(
        [f"committed-{i}".encode() for i in range(9)] + [f"after-{i}".encode() for i in range(3)]
    )
    everything = read_all(cluster.kafka_bootstrap, topic, 3, "read_uncommitted", 18)
    assert sorted(everything) == sorted(committed + [f"aborted-{i}".encode() for i in range(6)])
    eventually(lambda: transaction_state(cluster, coordinator, tid) == "CompleteCommit")
    # A marker of an older coordinator epoch (a deposed coordinator's, late) is refused
    # by the partition: the coordinator epoch is the __transaction_state partition's
    # leader epoch, which the markers of this transaction carried.
    state_partition = partition_for(tid, 5)  # transaction.state.log.num.partitions
    coordinator_epoch = leader_epoch(cluster, coordinator, "__transaction_state", state_partition)
    request = DescribeTransactionsRequest[0](transactional_ids=[tid])
    (described,) = ask(
        cluster, coordinator, request, DescribeTransactionsResponse
    ).transaction_states
    late = write_marker(
        cluster,
        leaders[0],
        described.producer_id,
        described.producer_epoch,
        (topic, 0),
        coordinator_epoch - 1,
    )
    assert late == _TRANSACTION_COORDINATOR_FENCED
    # Only the coordinator serves the id: elsewhere NOT_COORDINATOR (the client asks
    # FindCoordinator again), as Kafka's.
    for broker_id in cluster.broker_ids:
        request = InitProducerIdRequest[1](transactional_id=tid, transaction_timeout_ms=60_000)
        answer = ask(cluster, broker_id, request, InitProducerIdResponse)
        if broker_id != coordinator:
            assert answer.error_code == _NOT_COORDINATOR, broker_id


def test_the_next_coordinator_completes_a_commit_its_predecessor_prepared(
    cluster: LocalCluster,
) -> None:
    topic = unique("held")
    # min.insync.replicas 3: no marker can be written while one replica is stopped.
    create_topic(cluster, topic, 2, 3)
    tid, coordinator = new_id(cluster)
    stopped = next(b for b in cluster.broker_ids if b != coordinator)
    successor = next(b for b in cluster.broker_ids if b not in (stopped, coordinator))
    tx = producer(cluster.kafka_bootstrap, tid)
    tx.begin_transaction()
    for i in range(10):
        tx.produce(topic, f"held-{i}".encode(), partition=i % 2)
    tx.flush(TIMEOUT_S)
    cluster.kill(stopped, signal.SIGSTOP)
    try:
        # PrepareCommit is durable on the coordinator and its successor (the topic's
        # min ISR is transaction.state.log.min.isr = 2) once the stopped broker left the
        # ISR; the client is answered then, before the markers, which cannot be written.
        tx.commit_transaction(TIMEOUT_S * 2)
        assert transaction_state(cluster, coordinator, tid) == "PrepareCommit"
        state_partition = partition_for(tid, 5)  # transaction.state.log.num.partitions
        old_epoch = leader_epoch(cluster, coordinator, "__transaction_state", state_partition)
        cluster.kill(coordinator)
        eventually(lambda: coordinator_of(cluster, successor, tid) == successor, TIMEOUT_S * 2)
    finally:
        cluster.kill(stopped, signal.SIGCONT)
    cluster.start_broker(coordinator)  # the data partitions' third replica comes back
    committed = read_all(cluster.kafka_bootstrap, topic, 2, "read_committed", 10)
    assert sorted(committed) == sorted(f"held-{i}".encode() for i in range(10))
    eventually(
        lambda: transaction_state(cluster, successor, tid) == "CompleteCommit", TIMEOUT_S * 2
    )
    assert coordinator_of(cluster, successor, tid) == successor  # it did, not the restarted one
    # Its markers carried its own coordinator epoch (the partition's new leader epoch): the
    # old coordinator's epoch is fenced at the data partitions from now on.
    assert leader_epoch(cluster, successor, "__transaction_state", state_partition) > old_epoch
    request = DescribeTransactionsRequest[0](transactional_ids=[tid])
    (described,) = ask(cluster, successor, request, DescribeTransactionsResponse).transaction_states
    leader = placement(cluster, successor, topic)[0][0]
    late = write_marker(
        cluster, leader, described.producer_id, described.producer_epoch, (topic, 0), old_epoch
    )
    assert late == _TRANSACTION_COORDINATOR_FENCED


def test_a_partition_leader_killed_mid_transaction_leaves_all_or_nothing(
    cluster: LocalCluster,
) -> None:
    cluster.wait_converged()
    topic = unique("lost")
    create_topic(cluster, topic, 3, 2)  # one preferred leader per broker
    tid, coordinator = new_id(cluster)
    leaders = {p: leader for p, (leader, _) in placement(cluster, 1, topic).items()}
    lost = next(p for p, leader in leaders.items() if leader != coordinator)
    victim = leaders[lost]
    kept = next(p for p in leaders if p != lost)
    tx = producer(cluster.kafka_bootstrap, tid)
    tx.begin_transaction()
    for i in range(10):
        tx.produce(topic, f"before-{i}".encode(), partition=(lost, kept)[i % 2])
    tx.flush(TIMEOUT_S)
    cluster.kill(victim)
    try:
        # The producer follows the partition's new leader, which verifies the next batches
        # with the coordinator and has the open transaction from the replicated log.
        for i in range(10):
            tx.produce(topic, f"after-{i}".encode(), partition=(lost, kept)[i % 2])
        try:
            tx.commit_transaction(TIMEOUT_S * 2)
            outcome = "commit"
        except KafkaException as exc:
            if not exc.args[0].txn_requires_abort():
                raise
            tx.abort_transaction(TIMEOUT_S * 2)
            outcome = "abort"
        survivor = coordinator
        seen = read_all(
            cluster.kafka_address(survivor),
            topic,
            2,
            "read_committed",
            20 if outcome == "commit" else 0,
        )
    finally:
        cluster.start_broker(victim)
    ours = {v for v in seen if v.startswith((b"before-", b"after-"))}
    expected = {f"{w}-{i}".encode() for w in ("before", "after") for i in range(10)}
    assert ours == (expected if outcome == "commit" else set()), outcome
    assert len(seen) == len(ours)  # and nothing twice
