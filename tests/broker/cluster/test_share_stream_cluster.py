"""The share fetch stream in a cluster (three brokers on a real ZooKeeper): a stream to a
broker that does not lead the partition answers that partition ``NOT_LEADER_OR_FOLLOWER``
(its acquisitions and its acknowledgements alike, as the unary ShareFetch does) and
stays open; the same member's stream to the leader is served. ``ShareConsumer`` finds the
leader from there (``tests/client/test_share_stream.py`` has the single node's cases).
"""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from tests.broker.cluster.conftest import partition_leaders, require_zookeeper
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Producer, ShareConsumer
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SETTINGS = {
    "offsets.topic.num.partitions": 3,
    "replica.fetch.backoff.ms": 200,
    "group.share.min.heartbeat.interval.ms": 100,
    "group.share.heartbeat.interval.ms": 100,
}
BROKERS = {1, 2, 3}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    with LocalCluster(brokers=3, session_timeout_ms=3_000, settings=SETTINGS) as running:
        yield running


def _request(group: str, member: str, topic: str, acks: bool) -> pb.ShareFetchRequest:
    return pb.ShareFetchRequest(
        group_id=group,
        member_id=member,
        partitions=[pb.TopicPartitions(topic=topic, partitions=[0])],
        acknowledgements=[
            pb.ShareAcknowledgement(topic=topic, partition=0, first_offset=0, last_offset=0, kind=1)
            for _ in range(1 if acks else 0)
        ],
        max_records=10,
        max_wait_ms=0,
    )


def test_a_stream_to_a_broker_that_does_not_lead_answers_not_leader(
    cluster: LocalCluster,
) -> None:
    topic, group, member = "stream-leaders", "stream-workers", str(uuid.uuid4())
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        admin.create_topic(topic, replica_assignment=[[1, 2, 3]])
        eventually(lambda: partition_leaders(admin, topic).get(0) == 1, 60)
    follower = cluster.address(2)
    channel = grpc.insecure_channel(follower)
    requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
    try:
        answers = broker_pb2_grpc.BrokerStub(channel).ShareFetchStream(iter(requests.get, None))
        for acks in (False, True):  # the stream stays open after the partition's error
            requests.put(_request(group, member, topic, acks))
            answer: pb.ShareFetchResponse = next(answers)
            behind = time.monotonic() + 30
            while answer.partitions[0].error_code == "UNKNOWN_TOPIC_OR_PARTITION":
                # Broker 2's watched metadata may not have the new topic yet (the test
                # waited for its leader through any broker): asked again on the same stream.
                assert time.monotonic() < behind, "broker 2 never learned the topic"
                time.sleep(0.1)
                requests.put(_request(group, member, topic, acks))
                answer = next(answers)
            assert [(p.topic, p.error_code) for p in answer.partitions] == [
                (topic, "NOT_LEADER_OR_FOLLOWER")
            ]
            assert not answer.partitions[0].acquired
            assert [r.error_code for r in answer.acknowledgements] == (
                ["NOT_LEADER_OR_FOLLOWER"] if acks else []
            )
        requests.put(None)
    finally:
        channel.close()
    # A consumer over the cluster is routed to the leader's stream and served there.
    with ShareConsumer(cluster.bootstrap, group, request_timeout_ms=15_000) as consumer:
        consumer.subscribe([topic])
        eventually(lambda: bool(consumer.assignment()), 60)
        consumer.poll(timeout_ms=0)  # the share partition starts at the log end
        with Producer(cluster.bootstrap, acks="all") as producer:
            producer.send(topic, value=b"job").result(timeout=30)
        got: list[int] = []
        eventually(lambda: bool(got.extend(r.offset for r in consumer.poll(200)) or got), 60)
        assert got == [0]
        assert list(consumer.commit_sync().values()) == [None]
