"""Limits that refuse instead of stalling: connections, queued requests, bytes in flight.

Kafka's names and meanings, adapted to a gRPC listener:

- ``max.connections``: connections served at once. gRPC's Python API does not report a
  connection until it carries a call, so a connection counts from the start of its first
  call to the end of its last one; Tidelog clients hold a stream for their whole life
  (a consumer's ``FetchStream``, a producer's ``ProduceStream``), so this is the number
  of live clients. A call on a connection not yet counted is refused when the count is
  at the limit.
- ``max.connections.per.ip``: the same, per remote address.
- ``queued.max.requests``: requests admitted to the storage executor and not finished
  (queued or running). Parked operations do not count: they hold no thread.
- ``queued.max.request.bytes``: produce record bytes received and not yet answered
  (appended, or waiting for their fsync), so the broker's memory stays bounded whatever
  producers send (Kafka's default is unbounded; Tidelog's is 256 MiB).

Past a limit the call ends at once with ``RESOURCE_EXHAUSTED`` and the code of the limit
(``storage.errors.BrokerBusyError`` and its subclasses); nothing is queued silently. The
refusals are counted (``tidelog_limit_refusals_total``) and logged at most once a second
per limit.

``Admission`` is listener-neutral: it counts plain ``RequestContext`` values.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tidelog.broker.core.context import RequestContext
from tidelog.storage.errors import (
    BrokerBusyError,
    MaxConnectionsError,
    MaxConnectionsPerIpError,
    QueuedMaxRequestBytesError,
    QueuedMaxRequestsError,
)

__all__ = ["Admission", "AdmissionCollector", "LimitsConfig"]

log = logging.getLogger(__name__)

_LOG_EVERY_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitsConfig:
    """The four limits (Kafka's names in ``BrokerConfig``). Validated when built."""

    max_connections: int = 20_000
    max_connections_per_ip: int = 20_000
    queued_max_requests: int = 500
    queued_max_request_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in (
            "max_connections",
            "max_connections_per_ip",
            "queued_max_requests",
            "queued_max_request_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '.')}: must be >= 1")


class Admission:
    """The counters behind the limits. Thread-safe (one lock, held for a few operations).

    Every admission is paired with its release by the listener (``try``/``finally``).
    """

    def __init__(self, config: LimitsConfig) -> None:
        self.config = config
        self._lock = threading.Lock()  # guards every counter below
        self._calls_by_peer: dict[str, int] = {}
        self._connections_by_host: dict[str, int] = {}
        self._requests = 0
        self._request_bytes = 0
        self._refusals: dict[str, int] = {}
        self._last_logged: dict[str, float] = {}

    # --- connections --------------------------------------------------------------------

    def open_call(self, context: RequestContext) -> None:
        """Count a call on ``context.peer``; a new connection must fit the limits.

        Raises:
            MaxConnectionsError, MaxConnectionsPerIpError: the connection is refused.
        """
        with self._lock:
            calls = self._calls_by_peer.get(context.peer)
            if calls is not None:
                self._calls_by_peer[context.peer] = calls + 1
                return
            host = context.host
            on_host = self._connections_by_host.get(host, 0)
            if len(self._calls_by_peer) >= self.config.max_connections:
                error: BrokerBusyError = MaxConnectionsError(
                    f"the broker serves max.connections={self.config.max_connections}"
                    " connections already"
                )
            elif on_host >= self.config.max_connections_per_ip:
                error = MaxConnectionsPerIpError(
                    f"the broker serves max.connections.per.ip="
                    f"{self.config.max_connections_per_ip} connections from {host} already"
                )
            else:
                self._calls_by_peer[context.peer] = 1
                self._connections_by_host[host] = on_host + 1
                return
        raise self._refused(error, context)

    def close_call(self, context: RequestContext) -> None:
        """The call counted by ``open_call`` ended."""
        with self._lock:
            calls = self._calls_by_peer.get(context.peer, 0) - 1
            if calls > 0:
                self._calls_by_peer[context.peer] = calls
                return
            self._calls_by_peer.pop(context.peer, None)
            host = context.host
            left = self._connections_by_host.get(host, 0) - 1
            if left > 0:
                self._connections_by_host[host] = left
            else:
                self._connections_by_host.pop(host, None)

    # --- queued requests and bytes ------------------------------------------------------

    def admit_request(self, context: RequestContext | None = None) -> None:
        """Count one request for the storage executor (``context``: for the log).

        Raises:
            QueuedMaxRequestsError: ``queued.max.requests`` are queued or running.
        """
        with self._lock:
            if self._requests < self.config.queued_max_requests:
                self._requests += 1
                return
        raise self._refused(
            QueuedMaxRequestsError(
                f"queued.max.requests={self.config.queued_max_requests} requests are"
                " already waiting for the broker"
            ),
            context,
        )

    def try_admit_request(self) -> bool:
        """``admit_request`` without the refusal: False (not counted, not logged) when
        full. For a listener that waits instead of refusing (the Kafka listener)."""
        with self._lock:
            if self._requests < self.config.queued_max_requests:
                self._requests += 1
                return True
        return False

    def release_request(self) -> None:
        """The request counted by ``admit_request`` finished."""
        with self._lock:
            self._requests -= 1

    def admit_bytes(self, size: int, context: RequestContext | None = None) -> None:
        """Count ``size`` produce bytes in flight (``context``: for the log).

        A request larger than the whole limit is admitted when nothing else is in flight,
        so that one large batch is never refused forever.

        Raises:
            QueuedMaxRequestBytesError: they would exceed ``queued.max.request.bytes``.
        """
        with self._lock:
            limit = self.config.queued_max_request_bytes
            if self._request_bytes + size <= limit or self._request_bytes == 0:
                self._request_bytes += size
                return
        raise self._refused(
            QueuedMaxRequestBytesError(
                f"queued.max.request.bytes={limit}: the broker holds too much produce data"
                " in flight"
            ),
            context,
        )

    def try_admit_bytes(self, size: int) -> bool:
        """``admit_bytes`` without the refusal: False (not counted, not logged) when the
        bytes do not fit now."""
        with self._lock:
            limit = self.config.queued_max_request_bytes
            if self._request_bytes + size <= limit or self._request_bytes == 0:
                self._request_bytes += size
                return True
        return False

    def release_bytes(self, size: int) -> None:
        """Bytes counted by ``admit_bytes`` were answered (or dropped)."""
        with self._lock:
            self._request_bytes -= size

    def _refused(self, error: BrokerBusyError, context: RequestContext | None) -> BrokerBusyError:
        now = time.monotonic()
        with self._lock:
            self._refusals[error.code] = self._refusals.get(error.code, 0) + 1
            due = now - self._last_logged.get(error.code, 0.0) >= _LOG_EVERY_S
            if due:
                self._last_logged[error.code] = now
        if due:
            who = f"{context.peer} (client id {context.client_id!r})" if context else "a client"
            log.warning("refused a call of %s: %s (%s)", who, error.code, error)
        return error

    # --- state --------------------------------------------------------------------------

    @property
    def connections(self) -> int:
        """Connections carrying at least one call now."""
        with self._lock:
            return len(self._calls_by_peer)

    @property
    def queued_requests(self) -> int:
        """Requests admitted to the storage executor and not finished."""
        with self._lock:
            return self._requests

    @property
    def queued_bytes(self) -> int:
        """Produce bytes in flight."""
        with self._lock:
            return self._request_bytes

    def refusals(self) -> dict[str, int]:
        """Refused calls so far, by error code."""
        with self._lock:
            return dict(self._refusals)


class AdmissionCollector(Collector):
    """Prometheus view of an ``Admission`` and of the parked operations."""

    def __init__(self, admission: Admission, parked: Callable[[], dict[str, int]]) -> None:
        self._admission = admission
        self._parked = parked

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        admission = self._admission
        yield GaugeMetricFamily(
            "tidelog_connections", "Connections carrying a call now", value=admission.connections
        )
        yield GaugeMetricFamily(
            "tidelog_queued_requests",
            "Requests queued or running on the storage executor",
            value=admission.queued_requests,
        )
        yield GaugeMetricFamily(
            "tidelog_queued_request_bytes",
            "Produce bytes received and not yet answered",
            value=admission.queued_bytes,
        )
        refusals = CounterMetricFamily(
            "tidelog_limit_refusals", "Calls refused by a limit", labels=["code"]
        )
        for code, count in sorted(admission.refusals().items()):
            refusals.add_metric([code], count)
        yield refusals
        parked = GaugeMetricFamily(
            "tidelog_parked_operations", "Delayed operations parked now", labels=["purgatory"]
        )
        for name, count in sorted(self._parked().items()):
            parked.add_metric([name], count)
        yield parked
