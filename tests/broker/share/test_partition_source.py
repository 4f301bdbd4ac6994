"""``LogRecordSource.scan`` over a real partition log: a producer's batches are read from
their headers alone (no decoding), a compacted batch by decoding it; both give exactly the
offsets of the records a consumer reads, from any offset and up to any count."""

from __future__ import annotations

from pathlib import Path

from tidelog.broker.share.partition_source import LogRecordSource
from tidelog.storage.cleaner import LogCleaner
from tidelog.storage.clock import ManualClock
from tidelog.storage.config import LogConfig
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import decode_batch, encode_batch, iter_batch_headers

T0 = 1_700_000_000_000


def _log(path: Path, clock: ManualClock, compact: bool) -> PartitionLog:
    config = LogConfig.from_mapping(
        {"cleanup.policy": "compact", "segment.bytes": 400, "file.delete.delay.ms": 0}
        if compact
        else {"segment.bytes": 400}
    )
    return PartitionLog.open(path, "t", 0, config, clock)


def _fill(log: PartitionLog, batches: int) -> None:
    """Batches of five keyed records, keys repeating across and within batches."""
    for b in range(batches):
        records = [(T0, b"k%d" % ((b * 5 + i) % 7), b"v%d-%d" % (b, i)) for i in range(5)]
        log.append(encode_batch(records))


def _read_offsets(log: PartitionLog) -> list[int]:
    """Every record's offset, decoded through the public read path."""
    out: list[int] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20).records
        if not data:
            break
        for position, _ in iter_batch_headers(data):
            header, records = decode_batch(data, position)
            out.extend(r.offset for r in records if r.offset >= offset)
            offset = max(offset, header.next_offset)
    return out


def _scan_all(source: LogRecordSource, start: int, step: int) -> list[int]:
    found: list[int] = []
    offset = start
    while True:
        scan = source.scan(offset, step)
        found.extend(scan.offsets)
        if not scan.offsets:
            return found
        offset = scan.next_offset


def test_scan_gives_the_records_offsets_of_plain_and_compacted_batches(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    plain = _log(tmp_path / "plain" / "t-0", clock, compact=False)
    compacted = _log(tmp_path / "compacted" / "t-0", clock, compact=True)
    for log in (plain, compacted):
        _fill(log, 20)
    cleaner = LogCleaner(tmp_path / "compacted", clock)
    assert cleaner.clean_log(compacted, force=True).cleaned
    for log in (plain, compacted):
        expected = _read_offsets(log)
        source = LogRecordSource(log, read_committed=False)
        for start in (0, 3, 17, 42):
            for step in (1, 4, 500):
                got = _scan_all(source, start, step)
                assert got == [o for o in expected if o >= start], (log.topic, start, step)
    # The compacted log really has gaps inside its batches (the decoding path ran).
    assert _read_offsets(compacted) != list(range(compacted.log_end_offset))
    assert _read_offsets(plain) == list(range(100))
