"""Which partition a record goes to: Kafka's murmur2 for keys, a sticky choice without.

- A keyed record goes to ``(murmur2(key) & 0x7fffffff) % partitions``, Kafka's
  ``BuiltInPartitioner.partitionForKey``, so a key lands where a Kafka client would put it
  (checked against the vectors of Kafka's ``UtilsTest.testMurmur2``).
- A keyless record goes to the topic's current sticky partition, which changes after
  ``batch_size`` bytes were sent to it (KIP-794's uniform sticky partitioner without the
  broker-load feedback): records fill whole batches, one partition at a time, and over
  time every partition gets the same share.

``murmur2`` is the hot loop of a keyed ``send``: it is the C extension's
(``storage.native``) when that is built, about 20x faster than Python, and
``partitions_for_keys`` hashes many keys in one call. The pure-Python ``murmur2_python``
is the fallback and the reference: it unpacks the 4-byte words with one ``struct`` call
rather than assembling them byte by byte, and runs code generated per key length with the
loop unrolled (together ~2.5x faster than a transcription of the Java code in CPython;
the property tests check both against one).

Pure; ``StickyPartitioner`` is not thread-safe (the producer calls it under its lock).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence
from typing import Any

from tidelog.storage.native import NATIVE, native

__all__ = [
    "NATIVE_MURMUR2",
    "StickyPartitioner",
    "murmur2",
    "murmur2_python",
    "partition_for_key",
    "partitions_for_keys",
]

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
_SEED = 0x9747B28C

_UNROLLED_WORDS = 16  # keys up to 67 bytes get straight-line code (UUIDs, ids, hashes)


def _unrolled(words: int) -> Callable[[bytes], int]:
    """murmur2 for keys of ``4 * words`` to ``4 * words + 3`` bytes, its loop unrolled.

    Generated once per word count: for a 16-byte key CPython spends about a third of the
    hash on loop overhead, and every int operation here is a multi-digit one already.
    """
    lines = [f"def murmur2_{words}(data, M={_M}, MASK={_MASK}, unpack=unpack):"]
    lines += ["    length = len(data)", f"    h = {_SEED} ^ length"]
    if words:
        names = [f"k{i}" for i in range(words)]
        lines.append(f"    ({', '.join(names)},) = unpack(data)")
        for name in names:
            lines.append(f"    {name} = {name} * M & MASK")
            lines.append(f"    {name} = ({name} ^ {name} >> 24) * M & MASK")
            lines.append(f"    h = (h * M ^ {name}) & MASK")
    tail = words * 4
    lines += [
        "    extra = length & 3",
        "    if extra:",
        "        if extra == 3:",
        f"            h ^= data[{tail + 2}] << 16",
        "        if extra >= 2:",
        f"            h ^= data[{tail + 1}] << 8",
        f"        h = (h ^ data[{tail}]) * M & MASK",
        "    h ^= h >> 13",
        "    h = h * M & MASK",
        "    return h ^ h >> 15",
    ]
    namespace: dict[str, Any] = {"unpack": struct.Struct(f"<{words}I").unpack_from}
    exec(compile("\n".join(lines), f"<murmur2 of {words} words>", "exec"), namespace)
    function: Callable[[bytes], int] = namespace[f"murmur2_{words}"]
    return function


_BY_WORDS = [_unrolled(words) for words in range(_UNROLLED_WORDS + 1)]


def murmur2_python(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (MurmurHash2, seed 0x9747b28c) as an unsigned 32-bit int.

    Java returns the same bits as a signed int: Java's ``-973932308`` for ``b"21"`` is
    ``3321034988`` here (``h - 2**32`` when ``h >= 2**31`` gives Java's value). The
    pure-Python implementation; ``murmur2`` is the C one when it is built.
    """
    words = len(data) >> 2
    if words <= _UNROLLED_WORDS:
        return _BY_WORDS[words](data)
    return _murmur2_loop(data)


def _murmur2_loop(data: bytes) -> int:
    length = len(data)
    h = _SEED ^ length
    for k in struct.unpack_from(f"<{length >> 2}I", data):
        k = (k * _M) & _MASK
        k = ((k ^ (k >> 24)) * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    extra = length & 3
    if extra:
        tail = length & ~3
        if extra == 3:
            h ^= data[tail + 2] << 16
        if extra >= 2:
            h ^= data[tail + 1] << 8
        h = ((h ^ data[tail]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


murmur2: Callable[[bytes], int] = native.murmur2 if NATIVE else murmur2_python
"""``murmur2_python``'s result, from the C extension when it is built."""

NATIVE_MURMUR2 = NATIVE
"""Whether ``murmur2`` is the C one (cheap enough that caching its results costs more)."""


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's partition for ``key`` among ``partitions``: ``toPositive(murmur2) % n``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def partitions_for_keys(keys: Sequence[bytes], partitions: int) -> list[int]:
    """``partition_for_key`` of every key, in one call to the C extension when it is built.

    Raises ``ValueError`` for ``partitions < 1`` and ``TypeError`` for a key that is not
    bytes-like (None included).
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    if NATIVE:
        return native.murmur2_partitions(keys, partitions)
    for key in keys:
        if key is None:
            raise TypeError("a key must be bytes-like, not None")
    return [(murmur2_python(key) & 0x7FFFFFFF) % partitions for key in keys]


class StickyPartitioner:
    """Keyless records: one partition per topic until ``batch_size`` bytes went to it.

    Not thread-safe. ``rng`` is injected so tests are deterministic.
    """

    __slots__ = ("_batch_size", "_rng", "_sticky")

    def __init__(self, batch_size: int, rng: random.Random | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._batch_size = batch_size
        self._rng = rng or random.Random()
        # topic -> [partition, bytes sent to it since it became sticky, partition count]
        self._sticky: dict[str, list[int]] = {}

    def partition(self, topic: str, partitions: int, record_bytes: int) -> int:
        """The partition for a keyless record of ``record_bytes`` bytes of ``topic``.

        The record counts towards the current partition; once ``batch_size`` bytes went
        there, the next record picks a new one at random (a different one when there are
        several). A change in the partition count also picks anew.
        """
        state = self._sticky.get(topic)
        if state is None or state[2] != partitions or state[1] >= self._batch_size:
            previous = -1 if state is None else state[0]
            state = [self._pick(partitions, previous), 0, partitions]
            self._sticky[topic] = state
        state[1] += record_bytes
        return state[0]

    def _pick(self, partitions: int, previous: int) -> int:
        if partitions == 1:
            return 0
        choice = self._rng.randrange(partitions)
        if choice == previous:
            choice = (choice + 1) % partitions
        return choice
