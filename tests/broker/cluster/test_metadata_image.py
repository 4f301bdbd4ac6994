"""The metadata watcher's image (``broker.cluster.metadata._Image``): what a fired watch
makes it forget, a topic's assignment and states together."""

from __future__ import annotations

from tidelog.broker.cluster.metadata import _Image
from tidelog.broker.cluster.znodes import (
    PartitionState,
    TopicAssignment,
    partition_state_path,
    topic_config_path,
    topic_path,
)


def _image(topics: dict[str, int]) -> _Image:
    image = _Image()
    for name, count in topics.items():
        image.assignments[name] = TopicAssignment(
            name, "id", dict.fromkeys(range(count), (1, 2, 3))
        )
        image.configs[name] = {"retention.ms": "1"}
        for p in range(count):
            image.states[(name, p)] = (PartitionState(1, 0, (1, 2, 3), 1), 0, 0)
    return image


def test_any_fired_path_of_a_topic_forgets_its_assignment_and_every_state() -> None:
    image = _image({"a": 50, "b": 50, "c": 4})
    fired = {partition_state_path("a", p) for p in range(0, 50, 3)}
    fired |= {topic_path("c"), topic_config_path("b")}
    image.forget(fired)
    assert set(image.assignments) == {"b"}
    assert {k[0] for k in image.states} == {"b"}
    assert len(image.states) == 50
    assert set(image.configs) == {"a", "c"}  # a state or assignment keeps the config


def test_states_cached_without_their_assignment_are_forgotten_too() -> None:
    image = _image({"a": 3, "b": 2})
    del image.assignments["a"]
    image.forget({partition_state_path("a", 1), partition_state_path("a", 2)})
    assert {k[0] for k in image.states} == {"b"}
