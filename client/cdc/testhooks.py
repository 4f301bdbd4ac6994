"""A test hook: stop the connector process at a named point, so a test can SIGKILL it there.

For tests only; nothing happens unless the environment variable ``TIDELOG_CDC_TEST_STOP_AT``
is set. Its value is ``POINT`` or ``POINT:N`` (the N-th time the point is reached in this
process, default 1). When the process reaches that point it writes ``CDC test hook:
stopped at POINT`` to stderr (flushed) and sends itself SIGSTOP; the test waits for the
line and SIGKILLs the process, which then dies exactly there (nothing runs between the
line and the stop that could change what is stored).

The SIGSTOP is sent to the calling thread (``pthread_kill``), not to the process: the
kernel hands a process-directed signal to the main thread, and a point reached on another
thread (the pipelined sink's committer reaches ``mid_transaction``) ran on until the main
thread got a CPU to stop the group, long enough on a loaded machine to send the EndTxn
the test then found committed (docs/cdc.md, "Performance"). A thread-directed SIGSTOP is
taken by the caller on its way out of the system call, so the caller stops before it
runs another instruction of its own; the other threads stop with it (a stop is for the
whole process).

Points (``client.cdc.txn_sink`` and ``connector``):

- ``snapshot``: a snapshot chunk's records are sent and stored in the broker's log, inside
  the snapshot's open transaction;
- ``mid_transaction``: a streaming transaction's records and position are stored in the
  broker's log, the Tidelog transaction is not committed;
- ``after_commit``: the Tidelog transaction committed, its LSN not yet confirmed to
  PostgreSQL.

The hook is a documented seam, not a mock: the process and everything it talks to are
real; the hook only chooses when the process dies.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable

__all__ = ["ENV", "POINTS", "stop_point"]

ENV = "TIDELOG_CDC_TEST_STOP_AT"
POINTS = ("snapshot", "mid_transaction", "after_commit")

_reached: Counter[str] = Counter()


def _wanted() -> tuple[str, int] | None:
    value = os.environ.get(ENV)
    if not value:
        return None
    point, _, nth = value.partition(":")
    if point not in POINTS:
        raise ValueError(f"{ENV}: unknown point {point!r}, expected one of {POINTS}")
    return point, int(nth or 1)


def stop_point(point: str, prepare: Callable[[], None] | None = None) -> None:
    """Count ``point``; stop the process here if the environment asks for this one."""
    wanted = _wanted()
    if wanted is None or wanted[0] != point:
        return
    _reached[point] += 1
    if _reached[point] != wanted[1]:
        return
    if prepare is not None:
        prepare()
    sys.stderr.write(f"CDC test hook: stopped at {point}\n")
    sys.stderr.flush()
    # Directed at this thread, not the process (module docstring).
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
