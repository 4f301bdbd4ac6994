"""A broker process that stops running Python leaves every thread's stack in its log.

``ProcessStallDump`` (``broker.loop_watchdog``): by default a thread notices afterwards
that the process ran no Python and dumps every stack with the GIL held (safe, also for a
process that was paused); with ``c_timer`` faulthandler's C timer, which needs no GIL,
catches a call that holds the GIL in the act. Run in child processes, since faulthandler
keeps one timer per process.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.broker.hostile.process import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]

_HOG = textwrap.dedent(
    """
    import logging, re, sys, time
    from tidelog.broker.loop_watchdog import ProcessStallDump

    # A catastrophic regular expression: the re engine never releases the GIL during one
    # match, and each extra "a" doubles its time. One match must outlast the stall
    # threshold (1 s) by itself: between matches the GIL is released and the watchdog's
    # heartbeat runs, so a loop of short matches is no stall (on a fast machine 24 "a"s
    # took 0.57 s and the dump never fired). Calibrated here, before the watchdog starts.
    size = 18
    while True:
        started = time.monotonic()
        re.match(r"(a+)+$", "a" * size + "b")
        if time.monotonic() - started >= 0.8:  # the next size takes >= 1.6 s
            size += 1
            break
        size += 1

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    dump = ProcessStallDump(stall_s=1.0, interval_s=0.2, c_timer=True).start()
    time.sleep(0.5)

    def hold_the_gil_in_c() -> None:
        re.match(r"(a+)+$", "a" * size + "b")

    hold_the_gil_in_c()
    time.sleep(0.6)
    dump.stop()
    """
)


def test_a_call_holding_the_gil_is_caught_with_every_stack() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _HOG], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "most recent call first" in done.stderr
    assert "hold_the_gil_in_c" in done.stderr
    assert "ran no Python for" in done.stderr


_PAUSED = textwrap.dedent(
    """
    import logging, sys, threading, time
    from tidelog.broker.loop_watchdog import ProcessStallDump

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

    def busy() -> None:  # threads that run the moment the process is resumed
        while True:
            sum(range(1000))
            time.sleep(0.001)

    for _ in range(6):
        threading.Thread(target=busy, daemon=True).start()
    dump = ProcessStallDump(stall_s=1.0, interval_s=0.1).start()
    print("ready", flush=True)
    time.sleep(30)
    """
)


def test_a_paused_process_is_reported_and_survives_its_resumption() -> None:
    """Issue #29: with faulthandler's C timer armed, a cluster broker resumed after a
    SIGSTOP longer than the timer died of SIGSEGV (the timer walked the threads' frames
    while they ran again). The default reports the pause after the fact, stacks included,
    and the process lives on, pause after pause."""
    child = subprocess.Popen(
        [sys.executable, "-c", _PAUSED],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        for _ in range(5):
            child.send_signal(signal.SIGSTOP)
            time.sleep(1.5)
            child.send_signal(signal.SIGCONT)
            time.sleep(0.5)
        assert child.poll() is None, f"died with {child.returncode} after a pause"
    finally:
        child.kill()
        _, stderr = child.communicate(timeout=10)
    assert stderr.count("ran no Python for") >= 5
    assert "every thread's stack, as they went on, follows" in stderr
    assert " in busy\n" in stderr  # the dump names the threads' functions
    assert "Timeout (" not in stderr  # faulthandler's C timer never fired


def test_sigusr1_dumps_a_running_brokers_stacks(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", {})
    try:
        broker.process.send_signal(signal.SIGUSR1)

        def dumped(output: str) -> bool:
            # The dump is written thread by thread: wait for the whole of it.
            return " in run_forever\n" in output and output.count("Thread 0x") >= 3

        deadline = time.monotonic() + 10
        while not dumped(broker.output()) and time.monotonic() < deadline:
            time.sleep(0.05)
        output = broker.output()
        assert "most recent call first" in output
        assert " in run_forever\n" in output  # the listener's event loop thread
        assert output.count("Thread 0x") >= 3  # the loop, the storage threads...
        assert broker.alive()
    finally:
        assert broker.stop() == 0
