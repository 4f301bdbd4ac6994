"""How close Tidelog's Kafka listener comes to the machine's own limits (issue #31).

::

    python benchmarks/limits_bench.py [--mb 256] [--records 200000] [--samples 1000]
                                      [--peers redis] [--quick] [--set key=value ...]
    python benchmarks/limits_bench.py --profile consume|produce [--mb 64] [--set ...]

``make bench-limits`` installs what it needs first (Debian's iperf3 and redis-server with
apt-get as root, the ``bench`` extra) and runs this with ``BENCH_ARGS``.

Everything is measured in one run, one step after the other, on the same machine state,
so the ratios compare like with like (the machine is shared and noisy: compare the
figures of one run only, never across runs):

1. the machine's ceilings:

   - ``loopback_mb_per_s``: one TCP stream over 127.0.0.1 (``iperf3 -c ... -t 3``; without
     iperf3, ``loopback_tool`` says ``socketpair``: one Python thread ``sendall``-ing 1 MiB
     buffers to another ``recv_into``-ing them, where the syscalls dominate);
   - ``disk_mb_per_s``: sequential ``write`` + ``os.fsync`` of ``disk_batch_bytes`` at a
     time, in the broker's data directory, as a segment flush fsyncs (the batch size is
     the mean stored batch of a short 1 KiB ``acks=all`` pilot run, read back from its
     log); the mean of ``disk_before_mb_per_s`` and ``disk_after_mb_per_s``, taken right
     before and right after the 1 KiB ``acks=all`` produce it is compared with (a
     virtual disk's rate depends on what was written just before it);
   - ``fsync_p50_ms``: one small append and ``os.fsync`` there (what ``acks=all`` must pay);
   - ``echo_p50_ms`` / ``echo_p99_ms``: a bare asyncio TCP echo server in its own process
     (``asyncio.start_server``), 116 bytes (a 100 B record's key and value) there and back
     from a blocking socket, one at a time;

2. Tidelog (one broker process, ``benchmarks/kafka_bench.start_broker``) through its Kafka
   listener with confluent-kafka, whose client work is C (librdkafka), so the broker is
   what is measured:

   - ``kafka_consume_1k_mb_per_s`` (1 partition) and ``kafka_consume_1k_4p_mb_per_s`` (4):
     ``--mb`` of 1 KiB values read by one consumer (assign from 0, timed from the first
     record's arrival); their ratios to the
     loopback ceiling are ``kafka_consume_1k_over_loopback`` and ``..._4p_over_loopback``
     (target >= 0.5); ``..._broker_cpu_ms_per_mb``: the broker process's CPU time (all
     its threads, user and system) per MB consumed, which a busy machine disturbs less
     than the rates, and ``..._broker_user_ms_per_mb`` its user part (the rest is the
     kernel, loopback's TCP included: a sender's CPU pays for delivering to the receiver);
     ``..._client_cpu_ms_per_mb``: the benchmark process's CPU (the client's, every
     thread) per MB, and ``..._cpu_bound_mb_per_s`` the rate at which that client and the
     broker together would keep every core busy (``os.cpu_count()`` over the two CPU
     costs added), over loopback as ``kafka_consume_1k_cpu_bound_over_loopback`` and
     ``..._4p_...``: what no consumer of the kind could pass on this machine;
   - ``kafka_fetch_1k_raw_mb_per_s`` / ``..._4p_raw_...`` and ``..._raw_over_loopback``:
     the same records read by a minimal Fetch client (``raw_fetch_values``: one socket,
     one reused buffer, framing parsed only), which leaves the broker as the bottleneck
     where confluent-kafka's Python loop (one ``Message`` object per record) is one;
   - the same four consume figures again with the suffixes ``_ab_zero_copy`` and
     ``_ab_copying``, from two brokers restarted one after the other over the same data
     directory with ``kafka.zero.copy.fetch`` on and off: zero copy against the copying
     path in one run, on the same footing (skipped when the run sets it off);
   - ``kafka_produce_1k_mb_per_s``: the same bytes produced with ``acks=all``
     (``linger.ms`` 5), over the disk ceiling: ``kafka_produce_1k_over_disk`` (>= 0.5);
     its ``_client_cpu_ms_per_mb``, ``_broker_cpu_ms_per_mb`` and ``_cpu_bound_mb_per_s``
     as for consuming, and ``kafka_produce_1k_cpu_bound_over_disk``;
   - ``kafka_produce_100b_records_per_s`` / ``kafka_consume_100b_records_per_s``: the
     peers' workloads (``benchmarks/peers/tidelog_kafka_peer``, 16 B key, 100 B value,
     ``acks=all``), and with ``--peers redis`` the same workloads against Redis Streams
     (``benchmarks/peers/redis_peer``) and the ratios ``..._over_redis``;
   - ``kafka_p50_acks1_ms`` / ``kafka_p99_acks1_ms``: one 100 B record at a time,
     ``acks=1``, ``linger.ms`` 0, each flushed; over the echo round trip:
     ``kafka_p50_acks1_over_echo`` (<= 3) and ``kafka_p99_acks1_over_echo`` (<= 5);
   - ``kafka_p50_acksall_ms`` and ``kafka_p50_acksall_minus_fsync_ms``: the same with
     ``acks=all``, less one fsync's p50 (``fsync_interleaved_p50_ms``: fsyncs in the data
     directory taken between the timed produces, ``FsyncProbe``): what ``acks=all`` costs
     beyond its fsync;
   - ``kafka_raw_p50_acks1_ms`` / ``kafka_raw_p50_acksall_ms`` and
     ``kafka_raw_p50_acks1_over_echo``: the same single records from a minimal Produce
     client (``raw_produce_latency``: one socket, a request framed once), which leaves
     out librdkafka's hand-offs between its own threads.

``--latency`` runs only the echo and the single-record figures (and one fsync's p50,
taken in the broker's data directory between them): a quick before/after.

MB is 10^6 bytes of record payload (key + value). The last line printed is one JSON
object; ``load_avg`` (taken before and after) says how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import confluent_kafka  # noqa: E402 - after the path entry above

from benchmarks.kafka_bench import start_broker  # noqa: E402
from benchmarks.peers import redis_peer, tidelog_kafka_peer  # noqa: E402
from benchmarks.peers.common import Workload, free_port, process_cpu_split_s  # noqa: E402
from tidelog import client  # noqa: E402
from tidelog.storage.records import BatchBuilder, iter_batch_headers  # noqa: E402

TIMEOUT_S = 120.0
ONE_KIB = 1024
SMALL_VALUE = 100
KEY_BYTES = 16
_MB = 1e6


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---------------------------------------------------------------- the machine's ceilings


def loopback_ceiling(seconds: float) -> tuple[float, str]:
    """MB/s of one TCP stream over 127.0.0.1, and the tool that measured it."""
    iperf = shutil.which("iperf3")
    if iperf is not None:
        port = free_port()
        server = subprocess.Popen(
            [iperf, "-s", "-p", str(port), "-B", "127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        why = "iperf3 did not answer"
        try:
            deadline = time.monotonic() + 30  # until the server listens (a busy machine)
            while time.monotonic() < deadline:
                out = subprocess.run(
                    [iperf, "-c", "127.0.0.1", "-p", str(port), "-t", str(int(seconds)), "-J"],
                    capture_output=True,
                    text=True,
                    timeout=seconds + 30,
                    check=False,
                )
                if out.returncode == 0:
                    # A run can end "successfully" with an error report and no sums
                    # (the server not yet listening): try again, as for a failure.
                    report = json.loads(out.stdout)
                    received = report.get("end", {}).get("sum_received")
                    if received is not None:
                        return received["bits_per_second"] / 8 / _MB, "iperf3"
                    why = str(report.get("error", "no sum_received in iperf3's report"))
                else:
                    why = (out.stderr or out.stdout).strip()[-200:]
                time.sleep(0.2)
        except (json.JSONDecodeError, KeyError, subprocess.TimeoutExpired) as exc:
            why = repr(exc)
        finally:
            server.kill()
            server.wait()
        return _socketpair_ceiling(seconds), f"socketpair (iperf3 failed: {why})"
    return _socketpair_ceiling(seconds), "socketpair"


def _socketpair_ceiling(seconds: float) -> float:
    with socket.create_server(("127.0.0.1", 0)) as server:
        left = socket.create_connection(server.getsockname())
        right, _ = server.accept()
    received = 0
    done = threading.Event()

    def drain() -> None:
        nonlocal received
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        while True:
            n = right.recv_into(view)
            if not n:
                break
            received += n
        done.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    chunk = b"\0" * (1 << 20)
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        left.sendall(chunk)
    left.shutdown(socket.SHUT_WR)
    done.wait(30)
    elapsed = time.perf_counter() - started
    left.close()
    right.close()
    return received / elapsed / _MB


def disk_ceiling(directory: Path, batch_bytes: int, total_bytes: int) -> float:
    """MB/s of sequential ``batch_bytes`` writes, each followed by ``os.fsync``."""
    path = directory / "limits-disk-ceiling.tmp"
    chunk = os.urandom(batch_bytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        started = time.perf_counter()
        while written < total_bytes:
            written += os.write(fd, chunk)
            os.fsync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()
    return written / elapsed / _MB


def fsync_latency(directory: Path, samples: int) -> list[float]:
    """Milliseconds of one small append plus ``os.fsync``, ``samples`` times."""
    path = directory / "limits-fsync.tmp"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    out = []
    try:
        record = b"x" * (KEY_BYTES + SMALL_VALUE + 70)  # a one-record batch's size
        for _ in range(samples):
            started = time.perf_counter()
            os.write(fd, record)
            os.fsync(fd)
            out.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return out


class FsyncProbe:
    """One small append and ``os.fsync`` in ``directory`` per call, timed (ms, in
    ``samples``): run between the timed produces of ``single_record_latency``, so that
    the fsync a produce is compared with saw the same disk, at the same moments (a
    separate run of ``fsync_latency`` on this shared machine moved 0.12-2.8 ms between
    runs while the produces did not)."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / "limits-fsync-probe.tmp"
        self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        self._record = b"x" * (KEY_BYTES + SMALL_VALUE + 70)
        self.samples: list[float] = []

    def __call__(self) -> None:
        started = time.perf_counter()
        os.write(self._fd, self._record)
        os.fsync(self._fd)
        self.samples.append((time.perf_counter() - started) * 1000)

    def close(self) -> None:
        os.close(self._fd)
        self._path.unlink()


