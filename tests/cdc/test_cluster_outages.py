"""The connector streaming into a 3-broker cluster whose brokers are SIGKILLed under it
(issue #30: "the broker restarted or its leader killed"; docs/cdc.md, "Defined
behaviours").

A real PostgreSQL, a ``LocalCluster`` of three broker processes on a real ZooKeeper with
RF=3 topics and ``min.insync.replicas=2``, and the connector on a thread (exactly-once,
the default ``TransactionalSink``) while a mixed insert/update/delete load runs. Two
faults, one after the other, each while the stream flows:

1. the leader of the table topic's partition is SIGKILLed: the connector goes on
   committing with the two brokers left (a new leader, two in-sync replicas), then the
   broker is restarted;
2. the transaction coordinator of the connector's transactional id (FindCoordinator key
   type 1 at the Kafka listener) is SIGKILLed: another broker takes over its
   ``__transaction_state`` partition and the connector's commits go on there; then the
   broker is restarted.

Each kill is checked to have hit what it says (the broker named leader or coordinator
just before) and the fault to have been survived (another broker takes the role, and a
PostgreSQL transaction committed after the kill becomes the connector's committed
position while the victim is still down). At the end the compacted topic equals
``SELECT *`` row for row and the read_committed change stream holds each change exactly
once, in commit order per key (``tests.cdc.checks``, the same checks as the single-node
kill and outage tests).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tests.cdc.checks import Writer, check_exactly_once, compacted_differences
from tests.cdc.test_connector import Workload, _create_table, running
from tests.cdc.topics import read_topic, wal_insert_lsn
from tests.kafka.test_transactions_cluster import coordinator_of, placement
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client.cdc import ConnectorConfig, PostgresConnector
from tidelog.client.cdc.txn_sink import transactional_id_for

pytestmark = pytest.mark.timeout(180)

NAME = "clustered"
TOPIC = f"{NAME}.public.t"
OFFSETS = f"{NAME}-offsets"
# Long enough to show commits going on without the victim; bounded by the outage budget.
PROGRESS_TIMEOUT_S = 60


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {
        "default.replication.factor": 3,
        "min.insync.replicas": 2,
        # A killed follower leaves the in-sync replicas soon (Kafka: 30 s).
        "replica.lag.time.max.ms": 2_000,
        # Leaders move only when a broker dies: a restarted broker takes nothing back.
        "auto.leader.rebalance.enable": "false",
    }
    with LocalCluster(3, kafka=True, session_timeout_ms=3_000, settings=settings) as running_:
        yield running_


def _asked(cluster: LocalCluster) -> int:
    """A running broker to ask."""
    return next(b for b in cluster.broker_ids if cluster.is_running(b))


def _leader(cluster: LocalCluster) -> int:
    """The leader of the table topic's partition a running broker names (-1: none)."""
    return placement(cluster, _asked(cluster), TOPIC).get(0, (-1, []))[0]


def _coordinator(cluster: LocalCluster) -> int:
    return coordinator_of(cluster, _asked(cluster), transactional_id_for(NAME))


def _restart(cluster: LocalCluster, broker_id: int) -> None:
    """Start ``broker_id`` again and wait until it is back in the in-sync replicas of
    every partition the connector writes (its table's, its offsets', the transaction
    state's): RF=3 with min.insync.replicas 2 survives one broker down at a time, so the
    next kill must find three in sync."""
    cluster.start_broker(broker_id)
    cluster.wait_converged()

    def in_sync() -> bool:
        asked = _asked(cluster)
        for topic in (TOPIC, OFFSETS, "__transaction_state"):
            found = placement(cluster, asked, topic)
            if not found or any(broker_id not in isr for _, isr in found.values()):
                return False
        return True

    eventually(in_sync, 60)


def _commits_past(connector: PostgresConnector, dsn: str) -> None:
    """Wait until a PostgreSQL transaction committed from now on (the load runs) is in
    the connector's committed position: the connector committed a Tidelog transaction
    after this call began."""
    now = wal_insert_lsn(dsn)
    eventually(lambda: connector.metrics()["durable_lsn"] > now, PROGRESS_TIMEOUT_S)


def test_leader_and_coordinator_killed_under_the_connector(dsn: str, cluster: LocalCluster) -> None:
    initial = range(1_000)
    _create_table(dsn, len(initial))
    workload = Workload(dsn, seed=32, ids=initial)
    writer = Writer(workload)
    config = ConnectorConfig(
        dsn=dsn,
        bootstrap_servers=cluster.bootstrap,
        tables=("public.t",),
        slot=NAME,
        topic_prefix=NAME,
        offsets_topic=OFFSETS,
        snapshot_chunk_rows=250,
        # Shorter than a leader's failover (the session timeout, then an election): a
        # commit in flight at a kill times out and is retried by the sink.
        request_timeout_ms=2_000,
    )
    connector = PostgresConnector(config)
    with running(connector):
        replicas = placement(cluster, _asked(cluster), TOPIC)
        assert len(replicas[0][1]) == 3, replicas  # RF=3, all in sync
        writer.start()
        _commits_past(connector, dsn)

        # 1. The table partition's leader.
        leader = _leader(cluster)
        cluster.kill(leader)
        eventually(lambda: _leader(cluster) not in (leader, -1), PROGRESS_TIMEOUT_S)
        _commits_past(connector, dsn)  # with the victim down
        _restart(cluster, leader)
        _commits_past(connector, dsn)

        # 2. The transaction coordinator of the connector's transactional id.
        coordinator = _coordinator(cluster)
        cluster.kill(coordinator)
        eventually(lambda: _coordinator(cluster) not in (coordinator, -1), PROGRESS_TIMEOUT_S)
        _commits_past(connector, dsn)  # with the victim down
        _restart(cluster, coordinator)
        _commits_past(connector, dsn)

        writer.stop()
        try:
            eventually(lambda: not compacted_differences(cluster.bootstrap, TOPIC, dsn), 60)
        except AssertionError:
            wrong = compacted_differences(cluster.bootstrap, TOPIC, dsn)
            raise AssertionError(f"{len(wrong)} keys differ, e.g. {wrong[:5]}") from None
    assert sum(len(h) for h in workload.history.values()) > 100, "too few changes to matter"
    check_exactly_once(read_topic(cluster.bootstrap, TOPIC, "read_committed"), workload, initial)
