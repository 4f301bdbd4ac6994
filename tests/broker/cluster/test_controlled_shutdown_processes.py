"""A broker that leads partitions nobody else can take stops without waiting for them.

Controlled shutdown asks the controller to move this broker's leaderships to other
in-sync replicas and waits (15 s at most) until its view shows them moved. A partition
whose ISR is this broker alone has nowhere to go: the controller leaves it (as Kafka's),
and the wait must not count it. The fault runs of issue #29 saw a controller whose
followers were gone take 50 s to stop on SIGTERM, 15 s of them in that wait.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.broker.cluster.waiting import eventually
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.client import AdminClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_sole_in_sync_leader_stops_without_the_controlled_shutdown_wait() -> None:
    require_zookeeper()
    with LocalCluster(brokers=3, session_timeout_ms=3_000) as cluster:
        with AdminClient(cluster.address(1), request_timeout_ms=20_000) as admin:
            admin.create_topic("alone", 3, replication_factor=3)
            eventually(
                lambda: all(len(p.isr) == 3 for p in admin.describe_topic("alone").partitions)
            )
            cluster.kill(2)
            cluster.kill(3)
            # Their sessions expire: every partition is led by broker 1, its ISR broker 1.
            eventually(
                lambda: all(
                    p.leader == 1 and p.isr == (1,)
                    for p in admin.describe_topic("alone").partitions
                ),
                30,
            )
        started = time.monotonic()
        cluster.kill(1, signal.SIGTERM)  # waits for the process to end
        took = time.monotonic() - started
        output = cluster.output(1)
        assert "controlled shutdown: " in output, output[-3000:]
        # The old wait alone was 15 s; the rest of a stop takes a second or two.
        assert took < 12, f"the stop took {took:.1f} s"
