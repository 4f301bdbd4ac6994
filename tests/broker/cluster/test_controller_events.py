"""The controller's burst coalescing (``broker.cluster.controller_events``), pure."""

from __future__ import annotations

import queue

from tidelog.broker.cluster.controller_events import (
    URGENT,
    Event,
    UrgentLane,
    answer_merged,
    coalesce,
    take_burst,
)
from tidelog.broker.core.placement import NewTopic
from tidelog.storage.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError


def _create(*names: str) -> Event:
    return Event("create_topics", items=[NewTopic(n, 1, 1, {}) for n in names])


def test_a_burst_runs_each_decision_once_at_its_last_place_and_merges_adjacent_batches() -> None:
    call = Event("call", lambda: None)
    first, second = _create("a"), _create("b", "c")
    drop, keep = Event("delete_topics", items=["x"]), Event("delete_topics", items=["y"])
    burst = [
        Event("brokers"),
        first,
        second,
        Event("brokers"),
        call,
        drop,
        keep,
        Event("election"),
        Event("stop"),
        Event("brokers"),
    ]
    handled = coalesce(burst)
    assert [e.kind for e in handled] == [
        "create_topics",
        "brokers",
        "call",
        "delete_topics",
        "election",
        "stop",
    ]
    merged = handled[0]
    assert merged.merged == [first, second]
    assert [s.name for s in merged.items] == ["a", "b", "c"]
    assert handled[2] is call
    assert handled[3].items == ["x", "y"]
    assert handled[1] is burst[3]  # the later one: it reads after everything before it


def test_batches_apart_stay_apart_and_a_lone_one_is_not_wrapped() -> None:
    one, two = _create("a"), _create("b")
    handled = coalesce([one, Event("call", lambda: None), two])
    assert handled[0] is one
    assert handled[2] is two
    assert not one.merged
    assert not two.merged


def test_each_merged_caller_gets_its_own_answers_and_a_contested_name_once() -> None:
    first, second = _create("a", "shared"), _create("shared", "b")
    (merged,) = coalesce([first, second])
    answer_merged(merged, {"a": "A", "shared": "S", "b": "B"})
    assert first.result.result(0) == {"a": "A", "shared": "S"}
    got = second.result.result(0)
    assert got["b"] == "B"
    assert isinstance(got["shared"], TopicAlreadyExistsError)

    gone, again = Event("delete_topics", items=["t"]), Event("delete_topics", items=["t"])
    (merged,) = coalesce([gone, again])
    answer_merged(merged, {"t": None})
    assert gone.result.result(0) == {"t": None}
    assert isinstance(again.result.result(0)["t"], UnknownTopicOrPartitionError)


def test_take_burst_takes_what_is_queued_now() -> None:
    events: queue.Queue[Event] = queue.Queue()
    later = [Event("brokers"), Event("reassign")]
    for event in later:
        events.put(event)
    first = Event("election")
    assert take_burst(events, first) == [first, *later]
    assert events.empty()


def test_urgent_calls_wait_in_their_lane_and_their_wake_ups_are_not_handled() -> None:
    events: queue.Queue[Event] = queue.Queue()
    lane = UrgentLane(events)
    ordinary = Event("brokers")
    events.put(ordinary)
    urgent = [Event("call", lambda: 1), Event("call", lambda: 2)]
    for call in urgent:
        lane.put(call)
    assert lane.take() == urgent
    assert lane.take() == []
    burst = take_burst(events, events.get_nowait())
    assert [e.kind for e in burst] == ["brokers", URGENT, URGENT]  # the idle thread woke
    assert coalesce(burst) == [ordinary]
