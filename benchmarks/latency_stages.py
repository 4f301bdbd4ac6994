"""Where one acknowledged record's time goes in the producer, stage by stage.

::

    python benchmarks/latency_stages.py [--count 3000] [--acks 1]

Against one broker process (``python -m broker``, a temporary data directory,
127.0.0.1), single records sent with ``linger_ms=0``, each waited for. The producer's
sender thread is timestamped (wrappers around its private methods, this script only) at:
``send`` → drained (the sender thread woke and drained the batch) → written (request
encoded and queued on the stream) → answered (the stream's reader thread has the answer)
→ settled (futures completed) → returned (``result()`` came back in the caller). Medians
in µs, next to the bare gRPC round trip of ``benchmarks/client_bench.py`` in the same run.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import client_bench  # noqa: E402

STAGES = ("drained", "written", "answered", "settled", "returned")


def _instrument(marks: dict[str, float]) -> None:
    from tidelog.client.sender import Sender

    collect, send, on_response = Sender._collect, Sender._send, Sender._on_response

    def timed_collect(self: Any) -> Any:
        result = collect(self)
        if result[0]:
            marks.setdefault("drained", time.perf_counter())
        return result

    def timed_send(self: Any, batches: Any) -> None:
        send(self, batches)
        marks.setdefault("written", time.perf_counter())

    def timed_on_response(self: Any, stream_id: int, response: Any) -> None:
        marks.setdefault("answered", time.perf_counter())
        on_response(self, stream_id, response)
        marks.setdefault("settled", time.perf_counter())

    wrappers: dict[str, Callable[..., Any]] = {
        "_collect": timed_collect,
        "_send": timed_send,
        "_on_response": timed_on_response,
    }
    for name, wrapper in wrappers.items():
        setattr(Sender, name, wrapper)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=3_000)
    parser.add_argument("--acks", default="1")
    args = parser.parse_args()
    from tidelog.client import AdminClient, Producer

    marks: dict[str, float] = {}
    _instrument(marks)
    work = Path(tempfile.mkdtemp(prefix="tidelog-stages-"))
    broker, address = client_bench.start_broker(work)
    echo, echo_address = client_bench.start_echo_server(work)
    try:
        floor = client_bench._run_role(
            "--role", "grpc-floor", "--address", echo_address, "--count", "2000"
        )
        with AdminClient(address) as admin:
            admin.create_topic("stages", partitions=1)
        samples: dict[str, list[float]] = {stage: [] for stage in STAGES}
        totals: list[float] = []
        value, key = os.urandom(100), os.urandom(16)
        with Producer(address, acks=args.acks, linger_ms=0) as producer:
            for _ in range(200):  # warm up: connection, producer id, metadata
                producer.send("stages", value, key).result(timeout=10)
            for _ in range(args.count):
                marks.clear()
                started = time.perf_counter()
                producer.send("stages", value, key).result(timeout=10)
                marks["returned"] = time.perf_counter()
                if any(stage not in marks for stage in STAGES):
                    continue  # an answer overtook a mark: too close to call, skip it
                previous = started
                for stage in STAGES:
                    samples[stage].append((marks[stage] - previous) * 1e6)
                    previous = marks[stage]
                totals.append((marks["returned"] - started) * 1e6)
        result: dict[str, Any] = {
            f"{stage}_p50_us": round(statistics.median(values), 1)
            for stage, values in samples.items()
        }
        result["total_p50_us"] = round(statistics.median(totals), 1)
        result["samples"] = len(totals)
        result["grpc_roundtrip_p50_us"] = round(floor["grpc_roundtrip_p50_ms"] * 1000, 1)
        for stage in STAGES:
            print(f"{stage:>9}: {result[f'{stage}_p50_us']:8.1f} us (p50, since the stage before)")
        print(
            f"    total: {result['total_p50_us']:8.1f} us; bare gRPC round trip "
            f"{result['grpc_roundtrip_p50_us']} us"
        )
        print(json.dumps(result))
    finally:
        client_bench.stop(broker)
        client_bench.stop(echo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
