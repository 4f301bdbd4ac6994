"""Fixtures for the Spark tests: one ``local[2]`` SparkSession and one broker per run.

A SparkSession costs 10-30 s to start on this machine, so the whole run shares one
(session scope); each test works on topics and checkpoint directories of its own. The
executors are Python workers started by Spark: they must use this interpreter
(``PYSPARK_PYTHON = sys.executable``) and find the repository (``PYTHONPATH``), so the
fixture sets both before the JVM starts. The broker is the real daemon in this process
(``broker.testing.InProcessBroker``) with a fast retention check, so tests can make
retention overtake a query by shrinking ``retention.bytes``.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition

pyspark = pytest.importorskip("pyspark")

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_AUTH_SOCKET_TIMEOUT", "120")  # the driver side of the same
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("tidelog-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.adaptive.enabled", "false")
        # Python workers connect back to the JVM within this (15 s by default); on a
        # shared 2-core machine with other suites running that was seen to time out.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def broker() -> Iterator[InProcessBroker]:
    settings = {"log.retention.check.interval.ms": 100, "log.cleaner.backoff.ms": 100}
    with InProcessBroker(settings=settings) as running:
        yield running


@pytest.fixture(scope="session")
def admin(broker: InProcessBroker) -> Iterator[AdminClient]:
    with AdminClient(broker.address, request_timeout_ms=10_000) as client:
        yield client


TopicFactory = Callable[..., str]


@pytest.fixture
def new_topic(admin: AdminClient, request: pytest.FixtureRequest) -> TopicFactory:
    """``new_topic(partitions=1, **config)``: a fresh topic (config keys with _ for .)."""

    def create(partitions: int = 1, **config: object) -> str:
        base = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:50]
        name = f"{base}-{next(_names)}"
        admin.create_topic(name, partitions, {k.replace("_", "."): v for k, v in config.items()})
        return name

    return create


def produce(
    address: str,
    topic: str,
    values: list[bytes],
    *,
    keys: list[bytes | None] | None = None,
    partition: int | None = None,
    headers: list[tuple[str, bytes | None]] | None = None,
    timestamps_ms: list[int] | None = None,
) -> None:
    """Send and wait for every record."""
    with Producer(address, linger_ms=0, acks="all") as producer:
        futures = [
            producer.send(
                topic,
                value=value,
                key=None if keys is None else keys[i],
                partition=partition,
                headers=headers or [],
                timestamp_ms=None if timestamps_ms is None else timestamps_ms[i],
            )
            for i, value in enumerate(values)
        ]
        producer.flush()
        for future in futures:
            future.result(timeout=30)


def consume_all(address: str, topic: str, partitions: int = 1) -> list[Any]:
    """Every record of ``topic`` (all partitions), read from offset zero."""
    out: list[Any] = []
    with AdminClient(address) as admin:
        ends = {p.partition: p.high_watermark for p in admin.describe_topic(topic).partitions}
    consumer = Consumer(address, auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(ends)]
        consumer.assign(tps)
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp.partition] for tp in tps):
            out.extend(consumer.poll(timeout_ms=200))
            assert time.monotonic() < deadline, "consume_all timed out"
    finally:
        consumer.close(autocommit=False)
    return out
