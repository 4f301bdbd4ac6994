"""A FUSE pass-through file system that loses unsynced writes on command (issue #29).

LazyFS's fault (``reference/fault-testing.md`` section 3) in Python: a broker's data
directory lives on this file system; a test SIGKILLs the broker, then tells the file
system to ``crash``, and everything that was not made durable is gone, as after a power
cut. A process kill alone loses nothing, because the kernel's page cache survives it; the
``crash`` is the part a kill cannot do.

Durability model (strict POSIX, stricter than ext4's defaults; say so when reading a result):

* **File content** is durable as of the last ``fsync``/``fdatasync`` of the file (either
  one persists size and data; metadata such as mode and times is not tracked). A file
  never fsynced has empty durable content.
* **Directory entries** (create, mkdir, unlink, rmdir, rename, in and out) are durable as
  of the last ``fsync`` of the directory that holds them: the directory's whole entry
  list is snapshotted then. An fsync of a *file* does not make its name durable (a
  journaling file system such as ext4 usually commits it along in practice; POSIX does
  not promise it; ext4's ``auto_da_alloc`` rename heuristics are not modelled).
* A new directory's own entries are empty until it is fsynced; a directory whose entry in
  its parent is not durable vanishes with everything under it.
* ``os.replace`` of a fsynced temp file followed by an fsync of the directory (the order
  of ``storage.files.atomic_write``) is therefore durable, and any step left out is not.

How: every operation is applied to a backing directory at once (the "live" tree the
kernel sees). Each file and directory gets an identity of our own (an integer: backing
inode numbers are reused after unlink, ours never are). The file system keeps two
namespaces, live and durable, each a map from directory identity to ``{name:
identity}``, and for each file a shadow copy of its content as of its last fsync (the
whole file is copied on each fsync: fine for test-sized data, see ``stats``). ``crash``
empties the backing directory and rebuilds it from the durable namespace and shadow
copies; open handles from before it turn stale (every operation on them fails with EIO,
and a late fsync on one changes nothing).

Kernel caching: entry and attribute timeouts are 0 so the kernel sees a crash at once,
``hard_remove`` so an unlinked open file is not renamed to ``.fuse_hidden*`` (which would
be an entry of its own), and FUSE without ``writeback_cache`` is write-through: every
``write(2)`` has reached this process when it returns, so a SIGKILLed writer leaves
nothing behind in the kernel that a later flush could add after the crash. Not supported:
hard links, symlinks, ``fallocate``, ``mmap``-only writes (Tidelog uses none).

Binding: mfusepy (the maintained fork of fusepy, pure ctypes, no compiler) over Debian's
``fuse3`` (libfuse3 and ``fusermount3``). pyfuse3 would need libfuse3-dev, pkg-config, a
C build and trio; fusepy 3.0 (2018) only speaks libfuse2. The file system runs single
threaded (``-s``) in a process of its own (``python -m tests.faults.lossyfs``), so a
test can kill the broker and then crash the file system. Control is a Unix socket in the
abstract namespace (no path-length limit, nothing to clean up): one command per
connection, ``crash`` or ``stats``, answered with one JSON line.

Slow fsyncs (``slow_fsyncs P MIN_S MAX_S SEED``, ``LossyFs.slow_fsyncs``): from then
on each file fsync first stalls, with probability ``P``, for a time drawn between
``MIN_S`` and ``MAX_S`` (a seeded draw); ``P`` 0 turns it off; the fsync then
completes as usual. Single threaded, a stall holds every operation behind it, as a disk
that stops for a few seconds does. With ``--threads`` (``LossyFs(threads=True)``) the
FUSE loop runs a thread per request: every operation still holds the one lock, so they
apply one at a time as before, but a stall waits outside it and holds only its caller,
as one slow fsync on a working disk does (writes go on meanwhile; what the fsync makes
durable is the content when it ends). A broker killed during a stall has
appended what it was about to acknowledge and answered nothing: the window in which a
client must decide whether a batch was stored (it found a silent loss in session 23,
``docs/transactions.md``). ``stats`` counts the stalls (``slow_fsyncs``,
``slow_fsync_s``).

``crash`` and ``stats`` report what a crash undoes (``entries_dropped``: names that
vanish; ``entries_restored``: unlinked or renamed-away names that come back;
``files_rolled_back``: files whose content goes back to its last fsync); ``stats`` also
counts writes, fsyncs and the bytes they copied.

``LossyFs`` is the test's handle: it starts the process, waits for the mount, sends
commands and always unmounts (``fusermount3 -u``, then lazily, then the process is
killed), every step time-bounded; the process also unmounts by itself when the test
process that started it dies. ``missing()`` names what this host lacks; tests fail on
it in CI and skip elsewhere. ``LossyFs`` is not thread-safe (one owner); the file
system's state is guarded by one lock shared by the FUSE loop and the control thread.
"""

