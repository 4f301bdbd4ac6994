"""Injected time: every component that reads a clock takes a ``Clock``.

``SystemClock`` is the real one; ``ManualClock`` is what tests use so that no test sleeps
to wait for a deadline. Both are thread-safe.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """A source of time in integer milliseconds."""

    def monotonic_ms(self) -> int:
        """Milliseconds on a clock that never goes backwards; for intervals and deadlines."""
        ...

    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch; for record timestamps and retention."""
        ...


class SystemClock:
    """The machine's clocks. Thread-safe (stateless)."""

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to. Thread-safe."""

    def __init__(self, wall_ms: int = 1_700_000_000_000, monotonic_ms: int = 0) -> None:
        self._lock = threading.Lock()
        self._wall_ms = wall_ms
        self._monotonic_ms = monotonic_ms

    def monotonic_ms(self) -> int:
        with self._lock:
            return self._monotonic_ms

    def wall_ms(self) -> int:
        with self._lock:
            return self._wall_ms

    def advance(self, ms: int) -> None:
        """Move both clocks forward by ``ms`` (which must not be negative)."""
        if ms < 0:
            raise ValueError(f"a clock cannot go back: advance({ms})")
        with self._lock:
            self._wall_ms += ms
            self._monotonic_ms += ms
