"""Record codec benchmark: the C codec against the pure-Python one, encode and decode.

::

    python benchmarks/codec_bench.py [--quick]

In one process, interleaved, best of ``--repeats`` (the machine is shared and noisy),
over 64 batches of 500 records (16-byte key, 100-byte value):

- decode: the consumer's path, ``CompletedFetch.take`` (``decode_batch_as``: records
  built as ``ConsumerRecord``s), with the C decoder (the default when it is built) and
  with ``pure=True``; and ``decode_batch`` followed by one ``ConsumerRecord`` per
  ``Record``, the consumer's path before ``decode_batch_as``;
- columns: the Spark source's path, ``decode_batch_into`` an Arrow-layout column builder,
  the C builder against ``PyColumnBuilder``;
- encode: the same 500-record batch built by ``BatchBuilder.extend`` (the producer's
  path) in C and with ``pure=True``, against ``BatchBuilder.append`` in a loop; the bytes
  are checked equal;
- murmur2 of a 16-byte key, C against Python.

Without the extension (no compiler, or ``TIDELOG_PURE_PYTHON=1``) the native figures
are null. Figures in µs a record, records/s and ratios; the last line is one JSON object.
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

from tidelog.client.fetcher import CompletedFetch  # noqa: E402
from tidelog.client.partitioner import murmur2, murmur2_python  # noqa: E402
from tidelog.client.types import ConsumerRecord, TopicPartition  # noqa: E402
from tidelog.storage.columns import decode_batch_into, finish_columns, new_column_builder  # noqa: E402
from tidelog.storage.native import NATIVE  # noqa: E402
from tidelog.storage.records import (  # noqa: E402
    BatchBuilder,
    decode_batch,
    decode_batch_as,
    iter_batch_headers,
)

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


def decode_rows(data: bytes, *, pure: bool) -> int:
    """``decode_batch_as`` over every batch: what ``take`` does, C or pure."""
    prefix = (TP.topic, TP.partition)
    count = 0
    for position, _ in iter_batch_headers(data, validate=False):  # the decoder validates
        count += len(decode_batch_as(data, position, ConsumerRecord, prefix, pure=pure)[1])
    return count


def decode_columns(data: bytes, *, pure: bool) -> int:
    builder = new_column_builder(False, pure=pure)
    for position, _ in iter_batch_headers(data, validate=False):  # the decoder validates
        decode_batch_into(builder, data, position)
    return finish_columns(builder).rows


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


def encode_extend(
    columns: tuple[list[int], list[bytes], list[bytes], list[tuple[()]]], *, pure: bool = False
) -> bytes:
    builder = BatchBuilder(producer_id=5, producer_epoch=0, base_sequence=0)
    builder.extend(*columns, pure=pure)
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


def _rate(us_per_record: float | None) -> int | None:
    return None if us_per_record is None else round(1e6 / us_per_record)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="8 batches, 3 repeats")
    args = parser.parse_args()
    batches, repeats = (8, 3) if args.quick else (64, args.repeats)
    data, records = _fetched(batches)
    assert decode_take(data) == decode_then_copy(data) == records
    assert decode_rows(data, pure=True) == decode_columns(data, pure=True) == records
    columns = _columns(PER_BATCH, 0)
    assert encode_extend(columns) == encode_extend(columns, pure=True) == encode_append(columns)
    decode_runs: dict[str, Callable[[], object]] = {
        "take": lambda: decode_take(data),
        "then_copy": lambda: decode_then_copy(data),
        "rows_pure": lambda: decode_rows(data, pure=True),
        "columns_pure": lambda: decode_columns(data, pure=True),
    }
    encode_runs: dict[str, Callable[[], object]] = {
        "extend_pure": lambda: encode_extend(columns, pure=True),
        "append": lambda: encode_append(columns),
    }
    if NATIVE:
        decode_runs["rows_native"] = lambda: decode_rows(data, pure=False)
        decode_runs["columns_native"] = lambda: decode_columns(data, pure=False)
        encode_runs["extend_native"] = lambda: encode_extend(columns, pure=False)
    decode = _best_us(decode_runs, records, repeats)
    encode = _best_us(encode_runs, PER_BATCH, repeats * batches)
    keys = columns[1]
    hashes: dict[str, Callable[[], object]] = {
        "python": lambda: [murmur2_python(key) for key in keys]
    }
    if NATIVE:
        hashes["native"] = lambda: [murmur2(key) for key in keys]
    murmur = _best_us(hashes, len(keys), repeats * 4)
    rows_native = decode.get("rows_native")
    columns_native = decode.get("columns_native")
    extend_native = encode.get("extend_native")

    def ratio(slow: float, fast: float | None) -> float | None:
        return None if fast is None else round(slow / fast, 2)

    result = {
        "native": NATIVE,
        "decode_us_per_record": round(decode["take"], 3),
        "decode_then_copy_us_per_record": round(decode["then_copy"], 3),
        "decode_speedup": round(decode["then_copy"] / decode["take"], 2),
        "decode_native_records_per_s": _rate(rows_native),
        "decode_pure_records_per_s": _rate(decode["rows_pure"]),
        "decode_native_over_pure": ratio(decode["rows_pure"], rows_native),
        "columns_native_records_per_s": _rate(columns_native),
        "columns_pure_records_per_s": _rate(decode["columns_pure"]),
        "columns_native_over_pure": ratio(decode["columns_pure"], columns_native),
        "encode_extend_us_per_record": round(encode.get("extend_native", encode["extend_pure"]), 3),
        "encode_append_loop_us_per_record": round(encode["append"], 3),
        "encode_speedup": round(
            encode["append"] / encode.get("extend_native", encode["extend_pure"]), 2
        ),
        "encode_native_records_per_s": _rate(extend_native),
        "encode_pure_records_per_s": _rate(encode["extend_pure"]),
        "encode_native_over_pure": ratio(encode["extend_pure"], extend_native),
        "murmur2_native_ns": None,
        "murmur2_python_ns": round(murmur["python"] * 1000, 1),
    }
    if "native" in murmur:
        result["murmur2_native_ns"] = round(murmur["native"] * 1000, 1)

    def show(rate: object) -> str:
        return "-" if rate is None else f"{rate:,}"

    print(
        f"decode (ConsumerRecords): C {show(result['decode_native_records_per_s'])} records/s, "
        f"pure {show(result['decode_pure_records_per_s'])} "
        f"(x{result['decode_native_over_pure']}); take {result['decode_us_per_record']} "
        f"us/record, decode_batch then copy {result['decode_then_copy_us_per_record']}\n"
        f"decode (Arrow columns):   C {show(result['columns_native_records_per_s'])} records/s, "
        f"pure {show(result['columns_pure_records_per_s'])} "
        f"(x{result['columns_native_over_pure']})\n"
        f"encode (extend):          C {show(result['encode_native_records_per_s'])} records/s, "
        f"pure {show(result['encode_pure_records_per_s'])} "
        f"(x{result['encode_native_over_pure']}); append in a loop "
        f"{result['encode_append_loop_us_per_record']} us/record\n"
        f"murmur2 (16-byte key):    C {result['murmur2_native_ns']} ns, "
        f"Python {result['murmur2_python_ns']} ns"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
