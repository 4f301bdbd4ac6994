"""What one request costs the broker: raw gRPC, no Tidelog client.

::

    python benchmarks/request_cost_bench.py [--rounds 3] [--produce 400] [--fetch 300]

For each round, a fresh broker on 127.0.0.1, metrics off:

1. produce: one ``ProduceStream`` sends ``--produce`` requests of one 1,000-record batch
   (16-byte keys, 100-byte values, about 120 KB; ``acks=1``), 5 in flight, as the
   Tidelog producer pipelines them;
2. fetch: one ``FetchStream`` asks ``--fetch`` times for 1 MiB from offsets spread over
   what was produced, one request at a time, as a consumer does.

The broker's CPU (user + system, from ``/proc``, 10 ms ticks) and the wall time are
divided by the requests. Without a Tidelog client the client's own cost is small, so the
figures are the broker's. The last line is one JSON object with the medians of the
rounds. The machine is shared and noisy: to judge a change, run this on both trees in
turn, a few times each, and compare medians, not single rounds.

Until issue #26 this was ``serving_models_bench.py`` and compared the threaded serving
model with the asynchronous one (the figures are in ``docs/broker.md``, "Serving model").
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_IN_FLIGHT = 5
_RECORDS_PER_BATCH = 1_000
_FETCH_BYTES = 1 << 20


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_broker(work: Path) -> tuple[subprocess.Popen[str], str]:
    ready = work / "ready"
    process = subprocess.Popen(
        [sys.executable, "-m", "tidelog.broker", "--data-dir", str(work / "data"),
         "--listen", "127.0.0.1:0", "--ready-file", str(ready), "--log-level", "WARNING",
         "--set", "metrics.port=-1"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the broker did not start")
        time.sleep(0.05)
    return process, ready.read_text().strip()


def measure(produce_requests: int, fetch_requests: int) -> dict[str, float]:
    import grpc

    from tidelog.proto.tidelog.v1 import broker_pb2 as pb
    from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
    from tidelog.storage.records import encode_batch

    batch = encode_batch(
        [(1, i.to_bytes(16, "big"), os.urandom(100)) for i in range(_RECORDS_PER_BATCH)]
    )
    work = Path(tempfile.mkdtemp(prefix="tidelog-request-cost-"))
    broker, address = _start_broker(work)
    options = [("grpc.max_receive_message_length", -1), ("grpc.use_local_subchannel_pool", 1)]
    try:
        with grpc.insecure_channel(address, options=options) as channel:
            stub = pb_grpc.BrokerStub(channel)
            stub.CreateTopic(pb.CreateTopicRequest(name="t", partitions=1))
            produce = pb.ProduceRequest(
                acks=1,
                topics=[
                    pb.ProduceTopicData(
                        topic="t", partitions=[pb.ProducePartitionData(partition=0, records=batch)]
                    )
                ],
            )
            requests: queue.SimpleQueue[pb.ProduceRequest | None] = queue.SimpleQueue()
            answers = stub.ProduceStream(iter(requests.get, None))
            for _ in range(20):  # warm up
                requests.put(produce)
                next(answers)
            cpu, started = _cpu_seconds(broker.pid), time.perf_counter()
            for i in range(produce_requests + _IN_FLIGHT):
                if i < produce_requests:
                    requests.put(produce)
                if i >= _IN_FLIGHT:
                    next(answers)
            produce_wall = time.perf_counter() - started
            produce_cpu = _cpu_seconds(broker.pid) - cpu
            requests.put(None)

            produced = (produce_requests + 20) * _RECORDS_PER_BATCH
            fetches: queue.SimpleQueue[pb.FetchRequest | None] = queue.SimpleQueue()
            fetched = stub.FetchStream(iter(fetches.get, None))

            def fetch(offset: int) -> int:
                fetches.put(
                    pb.FetchRequest(
                        max_wait_ms=500,
                        min_bytes=1,
                        partitions=[
                            pb.FetchPartition(
                                topic="t",
                                partition=0,
                                fetch_offset=offset,
                                partition_max_bytes=_FETCH_BYTES,
                            )
                        ],
                    )
                )
                return len(next(fetched).results[0].records)

            for _ in range(10):  # warm up
                fetch(0)
            step = _FETCH_BYTES // (len(batch) // _RECORDS_PER_BATCH)
            cpu, started = _cpu_seconds(broker.pid), time.perf_counter()
            size = sum(fetch((i * step) % (produced - 2 * step)) for i in range(fetch_requests))
            fetch_wall = time.perf_counter() - started
            fetch_cpu = _cpu_seconds(broker.pid) - cpu
            fetches.put(None)
    finally:
        broker.terminate()
        broker.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    return {
        "produce_cpu_us": produce_cpu / produce_requests * 1e6,
        "produce_wall_us": produce_wall / produce_requests * 1e6,
        "fetch_cpu_us": fetch_cpu / fetch_requests * 1e6,
        "fetch_wall_us": fetch_wall / fetch_requests * 1e6,
        "fetch_kib": size / fetch_requests / 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--produce", type=int, default=400)
    parser.add_argument("--fetch", type=int, default=300)
    args = parser.parse_args()
    figures: list[dict[str, float]] = []
    for round_number in range(args.rounds):
        found = measure(args.produce, args.fetch)
        figures.append(found)
        print(f"round {round_number + 1}: "
              + ", ".join(f"{key} {value:,.0f}" for key, value in found.items()))  # fmt: skip
    result: dict[str, Any] = {"rounds": args.rounds}
    for key in figures[0]:
        result[key] = round(statistics.median(f[key] for f in figures))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
