"""Failure scenarios under continuous load, judged by the history checker (``workload``).

Each scenario runs a ``Workload`` (an idempotent ``acks="all"`` producer, a group
consumer committing, a committed-offset monitor) against a three-broker cluster on a real
ZooKeeper, breaks the cluster while the load runs, lets it recover, and checks: no
acknowledged record lost, none stored twice, each key in order, nothing read above the
high watermark, committed offsets never backwards (``docs/replication.md``). The leader
cut off from ZooKeeper is in ``test_replication_processes``.
"""

from __future__ import annotations

import itertools
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.broker.cluster.workload import Workload
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.storage.errors import InvalidReplicationFactorError, TidelogError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
PARTITIONS = 3
_topics = itertools.count()
# The broker log lines a leaderless moment is explained by.
_LEADERSHIP = re.compile(r"controlled shutdown|offline|ISR|elect|leader at|registered|diverged")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {
        "replica.lag.time.max.ms": 3_000,
        "replica.fetch.backoff.ms": 200,
        "offsets.topic.num.partitions": 3,
    }
    with LocalCluster(brokers=3, session_timeout_ms=3_000, settings=settings) as running:
        yield running


def fully_replicated(cluster: LocalCluster, topic: str) -> bool:
    with AdminClient(cluster.bootstrap, request_timeout_ms=10_000) as admin:
        return all(len(p.isr) == 3 for p in admin.describe_topic(topic).partitions)


def new_topic(cluster: LocalCluster) -> str:
    name = f"checked-{next(_topics)}"
    for broker in cluster.broker_ids:
        if not cluster.is_running(broker):
            cluster.start_broker(broker)
    with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
        eventually(lambda: len(admin.describe_cluster().brokers) == 3, 60)

        def created() -> bool:
            # A restarted broker may be in one broker's view before the controller's.
            try:
                admin.create_topic(
                    name, PARTITIONS, {"min.insync.replicas": "2"}, replication_factor=3
                )
            except InvalidReplicationFactorError:
                return False
            return True

        eventually(created, 60)
    eventually(lambda: fully_replicated(cluster, name), 60)
    return name


def leader_of(cluster: LocalCluster, topic: str, partition: int) -> int:
    with AdminClient(cluster.bootstrap, request_timeout_ms=10_000) as admin:
        return admin.describe_topic(topic).partitions[partition].leader


def controller_of(cluster: LocalCluster) -> int:
    live = ",".join(cluster.address(b) for b in cluster.broker_ids if cluster.is_running(b))
    with AdminClient(live, request_timeout_ms=10_000) as admin:
        return admin.describe_cluster().controller_id


def run_scenario(cluster: LocalCluster, breaking: Callable[[str], None]) -> dict[str, int]:
    topic = new_topic(cluster)
    workload = Workload(cluster.bootstrap, topic, PARTITIONS).start()
    try:
        workload.wait_for_acks(200)
        breaking(topic)
        for broker in cluster.broker_ids:
            if not cluster.is_running(broker):
                cluster.start_broker(broker)
        workload.wait_for_acks(200, timeout_s=90)
        eventually(lambda: fully_replicated(cluster, topic), 90)
        workload.wait_for_acks(100)
    finally:
        workload.stop()
    return workload.check()


def test_sigkill_of_a_leader_under_load(cluster: LocalCluster) -> None:
    def breaking(topic: str) -> None:
        cluster.kill(leader_of(cluster, topic, 0))

    counts = run_scenario(cluster, breaking)
    assert counts["acknowledged"] >= 500


def test_sigkill_of_the_controller_under_load(cluster: LocalCluster) -> None:
    def breaking(_topic: str) -> None:
        victim = controller_of(cluster)
        cluster.kill(victim)
        eventually(lambda: controller_of(cluster) not in (-1, victim), 30)

    counts = run_scenario(cluster, breaking)
    assert counts["acknowledged"] >= 500


def test_all_brokers_restarted_at_once(cluster: LocalCluster) -> None:
    """Every broker SIGKILLed, then all started together: no controller saw them die, so
    each must wait for the new controller's grant (a new epoch) before leading; nothing
    acknowledged is lost and no committed offset goes backwards."""

    def breaking(_topic: str) -> None:
        for broker in cluster.broker_ids:
            cluster.kill(broker)
        for broker in cluster.broker_ids:
            cluster.start_broker(broker, wait=False)
        for broker in cluster.broker_ids:
            cluster.wait_ready(broker)

    counts = run_scenario(cluster, breaking)
    assert counts["acknowledged"] >= 500


