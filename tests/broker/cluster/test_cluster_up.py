"""``tidelog cluster up`` as a user runs it: a subprocess, its printed addresses, SIGTERM,
and the same data directory again (issue #27).

One test, two lives of one cluster: records produced through the printed Kafka bootstrap
(confluent-kafka) are read back through the printed gRPC bootstrap (Tidelog's client)
after a clean stop and a second ``cluster up`` on the same directory, which is the same
cluster (same broker ids, the topic and its records still there). Every process the
command started is gone after each SIGTERM.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tests.kafka.clients import Out, consume, produce
from tidelog.broker.cluster_up import ClusterUpError, LocalClusterProcesses, existing_broker_ids
from tidelog.client import AdminClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

_START_TIMEOUT_S = 150.0


def _free_block(brokers: int) -> int:
    """A base port whose whole block (ZooKeeper, 3 ports per broker) is free now."""
    for _ in range(100):
        base = random.randrange(20_000, 28_000, 10)
        ports = [base] + [base + 10 * i + k for i in range(1, brokers + 1) for k in range(3)]
        if all(_bindable(port) for port in ports):
            return base
    raise RuntimeError("no free block of ports")


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class _Run:
    """One ``tidelog cluster up`` process and what it printed."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tidelog.client.cli", "cluster", "up", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def value(self, prefix: str) -> str:
        """The rest of the first printed line starting with ``prefix``, once printed."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        self.process.kill()
        raise AssertionError(f"no {prefix!r} line; printed:\n" + "\n".join(self.lines))

    def children(self) -> list[int]:
        """The processes whose parent is the command (ZooKeeper's JVM and the brokers)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == self.process.pid:
                found.append(int(entry.name))
        return found

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(90)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)
            self._reader.join(10)
            assert self.process.stdout is not None
            self.process.stdout.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie is gone too: it runs nothing (reaped by its parent or init later).
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_cluster_up_serves_stops_and_comes_back_with_the_same_data(tmp_path: Path) -> None:
    require_zookeeper()
    data_dir = tmp_path / "cluster"
    base = _free_block(2)
    first = _Run(["--brokers", "2", "--data-dir", str(data_dir), "--base-port", str(base)])
    try:
        kafka_bootstrap = first.value("Kafka bootstrap:")
        grpc_bootstrap = first.value("gRPC bootstrap:")
        assert kafka_bootstrap == f"127.0.0.1:{base + 11},127.0.0.1:{base + 21}"
        assert grpc_bootstrap == f"127.0.0.1:{base + 10},127.0.0.1:{base + 20}"
        with AdminClient(grpc_bootstrap, request_timeout_ms=30_000) as admin:
            admin.create_topic("tried", 2)
            partitions = admin.describe_topic("tried").partitions
            # cluster up's default.replication.factor: min(3, brokers).
            assert all(sorted(p.replicas) == [1, 2] for p in partitions)
        records = [Out(key=f"k{i}".encode(), value=f"v{i}".encode()) for i in range(20)]
        produce("confluent-kafka", kafka_bootstrap, grpc_bootstrap, "tried", records)
        children = first.children()
        assert len(children) == 3, children  # ZooKeeper and two brokers
    finally:
        status = first.stop()
    assert status == 0, "\n".join(first.lines)
    assert any(line.startswith("Stopped.") for line in first.lines), first.lines
    assert all(_gone(pid) for pid in children), [p for p in children if not _gone(p)]

    # The same directory, no --brokers: as many as it holds, the same ids and data.
    second = _Run(["--data-dir", str(data_dir), "--base-port", str(base)])
    try:
        grpc_bootstrap = second.value("gRPC bootstrap:")
        assert second.value("broker 2:").startswith(f"gRPC 127.0.0.1:{base + 20}")
        got = consume("tidelog", "", grpc_bootstrap, "tried", [0, 1], len(records))
        assert sorted(r.value for r in got) == sorted(r.value for r in records)
        children = second.children()
        assert len(children) == 3, children
    finally:
        status = second.stop()
    assert status == 0, "\n".join(second.lines)
    assert all(_gone(pid) for pid in children)


def test_a_port_in_use_stops_the_start_before_anything_runs(tmp_path: Path) -> None:
    """A second cluster on the same ports would otherwise find the first one's ZooKeeper
    answering; nothing is started and the message names the port and its use."""
    base = _free_block(1)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 11))
        holder.listen()
        cluster = LocalClusterProcesses(tmp_path / "d", brokers=1, base_port=base)
        with pytest.raises(ClusterUpError, match=rf"{base + 11} \(broker 1's Kafka\)"):
            cluster.start()
    assert not (tmp_path / "d" / "zookeeper").exists()


def test_one_directory_serves_one_cluster_at_a_time(tmp_path: Path) -> None:
    first = LocalClusterProcesses(tmp_path, brokers=1, base_port=_free_block(1))
    first._lock()  # what start does first
    try:
        second = LocalClusterProcesses(tmp_path, brokers=1, base_port=_free_block(1))
        with pytest.raises(ClusterUpError, match="in use by another"):
            second.start()
    finally:
        first.stop()


def test_the_brokers_a_directory_holds(tmp_path: Path) -> None:
    for name in ("broker-1", "broker-3", "broker-x", "zookeeper", "logs"):
        (tmp_path / name).mkdir()
    assert existing_broker_ids(tmp_path) == [1, 3]
    assert existing_broker_ids(tmp_path / "missing") == []
    with pytest.raises(ValueError, match="between 1024 and 65535"):
        LocalClusterProcesses(tmp_path, brokers=3, base_port=65_510)
