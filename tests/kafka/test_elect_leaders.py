"""ElectLeaders (KIP-460) in a three-broker cluster, through confluent-kafka's
``AdminClient.elect_leaders``, Tidelog's ``AdminClient.elect_leaders`` and ``tidelog leaders
elect``: a preferred election moves a leadership back to the first replica once it is in
sync again (and is "not needed" after), is refused while the preferred replica is down,
and an unclean election gives an offline partition whose only in-sync replica is gone a
leader among the live replicas. Brokers are stopped and restarted; every wait is bounded.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator

import confluent_kafka
import pytest
from confluent_kafka import ElectionType
from confluent_kafka.admin import AdminClient as ConfluentAdmin
from confluent_kafka.admin import NewTopic

from tests.broker.cluster.conftest import require_zookeeper
from tests.cli import tidelog
from tests.kafka.conftest import unique
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, TopicPartition
from tidelog.client.types import PartitionDescription
from tidelog.storage.errors import ElectionNotNeededError, UnknownTopicOrPartitionError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {"replica.lag.time.max.ms": 2_000, "auto.leader.rebalance.enable": "false"}
    with LocalCluster(brokers=3, kafka=True, session_timeout_ms=3_000, settings=settings) as c:
        yield c


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        assert time.monotonic() < deadline, f"{what}: not reached in {TIMEOUT_S:.0f} s"
        time.sleep(0.2)


def partition(cluster: LocalCluster, topic: str) -> PartitionDescription:
    with AdminClient(cluster.bootstrap, request_timeout_ms=10_000) as admin:
        (found,) = admin.describe_topic(topic).partitions
    return found


def confluent(cluster: LocalCluster) -> ConfluentAdmin:
    return ConfluentAdmin({"bootstrap.servers": cluster.kafka_bootstrap})


def elect(cluster: LocalCluster, kind: ElectionType, topic: str, index: int = 0) -> object:
    """confluent-kafka's answer for one partition: None (elected) or its KafkaError."""
    tp = confluent_kafka.TopicPartition(topic, index)
    admin = confluent(cluster)  # kept alive until the answer came
    found = admin.elect_leaders(kind, [tp]).result(TIMEOUT_S)
    ((answered, error),) = found.items()
    assert (answered.topic, answered.partition) == (topic, index)
    return None if error is None else error.code()


def _in_sync(cluster: LocalCluster, topic: str, factor: int) -> bool:
    try:
        return len(partition(cluster, topic).isr) == factor
    except UnknownTopicOrPartitionError:
        return False  # the broker asked has not seen the new topic yet


def create(cluster: LocalCluster, topic: str, factor: int) -> PartitionDescription:
    new = NewTopic(topic, 1, factor)
    admin = confluent(cluster)
    admin.create_topics([new])[topic].result(TIMEOUT_S)
    eventually(lambda: _in_sync(cluster, topic, factor), f"{topic} fully in sync")
    return partition(cluster, topic)


def test_a_preferred_election_moves_the_leadership_back(cluster: LocalCluster) -> None:
    topic = unique("preferred")
    first = create(cluster, topic, 3)
    preferred = first.replicas[0]
    assert first.leader == preferred
    assert elect(cluster, ElectionType.PREFERRED, topic) == (
        confluent_kafka.KafkaError.ELECTION_NOT_NEEDED
    )

    cluster.kill(preferred, signal.SIGTERM)
    eventually(lambda: partition(cluster, topic).leader not in (preferred, -1), "a new leader")
    assert elect(cluster, ElectionType.PREFERRED, topic) == (
        confluent_kafka.KafkaError.PREFERRED_LEADER_NOT_AVAILABLE
    )
    cluster.start_broker(preferred)
    eventually(lambda: preferred in partition(cluster, topic).isr, "the preferred replica in sync")
    assert partition(cluster, topic).leader != preferred

    assert elect(cluster, ElectionType.PREFERRED, topic) is None
    eventually(lambda: partition(cluster, topic).leader == preferred, "the preferred leader")
    assert elect(cluster, ElectionType.PREFERRED, topic, 5) == (
        confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART
    )

    # Tidelog's own AdminClient and command line, over gRPC.
    tp = TopicPartition(topic, 0)
    with AdminClient(cluster.bootstrap, request_timeout_ms=10_000) as admin:
        (answer,) = admin.elect_leaders("preferred", [tp]).values()
        assert isinstance(answer, ElectionNotNeededError)
        missing = admin.elect_leaders("preferred", [TopicPartition(topic, 5)])
        assert isinstance(missing[TopicPartition(topic, 5)], UnknownTopicOrPartitionError)
        # Other partitions (__consumer_offsets) moved off the stopped broker too: they
        # move back, until nothing is left to move.
        eventually(lambda: admin.elect_preferred_leaders() == 0, "every preferred leader")
    shown = tidelog(
        "leaders", "elect", "--preferred", "--topic", topic, "--bootstrap", cluster.bootstrap
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split()[-3:] == [topic, "0", "ELECTION_NOT_NEEDED"]
    assert "0 partition(s) moved" in shown.stderr


def test_an_unclean_election_brings_an_offline_partition_back(cluster: LocalCluster) -> None:
    topic = unique("unclean")
    first = create(cluster, topic, 2)
    leader, follower = first.leader, next(r for r in first.replicas if r != first.leader)
    assert elect(cluster, ElectionType.UNCLEAN, topic) == (
        confluent_kafka.KafkaError.ELECTION_NOT_NEEDED
    )

    # The follower stops: out of the ISR. Then the leader, the last in-sync replica: the
    # partition is offline, and the follower coming back cannot lead it cleanly.
    cluster.kill(follower, signal.SIGTERM)
    eventually(lambda: partition(cluster, topic).isr == (leader,), "the ISR shrunk to the leader")
    cluster.kill(leader, signal.SIGTERM)
    cluster.start_broker(follower)
    eventually(lambda: partition(cluster, topic).leader == -1, "the partition offline")
    time.sleep(1)
    assert partition(cluster, topic).leader == -1  # no clean election makes it a leader

    assert elect(cluster, ElectionType.UNCLEAN, topic) is None
    eventually(lambda: partition(cluster, topic).leader == follower, "the unclean leader")
    cluster.start_broker(leader)
