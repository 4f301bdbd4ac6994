"""``LoginLimiter``: the console's own limit on failed logins per client address.

Every console login reaches the broker from the console's address, so the broker's
failed-login limit per address (``sasl.login.failures.max``, 5 in 60 s by default)
counts all console users together: without a limit of its own, one person guessing
passwords through the console would lock every console user out at the broker. The
console therefore counts failed logins per *browser's* address and refuses (HTTP 429,
without asking the broker) once an address has ``max_failures`` within ``window_ms``;
the default, 3 in 60 s, stays below the broker's 5.

Each attempt is counted as a failure before the broker is asked (``begin``) and taken
back when it was not a refused password (``end``): parallel requests cannot slip past
the limit while their answers are pending. A successful login does not clear earlier
failures (a guesser with an account of their own could otherwise reset the count
between guesses). Memory is bounded: at most ``max_addresses`` addresses are tracked,
the least recently failed dropped first.

Thread-safe (one lock); clock-free for tests (``clock_ms``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Attempt", "LoginLimiter"]


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Attempt:
    """A login attempt under way: its address and when it was counted."""

    address: str
    time_ms: int


class LoginLimiter:
    """Failed logins per client address in a sliding window. Thread-safe.

    Args:
        max_failures: failures within ``window_ms`` after which an address is refused.
        window_ms: the window.
        max_addresses: how many addresses are remembered at most.
    """

    def __init__(
        self,
        *,
        max_failures: int = 3,
        window_ms: int = 60_000,
        max_addresses: int = 10_000,
        clock_ms: Callable[[], int] = _monotonic_ms,
    ) -> None:
        if max_failures < 1 or window_ms < 1 or max_addresses < 1:
            raise ValueError("max_failures, window_ms and max_addresses must be positive")
        self.max_failures = max_failures
        self.window_ms = window_ms
        self._max_addresses = max_addresses
        self._clock_ms = clock_ms
        self._failures: OrderedDict[str, deque[int]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, address: str, now: int) -> deque[int] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        while times and times[0] <= now - self.window_ms:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def begin(self, address: str) -> Attempt | int:
        """Count an attempt from ``address`` as a failure for now and return it, or,
        when the address already has ``max_failures`` in the window, the milliseconds
        until it may try again (and count nothing)."""
        now = self._clock_ms()
        with self._lock:
            times = self._recent(address, now)
            if times is not None and len(times) >= self.max_failures:
                return max(1, times[0] + self.window_ms - now)
            if times is None:
                times = self._failures[address] = deque()
                while len(self._failures) > self._max_addresses:
                    self._failures.popitem(last=False)
            times.append(now)
            self._failures.move_to_end(address)
            return Attempt(address, now)

    def end(self, attempt: Attempt, *, refused: bool) -> None:
        """The broker's answer: ``refused`` (a wrong user name or password) keeps the
        failure counted; anything else (logged in, the cluster unreachable) takes it
        back."""
        if refused:
            return
        with self._lock:
            times = self._failures.get(attempt.address)
            if times is not None:
                try:
                    times.remove(attempt.time_ms)
                except ValueError:
                    pass  # already out of the window
                if not times:
                    del self._failures[attempt.address]

    def failures(self, address: str) -> int:
        """Failures of ``address`` within the window now."""
        with self._lock:
            times = self._recent(address, self._clock_ms())
            return 0 if times is None else len(times)
