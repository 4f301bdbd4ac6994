"""Client benchmark: producer and consumer throughput, produce and end-to-end latency.

::

    python benchmarks/client_bench.py [--records 1000000] [--partitions 1] [--quick]

Runs, each in a process of its own against one broker process (``python -m broker``, a
temporary data directory, 127.0.0.1, metrics off):

1. the floor: a bare gRPC round trip (unary, and one message on an open bidi stream) to a
   trivial echo server in another process, no protobuf, no Tidelog;
2. produce throughput: one producer process sends ``--records`` records (16-byte key,
   100-byte value; ``acks=1``, otherwise the producer's defaults) and flushes;
3. consume throughput: one consumer process reads them back from offset zero;
4. produce latency: single records, each waited for, ``acks=1`` and ``acks=all``
   (``linger_ms=0``);
5. end-to-end latency: from ``send`` to a consumer that is waiting in ``poll``;
6. three timestamps per record: produce and consume throughput against this broker and
   against a second one with ``log.batch.times.enable=false`` (no sent/received times
   stored or fetched: the plain baseline), ``--ts-rounds`` interleaved rounds of fresh
   topics, the median of the rounds' ratios: ``three_ts_over_plain_produce`` and
   ``three_ts_over_plain_consume`` (1.0 = no cost; the target is >= 0.97), and the bytes
   the times add per batch (on disk, in a fetch answer) and per produce request.

Keys are unique (``i`` as 16 big-endian bytes). On a one-partition topic (the default)
the producer skips murmur2, which cannot change the partition; ``--partitions 3`` shows
the cost of hashing every key in pure Python (see docs/client.md). A second produce run
on a three-partition topic is reported as ``produce_records_per_s_3p_keyed``.

The machine is shared and noisy: every figure comes from one run in the same script,
next to the gRPC floor measured in the same minute. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KEY_BYTES = 16
VALUE_BYTES = 100
RECORD_BYTES = KEY_BYTES + VALUE_BYTES


# --- processes ---------------------------------------------------------------------------


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )


def _run_role(*args: str, timeout_s: float = 600) -> dict[str, Any]:
    """Run this script in another process with ``--role``; return its JSON answer."""
    process = _spawn(str(Path(__file__)), *args)
    out, _ = process.communicate(timeout=timeout_s)
    if process.returncode != 0:
        raise RuntimeError(f"{args} failed with status {process.returncode}")
    answer: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return answer


def _wait_for_file(path: Path, process: subprocess.Popen[str], what: str) -> str:
    deadline = time.monotonic() + 30
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.02)
    return path.read_text().strip()


def start_broker(
    work: Path, *settings: str, name: str = "broker"
) -> tuple[subprocess.Popen[str], str]:
    ready = work / f"{name}-ready"
    ready.unlink(missing_ok=True)
    extra: list[str] = []
    for setting in settings:
        extra += ["--set", setting]
    data = work / ("data" if name == "broker" else f"data-{name}")
    process = _spawn(
        "-m", "tidelog.broker", "--data-dir", str(data), "--listen", "127.0.0.1:0",
        "--ready-file", str(ready), "--log-level", "WARNING", "--set", "metrics.port=-1",
        *extra,
    )  # fmt: skip
    return process, _wait_for_file(ready, process, "the broker")


def start_echo_server(work: Path) -> tuple[subprocess.Popen[str], str]:
    ready = work / "echo-ready"
    process = _spawn(str(Path(__file__)), "--role", "echo-server", "--ready-file", str(ready))
    return process, _wait_for_file(ready, process, "the echo server")


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


# --- roles (each runs in its own process) --------------------------------------------------


def role_echo_server(ready_file: str) -> None:
    """A gRPC server that echoes bytes: unary and bidi, no protobuf."""
    import grpc

    def unary(request: bytes, context: object) -> bytes:
        return request

    def stream(requests: Any, context: object) -> Any:
        yield from requests

    handler = grpc.method_handlers_generic_handler(
        "echo.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.stream_stream_rpc_method_handler(stream),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    Path(ready_file).write_text(f"127.0.0.1:{port}")
    server.wait_for_termination()


def role_grpc_floor(address: str, calls: int) -> dict[str, Any]:
    import grpc

    payload = b"x" * 200  # about a one-record produce request
    with grpc.insecure_channel(address) as channel:
        unary = channel.unary_unary("/echo.Echo/Unary")
        for _ in range(200):
            unary(payload, timeout=10)
        unary_ms = []
        for _ in range(calls):
            started = time.perf_counter()
            unary(payload, timeout=10)
            unary_ms.append((time.perf_counter() - started) * 1000)
        import queue

        requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        answers = channel.stream_stream("/echo.Echo/Stream")(iter(requests.get, None))
        stream_ms = []
        for i in range(calls + 200):
            started = time.perf_counter()
            requests.put(payload)
            next(answers)
            if i >= 200:
                stream_ms.append((time.perf_counter() - started) * 1000)
        requests.put(None)
    return {
        "grpc_roundtrip_p50_ms": statistics.median(unary_ms),
        "grpc_roundtrip_p99_ms": _percentile(unary_ms, 99),
        "grpc_stream_roundtrip_p50_ms": statistics.median(stream_ms),
    }


def _keys(count: int) -> list[bytes]:
    return [i.to_bytes(KEY_BYTES, "big") for i in range(count)]


def role_produce(address: str, topic: str, records: int) -> dict[str, Any]:
    from tidelog.client import Producer

    keys = _keys(records)
    value = os.urandom(VALUE_BYTES)
    # The million keys are the harness's, not the client's: keep the collector from
    # walking their list on every full collection of the run.
    gc.freeze()
    gc_seconds = _time_in_gc()
    with Producer(address, acks=1) as producer:
        producer.partitions_for(topic)
        started = time.perf_counter()
        cpu_started = time.process_time()
        gc_started = gc_seconds()
        send = producer.send
        for key in keys:
            send(topic, value, key)
        producer.flush()
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        in_gc = gc_seconds() - gc_started
    return {
        "records_per_s": records / seconds,
        "mb_per_s": records * RECORD_BYTES / seconds / 1e6,
        "cpu_us_per_record": cpu / records * 1e6,
        "gc_share": in_gc / seconds,
    }


def _time_in_gc() -> Callable[[], float]:
    """A reader of the wall seconds spent in the garbage collector from now on."""
    total = [0.0]
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            total[0] += time.perf_counter() - started[0]

    gc.callbacks.append(callback)
    return lambda: total[0]


def role_consume(address: str, topic: str, partitions: int, records: int) -> dict[str, Any]:
    from tidelog.client import Consumer, TopicPartition

    with Consumer(address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        for tp in consumer.assignment():
            consumer.position(tp)  # positions first: time the reading, not the lookups
        got = 0
        payload = 0
        started = time.perf_counter()
        cpu_started = time.process_time()
        while got < records:
            batch = consumer.poll(timeout_ms=5_000)
            if not batch:
                raise RuntimeError(f"consumer stalled at {got} records")
            got += len(batch)
            payload += len(batch[-1].value or b"") * len(batch)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
    return {
        "records_per_s": got / seconds,
        "mb_per_s": got * RECORD_BYTES / seconds / 1e6,
        "cpu_us_per_record": cpu / got * 1e6,
    }


def role_latency(address: str, topic: str, acks: str, count: int) -> dict[str, Any]:
    from tidelog.client import Producer

    value = os.urandom(VALUE_BYTES)
    key = os.urandom(KEY_BYTES)
    with Producer(address, acks=acks, linger_ms=0) as producer:
        for _ in range(200):  # warm up: connection, producer id, metadata
            producer.send(topic, value, key).result(timeout=10)
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            producer.send(topic, value, key).result(timeout=10)
            samples.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": statistics.median(samples), "p99_ms": _percentile(samples, 99)}


def role_end_to_end(address: str, topic: str, count: int) -> dict[str, Any]:
    from tidelog.client import Consumer, Producer, TopicPartition

    arrived: dict[int, float] = {}
    seen = threading.Condition()
    stop_reading = threading.Event()

    def read() -> None:
        with Consumer(address, auto_offset_reset="latest") as consumer:
            consumer.assign([TopicPartition(topic, 0)])
            consumer.position(TopicPartition(topic, 0))
            ready.set()
            while not stop_reading.is_set():
                for record in consumer.poll(timeout_ms=200):
                    now = time.perf_counter()
                    with seen:
                        arrived[int.from_bytes(record.key or b"", "big")] = now
                        seen.notify_all()

    ready = threading.Event()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ready.wait(30)
    value = os.urandom(VALUE_BYTES)
    samples = []
    with Producer(address, acks=1, linger_ms=0) as producer:
        for i in range(count + 100):
            started = time.perf_counter()
            producer.send(topic, value, i.to_bytes(KEY_BYTES, "big"), partition=0)
            with seen:
                if not seen.wait_for(lambda i=i: i in arrived, timeout=10):  # type: ignore[misc]
                    raise RuntimeError(f"record {i} never reached the consumer")
                if i >= 100:  # the first ones warm up
                    samples.append((arrived[i] - started) * 1000)
    stop_reading.set()
    reader.join(5)
    return {"p50_ms": statistics.median(samples), "p99_ms": _percentile(samples, 99)}


def _percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


# --- the run -----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--latency-samples", type=int, default=2_000)
    parser.add_argument("--quick", action="store_true", help="100k records, fewer samples")
    parser.add_argument(
        "--ts-rounds", type=int, default=3, help="rounds of the three-timestamps comparison"
    )
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--acks", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.role:
        return _role(args)
    if args.quick:
        args.records = 100_000
        args.latency_samples = 300
        args.ts_rounds = 1

    work = Path(tempfile.mkdtemp(prefix="tidelog-client-bench-"))
    broker, address = start_broker(work)
    plain_broker, plain_address = start_broker(work, "log.batch.times.enable=false", name="plain")
    echo, echo_address = start_echo_server(work)
    try:
        from tidelog.client import AdminClient

        with AdminClient(address) as admin:
            admin.create_topic("bench", args.partitions)
            admin.create_topic("bench-3p", 3)
            admin.create_topic("latency", 1)
            admin.create_topic("e2e", 1)
        samples = str(args.latency_samples)
        floor = _run_role("--role", "grpc-floor", "--address", echo_address, "--count", samples)
        print(f"bare gRPC round trip: p50 {floor['grpc_roundtrip_p50_ms']:.3f} ms "
              f"(stream message {floor['grpc_stream_roundtrip_p50_ms']:.3f} ms)")  # fmt: skip
        records = str(args.records)
        produce = _run_role("--role", "produce", "--address", address, "--topic", "bench",
                            "--count", records)  # fmt: skip
        _report("produce", produce)
        consume = _run_role("--role", "consume", "--address", address, "--topic", "bench",
                            "--partitions", str(args.partitions), "--count", records)  # fmt: skip
        _report("consume", consume)
        keyed = _run_role("--role", "produce", "--address", address, "--topic", "bench-3p",
                          "--count", records)  # fmt: skip
        print(f"produce, 3 partitions, murmur2 per key: {keyed['records_per_s']:,.0f} records/s")
        latency = {}
        for acks in ("1", "all"):
            latency[acks] = _run_role(
                "--role", "latency", "--address", address, "--topic", "latency",
                "--acks", acks, "--count", samples,
            )  # fmt: skip
            print(f"produce latency acks={acks}: p50 {latency[acks]['p50_ms']:.3f} ms, "
                  f"p99 {latency[acks]['p99_ms']:.3f} ms")  # fmt: skip
        e2e = _run_role("--role", "end-to-end", "--address", address, "--topic", "e2e",
                        "--count", samples)  # fmt: skip
        print(f"end-to-end: p50 {e2e['p50_ms']:.3f} ms, p99 {e2e['p99_ms']:.3f} ms")
        three_ts = compare_three_timestamps(
            {"three_ts": address, "plain": plain_address}, args.records, args.ts_rounds
        )
    finally:
        stop(echo)
        stop(plain_broker)
        stop(broker)
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "records": args.records,
        "partitions": args.partitions,
        "record_bytes": RECORD_BYTES,
        "produce_records_per_s": round(produce["records_per_s"]),
        "produce_mb_per_s": round(produce["mb_per_s"], 1),
        "produce_cpu_us_per_record": round(produce["cpu_us_per_record"], 2),
        "produce_gc_share": round(produce["gc_share"], 3),
        "produce_records_per_s_3p_keyed": round(keyed["records_per_s"]),
        "consume_records_per_s": round(consume["records_per_s"]),
        "consume_mb_per_s": round(consume["mb_per_s"], 1),
        "consume_cpu_us_per_record": round(consume["cpu_us_per_record"], 2),
        "produce_p50_ms_acks1": round(latency["1"]["p50_ms"], 3),
        "produce_p99_ms_acks1": round(latency["1"]["p99_ms"], 3),
        "produce_p50_ms_acks_all": round(latency["all"]["p50_ms"], 3),
        "produce_p99_ms_acks_all": round(latency["all"]["p99_ms"], 3),
        "end_to_end_p50_ms": round(e2e["p50_ms"], 3),
        "end_to_end_p99_ms": round(e2e["p99_ms"], 3),
        "grpc_roundtrip_p50_ms": round(floor["grpc_roundtrip_p50_ms"], 3),
        "grpc_stream_roundtrip_p50_ms": round(floor["grpc_stream_roundtrip_p50_ms"], 3),
        "acks1_p50_over_grpc_roundtrip": round(
            latency["1"]["p50_ms"] / floor["grpc_roundtrip_p50_ms"], 2
        ),
        **three_ts,
    }
    print(json.dumps(result))
    return 0


def compare_three_timestamps(
    addresses: dict[str, str], records: int, rounds: int
) -> dict[str, Any]:
    """Produce and consume throughput with the three timestamps ("three_ts": the broker
    stores and serves each batch's sent/received times, the consumer builds the corrected
    time) and without ("plain": ``log.batch.times.enable=false``), interleaved rounds on
    fresh one-partition topics; the ratios of the medians, and the added bytes."""
    from tidelog.client import AdminClient
    from tidelog.proto.tidelog.v1 import broker_pb2 as pb
    from tidelog.storage.batch_times import ENTRY, WIRE_ENTRY

    figures: dict[str, dict[str, list[float]]] = {
        name: {"produce": [], "consume": []} for name in addresses
    }
    count = str(records)
    for round_number in range(rounds):
        # Alternate which goes first: the machine's noise drifts over a run.
        order = list(addresses) if round_number % 2 == 0 else list(reversed(addresses))
        for name in order:
            address = addresses[name]
            topic = f"ts-{round_number}"
            with AdminClient(address) as admin:
                admin.create_topic(topic, 1)
            produced = _run_role("--role", "produce", "--address", address, "--topic", topic,
                                 "--count", count)  # fmt: skip
            consumed = _run_role("--role", "consume", "--address", address, "--topic", topic,
                                 "--partitions", "1", "--count", count)  # fmt: skip
            figures[name]["produce"].append(produced["records_per_s"])
            figures[name]["consume"].append(consumed["records_per_s"])
            print(f"three timestamps round {round_number + 1} {name:>8}: produce "
                  f"{produced['records_per_s']:,.0f}/s, consume "
                  f"{consumed['records_per_s']:,.0f}/s")  # fmt: skip
    medians = {
        name: {kind: statistics.median(values) for kind, values in kinds.items()}
        for name, kinds in figures.items()
    }

    def paired(kind: str) -> float:
        stamped, plain = figures["three_ts"][kind], figures["plain"][kind]
        return statistics.median(a / b for a, b in zip(stamped, plain, strict=True))

    stamped = pb.ProduceRequest(acks=1, sent_timestamp_ms=int(time.time() * 1000))
    result = {
        "three_ts_rounds": rounds,
        "three_ts_produce_records_per_s": round(medians["three_ts"]["produce"]),
        "plain_produce_records_per_s": round(medians["plain"]["produce"]),
        "three_ts_consume_records_per_s": round(medians["three_ts"]["consume"]),
        "plain_consume_records_per_s": round(medians["plain"]["consume"]),
        # The median of each round's ratio: a round's two runs are minutes apart at most,
        # so the machine's drift over the run cancels out better than in a ratio of medians.
        "three_ts_over_plain_produce": round(paired("produce"), 3),
        "three_ts_over_plain_consume": round(paired("consume"), 3),
        "three_ts_disk_bytes_per_batch": ENTRY.size,
        "three_ts_fetch_bytes_per_batch": WIRE_ENTRY.size,
        "three_ts_produce_bytes_per_request": len(stamped.SerializeToString())
        - len(pb.ProduceRequest(acks=1).SerializeToString()),
    }
    print(f"three timestamps over plain: produce {result['three_ts_over_plain_produce']}, "
          f"consume {result['three_ts_over_plain_consume']}")  # fmt: skip
    return result


def _report(what: str, figures: dict[str, Any]) -> None:
    print(
        f"{what}: {figures['records_per_s']:,.0f} records/s, {figures['mb_per_s']:.1f} MB/s "
        f"({figures['cpu_us_per_record']:.2f} us CPU/record)"
    )


def _role(args: argparse.Namespace) -> int:
    """One measurement in this process; prints its JSON answer as the last line."""
    if args.role == "echo-server":
        role_echo_server(args.ready_file)
        return 0
    if args.role == "grpc-floor":
        answer = role_grpc_floor(args.address, args.count)
    elif args.role == "produce":
        answer = role_produce(args.address, args.topic, args.count)
    elif args.role == "consume":
        answer = role_consume(args.address, args.topic, args.partitions, args.count)
    elif args.role == "latency":
        answer = role_latency(args.address, args.topic, args.acks, args.count)
    elif args.role == "end-to-end":
        answer = role_end_to_end(args.address, args.topic, args.count)
    else:
        raise SystemExit(f"unknown role {args.role}")
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
