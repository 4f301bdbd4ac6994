"""The broker process's cyclic garbage collector, kept off the request path (issue #34).

CPython's collector finds garbage in reference cycles by walking every tracked container
object of the generation it collects; a full (generation 2) collection walks all of
them. A broker holding 10,000 partitions (RF=3, every broker a replica of each) tracks
about 650,000 such objects: its logs, segments, indexes, ``Partition`` states and
metadata image. Measured with three brokers on this 2-core machine, Metadata for every
topic sampled 200 times (``benchmarks/metadata_scale.py``'s step): each broker ran a full
collection every few seconds, 290-490 ms each, finding nothing to free (the objects are
alive: they are the partitions), and every request, fetch and ZooKeeper heartbeat of the
broker waited it out. Metadata p99 104 ms, max 425 ms.

The remedy (Instagram's, and what ``gc.freeze`` is documented for): move the long-lived
objects to the collector's permanent generation, which no collection walks.
``GcFreezer`` does it once at start (the loaded logs) and then every ``interval_s``
(default 10 s): one ``gc.collect()`` over the objects that are not frozen yet (what
was allocated and survived since the last step: cheap once the partitions are frozen),
then ``gc.freeze()``. Same run with it: no collection over 100 ms after the partitions
were frozen, Metadata p99 80 ms, max 91 ms.

What it costs: a frozen object that later becomes cyclic garbage (a deleted topic's
partition, whose log and state refer to each other) is not reclaimed while it is
frozen; reference counting still frees everything outside cycles at once. So every
``full_interval_s`` (default 10 minutes) the freezer unfreezes, collects everything (one
full pause, as before but 10 minutes apart instead of seconds) and freezes again: cyclic
garbage lives at most that long.

Only the broker daemon's process runs it (``tidelog serve``, ``python -m
tidelog.broker``): an embedded broker shares its application's heap, whose collector is
the application's to tune.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["FREEZE_INTERVAL_S", "FULL_INTERVAL_S", "GcFreezer"]

log = logging.getLogger(__name__)

FREEZE_INTERVAL_S = 10.0
FULL_INTERVAL_S = 600.0


class GcFreezer:
    """Freezes the process's surviving objects every ``interval_s`` and collects them all
    every ``full_interval_s`` (see the module docstring). Thread-safe."""

    def __init__(
        self,
        interval_s: float = FREEZE_INTERVAL_S,
        full_interval_s: float = FULL_INTERVAL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval_s = interval_s
        self._full_interval_s = full_interval_s
        self._clock = clock
        self._last_full = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def step(self) -> tuple[str, int]:
        """One round, now: ``("full", collected)`` when ``full_interval_s`` has passed
        since the last full round (unfreeze, collect everything, freeze), else
        ``("freeze", collected)`` (collect what is not frozen, freeze it)."""
        with self._lock:
            now = self._clock()
            kind = "freeze"
            if now - self._last_full >= self._full_interval_s:
                kind = "full"
                self._last_full = now
                gc.unfreeze()
            started = time.perf_counter()
            collected = gc.collect()
            gc.freeze()
            took_ms = (time.perf_counter() - started) * 1000
        level = logging.INFO if kind == "full" or took_ms >= 100 else logging.DEBUG
        log.log(
            level,
            "gc: %s round freed %d objects in %.1f ms; %d frozen",
            kind,
            collected,
            took_ms,
            gc.get_freeze_count(),
        )
        return kind, collected

    def start(self) -> GcFreezer:
        """Freeze what exists now (the loaded broker), then every ``interval_s``."""
        _, collected = self.step()
        log.info(
            "gc: froze %d objects at start (freed %d); again every %.0f s, all collected "
            "every %.0f s",
            gc.get_freeze_count(),
            collected,
            self._interval_s,
            self._full_interval_s,
        )
        self._thread = threading.Thread(target=self._run, name="tidelog-gc-freezer", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.step()
            except Exception:  # never let the freezer's failure go unseen, nor stop it
                log.exception("gc: freezer round failed")

    def stop(self) -> None:
        """Stop the rounds and unfreeze: a stopping process's leftovers are collectable."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        with self._lock:
            gc.unfreeze()
