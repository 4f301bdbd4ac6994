"""What every peer of the comparison shares: the workload, records, figures, processes.

Pure helpers (records, percentiles, figure rounding) plus the two pieces of process
plumbing every server needs: a free port on 127.0.0.1 and ``ServerProcess``, which starts a
server in a process group of its own and stops the whole group (SIGTERM, then SIGKILL),
so a Ctrl-C or an exception in the harness never leaves a server behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEY_BYTES = 16
LATENCY_WARMUP = 200


@dataclass(frozen=True, slots=True)
class Workload:
    """One measurement a worker process runs against one peer.

    ``kind``: ``produce``, ``consume``, ``latency``, ``end_to_end`` or (Tidelog only)
    ``backlog``. ``records`` is the count for throughput runs, ``samples`` the count of
    single acknowledged records for latency runs. ``step_bytes`` / ``total_bytes`` are for
    ``backlog``.
    """

    kind: str
    stream: str
    value_bytes: int
    acks: str = "all"  # Tidelog only: "all" (fsynced) or "1" (appended, not fsynced)
    records: int = 0
    samples: int = 0
    partitions: int = 1
    step_bytes: int = 0
    total_bytes: int = 0
    server_pid: int = 0  # backlog: the broker, whose CPU time each step reads


def key_for(i: int) -> bytes:
    """The ``i``-th record's 16-byte key: unique, big-endian, so it names its record."""
    return i.to_bytes(KEY_BYTES, "big")


def percentile(samples: Sequence[float], pct: float) -> float:
    """The nearest-rank percentile (``pct`` in 0..100) of a non-empty sequence."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def latency_figures(samples_ms: Sequence[float]) -> dict[str, Any]:
    """p50/p99/p999/mean/max of latency samples in milliseconds, rounded to microseconds."""
    return {
        "samples": len(samples_ms),
        "p50_ms": round(statistics.median(samples_ms), 3),
        "p99_ms": round(percentile(samples_ms, 99), 3),
        "p999_ms": round(percentile(samples_ms, 99.9), 3),
        "mean_ms": round(statistics.fmean(samples_ms), 3),
        "max_ms": round(max(samples_ms), 3),
    }


def throughput_figures(
    records: int, record_bytes: int, seconds: float, client_cpu_s: float
) -> dict[str, Any]:
    """Records/s and MB/s (10^6 bytes of key + value) of ``records`` moved in ``seconds``.

    ``client_cpu_s`` is the CPU time the client process spent in the same interval (all its
    threads): next to the server's, it shows which side is the bottleneck.
    """
    return {
        "records": records,
        "seconds": round(seconds, 3),
        "client_cpu_s": round(client_cpu_s, 3),
        "records_per_s": round(records / seconds),
        "mb_per_s": round(records * record_bytes / seconds / 1e6, 1),
    }


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (servers needing a fixed port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    """Wait until something accepts on 127.0.0.1:``port``; raise if ``process`` died."""
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode} at start")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen on port {port} within 30 s")
        time.sleep(0.05)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a live process has used; 0.0 if unreadable."""
    user_s, system_s = process_cpu_split_s(pid)
    return user_s + system_s


def process_cpu_split_s(pid: int) -> tuple[float, float]:
    """``(user, system)`` CPU seconds of a live process, all threads; zeros if unreadable.

    System time is the kernel working for the process: for a broker that writes and
    fsyncs, the page cache and block layer's share, which depends on the disk.
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0, 0.0
    # After the command name: state is field 3, utime field 14, stime field 15 (1-based).
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def directory_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (a data directory's size)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


class ServerProcess:
    """A server started in a new process group, stopped with everything it spawned.

    Not thread-safe. Output goes to ``log_path`` so a server that fails to start can be
    diagnosed; ``stop`` is idempotent and safe to call from ``finally``.
    """

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path, what: str) -> None:
        self.process = process
        self.log_path = log_path
        self.what = what

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        log_path: Path,
        what: str,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ServerProcess:
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                list(argv),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: the terminal's Ctrl-C
                env=env,  # reaches the harness, whose finally stops the group
                cwd=cwd,
            )
        return cls(process, log_path, what)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


class RunningServer:
    """A peer's started server: its process group, address and data directory.

    Not thread-safe; ``stop`` stops the whole process group (idempotent).
    """

    def __init__(self, process: ServerProcess, address: str, data_dir: Path) -> None:
        self.process = process
        self.address = address
        self.data_dir = data_dir

    def stop(self) -> None:
        self.process.stop()


def start_listening(
    argv: Sequence[str], log_path: Path, what: str, port: int, data_dir: Path
) -> RunningServer:
    """Start ``argv`` and wait until it accepts connections on 127.0.0.1:``port``.

    Raises ``RuntimeError`` with the end of its log if it does not (it is stopped first).
    """
    process = ServerProcess.start(argv, log_path, what)
    try:
        wait_for_port(port, process.process, what)
    except RuntimeError as exc:
        process.stop()
        raise RuntimeError(f"{exc}\n{process.log_tail()}") from exc
    return RunningServer(process, f"127.0.0.1:{port}", data_dir)


def command_version(argv: Sequence[str]) -> str:
    """First line of a command's ``--version`` style output, or ``unknown``."""
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "unknown"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def ensure_debian_packages(binaries: dict[str, str], allow_install: bool) -> dict[str, str]:
    """Install missing Debian packages for ``binaries`` (binary name -> package) if we can.

    Returns binary name -> reason it is still missing (empty when all are there). Installs
    only as root and only when ``allow_install``: ``apt-get update`` then ``apt-get install
    -y`` of the missing packages.
    """
    missing = {name: pkg for name, pkg in binaries.items() if shutil.which(name) is None}
    if not missing:
        return {}
    if not allow_install:
        return {name: f"{name} not found and installing is off" for name in missing}
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return {
            name: f"{name} not found; install Debian package {pkg} (needs root and apt-get)"
            for name, pkg in missing.items()
        }
    packages = sorted(set(missing.values()))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", *packages]):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return {name: f"`{' '.join(argv)}` failed: {' '.join(tail)}" for name in missing}
    return {
        name: f"{name} still not found after installing {missing[name]}"
        for name in missing
        if shutil.which(name) is None
    }
