"""The request pipeline's driver: one object per listener runs every request through the
same steps, so a listener keeps only its transport, its codec and its rendering (#26).

A listener decodes a request into a neutral operation (``broker.core.operations``), the
resources it names and a core call, and hands them to ``RequestPipeline.serve``, which
runs::

    admit       Admission.open_call (the listener, per call or connection, before serve)
    authenticate the listener's (SCRAM token / mTLS / SASL), giving the RequestContext
    authorize   operations.authorize on the policy table; one audit line per refusal
    core        the call: blocking work via ``run`` (queued.max.requests, the executor,
                request_percentage quota) or parked in a purgatory, answered through
                the one ``LoopBridge``
    quota       operations.record_quota (request_percentage in ``run``; byte rates by
                the data path, which knows the sizes)
    metrics     operations.observe (tidelog_operations_total, one sample per request)
    audit       written by authorize (refusals) and broker.core.audit (authentication)
    classify    broker.core.errors.classify: (code, retriable, safe message)

and hands back an ``Answer``: the core call's value, the throttle time the quotas asked
for, or the classified error. The listener encodes it (protobuf and a gRPC status via
``broker.grpc.errors``; a Kafka frame with ``broker.kafka.errors``' numbers).

Where the listeners differ, it is a setting of the driver, not a second copy of a step:

- ``wait_when_full``: past ``queued.max.requests`` the gRPC listener refuses the call
  (``RESOURCE_EXHAUSTED``), the Kafka listener waits, as Kafka's network threads wait on
  a full request queue (the connection is not read meanwhile);
- ``closes_on_error``: a Kafka handler puts the errors it knows into its answer; an
  exception that escapes it closes the connection, so it is counted and re-raised rather
  than classified for a client.

The one bridge back to a listener's loop (``LoopBridge``): the executor's end of a core
call (``run_in_executor``), a parked fetch's wake-up and an ``acks=all`` produce's answer
from the group fsync thread all reach the loop through it; a closed loop (the listener
stopped) drops the hand-off, since nobody waits any more.

Cost: ``serve`` adds no thread hand-off; the hot data paths (produce and fetch streams)
call ``run``, ``run_inline`` and ``finish`` per request and keep their own batching.

Thread-safety: a driver is used on its listener's loop thread only, except
``LoopBridge``'s callables, which any thread may call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tidelog.broker.core.acl_store import Acls
from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.errors import Outcome, classify
from tidelog.broker.core.limits import Admission
from tidelog.broker.core.metrics import BrokerMetrics
from tidelog.broker.core.operations import Resource, authorize, first_refusal, observe, record_quota
from tidelog.broker.core.quotas import REQUEST_PERCENTAGE, QuotaManager
from tidelog.storage.errors import BrokerBusyError

__all__ = ["Answer", "LoopBridge", "RequestPipeline"]

T = TypeVar("T")

_ADMIT_RETRY_FIRST_S = 0.001
_ADMIT_RETRY_MAX_S = 0.05


class LoopBridge:
    """The one way work finished on another thread (the executor, the group fsync thread,
    an append that completes a parked fetch) reaches a listener's event loop.

    Thread-safe: every method may be called from any thread.
    """

    __slots__ = ("loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def post(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback(*args)`` on the loop; dropped if the loop is closed (the
        listener stopped: nobody waits any more). Never raises into the caller's thread
        (the group fsync thread must not die of a stopped listener)."""
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass

    def waker(self, event: asyncio.Event) -> Callable[[], None]:
        """A callable that sets ``event`` on the loop (a parked fetch's wake-up)."""

        loop = self.loop

        def wake() -> None:
            if _running_loop() is loop:
                event.set()  # an inline append on the loop's thread: no wake-up needed
            else:
                self.post(event.set)

        return wake

    def resolver(self, future: asyncio.Future[T]) -> Callable[[T], None]:
        """A callable that sets ``future``'s result on the loop (once; later calls and a
        cancelled future are ignored). Called on the loop's own thread (an ``acks=1``
        produce's answer, delivered by ``complete`` there), it sets the result at once:
        posting it would cost a write to the loop's wake-up socket and a loop iteration
        for nothing. ``set_result`` runs no callback inline, so this is safe under the
        caller's locks too."""
        loop = self.loop

        def deliver(value: T) -> None:
            if _running_loop() is loop:
                resolve(future, value)
            else:
                self.post(resolve, future, value)

        return deliver


_running_loop = asyncio._get_running_loop  # None off a loop's thread (no exception)


def resolve(future: asyncio.Future[T], value: T) -> None:
    """Set ``future``'s result unless it is done (cancelled: the call ended). Loop only."""
    if not future.done():
        future.set_result(value)


@dataclass(frozen=True, slots=True)
class Answer(Generic[T]):
    """What ``serve`` hands back for encoding: the core call's value and the throttle
    time (ms) quotas asked for, or the classified error (``value`` None)."""

    value: T | None
    throttle_ms: int = 0
    error: Outcome | None = None


