"""A broker as users run it (``python -m broker``) for the hostile-input tests.

A subprocess, so that a crash shows (the process ends; the test sees its exit code and
log) and its memory can be measured from outside (``rss_bytes``, from
``/proc/PID/status``). Its log goes to a file that the tests grep for tracebacks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidelog.broker.cluster.testing import dying_with_parent

ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT_S = 90.0

# What a traceback or an unexpected-error line looks like in the broker's log.
_TRACEBACK = re.compile(
    r"Traceback \(most recent call last\)|unexpected error answered as INTERNAL"
)


class BrokerProcess:
    """``python -m broker`` on 127.0.0.1:0 over ``data_dir``. Not thread-safe (one owner).

    ``settings`` are ``--set KEY=VALUE`` pairs (Kafka names). Stop with ``stop``.
    """

    def __init__(self, data_dir: Path, log_file: Path, settings: dict[str, object]) -> None:
        self.data_dir = data_dir
        self.log_file = log_file
        self.ready_file = log_file.with_suffix(".ready")
        self.ready_file.unlink(missing_ok=True)
        args = [
            sys.executable,
            "-m",
            "tidelog.broker",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(data_dir),
            "--ready-file",
            str(self.ready_file),
            "--set",
            "metrics.port=-1",
        ]
        for key, value in settings.items():
            args += ["--set", f"{key}={value}"]
        with open(log_file, "ab") as log:
            self.process = subprocess.Popen(
                dying_with_parent(args), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=_env()
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.ready_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the broker did not start:\n{self.output()}")
            time.sleep(0.02)
        self.address = self.ready_file.read_text().strip()
        self.port = int(self.address.rsplit(":", 1)[1])

    def output(self) -> str:
        return self.log_file.read_text(errors="replace")

    def tracebacks(self) -> list[str]:
        """Lines of the log that show an unhandled exception (with some context).

        Not counted: grpc's own "ExecuteBatchError raised in core" (grpc.aio logs it with a
        traceback when an answer cannot be written because the client cancelled the call
        under it: grpc/grpc#32551; no Tidelog code runs there).
        """
        lines = self.output().splitlines()
        return [
            "\n".join(lines[max(0, i - 2) : i + 25])
            for i, line in enumerate(lines)
            if _TRACEBACK.search(line)
            and not (i > 0 and "ExecuteBatchError raised in core" in lines[i - 1])
        ]

    def stall_reports(self) -> str:
        """The log's stall reports (``broker.loop_watchdog``: a loop that stopped turning,
        a process that ran no Python, faulthandler's stack dumps): what a call that timed
        out was waiting behind."""
        lines = self.output().splitlines()
        marks = ("has not turned", "ran no Python", "Thread 0x", "Current thread 0x")
        return "\n".join(
            "\n".join(lines[i : i + 30])
            for i, line in enumerate(lines)
            if any(mark in line for mark in marks)
        )

    def dump_stacks_when_stalled(
        self, probe_timeout_s: float = 5.0, dumps: int = 3
    ) -> Callable[[], None]:
        """Probe the broker's health every second; when a probe gets no answer within
        ``probe_timeout_s``, send SIGUSR1 (the broker writes every thread's stack to its
        log), at most ``dumps`` times. Returns the function that stops probing."""
        stop = threading.Event()

        def probe() -> None:
            left = dumps
            with grpc.insecure_channel(self.address) as channel:
                check = health_pb2_grpc.HealthStub(channel).Check
                while left and not stop.wait(1.0):
                    try:
                        check(health_pb2.HealthCheckRequest(), timeout=probe_timeout_s)
                    except grpc.RpcError as exc:
                        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and self.alive():
                            self.process.send_signal(signal.SIGUSR1)
                            left -= 1

        thread = threading.Thread(target=probe, name="stall-probe", daemon=True)
        thread.start()

        def stop_probing() -> None:
            stop.set()
            thread.join(probe_timeout_s + 2)

        return stop_probing

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss_bytes(self) -> int:
        """The broker's resident set size now (Linux ``VmRSS``)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None, status
        return int(match.group(1)) * 1024

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM, then SIGKILL if it does not stop in time; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.process.returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a hard crash leaves a stack in the log
    return env
