"""Replication benchmark: what replicas cost a producer, and how long a failover takes.

::

    python benchmarks/replication_bench.py [--records 100000] [--trials 5] [--quick]

On one three-broker cluster (``LocalCluster``: a throwaway ZooKeeper and three broker
processes on 127.0.0.1, ``zookeeper.session.timeout.ms`` 6000):

* **Produce, replication factor 3 against 1.** Two topics of 6 partitions, one with
  ``replication_factor=1`` and ``acks=1`` semantics aside, the other with
  ``replication_factor=3`` and ``min.insync.replicas=2``; one producer process per run
  sends ``--records`` 100-byte records with ``acks="all"`` to each, alternating, three
  rounds; the ratio of the medians is ``rf3_over_rf1_produce`` (target: at least 0.5).
  With ``acks="all"`` the leader answers once every in-sync follower fetched the batch:
  one more round trip per batch, and three copies written by the same two cores.
* **Failover.** ``--trials`` times: a replicated partition's leader is killed with
  SIGKILL while a producer sends one record at a time with ``acks="all"``; the time from
  the kill to the first record acknowledged afterwards (by the new leader) is measured.
  The killed broker is restarted and the ISR restored before the next trial. Target: at
  most ``zookeeper.session.timeout.ms`` + 2 s at the median: the controller only learns of
  a dead broker when its ZooKeeper session expires.

The last line is one JSON object with ``rf3_over_rf1_produce``,
``rf1_acks_all_records_per_s``, ``rf3_acks_all_records_per_s``, ``failover_p50_ms``,
``failover_max_ms`` and ``session_timeout_ms``. ``benchmarks/cluster_bench.py`` prints
these keys too (it runs this module).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tidelog.broker.cluster.testing import LocalCluster  # noqa: E402
from tidelog.client import AdminClient, Producer  # noqa: E402
from tidelog.storage.errors import TidelogError  # noqa: E402

SESSION_TIMEOUT_MS = 6_000
PARTITIONS = 6

_PRODUCE = """
import sys, time
from tidelog.client import Producer
bootstrap, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
value = b"v" * 100
with Producer(bootstrap, acks="all") as producer:
    started = time.perf_counter()
    for _ in range(count):
        producer.send(topic, value)
    producer.flush(timeout_ms=300_000)
    print(count / (time.perf_counter() - started))
"""


def _produce_rate(bootstrap: str, topic: str, records: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _PRODUCE, bootstrap, topic, str(records)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=900,
    )
    return float(out.stdout.strip().splitlines()[-1])


def _wait(check: Callable[[], bool], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while True:
        try:
            if check():
                return
        except TidelogError as exc:  # a leader moving, a broker starting: ask again
            last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"the cluster did not settle ({last!r})")
        time.sleep(0.2)


def _in_sync(admin: AdminClient, topic: str) -> bool:
    return all(len(p.isr) == len(p.replicas) for p in admin.describe_topic(topic).partitions)


def _failover_ms(cluster: LocalCluster, admin: AdminClient, topic: str) -> float:
    leader = admin.describe_topic(topic).partitions[0].leader
    others = ",".join(cluster.address(b) for b in cluster.broker_ids if b != leader)
    with Producer(others, acks="all", linger_ms=0, delivery_timeout_ms=120_000) as producer:
        producer.send(topic, b"warm", partition=0).result(timeout=60)
        cluster.kill(leader)
        killed = time.perf_counter()
        while True:
            try:
                producer.send(topic, b"probe", partition=0).result(timeout=120)
                break
            except TidelogError:
                time.sleep(0.01)
        elapsed = (time.perf_counter() - killed) * 1000
    cluster.start_broker(leader)
    _wait(lambda: _in_sync(admin, topic))
    return elapsed


def measure(records: int, trials: int) -> dict[str, float]:
    settings = {"replica.fetch.backoff.ms": 200, "auto.leader.rebalance.enable": "false"}
    cluster = LocalCluster(brokers=3, session_timeout_ms=SESSION_TIMEOUT_MS, settings=settings)
    with cluster as cl, AdminClient(cl.bootstrap, request_timeout_ms=30_000) as admin:
        _wait(lambda: len(admin.describe_cluster().brokers) == 3)
        admin.create_topic("rf1", PARTITIONS, replication_factor=1)
        admin.create_topic("rf3", PARTITIONS, {"min.insync.replicas": "2"}, replication_factor=3)
        admin.create_topic("failover", 1, {"min.insync.replicas": "2"}, replication_factor=3)
        for topic in ("rf1", "rf3", "failover"):
            _wait(lambda t=topic: _in_sync(admin, t))
        rates: dict[str, list[float]] = {"rf1": [], "rf3": []}
        for _round in range(3):
            for topic in ("rf1", "rf3"):
                rates[topic].append(_produce_rate(cl.bootstrap, topic, records))
                print(f"{topic}: {rates[topic][-1]:,.0f} records/s", flush=True)
        failovers = []
        for trial in range(trials):
            failovers.append(_failover_ms(cl, admin, "failover"))
            print(f"failover {trial + 1}: {failovers[-1]:,.0f} ms", flush=True)
    rf1 = statistics.median(rates["rf1"])
    rf3 = statistics.median(rates["rf3"])
    return {
        "rf1_acks_all_records_per_s": round(rf1),
        "rf3_acks_all_records_per_s": round(rf3),
        "rf3_over_rf1_produce": round(rf3 / rf1, 3),
        "failover_p50_ms": round(statistics.median(failovers)),
        "failover_max_ms": round(max(failovers)),
        "session_timeout_ms": SESSION_TIMEOUT_MS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="20,000 records, 2 trials")
    args = parser.parse_args()
    records, trials = (20_000, 2) if args.quick else (args.records, args.trials)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(json.dumps(measure(records, trials)))


if __name__ == "__main__":
    main()
