"""A data directory of partition logs: topics, checkpoints, background work, shutdown.

Layout of the data directory (everything but the partition directories is written with
``atomic_write``)::

    <data_dir>/
      topics.json                          topics, partition counts, config overrides
      recovery-point-offset-checkpoint     per partition: flushed up to here
      log-start-offset-checkpoint          per partition: log start offset
      cleaner-offset-checkpoint            per partition: compacted up to here
      replication-offset-checkpoint        per replicated partition: its high watermark
      .tidelog_cleanshutdown               present only between a clean close and the next
                                           open: {"version": 0, "broker_epoch": E}
      <topic>-<partition>/                 one PartitionLog each

Topics are created, grown (``create_partitions``: partitions are only ever added) and
deleted here; ``topics.json`` always changes before the partition directories do, so a
crash leaves at worst missing (empty) logs that the next open creates.

Opening: if the clean-shutdown marker is there it is deleted at once (a crash while loading
must count as unclean next time) and recovery is skipped; otherwise every log re-validates
its unflushed tail; ``_OPEN_THREADS`` threads open (and close) the logs. The marker also
carries the broker epoch of the last cluster registration (``record_broker_epoch``; Kafka's
``.kafka_cleanshutdown``, KIP-966): after an open, ``previous_broker_epoch`` is that epoch,
0 for a clean stop that recorded none (single-node mode, an older marker), -1 if the last
stop was not clean; a cluster broker reports it when it registers, and its controller
does not count on the log tails of a broker that says -1. Partition directories of unknown
topics (a crash during delete) and ``*-delete`` directories are removed.

Background work runs on two daemon threads once ``start_background`` is called: a
scheduler (retention, flushing sealed segments and by ``flush.ms``, unlinking ``.deleted``
files, checkpoints) and the log cleaner. Each task is also a public method, so tests drive
them directly with a manual clock. Thread-safe.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from tidelog.storage.checkpoint import (
    CLEAN_SHUTDOWN_MARKER,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    read_offsets,
    write_offsets,
)
from tidelog.storage.cleaner import LogCleaner
from tidelog.storage.clock import Clock, SystemClock
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRequestError,
    LogDirFullError,
    StorageError,
    TidelogError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.files import (
    TMP_SUFFIX,
    atomic_write,
    fsync_dir,
    make_dir_durable,
    parse_partition_dir,
    partition_dir_name,
)
from tidelog.storage.files import validate_topic_name as _validate_topic_name
from tidelog.storage.log_manager_config import LogManagerConfig, TopicMetadata
from tidelog.storage.partition_log import PartitionLog

__all__ = ["Cleaner", "LogManager", "LogManagerConfig", "TopicMetadata"]

log = logging.getLogger(__name__)

TOPICS_FILE = "topics.json"
MAX_PARTITIONS = 10_000
_DELETE_DIR_SUFFIX = "-delete"
_MAX_DIR_NAME_BYTES = 255  # NAME_MAX of Linux file systems
_OPEN_THREADS = 8  # logs opened or closed at once: fsyncs overlap (num.recovery.threads...)


class LogManager:
    """All partition logs of one data directory. Thread-safe."""

    def __init__(self, data_dir: Path, config: LogManagerConfig, clock: Clock) -> None:
        self.data_dir = data_dir
        self.config = config
        self.clock = clock
        self._lock = threading.RLock()
        self._topics: dict[str, TopicMetadata] = {}
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.cleaner: Cleaner | None = None
        self._previous_broker_epoch = -1  # set by _load from the clean-shutdown marker
        self._broker_epoch = 0  # written into the marker at close (record_broker_epoch)

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        data_dir: str | os.PathLike[str],
        config: LogManagerConfig | None = None,
        clock: Clock | None = None,
    ) -> LogManager:
        """Open a data directory (creating it), recovering every partition if needed.

        Raises:
            StorageError: the directory cannot be created, read or written.
        """
        path = Path(data_dir).resolve()
        manager = cls(path, config or LogManagerConfig(), clock or SystemClock())
        try:
            make_dir_durable(path)
            manager._load()
        except OSError as exc:
            raise StorageError(f"cannot open data directory {path}: {exc}") from exc
        if manager.config.cleaner_enabled:
            manager.cleaner = LogCleaner(path, manager.clock)
        return manager

    def _load(self) -> None:
        marker = self.data_dir / CLEAN_SHUTDOWN_MARKER
        clean = marker.exists()
        if clean:
            self._previous_broker_epoch = _marker_broker_epoch(marker)
            marker.unlink()
            fsync_dir(self.data_dir)
        for entry in os.listdir(self.data_dir):
            if entry.endswith(TMP_SUFFIX) and (self.data_dir / entry).is_file():
                # A crash inside atomic_write leaves its temp file; the target is intact.
                (self.data_dir / entry).unlink()
        recovery_points = self._read_checkpoint(RECOVERY_POINT_CHECKPOINT)
        log_starts = self._read_checkpoint(LOG_START_OFFSET_CHECKPOINT)
        high_watermarks = self._read_checkpoint(REPLICATION_OFFSET_CHECKPOINT)
        self._topics = self._read_topics()
        for entry in os.listdir(self.data_dir):
            full = self.data_dir / entry
            if not full.is_dir():
                continue
            parsed = parse_partition_dir(entry)
            if entry.endswith(_DELETE_DIR_SUFFIX) or parsed is None:
                if entry.endswith(_DELETE_DIR_SUFFIX):
                    shutil.rmtree(full, ignore_errors=True)
                continue
            topic, partition = parsed
            meta = self._topics.get(topic)
            if meta is None or partition >= meta.partitions:
                log.warning("removing %s: it belongs to no known topic", full)
                self._remove_dir(full)

        def open_one(key: tuple[str, int]) -> PartitionLog:
            return PartitionLog.open(
                self.data_dir / partition_dir_name(*key),
                key[0],
                key[1],
                self._topics[key[0]].config,
                self.clock,
                log_start_offset=log_starts.get(key, 0),
                recovery_point=recovery_points.get(key, 0),
                had_clean_shutdown=clean and key in recovery_points,
                high_watermark=high_watermarks.get(key),
            )

        keys = [(m.name, p) for m in self._topics.values() for p in range(m.partitions)]
        with ThreadPoolExecutor(max(1, min(_OPEN_THREADS, len(keys)))) as pool:
            self._logs.update(zip(keys, pool.map(open_one, keys), strict=True))
        log.info(
            "opened %s: %d topic(s), %d partition(s), %s shutdown",
            self.data_dir,
            len(self._topics),
            len(self._logs),
            "clean" if clean else "unclean",
        )

    def _read_checkpoint(self, name: str) -> dict[tuple[str, int], int]:
        try:
            return read_offsets(self.data_dir / name)
        except (ValueError, OSError) as exc:
            log.warning("ignoring unreadable checkpoint %s: %s", name, exc)
            return {}

    def _read_topics(self) -> dict[str, TopicMetadata]:
        path = self.data_dir / TOPICS_FILE
        try:
            document = json.loads(path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise StorageError(f"unreadable topic metadata {path}: {exc}") from exc
        topics: dict[str, TopicMetadata] = {}
        for name, entry in document.get("topics", {}).items():
            overrides = {str(k): str(v) for k, v in entry.get("config", {}).items()}
            topics[name] = TopicMetadata(
                name,
                int(entry["partitions"]),
                MappingProxyType(overrides),
                LogConfig.from_mapping(overrides, self.config.defaults),
                bool(entry.get("internal", False)),
            )
        return topics

    def _write_topics_locked(self, topics: Mapping[str, TopicMetadata] | None = None) -> None:
        """Write ``topics`` (default: the current ones) to ``topics.json`` atomically."""
        document = {
            "version": 1,
            "topics": {
                t.name: {
                    "partitions": t.partitions,
                    "config": dict(t.overrides),
                    "internal": t.internal,
                }
                for t in (self._topics if topics is None else topics).values()
            },
        }
        atomic_write(self.data_dir / TOPICS_FILE, json.dumps(document, indent=1).encode())

    # ------------------------------------------------------------------ topics

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        config: Mapping[str, str] | None = None,
        *,
        internal: bool = False,
    ) -> TopicMetadata:
        """Create a topic with ``partitions`` partitions (broker default if None).

        Raises:
            InvalidTopicError, TopicAlreadyExistsError, InvalidConfigError,
            InvalidPartitionsError, StorageError.
        """
        created = self.create_topics([(name, partitions, config)], internal=internal)[name]
        if isinstance(created, Exception):
            raise created
        return created

    def create_topics(
        self,
        topics: Sequence[tuple[str, int | None, Mapping[str, str] | None]],
        *,
        internal: bool = False,
    ) -> dict[str, TopicMetadata | TidelogError]:
        """Create many topics at once (a cluster's burst, issue #34): ``topics.json``
        written once for all of them, and their partition logs opened by up to
        ``_OPEN_THREADS`` threads, whose fsyncs the disk overlaps (Kafka's
        ``num.recovery.threads.per.data.dir`` idea) instead of one after another. Per
        topic its metadata or what ``create_topic`` raises; one that fails is undone
        alone.

        Metadata first: a crash before the directories exist leaves a topic whose empty
        logs are created on the next open; the reverse would leave orphans.
        """
        out: dict[str, TopicMetadata | TidelogError] = {}
        new: dict[str, TopicMetadata] = {}
        for name, partitions, config in topics:
            try:
                count, overrides, log_config = self._check_new_topic(name, partitions, config)
            except TidelogError as exc:
                out[name] = exc
                continue
            overrides_view = MappingProxyType(overrides)
            new[name] = TopicMetadata(name, count, overrides_view, log_config, internal)
        with self._lock:
            self._check_open()
            for name in [n for n in new if n in self._topics]:
                out[name] = TopicAlreadyExistsError(f"topic {name!r} already exists")
                del new[name]
            if not new:
                return out
            self._topics.update(new)
            try:
                self._write_topics_locked()
            except OSError as exc:
                for name in new:
                    self._topics.pop(name, None)
                    out[name] = _storage_error(exc, f"cannot create topic {name!r}")
                return out
            keys = [(m, p) for m in new.values() for p in range(m.partitions)]
            try:
                # Every new directory's name made durable by one fsync of the data
                # directory, not one each (``make_dir_durable`` finds them there).
                for meta, partition in keys:
                    (self.data_dir / partition_dir_name(meta.name, partition)).mkdir(exist_ok=True)
                fsync_dir(self.data_dir)
            except OSError as exc:  # each open below tries again and reports its own
                log.warning("cannot pre-create the new topics' directories: %s", exc)
            with ThreadPoolExecutor(min(_OPEN_THREADS, len(keys))) as pool:
                opened = list(pool.map(self._open_new, keys))
            failed: dict[str, TidelogError] = {}
            for (meta, partition), result in zip(keys, opened, strict=True):
                if isinstance(result, PartitionLog):
                    self._logs[(meta.name, partition)] = result
                else:
                    failed.setdefault(meta.name, result)
            for name, error in failed.items():
                # Undo it all: a failed create must not leave a listed topic without logs.
                meta = self._topics.pop(name)
                for partition in range(meta.partitions):
                    created = self._logs.pop((name, partition), None)
                    if created is not None:
                        created.delete()
                out[name] = error
            if failed:
                try:
                    self._write_topics_locked()
                except OSError:
                    # The next open creates the topics' missing logs; harmless.
                    log.exception("cannot roll back topics %s in %s", sorted(failed), TOPICS_FILE)
            for name, meta in new.items():
                if name not in failed:
                    out[name] = meta
                    log.info("created topic %s with %d partition(s)", name, meta.partitions)
            return out

    def _open_new(self, key: tuple[TopicMetadata, int]) -> PartitionLog | TidelogError:
        meta, partition = key
        try:
            return PartitionLog.open(
                self.data_dir / partition_dir_name(meta.name, partition),
                meta.name,
                partition,
                meta.config,
                self.clock,
            )
        except StorageError as exc:
            return exc
        except OSError as exc:
            return _storage_error(exc, f"cannot create topic {meta.name!r}")

    def validate_new_topic(
        self, name: str, partitions: int | None, config: Mapping[str, str] | None
    ) -> None:
        """Raise what ``create_topic`` would, without creating anything.

        Cluster mode checks a topic here before the controller records it in ZooKeeper.
        """
        self._check_new_topic(name, partitions, config)
        with self._lock:
            if name in self._topics:
                raise TopicAlreadyExistsError(f"topic {name!r} already exists")

    def validate_topic_config(self, overrides: Mapping[str, str]) -> None:
        """Raise ``InvalidConfigError`` unless ``overrides`` is a valid topic config."""
        LogConfig.from_mapping({str(k): str(v) for k, v in overrides.items()}, self.config.defaults)

    def _check_new_topic(
        self, name: str, partitions: int | None, config: Mapping[str, str] | None
    ) -> tuple[int, dict[str, str], LogConfig]:
        _validate_topic_name(name)
        count = self.config.num_partitions if partitions is None or partitions == 0 else partitions
        if (
            not isinstance(count, int)
            or isinstance(count, bool)
            or not 1 <= count <= MAX_PARTITIONS
        ):
            raise InvalidPartitionsError(
                f"partitions must be between 1 and {MAX_PARTITIONS}, got {partitions!r}"
            )
        overrides = {str(k): str(v) for k, v in (config or {}).items()}
        return count, overrides, LogConfig.from_mapping(overrides, self.config.defaults)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and all its data.

        Raises:
            UnknownTopicOrPartitionError: no such topic.
        """
        self.delete_topics([name])

    def delete_topics(self, names: Iterable[str]) -> None:
        """Delete topics and all their data, ``topics.json`` and the checkpoints written
        once for all of them (a cluster's burst, issue #34).

        Raises:
            UnknownTopicOrPartitionError: one is unknown (then none is deleted).
        """
        with self._lock:
            self._check_open()
            metas = [self.topic(name) for name in dict.fromkeys(names)]
            for meta in metas:
                del self._topics[meta.name]
            self._write_topics_locked()
            logs = [self._logs.pop((m.name, p)) for m in metas for p in range(m.partitions)]
            # Drop the topics' checkpoint entries before anything can re-create them: a
            # new topic of the same name must not inherit the old log start offset or
            # recovery point after a crash (the log start would wipe its data).
            self.write_checkpoints()
        for partition_log in logs:
            partition_log.close()
            self._remove_dir(partition_log.directory)
        for meta in metas:
            log.info("deleted topic %s", meta.name)

    def create_partitions(
        self, name: str, count: int, *, validate_only: bool = False
    ) -> TopicMetadata:
        """Grow topic ``name`` to ``count`` partitions in total (Kafka's CreatePartitions).

        Existing partitions keep their data and offsets; the new ones start empty, with
        the topic's config. With ``validate_only`` everything is checked and nothing
        changes (the answer shows the count the topic would have).

        Crash consistency, as ``create_topic``: ``topics.json`` with the new count is
        written first (temp file, fsync, rename, fsync the directory), then the new
        partition directories are created. A crash in between leaves a topic whose
        missing logs the next open creates empty; no directory ever exists beyond the
        count on disk (the next open would remove it as an orphan). Readers see the new
        partitions only once all of them are open: ``topic()`` keeps answering the old
        count until then.

        Raises:
            UnknownTopicOrPartitionError: no such topic.
            InvalidPartitionsError: ``count`` is not an int larger than the current count,
                or is above ``MAX_PARTITIONS`` (Kafka's INVALID_PARTITIONS).
            InvalidRequestError: an internal topic (``__consumer_offsets`` maps each group
                to ``hash % partitions``: growing it would move every group's offsets).
            StorageError, LogDirFullError: the metadata or a directory could not be
                written; nothing changed (a failed rollback is logged; the next open then
                completes the growth with empty logs).
        """
        _validate_topic_name(name)
        if not isinstance(count, int) or isinstance(count, bool):
            raise InvalidPartitionsError(f"partition count must be an int, got {count!r}")
        with self._lock:
            self._check_open()
            meta = self.topic(name)
            if meta.internal:
                raise InvalidRequestError(
                    f"{name} is an internal topic: its partition count cannot change"
                )
            if count <= meta.partitions:
                raise InvalidPartitionsError(
                    f"topic {name!r} has {meta.partitions} partition(s); the new count must "
                    f"be larger (partitions can be added, never removed), got {count}"
                )
            if count > MAX_PARTITIONS:
                raise InvalidPartitionsError(
                    f"a topic has at most {MAX_PARTITIONS} partitions, got {count}"
                )
            grown = TopicMetadata(name, count, meta.overrides, meta.config, meta.internal)
            if validate_only:
                return grown
            added: dict[tuple[str, int], PartitionLog] = {}
            metadata_written = False
            try:
                self._write_topics_locked({**self._topics, name: grown})
                metadata_written = True
                for partition in range(meta.partitions, count):
                    added[(name, partition)] = PartitionLog.open(
                        self.data_dir / partition_dir_name(name, partition),
                        name,
                        partition,
                        meta.config,
                        self.clock,
                    )
            except (OSError, StorageError) as exc:
                for created in added.values():
                    created.delete()
                try:
                    if metadata_written:
                        self._write_topics_locked()
                except OSError:
                    # The next open creates the missing logs: the topic has grown after all.
                    log.exception("cannot roll back the growth of %s in %s", name, TOPICS_FILE)
                if isinstance(exc, StorageError):
                    raise
                raise _storage_error(exc, f"cannot add partitions to {name!r}") from exc
            # Logs before metadata: whoever sees the new count finds every log.
            self._logs.update(added)
            self._topics[name] = grown
            log.info("topic %s grew from %d to %d partition(s)", name, meta.partitions, count)
            return grown

    def _remove_dir(self, directory: Path) -> None:
        """Rename to ``*.<uuid>-delete`` (atomic, invisible to a reload) then remove.

        The name keeps at most ``_MAX_DIR_NAME_BYTES`` bytes, cutting the partition's part
        (as Kafka's ``logDirNameWithSuffixCappedLength``): a 249-character topic name is
        valid, and with ``-0`` and the suffix its full name would not fit in a file name.
        """
        suffix = f".{uuid.uuid4().hex}{_DELETE_DIR_SUFFIX}"
        prefix = directory.name[: _MAX_DIR_NAME_BYTES - len(suffix)]  # ASCII: chars = bytes
        doomed = directory.with_name(prefix + suffix)
        try:
            os.replace(directory, doomed)
            fsync_dir(self.data_dir)
        except FileNotFoundError:
            return
        shutil.rmtree(doomed, ignore_errors=True)

    def topics(self) -> list[TopicMetadata]:
        """Every topic, sorted by name."""
        with self._lock:
            return sorted(self._topics.values(), key=lambda t: t.name)

    def topic(self, name: str) -> TopicMetadata:
        """One topic's metadata. Raises ``UnknownTopicOrPartitionError``."""
        with self._lock:
            meta = self._topics.get(name)
        if meta is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        return meta

    def alter_topic_config(
        self, name: str, set: Mapping[str, str], delete: Iterable[str] = ()
    ) -> TopicMetadata:
        """Set and/or reset (to the broker default) topic config keys.

        Raises:
            UnknownTopicOrPartitionError, InvalidConfigError.
        """
        with self._lock:
            self._check_open()
            meta = self.topic(name)
            overrides = dict(meta.overrides)
            for key in delete:
                if key not in LogConfig.known_keys():
                    raise InvalidConfigError(f"unknown topic config {key!r}")
                overrides.pop(key, None)
            overrides.update({str(k): str(v) for k, v in set.items()})
            log_config = LogConfig.from_mapping(overrides, self.config.defaults)
            new = TopicMetadata(
                name, meta.partitions, MappingProxyType(overrides), log_config, meta.internal
            )
            self._topics[name] = new
            self._write_topics_locked()
            for partition in range(meta.partitions):
                self._logs[(name, partition)].update_config(log_config)
            return new

    def set_defaults(self, defaults: LogConfig) -> None:
        """Make ``defaults`` the broker-level topic defaults (a dynamic broker config
        changed): every topic's effective config is rebuilt from its overrides over them
        and applied to its logs at once. Nothing is written: ``topics.json`` holds only
        overrides, and the defaults' own store is the caller's.
        """
        with self._lock:
            self._check_open()
            self.config = dataclasses.replace(self.config, defaults=defaults)
            for name, meta in list(self._topics.items()):
                log_config = LogConfig.from_mapping(meta.overrides, defaults)
                self._topics[name] = TopicMetadata(
                    name, meta.partitions, meta.overrides, log_config, meta.internal
                )
                for partition in range(meta.partitions):
                    partition_log = self._logs.get((name, partition))
                    if partition_log is not None:
                        partition_log.update_config(log_config)

    def get_log(self, topic: str, partition: int) -> PartitionLog:
        """The log of one partition. Raises ``UnknownTopicOrPartitionError``."""
        partition_log = self._logs.get((topic, partition))
        if partition_log is None:
            if topic in self._topics:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has no partition {partition} "
                    f"(it has {self._topics[topic].partitions})"
                )
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        return partition_log

    def logs(self) -> list[PartitionLog]:
        """Every partition log (a snapshot)."""
        with self._lock:
            return list(self._logs.values())

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the log manager is closed")

    # ------------------------------------------------------------------ background tasks

    def run_retention(self) -> int:
        """One retention pass over every log; returns segments deleted."""
        deleted = 0
        for partition_log in self.logs():
            try:
                deleted += partition_log.delete_old_segments()
            except StorageError:
                log.exception("%s: retention failed", partition_log)
        return deleted

    def run_flush(self) -> None:
        """fsync sealed segments and honour ``flush.ms``."""
        for partition_log in self.logs():
            try:
                partition_log.flush_sealed()
                partition_log.maybe_flush_by_time()
            except StorageError:
                log.exception("%s: flush failed", partition_log)

    def run_producer_expiration(self) -> int:
        """Forget producers idle for ``producer_id_expiration_ms`` in every log; how many."""
        expired = 0
        for partition_log in self.logs():
            expired += partition_log.expire_producers(self.config.producer_id_expiration_ms)
        return expired

    def run_file_deletes(self) -> int:
        """Unlink ``.deleted`` files whose delay has passed."""
        return sum(p.delete_expired_files() for p in self.logs())

    def run_cleaner(self) -> int:
        """One compaction pass (if a cleaner is attached); returns logs cleaned."""
        cleaner = self.cleaner
        if cleaner is None:
            return 0
        return cleaner.clean_once(self.logs())

    def write_checkpoints(self) -> None:
        """Persist every log's recovery point and log start offset."""
        # Under the manager lock: a snapshot of the logs taken before a topic deletion
        # must not be written after the deletion's own checkpoint (stale entries would
        # come back), and two writers would share atomic_write's temp file.
        with self._lock:
            logs = list(self._logs.values())
            try:
                write_offsets(
                    self.data_dir / RECOVERY_POINT_CHECKPOINT,
                    {(p.topic, p.partition): p.recovery_point for p in logs},
                )
                write_offsets(
                    self.data_dir / LOG_START_OFFSET_CHECKPOINT,
                    {(p.topic, p.partition): p.log_start_offset for p in logs},
                )
                replicated = {
                    (p.topic, p.partition): p.high_watermark for p in logs if p.replicated
                }
                if replicated:
                    write_offsets(self.data_dir / REPLICATION_OFFSET_CHECKPOINT, replicated)
            except OSError as exc:
                raise _storage_error(exc, "cannot write offset checkpoints") from exc

    def checkpoint_log_start_offsets(self) -> None:
        """Write ``log-start-offset-checkpoint`` now (atomically, fsynced), so that a log
        start offset moved by DeleteRecords survives a crash before it is answered
        (retention's moves need not wait: a restart finds them again from the first
        segment's base offset). Raises ``StorageError``."""
        with self._lock:  # see write_checkpoints: one writer, no stale entries
            logs = list(self._logs.values())
            try:
                write_offsets(
                    self.data_dir / LOG_START_OFFSET_CHECKPOINT,
                    {(p.topic, p.partition): p.log_start_offset for p in logs},
                )
            except OSError as exc:
                raise _storage_error(exc, "cannot write the log start offsets") from exc

    def start_background(self) -> None:
        """Start the scheduler and cleaner threads (daemon threads; ``close`` stops them)."""
        # Producers that went idle while the broker was down (or came back from the log
        # tail after an unclean stop) are forgotten now, not an interval later.
        self._expire_producers_quietly()
        with self._lock:
            if self._threads:
                return
            tasks: list[tuple[str, int, Callable[[], object]]] = [
                ("retention", self.config.retention_check_interval_ms, self.run_retention),
                ("flush", self.config.flush_scheduler_interval_ms, self.run_flush),
                ("file-deletes", self.config.file_delete_check_interval_ms, self.run_file_deletes),
                (
                    "producer-expiration",
                    self.config.producer_id_expiration_check_interval_ms,
                    self._expire_producers_quietly,
                ),
                (
                    "checkpoints",
                    self.config.flush_offset_checkpoint_interval_ms,
                    self.write_checkpoints,
                ),
            ]
            self._threads.append(
                threading.Thread(
                    target=self._schedule, args=(tasks,), name="tidelog-scheduler", daemon=True
                )
            )
            if self.config.cleaner_enabled and self.cleaner is not None:
                cleaner_task = [("cleaner", self.config.cleaner_backoff_ms, self.run_cleaner)]
                self._threads.append(
                    threading.Thread(
                        target=self._schedule,
                        args=(cleaner_task,),
                        name="tidelog-cleaner",
                        daemon=True,
                    )
                )
            for thread in self._threads:
                thread.start()

    def _expire_producers_quietly(self) -> None:
        # Returns None, not the count: the scheduler would run a task that "did work"
        # again at once, and one pass forgets everything that is due.
        expired = self.run_producer_expiration()
        if expired:
            log.info("forgot %d idle producer(s) (producer.id.expiration.ms)", expired)

    def _schedule(self, tasks: list[tuple[str, int, Callable[[], object]]]) -> None:
        # Real time on purpose: this thread only paces work; every task reads the injected
        # clock for its decisions, and tests call the tasks directly.
        clock = self.clock
        due = {name: clock.monotonic_ms() + interval for name, interval, _ in tasks}
        while not self._stop.is_set():
            now = clock.monotonic_ms()
            for name, interval, task in tasks:
                if now >= due[name]:
                    did_work: object = None
                    try:
                        did_work = task()
                    except LogDirFullError as exc:
                        # Expected while the disk is full, retried next interval: one
                        # line, no traceback (written to that full disk, often).
                        log.warning("background task %s failed: %s", name, exc)
                    except Exception:
                        log.exception("background task %s failed", name)
                    # A task that did work (returned a positive count) runs again at
                    # once; one that found nothing backs off (Kafka's cleaner backoff).
                    again = isinstance(did_work, int) and did_work > 0
                    due[name] = clock.monotonic_ms() + (0 if again else interval)
            wait_ms = max(min(due.values()) - clock.monotonic_ms(), 10)
            self._stop.wait(min(wait_ms, 1000) / 1000)

    # ------------------------------------------------------------------ closing

    @property
    def previous_broker_epoch(self) -> int:
        """What the clean-shutdown marker found at open said: the broker epoch recorded
        at the last clean close, 0 if it recorded none, -1 if there was no marker (the
        last stop was not clean, or this directory is new)."""
        return self._previous_broker_epoch

    def record_broker_epoch(self, broker_epoch: int) -> None:
        """The broker epoch to write into the clean-shutdown marker at ``close``."""
        self._broker_epoch = broker_epoch

    def close(self) -> None:
        """Stop background work, flush and close every log, write checkpoints, then the
        clean-shutdown marker (last, so that its presence proves everything before it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        with ThreadPoolExecutor(_OPEN_THREADS) as pool:  # their fsyncs overlap, as opening's
            list(pool.map(PartitionLog.close, self.logs()))
        self.write_checkpoints()
        marker = {"version": 0, "broker_epoch": self._broker_epoch}
        atomic_write(self.data_dir / CLEAN_SHUTDOWN_MARKER, json.dumps(marker).encode() + b"\n")
        log.info("closed %s cleanly", self.data_dir)

    def __enter__(self) -> LogManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _marker_broker_epoch(marker: Path) -> int:
    """The broker epoch in a clean-shutdown marker; 0 if it has none (an older marker, or
    one that does not parse: the marker's presence alone says the stop was clean)."""
    try:
        document = json.loads(marker.read_bytes())
    except (OSError, ValueError):
        return 0
    epoch = document.get("broker_epoch") if isinstance(document, dict) else None
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0 else 0


def _storage_error(exc: OSError, what: str) -> StorageError:
    """``LogDirFullError`` (retriable) for a full disk, else ``StorageError``."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return LogDirFullError(f"{what}: no space left on the data directory's disk")
    return StorageError(f"{what}: {exc}")


class Cleaner(Protocol):
    """What the log manager needs of a log cleaner (``storage.cleaner.LogCleaner``)."""

    def clean_once(self, logs: list[PartitionLog]) -> int:
        """Compact the logs that need it most; return how many were cleaned."""
        ...