_ECHO_SERVER = """
import asyncio, sys
async def echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def echo_latency(samples: int) -> list[float]:
    """Milliseconds of 116 bytes to an asyncio echo server (its own process) and back."""
    server = subprocess.Popen(
        [sys.executable, "-c", _ECHO_SERVER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        payload = b"e" * (KEY_BYTES + SMALL_VALUE)
        out = []
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(200 + samples):
                started = time.perf_counter()
                sock.sendall(payload)
                got = 0
                while got < len(payload):
                    got += len(sock.recv(65536))
                if i >= 200:
                    out.append((time.perf_counter() - started) * 1000)
        return out
    finally:
        server.kill()
        server.wait()


# ---------------------------------------------------------------- Tidelog through Kafka


def produce_values(bootstrap: str, topic: str, partitions: int, count: int, acks: str) -> float:
    """Seconds to produce ``count`` 1 KiB values round-robin over ``partitions``."""
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5}
    )
    value = os.urandom(ONE_KIB)
    started = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.01)
    left = producer.flush(TIMEOUT_S)
    elapsed = time.perf_counter() - started
    if left:
        raise RuntimeError(f"{left} records not delivered")
    return elapsed


def consume_values(bootstrap: str, topic: str, partitions: int, count: int) -> float:
    """Seconds for one consumer to read ``count`` records of ``partitions`` from 0, from
    the first record's arrival."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "limits",
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 10,  # as benchmarks/peers/tidelog_kafka_peer
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        got = 0
        started = 0.0
        deadline = time.monotonic() + TIMEOUT_S
        while got < count and time.monotonic() < deadline:
            batch = consumer.consume(10_000, 0.5)
            if not got and batch:
                # Timed from the first record: the connection, metadata and the first
                # fetch's setup are not the steady rate being compared with loopback.
                started = time.perf_counter()
                batch = batch[1:]
                got = 1
            got += sum(1 for m in batch if m.error() is None)
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    if got < count:
        raise RuntimeError(f"read {got} of {count} records of {topic}")
    return elapsed


