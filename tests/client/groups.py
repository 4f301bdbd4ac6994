"""Shared helpers of the consumer-group tests: broker settings, members, polling.

Short group timeouts (heartbeat 100 ms, sessions of 2 s) so that rebalances take a few
hundred milliseconds; members are driven from the test's thread, polling in turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tidelog.client import Consumer, Producer
from tidelog.client.config import ConsumerConfig
from tidelog.client.connection import ConnectionFactory
from tidelog.client.types import ConsumerRecord

SESSION_TIMEOUT_MS = 2_000
GROUP_SETTINGS: dict[str, object] = {
    "group.consumer.heartbeat.interval.ms": 100,
    "group.consumer.min.session.timeout.ms": 500,
    "group.consumer.session.timeout.ms": SESSION_TIMEOUT_MS,
}


def member(
    address: str,
    group: str,
    connection_factory: ConnectionFactory | None = None,
    **settings: object,
) -> Consumer:
    """A group consumer with the tests' timeouts; ``settings`` override them."""
    options: dict[str, object] = {
        "group_id": group,
        "auto_offset_reset": "earliest",
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "heartbeat_interval_ms": 100,
        "request_timeout_ms": 5_000,
        "fetch_max_wait_ms": 100,
        **settings,
    }
    return Consumer(
        config=ConsumerConfig.from_mapping({"bootstrap_servers": address, **options}),
        connection_factory=connection_factory,
    )


def produce(address: str, topic: str, partitions: int | range, per_partition: int) -> None:
    """``per_partition`` records ``b"<partition>-<i>"`` to each partition, round robin."""
    numbers = range(partitions) if isinstance(partitions, int) else partitions
    with Producer(address, linger_ms=0) as producer:
        for i in range(per_partition):
            for p in numbers:
                producer.send(topic, f"{p}-{i}".encode(), partition=p)


def wait_for(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def poll_until(
    consumers: list[Consumer],
    condition: Callable[[], bool],
    timeout_s: float = 30,
    sink: list[ConsumerRecord] | None = None,
) -> None:
    """Poll each consumer in turn until ``condition``; records go to ``sink`` if given."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        for consumer in consumers:
            records = consumer.poll(timeout_ms=20)
            if sink is not None:
                sink += records
