"""Keyed partitioning by Kafka's murmur2, and the sticky partitioner for keyless records."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.client.partitioner import (
    StickyPartitioner,
    murmur2,
    murmur2_python,
    partition_for_key,
    partitions_for_keys,
)
from tidelog.storage.native import NATIVE

# Kafka's own vectors: clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java
# (testMurmur2), as Java's signed ints.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def _signed(value: int) -> int:
    return value - 2**32 if value >= 2**31 else value


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS.items())
def test_murmur2_matches_kafka_vectors(data: bytes, expected: int) -> None:
    assert _signed(murmur2(data)) == expected
    assert _signed(murmur2_python(data)) == expected


def _reference_murmur2(data: bytes) -> int:
    """A line-by-line transcription of Kafka's Utils.murmur2, byte by byte."""
    length = len(data)
    m = 0x5BD1E995
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        i4 = i * 4
        k = data[i4] | data[i4 + 1] << 8 | data[i4 + 2] << 16 | data[i4 + 3] << 24
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = length & ~3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


@given(st.binary(max_size=96))
def test_murmur2_matches_the_reference_for_any_bytes(data: bytes) -> None:
    expected = _reference_murmur2(data)
    assert murmur2_python(data) == expected
    assert murmur2(data) == expected
    assert murmur2(bytearray(data)) == murmur2(memoryview(data)) == expected


def test_murmur2_is_the_c_one_when_it_is_built() -> None:
    assert (murmur2 is not murmur2_python) == NATIVE


@given(st.lists(st.binary(max_size=40), max_size=30), st.integers(1, 100))
def test_partitions_for_keys_is_partition_for_key_of_each(keys: list[bytes], n: int) -> None:
    expected = [(_reference_murmur2(key) & 0x7FFFFFFF) % n for key in keys]
    assert partitions_for_keys(keys, n) == expected
    assert [partition_for_key(key, n) for key in keys] == expected


def test_partitions_for_keys_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="partitions"):
        partitions_for_keys([b"k"], 0)
    with pytest.raises(TypeError):
        partitions_for_keys([b"k", None], 3)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        partitions_for_keys(["text"], 3)  # type: ignore[list-item]


def test_partition_for_key_is_kafkas_positive_modulo() -> None:
    # toPositive(-790332482) % 50 == 16, as the Java client computes it.
    assert partition_for_key(b"foobar", 50) == (-790332482 & 0x7FFFFFFF) % 50 == 16
    for key in KAFKA_VECTORS:
        for partitions in (1, 3, 7, 12):
            assert 0 <= partition_for_key(key, partitions) < partitions


def test_sticky_partitioner_sticks_until_batch_size_then_switches() -> None:
    sticky = StickyPartitioner(batch_size=100, rng=random.Random(7))
    first = sticky.partition("t", 4, 40)
    assert sticky.partition("t", 4, 40) == first
    assert sticky.partition("t", 4, 40) == first  # 120 bytes went there now
    second = sticky.partition("t", 4, 40)
    assert second != first


def test_sticky_partitioner_spreads_over_all_partitions() -> None:
    sticky = StickyPartitioner(batch_size=10, rng=random.Random(1))
    counts = [0, 0, 0]
    for _ in range(3000):
        counts[sticky.partition("t", 3, 10)] += 1
    assert all(c > 700 for c in counts), counts


def test_sticky_partitioner_keeps_topics_apart_and_follows_partition_count() -> None:
    sticky = StickyPartitioner(batch_size=1000, rng=random.Random(3))
    assert sticky.partition("one", 1, 10) == 0
    chosen = sticky.partition("two", 5, 10)
    assert 0 <= chosen < 5
    assert sticky.partition("two", 1, 10) == 0  # the topic shrank (or was recreated)


def test_sticky_partitioner_rejects_a_bad_batch_size() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        StickyPartitioner(0)