from __future__ import annotations

import argparse
import ctypes.util
import errno
import importlib.util
import json
import logging
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["LossyFs", "missing"]

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
INSTALL_HINT = (
    "apt-get install fuse3 and pip install 'mfusepy>=3.1' (`make venv` does both as root)"
)
_MOUNT_TIMEOUT_S = 15.0
_COMMAND_TIMEOUT_S = 30.0
_UNMOUNT_TIMEOUT_S = 10.0
_ROOT_ID = 0
_COPY_CHUNK_BYTES = 1 << 20


def missing() -> str | None:
    """What stops lossy-FS tests here (root, ``/dev/fuse``, fuse3, mfusepy), or None."""
    if os.geteuid() != 0:
        return "the lossy file system tests mount FUSE as root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None:
        return f"no fusermount3: {INSTALL_HINT}"
    if ctypes.util.find_library("fuse3") is None:
        return f"no libfuse3: {INSTALL_HINT}"
    if importlib.util.find_spec("mfusepy") is None:
        return f"no mfusepy: {INSTALL_HINT}"
    return None


# --- the file system (runs in its own process) ---------------------------------------------


class LossyOperations:
    """mfusepy operations over ``backing``; durable state in ``shadow``. See the module doc.

    Thread-safe: every operation takes ``self._mutex`` (the FUSE loop is single threaded;
    the control thread calls ``crash`` and ``stats``).
    """

    use_ns = True  # mfusepy: times as integer nanoseconds

    def __init__(self, backing: Path, shadow: Path) -> None:
        self.backing = backing
        self.shadow = shadow
        self._mutex = threading.RLock()
        self._next_id = _ROOT_ID + 1
        self._is_dir: dict[int, bool] = {_ROOT_ID: True}
        self._live: dict[int, dict[str, int]] = {_ROOT_ID: {}}
        self._durable: dict[int, dict[str, int]] = {_ROOT_ID: {}}
        self._handles: dict[int, int] = {}  # open fd -> identity
        self._stale: set[int] = set()  # fds opened before the last crash
        self._counters = {
            "writes": 0,
            "write_bytes": 0,
            "reads": 0,
            "fsyncs": 0,
            "fsync_copied_bytes": 0,
            "fsyncdirs": 0,
            "crashes": 0,
            "slow_fsyncs": 0,
            "slow_fsync_s": 0.0,
        }
        self._slow: tuple[float, float, float] | None = None  # probability, min s, max s
        self._slow_rng = random.Random(0)
        self._last_crash: dict[str, Any] = {}
        self.shadow.mkdir(parents=True, exist_ok=True)
        self._adopt(_ROOT_ID, self.backing)

    def _adopt(self, directory_id: int, path: Path) -> None:
        """Take what the backing directory already holds as durable (mount time)."""
        for entry in sorted(os.listdir(path)):
            child = path / entry
            identity = self._new_id(child.is_dir() and not child.is_symlink())
            self._live[directory_id][entry] = identity
            self._durable[directory_id][entry] = identity
            if self._is_dir[identity]:
                self._live[identity] = {}
                self._durable[identity] = {}
                self._adopt(identity, child)
            else:
                shutil.copyfile(child, self._shadow_path(identity))

    # --- identities and paths -------------------------------------------------------------

    def _new_id(self, is_dir: bool) -> int:
        identity = self._next_id
        self._next_id += 1
        self._is_dir[identity] = is_dir
        if is_dir:
            self._live[identity] = {}
        return identity

    def _shadow_path(self, identity: int) -> Path:
        return self.shadow / str(identity)

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _resolve(self, path: str) -> int:
        identity = _ROOT_ID
        for part in path.strip("/").split("/"):
            if not part:
                continue
            try:
                identity = self._live[identity][part]
            except KeyError:
                raise OSError(errno.ENOENT, path) from None
        return identity

    def _parent(self, path: str) -> tuple[int, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        return self._resolve(head or "/"), name

    def _fd(self, fh: int) -> int:
        if fh in self._stale:
            raise OSError(errno.EIO, "handle opened before the crash")
        return fh

    # --- metadata ---------------------------------------------------------------------------

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self._mutex:
            if fh is not None and path is None:
                st = os.fstat(self._fd(fh))
            else:
                st = os.lstat(self._real(path or "/"))
        return {
            "st_mode": st.st_mode,
            "st_nlink": st.st_nlink,
            "st_uid": st.st_uid,
            "st_gid": st.st_gid,
            "st_size": st.st_size,
            "st_blocks": st.st_blocks,
            "st_atime": st.st_atime_ns,  # nanoseconds: use_ns
            "st_mtime": st.st_mtime_ns,
            "st_ctime": st.st_ctime_ns,
        }

    def readdir(self, path: str, fh: int) -> list[str]:
        with self._mutex:
            return [".", "..", *os.listdir(self._real(path))]

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.backing)
        return {
            key: getattr(st, key)
            for key in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_namemax",
            )
        }

    def chmod(self, path: str, mode: int) -> int:
        with self._mutex:
            os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        with self._mutex:
            os.chown(self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        with self._mutex:
            if times is None:
                os.utime(self._real(path))
            else:
                os.utime(self._real(path), ns=times)
        return 0

    # --- namespace ----------------------------------------------------------------------------

    def create(self, path: str, mode: int, flags: int) -> int:
        with self._mutex:
            parent, name = self._parent(path)
            existing = self._live[parent].get(name)
            fd = os.open(self._real(path), flags | os.O_CREAT, mode)
            identity = existing if existing is not None else self._new_id(False)
            self._live[parent][name] = identity
            self._handles[fd] = identity
            return fd

    def mkdir(self, path: str, mode: int) -> int:
        with self._mutex:
            parent, name = self._parent(path)
            os.mkdir(self._real(path), mode)
            self._live[parent][name] = self._new_id(True)
        return 0

    def unlink(self, path: str) -> int:
        with self._mutex:
            parent, name = self._parent(path)
            os.unlink(self._real(path))
            self._live[parent].pop(name, None)
        return 0

    def rmdir(self, path: str) -> int:
        with self._mutex:
            parent, name = self._parent(path)
            os.rmdir(self._real(path))
            self._live[parent].pop(name, None)
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._mutex:
            old_parent, old_name = self._parent(old)
            new_parent, new_name = self._parent(new)
            os.rename(self._real(old), self._real(new))
            identity = self._live[old_parent].pop(old_name)
            self._live[new_parent][new_name] = identity
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        with self._mutex:
            identity = self._resolve(path)
            self._durable[identity] = dict(self._live[identity])
            self._counters["fsyncdirs"] += 1
        return 0

    # --- file content -------------------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        with self._mutex:
            identity = self._resolve(path)
            fd = os.open(self._real(path), flags)
            self._handles[fd] = identity
            return fd

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self._mutex:
            self._counters["reads"] += 1
            return os.pread(self._fd(fh), size, offset)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self._mutex:
            written = os.pwrite(self._fd(fh), data, offset)
            self._counters["writes"] += 1
            self._counters["write_bytes"] += written
            return written

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self._mutex:
            if fh is not None:
                os.ftruncate(self._fd(fh), length)
            elif path is not None:
                os.truncate(self._real(path), length)
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0

    def release(self, path: str | None, fh: int) -> int:
        with self._mutex:
            self._handles.pop(fh, None)
            self._stale.discard(fh)
            os.close(fh)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        """Copy the file's whole content to its shadow: that is now what survives a crash
        (after a stall first, when slow fsyncs are on and the draw says so)."""
        self._maybe_stall()
        with self._mutex:
            fd = self._fd(fh)
            identity = self._handles[fh]
            target = self._shadow_path(identity)
            temporary = target.with_name(f"{identity}.tmp")
            size = os.fstat(fd).st_size
            # The handle may be write-only: read through a second, read-only open of the
            # same file (/proc finds it even after an unlink).
            with open(f"/proc/self/fd/{fd}", "rb") as source, open(temporary, "wb") as out:
                shutil.copyfileobj(source, out, _COPY_CHUNK_BYTES)
            # The shadow stands in for the disk, itself never crashed: no fsync needed.
            os.replace(temporary, target)
            self._counters["fsyncs"] += 1
            self._counters["fsync_copied_bytes"] += size
        return 0

    def _maybe_stall(self) -> None:
        with self._mutex:
            slow = self._slow
            if slow is None or self._slow_rng.random() >= slow[0]:
                return
            delay = self._slow_rng.uniform(slow[1], slow[2])
            self._counters["slow_fsyncs"] += 1
            self._counters["slow_fsync_s"] += delay
        log.info("stalling an fsync for %.2f s", delay)
        time.sleep(delay)  # outside the lock: the control socket still answers

    # --- control ------------------------------------------------------------------------------

    def slow_fsyncs(
        self, probability: float, min_s: float, max_s: float, seed: int
    ) -> dict[str, Any]:
        """Stall each later file fsync with ``probability`` for ``min_s``..``max_s``
        seconds (``random.Random(seed)``); ``probability`` 0 turns stalls off."""
        if not 0 <= probability <= 1:
            raise ValueError(f"probability {probability} is outside [0, 1]")
        if not 0 <= min_s <= max_s <= 60:
            raise ValueError(f"stall range [{min_s}, {max_s}] s is not within [0, 60]")
        with self._mutex:
            self._slow = (probability, min_s, max_s) if probability > 0 else None
            self._slow_rng = random.Random(seed)
        return {"probability": probability, "min_s": min_s, "max_s": max_s, "seed": seed}

    def crash(self) -> dict[str, Any]:
        """Forget everything not durable; return what was dropped."""
        with self._mutex:
            report = self._diff()
            for entry in os.listdir(self.backing):
                path = os.path.join(self.backing, entry)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
            live: dict[int, dict[str, int]] = {}
            self._rebuild(_ROOT_ID, self.backing, live)
            self._live = live
            reachable_dirs = set(live)
            self._durable = {
                identity: dict(entries)
                for identity, entries in self._durable.items()
                if identity in reachable_dirs
            }
            for identity in reachable_dirs - self._durable.keys():
                self._durable[identity] = {}
            reachable = {i for entries in live.values() for i in entries.values()}
            for entry in os.listdir(self.shadow):
                if entry.isdigit() and int(entry) not in reachable:
                    os.unlink(self.shadow / entry)
            self._stale.update(self._handles)
            self._counters["crashes"] += 1
            self._last_crash = report
            return report

    def _rebuild(self, directory_id: int, path: Path, live: dict[int, dict[str, int]]) -> None:
        live[directory_id] = {}
        for name, identity in self._durable.get(directory_id, {}).items():
            live[directory_id][name] = identity
            child = path / name
            if self._is_dir[identity]:
                child.mkdir()
                self._rebuild(identity, child, live)
            elif self._shadow_path(identity).exists():
                shutil.copyfile(self._shadow_path(identity), child)
            else:
                child.touch()

    def _diff(self) -> dict[str, Any]:
        """What a crash now would undo (for ``stats`` and ``crash``).

        ``entries_dropped``: live names that are not durable (they vanish);
        ``entries_restored``: durable names gone from the live tree (they come back);
        ``files_rolled_back``: durable files whose content differs from the durable copy,
        with live size minus durable size. Paths are relative to the mount point.
        """
        dropped: list[str] = []
        restored: list[str] = []
        rolled_back: dict[str, int] = {}

        def walk(directory_id: int, prefix: str, durable_too: bool) -> None:
            live = self._live.get(directory_id, {})
            durable = self._durable.get(directory_id, {}) if durable_too else {}
            for name in sorted(live.keys() | durable.keys()):
                path = f"{prefix}/{name}"
                identity = live.get(name)
                if name in durable and durable[name] != identity:
                    restored.append(path)
                if identity is not None and durable.get(name) != identity:
                    dropped.append(path)
                if identity is None:
                    continue
                kept = durable.get(name) == identity
                if self._is_dir[identity]:
                    if kept:
                        walk(identity, path, kept)
                elif kept:
                    live_path = Path(self._real(path))
                    shadow = self._shadow_path(identity)
                    durable_size = shadow.stat().st_size if shadow.exists() else 0
                    live_size = live_path.lstat().st_size
                    if live_size != durable_size or (
                        live_size and shadow.read_bytes() != live_path.read_bytes()
                    ):
                        rolled_back[path] = live_size - durable_size

        walk(_ROOT_ID, "", True)
        return {
            "entries_dropped": dropped,
            "entries_restored": restored,
            "files_rolled_back": rolled_back,
        }

    def stats(self) -> dict[str, Any]:
        with self._mutex:
            return {
                **self._counters,
                "open_handles": len(self._handles),
                "pending": self._diff(),
                "last_crash": self._last_crash,
            }


def _serve_control(operations: LossyOperations, address: str, ready: threading.Event) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + address)
    server.listen(4)
    ready.set()
    while True:
        connection, _ = server.accept()
        with connection:
            command = connection.makefile("r").readline().strip()
            try:
                if command == "crash":
                    answer: dict[str, Any] = {"ok": True, **operations.crash()}
                elif command == "stats":
                    answer = {"ok": True, **operations.stats()}
                elif command.startswith("slow_fsyncs "):
                    p, low, high, seed = command.split()[1:]
                    answer = {
                        "ok": True,
                        **operations.slow_fsyncs(float(p), float(low), float(high), int(seed)),
                    }
                else:
                    answer = {"ok": False, "error": f"unknown command {command!r}"}
            except Exception as exc:  # the answer carries it; the server goes on
                log.exception("control command %s failed", command)
                answer = {"ok": False, "error": repr(exc)}
            connection.sendall(json.dumps(answer).encode() + b"\n")


