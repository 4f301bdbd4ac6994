"""``tidelog console``: serves the console on 127.0.0.1, stops on SIGINT, refuses bad usage."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.client.test_cli import tidelog
from tidelog.broker.testing import InProcessBroker

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_serves_the_console_until_interrupted() -> None:
    with InProcessBroker() as broker:
        port = _free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "tidelog.client.cli", "console", "--bootstrap", broker.address,
             "--listen", f"127.0.0.1:{port}", "--refresh-ms", "2000", "--sample-ms", "1000"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                        body = page.read().decode()
                    break
                except OSError:
                    assert process.poll() is None, process.communicate(timeout=5)
                    assert time.monotonic() < deadline, "the console did not start"
                    time.sleep(0.2)
            assert "Overview" in body
            assert broker.address in body
            assert 'data-refresh-ms="2000"' in body
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=10)
    assert process.returncode == 0, err
    assert f"http://127.0.0.1:{port}/" in err
    assert "GET /" not in out + err  # no access log


def test_bad_usage(tmp_path: Path) -> None:
    bad = tidelog("console", "--listen", "nowhere")
    assert bad.returncode == 2
    assert "HOST:PORT" in bad.stderr
    fast = tidelog("console", "--sample-ms", "100")
    assert fast.returncode == 2
    assert "sample_interval_ms must be between 1000 and 60000" in fast.stderr
    config = tmp_path / "client.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
        "sasl.username=root\nsasl.password=root-secret\n"
    )
    refused = tidelog("console", "--command-config", str(config))
    assert refused.returncode == 2
    assert "log in on the login page" in refused.stderr
    assert "root-secret" not in refused.stderr
