"""Connect storm: how many first stream writes fail when many connections open at once.

::

    python benchmarks/connect_storm.py [--server bare|broker] [--processes 4]
                                       [--per-process 1250] [--chunk 100] [--sequential]

A server (``bare``: a ``grpc.aio`` server with one ``FetchStream`` method that reads a
request and waits, no Tidelog code; ``broker``: ``python -m broker``, the asynchronous
model) and ``--processes`` client processes that each open ``--per-process`` connections
(``grpc.aio``, one TCP connection per channel), ``--chunk`` at a time, and write one fetch
request on a new ``FetchStream`` of each, as ``tests/broker/fetch_holder.py`` does. The
clients start together, or one after the other with ``--sequential``. Each failed first
write is counted by the status the write raised and the call's final status.

Measured (docs/broker.md, "Serving model"): 4 x 1,250 at once fails 1-7% of the first
writes against the bare server as against the broker, 0 of 5,000 sequentially or from one
process; the server's core cancels those new streams (``GRPC_TRACE=call_error`` on the
server: ``CancelWithError SVR CANCELLED``), with the garbage collector on or off. The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _raise_file_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _bare_server() -> None:
    import grpc
    from grpc import aio

    async def fetch_stream(requests: Any, context: Any) -> Any:
        async for _ in requests:
            await asyncio.sleep(600)
        yield b""  # never reached: the stream only waits

    server = aio.server()
    handler = grpc.stream_stream_rpc_method_handler(fetch_stream)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("tidelog.v1.Broker", {"FetchStream": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


async def _clients(address: str, count: int, chunk: int, hold_s: float) -> dict[str, Any]:
    from grpc import aio

    from tidelog.proto.tidelog.v1 import broker_pb2 as pb
    from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

    request = pb.FetchRequest(
        max_wait_ms=600_000,
        min_bytes=1,
        partitions=[pb.FetchPartition(topic="quiet", partition=0, fetch_offset=0)],
    )
    failures: collections.Counter[str] = collections.Counter()
    calls: list[Any] = []
    channels: list[aio.Channel] = []

    async def connect() -> None:
        channel = aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        call = pb_grpc.BrokerStub(channel).FetchStream()
        try:
            await call.write(request)
        except aio.AioRpcError as exc:
            final = await call.code()
            failures[f"{exc.code().name} (final {final.name})"] += 1
            await channel.close()
            return
        channels.append(channel)
        calls.append(call)

    for start in range(0, count, chunk):
        await asyncio.gather(*(connect() for _ in range(min(chunk, count - start))))
    await asyncio.sleep(hold_s)
    for call in calls:
        call.cancel()
    await asyncio.gather(*(channel.close() for channel in channels))
    return {"ok": len(calls), "failures": dict(failures)}


def _spawn(*args: str, stdout: Any = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=stdout,
        text=True,
    )


def _start_server(kind: str, work: Path) -> tuple[subprocess.Popen[str], str]:
    if kind == "bare":
        process = _spawn(str(Path(__file__)), "--role", "bare-server")
        assert process.stdout is not None
        return process, process.stdout.readline().strip()
    ready = work / "ready"
    process = _spawn(
        "-m", "tidelog.broker", "--data-dir", str(work / "data"), "--listen", "127.0.0.1:0",
        "--ready-file", str(ready), "--log-level", "WARNING", "--set", "metrics.port=-1",
        "--set", "fetch.max.wait.ms=600000",
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the broker did not start")
        time.sleep(0.05)
    address = ready.read_text().strip()
    from tidelog.client import AdminClient

    with AdminClient(address) as admin:
        admin.create_topic("quiet", 1)
    return process, address


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="bare", choices=("bare", "broker"))
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--per-process", type=int, default=1_250)
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument("--sequential", action="store_true")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--hold-s", type=float, default=5.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    _raise_file_limit()
    if args.role == "bare-server":
        asyncio.run(_bare_server())
        return 0
    if args.role == "clients":
        answer = asyncio.run(_clients(args.address, args.per_process, args.chunk, args.hold_s))
        print(json.dumps(answer), flush=True)
        return 0

    work = Path(tempfile.mkdtemp(prefix="tidelog-connect-storm-"))
    server, address = _start_server(args.server, work)
    try:
        clients = []
        for _ in range(args.processes):
            # Sequential: each process holds its connections while the next one opens its
            # own, so the server ends up with as many as in the storm.
            hold_s = (args.processes + 1) * 10.0 if args.sequential else 5.0
            client = _spawn(
                str(Path(__file__)), "--role", "clients", "--address", address,
                "--per-process", str(args.per_process), "--chunk", str(args.chunk),
                "--hold-s", str(hold_s),
            )  # fmt: skip
            clients.append(client)
            if args.sequential:
                time.sleep(10.0)
        answers = [json.loads(client.communicate(timeout=600)[0].strip()) for client in clients]
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    failures: collections.Counter[str] = collections.Counter()
    for answer in answers:
        failures.update(answer["failures"])
    total = args.processes * args.per_process
    failed = sum(failures.values())
    result = {
        "server": args.server,
        "connections": total,
        "sequential": args.sequential,
        "failed_first_writes": failed,
        "failed_share": round(failed / total, 4),
        "by_status": dict(failures),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
