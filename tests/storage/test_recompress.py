"""``compression.type`` (Kafka's topic key): a topic that names a codec stores every
produced batch in it, the broker recompressing the others; ``producer`` keeps batches as
sent. Properties against random batches, then through ``PartitionLog.append`` with the
idempotence state (a retried batch is still recognised after recompression)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.conftest import (
    T0,
    log_config,
    make_batch,
    open_log,
    read_all,
    scratch_dir,
)
from tidelog.storage.clock import ManualClock
from tidelog.storage.compression import Compression
from tidelog.storage.config import LogConfig
from tidelog.storage.errors import InvalidConfigError, RecordTooLargeError
from tidelog.storage.log_validator import recompress
from tidelog.storage.records import decode_batch, iter_batch_headers, validate_batch
from tidelog.storage.segment import BatchPosition

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CODECS = {
    "uncompressed": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}

values = st.lists(st.one_of(st.none(), st.binary(max_size=300)), min_size=1, max_size=20)


def _positions(records: bytes) -> list[BatchPosition]:
    return [BatchPosition(p, h) for p, h in iter_batch_headers(records)]


@PROPERTY
@given(
    batches=st.lists(
        st.tuples(values, st.sampled_from(list(Compression)), st.integers(-50, 50)),
        min_size=1,
        max_size=4,
    ),
    target=st.sampled_from(["producer", *CODECS]),
)
def test_recompressed_batches_hold_the_same_records(
    batches: list[tuple[list[bytes | None], Compression, int]], target: str
) -> None:
    records = b"".join(
        make_batch(
            vals,
            keys=[b"k%d" % i for i in range(len(vals))],
            timestamps=[T0 + skew * i for i in range(len(vals))],
            producer_id=7,
            producer_epoch=2,
            base_sequence=10 * n,
            compression=codec,
        )
        for n, (vals, codec, skew) in enumerate(batches)
    )
    config = LogConfig.from_mapping({"compression.type": target})
    out, positions = recompress(records, _positions(records), config)
    if target == "producer":
        assert out is records
    before = [decode_batch(records, p.position) for p in _positions(records)]
    after = [decode_batch(out, p.position) for p in positions]
    assert [p.position for p in positions] == [p for p, _ in iter_batch_headers(out)]
    for (old_header, old_records), (new_header, new_records), position in zip(
        before, after, positions, strict=True
    ):
        validate_batch(out, position.position)  # a valid CRC
        expected = old_header.compression if target == "producer" else CODECS[target]
        assert new_header.compression == expected
        assert new_records == old_records
        for field in (
            "producer_id",
            "producer_epoch",
            "base_sequence",
            "last_offset_delta",
            "max_timestamp",
            "timestamp_type",
        ):
            assert getattr(new_header, field) == getattr(old_header, field), field


def test_a_recompressed_batch_over_the_limit_is_refused() -> None:
    batch = make_batch([b"a" * 1000] * 8, compression=Compression.ZSTD)
    config = LogConfig.from_mapping({"compression.type": "uncompressed", "max.message.bytes": 2000})
    assert len(batch) < 2000
    with pytest.raises(RecordTooLargeError, match=r"compression\.type"):
        recompress(batch, _positions(batch), config)


def test_an_unknown_codec_name_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match=r"compression\.type"):
        LogConfig.from_mapping({"compression.type": "brotli"})


def test_the_log_stores_the_topics_codec_and_knows_a_retry(tmp_path: Path) -> None:
    with scratch_dir(tmp_path) as directory:
        log = open_log(directory, ManualClock(T0), log_config(compression_type="gzip"))
        sent = make_batch(
            [b"one", b"two"],
            producer_id=3,
            producer_epoch=0,
            base_sequence=0,
            compression=Compression.LZ4,
        )
        first = log.append(sent)
        retried = log.append(sent)  # the producer's retry of the same batch
        assert retried.duplicate
        assert (retried.base_offset, retried.last_offset) == (first.base_offset, first.last_offset)
        stored = log.read(0, 10_000).records
        ((_, header),) = list(iter_batch_headers(stored))
        assert header.compression == Compression.GZIP
        assert [r.value for r in read_all(log)] == [b"one", b"two"]
        log.close()
