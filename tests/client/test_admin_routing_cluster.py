"""Group and quota administration against three real brokers and a real ZooKeeper.

The admin client is bootstrapped on one broker and the group's coordinator is another:
every group-scoped call must reach the coordinator, and lag and reset targets must come
from each partition's leader (the coordinator's own log of a partition it does not lead
is empty), for partitions led by all three brokers. Group listings and client quotas
reach every live broker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.client.test_cluster_client import create_spread_topic, eventually, read
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.grpc_connection import grpc_connections
from tidelog.client.types import QuotaEntity
from tidelog.storage.errors import GroupIdNotFoundError, GroupNotEmptyError, TidelogError

pytestmark = pytest.mark.slow

TOPIC = "administered"
PARTITIONS = 6
PER_PARTITION = 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    from tests.broker.cluster.conftest import require_zookeeper

    require_zookeeper()
    with LocalCluster(brokers=3, session_timeout_ms=3_000) as running:
        yield running


def coordinator_id(cluster: LocalCluster, group_id: str) -> int:
    """The coordinator of ``group_id`` as broker 1 answers ``FindCoordinator``."""
    connect = grpc_connections(
        client_id="test", request_timeout_ms=10_000, reconnect_backoff_max_ms=1_000
    )
    connection = connect(cluster.address(1))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                return connection.find_coordinator(group_id, timeout_ms=5_000).id
            except TidelogError:
                assert time.monotonic() < deadline, "no coordinator in time"
                time.sleep(0.2)
    finally:
        connection.close()


@pytest.fixture(scope="module")
def topic(cluster: LocalCluster) -> dict[int, int]:
    """``TOPIC`` with leaders on all three brokers and ``PER_PARTITION`` records each."""
    one = cluster.address(1)
    with AdminClient(one, request_timeout_ms=20_000) as admin:
        leaders = create_spread_topic(admin, TOPIC, PARTITIONS)
    assert set(leaders.values()) == {1, 2, 3}
    with Producer(one, acks="all") as producer:
        futures = [
            producer.send(TOPIC, b"%d" % i, partition=i % PARTITIONS)
            for i in range(PARTITIONS * PER_PARTITION)
        ]
        for future in futures:
            future.result(timeout=30)
    return leaders


def tps() -> list[TopicPartition]:
    return [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]


def test_describe_reset_and_lag_of_a_group_coordinated_by_another_broker(
    cluster: LocalCluster, topic: dict[int, int]
) -> None:
    group_id = "elsewhere"
    coordinator = coordinator_id(cluster, group_id)
    # Bootstrapped on a broker that is not the coordinator.
    bootstrap = cluster.address(next(i for i in cluster.broker_ids if i != coordinator))
    # The group's committed offsets: 4 on every partition, committed by a consumer without
    # membership.
    with Consumer(bootstrap, group_id=group_id) as consumer:
        consumer.commit(dict.fromkeys(tps(), 4))
    with AdminClient(bootstrap, request_timeout_ms=20_000) as admin:
        described = admin.describe_group(group_id)
        assert described.state == "Empty"
        lag = {p.tp: (p.committed_offset, p.log_end_offset, p.lag) for p in described.partitions}
        # Lag from each partition's leader, whichever broker it is.
        assert lag == dict.fromkeys(tps(), (4, PER_PARTITION, PER_PARTITION - 4))

        assert admin.list_group_offsets(group_id) == dict.fromkeys(tps(), 4)
        assert admin.reset_group_offsets(group_id, TOPIC, to_latest=True) == dict.fromkeys(
            tps(), PER_PARTITION
        )
        assert {p.lag for p in admin.describe_group(group_id).partitions} == {0}
        assert admin.reset_group_offsets(group_id, to_earliest=True) == dict.fromkeys(tps(), 0)
        # An offset is clamped to each partition's [log start, log end], as Kafka's tool does.
        assert admin.reset_group_offsets(group_id, tps()[:2], to_offset=7) == dict.fromkeys(
            tps()[:2], 7
        )
        assert admin.reset_group_offsets(group_id, tps()[2:3], to_offset=99) == {
            tps()[2]: PER_PARTITION
        }
        assert admin.reset_group_offsets(group_id, TOPIC, to_timestamp_ms=0) == dict.fromkeys(
            tps(), 0
        )
        future_ms = int(time.time() * 1000) + 3_600_000
        assert admin.reset_group_offsets(
            group_id, TOPIC, to_timestamp_ms=future_ms
        ) == dict.fromkeys(tps(), PER_PARTITION)
        admin.alter_group_offsets(group_id, {tps()[0]: 3, tps()[5]: 9})
        offsets = admin.list_group_offsets(group_id)
        assert offsets == {**dict.fromkeys(tps(), PER_PARTITION), tps()[0]: 3, tps()[5]: 9}
        assert admin.list_group_offsets(group_id, [tps()[5]]) == {tps()[5]: 9}

    # Every broker's admin sees the same group and the same lag, and a consumer of the
    # group starts at the offsets the admin set, on every partition.
    expected_lag = {**dict.fromkeys(tps(), 0), tps()[0]: PER_PARTITION - 3, tps()[5]: 1}
    for broker_id in cluster.broker_ids:
        with AdminClient(cluster.address(broker_id), request_timeout_ms=20_000) as admin:
            assert group_id in {g.group_id for g in admin.list_groups()}
            lags = {p.tp: p.lag for p in admin.describe_group(group_id).partitions}
            assert lags == expected_lag
    with Consumer(bootstrap, group_id=group_id, auto_offset_reset="earliest") as consumer:
        consumer.subscribe([TOPIC])
        records = read(consumer, sum(expected_lag.values()))
        assert sorted((r.partition, r.offset) for r in records) == [
            (0, o) for o in range(3, PER_PARTITION)
        ] + [(5, 9)]
        # While it has a member, the admin may not move its offsets.
        with AdminClient(bootstrap, request_timeout_ms=20_000) as admin:
            with pytest.raises(GroupNotEmptyError):
                admin.reset_group_offsets(group_id, TOPIC, to_earliest=True)
            with pytest.raises(GroupNotEmptyError):
                admin.alter_group_offsets(group_id, {tps()[0]: 0})
            assert admin.describe_group(group_id).state != "Empty"

    with AdminClient(bootstrap, request_timeout_ms=20_000) as admin:
        eventually(lambda: admin.describe_group(group_id).state == "Empty")
        admin.delete_group(group_id)
        with pytest.raises(GroupIdNotFoundError):
            admin.describe_group(group_id)
        assert group_id not in {g.group_id for g in admin.list_groups()}


def groups_of(cluster: LocalCluster, broker_id: int) -> set[str]:
    """The groups broker ``broker_id`` itself lists (it knows those it coordinates)."""
    connect = grpc_connections(
        client_id="test", request_timeout_ms=10_000, reconnect_backoff_max_ms=1_000
    )
    connection = connect(cluster.address(broker_id))
    try:
        return {g.group_id for g in connection.list_groups(timeout_ms=10_000)}
    finally:
        connection.close()


def test_list_groups_merges_every_brokers_groups(
    cluster: LocalCluster, topic: dict[int, int]
) -> None:
    # A group on every broker that coordinates some (the offsets topic's partitions are
    # placed by the controller; when it won alone they all sit on it).
    wanted: dict[int, str] = {}
    for n in range(100):
        group_id = f"listed-{n}"
        wanted.setdefault(coordinator_id(cluster, group_id), group_id)
    for group_id in wanted.values():
        with Consumer(cluster.address(2), group_id=group_id) as consumer:
            consumer.commit({tps()[0]: 1})
    per_broker = {i: groups_of(cluster, i) for i in cluster.broker_ids}
    for coordinator, group_id in wanted.items():
        assert group_id in per_broker[coordinator]
    every = set().union(*per_broker.values())
    assert set(wanted.values()) <= every
    for broker_id in cluster.broker_ids:
        with AdminClient(cluster.address(broker_id), request_timeout_ms=20_000) as admin:
            listed = {g.group_id: g for g in admin.list_groups()}
            assert set(listed) == every
            assert all(listed[g].state == "Empty" for g in wanted.values())


def test_describe_topic_takes_each_partitions_figures_from_its_leader(
    cluster: LocalCluster, topic: dict[int, int]
) -> None:
    for broker_id in cluster.broker_ids:
        with AdminClient(cluster.address(broker_id), request_timeout_ms=20_000) as admin:
            partitions = admin.describe_topic(TOPIC).partitions
        assert {p.partition: p.leader for p in partitions} == topic
        assert [(p.log_start_offset, p.high_watermark, p.log_end_offset) for p in partitions] == [
            (0, PER_PARTITION, PER_PARTITION)
        ] * PARTITIONS
        assert all(p.size_bytes > 0 and p.segments == 1 for p in partitions)


def quotas_of(cluster: LocalCluster, broker_id: int, client_id: str) -> dict[str, float]:
    """The quotas of ``client_id`` as broker ``broker_id`` alone knows them."""
    connect = grpc_connections(
        client_id="test", request_timeout_ms=10_000, reconnect_backoff_max_ms=1_000
    )
    connection = connect(cluster.address(broker_id))
    try:
        found = connection.describe_client_quotas(client_id, timeout_ms=10_000)
        return found.get(QuotaEntity(None, client_id), {})
    finally:
        connection.close()


def test_client_quotas_are_set_on_every_live_broker(cluster: LocalCluster) -> None:
    with AdminClient(cluster.address(2), request_timeout_ms=20_000) as admin:
        admin.alter_client_quotas("etl", {"producer_byte_rate": 1e6, "request_percentage": 50})
        assert admin.describe_client_quotas("etl") == {
            "etl": {"producer_byte_rate": 1e6, "request_percentage": 50.0}
        }
    for broker_id in cluster.broker_ids:
        assert quotas_of(cluster, broker_id, "etl") == {
            "producer_byte_rate": 1e6,
            "request_percentage": 50.0,
        }
    with AdminClient(cluster.address(3), request_timeout_ms=20_000) as admin:
        admin.alter_client_quotas("etl", delete=["request_percentage"])
        assert admin.describe_client_quotas() == {"etl": {"producer_byte_rate": 1e6}}
    for broker_id in cluster.broker_ids:
        assert quotas_of(cluster, broker_id, "etl") == {"producer_byte_rate": 1e6}


def test_group_calls_follow_the_coordinator_through_its_death(
    cluster: LocalCluster, topic: dict[int, int]
) -> None:
    # Last in the module: it kills and restarts a broker.
    group_id = "survivor"
    coordinator = coordinator_id(cluster, group_id)
    other = next(i for i in cluster.broker_ids if i != coordinator)
    with AdminClient(cluster.address(other), request_timeout_ms=20_000) as admin:
        admin.alter_group_offsets(group_id, {tps()[1]: 2})
        assert admin.list_group_offsets(group_id) == {tps()[1]: 2}
        cluster.kill(coordinator)
        try:
            # A call with a short timeout fails clearly (retriable) while no broker
            # coordinates the group, or already finds the new coordinator.
            started = time.monotonic()
            outcome: TidelogError | None = None
            try:
                admin.describe_group(group_id, timeout_ms=1_000)
            except TidelogError as exc:
                outcome = exc
            assert outcome is None or outcome.retriable
            assert time.monotonic() - started < 10
            # The offsets topic is replicated: another broker takes the group over with
            # its committed offsets, within one call's timeout.
            assert admin.list_group_offsets(group_id) == {tps()[1]: 2}
        finally:
            cluster.start_broker(coordinator)
        assert group_id in {g.group_id for g in admin.list_groups()}
        admin.delete_group(group_id)
