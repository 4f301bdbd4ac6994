"""Console benchmark: the web framework's own cost, and what a console page costs.

::

    python benchmarks/console_bench.py [--requests 2000] [--topics 50] [--quick]

1. **Framework floor** (the choice between the two frameworks issue 19 names): a minimal
   application answering one plain-text route, on Starlette under uvicorn (the console's
   stack) and on aiohttp's own server, each in a process of its own on 127.0.0.1, asked
   ``--requests`` times by one keep-alive HTTP/1.1 client; rounds alternate which goes
   first. Per framework: p50 and p99 latency and requests/s;
   ``starlette_over_aiohttp_p50`` is the median of the rounds' p50 ratios (1.0 = the same;
   below 1 Starlette is faster).
2. **Console pages**: the real console (``tidelog console``) against a real broker with
   ``--topics`` topics, a consumer group and records; p50 and p99 of the overview,
   topics, topic, record browser and groups pages, ``--page-requests`` each. The pages'
   time is the clients' calls to the broker; the floor above is what the framework adds.

The machine is shared and noisy: compare figures from the same run. The last line is
one JSON object. aiohttp comes with the ``bench`` extra (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tidelog.broker.testing import InProcessBroker  # noqa: E402
from tidelog.client import AdminClient, Consumer, Producer  # noqa: E402

_STARLETTE_APP = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
def hello(request):
    return PlainTextResponse("hello")
app = Starlette(routes=[Route("/", hello)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False, ws="none")
"""

_AIOHTTP_APP = """
import sys
from aiohttp import web
async def hello(request):
    return web.Response(text="hello")
app = web.Application()
app.router.add_get("/", hello)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server on port {port} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listened on port {port} within {timeout_s} s")


def latencies_ms(port: int, path: str, requests: int) -> list[float]:
    """``requests`` GETs of ``path`` on one keep-alive connection, each timed."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times: list[float] = []
    try:
        for _ in range(requests):
            started = time.perf_counter()
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read()
            times.append((time.perf_counter() - started) * 1000)
            if response.status != 200 or not body:
                raise RuntimeError(f"GET {path}: {response.status}")
    finally:
        connection.close()
    return times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
        "per_s": round(len(ordered) / (sum(ordered) / 1000), 1),
    }


def framework_floor(requests: int, rounds: int) -> dict[str, object]:
    results: dict[str, list[list[float]]] = {"starlette": [], "aiohttp": []}
    sources = {"starlette": _STARLETTE_APP, "aiohttp": _AIOHTTP_APP}
    for round_number in range(rounds):
        order = list(sources.items())
        if round_number % 2:
            order.reverse()
        for name, source in order:
            port = free_port()
            process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(source), str(port)])
            try:
                wait_for_port(port, process)
                latencies_ms(port, "/", 100)  # warm up
                results[name].append(latencies_ms(port, "/", requests))
            finally:
                process.terminate()
                process.wait(30)
    ratios = [
        statistics.median(s) / statistics.median(a)
        for s, a in zip(results["starlette"], results["aiohttp"], strict=True)
    ]
    return {
        "starlette": summary([t for run in results["starlette"] for t in run]),
        "aiohttp": summary([t for run in results["aiohttp"] for t in run]),
        "starlette_over_aiohttp_p50": round(statistics.median(ratios), 3),
    }


def console_pages(topics: int, requests: int) -> dict[str, dict[str, float]]:
    with (
        tempfile.TemporaryDirectory(prefix="tidelog-console-bench-") as temp,
        InProcessBroker(Path(temp)) as broker,
    ):
        with AdminClient(broker.address) as admin:
            for i in range(topics):
                admin.create_topic(f"topic-{i:03d}", 3)
        with Producer(broker.address, acks=1) as producer:
            for i in range(2_000):
                producer.send(f"topic-{i % topics:03d}", b'{"n": %d}' % i, key=b"%d" % i)
            producer.flush(timeout_ms=60_000)
        with Consumer(broker.address, group_id="bench", auto_offset_reset="earliest") as c:
            c.subscribe(["topic-000"])
            deadline = time.monotonic() + 30
            while not c.assignment() and time.monotonic() < deadline:
                c.poll(timeout_ms=200)
            c.poll(timeout_ms=500)
            c.commit()
        port = free_port()
        command = [
            sys.executable, "-m", "tidelog.client.cli", "console", "--bootstrap", broker.address,
            "--listen", f"127.0.0.1:{port}",
        ]  # fmt: skip
        process = subprocess.Popen(command, cwd=ROOT)
        try:
            wait_for_port(port, process)
            pages = {
                "overview": "/",
                "topics": "/topics",
                "topic": "/topics/topic-000",
                "records": "/topics/topic-000?partition=0&offset=0",
                "groups": "/groups",
                "group": "/groups/bench",
            }
            out = {}
            for name, path in pages.items():
                latencies_ms(port, path, 5)  # warm up
                out[name] = summary(latencies_ms(port, path, requests))
                print(f"page {name:9}: {out[name]}", file=sys.stderr)
            return out
        finally:
            process.terminate()
            process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--topics", type=int, default=50)
    parser.add_argument("--page-requests", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="500 requests, 3 rounds, 10 pages")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds, args.page_requests, args.topics = 500, 3, 10, 10
    floor = framework_floor(args.requests, args.rounds)
    print(f"framework floor: {floor}", file=sys.stderr)
    pages = console_pages(args.topics, args.page_requests)
    print(json.dumps({"topics": args.topics, **floor, "pages": pages}))


if __name__ == "__main__":
    main()