def raw_fetch_values(bootstrap: str, topic: str, partitions: int, count: int) -> float:
    """Seconds for a minimal Fetch client to read ``count`` records of ``partitions``
    from 0: Fetch v4 (1 MiB per partition) on one blocking socket, each answer read into
    one reused buffer (``recv_into``) and parsed only for its framing and each
    partition's last batch header (the next offset); nothing is decoded or copied beyond
    the kernel's copy into the buffer. So the broker's serving rate is measured, not a
    client's per-record work (confluent-kafka's Python ``Message`` objects)."""
    host, port = bootstrap.rsplit(":", 1)
    name = topic.encode()
    offsets = [0] * partitions
    got = [0] * partitions
    buf = bytearray(64 << 20)
    view = memoryview(buf)
    started = time.perf_counter()
    deadline = time.monotonic() + TIMEOUT_S
    with socket.create_connection((host, int(port))) as sock:
        while sum(got) < count and time.monotonic() < deadline:
            body = struct.pack(">iiiibih", -1, 500, 1, 64 << 20, 0, 1, len(name)) + name
            body += struct.pack(">i", partitions)
            body += b"".join(struct.pack(">iqi", p, offsets[p], 1 << 20) for p in range(partitions))
            header = struct.pack(">hhih", 1, 4, 1, 6) + b"limits"
            request = header + body
            sock.sendall(struct.pack(">i", len(request)) + request)
            size = struct.unpack(">i", _recv_exactly(sock, view, 4))[0]
            frame = _recv_exactly(sock, view, size)
            # correlation id, throttle, one topic (its name), its partitions.
            position = 4 + 4 + 4
            (name_len,) = struct.unpack_from(">h", frame, position)
            position += 2 + name_len
            (answered,) = struct.unpack_from(">i", frame, position)
            position += 4
            for _ in range(answered):
                partition, error = struct.unpack_from(">ih", frame, position)
                position += 4 + 2 + 8 + 8
                (aborted,) = struct.unpack_from(">i", frame, position)
                position += 4 + max(aborted, 0) * 16
                (length,) = struct.unpack_from(">i", frame, position)
                position += 4
                if error:
                    raise RuntimeError(f"fetch of {topic}-{partition} answered error {error}")
                end = position + max(length, 0)
                batch = position
                while batch + 61 <= end:  # whole batches: the next offset, the records
                    base, batch_length = struct.unpack_from(">qi", frame, batch)
                    if batch + 12 + batch_length > end:
                        break
                    (delta,) = struct.unpack_from(">i", frame, batch + 23)
                    (records,) = struct.unpack_from(">i", frame, batch + 57)
                    if base + delta >= offsets[partition]:
                        got[partition] += records
                        offsets[partition] = base + delta + 1
                    batch += 12 + batch_length
                position = end
    elapsed = time.perf_counter() - started
    if sum(got) < count:
        raise RuntimeError(f"raw fetch read {sum(got)} of {count} records of {topic}")
    return elapsed


