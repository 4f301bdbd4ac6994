"""Smoke test of the peer comparison harness (``benchmarks/run.py``), Tidelog only.

Runs the real harness end to end at toy sizes: a broker process on 127.0.0.1 with a
temporary data directory, every workload in a worker process, then the JSON, markdown and
(when matplotlib is installed) chart outputs. Never installs anything and never starts NATS
or Redis, so it passes on machines without them; it checks structure, never speed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import run as harness  # noqa: E402  (ROOT must be on sys.path first)
from benchmarks.peers import report  # noqa: E402


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, object], Path]:
    out = tmp_path_factory.mktemp("bench-results")
    settings = harness.parse_settings(
        [
            "--quick", "--no-install", "--peers", "tidelog", "--value-sizes", "100",
            "--records", "2000", "--samples", "30", "--partition-counts", "1,4",
            "--backlog-bytes", "400000", "--backlog-step-bytes", "100000",
            "--out", str(out),
        ]
    )  # fmt: skip
    doc = harness.run(settings)
    return doc, out


@pytest.mark.timeout(60)
def test_results_json_has_every_workload(results: tuple[dict[str, object], Path]) -> None:
    doc, out = results
    assert doc["errors"] == []
    saved = json.loads((out / "results.json").read_text())
    assert saved["schema"] == 1
    assert saved["quick"] is True
    machine = saved["machine"]
    for key in ("cpu_count", "cpu_model", "kernel", "python", "loadavg_start", "loadavg_end"):
        assert machine[key], key
    assert set(saved["peers"]) == {"tidelog", "tidelog-acks1"}
    assert saved["reference"]["grpc_floor"]["grpc_roundtrip_p50_ms"] > 0
    assert saved["peers"]["tidelog"]["skipped"] is None
    assert "fsync" in saved["peers"]["tidelog"]["configuration"]["durability"]
    kinds = {(entry["peer"], entry["workload"]) for entry in saved["results"]}
    assert kinds == {
        ("tidelog", "produce"),
        ("tidelog", "consume"),
        ("tidelog", "latency"),
        ("tidelog", "end_to_end"),
        ("tidelog", "partitions"),
        ("tidelog", "backlog"),
        ("tidelog-acks1", "produce"),
        ("tidelog-acks1", "latency"),
        ("tidelog-acks1", "end_to_end"),
    }
    for entry in saved["results"]:
        figures = entry["figures"]
        if entry["workload"] in ("produce", "consume"):
            assert figures["records"] == 2000
            assert figures["records_per_s"] > 0
            assert figures["server_cpu_s"] >= 0
            if entry["workload"] == "consume":
                # The bare FetchStream reached the end of the same records.
                bare = figures["bare_fetch_stream"]
                assert bare["records"] == 2000
                assert bare["fetches"] >= 1
                assert bare["wire_mb_per_s"] >= bare["mb_per_s"] > 0
        elif entry["workload"] in ("latency", "end_to_end"):
            assert figures["samples"] == 30
            assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["p999_ms"]
        elif entry["workload"] == "partitions":
            assert entry["partitions"] in (1, 4)
            assert figures["consume"]["records"] == 2000
        else:
            assert len(figures["steps"]) == 4
            assert figures["summary"]["steps"] == 4


@pytest.mark.timeout(60)
def test_markdown_and_charts(results: tuple[dict[str, object], Path]) -> None:
    _doc, out = results
    text = (out / "results.md").read_text()
    for heading in (
        "## Peers",
        "### Produce throughput",
        "### Consume throughput",
        "### Produce latency",
        "### End-to-end latency",
        "### Where the time goes",
        "### Tidelog with 1, 4 and 16 partitions",
        "### Tidelog append rate as the retained backlog grows",
    ):
        assert heading in text, heading
    assert "| Tidelog acks=1 |" in text
    assert "bare `FetchStream`" in text
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return  # the bench extra is not installed: no charts, and the harness says so
    for name in ("throughput.png", "latency.png", "backlog.png", "partitions.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG"), name
        assert f"]({name})" in text


def test_backlog_summary_is_pure() -> None:
    points = [{"mb_per_s": 100.0}, {"mb_per_s": 90.0}, {"mb_per_s": 110.0}]
    summary = report.backlog_summary(points)
    assert summary == {
        "steps": 3,
        "median_mb_per_s": 100.0,
        "first_half_median_mb_per_s": 100.0,
        "second_half_median_mb_per_s": 100.0,
        "first_mb_per_s": 100.0,
        "last_mb_per_s": 110.0,
        "min_mb_per_s": 90.0,
        "max_mb_per_s": 110.0,
        "last_over_first": 1.1,
    }


def test_a_missing_server_skips_its_peer_without_installing() -> None:
    from benchmarks.peers.common import ensure_debian_packages

    missing = ensure_debian_packages({"no-such-server-binary": "no-such-package"}, False)
    assert "installing is off" in missing["no-such-server-binary"]
