"""Storage engine throughput against a plain file, in the same run.

Appends and sequential reads of 100-byte records, in ~1 MiB and ~16 KiB batches, through
``PartitionLog``; the baseline writes and reads the same bytes in the same chunk sizes
to a plain file with ``os.write`` / ``os.pread``. Neither side fsyncs; both go through the
same page cache. Batches are built before the timed region (encoding is the client's
cost). Repetitions interleave Tidelog and the plain file so drift (writeback, frequency
scaling) hits both alike; a ratio is the median of the per-repetition ratios, throughputs
are medians, and the range column shows the lowest and highest per-repetition ratio.

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/storage_bench.py [--quick] [--reps N]
        [--total-mib N] [--profile]

Prints a table, then the ratios; the last line is one JSON object with ``append_ratio_1mib``,
``read_ratio_1mib``, ``append_ratio_16kib``, ``read_ratio_16kib`` (Tidelog throughput /
plain-file throughput: 1.0 = as fast as the file).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidelog.storage.clock import SystemClock
from tidelog.storage.config import LogConfig
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import BatchBuilder

RECORD_BYTES = 100
DISTINCT_BATCHES = 8  # cycle through a few, so no side gets one hot buffer
_FRAMING = struct.Struct(">qi")  # base offset, batch length
_LAST_OFFSET_DELTA = struct.Struct(">i")


@dataclass(frozen=True)
class Case:
    name: str
    batch_bytes: int


CASES = [Case("1mib", 1024 * 1024), Case("16kib", 16 * 1024)]


def build_batches(batch_bytes: int) -> list[bytes]:
    """``DISTINCT_BATCHES`` batches of 100-byte values, each about ``batch_bytes`` long."""
    out = []
    for b in range(DISTINCT_BATCHES):
        builder = BatchBuilder()
        i = 0
        while builder.estimated_size_bytes() + RECORD_BYTES + 8 <= batch_bytes:
            value = (f"{b}:{i}:".encode() * 20)[:RECORD_BYTES]
            builder.append(1_700_000_000_000 + i, None, value)
            i += 1
        out.append(builder.build())
    return out


def next_offset_after(data: bytes) -> int:
    """The offset after the last whole batch in a fetch response (what a consumer does)."""
    position, last_position = 0, -1
    end = len(data)
    while end - position >= 61:
        _, length = _FRAMING.unpack_from(data, position)
        if position + 12 + length > end:
            break
        last_position = position
        position += 12 + length
    base, _ = _FRAMING.unpack_from(data, last_position)
    (delta,) = _LAST_OFFSET_DELTA.unpack_from(data, last_position + 23)
    return int(base) + int(delta) + 1


# ---------------------------------------------------------------------- the four timed runs


def tidelog_append(directory: Path, batches: list[bytes], count: int) -> tuple[float, int]:
    log = PartitionLog.open(directory, "bench", 0, LogConfig(), SystemClock())
    written = 0
    start = time.perf_counter()
    for i in range(count):
        batch = batches[i % len(batches)]
        log.append(batch)
        written += len(batch)
    elapsed = time.perf_counter() - start
    log.close()  # flushes: outside the timed region, as the baseline's close
    return elapsed, written


def tidelog_read(directory: Path, batch_bytes: int) -> tuple[float, int]:
    log = PartitionLog.open(
        directory, "bench", 0, LogConfig(), SystemClock(), had_clean_shutdown=True
    )
    end = log.log_end_offset
    offset, read = 0, 0
    start = time.perf_counter()
    while offset < end:
        data = log.read(offset, batch_bytes).records
        read += len(data)
        offset = next_offset_after(data)
    elapsed = time.perf_counter() - start
    log.close()
    return elapsed, read


def plain_append(path: Path, batches: list[bytes], count: int) -> tuple[float, int]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    written = 0
    start = time.perf_counter()
    for i in range(count):
        batch = batches[i % len(batches)]
        os.write(fd, batch)
        written += len(batch)
    elapsed = time.perf_counter() - start
    os.close(fd)
    return elapsed, written


def plain_read(path: Path, batch_bytes: int) -> tuple[float, int]:
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    position, read = 0, 0
    start = time.perf_counter()
    while position < size:
        data = os.pread(fd, batch_bytes, position)
        read += len(data)
        position += len(data)
    elapsed = time.perf_counter() - start
    os.close(fd)
    return elapsed, read


# ---------------------------------------------------------------------- driver


@dataclass
class Samples:
    tidelog_append: list[float]
    plain_append: list[float]
    tidelog_read: list[float]
    plain_read: list[float]


def run_case(case: Case, total_bytes: int, reps: int, root: Path) -> Samples:
    batches = build_batches(case.batch_bytes)
    batch_len = len(batches[0])
    count = max(1, total_bytes // batch_len)
    samples = Samples([], [], [], [])

    def measure(fn: Callable[..., tuple[float, int]], into: list[float], *args: object) -> None:
        os.sync()  # start every timed phase with no dirty pages from the previous one
        elapsed, nbytes = fn(*args)
        into.append(nbytes / elapsed / 1e6)

    for rep in range(reps):
        log_dir = root / f"bench-{case.name}-{rep}"
        plain = root / f"plain-{case.name}-{rep}.bin"
        # Alternate which side goes first, so neither always gets the fresher page cache.
        order = [("tidelog", "plain"), ("plain", "tidelog")][rep % 2]
        for side in order:
            if side == "tidelog":
                measure(tidelog_append, samples.tidelog_append, log_dir, batches, count)
            else:
                measure(plain_append, samples.plain_append, plain, batches, count)
        for side in order:
            if side == "tidelog":
                measure(tidelog_read, samples.tidelog_read, log_dir, case.batch_bytes)
            else:
                measure(plain_read, samples.plain_read, plain, case.batch_bytes)
        shutil.rmtree(log_dir)
        plain.unlink()
    return samples


def profile_case(case: Case, total_bytes: int, root: Path) -> None:
    """cProfile one Tidelog append and read pass; prints the top functions."""
    batches = build_batches(case.batch_bytes)
    count = max(1, total_bytes // len(batches[0]))
    directory = root / f"profile-{case.name}"
    for title, fn in (
        ("append", lambda: tidelog_append(directory, batches, count)),
        ("read", lambda: tidelog_read(directory, case.batch_bytes)),
    ):
        profiler = cProfile.Profile()
        profiler.enable()
        fn()
        profiler.disable()
        print(f"\n--- cProfile: {title}, {case.name} batches (tottime) ---")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
    shutil.rmtree(directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="~32 MiB per case instead of 256")
    parser.add_argument("--total-mib", type=int, default=None, help="MiB written per case")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (median reported)")
    parser.add_argument("--profile", action="store_true", help="also cProfile Tidelog's side")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args(argv)
    total_mib = args.total_mib or (32 if args.quick else 256)
    reps = args.reps or (3 if args.quick else 7)
    root = Path(tempfile.mkdtemp(prefix="tidelog-bench-", dir=args.dir))
    results: dict[str, float] = {}
    try:
        print(
            f"storage_bench: {total_mib} MiB per case, {reps} repetitions (median), "
            f"{RECORD_BYTES}-byte records, no fsync, in {root}"
        )
        header = (
            f"{'case':<8}{'op':<8}{'tidelog MB/s':>14}{'plain MB/s':>12}{'ratio':>8}{'range':>12}"
        )
        print(header)
        print("-" * len(header))
        for case in CASES:
            samples = run_case(case, total_mib * 1024 * 1024, reps, root)
            for op, mine, theirs in (
                ("append", samples.tidelog_append, samples.plain_append),
                ("read", samples.tidelog_read, samples.plain_read),
            ):
                # The ratio is the median of per-repetition ratios: each pair ran back to
                # back, so drift between repetitions (writeback, reclaim) cancels out.
                ratio = statistics.median(m / t for m, t in zip(mine, theirs, strict=True))
                mine_mbs, theirs_mbs = statistics.median(mine), statistics.median(theirs)
                results[f"{op}_ratio_{case.name}"] = round(ratio, 3)
                spread = f"{min(m / t for m, t in zip(mine, theirs, strict=True)):.2f}-" + (
                    f"{max(m / t for m, t in zip(mine, theirs, strict=True)):.2f}"
                )
                print(
                    f"{case.name:<8}{op:<8}{mine_mbs:>14.0f}{theirs_mbs:>12.0f}{ratio:>8.2f}"
                    f"{spread:>12}"
                )
        if args.profile:
            for case in CASES:
                profile_case(case, min(total_mib, 64) * 1024 * 1024, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    target = 0.7
    for key in ("append_ratio_1mib", "read_ratio_1mib"):
        verdict = "meets" if results[key] >= target else "MISSES"
        print(f"{key} = {results[key]:.2f} {verdict} the {target} target")
    print(
        json.dumps(
            {
                k: results[k]
                for k in (
                    "append_ratio_1mib",
                    "read_ratio_1mib",
                    "append_ratio_16kib",
                    "read_ratio_16kib",
                )
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