class RequestPipeline:
    """The steps every request of one listener takes (module docstring). Loop only."""

    def __init__(
        self,
        *,
        listener: str,
        acls: Acls,
        quotas: QuotaManager,
        metrics: BrokerMetrics,
        admission: Admission | None,
        executor: Executor,
        loop: asyncio.AbstractEventLoop,
        wait_when_full: bool = False,
        closes_on_error: bool = False,
        rpc_metrics: bool = False,
    ) -> None:
        """Args:
        listener: ``grpc`` or ``kafka`` (the metrics' and audit lines' label).
        admission: the limits shared by every listener (None: none).
        executor: where blocking core calls run (``num.io.threads`` threads).
        loop: the listener's event loop (``LoopBridge``).
        wait_when_full: wait, not refuse, past ``queued.max.requests``.
        closes_on_error: an escaping exception is counted and re-raised (Kafka).
        rpc_metrics: also count the older per-RPC ``tidelog_requests_total`` (gRPC).
        """
        self.listener = listener
        self.acls = acls
        self.quotas = quotas
        self.metrics = metrics
        self.admission = admission
        self.executor = executor
        self.bridge = LoopBridge(loop)
        self._wait_when_full = wait_when_full
        self._closes_on_error = closes_on_error
        self._rpc_metrics = rpc_metrics

    async def serve(
        self,
        caller: RequestContext,
        rpc: str,
        operation: str,
        call: Callable[[], Awaitable[T]],
        *,
        resources: Callable[[], Iterable[Resource]] | None = None,
        outcome_of: Callable[[T], str] | None = None,
    ) -> Answer[T]:
        """Run one decoded request through the pipeline.

        Args:
            caller: who asks (authenticated already).
            rpc: the listener's name of the request (audit lines, per-RPC metrics).
            operation: its neutral operation (``operations.OPERATIONS``).
            call: the core call; it runs blocking work through ``run`` and may park.
            resources: what the request names, refused as a whole by the first refused
                one (asked only with the authorizer on); None: the call decides per
                resource itself (Kafka's per-resource answers, the data path).
            outcome_of: the outcome label of an answered request (Kafka: the answer's
                top-level error name); default ``OK``.

        Returns:
            The answer, or the classified error (unless ``closes_on_error``).

        Raises:
            Exception: with ``closes_on_error``, whatever the call raised (counted).
        """
        started = time.perf_counter()
        try:
            if resources is not None and self.acls.enabled:
                first_refusal(authorize(self.acls, caller, rpc, operation, resources(), whole=True))
            value = await call()
        except Exception as exc:
            if self._closes_on_error:
                code = getattr(exc, "code", None)
                self.finish(rpc, operation, code if isinstance(code, str) else "INTERNAL", started)
                raise
            return Answer(None, 0, self.fail(rpc, operation, exc, started))
        self.finish(rpc, operation, "OK" if outcome_of is None else outcome_of(value), started)
        return Answer(value)

    def fail(self, rpc: str, operation: str, exc: BaseException, started: float) -> Outcome:
        """Classify ``exc`` (once: it logs what a client may not see) and count it."""
        outcome = classify(exc)
        self.finish(rpc, operation, outcome.code or "UNAVAILABLE", started)
        return outcome

    def finish(self, rpc: str, operation: str, outcome: str, started: float) -> None:
        """Count one finished request (``started``: its ``time.perf_counter()``)."""
        seconds = time.perf_counter() - started
        if self._rpc_metrics:
            self.metrics.observe_request(rpc, outcome, seconds)
        observe(self.metrics, self.listener, operation, outcome, seconds)

    async def run(
        self, caller: RequestContext, function: Callable[..., T], *args: Any
    ) -> tuple[T, int]:
        """``function(*args)`` on the executor within ``queued.max.requests`` (refused or
        waited for, per ``wait_when_full``); its result and the throttle time the
        caller's ``request_percentage`` quota asks for (0: none)."""
        admission = self.admission
        if admission is not None:
            if self._wait_when_full:
                await _wait_for(admission, caller)
            else:
                admission.admit_request(caller)
        try:
            result, busy_s = await self.bridge.loop.run_in_executor(
                self.executor, _timed, function, *args
            )
        finally:
            if admission is not None:
                admission.release_request()
        return result, self.meter_busy(caller, busy_s)

    def run_inline(
        self, caller: RequestContext, function: Callable[..., T], *args: Any
    ) -> tuple[T, int]:
        """``function(*args)`` on the loop's own thread (a small read: no hand-off),
        metered like ``run``."""
        result, busy_s = _timed(function, *args)
        return result, self.meter_busy(caller, busy_s)

    def meter_busy(self, caller: RequestContext, busy_s: float) -> int:
        """request_percentage: storage-thread time, in percent of one thread per second."""
        return record_quota(self.quotas, caller, REQUEST_PERCENTAGE, busy_s * 100)


async def _wait_for(admission: Admission, context: RequestContext) -> None:
    """Wait until ``queued.max.requests`` admits, as Kafka's network thread waits on a
    full request queue. The first refusal is counted and logged (``admit_request``
    raises it); the retries are not, so one wait is one refusal in the metrics."""
    try:
        admission.admit_request(context)
        return
    except BrokerBusyError:
        pass
    delay_s = _ADMIT_RETRY_FIRST_S
    while not admission.try_admit_request():
        await asyncio.sleep(delay_s)
        delay_s = min(delay_s * 2, _ADMIT_RETRY_MAX_S)


def _timed(function: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``function(*args)`` and the seconds it took (on whichever thread runs it)."""
    started = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - started
