"""Replication between real broker processes: followers copy, the ISR and high watermark
move, ``acks=all`` waits for the ISR, and a killed leader loses no acknowledged record.

Three brokers and a real ZooKeeper (``LocalCluster``); every client is the real client
library with one bootstrap broker.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.broker.conftest import make_batch
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.types import ConsumerRecord
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import InvalidReplicationFactorError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {
        "replica.lag.time.max.ms": 2_000,
        "replica.fetch.backoff.ms": 200,
        "log.retention.check.interval.ms": 500,
    }
    with LocalCluster(brokers=3, session_timeout_ms=3_000, settings=settings) as running:
        yield running


def read_all(bootstrap: str, topic: str, partitions: int, count: int) -> list[ConsumerRecord]:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    records: list[ConsumerRecord] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        deadline = time.monotonic() + 30
        while len(records) < count and time.monotonic() < deadline:
            records += consumer.poll(timeout_ms=200)
    return records


def create_replicated(admin: AdminClient, name: str, partitions: int, **config: str) -> None:
    eventually(lambda: len(admin.describe_cluster().brokers) == 3)

    def created() -> bool:
        # A broker back from an earlier test may be listed by one broker's view before
        # the controller counts it alive: the controller refuses three replicas until then.
        try:
            admin.create_topic(name, partitions, replication_factor=3, config=config or None)
        except InvalidReplicationFactorError:
            return False
        return True

    eventually(created)
    eventually(
        lambda: all(len(p.isr) == 3 for p in admin.describe_topic(name).partitions),
    )


def test_followers_copy_the_leaders_and_acks_all_waits_for_them(cluster: LocalCluster) -> None:
    one = cluster.address(1)
    with AdminClient(one, request_timeout_ms=20_000) as admin:
        create_replicated(admin, "copied", 3, **{"min.insync.replicas": "2"})
        described = admin.describe_topic("copied").partitions
        assert all(sorted(p.replicas) == [1, 2, 3] for p in described)
        assert {p.leader for p in described} == {1, 2, 3}  # leaders spread
    with Producer(one, acks="all", linger_ms=5) as producer:
        futures = [producer.send("copied", b"%d" % i, partition=i % 3) for i in range(300)]
        for future in futures:
            future.result(timeout=30)
    records = read_all(one, "copied", 3, 300)
    assert sorted(int(r.value or b"") for r in records) == list(range(300))
    # Every replica's log holds the same records: each broker, as leader in turn, serves
    # them after the others are killed is the failover test; here, the high watermark of
    # every partition reached the log end on the leader, which needs every ISR member.
    with Consumer(one) as consumer:
        tps = [TopicPartition("copied", p) for p in range(3)]
        assert consumer.end_offsets(tps) == dict.fromkeys(tps, 100)


def test_a_killed_leader_loses_no_acknowledged_record(cluster: LocalCluster) -> None:
    one = cluster.address(1)
    with AdminClient(one, request_timeout_ms=20_000) as admin:
        create_replicated(admin, "survive", 1, **{"min.insync.replicas": "2"})
        leader = admin.describe_topic("survive").partitions[0].leader
    bootstrap = ",".join(cluster.address(b) for b in cluster.broker_ids if b != leader)
    acknowledged: list[int] = []
    with Producer(bootstrap, acks="all", linger_ms=2, delivery_timeout_ms=60_000) as producer:
        for i in range(200):
            producer.send("survive", b"%d" % i).result(timeout=30)
            acknowledged.append(i)
        cluster.kill(leader)  # SIGKILL: no controlled shutdown
        futures = {i: producer.send("survive", b"%d" % i) for i in range(200, 400)}
        for i, future in futures.items():
            future.result(timeout=60)
            acknowledged.append(i)
    try:
        with AdminClient(bootstrap, request_timeout_ms=20_000) as admin:
            new_leader = admin.describe_topic("survive").partitions[0].leader
        assert new_leader not in (leader, -1)
        records = read_all(bootstrap, "survive", 1, 400)
        values = [int(r.value or b"") for r in records]
        assert sorted(set(values)) == acknowledged  # nothing acknowledged is lost
        # The new leader copied the batches' sent and received times with them.
        assert all(r.received_timestamp_ms is not None for r in records)
        assert all(r.sent_timestamp_ms is not None for r in records)
        assert values == sorted(values)  # in order
        assert len(values) == len(set(values))  # idempotent: no duplicates
    finally:
        cluster.start_broker(leader)
    # The old leader comes back as a follower and catches up.
    with AdminClient(one, request_timeout_ms=20_000) as admin:
        eventually(lambda: len(admin.describe_topic("survive").partitions[0].isr) == 3, 60)


def test_a_leader_cut_off_from_zookeeper_stops_acknowledging(cluster: LocalCluster) -> None:
    one = cluster.address(1)
    with AdminClient(one, request_timeout_ms=20_000) as admin:
        create_replicated(admin, "isolated", 1, **{"min.insync.replicas": "2"})
        leader = admin.describe_topic("isolated").partitions[0].leader
    others = [b for b in cluster.broker_ids if b != leader]
    bootstrap = ",".join(cluster.address(b) for b in others)
    acknowledged: list[int] = []
    with Producer(bootstrap, acks="all", linger_ms=2, delivery_timeout_ms=90_000) as producer:
        for i in range(100):
            producer.send("isolated", b"%d" % i).result(timeout=30)
            acknowledged.append(i)
        cluster.cut_from_zookeeper(leader)
        cut_at = time.monotonic()
        futures = {i: producer.send("isolated", b"%d" % i) for i in range(100, 300)}
        # A session timeout (3 s) and a little later, the old leader has given up its
        # leadership: even an acks=1 write straight to it is refused.
        time.sleep(max(0.0, cut_at + 3.0 + 2.0 - time.monotonic()))
        stub = pb_grpc.BrokerStub(grpc.insecure_channel(cluster.address(leader)))
        answer = stub.Produce(
            pb.ProduceRequest(
                acks=1,
                timeout_ms=5_000,
                topics=[
                    pb.ProduceTopicData(
                        topic="isolated",
                        partitions=[
                            pb.ProducePartitionData(partition=0, records=make_batch([b"x"]))
                        ],
                    )
                ],
            ),
            timeout=10,
        )
        assert answer.results[0].error_code in ("NOT_LEADER_OR_FOLLOWER", "LEADER_NOT_AVAILABLE")
        for i, future in futures.items():
            future.result(timeout=90)
            acknowledged.append(i)
    cluster.heal_zookeeper(leader)
    values = [int(r.value or b"") for r in read_all(bootstrap, "isolated", 1, 300)]
    assert sorted(set(values)) == acknowledged
    assert len(values) == len(set(values))
    with AdminClient(one, request_timeout_ms=20_000) as admin:
        eventually(lambda: len(admin.describe_topic("isolated").partitions[0].isr) == 3, 60)


def tidelog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidelog.client.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_paused_follower_leaves_the_isr_and_preferred_leaders_come_back(
    cluster: LocalCluster,
) -> None:
    one = cluster.address(1)
    with AdminClient(one, request_timeout_ms=20_000) as admin:
        create_replicated(admin, "paused", 3)
        preferred = {p.partition: p.replicas[0] for p in admin.describe_topic("paused").partitions}
        follower = 3
        led_by_follower = [p for p, b in preferred.items() if b == follower]
        cluster.kill(follower, signal.SIGSTOP)
        try:
            with Producer(one, acks=1) as producer:
                for i in range(30):  # give the followers something to fall behind on
                    producer.send("paused", b"%d" % i, partition=i % 3)
            # Its partitions elsewhere lose it from the ISR after replica.lag.time.max.ms
            # (2 s); the ones it led get a new leader after its session timeout (3 s).
            eventually(
                lambda: all(
                    follower not in p.isr for p in admin.describe_topic("paused").partitions
                ),
                30,
            )

            def listed() -> bool:
                # Each broker's view catches up on its own: ask until the one asked has.
                listing = tidelog("topics", "describe", "--under-replicated", "--bootstrap", one)
                assert listing.returncode == 0, listing.stderr
                rows = " ".join(listing.stdout.split()) + " "
                return all(f"paused {p} " in rows for p in range(3))

            eventually(listed, 30)
        finally:
            cluster.kill(follower, signal.SIGCONT)
        # Resumed: its session may have expired (it registers again), it catches up and
        # rejoins every ISR.
        eventually(
            lambda: all(len(p.isr) == 3 for p in admin.describe_topic("paused").partitions), 60
        )
        eventually(
            lambda: tidelog(
                "topics", "describe", "--under-replicated", "--bootstrap", one
            ).stdout.startswith("No under-replicated"),
            30,
        )
        if led_by_follower:
            elected = tidelog("leaders", "elect", "--preferred", "--bootstrap", one)
            assert elected.returncode == 0, elected.stderr
        eventually(
            lambda: (
                {p.partition: p.leader for p in admin.describe_topic("paused").partitions}
                == preferred
            ),
            30,
        )
    values = sorted(int(r.value or b"") for r in read_all(one, "paused", 3, 30))
    assert values == list(range(30))


def test_a_follower_left_below_the_leaders_log_start_starts_over_there(
    cluster: LocalCluster,
) -> None:
    """A paused follower leaves the ISR; retention on the leader then deletes everything
    it had not fetched. Resumed, it cannot continue its log: it drops it, starts at the
    leader's log start, catches up and rejoins the ISR; elected later, it serves exactly
    the leader's records from there on."""
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        create_replicated(
            admin, "behind", 1, **{"segment.bytes": "1024", "retention.bytes": "2048"}
        )
        leader = admin.describe_topic("behind").partitions[0].leader
        follower, other = (b for b in cluster.broker_ids if b != leader)
        cluster.kill(follower, signal.SIGSTOP)
        try:
            with Producer(cluster.address(leader), acks="all", linger_ms=0) as producer:
                for i in range(200):  # one batch each: many small segments
                    value = b"%d" % i + b"." * 60
                    producer.send("behind", value, partition=0).result(timeout=30)
            # Asked of the leader: a call routed to the stopped broker would wait for
            # its whole request timeout.
            with AdminClient(cluster.address(leader), request_timeout_ms=5_000) as direct:
                eventually(
                    lambda: direct.describe_topic("behind").partitions[0].log_start_offset > 0,
                    30,
                )
        finally:
            cluster.kill(follower, signal.SIGCONT)
        # Paused past its ZooKeeper session, the follower registers again on resuming; the
        # controller that took over may have read the live brokers before that and the ISR
        # after the leader re-added it, and then takes it out as dead (a new leader epoch,
        # as Kafka's ZooKeeper-era controller does for a broker it saw fail). Wait until
        # every broker sees every other, then for a full ISR that stays put at one leader
        # epoch for longer than the controller's events take.
        cluster.wait_converged()
        # The leader's answer: the resumed broker's own view is stale for a moment.
        with AdminClient(cluster.address(leader), request_timeout_ms=5_000) as direct:

            def full_isr_held() -> bool:
                first = direct.describe_topic("behind").partitions[0]
                if len(first.isr) != 3:
                    return False
                time.sleep(3)
                again = direct.describe_topic("behind").partitions[0]
                return len(again.isr) == 3 and again.leader_epoch == first.leader_epoch

            eventually(full_isr_held, 60)
            start = direct.describe_topic("behind").partitions[0].log_start_offset
    # The follower must now hold the records itself: make it the only one left to lead.
    cluster.kill(leader)
    cluster.kill(other)
    try:
        with AdminClient(cluster.address(follower), request_timeout_ms=20_000) as admin:
            eventually(lambda: admin.describe_topic("behind").partitions[0].leader == follower, 60)
            kept = admin.describe_topic("behind").partitions[0]
        assert kept.log_end_offset == 200
        assert kept.log_start_offset >= start > 0
        with Consumer(cluster.address(follower), auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("behind", 0)])
            records: list[ConsumerRecord] = []
            deadline = time.monotonic() + 30
            while (not records or records[-1].offset < 199) and time.monotonic() < deadline:
                records += consumer.poll(timeout_ms=200)
        assert [r.offset for r in records] == list(range(kept.log_start_offset, 200))
        assert all((r.value or b"").split(b".")[0] == b"%d" % r.offset for r in records)
    finally:
        cluster.start_broker(leader)
        cluster.start_broker(other)


