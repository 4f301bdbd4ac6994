"""A compacted log takes only batches whose records decode.

Regression (issue 15, found by ``tests/broker/hostile/test_fuzz.py``): a batch with a
valid CRC but records that do not decode (a lying header count, an offset delta out of
order) was stored in a compacted topic; the cleaner then failed on it and set the
partition aside until a restart, so one hostile produce stopped a topic's compaction.
"""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest

from tests.storage.conftest import log_config, make_batch, open_log, read_values
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import CorruptRecordError


def _lying_header_count() -> bytes:
    batch = bytearray(make_batch([b"v"]))
    batch[-1] = 0x7E  # the record's header count (varint 0) becomes 63
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def test_a_compacted_log_refuses_a_batch_whose_records_do_not_decode(
    tmp_path: Path, clock: ManualClock
) -> None:
    log = open_log(tmp_path / "c-0", clock, log_config(cleanup_policy="compact"))
    with pytest.raises(CorruptRecordError):
        log.append(_lying_header_count())
    log.append(make_batch([b"good"]))
    assert read_values(log) == [b"good"]
    log.close()


def test_a_delete_log_stores_it_undecoded_as_before(tmp_path: Path, clock: ManualClock) -> None:
    log = open_log(tmp_path / "d-0", clock, log_config(cleanup_policy="delete"))
    assert log.append(_lying_header_count()).base_offset == 0  # readers refuse it later
    log.close()
