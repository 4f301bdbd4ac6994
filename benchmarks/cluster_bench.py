"""Cluster benchmark: one, two and three brokers on this machine, the same total partitions.

::

    python benchmarks/cluster_bench.py [--records 300000] [--partitions 6] [--quick]

For each cluster size (``LocalCluster``: a throwaway ZooKeeper and N broker processes on
127.0.0.1), a topic with ``--partitions`` partitions is created, one producer process
sends ``--records`` keyless records (100-byte values, ``acks=1``, the producer's
defaults) through a bootstrap list naming every broker, and one consumer process reads
them all back from offset zero with ``assign``. The producer and consumer route each
partition to its leader, so with N brokers every broker takes a share.

It also times the client's metadata refresh: the ``Metadata`` call a client makes on a
leader change, as the median of 200 calls to one broker of the three-broker cluster.

On a 2-core machine N brokers cannot run N times faster: the client processes and the
brokers share the same two cores, so more brokers mostly add hand-offs. The ratio is
reported as measured. The last line is one JSON object with
``brokers_N_produce_records_per_s`` and ``brokers_N_consume_records_per_s`` for N = 1, 2, 3,
and ``metadata_refresh_ms_p50``; then, unless ``--no-replication``, the keys of
``benchmarks/replication_bench.py`` (``rf3_over_rf1_produce``, ``failover_p50_ms``,
``failover_max_ms``: replication factor 3 against 1 with ``acks="all"``, and the time from
a leader's SIGKILL to the first record its successor acknowledges).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VALUE_BYTES = 100

_PRODUCE = """
import sys, time
from tidelog.client import Producer
bootstrap, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
value = b"v" * {value}
with Producer(bootstrap, acks=1) as producer:
    started = time.perf_counter()
    for _ in range(count):
        producer.send(topic, value)
    producer.flush(timeout_ms=300_000)
    print(count / (time.perf_counter() - started))
"""

_CONSUME = """
import sys, time
from tidelog.client import AdminClient, Consumer, TopicPartition
bootstrap, topic, count, partitions = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    started = time.perf_counter()
    seen = 0
    while seen < count:
        seen += len(consumer.poll(timeout_ms=5_000))
    print(count / (time.perf_counter() - started))
"""


def _run(script: str, *args: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        cwd=ROOT,
    )
    return float(done.stdout.strip().splitlines()[-1])


def _measure(brokers: int, records: int, partitions: int) -> tuple[float, float, float | None]:
    import grpc

    from tidelog.broker.cluster.testing import LocalCluster
    from tidelog.client import AdminClient
    from tidelog.proto.tidelog.v1 import broker_pb2 as pb
    from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

    with LocalCluster(brokers=brokers) as cluster:
        topic = f"bench-{brokers}"
        with AdminClient(cluster.bootstrap) as admin:
            admin.create_topic(topic, partitions=partitions)
        produce = _run(_PRODUCE.format(value=VALUE_BYTES), cluster.bootstrap, topic, str(records))
        consume = _run(_CONSUME, cluster.bootstrap, topic, str(records), str(partitions))
        refresh_ms = None
        if brokers == 3:
            with grpc.insecure_channel(cluster.address(1)) as channel:
                stub = pb_grpc.BrokerStub(channel)
                samples = []
                for _ in range(200):
                    started = time.perf_counter()
                    stub.Metadata(pb.MetadataRequest(topics=[topic]), timeout=10)
                    samples.append((time.perf_counter() - started) * 1000)
                refresh_ms = statistics.median(samples)
    return produce, consume, refresh_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="30,000 records")
    parser.add_argument(
        "--no-replication", action="store_true", help="skip benchmarks/replication_bench.py"
    )
    args = parser.parse_args()
    records = 30_000 if args.quick else args.records
    result: dict[str, float] = {}
    print(f"{'brokers':>8} {'produce rec/s':>14} {'consume rec/s':>14}")
    for brokers in (1, 2, 3):
        produce, consume, refresh_ms = _measure(brokers, records, args.partitions)
        result[f"brokers_{brokers}_produce_records_per_s"] = round(produce)
        result[f"brokers_{brokers}_consume_records_per_s"] = round(consume)
        if refresh_ms is not None:
            result["metadata_refresh_ms_p50"] = round(refresh_ms, 3)
        print(f"{brokers:>8} {produce:>14,.0f} {consume:>14,.0f}")
    result["brokers_3_over_1_produce"] = round(
        result["brokers_3_produce_records_per_s"] / result["brokers_1_produce_records_per_s"], 3
    )
    result["brokers_3_over_1_consume"] = round(
        result["brokers_3_consume_records_per_s"] / result["brokers_1_consume_records_per_s"], 3
    )
    if not args.no_replication:
        # Replication (issue 14): rf3 over rf1 with acks=all, and failover times.
        from benchmarks.replication_bench import measure as measure_replication

        quick = args.quick
        result.update(measure_replication(20_000 if quick else 100_000, 2 if quick else 5))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