def _recv_exactly(sock: socket.socket, view: memoryview, count: int) -> memoryview:
    got = 0
    while got < count:
        n = sock.recv_into(view[got:count])
        if not n:
            raise ConnectionError("the broker hung up")
        got += n
    return view[:count]


def single_record_latency(
    bootstrap: str,
    topic: str,
    acks: str,
    samples: int,
    between: Callable[[], None] | None = None,
) -> list[float]:
    """Milliseconds per 100 B record (16 B key), ``linger.ms`` 0, each flushed;
    ``between`` runs after each timed sample, untimed (``FsyncProbe``)."""
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 0}
    )
    value = os.urandom(SMALL_VALUE)
    out = []
    for i in range(200 + samples):
        started = time.perf_counter()
        producer.produce(topic, value=value, key=i.to_bytes(KEY_BYTES, "big"), partition=0)
        if producer.flush(TIMEOUT_S):
            raise RuntimeError("a record was not delivered")
        if i >= 200:
            out.append((time.perf_counter() - started) * 1000)
            if between is not None:
                between()
    return out


def raw_produce_latency(bootstrap: str, topic: str, acks: int, samples: int) -> list[float]:
    """Milliseconds per Produce (v3) of one 100 B record (16 B key) to partition 0 from a
    minimal client: one blocking socket, the request framed once with ``struct``, the
    answer read whole and not parsed. What the broker adds to an echo round trip, without
    librdkafka's own hand-offs between its threads (``single_record_latency``)."""
    builder = BatchBuilder()
    builder.append(int(time.time() * 1000), b"k" * KEY_BYTES, os.urandom(SMALL_VALUE))
    records = builder.build()
    name = topic.encode()
    body = struct.pack(">hhi", -1, acks, 30_000) + struct.pack(">ih", 1, len(name)) + name
    body += struct.pack(">iii", 1, 0, len(records)) + records
    request = struct.pack(">hhih", 0, 3, 1, 6) + b"limits" + body
    framed = struct.pack(">i", len(request)) + request
    host, port = bootstrap.rsplit(":", 1)
    view = memoryview(bytearray(1 << 16))
    out = []
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(200 + samples):
            started = time.perf_counter()
            sock.sendall(framed)
            size = struct.unpack(">i", _recv_exactly(sock, view, 4))[0]
            _recv_exactly(sock, view, size)
            if i >= 200:
                out.append((time.perf_counter() - started) * 1000)
    return out


