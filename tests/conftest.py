"""A memory watchdog for the whole suite.

Once in CI the test process grew to 24 GiB during the hostile-input tests and the kernel
killed it: no test name, no traceback, nothing to go on (it did not recur alone). A
thread now reads this process's resident size every second; past ``TIDELOG_TEST_RSS_LIMIT_MB``
(8 GiB by default) it prints the running test's id and every thread's stack to stderr
and ends the run with exit status 70, before the kernel's OOM killer would.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tidelog.broker.cluster.testing import LocalCluster

_LIMIT_BYTES = int(os.environ.get("TIDELOG_TEST_RSS_LIMIT_MB", "8192")) * 1024 * 1024
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_current = {"test": "(between tests)"}
_config: list[pytest.Config] = []


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


def _watch(stop: threading.Event) -> None:
    while not stop.wait(1.0):
        try:
            rss = _rss_bytes()
        except OSError:
            return
        if rss > _LIMIT_BYTES:
            # pytest captures file descriptor 2: hand it back first, or the report is lost.
            capture = _config[0].pluginmanager.getplugin("capturemanager") if _config else None
            if capture is not None:
                capture.suspend_global_capture(in_=False)
            err = sys.stderr
            err.write(
                f"\nmemory watchdog: this test process holds {rss >> 20} MiB "
                f"(limit {_LIMIT_BYTES >> 20} MiB) during {_current['test']}; "
                "every thread's stack follows\n"
            )
            err.flush()
            faulthandler.dump_traceback(file=err, all_threads=True)
            err.flush()
            os._exit(70)


@pytest.fixture(scope="session", autouse=True)
def memory_watchdog(pytestconfig: pytest.Config) -> Iterator[None]:
    _config.append(pytestconfig)
    if not os.path.exists("/proc/self/statm"):
        yield
        return
    stop = threading.Event()
    thread = threading.Thread(target=_watch, args=(stop,), name="memory-watchdog", daemon=True)
    thread.start()
    yield
    stop.set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _current["test"] = item.nodeid
    yield
    _current["test"] = "(between tests)"


# TIDELOG_LOG_TAIL_CHARS widens it when chasing a failure locally.
_LOG_TAIL_CHARS = int(os.environ.get("TIDELOG_LOG_TAIL_CHARS", "6000"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that used a ``LocalCluster`` fixture reports the tail of each broker's
    log (all its lives) beside the traceback: a failure seen only in CI under load then
    says what the brokers were doing, not just what the client saw."""
    outcome: Any = yield
    report = outcome.get_result()
    if call.excinfo is None or report.when != "call":
        return
    funcargs = getattr(item, "funcargs", {})
    for name, value in funcargs.items():
        if isinstance(value, LocalCluster):
            for broker_id in value.broker_ids:
                tail = value.output(broker_id)[-_LOG_TAIL_CHARS:]
                report.sections.append((f"{name}: broker {broker_id} log (tail)", tail))
