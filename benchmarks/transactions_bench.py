"""Transactions benchmark (issue #28): what a transaction costs a producer, and what
read_committed costs a consumer, each against its baseline in the same run.

::

    python benchmarks/transactions_bench.py [--records 100000] [--txn-ms 100] [--small 100]
        [--quick]

One broker process (``kafka_bench.start_broker``: a temporary data directory, 127.0.0.1,
the Kafka listener on a free port). With confluent-kafka through the Kafka listener, one
after the other, on topics of 3 partitions:

1. ``idempotent_produce_records_per_s``: an idempotent producer (``acks=all``) sends
   ``--records`` records (16-byte key, 100-byte value, ``linger.ms=5``) and flushes;
2. ``txn_produce_records_per_s``: a transactional producer sends the same, in
   transactions of about ``--txn-ms`` milliseconds of records each (begin, produce until
   the time is up, commit);
3. ``txn_over_idempotent_produce``: 2 over 1 (the issue's target: >= 0.8);
4. ``read_uncommitted_consume_records_per_s`` / ``read_committed_consume_records_per_s``:
   a consumer reads the transactional topic from offset zero at each isolation level;
5. ``read_committed_over_uncommitted_consume``: their ratio (target: >= 0.95).
6. ``txn_small_ms_1_partition`` / ``txn_small_ms_6_partitions``: the median ms of a small
   transaction (one record on each partition, committed, the next begun at once: it waits
   for the previous one's markers), on one and on six partitions, ``--small`` of each a
   round, and ``txn_small_6_over_1_partition`` (what more partitions cost: markers written
   together, it stays near 1; one after the other it grows with the partitions).

Then the same produce pair with Tidelog's own client over the gRPC listener
(``client.Producer``, ``acks="all"``, ``linger_ms=5``):
``tidelog_idempotent_produce_records_per_s``, ``tidelog_txn_produce_records_per_s``
(``transactional_id``, transactions of about ``--txn-ms``) and
``tidelog_txn_over_idempotent_produce``.

Each figure is the best of two rounds that alternate the two sides (A B A B). The
machine is shared and noisy: compare figures of one run only. The last line printed
is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import confluent_kafka  # noqa: E402 - after the path entry above

from benchmarks.kafka_bench import KEY_BYTES, TIMEOUT_S, VALUE_BYTES, start_broker  # noqa: E402
from tidelog import client  # noqa: E402

PARTITIONS = 3
ROUNDS = 2
PARTITIONS_SMALL = 6  # the small transactions' partitions (and one)


def _send(producer: confluent_kafka.Producer, topic: str, i: int, value: bytes) -> None:
    while True:
        try:
            producer.produce(
                topic, value=value, key=i.to_bytes(KEY_BYTES, "big"), partition=i % PARTITIONS
            )
            return
        except BufferError:
            producer.poll(0.01)


def idempotent_produce(bootstrap: str, topic: str, records: int) -> float:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    value = b"v" * VALUE_BYTES
    started = time.perf_counter()
    for i in range(records):
        _send(producer, topic, i, value)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(TIMEOUT_S):
        raise RuntimeError("records not delivered")
    return records / (time.perf_counter() - started)


def transactional_produce(bootstrap: str, topic: str, records: int, txn_ms: float) -> float:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"bench-{time.monotonic_ns()}",
            "linger.ms": 5,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    value = b"v" * VALUE_BYTES
    started = time.perf_counter()
    i = 0
    while i < records:
        producer.begin_transaction()
        ends = time.perf_counter() + txn_ms / 1000
        while i < records and time.perf_counter() < ends:
            _send(producer, topic, i, value)
            i += 1
            if i % 1_000 == 0:
                producer.poll(0)
        producer.commit_transaction(TIMEOUT_S)
    return records / (time.perf_counter() - started)


def small_transactions(bootstrap: str, topic: str, partitions: int, count: int) -> float:
    """Median ms of one small transaction (begin, one record on each of ``partitions``,
    commit), one after the other: the next one's AddPartitionsToTxn waits for the previous
    one's markers (``CONCURRENT_TRANSACTIONS``), so this is the markers' cost."""
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"bench-small-{time.monotonic_ns()}",
            "linger.ms": 0,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    took: list[float] = []
    for i in range(count):
        started = time.perf_counter()
        producer.begin_transaction()
        for partition in range(partitions):
            producer.produce(topic, b"v", key=b"%d" % i, partition=partition)
        producer.commit_transaction(TIMEOUT_S)
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took[count // 10 :])


def tidelog_produce(address: str, topic: str, records: int, txn_ms: float | None) -> float:
    """Tidelog's producer: idempotent (``txn_ms`` None) or transactional."""
    settings: dict[str, Any] = {"acks": "all", "linger_ms": 5}
    if txn_ms is not None:
        settings["transactional_id"] = f"bench-tidelog-{time.monotonic_ns()}"
    value = b"v" * VALUE_BYTES
    with client.Producer(address, **settings) as producer:
        if txn_ms is not None:
            producer.init_transactions(int(TIMEOUT_S * 1000))
        started = time.perf_counter()
        i = 0
        while i < records:
            if txn_ms is not None:
                producer.begin_transaction()
            ends = time.perf_counter() + (txn_ms or 1e9) / 1000
            while i < records and time.perf_counter() < ends:
                producer.send(
                    topic, value, key=i.to_bytes(KEY_BYTES, "big"), partition=i % PARTITIONS
                )
                i += 1
            if txn_ms is not None:
                producer.commit_transaction(int(TIMEOUT_S * 1000))
        producer.flush(int(TIMEOUT_S * 1000))
        return records / (time.perf_counter() - started)


