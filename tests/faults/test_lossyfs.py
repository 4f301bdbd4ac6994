"""Issue #29, lost unsynced writes: the lossy file system itself, then a broker on it.

First the file system's contract (``tests/faults/lossyfs.py``), through the mount with
plain Python file operations: what an fsync makes durable survives ``crash``, and
nothing else does (file content, and directory entries until their directory is
fsynced); ``storage.files.atomic_write`` survives.

Then a real broker (``python -m broker``) with its data directory on the file system:
records acknowledged with ``acks=all`` must all be read back after the broker is
SIGKILLed, the file system crashed and the broker restarted. ``acks=1`` records are
acknowledged before any fsync (``flush.messages`` -1, the default): the second test
shows what a power cut does to them, so the first one is known to be able to fail.

Needs root, ``/dev/fuse``, Debian's fuse3 and mfusepy: fails in CI (``CI`` set) without
them, skips elsewhere with the install command.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.broker.hostile.process import BrokerProcess
from tests.faults.lossyfs import LossyFs, missing
from tidelog.client import AdminClient, Consumer, Producer, RecordMetadata, TopicPartition
from tidelog.client.producer import DeliveryCallback
from tidelog.storage.clock import SystemClock
from tidelog.storage.config import LogConfig
from tidelog.storage.files import atomic_write, fsync_dir
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import iter_batch_headers

log = logging.getLogger(__name__)

TOPIC = "lossy"
PARTITIONS = 2
PRODUCE_S = 1.5
FLUSH_EVERY = 5

pytestmark = pytest.mark.timeout(90)


def _require() -> None:
    reason = missing()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[LossyFs]:
    _require()
    with LossyFs(tmp_path / "lossyfs") as mounted:
        yield mounted


def _write(path: Path, data: bytes, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _append(path: Path, data: bytes, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


# --- the file system's contract ------------------------------------------------------------


def test_fsynced_content_survives_and_the_rest_is_lost(fs: LossyFs) -> None:
    kept = fs.mountpoint / "kept"
    _write(kept, b"durable", sync=True)
    _append(kept, b" and not", sync=False)
    fsync_dir(fs.mountpoint)
    assert kept.read_bytes() == b"durable and not"  # before the crash, all is there

    report = fs.crash()

    assert kept.read_bytes() == b"durable"
    assert report["files_rolled_back"] == {"/kept": len(b" and not")}


def test_a_file_never_fsynced_is_empty_after_a_crash(fs: LossyFs) -> None:
    path = fs.mountpoint / "unsynced"
    _write(path, b"in the page cache only", sync=False)
    fsync_dir(fs.mountpoint)  # the name is durable, the content is not
    fs.crash()
    assert path.read_bytes() == b""


def test_a_file_fsynced_in_a_directory_never_fsynced_disappears(fs: LossyFs) -> None:
    path = fs.mountpoint / "orphan"
    _write(path, b"content fsynced, name not", sync=True)
    report = fs.crash()
    assert not path.exists()
    assert report["entries_dropped"] == ["/orphan"]
    assert report["entries_restored"] == []


def test_a_new_directory_needs_its_parent_fsynced(fs: LossyFs) -> None:
    directory = fs.mountpoint / "partition-0"
    directory.mkdir()
    _write(directory / "segment", b"batch", sync=True)
    fsync_dir(directory)  # the segment's name in the new directory, not the directory's
    fs.crash()
    assert not directory.exists()

    directory.mkdir()
    _write(directory / "segment", b"batch", sync=True)
    fsync_dir(directory)
    fsync_dir(fs.mountpoint)
    fs.crash()
    assert (directory / "segment").read_bytes() == b"batch"


def test_rename_and_unlink_are_undone_without_a_directory_fsync(fs: LossyFs) -> None:
    old, new, doomed = (fs.mountpoint / name for name in ("old", "new", "doomed"))
    _write(old, b"renamed", sync=True)
    _write(doomed, b"unlinked", sync=True)
    fsync_dir(fs.mountpoint)
    old.rename(new)
    doomed.unlink()
    assert sorted(os.listdir(fs.mountpoint)) == ["new"]

    report = fs.crash()

    assert report["entries_dropped"] == ["/new"]
    assert report["entries_restored"] == ["/doomed", "/old"]

    assert sorted(os.listdir(fs.mountpoint)) == ["doomed", "old"]
    assert old.read_bytes() == b"renamed"
    assert doomed.read_bytes() == b"unlinked"

    old.rename(new)
    fsync_dir(fs.mountpoint)
    fs.crash()
    assert sorted(os.listdir(fs.mountpoint)) == ["doomed", "new"]
    assert new.read_bytes() == b"renamed"


def test_atomic_write_is_durable_and_its_steps_alone_are_not(fs: LossyFs) -> None:
    state = fs.mountpoint / "state"
    atomic_write(state, b"version 1")
    atomic_write(state, b"version 2")
    fs.crash()
    assert state.read_bytes() == b"version 2"
    assert sorted(os.listdir(fs.mountpoint)) == ["state"]

    # The same steps without the directory fsync: the replace is undone.
    tmp = fs.mountpoint / "state.tmp"
    _write(tmp, b"version 3", sync=True)
    os.replace(tmp, state)
    fs.crash()
    assert state.read_bytes() == b"version 2"


def test_truncation_without_fsync_is_undone(fs: LossyFs) -> None:
    path = fs.mountpoint / "log"
    _write(path, b"0123456789", sync=True)
    fsync_dir(fs.mountpoint)
    os.truncate(path, 4)
    fs.crash()
    assert path.read_bytes() == b"0123456789"


def test_a_killed_writer_loses_nothing_without_a_crash(fs: LossyFs) -> None:
    """A process kill is not a power cut: its unsynced writes stay (the kernel's page
    cache survives it; FUSE without writeback cache has them already)."""
    path = fs.mountpoint / "killed"
    script = (
        "import os, time, sys\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)\n"
        "os.write(fd, b'written, never fsynced')\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE
    ) as writer:
        assert writer.stdout is not None
        assert writer.stdout.readline() == b"ready\n"
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
    assert path.read_bytes() == b"written, never fsynced"
    stats = fs.stats()
    assert stats["pending"]["entries_dropped"] == ["/killed"]


def test_slow_fsyncs_stall_and_then_make_the_file_durable(fs: LossyFs) -> None:
    path = fs.mountpoint / "slow"
    _write(path, b"x", sync=True)  # the file exists, its first fsync at full speed
    fs.slow_fsyncs(1.0, 0.4, 0.4, seed=1)

    started = time.monotonic()
    _append(path, b"y", sync=True)
    stalled_s = time.monotonic() - started

    assert stalled_s >= 0.4
    stats = fs.stats()
    assert stats["slow_fsyncs"] == 1
    assert stats["slow_fsync_s"] == pytest.approx(0.4)
    fs.slow_fsyncs(0.0)
    started = time.monotonic()
    _append(path, b"z", sync=True)
    assert time.monotonic() - started < 0.4
    assert fs.stats()["slow_fsyncs"] == 1
    fsync_dir(fs.mountpoint)
    fs.crash()
    assert path.read_bytes() == b"xyz"  # the stalled fsync still made its bytes durable


def test_with_threads_a_stalled_fsync_holds_only_its_caller(tmp_path: Path) -> None:
    _require()
    with LossyFs(tmp_path / "lossyfs", threads=True) as fs:
        slow, other = fs.mountpoint / "slow", fs.mountpoint / "other"
        _write(slow, b"a", sync=True)
        _write(other, b"", sync=True)
        fs.slow_fsyncs(1.0, 1.0, 1.0)
        syncing = threading.Thread(target=_append, args=(slow, b"b"), kwargs={"sync": True})
        started = time.monotonic()
        syncing.start()
        while fs.stats()["slow_fsyncs"] == 0:  # the stall has begun
            assert time.monotonic() - started < 5
            time.sleep(0.01)
        _append(other, b"written during the stall", sync=False)
        assert other.read_bytes() == b"written during the stall"
        during_s = time.monotonic() - started
        syncing.join(5)
        assert during_s < 0.9  # the write did not wait for the stalled fsync
        assert time.monotonic() - started >= 1.0
        fsync_dir(fs.mountpoint)
        fs.crash()
        assert slow.read_bytes() == b"ab"


def test_slow_fsyncs_refuse_a_probability_or_range_out_of_bounds(fs: LossyFs) -> None:
    with pytest.raises(AssertionError, match="outside"):
        fs.slow_fsyncs(1.5, 0.1, 0.2)
    with pytest.raises(AssertionError, match="not within"):
        fs.slow_fsyncs(0.5, 2.0, 1.0)
    with pytest.raises(AssertionError, match="unknown command"):
        fs.command("slow fsyncs please")
    assert fs.stats()["slow_fsyncs"] == 0


# --- a broker on it --------------------------------------------------------------------------


def _start_broker(data_dir: Path, log_file: Path, *settings: str) -> BrokerProcess:
    """``python -m broker`` over ``data_dir`` (the hostile tests' ``BrokerProcess``, which
    also dies with this process); ``settings`` as ``KEY=VALUE``."""
    return BrokerProcess(data_dir, log_file, dict(s.split("=", 1) for s in settings))


def _provision(fs: LossyFs) -> Path:
    """The data directory as an operator makes it: created, and its name made durable."""
    data_dir = fs.mountpoint / "data"
    data_dir.mkdir()
    fsync_dir(fs.mountpoint)
    return data_dir


@dataclass
class Produced:
    acknowledged: list[bytes]
    sent: int
    seconds: float


def _produce_until_killed(
    daemon: BrokerProcess, acks: str | int, **producer_settings: object
) -> Produced:
    """Produce to both partitions, a flush every FLUSH_EVERY records, and SIGKILL the
    broker after PRODUCE_S while records are in flight; the values acknowledged."""
    with AdminClient(daemon.address) as admin:
        admin.create_topic(TOPIC, PARTITIONS)
    acknowledged: list[bytes] = []
    lock = threading.Lock()
    stop = threading.Event()
    sent = 0

    def on_delivery(value: bytes) -> DeliveryCallback:
        def callback(metadata: RecordMetadata | None, error: BaseException | None) -> None:
            if error is None:
                with lock:
                    acknowledged.append(value)

        return callback

    def run(producer: Producer) -> None:
        nonlocal sent
        while not stop.is_set():
            value = f"record-{sent}".encode()
            producer.send(TOPIC, value, partition=sent % PARTITIONS, callback=on_delivery(value))
            sent += 1
            if sent % FLUSH_EVERY == 0:
                try:
                    producer.flush(2_000)
                except Exception as exc:  # the broker is gone: the last ones never landed
                    log.info("flush failed: %r", exc)
                    return

    producer = Producer(daemon.address, acks=acks, linger_ms=0, retries=0, request_timeout_ms=2_000)
    thread = threading.Thread(target=run, args=(producer,), daemon=True)
    started = time.monotonic()
    try:
        thread.start()
        time.sleep(PRODUCE_S)
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(10)
        seconds = time.monotonic() - started
        stop.set()
        thread.join(10)
        assert not thread.is_alive(), "the producer thread did not stop"
    finally:
        stop.set()
        producer.close(1_000)
    with lock:
        return Produced(list(acknowledged), sent, seconds)


def _read_all(address: str) -> list[bytes]:
    """Every value in the topic after a restart ([] if the topic is gone)."""
    with AdminClient(address) as admin:
        topics = {t.name for t in admin.list_topics()}
        if TOPIC not in topics:
            return []
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        ends = admin.list_offsets(dict.fromkeys(tps, "latest"))
    values: list[bytes] = []
    with Consumer(address, enable_auto_commit=False) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        remaining = {tp: end.offset for tp, end in ends.items() if end is not None}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(
            consumer.position(tp) < end for tp, end in remaining.items()
        ):
            for record in consumer.poll(500):
                if record.value is not None:
                    values.append(record.value)
    return values


def _power_cut(
    fs: LossyFs,
    settings: tuple[str, ...],
    acks: str | int,
    tmp_path: Path,
    **producer_settings: object,
) -> Cut:
    """Produce on lossyfs, SIGKILL the broker, crash the file system, restart, read."""
    data_dir = _provision(fs)
    log_file = tmp_path / "broker.log"
    daemon = _start_broker(data_dir, log_file, *settings)
    restarted: BrokerProcess | None = None
    try:
        produced = _produce_until_killed(daemon, acks, **producer_settings)
        stats = fs.stats()
        report = fs.crash()
        restarted = _start_broker(data_dir, log_file, *settings)
        stored = _read_all(restarted.address)
    finally:
        daemon.kill()
        if restarted is not None:
            restarted.kill()
    cut = Cut(produced, stats, report, stored, log_file.read_text(errors="replace"))
    log.warning(
        "acks=%s %s on lossyfs: %d sent, %d acknowledged in %.2f s (%.0f/s); FS saw %d "
        "writes (%d bytes), %d fsyncs copying %d bytes, %d directory fsyncs; the crash "
        "dropped %s, restored %s and rolled back %d files; %d records read back",
        acks,
        " ".join(settings) or "(defaults)",
        produced.sent,
        len(produced.acknowledged),
        produced.seconds,
        len(produced.acknowledged) / produced.seconds,
        stats["writes"],
        stats["write_bytes"],
        stats["fsyncs"],
        stats["fsync_copied_bytes"],
        stats["fsyncdirs"],
        report["entries_dropped"],
        report["entries_restored"],
        len(report["files_rolled_back"]),
        len(stored),
    )
    return cut


@dataclass
class Cut:
    produced: Produced
    stats: dict[str, Any]
    report: dict[str, Any]
    stored: list[bytes]
    broker_log: str

    def lost(self) -> list[bytes]:
        return sorted(set(self.produced.acknowledged) - set(self.stored))


# Small segments and frequent checkpoints, so that segment rolls (new files, directory
# fsyncs) and checkpoint replaces happen under the power cut too.
STRESS = (
    "log.segment.bytes=4096",
    "log.index.interval.bytes=256",
    "log.flush.offset.checkpoint.interval.ms=200",
)


def test_every_acks_all_record_survives_a_power_cut(fs: LossyFs, tmp_path: Path) -> None:
    cut = _power_cut(fs, STRESS, "all", tmp_path)
    assert len(cut.produced.acknowledged) >= 50, cut.broker_log
    lost = cut.lost()
    assert not lost, (
        f"{len(lost)} of {len(cut.produced.acknowledged)} acknowledged records lost after a "
        f"power cut (first: {lost[:5]}); the crash undid {cut.report}\n{cut.broker_log}"
    )
    assert len(cut.stored) == len(set(cut.stored)), "a record was stored twice"
    assert cut.stats["fsyncs"] > 0


def test_acks_1_with_flush_per_message_survives_a_power_cut(fs: LossyFs, tmp_path: Path) -> None:
    """``log.flush.interval.messages=1`` fsyncs in the append, before the answer."""
    cut = _power_cut(fs, (*STRESS, "log.flush.interval.messages=1"), 1, tmp_path)
    assert len(cut.produced.acknowledged) >= 50, cut.broker_log
    lost = cut.lost()
    assert not lost, f"{len(lost)} acknowledged records lost: {lost[:5]}\n{cut.broker_log}"


def test_acks_1_records_are_not_promised_to_survive_a_power_cut(
    fs: LossyFs, tmp_path: Path
) -> None:
    """The fault is real: acks=1 answers before any fsync (``flush.messages`` -1, the
    default), and the crash takes those records away, where a kill alone would not
    (``tests/broker/test_cli.py``). What survives is what a roll, the flusher or a
    checkpoint happened to fsync before the kill."""
    cut = _power_cut(fs, STRESS, 1, tmp_path)
    assert len(cut.produced.acknowledged) >= 50, cut.broker_log
    assert set(cut.stored) <= set(cut.produced.acknowledged) | {
        f"record-{n}".encode() for n in range(cut.produced.sent)
    }
    assert cut.lost(), "a power cut lost no acks=1 record: is the file system lossy?"
    assert cut.report["files_rolled_back"]


def test_a_record_acknowledged_right_after_its_topic_was_created_survives_a_power_cut(
    fs: LossyFs, tmp_path: Path
) -> None:
    """The partition directory's own name must be durable before its first ack.

    ``LogManager.create_topic`` writes ``topics.json`` (atomic, the data directory
    fsynced), then creates ``<topic>-<partition>/`` and its first segment, fsyncing the
    partition directory but not the data directory. An ``acks=all`` produce fsyncs the
    segment only. Until something else fsyncs the data directory (the recovery-point
    checkpoint, every ``log.flush.offset.checkpoint.interval.ms``; an idempotent
    producer's id allocation), a power cut drops the partition directory with its
    acknowledged records, and the restarted broker recreates it empty from
    ``topics.json``.
    """
    data_dir = _provision(fs)
    log_file = tmp_path / "broker.log"
    daemon = _start_broker(data_dir, log_file)
    restarted: BrokerProcess | None = None
    try:
        with AdminClient(daemon.address) as admin:
            admin.create_topic(TOPIC, PARTITIONS)
        # Not idempotent: its id allocation would fsync the data directory by the way.
        with Producer(daemon.address, acks="all", enable_idempotence=False) as producer:
            futures = [
                producer.send(TOPIC, f"record-{n}".encode(), partition=n % PARTITIONS)
                for n in range(10)
            ]
            acknowledged = [future.result(10) for future in futures]
        pending = fs.stats()["pending"]
        daemon.kill()
        report = fs.crash()
        restarted = _start_broker(data_dir, log_file)
        stored = _read_all(restarted.address)
    finally:
        daemon.kill()
        if restarted is not None:
            restarted.kill()
    assert len(acknowledged) == 10
    assert sorted(stored) == sorted(f"record-{n}".encode() for n in range(10)), (
        f"acknowledged records lost: {len(stored)} of 10 read back; before the crash "
        f"{pending} was not durable; the crash undid {report}"
    )


# --- a follower's truncation ------------------------------------------------------------------

# Run in a process of its own, so that a SIGKILL ends it before the crash (as the broker).
_DIVERGED_FOLLOWER = """
import sys, time
from pathlib import Path
from tidelog.storage.clock import SystemClock
from tidelog.storage.config import LogConfig
from tidelog.storage.partition_log import PartitionLog
from tests.storage.conftest import make_batch, values

plog = PartitionLog.open(Path(sys.argv[1]), "t", 0, LogConfig(), SystemClock())
plog.track_high_watermark()
plog.begin_leader_epoch(4)
for n in range(10):
    plog.append(make_batch(values(1, n)), leader_epoch=4)  # 0-9, epoch 4, a batch each
plog.flush(10)  # durable, the recovery point at 10
plog.truncate_to(5)  # a follower cutting the tail that diverged from its new leader
plog.begin_leader_epoch(5)  # the new leader's epoch recorded at the cut: fsynced
plog.append(make_batch(values(3, 100)), leader_epoch=5)  # 5-7, never flushed
print("ready", flush=True)
time.sleep(60)
"""


def test_a_followers_truncation_is_durable_before_its_new_epoch(fs: LossyFs) -> None:
    """Issue #29, seed 202: a follower cut its diverged epoch-4 tail and recorded epoch 5
    at the cut (the epoch checkpoint is fsynced); the cut itself was not made durable, so
    a power loss brought the epoch-4 tail back under epoch 5, where no leader's answer
    found the divergence again: the follower kept records no leader had, became leader
    later, and acknowledged records were lost. Now the cut is fsynced before the new
    epoch can be recorded: after the power loss every batch in the log is of the epoch
    the log's epoch cache gives its offset, even with the recovery point from before the
    cut (the recovery-point checkpoint is only written now and then)."""
    directory = _provision(fs) / "t-0"
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, "-c", _DIVERGED_FOLLOWER, str(directory)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()
    fs.crash()
    plog = PartitionLog.open(
        directory, "t", 0, LogConfig(), SystemClock(), recovery_point=10, had_clean_shutdown=False
    )
    try:
        headers = [h for _, h in iter_batch_headers(plog.read(0, 10**9).records)]
        assert [h.base_offset for h in headers][:5] == [0, 1, 2, 3, 4], "the durable prefix"
        entries = plog.epoch_entries()
        for header in headers:
            said = [e.epoch for e in entries if e.start_offset <= header.base_offset][-1:]
            assert said == [header.partition_leader_epoch], (
                f"offset {header.base_offset}: written at epoch "
                f"{header.partition_leader_epoch}, the log says {plog.epoch_entries()}"
            )
        assert plog.log_end_offset <= 8
    finally:
        plog.close()
