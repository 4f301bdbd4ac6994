"""Leaders as Kafka clients find them, in a cluster of three broker processes with Kafka
listeners (``LocalCluster(kafka=True)``, racks r1-r3):

- KIP-951 leader discovery: a Produce v10 or Fetch v16 sent to a broker that does not
  lead the partition, or a Fetch naming a stale leader epoch, is answered with the
  partition's real leader and epoch and that leader's endpoint (``node_endpoints``);
- KIP-320 fencing of the client's ``current_leader_epoch`` on Fetch, ListOffsets and
  OffsetForLeaderEpoch: older than the leader's ``FENCED_LEADER_EPOCH`` (74), newer
  ``UNKNOWN_LEADER_EPOCH`` (75); ListOffsets names the epoch that wrote the offset;
- a confluent-kafka idempotent producer and an aiokafka consumer group go on across a
  leader move (the leader's controlled shutdown and restart), losing nothing
  acknowledged;
- Debian's kcat lists the cluster, produces and consumes in a group through it.

Leaders move by a controlled shutdown (SIGTERM) and a restart; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import aiokafka
import confluent_kafka
import pytest
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.kafka import raw
from tests.kafka.conftest import unique
from tests.kafka.test_cluster import create_topic, kafka_metadata
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.broker.kafka.kip848 import topic_id
from tidelog.storage.records import BatchBuilder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

TIMEOUT_S = 30.0
_NOT_LEADER_OR_FOLLOWER = 6
_FENCED_LEADER_EPOCH = 74
_UNKNOWN_LEADER_EPOCH = 75
_RACKS = {1: "r1", 2: "r2", 3: "r3"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    broker_settings = {b: {"broker.rack": rack} for b, rack in _RACKS.items()}
    with LocalCluster(
        brokers=3, kafka=True, session_timeout_ms=3_000, broker_settings=broker_settings
    ) as running:
        yield running


def _call(cluster: LocalCluster, broker_id: int, request: Any, response_class: Any) -> Any:
    host, port = cluster.kafka_address(broker_id).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        answer = raw.call(sock, request, "test-leaders")
    assert answer is not None, "the broker closed the connection"
    return response_class[request.version].decode(answer, header=True)


def _leader(cluster: LocalCluster, topic: str, partition: int = 0) -> tuple[int, int]:
    """(leader, leader epoch) of ``topic``-``partition`` in broker 1's Metadata."""
    (found,) = kafka_metadata(cluster, 1, topic).topics
    p = found.partitions[partition]
    return p.leader_id, p.leader_epoch


def _endpoint(cluster: LocalCluster, broker_id: int) -> tuple[int, str, int, str]:
    host, port = cluster.kafka_address(broker_id).rsplit(":", 1)
    return broker_id, host, int(port), _RACKS[broker_id]


def _nodes(answer: Any) -> list[tuple[int, str, int, str | None]]:
    return [(n.node_id, n.host, n.port, n.rack) for n in answer.node_endpoints]


def _produce_v10(topic: str) -> Any:
    builder = BatchBuilder()
    builder.append(int(time.time() * 1000), None, b"v")
    return ProduceRequest[10](
        transactional_id=None,
        acks=-1,
        timeout_ms=5_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(
                        index=0, records=builder.build()
                    )
                ],
            )
        ],
    )


