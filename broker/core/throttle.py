"""The leader's replication throttle (Kafka's ``leader.replication.throttled.rate``).

While a partition is being reassigned, the leader serves its *adding* replicas' fetches
(``Partition.throttled_follower``) from one budget of ``rate`` bytes per second for the
whole broker, a token bucket with one second of credit: ``grant`` says how many bytes a
read may take now (0: the bucket is in debt; the fetch answers no records and the
follower asks again after its long poll), ``charge`` takes what was read (a read may
exceed its grant by one batch: the first batch always goes whole, as Kafka's). The other
followers and every consumer are never slowed down. The follower side of the same idea is
``broker.cluster.fetcher`` (``follower.replication.throttled.rate``).

Both rates are dynamic broker configs (``broker.core.configs``): ``set_rate`` swaps the
rate while the broker runs; 0 turns the throttle off (``active`` false: reads go
unthrottled), as the static default does.

Thread-safe (one lock); time from the injected clock.
"""

from __future__ import annotations

import threading

from tidelog.storage.clock import Clock

__all__ = ["ReplicationThrottle"]

_BURST_MS = 1_000  # credit: this much of the rate may go at once


class ReplicationThrottle:
    """A byte-rate budget shared by the throttled replicas' reads. Thread-safe."""

    def __init__(self, rate_bytes: int, clock: Clock) -> None:
        if rate_bytes < 0:
            raise ValueError(f"rate_bytes must be 0 (off) or positive, got {rate_bytes}")
        self._rate_bytes = rate_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._debt_until_ms = 0.0  # the budget is spent until then

    @property
    def active(self) -> bool:
        """Whether reads go through the budget (a rate above 0)."""
        return self._rate_bytes > 0

    def set_rate(self, rate_bytes: int) -> None:
        """A new rate from now on (0: off), with a fresh budget: a debt run up at the
        old rate (at 1 byte/s, days of it) is not owed at the new one."""
        if rate_bytes < 0:
            raise ValueError(f"rate_bytes must be 0 (off) or positive, got {rate_bytes}")
        with self._lock:
            if rate_bytes != self._rate_bytes:
                self._rate_bytes = rate_bytes
                self._debt_until_ms = 0.0

    def grant(self, wanted_bytes: int) -> int:
        """How many of ``wanted_bytes`` a throttled read may take now (0: none; all of
        them while the throttle is off)."""
        now = self._clock.monotonic_ms()
        with self._lock:
            rate = self._rate_bytes
            until = max(self._debt_until_ms, now - _BURST_MS)
        if rate <= 0:
            return max(wanted_bytes, 0)
        available = int((now - until) * rate / 1000)
        return max(min(wanted_bytes, available), 0)

    def charge(self, read_bytes: int) -> None:
        """Take ``read_bytes`` (what a throttled read returned) from the budget."""
        if read_bytes <= 0:
            return
        now = self._clock.monotonic_ms()
        with self._lock:
            if self._rate_bytes <= 0:
                return
            until = max(self._debt_until_ms, now - _BURST_MS)
            self._debt_until_ms = until + read_bytes * 1000 / self._rate_bytes
