"""read_committed filtering in the consumer's engine (``client.fetcher``), on bytes built as a
partition leader stores them: transactional batches, COMMIT/ABORT control batches, and the
aborted transactions a broker names in a read_committed fetch answer (Kafka's rule:
entries whose ABORT marker is at or after the fetch offset and whose first offset is
below the end of the returned data). Pure; both record codecs and both column builders.

The model: a random interleaving of transactional producers (and a plain idempotent one)
on one partition; what read_committed must hand out is every non-transactional record and
every record of a committed transaction, in offset order, below the last stable offset,
and the position must end at the end of what was fetched (markers and aborted batches
stepped over). read_uncommitted hands out every data record and no control record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.client.columns import finish_columns, new_column_builder
from tidelog.client.fetcher import CompletedFetch
from tidelog.client.types import TopicPartition
from tidelog.storage.control import build_marker
from tidelog.storage.records import BatchBuilder

TP = TopicPartition("t", 0)
PLAIN = 100  # an idempotent producer outside any transaction


@dataclass
class Log:
    """A partition's bytes and what a read_committed fetch of them must name."""

    batches: list[tuple[int, int, bytes]] = field(default_factory=list)  # base, next, bytes
    end: int = 0
    open_first: dict[int, int] = field(default_factory=dict)  # pid -> first offset
    open_values: dict[int, list[bytes]] = field(default_factory=dict)
    aborted: list[tuple[int, int, int]] = field(default_factory=list)  # pid, first, marker
    visible: dict[int, bytes] = field(default_factory=dict)  # committed: offset -> value
    data: dict[int, bytes] = field(default_factory=dict)  # every data record
    offsets_of: dict[bytes, int] = field(default_factory=dict)

    def write(self, pid: int, count: int) -> None:
        transactional = pid != PLAIN
        builder = BatchBuilder(
            base_offset=self.end,
            producer_id=pid,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=transactional,
        )
        values = [f"{pid}@{self.end + i}".encode() for i in range(count)]
        for value in values:
            builder.append(1_000, None, value)
        self._append(builder.build(), count)
        for i, value in enumerate(values):
            self.data[self.end - count + i] = value
            self.offsets_of[value] = self.end - count + i
        if transactional:
            self.open_first.setdefault(pid, self.end - count)
            self.open_values.setdefault(pid, []).extend(values)
        else:
            self.visible.update({self.offsets_of[v]: v for v in values})

    def end_txn(self, pid: int, commit: bool) -> None:
        if pid not in self.open_first:
            return  # nothing written: the coordinator sends this partition no marker
        marker_offset = self.end
        marker = build_marker(
            pid, 0, commit=commit, coordinator_epoch=0, timestamp_ms=1_000, base_offset=self.end
        )
        self._append(marker, 1)
        first = self.open_first.pop(pid)
        values = self.open_values.pop(pid)
        if commit:
            self.visible.update({self.offsets_of[v]: v for v in values})
        else:
            self.aborted.append((pid, first, marker_offset))

    def _append(self, data: bytes, count: int) -> None:
        self.batches.append((self.end, self.end + count, data))
        self.end += count

    @property
    def last_stable_offset(self) -> int:
        return min(self.open_first.values(), default=self.end)

    def fetch(
        self, fetch_offset: int, *, committed: bool
    ) -> tuple[bytes, int, list[tuple[int, int]]]:
        """The records a fetch from ``fetch_offset`` gets (up to the LSO or the log end),
        where they end, and (read_committed) the aborted transactions it is told."""
        limit = self.last_stable_offset if committed else self.end
        chosen = [(b, n, d) for b, n, d in self.batches if n > fetch_offset and b < limit]
        upper = chosen[-1][1] if chosen else fetch_offset
        aborted = [
            (pid, first)
            for pid, first, marker in self.aborted
            if marker >= fetch_offset and first < upper
        ]
        return b"".join(d for _, _, d in chosen), upper, aborted


_STEP = st.tuples(st.sampled_from(["write", "write", "commit", "abort"]), st.integers(0, 3))