def mean_batch_bytes(topic_dir: Path) -> int:
    """The mean size of the batches stored in a partition's ``.log`` files."""
    sizes = []
    for log_file in sorted(topic_dir.glob("*.log")):
        data = log_file.read_bytes()
        sizes += [h.size_bytes for _, h in iter_batch_headers(data, validate=False)]
    return int(statistics.fmean(sizes)) if sizes else 16 * ONE_KIB


def _redis_figures(work: Path, records: int) -> dict[str, float]:
    server = redis_peer.start(work / "redis")
    try:
        produced = redis_peer.run(Workload("produce", "limits", SMALL_VALUE, records=records),
                                  server.address)  # fmt: skip
        consumed = redis_peer.run(Workload("consume", "limits", SMALL_VALUE, records=records),
                                  server.address)  # fmt: skip
    finally:
        server.stop()
    return {"produce": produced["records_per_s"], "consume": consumed["records_per_s"]}


def profile(kind: str, mb: int, settings: dict[str, str], top: int) -> str:
    """cProfile of the broker, in this process (``InProcessBroker``), while confluent-kafka
    produces (``acks=all``) or consumes ``mb`` MB of 1 KiB records: every Python thread
    the broker starts is profiled (``threading.setprofile`` enables a profiler in each),
    and the merged statistics, by own time, are returned as text. For ``consume`` the
    records are produced by an unprofiled broker first, and a second one, profiled from
    its start, serves them from the same data directory. librdkafka's threads are C and
    are not profiled; profiling slows Python code down several times, so the shares
    matter, not the times."""
    import cProfile
    import io
    import pstats

    from tidelog.broker.testing import InProcessBroker

    profiles: list[cProfile.Profile] = []

    def start_profiling(*_: object) -> None:
        sys.setprofile(None)  # this thread's hook: replaced by its own profiler
        profiler = cProfile.Profile()
        profiles.append(profiler)
        profiler.enable()

    count = mb * 1_000_000 // ONE_KIB
    broker_settings = {"kafka.listen": "127.0.0.1:0", "metrics.port": -1, **settings}
    data_dir = Path(tempfile.mkdtemp(prefix="tidelog-limits-profile-"))
    try:
        if kind == "consume":
            with InProcessBroker(data_dir=data_dir, settings=broker_settings) as broker:
                broker.server.core.create_topic("profiled", 1, {})
                produce_values(f"127.0.0.1:{broker.server.kafka_port}", "profiled", 1, count, "1")
        threading.setprofile(start_profiling)
        try:
            with InProcessBroker(data_dir=data_dir, settings=broker_settings) as broker:
                bootstrap = f"127.0.0.1:{broker.server.kafka_port}"
                for profiler in profiles:
                    profiler.clear()  # the broker's start (imports, recovery) is not the path
                if kind == "consume":
                    consume_values(bootstrap, "profiled", 1, count)
                else:
                    broker.server.core.create_topic("profiled", 1, {})
                    produce_values(bootstrap, "profiled", 1, count, "all")
                for profiler in profiles:
                    profiler.disable()
        finally:
            threading.setprofile(None)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    out = io.StringIO()
    for profiler in profiles:
        profiler.create_stats()
    profiles = [p for p in profiles if p.stats]  # type: ignore[attr-defined]  # idle threads
    if profiles:
        stats = pstats.Stats(*profiles, stream=out)
        # Threads waiting (the pool for work, the loop for events, the fsync thread for a
        # flush) are idle, not the path's cost: left out of the listing.
        waits = ("acquire' of '_thread.lock", "poll' of 'select.epoll", "get' of '_queue")
        table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
        for key in [k for k in table if any(w in k[2] for w in waits)]:
            del table[key]
        stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def latency_figures(bootstrap: str, data_dir: Path, samples: int) -> dict[str, float]:
    """The single-record figures of a running broker (topics ``lat1`` and ``latall``
    exist): ``acks=1`` and ``acks=all`` percentiles and one fsync's p50 in its data
    directory, taken between them."""
    acks1 = single_record_latency(bootstrap, "lat1", "1", samples)
    raw1 = raw_produce_latency(bootstrap, "lat1", 1, samples)
    fsync = fsync_latency(data_dir, 200)
    probe = FsyncProbe(data_dir)
    try:
        acksall = single_record_latency(bootstrap, "latall", "all", samples, probe)
    finally:
        probe.close()
    rawall = raw_produce_latency(bootstrap, "latall", -1, samples)
    return {
        "fsync_interleaved_p50_ms": round(statistics.median(probe.samples), 3),
        "kafka_p50_acks1_ms": round(statistics.median(acks1), 3),
        "kafka_p99_acks1_ms": round(_percentile(acks1, 0.99), 3),
        "kafka_raw_p50_acks1_ms": round(statistics.median(raw1), 3),
        "kafka_raw_p99_acks1_ms": round(_percentile(raw1, 0.99), 3),
        "fsync_p50_ms": round(statistics.median(fsync), 3),
        "kafka_p50_acksall_ms": round(statistics.median(acksall), 3),
        "kafka_p99_acksall_ms": round(_percentile(acksall, 0.99), 3),
        "kafka_raw_p50_acksall_ms": round(statistics.median(rawall), 3),
    }


