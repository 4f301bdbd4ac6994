"""``History``: rates from polled counters, on explicit times (no clock, no sleep)."""

from __future__ import annotations

import pytest

from tidelog.client.console.history import History


def values(series: object) -> list[float | None]:
    return [p.value for p in series.points]  # type: ignore[attr-defined]


def test_produce_rate_per_topic_growth_ignores_created_and_deleted_topics() -> None:
    history = History()
    history.record(0, topic_end_offsets={"a": 10})
    history.record(1_000, topic_end_offsets={"a": 30, "b": 500})  # b new: not a jump
    history.record(2_000, topic_end_offsets={"b": 510})  # a deleted: not a drop
    history.record(4_000, topic_end_offsets={"b": 530})
    assert values(history.produce_rate()) == [20.0, 10.0, 10.0]
    assert history.topic_rates() == {"b": 10.0}


def test_samples_too_close_merge_and_counters_are_rated_between_their_own_samples() -> None:
    history = History()
    history.record(0, topic_end_offsets={"a": 0})
    history.record(10, committed_total=0, group_lag={"g": 5})  # same look: merged
    history.record(1_000, group_lag={"g": 7})  # a group page alone
    history.record(2_000, topic_end_offsets={"a": 100})
    history.record(2_010, committed_total=50, group_lag={"g": 2})
    assert values(history.produce_rate()) == [50.0]
    assert values(history.consume_rate()) == [25.0]
    assert values(history.group_lag("g")) == [5.0, 7.0, 2.0]
    assert values(history.group_lag("other")) == []


def test_a_counter_going_down_gives_no_rate_and_old_samples_leave_the_window() -> None:
    history = History(window_ms=10_000)
    history.record(0, committed_total=100)
    history.record(1_000, committed_total=40)  # offsets reset
    history.record(2_000, committed_total=60)
    assert values(history.consume_rate()) == [None, 20.0]
    history.record(20_000, committed_total=80)
    assert values(history.consume_rate()) == []  # one sample left in the window


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="window_ms"):
        History(window_ms=0)


def test_a_topic_first_seen_in_a_merged_look_keeps_its_first_value() -> None:
    """A look too close after the last sample is merged into it; a topic created in
    between must keep the value it had then, so its growth afterwards is a rate."""
    history = History(window_ms=60_000)
    history.record(0, topic_end_offsets={"old": 5})
    history.record(100, topic_end_offsets={"old": 5, "new": 0})  # merged: too close
    history.record(2_000, topic_end_offsets={"old": 5, "new": 50})
    points = history.produce_rate().points
    assert [p.value for p in points] == [25.0]
