"""NATS JetStream as a peer: ``nats-server -js`` with file storage and the ``nats-py`` client.

Server: ``nats-server -a 127.0.0.1 -p <free port> -js -sd <tmp>`` (Debian package
``nats-server``), defaults otherwise. A stream per workload: file storage, one replica,
limits retention, no limits, one subject. A JetStream publish acknowledgement (PubAck)
means the server has stored the message in its file store: written to the stream's block
file buffers, *not* fsynced. The file store fsyncs on its own timer, every 2 minutes by
default (``sync_interval``, configurable from nats-server 2.10; 2.9 has the 2-minute default
compiled in) and when a block fills, relying on replication for durability.

Records: NATS messages have no key, so the payload is the 16-byte key followed by the value:
the same bytes as the other peers move. Client, per the nats-py documentation:
- produce: ``js.publish_async`` (up to 4,000 publishes in flight, nats-py's default),
  acknowledgements settled by callbacks, ``publish_async_completed()`` at the end;
- consume: a pull consumer (``AckPolicy.NONE``, ``DeliverPolicy.ALL``) fetching batches of
  ``FETCH_BATCH`` messages;
- latency: ``await js.publish(...)`` (waits for the PubAck), one at a time;
- end to end: ``js.publish`` to a pull consumer waiting in ``fetch``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
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

NAME = "nats"
LABEL = "NATS JetStream"
BINARIES = {"nats-server": "nats-server"}
FETCH_BATCH = 1_000
PUBLISH_ASYNC_MAX_PENDING = 4_000

CONFIGURATION = {
    "server": "nats-server -js -sd <tmp dir> on 127.0.0.1, defaults otherwise",
    "durability": (
        "file storage, 1 replica; PubAck once stored in the file store (not fsynced); "
        "the file store fsyncs every 2 min (default sync interval) and when a block fills"
    ),
    "produce": (
        f"js.publish_async, up to {PUBLISH_ASYNC_MAX_PENDING} in flight (nats-py default), "
        "acks settled by callbacks; payload = 16-byte key + value"
    ),
    "consume": f"pull consumer, AckPolicy.NONE, fetch(batch={FETCH_BATCH})",
    "latency": "await js.publish(...) one message at a time (waits for the PubAck)",
    "end_to_end": "js.publish to a pull consumer waiting in fetch()",
}


def version() -> str:
    binary = shutil.which("nats-server")
    return command_version([binary, "--version"]) if binary else "not installed"


def start(work: Path) -> RunningServer:
    """Start nats-server on 127.0.0.1 (a free port, data under ``work``); wait until it listens."""
    binary = shutil.which("nats-server")
    if binary is None:
        raise RuntimeError("nats-server is not installed")
    data_dir = work / "nats-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(data_dir)]
    return start_listening(argv, work / "nats.log", "nats-server", port, data_dir)


# --- workloads ------------------------------------------------------------------------------


def run(workload: Workload, address: str) -> dict[str, Any]:
    """Run one workload against the nats-server at ``address``; return its figures."""
    kinds = {
        "produce": _produce,
        "consume": _consume,
        "latency": _latency,
        "end_to_end": _end_to_end,
    }
    if workload.kind not in kinds:
        raise ValueError(f"NATS does not run workload {workload.kind!r}")
    return asyncio.run(kinds[workload.kind](workload, address))


def _subject(stream: str) -> str:
    return f"{stream}.records"


async def _connect(address: str) -> Any:
    import nats

    return await nats.connect(f"nats://{address}", max_reconnect_attempts=0)


async def _ensure_stream(js: Any, stream: str) -> None:
    from nats.js.api import StorageType
    from nats.js.errors import NotFoundError

    try:
        await js.stream_info(stream)
    except NotFoundError:
        await js.add_stream(name=stream, subjects=[_subject(stream)], storage=StorageType.FILE)


async def _produce(workload: Workload, address: str) -> dict[str, Any]:
    nc = await _connect(address)
    try:
        js = nc.jetstream(publish_async_max_pending=PUBLISH_ASYNC_MAX_PENDING)
        await _ensure_stream(js, workload.stream)
        subject = _subject(workload.stream)
        value = os.urandom(workload.value_bytes)
        errors: list[BaseException] = []
        acked = 0

        def settled(future: asyncio.Future[Any]) -> None:
            nonlocal acked
            if future.cancelled():
                errors.append(asyncio.CancelledError())
            elif future.exception() is not None:
                errors.append(future.exception())  # type: ignore[arg-type]
            else:
                acked += 1

        publish_async = js.publish_async
        started, cpu_started = time.perf_counter(), time.process_time()
        for i in range(workload.records):
            future = await publish_async(subject, key_for(i) + value)
            future.add_done_callback(settled)
        await nc.flush()
        await asyncio.wait_for(js.publish_async_completed(), 120)
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        if errors or acked != workload.records:
            raise RuntimeError(f"NATS: {acked} acknowledged, {len(errors)} failed: {errors[:1]}")
    finally:
        await nc.close()
    return throughput_figures(workload.records, KEY_BYTES + workload.value_bytes, seconds, cpu_s)


async def _consume(workload: Workload, address: str) -> dict[str, Any]:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await _connect(address)
    try:
        js = nc.jetstream()
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL,
        )
        psub = await js.pull_subscribe(
            _subject(workload.stream), durable=None, stream=workload.stream, config=config
        )
        got = 0
        payload = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        while got < workload.records:
            msgs = await psub.fetch(batch=min(FETCH_BATCH, workload.records - got), timeout=10)
            got += len(msgs)
            for msg in msgs:
                payload += len(msg.data)
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    finally:
        await nc.close()
    figures = throughput_figures(got, KEY_BYTES + workload.value_bytes, seconds, cpu_s)
    figures["payload_bytes"] = payload
    return figures


async def _latency(workload: Workload, address: str) -> dict[str, Any]:
    nc = await _connect(address)
    try:
        js = nc.jetstream()
        await _ensure_stream(js, workload.stream)
        subject = _subject(workload.stream)
        value = os.urandom(workload.value_bytes)
        samples: list[float] = []
        for i in range(LATENCY_WARMUP + workload.samples):
            started = time.perf_counter()
            await js.publish(subject, key_for(i) + value, timeout=10)
            if i >= LATENCY_WARMUP:
                samples.append((time.perf_counter() - started) * 1000)
    finally:
        await nc.close()
    return latency_figures(samples)


async def _end_to_end(workload: Workload, address: str) -> dict[str, Any]:
    from nats.errors import TimeoutError as NatsTimeoutError
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    producer_nc = await _connect(address)
    consumer_nc = await _connect(address)
    try:
        js = producer_nc.jetstream()
        await _ensure_stream(js, workload.stream)
        subject = _subject(workload.stream)
        consumer_js = consumer_nc.jetstream()
        config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.NEW)
        psub = await consumer_js.pull_subscribe(
            subject, durable=None, stream=workload.stream, config=config
        )
        arrived: dict[int, float] = {}
        waiting: dict[int, asyncio.Future[None]] = {}
        total = LATENCY_WARMUP + workload.samples

        async def read() -> None:
            while len(arrived) < total:
                try:
                    msgs = await psub.fetch(batch=100, timeout=5)
                except (TimeoutError, NatsTimeoutError):
                    continue
                now = time.perf_counter()
                for msg in msgs:
                    i = int.from_bytes(msg.data[:KEY_BYTES], "big")
                    arrived[i] = now
                    future = waiting.pop(i, None)
                    if future is not None and not future.done():
                        future.set_result(None)

        reader = asyncio.create_task(read())
        value = os.urandom(workload.value_bytes)
        loop = asyncio.get_running_loop()
        samples: list[float] = []
        for i in range(total):
            done: asyncio.Future[None] = loop.create_future()
            waiting[i] = done
            started = time.perf_counter()
            await js.publish(subject, key_for(i) + value, timeout=10)
            if i not in arrived:
                await asyncio.wait_for(done, 10)
            if i >= LATENCY_WARMUP:
                samples.append((arrived[i] - started) * 1000)
        await asyncio.wait_for(reader, 10)
    finally:
        await producer_nc.close()
        await consumer_nc.close()
    return latency_figures(samples)
