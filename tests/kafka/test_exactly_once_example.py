"""``examples/exactly_once_pipeline.py`` killed at random and restarted (issue #28): the
output holds every input record's transformation exactly once.

A single node with the Kafka listener; 3,000 unique input records on three partitions; the
pipeline (one process at a time, the same transactional id) is SIGKILLed three times at
seeded random moments once it has made progress, and restarted; the last instance runs
until it is idle. A read_committed reader of the output must see each ``V-<i>`` once.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.kafka.conftest import KafkaBroker, unique

pytestmark = pytest.mark.timeout(300)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "exactly_once_pipeline.py"
RECORDS = 3_000
KILLS = 3
SEED = 28


def committed_output(bootstrap: str, topic: str) -> list[bytes]:
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    reader.assign([TopicPartition(topic, p, 0) for p in range(3)])
    values: list[bytes] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + 60
    try:
        while len(at_end) < 3 and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end.add(message.partition())
                continue
            at_end.discard(message.partition())
            values.append(message.value())
    finally:
        reader.close()
    assert len(at_end) == 3, "the output was not read to its end in time"
    return values


def output_size(bootstrap: str, topic: str) -> int:
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("probe")})
    try:
        return sum(
            probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(3)
        )
    finally:
        probe.close()


def test_killed_and_restarted_the_pipeline_copies_every_record_once(
    kafka_broker: KafkaBroker,
) -> None:
    bootstrap = kafka_broker.bootstrap
    source, sink = unique("orders"), unique("orders-upper")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for name in (source, sink):
        admin.create_topics([NewTopic(name, num_partitions=3)])[name].result(timeout=30)
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(RECORDS):
        plain.produce(source, f"v-{i}".encode(), key=str(i).encode())
    plain.flush(30)
    command = [
        sys.executable,
        str(EXAMPLE),
        "--bootstrap",
        bootstrap,
        "--input",
        source,
        "--output",
        sink,
        "--group",
        unique("upper"),
        "--transactional-id",
        unique("upper"),
        "--batch",
        "50",
    ]
    rng = random.Random(SEED)
    for _ in range(KILLS):
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        try:
            started = output_size(bootstrap, sink)
            deadline = time.monotonic() + 60
            while output_size(bootstrap, sink) == started:  # some progress first
                assert process.poll() is None, "the pipeline died by itself"
                assert time.monotonic() < deadline, "the pipeline made no progress"
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, 0.5))  # then anywhere in a transaction
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(10)
    last = subprocess.run(
        [*command, "--idle-exit-s", "10"], capture_output=True, text=True, timeout=180
    )
    assert last.returncode == 0, last.stderr[-2000:]
    copies = Counter(committed_output(bootstrap, sink))
    assert set(copies) == {f"V-{i}".encode() for i in range(RECORDS)}
    duplicated = {value: n for value, n in copies.items() if n > 1}
    assert not duplicated, f"{len(duplicated)} record(s) copied more than once"
