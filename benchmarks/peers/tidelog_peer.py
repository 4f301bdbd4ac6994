"""Tidelog as a peer: the broker daemon (``python -m broker``) and its own Python client.

Server: ``python -m broker --data-dir <tmp> --listen 127.0.0.1:0 --ready-file ...
--set metrics.port=-1`` with the embedded defaults otherwise: ``flush.ms`` and
``flush.messages`` unset (-1), so the broker never fsyncs on a timer; durability comes from
the producer's ``acks=all``, which makes the broker fsync every partition a request wrote,
up to its last offset, before it answers (concurrent requests share one fsync).

Client, as ``docs/client.md`` recommends: ``Producer(acks="all")`` with its tuned defaults
(``batch_size`` 256 KiB, ``linger_ms`` 5, up to 5 requests in flight on one
``ProduceStream``, idempotence on, compression off: lz4 would only spend CPU on
incompressible random values); ``Consumer.poll`` over ``FetchStream`` (one fetch in flight
while the application decodes). Latency runs use ``linger_ms=0`` and wait for each future.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.peers.common import (
    KEY_BYTES,
    LATENCY_WARMUP,
    RunningServer,
    ServerProcess,
    Workload,
    key_for,
    latency_figures,
    process_cpu_split_s,
    throughput_figures,
)

ROOT = Path(__file__).resolve().parents[2]
# Where the broker and client code come from: this checkout by default; the harness's
# --tidelog-root points it at another tree (say, a `git archive HEAD` snapshot, so a run is
# not disturbed by uncommitted edits). Workers and the broker run with it as cwd and first
# on PYTHONPATH; ``benchmarks.peers`` itself always comes from ROOT.
source_root = ROOT


def python_env() -> dict[str, str]:
    """Environment for a broker or worker process: ``source_root`` first, then ROOT."""
    paths = [str(source_root)] + ([str(ROOT)] if source_root != ROOT else [])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


NAME = "tidelog"
LABEL = "Tidelog"
BINARIES: dict[str, str] = {}  # runs from this checkout: nothing to install

CONFIGURATION = {
    "server": "python -m broker, embedded defaults, metrics off, one data directory",
    "durability": (
        "acks=all: the broker fsyncs the partition up to the request's last offset before it "
        "answers (group commit); flush.ms/flush.messages unset (no timed fsync)"
    ),
    "produce": (
        "Producer(acks='all'), defaults: batch_size 256 KiB, linger_ms 5, 5 requests in flight "
        "on one ProduceStream, idempotent, compression off (lz4 off)"
    ),
    "consume": "Consumer.assign + seek_to_beginning + poll() over FetchStream, no group",
    "latency": "Producer(acks='all', linger_ms=0); send(...).result() one record at a time",
    "end_to_end": "acks='all' producer; a Consumer thread waiting in poll() (long-poll fetch)",
}
# The same broker and client with acks=1: answered once appended to the page cache, not
# fsynced, which is the durability NATS (2-minute sync) and Redis (everysec) acknowledge.
ACKS1_LABEL = "Tidelog acks=1"
ACKS1_CONFIGURATION = {
    "server": "the same broker process as Tidelog",
    "durability": (
        "acks=1: answered once appended (page cache), not fsynced; flush.ms unset, so the "
        "data reaches disk when the kernel writes it back or the broker stops cleanly"
    ),
    "produce": "as Tidelog, with acks=1",
    "latency": "as Tidelog, with acks=1",
    "end_to_end": "as Tidelog, with acks=1",
}


def version() -> str:
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "storage", "broker", "client", "proto"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if source_root != ROOT:
        where = f"code from {source_root}"
    else:
        where = "working tree" + (" with uncommitted changes" if dirty else "")
    return f"tidelog 0.1.0 (git {commit or 'unknown'}, {where})"


def start(work: Path, extra_settings: Sequence[str] = ()) -> RunningServer:
    """Start a broker on 127.0.0.1 (port 0, data under ``work``); wait for its ready file.

    ``extra_settings``: more ``KEY=VALUE`` broker settings (the Kafka listener peer's).
    """
    data_dir = work / "tidelog-data"
    ready = work / "tidelog-ready"
    argv = [
        sys.executable, "-m", "tidelog.broker", "--data-dir", str(data_dir),
        "--listen", "127.0.0.1:0", "--ready-file", str(ready),
        "--log-level", "WARNING", "--set", "metrics.port=-1",
    ]  # fmt: skip
    for setting in extra_settings:
        argv += ["--set", setting]
    process = ServerProcess.start(
        argv, work / "tidelog.log", "tidelog broker", env=python_env(), cwd=source_root
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        if process.process.poll() is not None or time.monotonic() > deadline:
            process.stop()
            raise RuntimeError(f"the Tidelog broker did not start:\n{process.log_tail()}")
        time.sleep(0.02)
    return RunningServer(process, ready.read_text().strip(), data_dir)


# --- workloads (each runs in a worker process of its own) --------------------------------


def _create_topic(address: str, topic: str, partitions: int) -> None:
    from tidelog.client import AdminClient, TopicAlreadyExistsError

    with AdminClient(address) as admin:
        try:
            admin.create_topic(topic, partitions)
        except TopicAlreadyExistsError:
            pass


def run(workload: Workload, address: str) -> dict[str, Any]:
    """Run one workload against the broker at ``address``; return its figures."""
    if workload.kind == "produce":
        return _produce(workload, address)
    if workload.kind == "consume":
        return _consume(workload, address)
    if workload.kind == "consume_bare":
        return _consume_bare(workload, address)
    if workload.kind == "latency":
        return _latency(workload, address)
    if workload.kind == "end_to_end":
        return _end_to_end(workload, address)
    if workload.kind == "backlog":
        return _backlog(workload, address)
    raise ValueError(f"unknown workload {workload.kind!r}")


def _send_all(producer: Any, topic: str, start: int, count: int, value: bytes) -> None:
    send = producer.send
    for i in range(start, start + count):
        send(topic, value, key_for(i))
    producer.flush()


def _produce(workload: Workload, address: str) -> dict[str, Any]:
    import gc

    from tidelog.client import Producer

    _create_topic(address, workload.stream, workload.partitions)
    value = os.urandom(workload.value_bytes)
    gc.freeze()  # the harness's objects, not the client's: keep full collections short
    with Producer(address, acks=workload.acks) as producer:
        producer.partitions_for(workload.stream)
        started, cpu_started = time.perf_counter(), time.process_time()
        _send_all(producer, workload.stream, 0, workload.records, value)
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    return throughput_figures(workload.records, KEY_BYTES + workload.value_bytes, seconds, cpu_s)


def _consume(workload: Workload, address: str) -> dict[str, Any]:
    from tidelog.client import Consumer, TopicPartition

    with Consumer(address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(workload.stream, p) for p in range(workload.partitions)])
        consumer.seek_to_beginning()
        for tp in consumer.assignment():
            consumer.position(tp)  # look positions up first: time the reading only
        got = 0
        payload = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        while got < workload.records:
            batch = consumer.poll(timeout_ms=10_000)
            if not batch:
                raise RuntimeError(f"Tidelog consumer stalled at {got} records")
            got += len(batch)
            for record in batch:
                payload += len(record.value or b"") + len(record.key or b"")
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    figures = throughput_figures(got, KEY_BYTES + workload.value_bytes, seconds, cpu_s)
    figures["payload_bytes"] = payload
    return figures


def _consume_bare(workload: Workload, address: str) -> dict[str, Any]:
    """The same records over a bare ``FetchStream``: what grpcio carries here, no client.

    The stub alone, with the consumer's fetch sizes (1 MiB a partition): one fetch at a
    time (the next offset is in the answer), the answer's bytes counted and never
    decoded; only the last batch's header is read, to know where to fetch next. The
    consumer's rate over this one, in the same run, is how much of the transport's
    ceiling the client leaves unused.
    """
    import grpc

    from tidelog.proto.tidelog.v1 import broker_pb2 as pb
    from tidelog.proto.tidelog.v1 import broker_pb2_grpc
    from tidelog.storage.records import iter_batch_headers

    requests: queue.SimpleQueue[pb.FetchRequest | None] = queue.SimpleQueue()

    def outgoing() -> Any:
        while (request := requests.get()) is not None:
            yield request

    def fetch(offset: int, correlation_id: int) -> pb.FetchRequest:
        return pb.FetchRequest(
            correlation_id=correlation_id,
            max_wait_ms=500,
            min_bytes=1,
            max_bytes=52_428_800,
            partitions=[
                pb.FetchPartition(
                    topic=workload.stream,
                    partition=0,
                    fetch_offset=offset,
                    partition_max_bytes=1_048_576,
                )
            ],
        )

    options = [("grpc.max_receive_message_length", 64 << 20)]
    with grpc.insecure_channel(address, options=options) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        answers = stub.FetchStream(outgoing())
        offset, fetches, wire_bytes = 0, 0, 0
        started, cpu_started = time.perf_counter(), time.process_time()
        requests.put(fetch(offset, fetches))
        for answer in answers:
            records = answer.results[0].records
            if answer.results[0].error_code:
                raise RuntimeError(f"bare fetch failed: {answer.results[0].error_code}")
            wire_bytes += len(records)
            last = None
            for _, header in iter_batch_headers(records, validate=False):
                last = header
            if last is not None:
                offset = last.next_offset
            fetches += 1
            if offset >= workload.records:
                break
            requests.put(fetch(offset, fetches))
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        requests.put(None)
        answers.cancel()
    figures = throughput_figures(offset, KEY_BYTES + workload.value_bytes, seconds, cpu_s)
    figures["fetches"] = fetches
    figures["wire_mb_per_s"] = round(wire_bytes / seconds / 1e6, 1)
    return figures


def _latency(workload: Workload, address: str) -> dict[str, Any]:
    from tidelog.client import Producer

    _create_topic(address, workload.stream, 1)
    value = os.urandom(workload.value_bytes)
    samples: list[float] = []
    with Producer(address, acks=workload.acks, linger_ms=0) as producer:
        for i in range(LATENCY_WARMUP + workload.samples):
            started = time.perf_counter()
            producer.send(workload.stream, value, key_for(i)).result(timeout=10)
            if i >= LATENCY_WARMUP:
                samples.append((time.perf_counter() - started) * 1000)
    return latency_figures(samples)


def _end_to_end(workload: Workload, address: str) -> dict[str, Any]:
    from tidelog.client import Consumer, Producer, TopicPartition

    _create_topic(address, workload.stream, 1)
    tp = TopicPartition(workload.stream, 0)
    arrived: dict[int, float] = {}
    seen = threading.Condition()
    ready = threading.Event()
    stop_reading = threading.Event()

    def read() -> None:
        with Consumer(address, auto_offset_reset="latest") as consumer:
            consumer.assign([tp])
            consumer.position(tp)
            ready.set()
            while not stop_reading.is_set():
                for record in consumer.poll(timeout_ms=200):
                    now = time.perf_counter()
                    with seen:
                        arrived[int.from_bytes(record.key or b"", "big")] = now
                        seen.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if not ready.wait(30):
        raise RuntimeError("the Tidelog end-to-end consumer did not start")
    value = os.urandom(workload.value_bytes)
    samples: list[float] = []
    with Producer(address, acks=workload.acks, linger_ms=0) as producer:
        for i in range(LATENCY_WARMUP + workload.samples):
            started = time.perf_counter()
            producer.send(workload.stream, value, key_for(i), partition=0)
            with seen:
                if not seen.wait_for(lambda i=i: i in arrived, timeout=10):  # type: ignore[misc]
                    raise RuntimeError(f"record {i} never reached the Tidelog consumer")
                if i >= LATENCY_WARMUP:
                    samples.append((arrived[i] - started) * 1000)
    stop_reading.set()
    reader.join(5)
    return latency_figures(samples)


# The baseline's write size: the producer's default batch_size, one request a write.
PLAIN_CHUNK_BYTES = 256 * 1024


def _backlog(workload: Workload, address: str) -> dict[str, Any]:
    """Append ``total_bytes`` in steps of ``step_bytes``; the rate of each step.

    Each step also records the broker's CPU seconds (``server_pid``) per GB appended: the
    cost of an append, apart from the disk.

    After each step the same bytes are appended to a plain file in the same file system
    (the system temp directory, where the harness keeps the broker's data too), in
    ``PLAIN_CHUNK_BYTES`` writes each followed by ``fsync``, as ``acks=all`` syncs each
    request: the disk's own rate at that point. A virtual disk's write cache can make the
    first gigabytes much faster than the rest; the ratio of the two rates is what tells
    whether the log slows down as it grows.
    """
    import gc

    from tidelog.client import Producer

    _create_topic(address, workload.stream, 1)
    value = os.urandom(workload.value_bytes)
    record_bytes = KEY_BYTES + workload.value_bytes
    per_step = max(1, workload.step_bytes // record_bytes)
    steps = max(1, workload.total_bytes // (per_step * record_bytes))
    gc.freeze()
    points: list[dict[str, Any]] = []
    plain_dir = tempfile.mkdtemp(prefix="tidelog-bench-plain-")
    plain_fd = os.open(os.path.join(plain_dir, "plain.log"), os.O_WRONLY | os.O_CREAT, 0o600)
    chunk = os.urandom(PLAIN_CHUNK_BYTES)
    try:
        with Producer(address, acks="all") as producer:
            producer.partitions_for(workload.stream)
            for step in range(steps):
                started, cpu_started = time.perf_counter(), time.process_time()
                user_started, system_started = process_cpu_split_s(workload.server_pid)
                _send_all(producer, workload.stream, step * per_step, per_step, value)
                seconds = time.perf_counter() - started
                cpu_s = time.process_time() - cpu_started
                user_ended, system_ended = process_cpu_split_s(workload.server_pid)
                point = throughput_figures(per_step, record_bytes, seconds, cpu_s)
                if workload.server_pid:
                    # The broker's work per byte: its own code (user time) should cost the
                    # same whatever the log's size; the kernel's share (system time) also
                    # follows what the disk is doing.
                    gigabytes = per_step * record_bytes / 1e9
                    user_s, system_s = user_ended - user_started, system_ended - system_started
                    point["server_cpu_s"] = round(user_s + system_s, 3)
                    point["server_cpu_s_per_gb"] = round((user_s + system_s) / gigabytes, 2)
                    point["server_user_s_per_gb"] = round(user_s / gigabytes, 2)
                    point["server_system_s_per_gb"] = round(system_s / gigabytes, 2)
                point["backlog_bytes_before"] = step * per_step * record_bytes
                plain_mb_per_s = _plain_append(plain_fd, chunk, per_step * record_bytes)
                point["plain_mb_per_s"] = round(plain_mb_per_s, 1)
                point["over_plain"] = round(point["mb_per_s"] / plain_mb_per_s, 3)
                point["loadavg_1m"] = round(os.getloadavg()[0], 2)  # the shared machine's noise
                points.append(point)
                print(f"progress {step + 1}/{steps}", file=sys.stderr, flush=True)
    finally:
        os.close(plain_fd)
        shutil.rmtree(plain_dir, ignore_errors=True)
    return {"records_per_step": per_step, "plain_chunk_bytes": PLAIN_CHUNK_BYTES, "steps": points}


def _plain_append(fd: int, chunk: bytes, total_bytes: int) -> float:
    """Append ``total_bytes`` to ``fd`` in ``chunk`` writes, each fsynced; MB/s."""
    written = 0
    started = time.perf_counter()
    while written < total_bytes:
        written += os.write(fd, chunk[: total_bytes - written])
        os.fsync(fd)
    return written / (time.perf_counter() - started) / 1e6