def _latency_ratios(r: dict[str, Any]) -> None:
    r["kafka_p50_acks1_over_echo"] = round(r["kafka_p50_acks1_ms"] / r["echo_p50_ms"], 3)
    r["kafka_p99_acks1_over_echo"] = round(r["kafka_p99_acks1_ms"] / r["echo_p99_ms"], 3)
    # The fsync sampled between the acks=all produces (FsyncProbe) where there is one.
    fsync = r.get("fsync_interleaved_p50_ms", r["fsync_p50_ms"])
    r["kafka_p50_acksall_minus_fsync_ms"] = round(r["kafka_p50_acksall_ms"] - fsync, 3)
    if "kafka_raw_p50_acks1_ms" in r:
        raw = r["kafka_raw_p50_acks1_ms"]
        r["kafka_raw_p50_acks1_over_echo"] = round(raw / r["echo_p50_ms"], 3)


def latency_only(samples: int, settings: dict[str, str]) -> dict[str, Any]:
    """``--latency``: the echo round trip and the single-record figures alone (a quick
    before/after of the latency work; the same steps as the full run)."""
    results: dict[str, Any] = {"load_avg_before": _load(), "samples": samples,
                               "broker_settings": settings}  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="tidelog-limits-"))
    try:
        echo = echo_latency(samples)
        results["echo_p50_ms"] = round(statistics.median(echo), 3)
        results["echo_p99_ms"] = round(_percentile(echo, 0.99), 3)
        process, address, bootstrap = start_broker(work, settings)
        try:
            with client.AdminClient(address) as admin:
                for topic in ("lat1", "latall"):
                    admin.create_topic(topic, 1)
            results.update(latency_figures(bootstrap, work / "data", samples))
        finally:
            _stop(process)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _latency_ratios(results)
    results["load_avg_after"] = _load()
    print(json.dumps(results))
    return results


def consume_steps(bootstrap: str, pid: int, count: int, suffix: str) -> dict[str, Any]:
    """The 1 KiB consume figures of topics ``c1`` and ``c4`` (keys end in ``suffix``):
    confluent-kafka's rate, the raw Fetch client's, and the broker's CPU for each."""
    out: dict[str, Any] = {}
    moved_mb = count * ONE_KIB / _MB
    for topic, partitions, key in (("c1", 1, "1k"), ("c4", 4, "1k_4p")):
        for name, run in (("consume", consume_values), ("fetch", raw_fetch_values)):
            label = f"kafka_{name}_{key}" + ("_raw" if name == "fetch" else "") + suffix
            user_before, system_before = process_cpu_split_s(pid)
            client_before = _own_cpu_s()
            seconds = run(bootstrap, topic, partitions, count)
            client_s = _own_cpu_s() - client_before
            user_after, system_after = process_cpu_split_s(pid)
            user_s = user_after - user_before
            broker_s = user_s + system_after - system_before
            out[f"{label}_mb_per_s"] = round(moved_mb / seconds)
            out.update(_cpu_figures(label, count, client_s, broker_s))
            out[f"{label}_broker_user_ms_per_mb"] = round(user_s * 1000 / moved_mb, 3)
    return out


