"""Produce and fetch throughput through the broker daemon, against the storage layer.

Runs, in one process and one go:

- storage direct: ``PartitionLog.append`` of the same batches (no fsync, and fsync after
  each, i.e. what ``acks=1`` and ``acks=all`` cost at the bottom), then ``read`` of the
  whole log;
- the daemon (``python -m broker`` in a subprocess, so client and broker do not share a
  GIL) over loopback gRPC with the generated stub: unary ``Produce``, ``ProduceStream``
  (acks=1 and acks=all), unary ``Fetch`` and ``FetchStream``; also unary versus stream
  with 64 KiB batches, where per-call overhead shows.

Every figure is MB/s of batch bytes (10^6 bytes per second), the median of ``--repeat``
runs, interleaved across measurements (each produce run into a fresh topic, deleted after
it; reads re-read the first run's topic). The figures move with this machine's disk and
neighbours; compare figures from one run. The last line printed is one
JSON object with the figures and the daemon/storage ratios.

    python benchmarks/broker_bench.py [--mib 128] [--batch-kib 1024] [--repeat 5]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tidelog.broker.malloc import tune_malloc  # noqa: E402  (path set up above)
from tidelog.proto.tidelog.v1 import broker_pb2 as pb  # noqa: E402
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc  # noqa: E402
from tidelog.storage.log_manager import LogManager, LogManagerConfig  # noqa: E402
from tidelog.storage.records import BatchBuilder, iter_batch_headers  # noqa: E402

FETCH_BYTES = 4 * 1024 * 1024


def make_batch(batch_bytes: int, record_bytes: int = 1024) -> bytes:
    """One uncompressed batch of about ``batch_bytes`` of random-ish values."""
    builder = BatchBuilder()
    value = os.urandom(record_bytes)
    now = int(time.time() * 1000)
    while builder.estimated_size_bytes() + record_bytes + 16 <= batch_bytes:
        builder.append(now, None, value)
    return builder.build()


def rate(total_bytes: int, seconds: float) -> float:
    return round(total_bytes / seconds / 1e6, 1)


def timed(body: Callable[[], int]) -> float:
    """MB/s of the bytes ``body`` reports having moved."""
    started = time.perf_counter()
    moved = body()
    return rate(moved, time.perf_counter() - started)


def interleaved(
    repeat: int, measurements: dict[str, tuple[Callable[[int], int], Callable[[int], None]]]
) -> dict[str, float]:
    """Median MB/s of each measurement, runs interleaved to spread the machine's drift.

    ``measurements`` maps a name to ``(body, cleanup)``: ``body(run)`` moves bytes and
    returns how many; ``cleanup(run)`` runs after every run but the first (whose data the
    read measurements use). Dirty pages are written back (``os.sync``, not timed) before
    each run and deleted data never is, so one run's writeback does not slow the next.
    """
    samples: dict[str, list[float]] = {name: [] for name in measurements}
    for run in range(repeat):
        for name, (body, cleanup) in measurements.items():
            os.sync()
            samples[name].append(timed(functools.partial(body, run)))
            if run > 0:
                cleanup(run)
    return {name: statistics.median(values) for name, values in samples.items()}


def _keep(run: int) -> None:
    """Cleanup for measurements that write nothing."""


def next_offset(records: bytes) -> int:
    last = None
    for _, header in iter_batch_headers(records, validate=False):
        last = header
    assert last is not None
    return last.next_offset


# --- storage direct ---------------------------------------------------------------------


def bench_storage(batch: bytes, count: int, repeat: int) -> dict[str, float]:
    config = LogManagerConfig(cleaner_enabled=False)
    limit = {"max.message.bytes": str(len(batch) + 1024)}
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="tidelog-bench-") as tmp:
        manager = LogManager.open(tmp, config)
        try:
            for run in range(repeat):
                manager.create_topic(f"plain-{run}", 1, limit)
                manager.create_topic(f"synced-{run}", 1, limit)

            def append_plain(run: int) -> int:
                plog = manager.get_log(f"plain-{run}", 0)
                for _ in range(count):
                    plog.append(batch)
                return count * len(batch)

            def append_synced(run: int) -> int:
                plog = manager.get_log(f"synced-{run}", 0)
                for _ in range(count):
                    result = plog.append(batch)
                    plog.flush(result.last_offset + 1)
                return count * len(batch)

            def read_all(run: int) -> int:
                plog = manager.get_log("plain-0", 0)
                offset, moved = 0, 0
                while offset < plog.log_end_offset:
                    records = plog.read(offset, FETCH_BYTES).records
                    moved += len(records)
                    offset = next_offset(records)
                return moved

            def drop(prefix: str) -> Callable[[int], None]:
                return lambda run: manager.delete_topic(f"{prefix}-{run}")

            out.update(
                interleaved(
                    repeat,
                    {
                        "storage_append": (append_plain, drop("plain")),
                        "storage_append_fsync": (append_synced, drop("synced")),
                        "storage_read": (read_all, _keep),
                    },
                )
            )
        finally:
            manager.close()
    return out


# --- through the daemon -----------------------------------------------------------------


class Daemon:
    """``python -m broker`` on a free port with a temporary data directory."""

    def __init__(self, data_dir: Path, max_message_bytes: int) -> None:
        ready = data_dir.parent / "ready"
        self.log = open(data_dir.parent / "broker.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tidelog.broker",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                str(data_dir),
                "--ready-file",
                str(ready),
                "--set",
                "metrics.port=-1",
                "--set",
                f"message.max.bytes={max_message_bytes}",
                "--set",
                "log.cleaner.enable=false",
                "--log-level",
                "WARNING",
            ],
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the broker did not start")
            time.sleep(0.02)
        self.address = ready.read_text().strip()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()


def produce_request(
    topic: str, batch: bytes, acks: int, correlation_id: int = 0
) -> pb.ProduceRequest:
    return pb.ProduceRequest(
        correlation_id=correlation_id,
        acks=acks,
        timeout_ms=30_000,
        topics=[
            pb.ProduceTopicData(
                topic=topic, partitions=[pb.ProducePartitionData(partition=0, records=batch)]
            )
        ],
    )


def check(response: pb.ProduceResponse) -> None:
    for result in response.results:
        if result.error_code:
            raise RuntimeError(f"produce failed: {result.error_code} {result.error_message}")


def bench_daemon(
    stub: pb_grpc.BrokerStub,
    batch: bytes,
    count: int,
    small: bytes,
    small_count: int,
    repeat: int,
) -> dict[str, float]:
    out: dict[str, float] = {}
    topics = ["unary", "stream", "stream-all", "unary-small", "stream-small"]
    for topic in topics:
        for run in range(repeat):
            stub.CreateTopic(pb.CreateTopicRequest(name=f"{topic}-{run}"), timeout=30)

    def unary(topic: str, payload: bytes, n: int, acks: int) -> int:
        request = produce_request(topic, payload, acks)
        for _ in range(n):
            check(stub.Produce(request, timeout=60))
        return n * len(payload)

    def stream(topic: str, payload: bytes, n: int, acks: int) -> int:
        requests = (produce_request(topic, payload, acks, i) for i in range(n))
        answered = 0
        for response in stub.ProduceStream(requests, timeout=600):
            check(response)
            answered += 1
        assert answered == n
        return n * len(payload)

    def drop(prefix: str) -> Callable[[int], None]:
        def delete(run: int) -> None:
            stub.DeleteTopic(pb.DeleteTopicRequest(name=f"{prefix}-{run}"), timeout=60)

        return delete

    def fetch_request(topic: str, offset: int) -> pb.FetchRequest:
        return pb.FetchRequest(
            max_bytes=FETCH_BYTES,
            partitions=[
                pb.FetchPartition(
                    topic=topic, partition=0, fetch_offset=offset, partition_max_bytes=FETCH_BYTES
                )
            ],
        )

    def fetch_unary(topic: str) -> int:
        offset, moved = 0, 0
        while True:
            result = stub.Fetch(fetch_request(topic, offset), timeout=60).results[0]
            if result.error_code:
                raise RuntimeError(result.error_code)
            if not result.records:
                return moved
            moved += len(result.records)
            offset = next_offset(result.records)

    def fetch_stream(topic: str) -> int:
        pending: queue.Queue[pb.FetchRequest | None] = queue.Queue()

        def requests() -> Iterator[pb.FetchRequest]:
            while True:
                request = pending.get(timeout=60)
                if request is None:
                    return
                yield request

        pending.put(fetch_request(topic, 0))
        moved = 0
        for response in stub.FetchStream(requests(), timeout=600):
            result = response.results[0]
            if result.error_code:
                raise RuntimeError(result.error_code)
            if not result.records:
                pending.put(None)
                continue
            moved += len(result.records)
            pending.put(fetch_request(topic, next_offset(result.records)))
        return moved

    measurements: dict[str, tuple[Callable[[int], int], Callable[[int], None]]] = {
        "daemon_produce_unary": (lambda r: unary(f"unary-{r}", batch, count, 1), drop("unary")),
        "daemon_produce_stream": (
            lambda r: stream(f"stream-{r}", batch, count, 1),
            drop("stream"),
        ),
        "daemon_produce_stream_acks_all": (
            lambda r: stream(f"stream-all-{r}", batch, count, -1),
            drop("stream-all"),
        ),
        "daemon_produce_unary_64k": (
            lambda r: unary(f"unary-small-{r}", small, small_count, 1),
            drop("unary-small"),
        ),
        "daemon_produce_stream_64k": (
            lambda r: stream(f"stream-small-{r}", small, small_count, 1),
            drop("stream-small"),
        ),
        "daemon_fetch_unary": (lambda r: fetch_unary("unary-0"), _keep),
        "daemon_fetch_stream": (lambda r: fetch_stream("stream-0"), _keep),
        "daemon_fetch_unary_64k": (lambda r: fetch_unary("unary-small-0"), _keep),
    }
    out.update(interleaved(repeat, measurements))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128, help="MiB moved per measurement")
    parser.add_argument("--batch-kib", type=int, default=1024, help="batch size in KiB")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (median)")
    args = parser.parse_args()
    tune_malloc()  # the daemon does the same at start-up

    batch = make_batch(args.batch_kib * 1024)
    count = max(args.mib * 1024 * 1024 // len(batch), 1)
    small = make_batch(64 * 1024)
    small_count = max(count * len(batch) // len(small) // 4, 1)  # a quarter of the bytes
    print(
        f"batches of {len(batch)} bytes x {count}; 64 KiB runs: {len(small)} bytes x {small_count}"
    )

    figures = bench_storage(batch, count, args.repeat)
    with tempfile.TemporaryDirectory(prefix="tidelog-bench-") as tmp:
        daemon = Daemon(Path(tmp) / "data", max(len(batch), len(small)) + 1024)
        try:
            options = [
                ("grpc.max_receive_message_length", -1),
                ("grpc.max_send_message_length", -1),
            ]
            with grpc.insecure_channel(daemon.address, options=options) as channel:
                stub = pb_grpc.BrokerStub(channel)
                figures.update(bench_daemon(stub, batch, count, small, small_count, args.repeat))
        finally:
            daemon.stop()
    for name, value in figures.items():
        print(f"{name:34s} {value:10.1f} MB/s")

    best_produce = max(figures["daemon_produce_unary"], figures["daemon_produce_stream"])
    best_fetch = max(figures["daemon_fetch_unary"], figures["daemon_fetch_stream"])
    summary = {
        "batch_bytes": len(batch),
        "mib": args.mib,
        "repeat": args.repeat,
        **figures,
        "produce_ratio": round(best_produce / figures["storage_append"], 3),
        "produce_acks_all_ratio": round(
            figures["daemon_produce_stream_acks_all"] / figures["storage_append_fsync"], 3
        ),
        "fetch_ratio": round(best_fetch / figures["storage_read"], 3),
        "stream_over_unary_64k": round(
            figures["daemon_produce_stream_64k"] / figures["daemon_produce_unary_64k"], 3
        ),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
