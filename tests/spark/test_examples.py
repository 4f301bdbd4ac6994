"""The examples run end to end: demo producer, then the stream-table join, briefly."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import ROOT, consume_all
from tidelog.broker.testing import InProcessBroker

pytestmark = [
    pytest.mark.spark,
]


def test_demo_producer_and_enrich_join(
    spark: Any, broker: InProcessBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import demo_producer
    import enrich_join
    import sessionization
    import windowed_counts

    demo_producer.main(["--bootstrap", broker.address, "--count", "120", "--rate", "100000"])
    queries = enrich_join.start_queries(spark, broker.address, str(tmp_path))
    try:
        queries[0].processAllAvailable()
    finally:
        for query in queries:
            query.stop()
    out = consume_all(broker.address, enrich_join.OUTPUT, 2)
    assert len(out) == 120
    docs = [json.loads(r.value) for r in out]
    assert all(d["profile"]["user"] == d["view"]["user"] for d in docs)
    assert {r.key for r in out} <= {b"user-%d" % n for n in range(50)}

    # The windowed and session jobs start and read every view (their windows stay open:
    # the demo's event times are recent, so nothing is final yet).
    queries = windowed_counts.start_queries(spark, broker.address, str(tmp_path))
    queries += sessionization.start_queries(spark, broker.address, str(tmp_path))
    try:
        for query in queries:
            query.processAllAvailable()
            assert sum(p["numInputRows"] for p in query.recentProgress) == 120
    finally:
        for query in queries:
            query.stop()
    for name in ("_common", "demo_producer", "enrich_join", "sessionization", "windowed_counts"):
        sys.modules.pop(name, None)


def test_device_clocks_counts_by_raw_and_by_corrected_time(
    spark: Any, broker: InProcessBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import device_clocks

    try:
        assert device_clocks.send_events(broker.address, events_per_phone=10) == 60
        raw, corrected = device_clocks.window_counts(spark, broker.address)
        assert sum(r["count"] for r in raw) == sum(r["count"] for r in corrected) == 60

        def span_minutes(rows: list[Any]) -> float:
            starts = [r["start"] for r in rows]
            return (max(starts) - min(starts)).total_seconds() / 60

        # Raw device times scatter over the phones' skews (six hours apart); corrected
        # times fall within the five minutes the events happened in (plus window edges).
        assert span_minutes(raw) >= 6 * 60 - 5
        assert span_minutes(corrected) <= 6
        table = device_clocks.side_by_side(raw, corrected)
        assert "window (raw device time)" in table
        assert "window (corrected time)" in table
    finally:
        for name in ("_common", "device_clocks"):
            sys.modules.pop(name, None)
