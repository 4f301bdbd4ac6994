"""``client.share_wire.acquired_records``: the records of a ShareFetch answer inside its
acquired ranges, against the plain definition (every record of every batch whose offset
lies in a range, with that range's delivery count), over random stored batches (gaps
between batches and, as after compaction, inside them) and random disjoint ranges that
start and end anywhere: inside a batch, across batches, several in one batch.
"""

from __future__ import annotations

import random

import pytest

from tidelog.client.share_wire import acquired_records
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.records import BatchBuilder


def _batches(rng: random.Random) -> tuple[bytes, list[int]]:
    data = b""
    offsets: list[int] = []
    base = rng.randrange(0, 5)
    for _ in range(rng.randrange(1, 5)):
        deltas: list[int] = []
        delta = 0
        for _ in range(rng.randrange(1, 30)):
            deltas.append(delta)
            delta += 1 if rng.random() < 0.8 else rng.randrange(2, 5)
        builder = BatchBuilder(base_offset=base)
        for d in deltas:
            builder.append(1_000, None, b"v%d" % (base + d), offset_delta=d)
        data += builder.build(last_offset_delta=deltas[-1])
        offsets.extend(base + d for d in deltas)
        base += deltas[-1] + 1 + rng.randrange(0, 4)
    return data, offsets


def _ranges(rng: random.Random, end: int) -> list[tuple[int, int, int]]:
    cuts = sorted(rng.sample(range(end + 2), min(end + 2, rng.randrange(0, 8) * 2)))
    return [(cuts[k], cuts[k + 1], rng.randrange(1, 4)) for k in range(0, len(cuts) - 1, 2)]


@pytest.mark.parametrize("seed", range(300))
def test_the_records_inside_the_acquired_ranges_with_their_counts(seed: int) -> None:
    rng = random.Random(seed)
    data, offsets = _batches(rng)
    ranges = _ranges(rng, offsets[-1])
    part = pb.ShareFetchPartition(
        topic="t",
        partition=3,
        records=data,
        acquired=[
            pb.ShareAcquiredRange(first_offset=first, last_offset=last, delivery_count=c)
            for first, last, c in reversed(ranges)  # any order on the wire
        ],
    )
    expected = [
        (offset, count)
        for offset in offsets
        for first, last, count in ranges
        if first <= offset <= last
    ]
    got = acquired_records(part)
    assert [(r.offset, count) for r, count in got] == expected
    assert all((r.topic, r.partition, r.value) == ("t", 3, b"v%d" % r.offset) for r, _ in got)
