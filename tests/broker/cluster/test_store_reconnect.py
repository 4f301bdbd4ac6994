"""A broker reconnects to ZooKeeper promptly after a long outage.

Kazoo's default connection retry doubles its wait up to an hour: after ZooKeeper had been
away for a while, a broker's next attempt could come many seconds (minutes, after a longer
outage) after ZooKeeper was back. ``broker.cluster.store.reconnect_retry`` caps the wait
at a third of the session timeout (at most 1 s).
"""

from __future__ import annotations

import time

import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tidelog.broker.cluster.store import ClusterStore, reconnect_retry
from tidelog.broker.cluster.testing import ZooKeeperServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

OUTAGE_S = 14.0  # kazoo's default would be waiting ~13 s between attempts by now


def test_the_reconnect_wait_is_capped_at_a_third_of_the_session() -> None:
    assert reconnect_retry(18_000).max_delay == 1.0
    assert reconnect_retry(1_500).max_delay == 0.5
    assert reconnect_retry(18_000).max_tries == -1  # forever: a broker never gives up


def test_a_broker_reconnects_within_a_second_or_two_after_a_long_outage() -> None:
    require_zookeeper()
    with ZooKeeperServer() as zookeeper:
        store = ClusterStore.connect(zookeeper.connect_string, session_timeout_ms=30_000)
        try:
            assert store.connected
            zookeeper.kill()
            time.sleep(OUTAGE_S)
            assert not store.connected
            zookeeper.start()  # returns once it answers
            back = time.monotonic()
            while not store.connected:
                # With kazoo's default policy the next attempt comes 6-13 s from now.
                assert time.monotonic() - back < 5.0, "no reconnect within 5 s"
                time.sleep(0.05)
            # The session outlived the outage (30 s timeout): the same session goes on.
            store.live_brokers()
        finally:
            store.close()