def test_rolling_restart_with_controlled_shutdown(cluster: LocalCluster) -> None:
    """SIGTERM each broker in turn (controlled shutdown moves its leaderships first): no
    partition is ever offline, and nothing is lost."""
    offline: list[str] = []

    def breaking(topic: str) -> None:
        stop = False

        def watch() -> None:
            while not stop:
                try:
                    with AdminClient(cluster.bootstrap, request_timeout_ms=5_000) as admin:
                        for p in admin.describe_topic(topic).partitions:
                            if p.leader < 0:
                                offline.append(
                                    f"{topic}-{p.partition} at {time.monotonic():.1f} "
                                    f"(epoch {p.leader_epoch}, isr {list(p.isr)})"
                                )
                except TidelogError:
                    pass
                time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            for broker in cluster.broker_ids:
                cluster.kill(broker, signal.SIGTERM)
                cluster.start_broker(broker)
                eventually(lambda: fully_replicated(cluster, topic), 90)
        finally:
            stop = True
            watcher.join(10)

    counts = run_scenario(cluster, breaking)
    assert counts["acknowledged"] >= 500
    assert not offline, (
        f"partitions went offline during the rolling restart: {offline[:5]}\n"
        + "\n".join(
            f"--- broker {broker}:\n"
            + "\n".join(
                line for line in cluster.output(broker).splitlines() if _LEADERSHIP.search(line)
            )[-4000:]
            for broker in cluster.broker_ids
        )
    )


def read_partition(bootstrap: str, tp: TopicPartition, count: int) -> list[bytes]:
    values: list[bytes] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        deadline = time.monotonic() + 30
        while len(values) < count and time.monotonic() < deadline:
            values += [r.value or b"" for r in consumer.poll(timeout_ms=200)]
    return values


def test_a_restarted_broker_truncates_its_diverged_log(cluster: LocalCluster) -> None:
    """The leader takes acks=1 writes its followers never get (they are paused), dies;
    a follower is elected (it was still in the ISR); the old leader comes back as a
    follower and must cut the records only it had, ending with the new leader's log."""
    topic = new_topic(cluster)
    tp = TopicPartition(topic, 0)
    old = leader_of(cluster, topic, 0)
    followers = [b for b in cluster.broker_ids if b != old]
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(20):
            producer.send(topic, b"shared-%d" % i, partition=0).result(timeout=30)
    for broker in followers:
        cluster.kill(broker, signal.SIGSTOP)
    try:
        # Their fetches parked on the leader time out (replica.fetch.wait.max.ms) and no
        # new one comes: the next records reach no follower.
        time.sleep(1.5)
        with Producer(cluster.address(old), acks=1, enable_idempotence=False) as producer:
            for i in range(5):
                producer.send(topic, b"orphan-%d" % i, partition=0).result(timeout=30)
        cluster.kill(old)  # SIGKILL before the followers could leave the ISR
    finally:
        for broker in followers:
            cluster.kill(broker, signal.SIGCONT)
    live = ",".join(cluster.address(b) for b in followers)
    with AdminClient(live, request_timeout_ms=20_000) as admin:
        eventually(lambda: admin.describe_topic(topic).partitions[0].leader in followers, 60)
    with Producer(live, acks="all") as producer:
        for i in range(10):
            producer.send(topic, b"after-%d" % i, partition=0).result(timeout=60)
    expected = [b"shared-%d" % i for i in range(20)] + [b"after-%d" % i for i in range(10)]
    assert read_partition(live, tp, 30) == expected  # the orphans were never replicated
    cluster.start_broker(old)
    eventually(lambda: fully_replicated(cluster, topic), 90)
    assert "diverged" in cluster.output(old)
    # The old leader's own log, read with it as the only live broker (leader again).
    for broker in followers:
        cluster.kill(broker)
    try:
        with AdminClient(cluster.address(old), request_timeout_ms=20_000) as admin:
            eventually(lambda: admin.describe_topic(topic).partitions[0].leader == old, 60)
        assert read_partition(cluster.address(old), tp, 30) == expected
    finally:
        for broker in followers:
            cluster.start_broker(broker, wait=False)
        for broker in followers:
            cluster.wait_ready(broker)
