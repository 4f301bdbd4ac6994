"""The shutdown gate: operations in flight, counted, so that closing waits for them.

``BrokerCore`` and the services it is made of (``broker.core.topics``,
``broker.core.offsets``) run each operation inside ``operation()``: refused with
``ShuttingDownError`` once closing began, counted until it ends. ``close`` (the core's)
calls ``begin_close`` and then ``wait_idle`` before it closes the logs, so that no append
races the closing of a log. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tidelog.broker.core.errors import ShuttingDownError

__all__ = ["OperationGate"]


class OperationGate:
    """Counts operations in flight; refuses new ones once closing."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._in_flight = 0
        self._closing = False

    @property
    def in_flight(self) -> int:
        with self._condition:
            return self._in_flight

    @contextmanager
    def operation(self) -> Iterator[None]:
        """Run one operation unless closing (``ShuttingDownError``)."""
        if not self.try_enter():
            raise ShuttingDownError("the broker is shutting down")
        try:
            yield
        finally:
            self.leave()

    def try_enter(self) -> bool:
        """Count one operation in; False (nothing counted) once closing."""
        with self._condition:
            if self._closing:
                return False
            self._in_flight += 1
            return True

    def leave(self) -> None:
        """An operation counted by ``try_enter`` ended."""
        with self._condition:
            self._in_flight -= 1
            # Only ``wait_idle`` waits, and only after ``begin_close`` (both under the
            # condition): an operation ending before that wakes nobody.
            if self._in_flight == 0 and self._closing:
                self._condition.notify_all()

    def begin_close(self) -> None:
        """Refuse new operations from now on. Idempotent."""
        with self._condition:
            self._closing = True

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no operation is in flight; False if ``timeout_s`` passed first."""
        with self._condition:
            return self._condition.wait_for(lambda: self._in_flight == 0, timeout_s)