def _fetch(topic: str, current_leader_epoch: int, version: int = 16) -> Any:
    """Fetch ``version`` of partition 0 from offset 0 (by topic id from v13 on)."""
    named: dict[str, Any] = {"topic_id": topic_id(topic)} if version >= 13 else {"topic": topic}
    return FetchRequest[version](
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            FetchRequest.FetchTopic(
                **named,
                partitions=[
                    FetchRequest.FetchTopic.FetchPartition(
                        partition=0,
                        current_leader_epoch=current_leader_epoch,
                        fetch_offset=0,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    )
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )


def _fetched(cluster: LocalCluster, broker_id: int, request: Any) -> tuple[Any, Any]:
    """(the partition's answer, the whole answer)."""
    answer = _call(cluster, broker_id, request, FetchResponse)
    ((found,),) = [t.partitions for t in answer.responses]
    return found, answer


def _list_offsets(
    cluster: LocalCluster,
    broker_id: int,
    topic: str,
    current_leader_epoch: int,
    timestamp: int = -1,
) -> Any:
    """ListOffsets v7 of partition 0 (-1 latest, -2 earliest, or a time): its answer."""
    request = ListOffsetsRequest[7](
        replica_id=-1,
        isolation_level=0,
        topics=[
            ListOffsetsRequest.ListOffsetsTopic(
                name=topic,
                partitions=[
                    ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=0,
                        current_leader_epoch=current_leader_epoch,
                        timestamp=timestamp,
                    )
                ],
            )
        ],
    )
    answer = _call(cluster, broker_id, request, ListOffsetsResponse)
    return answer.topics[0].partitions[0]


def _list_offsets_error(
    cluster: LocalCluster, broker_id: int, topic: str, current_leader_epoch: int
) -> int:
    return int(_list_offsets(cluster, broker_id, topic, current_leader_epoch).error_code)


def _epoch_end_error(
    cluster: LocalCluster, broker_id: int, topic: str, current_leader_epoch: int
) -> int:
    request = raw.offset_for_leader_epoch_request(
        topic, {0: 0}, current_leader_epoch=current_leader_epoch
    )
    answer = _call(cluster, broker_id, request, OffsetForLeaderEpochResponse)
    return int(answer.topics[0].partitions[0].error_code)


def _move_leader(cluster: LocalCluster, topic: str) -> tuple[int, int, int]:
    """Move ``topic``-0's leadership by its leader's controlled shutdown, then restart
    that broker; (old leader, new leader, new epoch)."""
    old, old_epoch = _leader(cluster, topic)
    cluster.kill(old, signal.SIGTERM)
    survivor = next(b for b in cluster.broker_ids if b != old)

    def moved() -> bool:
        (found,) = kafka_metadata(cluster, survivor, topic).topics
        p = found.partitions[0]
        return p.leader_id not in (old, -1) and p.leader_epoch > old_epoch

    eventually(moved, TIMEOUT_S)
    cluster.start_broker(old)
    cluster.wait_converged()
    (found,) = kafka_metadata(cluster, old, topic).topics
    new, new_epoch = found.partitions[0].leader_id, found.partitions[0].leader_epoch
    return old, new, new_epoch


def test_wrong_broker_and_stale_epochs_get_the_real_leader_and_are_fenced(
    cluster: LocalCluster,
) -> None:
    topic = unique("hints")
    create_topic(cluster, topic, 1, 3)
    leader, epoch = _leader(cluster, topic)
    other = next(b for b in cluster.broker_ids if b != leader)

    # KIP-951 on a broker that does not lead: Produce v10 and Fetch v16.
    produced = _call(cluster, other, _produce_v10(topic), ProduceResponse)
    (part,) = produced.responses[0].partition_responses
    assert part.error_code == _NOT_LEADER_OR_FOLLOWER
    assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (leader, epoch)
    assert _nodes(produced) == [_endpoint(cluster, leader)]
    found, answer = _fetched(cluster, other, _fetch(topic, epoch))
    assert found.error_code == _NOT_LEADER_OR_FOLLOWER
    assert (found.current_leader.leader_id, found.current_leader.leader_epoch) == (leader, epoch)
    assert _nodes(answer) == [_endpoint(cluster, leader)]
    # The leader answers a produce without any hint.
    produced = _call(cluster, leader, _produce_v10(topic), ProduceResponse)
    (part,) = produced.responses[0].partition_responses
    assert part.error_code == 0
    assert _nodes(produced) == []

    # A newer epoch than the leader's: UNKNOWN_LEADER_EPOCH (no hint: the client is ahead).
    for version in (12, 16):
        found, answer = _fetched(cluster, leader, _fetch(topic, epoch + 1, version))
        assert found.error_code == _UNKNOWN_LEADER_EPOCH
    assert _nodes(answer) == []
    assert _list_offsets_error(cluster, leader, topic, epoch + 1) == _UNKNOWN_LEADER_EPOCH
    assert _epoch_end_error(cluster, leader, topic, epoch + 1) == _UNKNOWN_LEADER_EPOCH

    old, new, new_epoch = _move_leader(cluster, topic)
    assert new != old
    assert new_epoch > epoch

    # The client's epoch is now stale: FENCED_LEADER_EPOCH, Fetch v16 with the leader.
    for version in (12, 16):
        found, answer = _fetched(cluster, new, _fetch(topic, epoch, version))
        assert found.error_code == _FENCED_LEADER_EPOCH
    assert (found.current_leader.leader_id, found.current_leader.leader_epoch) == (new, new_epoch)
    assert _nodes(answer) == [_endpoint(cluster, new)]
    assert _list_offsets_error(cluster, new, topic, epoch) == _FENCED_LEADER_EPOCH
    assert _epoch_end_error(cluster, new, topic, epoch) == _FENCED_LEADER_EPOCH
    # The current epoch is served; the old leader, a follower now, names the new one.
    found, _ = _fetched(cluster, new, _fetch(topic, new_epoch))
    assert (found.error_code, found.high_watermark) == (0, 1)
    assert _list_offsets_error(cluster, new, topic, new_epoch) == 0
    # ListOffsets v4+ names the epoch that wrote the offset (latest: the leader's now).
    latest = _list_offsets(cluster, new, topic, new_epoch)
    assert (latest.offset, latest.leader_epoch) == (1, new_epoch)
    for timestamp in (-2, 0):  # earliest; the first record at or after time 0
        found = _list_offsets(cluster, new, topic, new_epoch, timestamp)
        assert (found.error_code, found.offset, found.leader_epoch) == (0, 0, epoch)
    assert _epoch_end_error(cluster, new, topic, new_epoch) == 0
    found, answer = _fetched(cluster, old, _fetch(topic, new_epoch))
    assert found.error_code == _NOT_LEADER_OR_FOLLOWER
    assert found.current_leader.leader_id == new
    assert _nodes(answer) == [_endpoint(cluster, new)]


def test_confluent_producer_and_aiokafka_group_go_on_across_a_leader_move(
    cluster: LocalCluster,
) -> None:
    topic = unique("moving")
    group = unique("aio-group")
    create_topic(cluster, topic, 1, 3)
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "message.timeout.ms": 60_000,
        }
    )
    acknowledged: list[bytes] = []
    failed: list[Any] = []

    def delivered(err: Any, message: Any) -> None:
        if err is None:
            acknowledged.append(message.value())
        else:
            failed.append(err)

    def produce(first: int, count: int) -> None:
        for i in range(first, first + count):
            producer.produce(topic, value=b"%06d" % i, on_delivery=delivered)
            producer.poll(0)
            time.sleep(0.005)  # spread over the move
        assert producer.flush(60) == 0, "records left undelivered"

    read: list[bytes] = []
    stop = threading.Event()

    async def consume() -> None:
        consumer = aiokafka.AIOKafkaConsumer(
            topic,
            bootstrap_servers=cluster.kafka_bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=True,
            auto_commit_interval_ms=200,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=500,
        )
        await consumer.start()
        try:
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=200)
                for records in batches.values():
                    read.extend(r.value for r in records)
        finally:
            await consumer.stop()

    def read_at_least(count: int) -> bool:
        return len(set(read)) >= count

    # The group consumes on a thread of its own; brokers are (re)started from this one:
    # a broker dies with the thread that started it (``dying_with_parent``).
    consuming = threading.Thread(target=asyncio.run, args=(consume(),), daemon=True)
    consuming.start()
    try:
        produce(0, 100)
        eventually(lambda: read_at_least(100), TIMEOUT_S)
        # Records produced while the leader moves: the producer follows it.
        producing = threading.Thread(target=produce, args=(100, 300), daemon=True)
        producing.start()
        _move_leader(cluster, topic)
        producing.join(TIMEOUT_S * 2)
        assert not producing.is_alive(), "the producer did not finish"
        produce(400, 100)
        eventually(lambda: read_at_least(500), TIMEOUT_S)
    finally:
        stop.set()
        consuming.join(TIMEOUT_S)
    assert not failed, failed
    assert len(acknowledged) == 500
    # Idempotence and one partition: every acknowledged record, in order (a record read
    # again after the group's coordinator moved is the same record).
    assert sorted(acknowledged) == [b"%06d" % i for i in range(500)]
    assert list(dict.fromkeys(read)) == [b"%06d" % i for i in range(500)]


