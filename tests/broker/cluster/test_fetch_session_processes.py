"""Followers' incremental fetch sessions between real broker processes (issue #34).

Every replication test in this directory runs with sessions (the followers open one per
leader); this one takes them away as often as it can: each leader keeps one session
slot, free to take at once (``max.incremental.fetch.session.cache.slots`` 1,
``min.incremental.fetch.session.eviction.ms`` 0), and has two followers, so each
follower's session evicts the other's and every other fetch of each answers
``FETCH_SESSION_ID_NOT_FOUND``. A follower that did not open a new session with a full
fetch would stop replicating: ``acks=all`` with ``min.insync.replicas`` 3 waits for both
followers of every partition, and an idle follower left out would leave the ISR after
``replica.lag.time.max.ms``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.test_replication_processes import create_replicated, read_all
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient, Producer

pytestmark = pytest.mark.slow

LAG_MS = 2_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require_zookeeper()
    settings = {
        "replica.lag.time.max.ms": LAG_MS,
        "replica.fetch.backoff.ms": 200,
        "max.incremental.fetch.session.cache.slots": 1,
        "min.incremental.fetch.session.eviction.ms": 0,
    }
    with LocalCluster(brokers=3, session_timeout_ms=3_000, settings=settings) as running:
        yield running


def test_followers_losing_their_sessions_keep_replicating(cluster: LocalCluster) -> None:
    one = cluster.address(1)
    with AdminClient(one, request_timeout_ms=20_000) as admin:
        create_replicated(admin, "evicted", 3, **{"min.insync.replicas": "3"})
        with Producer(one, acks="all", linger_ms=5, delivery_timeout_ms=60_000) as producer:
            for round_ in range(3):
                futures = [
                    producer.send("evicted", b"%d" % (round_ * 100 + i), partition=i % 3)
                    for i in range(100)
                ]
                for future in futures:
                    future.result(timeout=30)
                time.sleep(LAG_MS / 1000 * 1.5)  # idle past the lag time between rounds
                described = admin.describe_topic("evicted").partitions
                assert all(len(p.isr) == 3 for p in described), described
        records = read_all(one, "evicted", 3, 300)
        assert sorted(int(r.value or b"") for r in records) == list(range(300))
        eventually(lambda: all(len(p.isr) == 3 for p in admin.describe_topic("evicted").partitions))
