"""The console in front of a real three-broker cluster (ZooKeeper + broker processes) when
one broker is SIGKILLed: it shows the broker down and its partitions offline, and keeps
working for everything else."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator

import pytest

from tests.console.conftest import console_client, csrf_token
from tidelog.broker.cluster.testing import LocalCluster, zookeeper_available
from tidelog.client.admin import AdminClient

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

if not zookeeper_available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI needs libzookeeper-java and java for the cluster tests")
    pytest.skip("no ZooKeeper (apt-get install libzookeeper-java)", allow_module_level=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # A follower that stops fetching leaves the ISR after 2 s: the RF-3 topic then shows
    # under-replicated partitions soon after the kill.
    with LocalCluster(brokers=3, settings={"replica.lag.time.max.ms": 2_000}) as running:
        yield running


def _rows(page: str, attribute: str) -> dict[str, str]:
    return dict(re.findall(rf'<tr {attribute}="([^"]+)">(.*?)</tr>', page, re.S))


def test_a_killed_broker_shows_down_and_its_partitions_offline(cluster: LocalCluster) -> None:
    with AdminClient(cluster.bootstrap, request_timeout_ms=15_000) as admin:
        admin.create_topic("spread", 3, replication_factor=1)
        admin.create_topic("safe", 3, replication_factor=3)
        controller = admin.describe_cluster().controller_id
        placement = {p.partition: p.leader for p in admin.describe_topic("spread").partitions}
    victim = next(b for b in cluster.broker_ids if b != controller and b in placement.values())
    lost = [p for p, leader in placement.items() if leader == victim]
    kept = [p for p, leader in placement.items() if leader != victim]

    with console_client(cluster.bootstrap, request_timeout_ms=3_000) as web:
        overview = web.get("/")
        assert overview.status_code == 200
        brokers = _rows(overview.text, "data-broker")
        assert sorted(brokers) == ["1", "2", "3"]
        assert all(">up<" in row for row in brokers.values())
        assert "controller" in brokers[str(controller)]

        cluster.kill(victim)

        deadline = time.monotonic() + 60
        while True:
            page = web.get("/")
            assert page.status_code == 200  # never an error page while the cluster heals
            brokers = _rows(page.text, "data-broker")
            offline = re.search(r'id="total-offline"[^>]*>(\d+)<', page.text)
            if ">down<" in brokers.get(str(victim), "") and offline and int(offline.group(1)):
                break
            assert time.monotonic() < deadline, page.text
            time.sleep(0.5)
        assert int(offline.group(1)) >= len(lost)
        assert all(">up<" in brokers[str(b)] for b in cluster.broker_ids if b != victim)

        topic = web.get("/topics/spread")
        assert topic.status_code == 200
        partitions = _rows(topic.text, "data-partition")
        for p in lost:
            assert "offline" in partitions[str(p)]
        for p in kept:
            assert "offline" not in partitions[str(p)]

        # Still working: the topics table, a produce and a read on a live partition.
        assert web.get("/topics").status_code == 200
        token = csrf_token(web)
        sent = web.post(
            "/topics/spread/produce",
            data={"csrf_token": token, "partition": str(kept[0]), "value": "still here"},
        )
        assert sent.status_code == 303
        shown = web.get(sent.headers["location"])
        assert "Sent: partition" in shown.text
        assert "still here" in shown.text
        # The RF-3 topic lost a replica but no partition: online, under-replicated.
        deadline = time.monotonic() + 60
        while True:
            page = web.get("/topics/safe")
            safe = _rows(page.text, "data-partition")
            assert all("offline" not in row for row in safe.values())
            if all("under-replicated" in row for row in safe.values()):
                break
            assert time.monotonic() < deadline, page.text
            time.sleep(0.5)
        topics = _rows(web.get("/topics").text, "data-topic")
        assert re.search(r'class="warn">3<', topics["safe"])
        under = re.search(r'id="total-under-replicated"[^>]*>(\d+)<', web.get("/").text)
        assert under
        assert int(under.group(1)) >= 3
        assert web.get("/groups").status_code == 200
