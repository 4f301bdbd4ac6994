"""A partition's log as text, for a fault test's failure message (issue #29).

When the checker finds an anomaly, the history says what the clients saw; this says what
the broker stored at the offsets involved: every batch near them (offsets, producer id
and epoch, base sequence, its values or its COMMIT/ABORT marker) and the aborted
transactions the ``.txnindex`` files list there. A copy of the partition directory is
read, never the live one (opening a segment may rebuild its index files).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tidelog.storage.control import is_marker_batch, read_marker
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.files import LOG_SUFFIX, base_offset_from_name
from tidelog.storage.records import decode_batch
from tidelog.storage.segment import Segment

__all__ = ["describe_partition"]

_MAX_LINES = 120


def describe_partition(partition_dir: Path, offsets: Iterable[int], *, context: int = 25) -> str:
    """The batches of ``partition_dir`` within ``context`` offsets of any of ``offsets``
    (every batch when ``offsets`` is empty, up to a bound), and the aborted transactions
    indexed there."""
    wanted = sorted(set(offsets))
    if not partition_dir.is_dir():
        return f"{partition_dir}: no such directory"
    lines = [f"{partition_dir.name}:"]
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / partition_dir.name
        shutil.copytree(partition_dir, copy)
        for path in sorted(copy.glob("*" + LOG_SUFFIX)):
            _describe_segment(copy, base_offset_from_name(path.name), wanted, context, lines)
    if len(lines) > _MAX_LINES:
        lines = [*lines[: _MAX_LINES // 2], "  ...", *lines[-_MAX_LINES // 2 :]]
    return "\n".join(lines)


def _near(first: int, last: int, wanted: list[int], context: int) -> bool:
    return not wanted or any(first - context <= o <= last + context for o in wanted)


def _describe_segment(
    directory: Path, base: int, wanted: list[int], context: int, lines: list[str]
) -> None:
    segment, _ = Segment.open(
        directory,
        base,
        index_interval_bytes=4096,
        index_max_bytes=10 * 1024 * 1024,
        max_message_bytes=2**30,
        recover=False,
    )
    try:
        lines.append(f" segment {base}, next offset {segment.next_offset}")
        for batch in segment.iter_batches(0):
            header = batch.header
            if not _near(header.base_offset, header.last_offset, wanted, context):
                continue
            data = segment.read_range(batch.position, batch.position + header.size_bytes)
            what = _contents(data, is_marker_batch(header))
            lines.append(
                f"  {header.base_offset}-{header.last_offset} pid {header.producer_id} "
                f"epoch {header.producer_epoch} seq {header.base_sequence}"
                f"{' txn' if header.is_transactional else ''}: {what}"
            )
        aborted, _ = segment.txn_index.collect(0, 2**63 - 1)
        for entry in aborted:
            if _near(entry.first_offset, entry.last_offset, wanted, context):
                lines.append(
                    f"  aborted: pid {entry.producer_id} {entry.first_offset}-"
                    f"{entry.last_offset} (lso {entry.last_stable_offset})"
                )
    finally:
        segment.close()


def _contents(data: bytes, marker: bool) -> str:
    try:
        if marker:
            found = read_marker(data)
            if found is None:
                return "control batch"
            kind = "COMMIT" if found.commit else "ABORT"
            return f"{kind} marker, coordinator epoch {found.coordinator_epoch}"
        _, records = decode_batch(data, validate=False)
    except CorruptRecordError as exc:
        return f"undecodable: {exc}"
    return " ".join((r.value or b"").decode(errors="replace") for r in records)