def _unmount_when_orphaned(parent_pid: int, mountpoint: Path) -> None:
    """Unmount (which ends the FUSE loop) once the test process that started us is gone,
    so that a test run killed outright leaves no mount behind."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    log.warning("parent %d gone: unmounting %s", parent_pid, mountpoint)
    subprocess.run(
        ["fusermount3", "-uz", str(mountpoint)],
        capture_output=True,
        timeout=_UNMOUNT_TIMEOUT_S,
        check=False,
    )


def serve(
    backing: Path,
    shadow: Path,
    mountpoint: Path,
    control: str,
    parent_pid: int,
    threads: bool = False,
) -> None:
    """Mount and serve until unmounted (blocks). The process entry point's body."""
    # Imported here, not at the top: mfusepy raises at import on a host without libfuse,
    # and the test process only needs LossyFs and missing().
    import mfusepy

    operations = LossyOperations(backing, shadow)
    ready = threading.Event()
    threading.Thread(target=_serve_control, args=(operations, control, ready), daemon=True).start()
    ready.wait(5)
    threading.Thread(
        target=_unmount_when_orphaned, args=(parent_pid, mountpoint), daemon=True
    ).start()
    mfusepy.FUSE(
        operations,
        str(mountpoint),
        foreground=True,
        nothreads=not threads,
        fsname="lossyfs",
        hard_remove=True,
        entry_timeout=0,
        attr_timeout=0,
        negative_timeout=0,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.lossyfs")
    parser.add_argument("--backing", type=Path, required=True)
    parser.add_argument("--shadow", type=Path, required=True)
    parser.add_argument("--mountpoint", type=Path, required=True)
    parser.add_argument("--control", required=True, help="abstract Unix socket name")
    parser.add_argument("--parent-pid", type=int, default=os.getppid())
    parser.add_argument("--threads", action="store_true", help="a thread per request")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, os.environ.get("LOSSYFS_LOG", "WARNING")),
        format="lossyfs %(levelname)s %(message)s",
    )
    serve(args.backing, args.shadow, args.mountpoint, args.control, args.parent_pid, args.threads)


