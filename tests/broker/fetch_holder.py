"""A process that holds many idle long polls: ``COUNT`` connections, one FetchStream each.

::

    python -m tests.broker.fetch_holder ADDRESS TOPIC COUNT [LIFETIME_S]

Each connection is its own TCP connection (``grpc.use_local_subchannel_pool``: without it
grpcio would share one connection among all the channels to the same target) with one
``FetchStream`` waiting at the log end of ``TOPIC``-0 with ``max_wait_ms`` 10 minutes
(the broker caps it at its ``fetch.max.wait.ms``). Answers are not read: the topic is
meant to stay quiet, and each stream stays parked until the broker's cap. Prints
``ready`` once every stream has sent its request, then waits until stdin closes or
``LIFETIME_S`` (default 120) passes, and exits: it never outlives its test. Used by
``test_serving.py`` and ``benchmarks/connections_bench.py``.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import threading
from typing import Any

from grpc import aio

from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

POLL_MS = 600_000
_CHUNK = 100


async def hold(address: str, topic: str, count: int, lifetime_s: float) -> None:
    """Open ``count`` connections with one waiting fetch each; see the module docstring.

    One thread and grpc's asyncio API: a process holds thousands of streams cheaply.
    """
    request = pb.FetchRequest(
        max_wait_ms=POLL_MS,
        min_bytes=1,
        partitions=[pb.FetchPartition(topic=topic, partition=0, fetch_offset=0)],
    )
    channels: list[aio.Channel] = []
    calls: list[Any] = []

    async def connect() -> None:
        for attempt in range(3):
            channel = aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
            call = pb_grpc.BrokerStub(channel).FetchStream()
            try:
                await call.write(request)  # sent: connected
            except aio.AioRpcError as exc:
                # Thousands of connections at once can overflow the listen backlog.
                await channel.close()
                if attempt == 2:
                    raise
                sys.stderr.write(f"fetch_holder: connecting again after {exc.code()}\n")
                await asyncio.sleep(0.5)
                continue
            channels.append(channel)
            calls.append(call)
            return

    for start in range(0, count, _CHUNK):  # a few connections at a time, not all at once
        await asyncio.gather(*(connect() for _ in range(min(_CHUNK, count - start))))
    sys.stdout.write("ready\n")  # to the parent process through a pipe
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    closed = asyncio.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(closed.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    try:
        await asyncio.wait_for(closed.wait(), lifetime_s)
    except TimeoutError:
        pass
    for call in calls:
        call.cancel()
    await asyncio.gather(*(channel.close() for channel in channels))


if __name__ == "__main__":
    # Each connection is a file descriptor: allow as many as the hard limit does.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(
        hold(
            sys.argv[1],
            sys.argv[2],
            int(sys.argv[3]),
            float(sys.argv[4]) if len(sys.argv) > 4 else 120.0,
        )
    )
