"""``BrokerMetrics`` looks each series' child up once (issue #31: ``labels`` four times a
produce was a tenth of a small produce's broker time); the exposition must say what it
said before, and a deleted topic's series must go and come back from zero."""

from __future__ import annotations

from prometheus_client import generate_latest

from tidelog.broker.core.metrics import BrokerMetrics


def _value(metrics: BrokerMetrics, line_start: str) -> float | None:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    return None


def test_counts_add_up_through_the_cached_children() -> None:
    metrics = BrokerMetrics()
    for _ in range(3):
        metrics.count_in("t", 100, 2)
        metrics.observe_operation("kafka", "produce", "OK", 0.001)
    assert _value(metrics, 'tidelog_bytes_in_total{topic="t"}') == 300
    assert _value(metrics, 'tidelog_records_in_total{topic="t"}') == 6
    labels = 'listener="kafka",operation="produce",outcome="OK"'
    assert _value(metrics, "tidelog_operations_total{" + labels + "}") == 3


def test_a_forgotten_topic_starts_again_from_zero() -> None:
    metrics = BrokerMetrics()
    metrics.count_in("t", 100, 2)
    metrics.forget_topic("t")
    assert _value(metrics, 'tidelog_bytes_in_total{topic="t"}') is None
    metrics.count_in("t", 7, 1)  # the topic created again
    assert _value(metrics, 'tidelog_bytes_in_total{topic="t"}') == 7
    assert _value(metrics, 'tidelog_records_in_total{topic="t"}') == 1
