"""``PartitionLog`` as a hypothesis state machine against a plain Python model.

The model is a list of record values indexed by offset, the batches they came in (for
batch-granular truncation), their timestamps (for time retention), the log start offset,
and one idempotent producer's history. Rules append, read, roll, restart cleanly and
uncleanly, apply retention by time and by size, unlink ``.deleted`` files, truncate, and
produce and retry idempotent batches. After every step the whole log is read back and
compared with the model.

Retention expectations are computed here from the model's timestamps and the sizes of the
``.log`` files on disk, by Kafka's rule (reference 3.2), not by calling ``plan_retention``.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tests.storage.conftest import (
    T0,
    crash,
    log_config,
    make_batch,
    open_log,
    read_all,
    reopen_clean,
    reopen_unclean,
)
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import OffsetOutOfRangeError
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import decode_records, split_whole_batches

RETENTION_MS = 10_000
DELETE_DELAY_MS = 1_000
PID = 77


@dataclass
class ProducerModel:
    """One idempotent producer: its batches as (first_seq, last_seq, base, last offset)."""

    next_sequence: int = 0
    history: list[tuple[int, int, int, int]] = field(default_factory=list)
    valid: bool = True  # truncation makes the expected state too intricate to model


class PartitionLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="tidelog-sm-"))
        self.directory = self.root / "events-0"
        self.clock = ManualClock(T0)
        self.values: list[bytes] = []
        self.timestamps: list[int] = []
        self.batch_bases: list[int] = []
        self.start = 0
        self.counter = 0
        self.producer = ProducerModel()
        self.last_retention_ms: int | None = None
        self.log: PartitionLog

    @initialize(
        segment_bytes=st.integers(300, 2000),
        index_interval=st.sampled_from([1, 64, 500, 4096]),
        segment_ms=st.sampled_from([7 * 24 * 3600 * 1000, 20_000]),
    )
    def open(self, segment_bytes: int, index_interval: int, segment_ms: int) -> None:
        config = log_config(
            segment_bytes=segment_bytes,
            index_interval_bytes=index_interval,
            segment_ms=segment_ms,
            retention_ms=-1,
            retention_bytes=-1,
            file_delete_delay_ms=DELETE_DELAY_MS,
        )
        self.log = open_log(self.directory, self.clock, config)

    def teardown(self) -> None:
        crash(self.root)
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ helpers

    def _new_values(self, count: int, size: int) -> list[bytes]:
        out = []
        for _ in range(count):
            self.counter += 1
            out.append(f"r{self.counter}:".encode().ljust(size, b"."))
        return out

    def _record_append(self, base: int, batch_values: list[bytes], timestamp_ms: int) -> None:
        assert base == len(self.values)
        self.batch_bases.append(base)
        self.values.extend(batch_values)
        self.timestamps.extend([timestamp_ms] * len(batch_values))

    def _set_config(self, **overrides: object) -> None:
        current = self.log.config.to_mapping()
        current.update({k.replace("_", "."): str(v) for k, v in overrides.items()})
        self.log.update_config(log_config(**{k.replace(".", "_"): v for k, v in current.items()}))

    # ------------------------------------------------------------------ rules

    @rule(
        count=st.integers(1, 4),
        size=st.integers(1, 120),
        jitter=st.integers(-50, 50),
        batches=st.integers(1, 3),
    )
    def append(self, count: int, size: int, jitter: int, batches: int) -> None:
        timestamp_ms = self.clock.wall_ms() + jitter
        parts = [self._new_values(count, size) for _ in range(batches)]
        request = b"".join(make_batch(p, timestamp_ms=timestamp_ms) for p in parts)
        result = self.log.append(request)
        assert result.base_offset == len(self.values)
        assert result.record_count == count * batches
        for part in parts:
            self._record_append(len(self.values), part, timestamp_ms)
        assert result.last_offset == len(self.values) - 1

    @rule(ms=st.integers(0, 6_000))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(offset_choice=st.integers(0, 10**9), max_bytes=st.integers(0, 2_000))
    def read(self, offset_choice: int, max_bytes: int) -> None:
        end = len(self.values)
        offset = self.start + offset_choice % (end - self.start + 1)
        result = self.log.read(offset, max_bytes)
        assert (result.high_watermark, result.log_start_offset) == (end, self.start)
        if offset == end:
            assert result.records == b""
            return
        whole = split_whole_batches(result.records)
        assert whole == len(result.records), "reads return whole batches only"
        records = [r for r in decode_records(result.records) if r.offset >= offset]
        assert records, "a read below the log end makes progress"
        assert [r.offset for r in records] == list(range(offset, offset + len(records)))
        assert [r.value for r in records] == self.values[offset : offset + len(records)]
        with pytest.raises(OffsetOutOfRangeError):
            self.log.read(end + 1, max_bytes)
        if self.start > 0:
            with pytest.raises(OffsetOutOfRangeError):
                self.log.read(self.start - 1, max_bytes)

    @rule()
    def roll(self) -> None:
        before = self.log.segment_count
        active_empty = self.log.segments[-1].size_bytes == 0
        segment = self.log.roll()
        assert segment.base_offset == len(self.values)
        assert self.log.segment_count == before + (0 if active_empty else 1)

    @rule()
    def flush(self) -> None:
        self.log.flush()
        assert self.log.recovery_point == len(self.values)

    @rule()
    def restart_clean(self) -> None:
        self.log = reopen_clean(self.log, self.clock)
        assert self.log.recovery_point == len(self.values)

    @rule(with_checkpoint=st.booleans())
    def restart_unclean(self, with_checkpoint: bool) -> None:
        # Without a checkpoint the log start is the first segment's base: the same here,
        # since it only moves to segment boundaries in this machine.
        self.log = reopen_unclean(
            self.log,
            self.clock,
            log_start_offset=self.start if with_checkpoint else 0,
            recovery_point=self.log.recovery_point if with_checkpoint else 0,
        )
        self.last_retention_ms = None  # .deleted files are removed on open
        assert self.log.recovery_point == len(self.values)

    @rule()
    def retention_by_time(self) -> None:
        now = self.clock.wall_ms()
        segments = [(s.base_offset, s.next_offset) for s in self.log.segments]
        count = 0
        for i, (base, next_offset) in enumerate(segments):
            if base == next_offset:
                assert i == len(segments) - 1, "only the active segment may be empty"
                break
            newest = max(self.timestamps[base:next_offset])
            if now - newest <= RETENTION_MS:
                break
            count += 1
        self._set_config(retention_ms=RETENTION_MS)
        try:
            deleted = self.log.delete_old_segments()
        finally:
            self._set_config(retention_ms=-1)
        self._check_retention(segments, count, deleted)

    @rule(limit_choice=st.integers(0, 10**9))
    def retention_by_size(self, limit_choice: int) -> None:
        segments = [(s.base_offset, s.next_offset) for s in self.log.segments]
        sizes = [(self.directory / f"{base:020d}.log").stat().st_size for base, _ in segments]
        total = sum(sizes)
        limit = limit_choice % (total + 2)
        excess = total - limit
        count = 0
        for i, size in enumerate(sizes):
            if i == len(sizes) - 1 and size == 0:
                break
            if excess - size < 0:
                break
            excess -= size
            count += 1
        self._set_config(retention_bytes=limit)
        try:
            deleted = self.log.delete_old_segments()
        finally:
            self._set_config(retention_bytes=-1)
        self._check_retention(segments, count, deleted)
        remaining = sum(s.size_bytes for s in self.log.segments)
        assert remaining <= limit or remaining - self.log.segments[0].size_bytes < limit

    def _check_retention(self, segments: list[tuple[int, int]], count: int, deleted: int) -> None:
        assert deleted == count
        if count == 0:
            return
        self.last_retention_ms = self.clock.monotonic_ms()
        end = len(self.values)
        self.start = segments[count][0] if count < len(segments) else end
        assert self.log.log_start_offset == self.start
        assert self.log.log_end_offset == end
        if count == len(segments):
            # Everything expired: a fresh empty active segment at the log end.
            assert [s.base_offset for s in self.log.segments] == [end]

    @rule()
    def delete_expired_files(self) -> None:
        self.log.delete_expired_files()
        leftovers = [p for p in self.directory.iterdir() if p.name.endswith(".deleted")]
        if self.last_retention_ms is None:
            assert not leftovers
        elif self.clock.monotonic_ms() - self.last_retention_ms >= DELETE_DELAY_MS:
            assert not leftovers
            self.last_retention_ms = None

    @rule(offset_choice=st.integers(0, 10**9))
    def truncate_to(self, offset_choice: int) -> None:
        end = len(self.values)
        offset = self.start + offset_choice % (end - self.start + 1)
        segments_before = len(self.log.segments)
        self.log.truncate_to(offset)
        if len(self.log.segments) < segments_before:
            # Dropped segments wait file.delete.delay.ms as .deleted, as retention's do.
            self.last_retention_ms = self.clock.monotonic_ms()
        # Batch granularity: every batch holding an offset at or past the cut goes.
        new_end = end if offset >= end else max(b for b in self.batch_bases if b <= offset)
        self.batch_bases = [b for b in self.batch_bases if b < new_end]
        del self.values[new_end:]
        del self.timestamps[new_end:]
        self.producer.valid = False
        assert self.log.log_end_offset == new_end

    @precondition(lambda self: self.producer.valid)
    @rule(count=st.integers(1, 3))
    def produce_idempotent(self, count: int) -> None:
        batch_values = self._new_values(count, 10)
        timestamp_ms = self.clock.wall_ms()
        first = self.producer.next_sequence
        result = self.log.append(
            make_batch(
                batch_values,
                timestamp_ms=timestamp_ms,
                producer_id=PID,
                producer_epoch=0,
                base_sequence=first,
            )
        )
        assert not result.duplicate
        assert result.base_offset == len(self.values)
        self._record_append(result.base_offset, batch_values, timestamp_ms)
        self.producer.history.append(
            (first, first + count - 1, result.base_offset, len(self.values) - 1)
        )
        self.producer.next_sequence += count

    @precondition(lambda self: self.producer.valid and self.producer.history)
    @rule(back=st.integers(1, 5))
    def retry_idempotent(self, back: int) -> None:
        history = self.producer.history
        first, last, base, last_offset = history[-min(back, len(history))]
        count = last - first + 1
        size_before = sum(s.size_bytes for s in self.log.segments)
        result = self.log.append(
            make_batch(
                [b"retry"] * count,
                producer_id=PID,
                producer_epoch=0,
                base_sequence=first,
            )
        )
        assert result.duplicate
        assert (result.base_offset, result.last_offset) == (base, last_offset)
        assert sum(s.size_bytes for s in self.log.segments) == size_before

    # ------------------------------------------------------------------ invariants

    @invariant()
    def matches_the_model(self) -> None:
        log = self.log
        end = len(self.values)
        assert log.log_end_offset == log.high_watermark == end
        assert log.log_start_offset == self.start
        assert 0 <= log.log_start_offset <= log.log_end_offset
        segments = log.segments
        assert segments, "a log always has an active segment"
        for before, after in itertools.pairwise(segments):
            assert before.next_offset == after.base_offset, "segments are contiguous"
        assert segments[0].base_offset <= self.start
        assert segments[-1].next_offset == end
        on_disk = sorted(p.name for p in self.directory.iterdir() if p.name.endswith(".log"))
        assert on_disk == [f"{s.base_offset:020d}.log" for s in segments]
        records = read_all(log, max_bytes=300)
        assert [r.offset for r in records] == list(range(self.start, end))
        assert [r.value for r in records] == self.values[self.start :]
        assert [r.timestamp_ms for r in records] == self.timestamps[self.start :]


PartitionLogMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_partition_log_state_machine = PartitionLogMachine.TestCase
