"""Client quotas, Kafka's model: byte rates and request time per user and client id.

Three quotas, Kafka's names:

- ``producer_byte_rate``: record bytes produced per second;
- ``consumer_byte_rate``: record bytes fetched per second;
- ``request_percentage``: time on the broker's storage threads, in percent of one thread
  per ``quota.window.size.seconds`` (100 = one whole thread).

Entities (``QuotaEntity``), Kafka's: a user, a client id, or a user and a client id;
``<default>`` in either place stands for every user (client id) without an entry of its
own. The user is the authenticated principal's name (``User:alice`` -> ``alice``);
without authentication it is ``ANONYMOUS``, as Kafka's. For each quota, the first entity
in Kafka's order that sets that quota applies:

1. user and client id   2. user and ``<default>`` client   3. user
4. ``<default>`` user and client id   5. ``<default>`` user and ``<default>`` client
6. ``<default>`` user   7. client id   8. ``<default>`` client

(per quota: a user with only ``consumer_byte_rate`` set still produces under the next
entity down that sets ``producer_byte_rate``, as Kafka keeps one override table per quota
type). The clients that match one entity share one meter: a user's quota is shared by all
its client ids; a default is metered for each user (client id) on its own.

Measurement (Kafka's ``Rate`` over ``SampledStat``): each meter has ``quota.window.num``
samples of ``quota.window.size.seconds``; the rate is the sum of the live samples over the
time they span, counted as at least ``num - 1`` whole windows, so a new client's first
burst is measured over the full window. A client over its quota is throttled for
``(rate - quota) / quota * window``: the time after which its rate is back at the quota,
at most the whole window span (Kafka's formula and cap).

Enforcement, by the listener: a produce stream over its quota is not read for the
throttle time (Kafka mutes the channel; gRPC flow control then holds the client back),
its answers go out at once; a fetch, unary produce or other call is answered after the
throttle time. Produce and fetch answers report it as ``throttle_time_ms``. The broker
does not trust the client to honour it: the muting does.

``RateMeter`` is pure (time comes in as ``now_ms``); ``QuotaManager`` is the thread-safe
owner of the quotas (persisted in ``quotas.json`` in the data directory, written
atomically; the file of a broker from before user quotas, client ids only, still loads)
and of the meters.
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

from tidelog.storage.clock import Clock
from tidelog.storage.errors import InvalidRequestError
from tidelog.storage.files import atomic_write

__all__ = [
    "ANONYMOUS",
    "CONSUMER_BYTE_RATE",
    "DEFAULT_ENTITY",
    "PRODUCER_BYTE_RATE",
    "QUOTA_KEYS",
    "REQUEST_PERCENTAGE",
    "QuotaCollector",
    "QuotaEntity",
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
ANONYMOUS = "ANONYMOUS"  # the user of a connection without authentication (Kafka's)
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


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """Who a quota is for: a user, a client id, or both (None: that part not given;
    ``<default>``: every user or client id without an entry of its own)."""

    user: str | None = None
    client_id: str | None = None

    def __post_init__(self) -> None:
        if self.user is None and self.client_id is None:
            raise InvalidRequestError("a quota needs a user, a client id, or both")

    def __str__(self) -> str:
        parts = []
        if self.user is not None:
            parts.append(f"user={self.user}")
        if self.client_id is not None:
            parts.append(f"client-id={self.client_id}")
        return ",".join(parts)

    def sort_key(self) -> tuple[str, str]:
        """Users first, then client ids (for listings)."""
        return (self.user or "\uffff", self.client_id or "")


def _precedence(user: str, client_id: str) -> tuple[QuotaEntity, ...]:
    """Kafka's order of the entities that may bound ``user`` with ``client_id``."""
    d = DEFAULT_ENTITY
    return (
        QuotaEntity(user, client_id),
        QuotaEntity(user, d),
        QuotaEntity(user, None),
        QuotaEntity(d, client_id),
        QuotaEntity(d, d),
        QuotaEntity(d, None),
        QuotaEntity(None, client_id),
        QuotaEntity(None, d),
    )


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
    """Quotas by entity, their meters and throttle totals. Thread-safe (one lock).

    Build with ``open``; the constructor only assigns.
    """

    def __init__(
        self,
        path: Path,
        window: QuotaWindow,
        clock: Clock,
        quotas: dict[QuotaEntity, dict[str, float]],
    ) -> None:
        self._path = path
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()  # guards _quotas, _meters, _throttled_ms
        self._quotas = quotas
        # (metered user or "", metered client id or "", quota) -> meter
        self._meters: dict[tuple[str, str, str], RateMeter] = {}
        self._throttled_ms: dict[str, int] = dict.fromkeys(QUOTA_KEYS, 0)

    @classmethod
    def open(cls, data_dir: Path, window: QuotaWindow, clock: Clock) -> QuotaManager:
        """Load the quotas kept in ``data_dir`` (none if the file is absent).

        Raises:
            OSError, ValueError: the file cannot be read or parsed.
        """
        path = data_dir / _FILE_NAME
        quotas: dict[QuotaEntity, dict[str, float]] = {}
        if path.exists():
            document = json.loads(path.read_text())
            # Before user quotas the file held client ids only.
            for client_id, values in document.get("client_ids", {}).items():
                quotas[QuotaEntity(None, str(client_id))] = _floats(values)
            for entry in document.get("entities", []):
                entity = QuotaEntity(entry.get("user"), entry.get("client_id"))
                quotas[entity] = _floats(entry["quotas"])
        return cls(path, window, clock, quotas)

    # --- configuration ------------------------------------------------------------------

    def alter(
        self, entity: QuotaEntity | str, set_values: Mapping[str, float], delete: list[str]
    ) -> None:
        """Set and remove quotas of ``entity`` (a bare string: a client id) and persist
        them.

        Raises:
            InvalidRequestError: an empty user or client id, an unknown quota name or a
                value that is not positive.
        """
        if isinstance(entity, str):
            entity = QuotaEntity(None, entity)
        if entity.user == "" or entity.client_id == "":
            raise InvalidRequestError("a quota's user or client id must not be empty")
        checked = _validate(set_values)
        for key in delete:
            if key not in QUOTA_KEYS:
                raise InvalidRequestError(
                    f"unknown quota {key!r}; known quotas: {', '.join(QUOTA_KEYS)}"
                )
        with self._lock:
            values = dict(self._quotas.get(entity, {}))
            for key in delete:
                values.pop(key, None)
            values.update(checked)
            if values:
                self._quotas[entity] = values
            else:
                self._quotas.pop(entity, None)
            document = {
                "entities": [
                    {"user": e.user, "client_id": e.client_id, "quotas": v}
                    for e, v in sorted(self._quotas.items(), key=lambda item: item[0].sort_key())
                ]
            }
            atomic_write(self._path, json.dumps(document, sort_keys=True).encode())
        log.info("quotas of %s: %s", entity, values or "none")

    def describe(self, client_id: str | None = None) -> dict[str, dict[str, float]]:
        """The quotas of client-id entities (no user part), by client id (one, or all if
        None)."""
        found = self.describe_entities(client_id=client_id, users=False)
        return {e.client_id: v for e, v in found.items() if e.client_id is not None}

    def describe_entities(
        self, *, user: str | None = None, client_id: str | None = None, users: bool = True
    ) -> dict[QuotaEntity, dict[str, float]]:
        """The quotas set, by entity: those whose user (client id) is ``user``
        (``client_id``) when given; ``users`` False leaves out entities with a user part."""
        with self._lock:
            out = {}
            for entity, values in self._quotas.items():
                if user is not None and entity.user != user:
                    continue
                if client_id is not None and entity.client_id != client_id:
                    continue
                if not users and entity.user is not None:
                    continue
                out[entity] = dict(values)
            return dict(sorted(out.items(), key=lambda item: item[0].sort_key()))

    # --- enforcement --------------------------------------------------------------------

    @property
    def configured(self) -> bool:
        """Whether any quota is set (for anyone)."""
        with self._lock:
            return bool(self._quotas)

    def record(self, client_id: str, quota: str, value: float, *, user: str | None = None) -> int:
        """Count ``value`` against the ``quota`` of ``user`` (None: ``ANONYMOUS``) with
        ``client_id``; the throttle time in ms (0 when within the quota or without one)."""
        with self._lock:
            if not self._quotas:
                return 0
            found = self._bound(user or ANONYMOUS, client_id, quota)
            if found is None:
                return 0
            meter_key, bound = found
            now_ms = self._clock.monotonic_ms()
            meter = self._meters.get(meter_key)
            if meter is None:
                meter = self._meters[meter_key] = RateMeter(self._window)
            meter.record(value, now_ms)
            throttle = meter.throttle_ms(bound, now_ms)
            self._throttled_ms[quota] += throttle
            return throttle

    def metered(self, user: str | None, client_id: str, quota: str) -> float:
        """What ``record`` has counted against the meter that ``user`` and ``client_id``
        share for ``quota``, over the live window (0 without a quota: nothing is
        metered then). For operators' tools and tests."""
        with self._lock:
            found = self._bound(user or ANONYMOUS, client_id, quota)
            if found is None:
                return 0.0
            meter = self._meters.get(found[0])
            if meter is None:
                return 0.0
            return meter.measure(self._clock.monotonic_ms())[0]

    def _bound(
        self, user: str, client_id: str, quota: str
    ) -> tuple[tuple[str, str, str], float] | None:
        for entity in _precedence(user, client_id):
            values = self._quotas.get(entity)
            if values is not None and quota in values:
                # Everyone the entity matches shares one meter: a named or default user
                # part meters per user, a client part per client id.
                metered_user = user if entity.user is not None else ""
                metered_client = client_id if entity.client_id is not None else ""
                return (metered_user, metered_client, quota), values[quota]
        return None

    def throttled_ms(self) -> dict[str, int]:
        """Total throttle time imposed so far, by quota (for the metrics)."""
        with self._lock:
            return dict(self._throttled_ms)


def _floats(values: Mapping[str, object]) -> dict[str, float]:
    return {str(k): float(v) for k, v in values.items()}  # type: ignore[arg-type]


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
