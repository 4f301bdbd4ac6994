"""Several brokers on one machine, differing only in ``--listen`` and ``--data-dir``.

Issue 11: a second broker could not start because both took the fixed metrics port, and
the error named neither the address nor the setting. The metrics port now follows the
listen port (+1000), and every "address in use" names the setting and the address.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 20.0


def _free_port_pair() -> int:
    """A port P with P and P + 1000 both free right now (best effort: a race is rare)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port + 1000 > 65535:
            continue
        with socket.socket() as other:
            try:
                other.bind(("127.0.0.1", port + 1000))
            except OSError:
                continue
        return port
    raise AssertionError("no free port pair")


def _serve(data_dir: Path, listen: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidelog.broker",
            "--listen",
            listen,
            "--data-dir",
            str(data_dir),
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)  # reaps it and closes its pipe


def _wait_for_metrics(port: int, process: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
                return str(answer.read().decode())
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"no metrics on {port}: {process.stdout.read() if process.stdout else ''}"
                ) from None
            time.sleep(0.05)


def test_two_brokers_run_side_by_side_and_clashes_name_the_setting(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    first_port = _free_port_pair()
    first = _serve(tmp_path / "one", f"127.0.0.1:{first_port}")
    processes.append(first)
    _wait_for_metrics(first_port + 1000, first)
    second_port = _free_port_pair()
    second = _serve(tmp_path / "two", f"127.0.0.1:{second_port}")
    processes.append(second)
    assert "tidelog_" in _wait_for_metrics(second_port + 1000, second)

    # The same listen address again: the error names the setting and the address.
    clash = _serve(tmp_path / "three", f"127.0.0.1:{first_port}", "--set", "metrics.port=0")
    processes.append(clash)
    output, _ = clash.communicate(timeout=30)
    assert clash.returncode == 1, output
    assert "listeners (--listen)" in output
    assert f"127.0.0.1:{first_port}" in output

    # A metrics port in use: named too, with what to do about it.
    taken = first_port + 1000
    clash = _serve(tmp_path / "four", "127.0.0.1:0", "--set", f"metrics.port={taken}")
    processes.append(clash)
    output, _ = clash.communicate(timeout=30)
    assert clash.returncode == 1, output
    assert f"metrics.port: cannot serve metrics on 127.0.0.1:{taken}" in output
    assert "Address already in use" in output
