"""Debian's kcat (librdkafka 2.0.2, the oldest client in scope) against the Kafka listener:
list metadata, produce, consume from the beginning, consume in a group. kcat missing is a
failure (``make venv`` and ``.ci/run`` install it), never a skip."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.kafka.clients import Out, consume, produce
from tests.kafka.conftest import KafkaBroker, unique

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 30


def _kcat(broker: KafkaBroker, *args: str, stdin: str | None = None) -> str:
    path = shutil.which("kcat")
    assert path is not None, "kcat is not installed: apt-get install kcat (make venv does)"
    done = subprocess.run(
        [path, "-b", broker.bootstrap, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _create(broker: KafkaBroker, partitions: int) -> str:
    topic = unique("kcat")
    broker.broker.server.core.create_topic(topic, partitions, {})
    return topic


def test_kcat_lists_the_broker_and_topics(kafka_broker: KafkaBroker) -> None:
    topic = _create(kafka_broker, 3)
    listed = json.loads(_kcat(kafka_broker, "-L", "-J"))
    host, port = kafka_broker.bootstrap.rsplit(":", 1)
    assert listed["brokers"] == [{"id": 0, "name": f"{host}:{port}"}]
    (described,) = [t for t in listed["topics"] if t["topic"] == topic]
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert all(p["leader"] == 0 for p in described["partitions"])


def test_kcat_produces_and_others_read_it(kafka_broker: KafkaBroker) -> None:
    topic = _create(kafka_broker, 1)
    lines = [f"key{i}:value {i}" for i in range(20)]
    _kcat(kafka_broker, "-P", "-t", topic, "-p", "0", "-K", ":", stdin="\n".join(lines) + "\n")
    for family in ("kafka-python", "tidelog"):
        got = consume(family, kafka_broker.bootstrap, kafka_broker.address, topic, [0], 20)
        assert [(r.key, r.value) for r in got] == [
            (f"key{i}".encode(), f"value {i}".encode()) for i in range(20)
        ]


def test_kcat_consumes_what_others_wrote(kafka_broker: KafkaBroker) -> None:
    topic = _create(kafka_broker, 2)
    sent = [Out(b"k%d" % i, b"v%d" % i, partition=i % 2) for i in range(10)]
    produce("confluent-kafka", kafka_broker.bootstrap, kafka_broker.address, topic, sent)
    out = _kcat(kafka_broker, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%p %o %k %s\n")
    got = sorted(tuple(line.split(" ")) for line in out.splitlines())
    expected = sorted((str(i % 2), str(i // 2), f"k{i}", f"v{i}") for i in range(10))
    assert got == expected


def test_kcat_consumes_in_a_group_and_commits(kafka_broker: KafkaBroker) -> None:
    topic = _create(kafka_broker, 2)
    group = unique("kcat-g")
    produce(
        "kafka-python",
        kafka_broker.bootstrap,
        kafka_broker.address,
        topic,
        [Out(None, b"g%d" % i, partition=i % 2) for i in range(8)],
    )
    out = _kcat(
        kafka_broker,
        "-G",
        group,
        topic,
        "-o",
        "beginning",
        "-e",
        "-X",
        "auto.offset.reset=earliest",
        "-f",
        "%s\n",
    )
    assert sorted(out.split()) == sorted(f"g{i}" for i in range(8))
    # kcat committed on its way out (auto-commit): the group's offsets are at the end.
    offsets = kafka_broker.broker.server.core.fetch_offsets(group, {topic: [0, 1]})
    assert [o.offset for o in offsets] == [4, 4]


def test_kcat_produces_keys_and_headers_that_others_read(kafka_broker: KafkaBroker) -> None:
    topic = _create(kafka_broker, 1)
    _kcat(
        kafka_broker,
        "-P",
        "-t",
        topic,
        "-p",
        "0",
        "-K",
        ":",
        "-H",
        "trace=abc",
        "-H",
        "tenant=7",
        stdin="k1:first\nk2:second\n",
    )
    got = consume("kafka-python", kafka_broker.bootstrap, kafka_broker.address, topic, [0], 2)
    assert [(r.key, r.value, r.headers) for r in got] == [
        (key, value, (("trace", b"abc"), ("tenant", b"7")))
        for key, value in ((b"k1", b"first"), (b"k2", b"second"))
    ]
    out = _kcat(kafka_broker, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%k|%s|%h\n")
    assert out.splitlines() == ["k1|first|trace=abc,tenant=7", "k2|second|trace=abc,tenant=7"]


def test_kcat_starts_at_a_timestamp_and_queries_offsets_by_time(
    kafka_broker: KafkaBroker,
) -> None:
    """``-o s@TS`` and ``-Q`` resolve a timestamp to an offset (ListOffsets by time)."""
    topic = _create(kafka_broker, 1)
    base = 1_700_000_000_000
    sent = [Out(None, b"t%d" % i, timestamp_ms=base + 1000 * i, partition=0) for i in range(5)]
    produce("confluent-kafka", kafka_broker.bootstrap, kafka_broker.address, topic, sent)
    out = _kcat(kafka_broker, "-C", "-t", topic, "-o", f"s@{base + 2500}", "-e", "-f", "%T %s\n")
    assert out.splitlines() == [f"{base + 3000} t3", f"{base + 4000} t4"]
    queried = _kcat(kafka_broker, "-Q", "-t", f"{topic}:0:{base + 1000}")
    assert f"{topic} [0] offset 1" in queried
    # A time after every record: the end of the log (-1 from the broker, kcat says so).
    after = _kcat(kafka_broker, "-Q", "-t", f"{topic}:0:{base + 60_000}")
    assert f"{topic} [0] offset -1" in after