def _cpu_figures(label: str, count: int, client_s: float, broker_s: float) -> dict[str, Any]:
    """CPU ms per MB of ``count`` 1 KiB records for the client (this process) and the
    broker, and ``..._cpu_bound_mb_per_s``: the rate at which the two together would
    keep every core of the machine busy, which no client of the kind can pass here."""
    moved_mb = count * ONE_KIB / _MB
    both_ms = (client_s + broker_s) * 1000 / moved_mb
    return {
        f"{label}_broker_cpu_ms_per_mb": round(broker_s * 1000 / moved_mb, 3),
        f"{label}_client_cpu_ms_per_mb": round(client_s * 1000 / moved_mb, 3),
        f"{label}_cpu_bound_mb_per_s": round((os.cpu_count() or 1) * 1000 / both_ms),
    }


def _own_cpu_s() -> float:
    """CPU seconds (user and system, every thread) of this process: the client's, while
    one client runs in it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="MB of 1 KiB records per run")
    parser.add_argument("--records", type=int, default=200_000, help="100 B records per run")
    parser.add_argument("--samples", type=int, default=1_000, help="latency samples")
    parser.add_argument("--peers", default="", help="comma-separated: redis")
    parser.add_argument("--quick", action="store_true", help="32 MB, 20,000 records, 200 samples")
    parser.add_argument("--set", action="append", default=[], help="a broker key=value")
    parser.add_argument("--profile", choices=("consume", "produce"),
                        help="print the broker's cProfile for one path and stop")  # fmt: skip
    parser.add_argument("--latency", action="store_true",
                        help="only the echo, fsync and single-record latency figures")  # fmt: skip
    args = parser.parse_args(argv)
    mb, records, samples = (32, 20_000, 200) if args.quick else (args.mb, args.records,
                                                                 args.samples)  # fmt: skip
    count = mb * 1_000_000 // ONE_KIB
    settings = dict(item.split("=", 1) for item in args.set)
    if args.profile:
        print(profile(args.profile, mb, settings, 30))
        return {}
    if args.latency:
        return latency_only(samples, settings)
    results: dict[str, Any] = {"load_avg_before": _load(), "mb": mb, "records": records,
                               "samples": samples, "broker_settings": settings}  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="tidelog-limits-"))
    try:
        loopback, tool = loopback_ceiling(3.0)
        results["loopback_mb_per_s"], results["loopback_tool"] = round(loopback), tool
        echo = echo_latency(samples)
        results["echo_p50_ms"] = round(statistics.median(echo), 3)
        results["echo_p99_ms"] = round(_percentile(echo, 0.99), 3)
        process, address, bootstrap = start_broker(work, settings)
        try:
            with client.AdminClient(address) as admin:
                for topic, partitions in (
                    ("c1", 1),
                    ("c4", 4),
                    ("lat1", 1),
                    ("latall", 1),
                    ("pilot", 1),
                ):
                    admin.create_topic(topic, partitions)
                for topic in ("p100", "c100"):
                    admin.create_topic(topic, 1)
            data_dir = work / "data"
            # The disk ceiling at the batch size the producer stores (a short pilot
            # run's mean batch), measured right before and right after the 1 KiB
            # acks=all produce into c1, which is compared with their mean: a virtual
            # disk's rate depends on how much was written just before (its host's
            # cache), so one ceiling taken after the produce favours the produce, or
            # the ceiling, by chance.
            produce_values(bootstrap, "pilot", 1, min(count, 16_384), "all")
            batch = mean_batch_bytes(next(data_dir.rglob("pilot-0")))
            disk_bytes = min(count * ONE_KIB, 512 * 1024 * 1024)
            disk_before = disk_ceiling(data_dir, batch, disk_bytes)
            broker_before, client_before = sum(process_cpu_split_s(process.pid)), _own_cpu_s()
            seconds = produce_values(bootstrap, "c1", 1, count, "all")
            client_s = _own_cpu_s() - client_before
            broker_s = sum(process_cpu_split_s(process.pid)) - broker_before
            disk_after = disk_ceiling(data_dir, batch, disk_bytes)
            results.update(_cpu_figures("kafka_produce_1k", count, client_s, broker_s))
            disk = (disk_before + disk_after) / 2
            results["kafka_produce_1k_mb_per_s"] = round(count * ONE_KIB / seconds / _MB)
            results["disk_batch_bytes"], results["disk_mb_per_s"] = batch, round(disk)
            results["disk_before_mb_per_s"] = round(disk_before)
            results["disk_after_mb_per_s"] = round(disk_after)
            results["kafka_produce_1k_mean_batch_bytes"] = mean_batch_bytes(
                next(data_dir.rglob("c1-0"))
            )
            produce_values(bootstrap, "c4", 4, count, "1")
            fsync = fsync_latency(data_dir, 200)
            results["fsync_p50_ms"] = round(statistics.median(fsync), 3)
            results.update(consume_steps(bootstrap, process.pid, count, ""))
            # 100 B records, the peers' workloads.
            produced = tidelog_kafka_peer.run(
                Workload("produce", "p100", SMALL_VALUE, records=records), bootstrap
            )
            consumed = tidelog_kafka_peer.run(
                Workload("consume", "p100", SMALL_VALUE, records=records), bootstrap
            )
            results["kafka_produce_100b_records_per_s"] = round(produced["records_per_s"])
            results["kafka_consume_100b_records_per_s"] = round(consumed["records_per_s"])
            latency = latency_figures(bootstrap, data_dir, samples)
            # One fsync's p50 is the figure taken above, beside the disk ceiling.
            latency.pop("fsync_p50_ms")
            results.update(latency)
        finally:
            _stop(process)
        if settings.get("kafka.zero.copy.fetch", "true") == "true":
            # The A/B of issue #31 in one run: the same records served by two brokers
            # restarted over the same data directory, zero copy on, then off. Both arms
            # restarted: the first broker's figures above come from a process that wrote
            # the data itself, which is not the same footing.
            for suffix, zero_copy in (("_ab_zero_copy", True), ("_ab_copying", False)):
                (work / "ready").unlink()
                ab_settings = {**settings, "kafka.zero.copy.fetch": zero_copy}
                process, _, bootstrap = start_broker(work, ab_settings)
                try:
                    results.update(consume_steps(bootstrap, process.pid, count, suffix))
                finally:
                    _stop(process)
        if "redis" in args.peers.split(","):
            if shutil.which("redis-server") is None:
                results["redis"] = "redis-server is not installed: no ratios"
            else:
                redis = _redis_figures(work, records)
                results["redis_produce_100b_records_per_s"] = round(redis["produce"])
                results["redis_consume_100b_records_per_s"] = round(redis["consume"])
                for kind in ("produce", "consume"):
                    ours = results[f"kafka_{kind}_100b_records_per_s"]
                    results[f"kafka_{kind}_100b_over_redis"] = round(ours / redis[kind], 3)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    r = results
    r["kafka_consume_1k_over_loopback"] = round(r["kafka_consume_1k_mb_per_s"] / loopback, 3)
    r["kafka_consume_1k_4p_over_loopback"] = round(r["kafka_consume_1k_4p_mb_per_s"] / loopback, 3)
    r["kafka_fetch_1k_raw_over_loopback"] = round(r["kafka_fetch_1k_raw_mb_per_s"] / loopback, 3)
    r["kafka_fetch_1k_4p_raw_over_loopback"] = round(
        r["kafka_fetch_1k_4p_raw_mb_per_s"] / loopback, 3
    )
    r["kafka_produce_1k_over_disk"] = round(r["kafka_produce_1k_mb_per_s"] / disk, 3)
    r["kafka_produce_1k_cpu_bound_over_disk"] = round(
        r["kafka_produce_1k_cpu_bound_mb_per_s"] / disk, 3
    )
    for key in ("1k", "1k_4p"):
        r[f"kafka_consume_{key}_cpu_bound_over_loopback"] = round(
            r[f"kafka_consume_{key}_cpu_bound_mb_per_s"] / loopback, 3
        )
    _latency_ratios(r)
    r["load_avg_after"] = _load()
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