def test_requests_naming_another_leader_epoch_are_fenced(cluster: LocalCluster) -> None:
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        create_replicated(admin, "fenced", 1)
        first = admin.describe_topic("fenced").partitions[0]
        # A new leader (so that epoch - 1 is a real, older epoch), seen in the metadata
        # of a broker that stays up.
        cluster.kill(first.leader)
        live = next(b for b in cluster.broker_ids if b != first.leader)
        meta_stub = pb_grpc.BrokerStub(grpc.insecure_channel(cluster.address(live)))

        def placed() -> pb.PartitionMetadata | None:
            """The partition as the live broker sees it now, or None while it knows none."""
            try:
                answer = meta_stub.Metadata(pb.MetadataRequest(topics=["fenced"]), timeout=10)
            except grpc.RpcError:
                return None
            if not answer.topics or not answer.topics[0].partitions:
                return None
            return answer.topics[0].partitions[0]

        def moved() -> bool:
            now = placed()
            return now is not None and now.leader_epoch > 0 and now.leader >= 0

        try:
            eventually(moved, 60)
        finally:
            cluster.start_broker(first.leader)
        eventually(moved, 30)
        described = placed()
        assert described is not None
    stub = pb_grpc.BrokerStub(grpc.insecure_channel(cluster.address(described.leader)))

    def produce(epoch: int) -> str:
        part = pb.ProducePartitionData(
            # Stamped now: make_batch's default time is years old, and this module runs
            # retention every 500 ms (7 days' time retention would delete the record).
            partition=0,
            records=make_batch([b"x"], timestamp_ms=int(time.time() * 1000)),
            current_leader_epoch=epoch,
        )
        request = pb.ProduceRequest(
            acks=1, topics=[pb.ProduceTopicData(topic="fenced", partitions=[part])]
        )
        return str(stub.Produce(request, timeout=10).results[0].error_code)

    def fetch(epoch: int) -> str:
        part = pb.FetchPartition(
            topic="fenced", partition=0, fetch_offset=0, current_leader_epoch=epoch
        )
        answer = stub.Fetch(pb.FetchRequest(partitions=[part]), timeout=10)
        return str(answer.results[0].error_code)

    def list_offsets(epoch: int) -> str:
        part = pb.ListOffsetsPartition(
            topic="fenced", partition=0, timestamp_ms=-1, current_leader_epoch=epoch
        )
        answer = stub.ListOffsets(pb.ListOffsetsRequest(partitions=[part]), timeout=10)
        return str(answer.results[0].error_code)

    epoch = described.leader_epoch
    for call in (produce, fetch, list_offsets):
        assert call(epoch) == ""
        assert call(epoch - 1) == "FENCED_LEADER_EPOCH"
        assert call(epoch + 1) == "UNKNOWN_LEADER_EPOCH"
