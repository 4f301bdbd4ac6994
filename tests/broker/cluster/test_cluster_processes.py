"""Three real broker processes and a real ZooKeeper (``LocalCluster``), driven over gRPC.

What the brokers themselves must do, before any client routing: register, elect one
controller, create topics through it with leaders on every broker, serve each partition
on its leader only, take a dead broker's partitions offline and back, and elect another
controller when the controller dies.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator

import grpc
import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.broker.conftest import error_code, make_batch
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.records import decode_records

pytestmark = pytest.mark.slow
TIMEOUT_S = 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(brokers=3, session_timeout_ms=3_000) as running:
        yield running


def stub(cluster: LocalCluster, broker_id: int) -> pb_grpc.BrokerStub:
    return pb_grpc.BrokerStub(grpc.insecure_channel(cluster.address(broker_id)))


def metadata(cluster: LocalCluster, broker_id: int, *topics: str) -> pb.MetadataResponse:
    return stub(cluster, broker_id).Metadata(pb.MetadataRequest(topics=topics), timeout=TIMEOUT_S)


def create_on_controller(cluster: LocalCluster, via: int, name: str, partitions: int) -> None:
    """CreateTopic as a client does it: at the controller, again on NOT_CONTROLLER or
    while no controller is known (-1: an election, or ``via`` cut off from ZooKeeper)."""
    deadline = time.monotonic() + 20
    while True:
        controller = metadata(cluster, via).controller_id
        if controller == -1:
            assert time.monotonic() < deadline, "no controller known"
            time.sleep(0.2)
            continue
        try:
            stub(cluster, controller).CreateTopic(
                pb.CreateTopicRequest(name=name, partitions=partitions), timeout=TIMEOUT_S
            )
            return
        except grpc.RpcError as exc:
            if time.monotonic() > deadline or error_code(exc) not in ("NOT_CONTROLLER", ""):
                raise
        time.sleep(0.2)


def leaders(cluster: LocalCluster, via: int, topic: str) -> dict[int, int]:
    answer = metadata(cluster, via, topic)
    if not answer.topics:  # a view without the topic yet
        return {}
    return {p.partition: p.leader for p in answer.topics[0].partitions}


def produce(
    cluster: LocalCluster, broker_id: int, topic: str, partition: int, value: bytes
) -> pb.ProducePartitionResult:
    request = pb.ProduceRequest(
        acks=-1,
        topics=[
            pb.ProduceTopicData(
                topic=topic,
                partitions=[
                    pb.ProducePartitionData(partition=partition, records=make_batch([value]))
                ],
            )
        ],
    )
    return stub(cluster, broker_id).Produce(request, timeout=TIMEOUT_S).results[0]


def fetch_values(
    cluster: LocalCluster, broker_id: int, topic: str, partition: int
) -> list[bytes | None]:
    request = pb.FetchRequest(
        max_wait_ms=0,
        partitions=[pb.FetchPartition(topic=topic, partition=partition, fetch_offset=0)],
    )
    result = stub(cluster, broker_id).Fetch(request, timeout=TIMEOUT_S).results[0]
    assert result.error_code == "", result.error_message
    return [r.value for r in decode_records(result.records)]


def test_brokers_register_and_elect_one_controller(cluster: LocalCluster) -> None:
    eventually(lambda: len(metadata(cluster, 1).brokers) == 3)
    # Each broker's view converges on the same controller.
    eventually(lambda: len({metadata(cluster, i).controller_id for i in cluster.broker_ids}) == 1)
    answers = [metadata(cluster, i) for i in cluster.broker_ids]
    assert answers[0].controller_id in cluster.broker_ids
    assert len({a.cluster_id for a in answers}) == 1
    assert sorted((b.id, b.port) for b in answers[0].brokers) == sorted(cluster.ports.items())


def test_topics_spread_and_each_partition_is_served_by_its_leader(cluster: LocalCluster) -> None:
    controller = metadata(cluster, 1).controller_id
    other = next(i for i in cluster.broker_ids if i != controller)
    # Sent to a broker that is not the controller: forwarded to it (broker.cluster.forwarding).
    created = stub(cluster, other).CreateTopic(
        pb.CreateTopicRequest(name="spread", partitions=6, replication_factor=1), timeout=TIMEOUT_S
    )
    assert sorted({p.leader for p in created.partitions}) == [1, 2, 3]
    eventually(
        lambda: all(
            leaders(cluster, i, "spread") == leaders(cluster, controller, "spread")
            for i in cluster.broker_ids
        )
    )
    for partition, leader in leaders(cluster, other, "spread").items():
        assert produce(cluster, leader, "spread", partition, b"p%d" % partition).error_code == ""
        elsewhere = next(i for i in cluster.broker_ids if i != leader)
        refused_here = produce(cluster, elsewhere, "spread", partition, b"x")
        assert refused_here.error_code == "NOT_LEADER_OR_FOLLOWER"
        assert fetch_values(cluster, leader, "spread", partition) == [b"p%d" % partition]


def test_a_dead_brokers_partitions_go_offline_and_return_with_their_records(
    cluster: LocalCluster,
) -> None:
    controller = metadata(cluster, 1).controller_id
    stub(cluster, controller).CreateTopic(
        pb.CreateTopicRequest(name="offline", partitions=6), timeout=TIMEOUT_S
    )
    victim = next(i for i in cluster.broker_ids if i != controller)
    survivor = next(i for i in cluster.broker_ids if i not in (controller, victim))
    eventually(lambda: len(leaders(cluster, survivor, "offline")) == 6)
    mine = [p for p, leader in leaders(cluster, survivor, "offline").items() if leader == victim]
    assert mine
    # The victim's own view may lag the survivor's for a moment.
    eventually(lambda: all(leaders(cluster, victim, "offline").get(p) == victim for p in mine))
    for partition in mine:
        assert produce(cluster, victim, "offline", partition, b"kept").error_code == ""
    cluster.kill(victim)
    eventually(lambda: all(leaders(cluster, survivor, "offline")[p] == -1 for p in mine))
    answer = produce(cluster, survivor, "offline", mine[0], b"lost?")
    assert answer.error_code == "LEADER_NOT_AVAILABLE"
    assert "offline" in answer.error_message
    cluster.start_broker(victim)
    for view in (survivor, victim):  # each broker's view catches up on its own
        eventually(lambda v=view: all(leaders(cluster, v, "offline")[p] == victim for p in mine))
    for partition in mine:
        assert fetch_values(cluster, victim, "offline", partition) == [b"kept"]


def test_another_broker_takes_over_when_the_controller_dies(cluster: LocalCluster) -> None:
    controller = metadata(cluster, 1).controller_id
    survivor = next(i for i in cluster.broker_ids if i != controller)
    cluster.kill(controller)
    eventually(lambda: metadata(cluster, survivor).controller_id not in (-1, controller))
    create_on_controller(cluster, survivor, "after-failover", 2)
    cluster.start_broker(controller)
    eventually(lambda: len(metadata(cluster, controller).brokers) == 3)
    # LEADER_NOT_AVAILABLE (retriable) while the returning broker's partitions come back.
    eventually(
        lambda: (
            stub(cluster, controller)
            .FindCoordinator(pb.FindCoordinatorRequest(group_id="g"), timeout=TIMEOUT_S)
            .coordinator.id
            in cluster.broker_ids
        )
    )


def test_a_paused_controller_cannot_write_after_it_resumes(cluster: LocalCluster) -> None:
    eventually(lambda: len(metadata(cluster, 1).brokers) == 3)
    stale = metadata(cluster, 1).controller_id
    survivor = next(i for i in cluster.broker_ids if i != stale)
    cluster.kill(stale, signal.SIGSTOP)
    try:
        eventually(lambda: metadata(cluster, survivor).controller_id not in (-1, stale))
    finally:
        cluster.kill(stale, signal.SIGCONT)
    # Asked to write as the controller (an Envelope runs on the receiving broker's own
    # controller only: a CreateTopic would be forwarded to the new controller, which may
    # create it), the zombie refuses: its lease is fenced.
    arguments = json.dumps(
        {"name": "from-a-zombie", "partitions": 1, "replication_factor": 1, "config": {}}
    ).encode()
    with pytest.raises(grpc.RpcError) as refused:
        stub(cluster, stale).Envelope(
            pb.EnvelopeRequest(call="create_topic", arguments=arguments, broker_id=survivor),
            timeout=TIMEOUT_S,
        )
    assert error_code(refused.value) == "NOT_CONTROLLER"
    assert metadata(cluster, survivor, "from-a-zombie").topics[0].error_code == (
        "UNKNOWN_TOPIC_OR_PARTITION"
    )
    # It comes back as an ordinary broker on a new session.
    eventually(lambda: len(metadata(cluster, survivor).brokers) == 3)
    eventually(lambda: metadata(cluster, stale).controller_id not in (-1, stale))


def test_the_cluster_rides_out_a_zookeeper_restart(cluster: LocalCluster) -> None:
    eventually(lambda: len(metadata(cluster, 1).brokers) == 3)
    cluster.zookeeper.restart()
    eventually(lambda: len(metadata(cluster, 1).brokers) == 3)
    create_on_controller(cluster, 1, "after-zk-restart", 3)
    for broker_id in cluster.broker_ids:
        eventually(lambda b=broker_id: -1 not in leaders(cluster, b, "after-zk-restart").values())
