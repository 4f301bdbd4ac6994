"""Notice an event loop that stopped turning, and say where it is stuck.

Every listener serves all its connections from one asyncio loop thread, so anything that
blocks that thread (a lock held across a disk write, a slow page-cache miss, a long
computation) stalls every client of the listener at once, and from outside that looks
like a broker that hangs without a word. ``LoopWatchdog`` is a daemon thread that asks the
loop for a no-op every ``interval_s``; when the loop has not run one for ``stall_s`` it logs
a warning with the loop thread's current stack (once per stall), and an info line when the
loop turns again, with how long it was stuck. It costs one wake-up of the loop per
interval.

The stack is written as plain ``File ..., line ...`` lines, not as a traceback: a stall is
a performance fault for an operator to read, not an error raised in the broker.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal
import sys
import threading
import time
import traceback
from typing import TextIO

__all__ = ["LoopWatchdog", "ProcessStallDump", "register_dump_signal", "thread_stacks"]

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.5
DEFAULT_STALL_S = 2.0


class LoopWatchdog:
    """Watches one loop run by ``loop_thread``. Thread-safe; ``stop`` once."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        loop_thread: threading.Thread,
        name: str,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        stall_s: float = DEFAULT_STALL_S,
    ) -> None:
        self._loop = loop
        self._loop_thread = loop_thread
        self._name = name
        self._interval_s = interval_s
        self._stall_s = stall_s
        self._last_turn = time.monotonic()
        self._stopped = threading.Event()
        self.stalls = 0  # how many stalls were reported
        self.longest_stall_s = 0.0
        self._thread = threading.Thread(target=self._run, name=f"{name}-watchdog", daemon=True)

    def start(self) -> LoopWatchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(2 * self._interval_s + 1)

    def _turned(self) -> None:
        self._last_turn = time.monotonic()

    def _run(self) -> None:
        stalled_since: float | None = None
        while not self._stopped.wait(self._interval_s):
            if self._loop.is_closed():
                return
            try:
                self._loop.call_soon_threadsafe(self._turned)
            except RuntimeError:  # the loop closed under us
                return
            now = time.monotonic()
            waited = now - self._last_turn
            if waited <= self._stall_s + self._interval_s:
                if stalled_since is not None:
                    stuck = now - stalled_since
                    self.longest_stall_s = max(self.longest_stall_s, stuck)
                    log.info("%s: the event loop turns again after %.1f s", self._name, stuck)
                    stalled_since = None
                continue
            if stalled_since is None:
                stalled_since = self._last_turn
                self.stalls += 1
                log.warning(
                    "%s: the event loop has not turned for %.1f s; every call on it waits."
                    " The loop thread is at:\n%s",
                    self._name,
                    waited,
                    self._loop_stack(),
                )

    def _loop_stack(self) -> str:
        ident = self._loop_thread.ident
        frame = sys._current_frames().get(ident) if ident is not None else None
        if frame is None:
            return "  (the loop thread is gone)"
        return "".join(traceback.format_stack(frame)).rstrip()


def thread_stacks(limit: int = 6) -> str:
    """Every thread's innermost ``limit`` frames, named (a stop held by a call: where
    each thread waits)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame, limit=limit))
        out.append(f"--- {names.get(ident, ident)}\n{stack}")
    return "\n".join(out)


class ProcessStallDump:
    """Report when the whole process stops running Python.

    ``LoopWatchdog`` needs the interpreter to run its own thread; a C call that holds the
    GIL for seconds (or a process the kernel does not schedule: a paused VM, SIGSTOP)
    freezes it with everything else. A daemon thread here wakes every ``interval_s``; when
    it wakes ``stall_s / 2`` or more late, it logs how long the process ran no Python and,
    past ``stall_s``, writes every thread's stack to ``file`` (stderr: the broker's log)
    with the GIL held, which is safe: the other threads are stopped between bytecodes.
    Those stacks show where each thread went on, not the call that held the GIL.

    ``c_timer=True`` catches that call in the act: it keeps faulthandler's
    ``dump_traceback_later`` armed, a C thread that needs no GIL and dumps after
    ``stall_s``. It is off by default because it is not safe for a process that was not
    scheduled: the timer fires the moment the process runs again, and walks the other
    threads' frames while they run; a cluster broker resumed after SIGSTOP died of
    SIGSEGV in about one pause in five (issue #29's pause fault, and CI). Use it to
    diagnose a GIL hog on a process nobody pauses. ``SIGUSR1`` dumps the stacks on
    demand either way (``register_dump_signal``). One per process (faulthandler keeps one
    timer): ``tidelog serve`` starts it, in-process test brokers do not.
    """

    def __init__(
        self,
        *,
        stall_s: float = 10.0,
        interval_s: float = 1.0,
        file: TextIO | None = None,
        c_timer: bool = False,
    ) -> None:
        self._stall_s = stall_s
        self._interval_s = interval_s
        self._file = file if file is not None else sys.stderr
        self._c_timer = c_timer
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-dump", daemon=True)

    def start(self) -> ProcessStallDump:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(2 * self._interval_s + 1)
        if self._c_timer:
            faulthandler.cancel_dump_traceback_later()

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            if self._c_timer:
                faulthandler.dump_traceback_later(self._stall_s, file=self._file)
            if self._stopped.wait(self._interval_s):
                return
            now = time.monotonic()
            late = now - last - self._interval_s
            if late > self._stall_s / 2:
                dump = late >= self._stall_s
                log.warning(
                    "the broker process ran no Python for %.1f s (a call holding the GIL, or"
                    " the machine did not schedule it)%s",
                    late,
                    (
                        "; every thread's stack was dumped above (the C timer)"
                        if dump and self._c_timer
                        else "; every thread's stack, as they went on, follows"
                        if dump
                        else ""
                    ),
                )
                if dump and not self._c_timer:
                    faulthandler.dump_traceback(file=self._file, all_threads=True)
            last = now


def register_dump_signal(file: TextIO | None = None) -> None:
    """``kill -USR1 <pid>`` writes every thread's stack to ``file`` (stderr), as a JVM's
    ``jstack``; works while a thread holds the GIL."""
    faulthandler.register(signal.SIGUSR1, file=file if file is not None else sys.stderr)
