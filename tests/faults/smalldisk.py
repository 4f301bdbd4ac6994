"""Small file systems for brokers' data directories, filled and freed on command (issue #29).

The ``disk-full`` fault: a broker's data directory lives on a size-limited tmpfs of its
own; at the step the harness fills that file system with a filler file, so every write
that needs a new page fails with ENOSPC (writes that still fit in a file's last page
succeed, as on a real nearly-full disk: that is what makes a failure land part way
through an append), and at the heal it deletes the filler.

``SmallDisks(workdir, broker_ids, size_bytes)`` mounts one tmpfs per broker at
``workdir/disk-<id>`` (``mount -t tmpfs -o size=...``, root only) and hands out
``data_dir(id)``, a directory inside it, for ``LocalCluster(data_dirs=...)``. Brokers
started in network namespaces (``ip netns exec`` gives each a mount namespace of its
own, a slave copy of the root's) see the mount, and the filler written from the root
namespace fills the same file system. ``fill(id)`` reserves the free space with
``posix_fallocate`` (fast, no data written), then tops it off with small writes until
ENOSPC; ``free(id)`` unlinks the filler. ``close`` (the ``with`` block) frees and
unmounts everything (``umount``, lazily if busy), every step time-bounded; it never
raises. A tmpfs takes memory only for what is written, so a generous size costs nothing
until the filler takes it, and only while a fault lasts.

``missing()`` names what this host lacks (root, ``mount``). Not thread-safe (one owner).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

__all__ = ["DEFAULT_SIZE_BYTES", "SmallDisks", "missing"]

log = logging.getLogger(__name__)

# Enough for a 30-minute run's data on one broker (every partition, RF 3) several times
# over; the filler makes it full whatever its size.
DEFAULT_SIZE_BYTES = 512 * 1024 * 1024
_FILLER = "filler"
_TOP_OFF_BYTES = 512
_PAGE_BYTES = 4096
_COMMAND_TIMEOUT_S = 20.0


def missing() -> str | None:
    """What stops small disks here, or None."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount/umount (util-linux)"
    return None


class SmallDisks:
    """One tmpfs per broker (module docstring). Build, ``with``/``close``."""

    def __init__(
        self, workdir: Path, broker_ids: Iterable[int], size_bytes: int = DEFAULT_SIZE_BYTES
    ) -> None:
        if size_bytes < 1024 * 1024:
            raise ValueError(f"a small disk has at least 1 MiB: {size_bytes}")
        self._workdir = workdir
        self._ids = sorted(set(broker_ids))
        self._size_bytes = size_bytes
        self._mounted: list[Path] = []
        self._full: set[int] = set()

    @property
    def broker_ids(self) -> list[int]:
        return list(self._ids)

    def mountpoint(self, broker_id: int) -> Path:
        return self._workdir / f"disk-{broker_id}"

    def data_dir(self, broker_id: int) -> Path:
        """Where broker ``broker_id`` keeps its data: beside the filler, on its tmpfs."""
        return self.mountpoint(broker_id) / "data"

    def data_dirs(self) -> dict[int, Path]:
        return {broker_id: self.data_dir(broker_id) for broker_id in self._ids}

    def is_full(self, broker_id: int) -> bool:
        return broker_id in self._full

    def start(self) -> SmallDisks:
        try:
            for broker_id in self._ids:
                mountpoint = self.mountpoint(broker_id)
                mountpoint.mkdir(parents=True, exist_ok=True)
                size = f"size={self._size_bytes}"
                _run(["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(mountpoint)])
                self._mounted.append(mountpoint)
                self.data_dir(broker_id).mkdir()
        except BaseException:
            self.close()
            raise
        return self

    def fill(self, broker_id: int) -> int:
        """Fill broker ``broker_id``'s file system to its last page; bytes the filler took."""
        if broker_id not in self._ids:
            raise ValueError(f"broker {broker_id} has no small disk (those: {self._ids})")
        path = self.mountpoint(broker_id) / _FILLER
        stat = os.statvfs(path.parent)
        free = stat.f_bavail * stat.f_frsize
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # A tmpfs undoes a whole fallocate that does not fit (the broker may have
            # written meanwhile): halve and go on, then top off the last pages.
            size = free
            while size >= _PAGE_BYTES:
                try:
                    os.posix_fallocate(fd, os.fstat(fd).st_size, size)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    size //= 2
            chunk = b"\0" * _TOP_OFF_BYTES
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
            taken = os.fstat(fd).st_blocks * 512
        finally:
            os.close(fd)
        self._full.add(broker_id)
        log.info("filled the disk of broker %d (%d bytes)", broker_id, taken)
        return taken

    def free(self, broker_id: int) -> None:
        """Delete broker ``broker_id``'s filler (nothing if there is none)."""
        (self.mountpoint(broker_id) / _FILLER).unlink(missing_ok=True)
        self._full.discard(broker_id)

    def close(self) -> None:
        """Free and unmount every disk. Idempotent; never raises."""
        for broker_id in self._ids:
            try:
                self.free(broker_id)
            except OSError as exc:
                log.warning("cannot free the disk of broker %d: %s", broker_id, exc)
        for mountpoint in reversed(self._mounted):
            try:
                _run(["umount", str(mountpoint)])
            except (RuntimeError, subprocess.TimeoutExpired):
                # A broker still running keeps it busy: detach now, gone when it exits.
                try:
                    _run(["umount", "-l", str(mountpoint)])
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    log.warning("cannot unmount %s: %s", mountpoint, exc)
        self._mounted.clear()

    def __enter__(self) -> SmallDisks:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _run(command: list[str]) -> None:
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr}")
