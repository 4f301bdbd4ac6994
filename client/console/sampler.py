"""The console's background sampler: chart history even while no page is open.

A page view samples the cluster too (``ClusterView.describe_all`` and ``overview``), but
only while someone looks. ``Sampler`` looks on its own every ``interval_ms``: one daemon
thread per cluster connection (per ``ClusterView``: the shared one without
authentication, one per logged-in session with it), started with the application's
lifespan or at the login, stopped when the session ends (logout, idle expiry) or the
application stops. Each look is ``ClusterView.sample``: every topic described (the
produce rate), every group described (the consume rate and each group's lag).

Bounded: the interval is clamped to [``MIN_INTERVAL_MS``, ``MAX_INTERVAL_MS``], each look
is bounded by the clients' ``request_timeout_ms``, and the samples live in the view's
``History`` (a window and a maximum count). A failed look is logged once per kind of
error (at WARNING, then DEBUG until a look succeeds) and the next one is tried on time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["MAX_INTERVAL_MS", "MIN_INTERVAL_MS", "Sampler"]

log = logging.getLogger(__name__)

MIN_INTERVAL_MS = 1_000
MAX_INTERVAL_MS = 60_000


class Sampler:
    """Calls ``look`` every ``interval_ms`` on a daemon thread until ``stop``.

    Args:
        look: one sample of the cluster (``ClusterView.sample``); exceptions are logged,
            never raised.
        interval_ms: time between the starts of two looks, clamped to
            [``MIN_INTERVAL_MS``, ``MAX_INTERVAL_MS``].
        name: the thread's name (for logs and debuggers).
    """

    def __init__(self, look: Callable[[], None], *, interval_ms: int, name: str) -> None:
        self.interval_ms = max(MIN_INTERVAL_MS, min(MAX_INTERVAL_MS, interval_ms))
        self._look = look
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._last_error: str | None = None
        self.looks = 0  # completed looks, successful or not (tests and debugging)

    def start(self) -> Sampler:
        """Start the thread (the first look is immediate). Returns ``self``."""
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the thread to end and wait up to ``timeout_s`` for a look in progress to
        finish (the thread is a daemon: one stuck in a call does not keep the process
        alive; what it raises after ``stop`` is logged at DEBUG only). Idempotent; safe
        before ``start``."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._look()
            except Exception as exc:  # a sampler must outlive any error
                kind = f"{type(exc).__name__}: {exc}"
                repeated = kind == self._last_error or self._stopped.is_set()
                level = logging.DEBUG if repeated else logging.WARNING
                log.log(level, "console sampler %s: %s", self._thread.name, kind)
                self._last_error = kind
            else:
                self._last_error = None
            self.looks += 1
            self._stopped.wait(self.interval_ms / 1000)
