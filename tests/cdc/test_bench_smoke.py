"""Smoke test of ``benchmarks/cdc_bench.py`` at toy sizes: its own PostgreSQL and broker
process, pgbench, ``pg_recvlogical`` and the connector worker all run; every figure is
present and positive (structure, not speed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import cdc_bench  # noqa: E402  (ROOT must be on sys.path first)


@pytest.mark.timeout(240)
def test_the_cdc_benchmark_reports_every_figure() -> None:
    results = cdc_bench.main(
        ["--transactions", "400", "--accounts", "1000", "--rate", "500", "--seconds", "2",
         "--rounds", "1"]
    )  # fmt: skip
    for key in (
        "pgbench_rows_per_s",
        "pg_recvlogical_rows_per_s",
        "psycopg2_read_rows_per_s",
        "psycopg2_decode_rows_per_s",
        "cdc_rows_per_s",
        "cdc_over_pg_recvlogical",
        "steady_rows_per_s",
        "commit_to_visible_p50_ms",
        "commit_to_visible_p99_ms",
    ):
        assert results[key] > 0, key
    # 400 transactions of 5 changes (a delete finds its row: the history is seeded) + marker.
    assert results["flat_out_changes"] == 400 * 5 + 1
    # (main raises when the consumer saw fewer transactions than pgbench committed.)
    assert results["steady_samples"] > 0
    assert results["commit_to_visible_p50_ms"] <= results["commit_to_visible_p99_ms"]
