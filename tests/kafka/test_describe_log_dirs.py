"""DescribeLogDirs over the Kafka listener (kafka-python's ``describe_log_dirs``) and
through Tidelog's AdminClient and ``tidelog cluster log-dirs``: the broker's one data
directory, the file system's size and free space, and each partition copy's size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kafka
import kafka.admin
import pytest

from tests.cli import tidelog
from tests.kafka.clients import TIMEOUT_S
from tests.kafka.conftest import KafkaBroker, unique
from tidelog.client import AdminClient, Producer, TopicPartition

pytestmark = pytest.mark.timeout(60)


def _topic(broker: KafkaBroker, records: int) -> str:
    topic = unique("log-dirs")
    with AdminClient(broker.address) as admin:
        admin.create_topic(topic, 2)
    with Producer(broker.address, linger_ms=0) as producer:
        for _ in range(records):
            producer.send(topic, b"x" * 100, partition=0).result(TIMEOUT_S)
    return topic


def test_kafka_python_describes_the_log_dir(kafka_broker: KafkaBroker) -> None:
    topic = _topic(kafka_broker, 20)
    admin = kafka.KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        answers: list[dict[str, Any]] = admin.describe_log_dirs({topic: [0, 1, 9]})
    finally:
        admin.close()
    (answer,) = answers  # one per broker: {"broker": id, "log_dirs": [...]}
    assert answer["broker"] == 0
    (as_dict,) = answer["log_dirs"]
    assert as_dict["error_code"] == 0
    assert Path(as_dict["log_dir"]).resolve() == kafka_broker.broker.data_dir.resolve()
    assert as_dict["total_bytes"] >= as_dict["usable_bytes"] > 0
    (entry,) = as_dict["topics"]
    sizes = {p["partition_index"]: p["partition_size"] for p in entry["partitions"]}
    assert set(sizes) == {0, 1}  # partition 9 does not exist: left out
    assert sizes[0] > 20 * 100 > sizes[1] == 0
    assert all(p["offset_lag"] == 0 for p in entry["partitions"])


def test_admin_client_and_cli(kafka_broker: KafkaBroker) -> None:
    topic = _topic(kafka_broker, 5)
    with AdminClient(kafka_broker.address) as admin:
        (only,) = admin.describe_log_dirs(topics=[topic]).values()
        described = admin.describe_topic(topic)
        everything = admin.describe_log_dirs()[0]
        assert admin.describe_log_dirs([7]) == {}
    assert Path(only.path).resolve() == kafka_broker.broker.data_dir.resolve()
    assert set(only.replicas) == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
    for p in described.partitions:
        assert only.replicas[TopicPartition(topic, p.partition)].size_bytes == p.size_bytes
    assert set(only.replicas) < set(everything.replicas)

    shown = tidelog("cluster", "log-dirs", "--topic", topic, "--bootstrap", kafka_broker.address)
    assert shown.returncode == 0, shown.stderr
    header, *rows = shown.stdout.splitlines()
    assert header.split()[:3] == ["BROKER", "LOG", "DIR"]
    # Sizes read "252.0 GiB": split each row at the topic's name.
    assert [row.split(f" {topic} ")[1].split()[0] for row in rows] == ["0", "1"]
