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
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import CorruptRecordError, InvalidConfigError, InvalidRecordError


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
    log.append(make_batch([b"good"], keys=[b"k"]))
    assert read_values(log) == [b"good"]
    log.close()


def test_a_delete_log_stores_it_undecoded_as_before(tmp_path: Path, clock: ManualClock) -> None:
    log = open_log(tmp_path / "d-0", clock, log_config(cleanup_policy="delete"))
    assert log.append(_lying_header_count()).base_offset == 0  # readers refuse it later
    log.close()


def test_a_compacted_log_refuses_key_less_records_from_the_moment_it_is_compacted(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Issue #27: a record without a key has no place in a compacted log (Kafka answers
    INVALID_RECORD); a log made compact on the fly refuses them from then on, and the whole
    batch holding one is refused (nothing of it stored)."""
    log = open_log(tmp_path / "k-0", clock, log_config(cleanup_policy="delete"))
    log.append(make_batch([b"before"]))  # delete policy: key-less is fine
    log.update_config(log_config(cleanup_policy="compact,delete"))
    with pytest.raises(InvalidRecordError, match="has no key"):
        log.append(make_batch([b"keyed", b"not"], keys=[b"k", None]))
    log.append(make_batch([b"keyed"], keys=[b"k"]))
    assert read_values(log) == [b"before", b"keyed"]
    log.close()


def test_tiered_storage_keys_are_refused_by_name() -> None:
    for key in ("local.retention.ms", "local.retention.bytes", "remote.storage.enable"):
        with pytest.raises(InvalidConfigError, match=r"tiered storage \(KIP-405\)"):
            LogConfig.from_mapping({key: "1"})
