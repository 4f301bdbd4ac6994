"""Tidelog through its Kafka listener as a peer: the same broker, driven by confluent-kafka.

Server: ``python -m broker`` as for Tidelog (``tidelog_peer``), plus ``kafka.listen`` on a
free port; the peer's address is that Kafka endpoint. Client: confluent-kafka (librdkafka)
with ``acks=all``, so the durability is Tidelog's (fsynced before the answer):

- produce: ``Producer.produce`` of every record (``linger.ms`` 5), then ``flush``;
- consume: ``Consumer.assign`` from offset 0 and ``consume`` in batches, no group;
- latency: one record at a time, each flushed (``linger.ms`` 0);
- end to end: a second client waiting in ``poll`` while single records are produced.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.peers import tidelog_peer
from benchmarks.peers.common import (
    KEY_BYTES,
    LATENCY_WARMUP,
    RunningServer,
    Workload,
    free_port,
    key_for,
    latency_figures,
    throughput_figures,
    wait_for_port,
)

NAME = "tidelog-kafka"
LABEL = "Tidelog (Kafka listener)"
BINARIES: dict[str, str] = {}  # runs from this checkout: nothing to install
TIMEOUT_S = 120.0
READ_BATCH = 10_000

CONFIGURATION = {
    "server": "as Tidelog, plus kafka.listen (the Kafka wire-protocol listener)",
    "durability": "acks=all: as Tidelog (fsynced up to the request's last offset)",
    "produce": "confluent-kafka Producer(acks=all, linger.ms=5), produce() then flush()",
    "consume": (
        f"confluent-kafka Consumer, assign from offset 0, consume({READ_BATCH}), no group, "
        "fetch.queue.backoff.ms=10"
    ),
    "latency": "confluent-kafka Producer(acks=all, linger.ms=0); produce() + flush() per record",
    "end_to_end": "acks=all producer; a confluent-kafka Consumer waiting in poll()",
}


def version() -> str:
    return tidelog_peer.version()


def start(work: Path) -> RunningServer:
    """Start a broker with its Kafka listener on 127.0.0.1; wait until it listens."""
    port = free_port()
    server = tidelog_peer.start(work, extra_settings=[f"kafka.listen=127.0.0.1:{port}"])
    try:
        wait_for_port(port, server.process.process, "the Kafka listener")
    except RuntimeError:
        server.stop()
        raise
    return RunningServer(server.process, f"127.0.0.1:{port}", server.data_dir)


def run(workload: Workload, address: str) -> dict[str, Any]:
    """Run one workload against the Kafka listener at ``address``; return its figures."""
    kinds = {
        "produce": _produce,
        "consume": _consume,
        "latency": _latency,
        "end_to_end": _end_to_end,
    }
    if workload.kind not in kinds:
        raise ValueError(f"the Kafka listener peer does not run workload {workload.kind!r}")
    _create_topic(address, workload.stream)
    return kinds[workload.kind](workload, address)


def _create_topic(address: str, topic: str) -> None:
    import confluent_kafka
    import confluent_kafka.admin

    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": address})
    future = admin.create_topics([confluent_kafka.admin.NewTopic(topic, 1, 1)])[topic]
    try:
        future.result(TIMEOUT_S)
    except confluent_kafka.KafkaException as exc:
        if exc.args[0].code() != confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def _producer(address: str, linger_ms: int) -> Any:
    import confluent_kafka

    return confluent_kafka.Producer(
        {"bootstrap.servers": address, "acks": "all", "linger.ms": linger_ms}
    )


def _produce(workload: Workload, address: str) -> dict[str, Any]:
    producer = _producer(address, 5)
    value = os.urandom(workload.value_bytes)
    started, cpu_started = time.perf_counter(), time.process_time()
    for i in range(workload.records):
        while True:
            try:
                producer.produce(workload.stream, value=value, key=key_for(i), partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    left = producer.flush(TIMEOUT_S)
    seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    if left:
        raise RuntimeError(f"{left} records not delivered")
    return throughput_figures(workload.records, KEY_BYTES + workload.value_bytes, seconds, cpu_s)


def _consume(workload: Workload, address: str) -> dict[str, Any]:
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": address,
            "group.id": "bench",
            "enable.auto.commit": False,
            # librdkafka stops fetching for fetch.queue.backoff.ms (1 s by default) each
            # time its local queue holds queued.min.messages: with a broker faster than
            # the Python loop draining the queue, a third of the run was that pause
            # (its debug log: "Fetch backoff for 1000ms: Local: Queue full").
            "fetch.queue.backoff.ms": 10,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(workload.stream, 0, 0)])
        got = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        deadline = time.monotonic() + TIMEOUT_S
        while got < workload.records and time.monotonic() < deadline:
            got += sum(1 for m in consumer.consume(READ_BATCH, 0.5) if m.error() is None)
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    finally:
        consumer.close()
    if got < workload.records:
        raise RuntimeError(f"read {got} of {workload.records} records")
    return throughput_figures(workload.records, KEY_BYTES + workload.value_bytes, seconds, cpu_s)


def _latency(workload: Workload, address: str) -> dict[str, Any]:
    producer = _producer(address, 0)
    value = os.urandom(workload.value_bytes)
    samples = []
    for i in range(LATENCY_WARMUP + workload.samples):
        started = time.perf_counter()
        producer.produce(workload.stream, value=value, key=key_for(i), partition=0)
        if producer.flush(TIMEOUT_S):
            raise RuntimeError("a record was not delivered")
        if i >= LATENCY_WARMUP:
            samples.append((time.perf_counter() - started) * 1000)
    return latency_figures(samples)


def _end_to_end(workload: Workload, address: str) -> dict[str, Any]:
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": address,
            "group.id": "bench-e2e",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 500,
        }
    )
    consumer.assign(
        [confluent_kafka.TopicPartition(workload.stream, 0, confluent_kafka.OFFSET_END)]
    )
    arrived: dict[int, float] = {}
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None and msg.key() is not None:
                arrived[int.from_bytes(msg.key(), "big")] = time.perf_counter()

    producer = _producer(address, 0)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    value = os.urandom(workload.value_bytes)
    time.sleep(1.0)  # the consumer's first fetch is parked before the first record
    sent: dict[int, float] = {}
    try:
        for i in range(LATENCY_WARMUP + workload.samples):
            sent[i] = time.perf_counter()
            producer.produce(workload.stream, value=value, key=key_for(i), partition=0)
            producer.flush(TIMEOUT_S)
            deadline = time.monotonic() + TIMEOUT_S
            while i not in arrived and time.monotonic() < deadline:
                time.sleep(0.0002)
            if i not in arrived:
                raise RuntimeError(f"record {i} never reached the consumer")
    finally:
        stop.set()
        reader.join(TIMEOUT_S)
        consumer.close()
    samples = [
        (arrived[i] - sent[i]) * 1000
        for i in range(LATENCY_WARMUP, LATENCY_WARMUP + workload.samples)
    ]
    return latency_figures(samples)
