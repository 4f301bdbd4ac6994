"""Record codec benchmark: the client's encode and decode paths against their predecessors.

::

    python benchmarks/codec_bench.py [--quick]

In one process, interleaved, best of ``--repeats`` (the machine is shared and noisy):

- decode: 64 batches of 500 records (16-byte key, 100-byte value) handed out by the
  consumer's ``CompletedFetch.take`` (``decode_batch_as``: records built as
  ``ConsumerRecord``s) against ``decode_batch`` followed by one ``ConsumerRecord`` per
  ``Record``, the consumer's path before ``decode_batch_as``;
- encode: the same 500-record batch built by ``BatchBuilder.extend`` (the producer's
  path) against ``BatchBuilder.append`` in a loop; the bytes are checked equal.

Figures in µs a record and as ratios; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from client.fetcher import CompletedFetch  # noqa: E402
from client.types import ConsumerRecord, TopicPartition  # noqa: E402
from storage.records import BatchBuilder, decode_batch, iter_batch_headers  # noqa: E402

TP = TopicPartition("bench", 0)
PER_BATCH = 500
T0 = 1_700_000_000_000


def _columns(count: int, start: int) -> tuple[list[int], list[bytes], list[bytes], list[tuple[()]]]:
    value = os.urandom(100)
    keys = [i.to_bytes(16, "big") for i in range(start, start + count)]
    return [T0 + i // 50 for i in range(count)], keys, [value] * count, [()] * count


def _fetched(batches: int) -> tuple[bytes, int]:
    out = bytearray()
    for b in range(batches):
        builder = BatchBuilder(base_offset=b * PER_BATCH)
        builder.extend(*_columns(PER_BATCH, b * PER_BATCH))
        out += builder.build()
    return bytes(out), batches * PER_BATCH


def decode_take(data: bytes) -> int:
    fetch = CompletedFetch(TP, 0, 0, data)
    position, count = 0, 0
    while True:
        records, position = fetch.take(position, 500)
        if not records:
            return count
        count += len(records)


def decode_then_copy(data: bytes) -> int:
    new, topic, partition = tuple.__new__, TP.topic, TP.partition
    count = 0
    for position, _ in iter_batch_headers(data):
        _, records = decode_batch(data, position)
        out = [
            new(
                ConsumerRecord,
                (topic, partition, r.offset, r.timestamp_ms, r.key, r.value, r.headers),
            )
            for r in records
        ]
        count += len(out)
    return count


def encode_extend(columns: tuple[list[int], list[bytes], list[bytes], list[tuple[()]]]) -> bytes:
    builder = BatchBuilder(producer_id=5, producer_epoch=0, base_sequence=0)
    builder.extend(*columns)
    return builder.build()


def encode_append(columns: tuple[list[int], list[bytes], list[bytes], list[tuple[()]]]) -> bytes:
    builder = BatchBuilder(producer_id=5, producer_epoch=0, base_sequence=0)
    append = builder.append
    for timestamp_ms, key, value, headers in zip(*columns, strict=True):
        append(timestamp_ms, key, value, headers)
    return builder.build()


def _best_us(runs: dict[str, Callable[[], object]], records: int, repeats: int) -> dict[str, float]:
    best = {name: float("inf") for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - started)
    return {name: seconds / records * 1e6 for name, seconds in best.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="8 batches, 3 repeats")
    args = parser.parse_args()
    batches, repeats = (8, 3) if args.quick else (64, args.repeats)
    data, records = _fetched(batches)
    assert decode_take(data) == decode_then_copy(data) == records
    columns = _columns(PER_BATCH, 0)
    assert encode_extend(columns) == encode_append(columns)
    decode = _best_us(
        {"take": lambda: decode_take(data), "then_copy": lambda: decode_then_copy(data)},
        records,
        repeats,
    )
    encode = _best_us(
        {"extend": lambda: encode_extend(columns), "append": lambda: encode_append(columns)},
        PER_BATCH,
        repeats * batches,
    )
    result = {
        "decode_us_per_record": round(decode["take"], 3),
        "decode_then_copy_us_per_record": round(decode["then_copy"], 3),
        "decode_speedup": round(decode["then_copy"] / decode["take"], 2),
        "encode_extend_us_per_record": round(encode["extend"], 3),
        "encode_append_loop_us_per_record": round(encode["append"], 3),
        "encode_speedup": round(encode["append"] / encode["extend"], 2),
    }
    print(
        f"decode: {result['decode_us_per_record']} us/record (decode_batch then copy: "
        f"{result['decode_then_copy_us_per_record']}), x{result['decode_speedup']}\n"
        f"encode: {result['encode_extend_us_per_record']} us/record (append in a loop: "
        f"{result['encode_append_loop_us_per_record']}), x{result['encode_speedup']}"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
