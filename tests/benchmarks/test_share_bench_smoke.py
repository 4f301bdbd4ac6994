"""Smoke test of ``benchmarks/share_bench.py`` at toy sizes: its broker process, member
processes of a consumer group and of a share group, every phase run; every figure is
present and positive, and each side's work went where it should (structure, not speed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import share_bench  # noqa: E402  (ROOT must be on sys.path first)


@pytest.mark.timeout(180)
def test_the_share_benchmark_reports_every_figure() -> None:
    results = share_bench.main(["--quick"])
    for key in (
        "group_records_per_s",
        "share_records_per_s",
        "group_flat_records_per_s",
        "share_flat_records_per_s",
        "share_over_group_throughput",
        "share_ack_over_group",
        "fsync_p50_ms",
        "share_poll_ms",
        "share_commit_ms",
    ):
        assert results[key] > 0, key
    members = results["members"]
    # A consumer group works on two partitions with two members; a share group with all.
    assert results["group_working_members"] == 2
    assert results["share_working_members"] == members
    # The no-work phases drain their whole backlog.
    assert results["group_flat_records"] == results["share_flat_records"] == 5_000