# --- the test's handle ------------------------------------------------------------------------


class LossyFs:
    """A mounted lossy file system under ``workdir``; ``mountpoint`` is where to write.

    ``workdir/backing`` holds the live files, ``workdir/durable`` the fsynced copies,
    ``workdir/lossyfs.log`` the process's output. Use as a context manager: the file
    system is unmounted and its process ended on exit, whatever happened.
    """

    def __init__(self, workdir: Path, *, threads: bool = False) -> None:
        """``threads``: a FUSE thread per request (module docstring, slow fsyncs)."""
        self.workdir = workdir
        self.threads = threads
        self.backing = workdir / "backing"
        self.shadow = workdir / "durable"
        self.mountpoint = workdir / "mnt"
        self.log_file = workdir / "lossyfs.log"
        self.control = f"tidelog-lossyfs-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LossyFs:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        for directory in (self.backing, self.shadow, self.mountpoint):
            directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "wb") as output:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.faults.lossyfs",
                    "--backing",
                    str(self.backing),
                    "--shadow",
                    str(self.shadow),
                    "--mountpoint",
                    str(self.mountpoint),
                    "--control",
                    self.control,
                    "--parent-pid",
                    str(os.getpid()),
                    *(["--threads"] if self.threads else []),
                ],
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + _MOUNT_TIMEOUT_S
        while not self.mounted():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"lossyfs did not mount:\n{self.output()}")
            time.sleep(0.02)

    def mounted(self) -> bool:
        """Whether the mount table lists the mount point (``os.path.ismount`` says no
        for a FUSE mount whose process died: its stat fails with ENOTCONN)."""
        target = os.fsencode(os.path.realpath(self.mountpoint))
        with open("/proc/self/mounts", "rb") as mounts:
            return any(line.split()[1] == target for line in mounts if line.strip())

    def output(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def command(self, name: str) -> dict[str, Any]:
        """Send a command (``crash``, ``stats``, ``slow_fsyncs ...``); return the decoded
        answer (raises if not ok)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(_COMMAND_TIMEOUT_S)
            connection.connect("\0" + self.control)
            connection.sendall(name.encode() + b"\n")
            answer: dict[str, Any] = json.loads(connection.makefile("r").readline())
        if not answer.get("ok"):
            raise AssertionError(f"lossyfs {name}: {answer.get('error')}")
        return answer

    def crash(self) -> dict[str, Any]:
        """Drop every unsynced write and directory change (call after killing writers)."""
        return self.command("crash")

    def stats(self) -> dict[str, Any]:
        return self.command("stats")

    def slow_fsyncs(
        self, probability: float, min_s: float = 0.0, max_s: float = 0.0, seed: int = 0
    ) -> dict[str, Any]:
        """Stall later fsyncs (module docstring); ``probability`` 0 turns them off."""
        return self.command(f"slow_fsyncs {probability!r} {min_s!r} {max_s!r} {seed:d}")

    def close(self) -> None:
        """Unmount and end the process; each step time-bounded, later ones as fallbacks."""
        if self.mounted():
            for command in (["fusermount3", "-u"], ["fusermount3", "-uz"], ["umount", "-l"]):
                try:
                    subprocess.run(
                        [*command, str(self.mountpoint)],
                        capture_output=True,
                        timeout=_UNMOUNT_TIMEOUT_S,
                        check=False,
                    )
                except subprocess.TimeoutExpired:
                    log.warning("%s %s timed out", " ".join(command), self.mountpoint)
                if not self.mounted():
                    break
        if self.process is not None:
            try:
                self.process.wait(_UNMOUNT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(_UNMOUNT_TIMEOUT_S)


if __name__ == "__main__":
    main()
