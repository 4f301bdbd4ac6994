"""A broker process (``python -m tidelog.broker``) with a Kafka listener on a fixed port,
killed with SIGKILL and restarted on the same data directory: the crash tests of
transactions (tests/kafka/test_transaction_crashes.py), the transactional workload under
kills (tests/faults/test_transactions_under_kills.py), hanging transactions
(tests/client/test_hanging_transactions.py). Both listeners keep their ports across
restarts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["BrokerProcess"]

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class BrokerProcess:
    """``python -m tidelog.broker`` on fixed ports (``bootstrap`` the Kafka listener's,
    ``address`` the gRPC one's), restartable on its data directory."""

    def __init__(self, data_dir: Path, settings: Mapping[str, object] | None = None) -> None:
        """``settings``: more broker keys (``--set``), kept across restarts."""
        self.data_dir = data_dir
        self.settings = dict(settings or {})
        self.kafka_port = _free_port()
        self.bootstrap = f"127.0.0.1:{self.kafka_port}"
        self.grpc_port = _free_port()
        self.address = f"127.0.0.1:{self.grpc_port}"  # Tidelog's own clients, the CLI
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        ready = self.data_dir.parent / "ready"
        ready.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "tidelog.broker", "--data-dir", str(self.data_dir),
                "--listen", self.address, "--ready-file", str(ready), "--log-level", "WARNING",
                "--set", "metrics.port=-1",
                "--set", f"kafka.listen=127.0.0.1:{self.kafka_port}",
                "--set", "transaction.abort.timed.out.transaction.cleanup.interval.ms=200",
                *(arg for k, v in self.settings.items() for arg in ("--set", f"{k}={v}")),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert self.process.poll() is None, "the broker died at start"
            assert time.monotonic() < deadline, "the broker did not start"
            time.sleep(0.05)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
