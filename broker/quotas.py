"""Client quotas, Kafka's model: byte rates and request time per client id, by throttling.

Three quotas, Kafka's names, per client id (``<default>`` applies to every client id
without quotas of its own; per user once authentication exists):

- ``producer_byte_rate``: record bytes produced per second;
- ``consumer_byte_rate``: record bytes fetched per second;
- ``request_percentage``: time on the broker's storage threads, in percent of one thread
  per ``quota.window.size.seconds`` (100 = one whole thread).

Measurement (Kafka's ``Rate`` over ``SampledStat``): each client id and quota has
``quota.window.num`` samples of ``quota.window.size.seconds``; the rate is the sum of the
live samples over the time they span, counted as at least ``num - 1`` whole windows, so a
new client's first burst is measured over the full window. A client over its quota is
throttled for ``(rate - quota) / quota * window``: the time after which its rate is back
at the quota, at most the whole window span (Kafka's formula and cap).

Enforcement, by the listener: a produce stream over its quota is not read for the
throttle time (Kafka mutes the channel; gRPC flow control then holds the client back),
its answers go out at once; a fetch, unary produce or other call is answered after the
throttle time. Produce and fetch answers report it as ``throttle_time_ms``. The broker
does not trust the client to honour it: the muting does.

``RateMeter`` is pure (time comes in as ``now_ms``); ``QuotaManager`` is the thread-safe
owner of the quotas (persisted in ``quotas.json`` in the data directory, written
atomically) and of the meters.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from storage.clock import Clock
from storage.errors import InvalidRequestError
from storage.files import atomic_write

__all__ = [
    "CONSUMER_BYTE_RATE",
    "DEFAULT_ENTITY",
    "PRODUCER_BYTE_RATE",
    "QUOTA_KEYS",
    "REQUEST_PERCENTAGE",
    "QuotaCollector",
    "QuotaManager",
    "QuotaWindow",
    "RateMeter",
]

log = logging.getLogger(__name__)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
DEFAULT_ENTITY = "<default>"
_FILE_NAME = "quotas.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaWindow:
    """``quota.window.num`` samples of ``quota.window.size.seconds`` (Kafka: 11 x 1 s)."""

    samples: int = 11
    sample_ms: int = 1_000

    def __post_init__(self) -> None:
        if self.samples < 2:
            raise ValueError("quota.window.num: must be >= 2")
        if self.sample_ms < 1:
            raise ValueError("quota.window.size.seconds: must be >= 1")


class RateMeter:
    """A rate over sampled windows. Not thread-safe (its manager's lock guards it)."""

    __slots__ = ("_samples", "_window")

    def __init__(self, window: QuotaWindow) -> None:
        self._window = window
        self._samples: deque[list[float]] = deque()  # [start_ms, total]

    def record(self, value: float, now_ms: int) -> None:
        """Add ``value`` at ``now_ms`` (times must not go back)."""
        samples = self._samples
        if not samples or now_ms >= samples[-1][0] + self._window.sample_ms:
            samples.append([float(now_ms), 0.0])
            while len(samples) > self._window.samples:
                samples.popleft()
        samples[-1][1] += value

    def measure(self, now_ms: int) -> tuple[float, int]:
        """(total of the live samples, the time they count for in ms)."""
        window = self._window
        samples = self._samples
        while samples and samples[0][0] + window.samples * window.sample_ms <= now_ms:
            samples.popleft()  # wholly outside the span
        total = sum(sample[1] for sample in samples)
        oldest = int(samples[0][0]) if samples else now_ms
        elapsed = now_ms - oldest
        full = elapsed // window.sample_ms
        if full < window.samples - 1:
            elapsed += (window.samples - 1 - full) * window.sample_ms
        return total, elapsed

    def rate_per_s(self, now_ms: int) -> float:
        """The measured rate per second."""
        total, elapsed = self.measure(now_ms)
        return total * 1000.0 / elapsed if elapsed > 0 else 0.0

    def throttle_ms(self, bound_per_s: float, now_ms: int) -> int:
        """How long to hold a client measured here back so its rate falls to
        ``bound_per_s``; 0 within the quota. Capped at the window span."""
        total, elapsed = self.measure(now_ms)
        if bound_per_s <= 0:
            return self._window.samples * self._window.sample_ms
        excess = total - bound_per_s * elapsed / 1000.0
        if excess <= 0:
            return 0
        throttle = math.ceil(excess / bound_per_s * 1000.0)
        return min(throttle, self._window.samples * self._window.sample_ms)


def _validate(values: Mapping[str, float]) -> dict[str, float]:
    checked = {}
    for key, value in values.items():
        if key not in QUOTA_KEYS:
            raise InvalidRequestError(
                f"unknown quota {key!r}; known quotas: {', '.join(QUOTA_KEYS)}"
            )
        if not math.isfinite(value) or value <= 0:
            raise InvalidRequestError(f"quota {key} must be a positive number, got {value}")
        checked[key] = float(value)
    return checked


class QuotaManager:
    """Quotas by client id, their meters and throttle totals. Thread-safe (one lock).

    Build with ``open``; the constructor only assigns.
    """

    def __init__(
        self,
        path: Path,
        window: QuotaWindow,
        clock: Clock,
        quotas: dict[str, dict[str, float]],
    ) -> None:
        self._path = path
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()  # guards _quotas, _meters, _throttled_ms
        self._quotas = quotas
        self._meters: dict[tuple[str, str], RateMeter] = {}
        self._throttled_ms: dict[str, int] = dict.fromkeys(QUOTA_KEYS, 0)

    @classmethod
    def open(cls, data_dir: Path, window: QuotaWindow, clock: Clock) -> QuotaManager:
        """Load the quotas kept in ``data_dir`` (none if the file is absent).

        Raises:
            OSError, ValueError: the file cannot be read or parsed.
        """
        path = data_dir / _FILE_NAME
        quotas: dict[str, dict[str, float]] = {}
        if path.exists():
            document = json.loads(path.read_text())
            for entity, values in document.get("client_ids", {}).items():
                quotas[str(entity)] = {str(k): float(v) for k, v in values.items()}
        return cls(path, window, clock, quotas)

    # --- configuration ------------------------------------------------------------------

    def alter(self, client_id: str, set_values: Mapping[str, float], delete: list[str]) -> None:
        """Set and remove quotas of ``client_id`` (``<default>``: every client id without
        its own) and persist them.

        Raises:
            InvalidRequestError: an unknown quota name or a value that is not positive.
        """
        checked = _validate(set_values)
        for key in delete:
            if key not in QUOTA_KEYS:
                raise InvalidRequestError(
                    f"unknown quota {key!r}; known quotas: {', '.join(QUOTA_KEYS)}"
                )
        with self._lock:
            values = dict(self._quotas.get(client_id, {}))
            for key in delete:
                values.pop(key, None)
            values.update(checked)
            if values:
                self._quotas[client_id] = values
            else:
                self._quotas.pop(client_id, None)
            document = {"client_ids": self._quotas}
            atomic_write(self._path, json.dumps(document, sort_keys=True).encode())
        log.info("quotas of client id %r: %s", client_id, values or "none")

    def describe(self, client_id: str | None = None) -> dict[str, dict[str, float]]:
        """The quotas set, by client id (one client id, or all if None)."""
        with self._lock:
            if client_id is not None:
                found = self._quotas.get(client_id)
                return {client_id: dict(found)} if found else {}
            return {entity: dict(values) for entity, values in sorted(self._quotas.items())}

    # --- enforcement --------------------------------------------------------------------

    def record(self, client_id: str, quota: str, value: float) -> int:
        """Count ``value`` against ``client_id``'s ``quota``; the throttle time in ms
        (0 when within its quota or without one)."""
        with self._lock:
            values = self._quotas.get(client_id) or self._quotas.get(DEFAULT_ENTITY)
            bound = values.get(quota) if values else None
            if bound is None:
                return 0
            now_ms = self._clock.monotonic_ms()
            key = (client_id, quota)
            meter = self._meters.get(key)
            if meter is None:
                meter = self._meters[key] = RateMeter(self._window)
            meter.record(value, now_ms)
            throttle = meter.throttle_ms(bound, now_ms)
            self._throttled_ms[quota] += throttle
            return throttle

    def throttled_ms(self) -> dict[str, int]:
        """Total throttle time imposed so far, by quota (for the metrics)."""
        with self._lock:
            return dict(self._throttled_ms)


class QuotaCollector(Collector):
    """Prometheus view of the throttling: ``tidelog_throttle_time_ms_total{quota}``."""

    def __init__(self, quotas: QuotaManager) -> None:
        self._quotas = quotas

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "tidelog_throttle_time_ms", "Throttle time imposed by quotas", labels=["quota"]
        )
        for quota, total in sorted(self._quotas.throttled_ms().items()):
            family.add_metric([quota], total)
        yield family
