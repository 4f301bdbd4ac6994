"""Redis Streams as a peer: ``redis-server`` with an append-only file and the ``redis`` client.

Server: ``redis-server --bind 127.0.0.1 --port <free port> --dir <tmp> --appendonly yes
--appendfsync everysec --save ""`` (Debian package ``redis-server``; no RDB snapshots,
defaults otherwise, so AOF rewrites run at their default thresholds). With ``everysec``
Redis answers a write once it is in the AOF's page cache (``write(2)`` happens before
replies are sent) and fsyncs the file in a background thread about once a second: an
acknowledged write can be lost if the machine (not the process) dies within ~1-2 s.

Records: one stream entry per record, fields ``k`` (the 16-byte key) and ``v`` (the
value), auto ids. Client ``redis`` (redis-py) with the ``hiredis`` reply parser:
- produce: ``XADD`` in non-transactional pipelines of ``PIPELINE`` commands;
- consume: ``XRANGE`` from the start with ``COUNT`` ``READ_BATCH``, resuming after the last id;
- latency: one ``XADD`` round trip at a time;
- end to end: ``XADD`` to a second connection waiting in ``XREAD BLOCK``.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.peers.common import (
    KEY_BYTES,
    LATENCY_WARMUP,
    RunningServer,
    Workload,
    command_version,
    free_port,
    key_for,
    latency_figures,
    start_listening,
    throughput_figures,
)

NAME = "redis"
LABEL = "Redis Streams"
BINARIES = {"redis-server": "redis-server"}
PIPELINE = 1_000
READ_BATCH = 1_000

CONFIGURATION = {
    "server": (
        'redis-server --appendonly yes --appendfsync everysec --save "" (no RDB), '
        "temp dir, 127.0.0.1, defaults otherwise"
    ),
    "durability": (
        "appendfsync everysec: acknowledged after write(2) to the AOF, before fsync; "
        "fsync about once a second in a background thread"
    ),
    "produce": f"XADD * k <key> v <value> in non-transactional pipelines of {PIPELINE}",
    "consume": f"XRANGE from the start, COUNT {READ_BATCH}, resuming after the last id",
    "latency": "one XADD round trip at a time",
    "end_to_end": "XADD to another connection blocked in XREAD BLOCK",
}


def version() -> str:
    binary = shutil.which("redis-server")
    return command_version([binary, "--version"]) if binary else "not installed"


def start(work: Path) -> RunningServer:
    """Start redis-server on 127.0.0.1 (a free port, data under ``work``); wait until it listens."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    data_dir = work / "redis-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data_dir),
        "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
        "--protected-mode", "no", "--daemonize", "no", "--logfile", "",
    ]  # fmt: skip
    return start_listening(argv, work / "redis.log", "redis-server", port, data_dir)


# --- workloads ------------------------------------------------------------------------------


def _connect(address: str) -> Any:
    import redis

    host, _, port = address.rpartition(":")
    return redis.Redis(host=host, port=int(port), socket_timeout=30)


def run(workload: Workload, address: str) -> dict[str, Any]:
    """Run one workload against the redis-server at ``address``; return its figures."""
    kinds = {
        "produce": _produce,
        "consume": _consume,
        "latency": _latency,
        "end_to_end": _end_to_end,
    }
    if workload.kind not in kinds:
        raise ValueError(f"Redis does not run workload {workload.kind!r}")
    return kinds[workload.kind](workload, address)


def _produce(workload: Workload, address: str) -> dict[str, Any]:
    client = _connect(address)
    value = os.urandom(workload.value_bytes)
    stream = workload.stream
    try:
        started, cpu_started = time.perf_counter(), time.process_time()
        pipe = client.pipeline(transaction=False)
        for i in range(workload.records):
            pipe.xadd(stream, {b"k": key_for(i), b"v": value})
            if len(pipe) >= PIPELINE:
                pipe.execute()
        if len(pipe):
            pipe.execute()
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        stored = client.xlen(stream)
    finally:
        client.close()
    if stored != workload.records:
        raise RuntimeError(f"Redis stream holds {stored} entries, expected {workload.records}")
    return throughput_figures(workload.records, KEY_BYTES + workload.value_bytes, seconds, cpu_s)


def _consume(workload: Workload, address: str) -> dict[str, Any]:
    client = _connect(address)
    try:
        got = 0
        payload = 0
        low: bytes | str = "-"
        started, cpu_started = time.perf_counter(), time.process_time()
        while got < workload.records:
            entries = client.xrange(workload.stream, min=low, max="+", count=READ_BATCH)
            if not entries:
                raise RuntimeError(f"Redis consumer stalled at {got} records")
            got += len(entries)
            for _entry_id, fields in entries:
                payload += len(fields[b"k"]) + len(fields[b"v"])
            low = b"(" + entries[-1][0]
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    finally:
        client.close()
    figures = throughput_figures(got, KEY_BYTES + workload.value_bytes, seconds, cpu_s)
    figures["payload_bytes"] = payload
    return figures


def _latency(workload: Workload, address: str) -> dict[str, Any]:
    client = _connect(address)
    value = os.urandom(workload.value_bytes)
    samples: list[float] = []
    try:
        for i in range(LATENCY_WARMUP + workload.samples):
            started = time.perf_counter()
            client.xadd(workload.stream, {b"k": key_for(i), b"v": value})
            if i >= LATENCY_WARMUP:
                samples.append((time.perf_counter() - started) * 1000)
    finally:
        client.close()
    return latency_figures(samples)


def _end_to_end(workload: Workload, address: str) -> dict[str, Any]:
    producer = _connect(address)
    consumer = _connect(address)
    total = LATENCY_WARMUP + workload.samples
    arrived: dict[int, float] = {}
    seen = threading.Condition()
    failure: list[BaseException] = []
    # "$" resolved now, before the first XADD: the reader starts after everything older.
    last_id: bytes | str = producer.xadd(workload.stream, {b"k": b"", b"v": b""})

    def read() -> None:
        nonlocal last_id
        try:
            while len(arrived) < total:
                answer = consumer.xread({workload.stream: last_id}, count=100, block=5_000)
                now = time.perf_counter()
                for _stream, entries in answer or []:
                    with seen:
                        for entry_id, fields in entries:
                            arrived[int.from_bytes(fields[b"k"], "big")] = now
                            last_id = entry_id
                        seen.notify_all()
        except BaseException as exc:
            failure.append(exc)
            with seen:
                seen.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    value = os.urandom(workload.value_bytes)
    samples: list[float] = []
    try:
        for i in range(total):
            started = time.perf_counter()
            producer.xadd(workload.stream, {b"k": key_for(i), b"v": value})
            with seen:
                if not seen.wait_for(lambda i=i: i in arrived or bool(failure), timeout=10):  # type: ignore[misc]
                    raise RuntimeError(f"record {i} never reached the Redis consumer")
            if failure:
                raise RuntimeError(f"the Redis reader failed: {failure[0]!r}")
            if i >= LATENCY_WARMUP:
                samples.append((arrived[i] - started) * 1000)
        reader.join(10)
    finally:
        producer.close()
        consumer.close()
    return latency_figures(samples)