def _build(steps: list[tuple[str, int]]) -> Log:
    log = Log()
    pids = [1, 2, 3, PLAIN]
    for kind, index in steps:
        pid = pids[index]
        if kind == "write":
            log.write(pid, 1 + (log.end % 3))
        elif pid != PLAIN:
            log.end_txn(pid, commit=kind == "commit")
    return log


def _take_all(fetch: CompletedFetch, position: int, chunk: int) -> tuple[list[int], int]:
    offsets: list[int] = []
    while not fetch.exhausted:
        records, position = fetch.take(position, chunk)
        offsets += [r.offset for r in records]
    return offsets, position


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(_STEP, max_size=30),
    start=st.integers(0, 60),
    chunk=st.integers(1, 5),
    columns=st.sampled_from([None, False, True]),
)
def test_read_committed_hands_out_exactly_the_committed_records(
    steps: list[tuple[str, int]], start: int, chunk: int, columns: bool | None
) -> None:
    log = _build(steps)
    fetch_offset = min(start, log.last_stable_offset)
    data, upper, aborted = log.fetch(fetch_offset, committed=True)
    fetch = CompletedFetch(TP, 0, fetch_offset, data, aborted_transactions=aborted)
    if columns is None:
        offsets, position = _take_all(fetch, fetch_offset, chunk)
    else:  # the column path, with the pure or (when built) the C builder
        builder = new_column_builder(False, pure=columns)
        position = fetch_offset
        while not fetch.exhausted:
            position = fetch.take_columns(position, builder, chunk)
        offsets = list(memoryview(finish_columns(builder).offsets).cast("q"))
    expected = sorted(o for o in log.visible if fetch_offset <= o < log.last_stable_offset)
    assert offsets == expected
    assert position == max(upper, fetch_offset)
    if data:
        assert position == log.last_stable_offset  # past every marker and aborted batch


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(_STEP, max_size=30), chunk=st.integers(1, 5))
def test_read_uncommitted_hands_out_every_data_record_and_no_marker(
    steps: list[tuple[str, int]], chunk: int
) -> None:
    log = _build(steps)
    data, upper, _ = log.fetch(0, committed=False)
    offsets, position = _take_all(CompletedFetch(TP, 0, 0, data), 0, chunk)
    assert offsets == sorted(log.data)
    assert position == upper == log.end


def test_an_aborted_transaction_then_a_committed_one_of_the_same_producer() -> None:
    """The ABORT marker ends the producer's aborted run: its next transaction counts."""
    log = Log()
    log.write(1, 2)  # 0-1, aborted
    log.write(2, 1)  # 2, committed, inside producer 1's aborted transaction
    log.end_txn(1, commit=False)  # 3
    log.write(1, 1)  # 4, committed
    log.end_txn(2, commit=True)  # 5
    log.end_txn(1, commit=True)  # 6
    data, _, aborted = log.fetch(0, committed=True)
    assert aborted == [(1, 0)]
    fetch = CompletedFetch(TP, 0, 0, data, aborted_transactions=aborted)
    records, position = fetch.take(0, 100)
    assert [(r.offset, r.value) for r in records] == [(2, b"2@2"), (4, b"1@4")]
    assert position == 7
    # Without the list (read_uncommitted) the aborted records are data like any other.
    records, _ = CompletedFetch(TP, 0, 0, data).take(0, 100)
    assert [r.offset for r in records] == [0, 1, 2, 4]


@pytest.mark.parametrize("fetch_offset", [1, 3])
def test_a_fetch_from_inside_an_aborted_transaction(fetch_offset: int) -> None:
    """Fetched from offset 1 (inside the first batch) or 3 (at the marker): the entry
    still names the transaction; nothing of it is handed out."""
    log = Log()
    log.write(1, 3)  # 0-2 aborted
    log.end_txn(1, commit=False)  # 3
    log.write(PLAIN, 1)  # 4
    data, _, aborted = log.fetch(fetch_offset, committed=True)
    fetch = CompletedFetch(TP, 0, fetch_offset, data, aborted_transactions=aborted)
    records, position = fetch.take(fetch_offset, 100)
    assert [r.offset for r in records] == [4]
    assert position == 5