def consume(bootstrap: str, topic: str, records: int, isolation: str) -> float:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{isolation}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        got = 0
        started = time.perf_counter()
        deadline = time.monotonic() + TIMEOUT_S
        while got < records and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 0.5):
                if message.error() is None:
                    got += 1
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    if got < records:
        raise RuntimeError(f"read {got} of {records} records ({isolation})")
    return records / elapsed


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--txn-ms", type=float, default=100.0)
    p.add_argument("--small", type=int, default=100, help="small transactions a round")
    p.add_argument("--quick", action="store_true", help="20,000 records")
    args = p.parse_args(argv)
    records = 20_000 if args.quick else args.records
    work = Path(tempfile.mkdtemp(prefix="tidelog-txn-bench-"))
    process, address, bootstrap = start_broker(work)
    try:
        results: dict[str, Any] = {"records": records, "txn_ms": args.txn_ms}
        # Rounds alternate the two sides and each keeps its best, so that neither pays
        # alone for the first connection, the first segment or a noisy neighbour.
        idem = txn = uncommitted = committed = 0.0
        with client.AdminClient(address) as admin:
            for round_ in range(ROUNDS):
                admin.create_topic(f"idempotent-{round_}", PARTITIONS)
                admin.create_topic(f"transactional-{round_}", PARTITIONS)
                admin.create_topic(f"tidelog-idempotent-{round_}", PARTITIONS)
                admin.create_topic(f"tidelog-transactional-{round_}", PARTITIONS)
            admin.create_topic("small", PARTITIONS_SMALL)
        for round_ in range(ROUNDS):
            idem = max(idem, idempotent_produce(bootstrap, f"idempotent-{round_}", records))
            txn = max(
                txn,
                transactional_produce(bootstrap, f"transactional-{round_}", records, args.txn_ms),
            )
        for _ in range(ROUNDS):
            uncommitted = max(
                uncommitted, consume(bootstrap, "transactional-0", records, "read_uncommitted")
            )
            committed = max(
                committed, consume(bootstrap, "transactional-0", records, "read_committed")
            )
        results["idempotent_produce_records_per_s"] = round(idem)
        results["txn_produce_records_per_s"] = round(txn)
        results["txn_over_idempotent_produce"] = round(txn / idem, 3)
        results["read_uncommitted_consume_records_per_s"] = round(uncommitted)
        results["read_committed_consume_records_per_s"] = round(committed)
        results["read_committed_over_uncommitted_consume"] = round(committed / uncommitted, 3)
        one = many = float("inf")
        for _ in range(ROUNDS):
            one = min(one, small_transactions(bootstrap, "small", 1, args.small))
            many = min(many, small_transactions(bootstrap, "small", PARTITIONS_SMALL, args.small))
        results["txn_small_ms_1_partition"] = round(one, 2)
        results[f"txn_small_ms_{PARTITIONS_SMALL}_partitions"] = round(many, 2)
        results[f"txn_small_{PARTITIONS_SMALL}_over_1_partition"] = round(many / one, 3)
        own_idem = own_txn = 0.0
        for round_ in range(ROUNDS):
            own_idem = max(
                own_idem, tidelog_produce(address, f"tidelog-idempotent-{round_}", records, None)
            )
            own_txn = max(
                own_txn,
                tidelog_produce(address, f"tidelog-transactional-{round_}", records, args.txn_ms),
            )
        results["tidelog_idempotent_produce_records_per_s"] = round(own_idem)
        results["tidelog_txn_produce_records_per_s"] = round(own_txn)
        results["tidelog_txn_over_idempotent_produce"] = round(own_txn / own_idem, 3)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except Exception:
            process.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
