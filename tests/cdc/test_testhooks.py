"""The CDC stop-point hook (``client.cdc.testhooks``) stops the process exactly where it
is reached, whichever thread reaches it.

The kill tests trust the hook's promise: once the line ``CDC test hook: stopped at
POINT`` is written, nothing after the point runs. A pipelined sink reaches
``mid_transaction`` on its committer thread, not the main thread; a process-directed
SIGSTOP (``os.kill(os.getpid(), SIGSTOP)``) is taken by the main thread, and the
calling thread ran on until the main thread got the CPU to stop the group: the
committer sent its EndTxn after the line, so the kill test found the "stopped"
transaction committed (docs/cdc.md, "Performance"). Here a child process reaches a
point on the main thread or on another thread, and writes to its stdout right after
``stop_point`` returns; once every thread of the child is stopped, that write must not
have happened. The loaded machine is made certain: the child runs on one CPU and its
main thread is ``SCHED_IDLE``, so it runs only when the other thread waits. (With the
process-directed SIGSTOP, the thread rounds failed 4 of 5 so.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broker.cluster.waiting import eventually
from tidelog.client.cdc.testhooks import ENV

_CHILD = """
import os, sys, threading
from tidelog.client.cdc.testhooks import stop_point

def reach() -> None:
    stop_point("mid_transaction")
    os.write(1, b"ran on after the stop point\\n")

# One CPU for the whole process (threads inherit it).
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
if sys.argv[1] == "thread":
    go = threading.Event()
    def thread_main() -> None:
        go.wait()
        reach()
    thread = threading.Thread(target=thread_main)
    thread.start()
    # The main thread, which takes a process-directed signal, only runs when the other
    # thread waits (SCHED_IDLE, on the same CPU): a loaded machine, made certain.
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    go.set()
    thread.join()
else:
    reach()
"""


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is in the stopped state (``T`` in its stat)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        states.append(stat[stat.rindex(")") + 2])
    return bool(states) and all(state == "T" for state in states)


@pytest.mark.parametrize("where", ["main", "thread"])
@pytest.mark.parametrize("round_", range(5))
def test_nothing_after_the_stop_point_runs(where: str, round_: int, tmp_path: Path) -> None:
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    env = {**os.environ, ENV: "mid_transaction"}
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, where], stdout=stdout, stderr=stderr, env=env
        )
    try:
        eventually(lambda: "stopped at mid_transaction" in err.read_text(), 30)
        eventually(lambda: _all_threads_stopped(child.pid), 30)
        assert out.read_text() == ""
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