def _kcat(bootstrap: str, *args: str, stdin: str | None = None) -> str:
    path = shutil.which("kcat")
    assert path is not None, "kcat is not installed: apt-get install kcat (make venv does)"
    done = subprocess.run(
        [path, "-b", bootstrap, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kcat_lists_produces_and_consumes_in_a_group_across_the_cluster(
    cluster: LocalCluster,
) -> None:
    """Debian's kcat (librdkafka 2.0.2) bootstrapped from one broker: every broker and
    leader listed (librdkafka 2.0.2's metadata has no racks to show), records keyed onto
    partitions led by three brokers, and read back in a group."""
    topic = unique("kcat-cluster")
    create_topic(cluster, topic, 3, 3)
    listed = json.loads(_kcat(cluster.kafka_address(2), "-L", "-J", "-t", topic))
    assert sorted((b["id"], b["name"]) for b in listed["brokers"]) == [
        (b, cluster.kafka_address(b)) for b in cluster.broker_ids
    ]
    (described,) = listed["topics"]
    (found,) = kafka_metadata(cluster, 1, topic).topics
    assert {p["partition"]: p["leader"] for p in described["partitions"]} == {
        p.partition_index: p.leader_id for p in found.partitions
    }
    lines = [f"key{i}:value {i}" for i in range(30)]
    _kcat(cluster.kafka_address(3), "-P", "-t", topic, "-K", ":", stdin="\n".join(lines) + "\n")
    group = unique("kcat-group")
    out = _kcat(
        cluster.kafka_address(1),
        "-G",
        group,
        topic,
        "-o",
        "beginning",
        "-e",
        "-X",
        "auto.offset.reset=earliest",
        "-f",
        "%k:%s\n",
    )
    assert sorted(out.splitlines()) == sorted(lines)
