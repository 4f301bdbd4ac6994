"""The daemon as users run it: ``python -m broker`` in a subprocess, signals included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import grpc
import pytest

from tests.broker.conftest import create_topic, fetch, make_batch, produce
from tidelog.broker.cli import main
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.checkpoint import CLEAN_SHUTDOWN_MARKER
from tidelog.storage.records import decode_records

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 20.0


class Daemon:
    """``python -m broker`` on 127.0.0.1:0, its port read from ``--ready-file``."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.ready_file = data_dir.parent / f"{data_dir.name}.ready"
        self.ready_file.unlink(missing_ok=True)
        # A file, not a pipe: nobody has to drain it while the daemon runs.
        self.log_file = data_dir.parent / f"{data_dir.name}.log"
        with open(self.log_file, "wb") as log:
            self.process = self._spawn(data_dir, log, extra)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.ready_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"daemon did not start:\n{self.output()}")
            time.sleep(0.02)
        self.address = self.ready_file.read_text().strip()

    def _spawn(
        self, data_dir: Path, log: BinaryIO, extra: tuple[str, ...]
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
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
                *extra,
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log_file.read_text(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:  # never leave a process behind
        daemon.kill()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly(tmp_path: Path, daemons: list[Daemon], signum: int) -> None:
    data_dir = tmp_path / "data"
    daemon = Daemon(data_dir)
    daemons.append(daemon)
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t")
        produce(stub, "t", 0, make_batch([b"x"]), acks=1)
    daemon.process.send_signal(signum)
    daemon.process.send_signal(signum)  # a duplicate at once (a wrapper forwarding it)
    assert daemon.process.wait(15) == 0, daemon.output()
    assert (data_dir / CLEAN_SHUTDOWN_MARKER).exists()
    assert "stopped" in daemon.output()


def test_every_acks_all_record_survives_sigkill(tmp_path: Path, daemons: list[Daemon]) -> None:
    data_dir = tmp_path / "data"
    daemon = Daemon(data_dir)
    daemons.append(daemon)
    acknowledged: set[bytes] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def producer(worker: int) -> None:
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            n = 0
            while not stop.is_set():
                value = f"{worker}-{n}".encode()
                try:
                    result = produce(stub, "t", worker % 2, make_batch([value] * 10), acks=-1)
                except grpc.RpcError:
                    return  # the broker died under us: that one was never acknowledged
                if result.error_code == "":
                    with lock:
                        acknowledged.add(value)
                n += 1

    with grpc.insecure_channel(daemon.address) as channel:
        create_topic(pb_grpc.BrokerStub(channel), "t", 2)
    threads = [threading.Thread(target=producer, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.7)
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait(10)
    stop.set()
    for thread in threads:
        thread.join(10)
    assert len(acknowledged) > 50, len(acknowledged)
    assert not (data_dir / CLEAN_SHUTDOWN_MARKER).exists()

    with InProcessBroker(data_dir) as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        stored: list[bytes | None] = []
        for partition in (0, 1):
            offset = 0
            while True:
                result = fetch(stub, "t", partition, offset, partition_max_bytes=1 << 20)
                assert result.error_code == ""
                records = [r for r in decode_records(result.records) if r.offset >= offset]
                if not records:
                    break
                stored.extend(r.value for r in records)
                offset = records[-1].offset + 1
    assert acknowledged <= set(stored)
    assert len(stored) == 10 * len(set(stored))  # whole batches, each stored once


def test_bad_settings_exit_2_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--set", "log.retention.msec=5"]) == 2
    assert "unknown broker setting 'log.retention.msec'" in capsys.readouterr().err
    assert main(["--set", "num.partitions=zero"]) == 2
    assert "num.partitions" in capsys.readouterr().err


def test_an_unusable_data_dir_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code = main(["--data-dir", str(blocker / "data"), "--listen", "127.0.0.1:0"])
    assert code == 1
    assert "cannot start" in capsys.readouterr().err


def test_healthcheck_command(broker: InProcessBroker, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["healthcheck", "--address", broker.address]) == 0
    address = broker.address
    broker.stop()
    assert main(["healthcheck", "--address", address, "--timeout-ms", "500"]) == 1
    assert "unhealthy" in capsys.readouterr().err


def test_ignored_security_settings_are_warned_about_at_start(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    """Certificates, SASL mechanisms and the authorizer given without a TLS or SASL scheme:
    the broker serves PLAINTEXT as Kafka would, and says so for each setting."""
    pki = TestPki.create(tmp_path / "pki")
    daemon = Daemon(
        tmp_path / "data",
        "--set",
        f"ssl.certfile={pki.server_cert}",
        "--set",
        f"ssl.keyfile={pki.server_key}",
        "--set",
        "sasl.enabled.mechanisms=SCRAM-SHA-512",
        "--set",
        "authorizer.enabled=true",
    )
    daemons.append(daemon)
    output = daemon.output()
    assert "serving PLAINTEXT" in output
    warnings = [line for line in output.splitlines() if " WARNING " in line]
    for key in ("ssl.certfile", "ssl.keyfile", "sasl.enabled.mechanisms", "authorizer.enabled"):
        assert any(key in line for line in warnings), (key, output)
    assert all("security.protocol" in line for line in warnings if "is ignored" in line)


def test_serve_help_says_the_listener_scheme_decides() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tidelog.broker", "--help"],
        cwd=ROOT,
        capture_output=True,
        timeout=30,
        check=True,
    ).stdout.decode()
    head = " ".join(out.split("options:")[0].split())
    assert "security.protocol" in head
    assert "ignored" in head


def test_python_m_broker_help_lists_the_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tidelog.broker", "--help"],
        cwd=ROOT,
        capture_output=True,
        timeout=30,
        check=True,
        env={**os.environ},
    ).stdout.decode()
    for flag in ("--data-dir", "--listen", "--config", "--set"):
        assert flag in out


def test_the_daemon_freezes_its_loaded_objects_out_of_the_collector(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    """``broker.gc_freeze`` runs in the daemon's process (issue #34)."""
    daemon = Daemon(tmp_path / "data", "--log-level", "INFO")
    daemons.append(daemon)
    with grpc.insecure_channel(daemon.address) as channel:
        create_topic(pb_grpc.BrokerStub(channel), "t")
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(15) == 0, daemon.output()
    froze = [line for line in daemon.output().splitlines() if "gc: froze" in line]
    assert len(froze) == 1, daemon.output()
    assert int(froze[0].split("gc: froze ")[1].split()[0]) > 10_000, froze
