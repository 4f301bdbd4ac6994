"""A gRPC listener's produce requests appended in one executor job (``AppendJob``).

Split from ``broker.grpc.listener`` (which builds and awaits the jobs) for size.
"""

from __future__ import annotations

import asyncio
import functools
import threading

from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.core.pipeline import LoopBridge, resolve
from tidelog.broker.core.produce import Acks, PartitionProduced
from tidelog.broker.grpc.data_service import produce_parts
from tidelog.proto.tidelog.v1 import broker_pb2 as pb

__all__ = ["AppendJob", "produce_bytes"]


class AppendJob:
    """Produce requests appended in one executor job, in order, each handed to
    ``BrokerCore.complete`` right there (so an ``acks=all`` fsync is asked for before the
    event loop even hears of the append). Built and resolved on the loop; ``run`` on the
    executor. Thread-safe where it has to be (``_deliver``).

    Answers delivered while the job runs (``acks`` 0 and 1 always, ``acks=all`` when the
    data was durable already) are kept and set by ``resolve_early`` once the job is back
    on the loop: no ``LoopBridge.post`` (a write to the loop's self-pipe and a wake-up
    of the loop) per request. Only answers delivered after the job ended (``acks=all``,
    from the group fsync thread) are handed to the loop one by one.

    An append never raises for a partition's fault (each answer carries its own); one
    that raises (shutdown) fails the whole job.
    """

    __slots__ = ("_bridge", "_caller", "_core", "_early", "_lock", "_running", "_work", "futures")

    def __init__(
        self,
        core: BrokerCore,
        bridge: LoopBridge,
        work: list[tuple[pb.ProduceRequest, int, Acks]],
        futures: list[asyncio.Future[list[PartitionProduced]]],
        caller: RequestContext | None = None,
    ) -> None:
        self._core = core
        self._caller = caller  # whose requests (the authorizer's WRITE check)
        self._bridge = bridge
        self._work = work
        self.futures = futures
        self._lock = threading.Lock()
        self._running = True
        self._early: list[tuple[int, list[PartitionProduced]]] = []

    def run(self) -> None:
        """Append and complete every request (on the executor)."""
        core = self._core
        try:
            for index, (request, received_ms, acks) in enumerate(self._work):
                parts = produce_parts(request, received_ms, self._caller, core.acls)
                appends = core.append(parts)
                core.complete(appends, acks, functools.partial(self._deliver, index))
        finally:
            with self._lock:
                self._running = False

    def _deliver(self, index: int, answers: list[PartitionProduced]) -> None:
        # Any thread, once per request: the executor's during run, the fsync thread's
        # during or after it.
        with self._lock:
            if self._running:
                self._early.append((index, answers))
                return
        self._bridge.post(resolve, self.futures[index], answers)

    def resolve_early(self) -> None:
        """Set the answers delivered while the job ran (on the loop, after ``run``)."""
        for index, answers in self._early:
            resolve(self.futures[index], answers)
        self._early.clear()


def produce_bytes(request: pb.ProduceRequest) -> int:
    """The record bytes of a produce request (what queued.max.request.bytes counts)."""
    return sum(len(p.records) for t in request.topics for p in t.partitions)
