"""A ShareFetch parked until there is something to hand out (``ShareWait``), and the
cancel its caller holds when it may go away while it waits (``ShareFetchCancel``).

Split from ``broker.core.share_ops`` (which parks and wakes them) for size.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tidelog.broker.core.delayed import DelayedOperation

__all__ = ["ShareFetchCancel", "ShareWait"]


class ShareWait(DelayedOperation):
    """A ShareFetch waiting for something to hand out."""

    __slots__ = ("_event", "_probe")

    def __init__(self, deadline_ms: int, probe: Callable[[], bool]) -> None:
        super().__init__(deadline_ms)
        self._probe = probe
        self._event = threading.Event()

    def is_satisfied(self) -> bool:
        return self._probe()

    def on_complete(self) -> None:
        self._event.set()

    def wait(self, timeout_s: float) -> None:
        self._event.wait(timeout_s)


class ShareFetchCancel:
    """Set when whoever asked is gone (a share fetch stream ended,
    ``broker.grpc.share_stream``): a ShareFetch parked for it wakes at once and acquires
    nothing more. Without it a fetch parked for a broken stream would wait out its
    ``max_wait_ms`` and could acquire records for a client that will never see them
    (they would come back only after another lock duration). Thread-safe."""

    __slots__ = ("_cancelled", "_lock", "_wait")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._wait: ShareWait | None = None

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            wait, self._wait = self._wait, None
        if wait is not None:
            wait.force_complete()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def watch(self, wait: ShareWait) -> bool:
        """Wake ``wait`` on ``cancel``; False: cancelled already (do not wait)."""
        with self._lock:
            if self._cancelled:
                return False
            self._wait = wait
            return True
