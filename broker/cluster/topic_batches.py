"""CreateTopics, DeleteTopics and CreatePartitions of many topics, on any broker of a
cluster (issue #34).

``ClusterNode.create_topics`` / ``delete_topics`` (the core's ``TopicAdmin`` seam) hand
the whole request to the controller as **one** call (here, or forwarded as one
``Envelope``: ``broker.cluster.forwarding``), which writes every topic in one batch
(``TopicChanges.create_many``), then wait on this broker's own view, which the metadata
watcher keeps from watches (``broker.cluster.metadata``), for all of them at once.

Decided, as Kafka's ``ZkAdminManager`` with its ``DelayedCreateTopics``:

* a created topic is answered once this broker's view shows it with **every partition
  led** (and its local logs made: the watcher's listener runs before a view is
  published); a deleted one once the view no longer lists it;
* at ``timeout_ms`` every topic still pending gets ``REQUEST_TIMED_OUT``
  (``KafkaTimeoutError``, retriable): it was written and will still appear (or go);
  ``timeout_ms <= 0`` answers as soon as the controller wrote them, without waiting
  (Kafka: "the request returns immediately"); the call that only started the creation
  then answers ``None`` for the topic rather than a view;
* an error the controller gave (exists, bad assignment...) is that topic's alone; a
  ZooKeeper failure the controller met for one topic is ``NOT_CONTROLLER`` (retriable),
  as for a whole call.

Forwarded answers travel as JSON: per topic ``null`` or ``[code, message]``.

Thread-safe: no state of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tidelog.broker.cluster.controller import Controller
from tidelog.broker.cluster.metadata import ClusterMetadata, MetadataWatcher
from tidelog.broker.cluster.znodes import NO_LEADER
from tidelog.broker.core.placement import Growth, NewTopic
from tidelog.storage.errors import (
    KafkaTimeoutError,
    NotControllerError,
    TidelogError,
    error_for_code,
)

__all__ = [
    "TopicBatches",
    "decode_outcomes",
    "encode_new_topics",
    "run_create_partitions",
    "run_create_topics",
    "run_delete_topics",
]

Json = Any


def encode_new_topics(specs: Sequence[NewTopic]) -> Json:
    return [
        {
            "name": s.name,
            "partitions": s.partitions,
            "replication_factor": s.replication_factor,
            "config": dict(s.config),
            "assignment": None if s.manual is None else [[p, list(r)] for p, r in s.manual],
        }
        for s in specs
    ]


def _decode_new_topics(value: Json) -> list[NewTopic]:
    return [
        NewTopic(
            str(t["name"]),
            int(t["partitions"]),
            int(t["replication_factor"]),
            {str(k): str(v) for k, v in dict(t["config"]).items()},
            None
            if t.get("assignment") is None
            else [(int(p), tuple(int(b) for b in r)) for p, r in t["assignment"]],
        )
        for t in value
    ]


def _encode_outcomes(outcomes: Mapping[str, object]) -> Json:
    out: dict[str, Json] = {}
    for name, outcome in outcomes.items():
        if isinstance(outcome, TidelogError):
            out[name] = [outcome.code, str(outcome)]
        elif isinstance(outcome, Exception):  # ZooKeeper failed for it: retriable
            out[name] = [
                NotControllerError.code,
                f"the controller cannot reach ZooKeeper: {outcome}",
            ]
        else:
            out[name] = None
    return out


def decode_outcomes(value: Json) -> dict[str, Exception | None]:
    """A forwarded ``create_topics`` / ``delete_topics`` answer: per topic None or the
    error, rebuilt from its code."""
    return {
        str(name): None if found is None else error_for_code(str(found[0]), str(found[1]))
        for name, found in dict(value).items()
    }


def run_create_topics(controller: Controller, a: Mapping[str, Json]) -> Json:
    """The controller's half of a (forwarded) ``create_topics``."""
    return _encode_outcomes(controller.create_topics(_decode_new_topics(a["topics"])))


def run_create_partitions(controller: Controller, a: Mapping[str, Json]) -> Json:
    """The controller's half of a (forwarded) ``create_partitions_many``."""
    growths = [
        Growth(
            str(g["name"]),
            int(g["total"]),
            None
            if g.get("assignment") is None
            else [tuple(int(b) for b in r) for r in g["assignment"]],
        )
        for g in a["growths"]
    ]
    return _encode_outcomes(controller.create_partitions_many(growths))


def run_delete_topics(controller: Controller, a: Mapping[str, Json]) -> Json:
    """The controller's half of a (forwarded) ``delete_topics``."""
    return _encode_outcomes(controller.delete_topics([str(n) for n in a["names"]]))


def _led(view: ClusterMetadata, name: str, total: int = 0) -> bool:
    topic = view.topics.get(name)
    if topic is None or topic.assignment.partition_count < total:
        return False
    return all(
        topic.states.get(p) is not None and topic.leader(p) != NO_LEADER
        for p in topic.assignment.replicas
    )


class TopicBatches:
    """Runs batches on the controller (``on_controller``: the node's forwarder) and
    waits for this broker's view (the module docstring's rules)."""

    def __init__(
        self, on_controller: Callable[[str, Mapping[str, Json]], Json], watcher: MetadataWatcher
    ) -> None:
        self._on_controller = on_controller
        self._watcher = watcher

    def create_topics(
        self, specs: Sequence[NewTopic], timeout_ms: int
    ) -> dict[str, Exception | None]:
        """Per topic None (created, and led here unless ``timeout_ms <= 0``) or its
        error. Raises what the forwarded call raises as a whole (``NotControllerError``,
        ``KafkaTimeoutError``)."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        answer = decode_outcomes(
            self._on_controller("create_topics", {"topics": encode_new_topics(specs)})
        )
        created = [name for name, error in answer.items() if error is None]
        if timeout_ms > 0:
            self._wait(created, lambda view, name: _led(view, name), deadline, answer, "led")
        return answer

    def create_partitions(
        self, growths: Sequence[Growth], timeout_ms: int
    ) -> dict[str, Exception | None]:
        """Per topic None (grown, every partition led here unless ``timeout_ms <= 0``)
        or its error."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        encoded = [
            {
                "name": g.name,
                "total": g.total,
                "assignment": None if g.manual is None else [list(r) for r in g.manual],
            }
            for g in growths
        ]
        answer = decode_outcomes(
            self._on_controller("create_partitions_many", {"growths": encoded})
        )
        totals = {g.name: g.total for g in growths}
        grown = [name for name, error in answer.items() if error is None]
        if timeout_ms > 0:
            self._wait(
                grown, lambda view, name: _led(view, name, totals[name]), deadline, answer, "grown"
            )
        return answer

    def delete_topics(self, names: Sequence[str], timeout_ms: int) -> dict[str, Exception | None]:
        """Per topic None (deleted, and gone from this broker's view unless
        ``timeout_ms <= 0``) or its error."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        answer = decode_outcomes(self._on_controller("delete_topics", {"names": list(names)}))
        deleted = [name for name, error in answer.items() if error is None]
        if timeout_ms > 0:
            self._wait(
                deleted, lambda view, name: name not in view.topics, deadline, answer, "deleted"
            )
        return answer

    def _wait(
        self,
        names: Sequence[str],
        done: Callable[[ClusterMetadata, str], bool],
        deadline: float,
        answer: dict[str, Exception | None],
        what: str,
    ) -> None:
        if not names:
            return
        left_ms = max(int((deadline - time.monotonic()) * 1000), 0)
        self._watcher.wait_for(lambda view: all(done(view, n) for n in names), left_ms)
        view = self._watcher.snapshot
        for name in names:
            if not done(view, name):
                answer[name] = KafkaTimeoutError(
                    f"topic {name!r} was not {what} on this broker within the request's "
                    "timeout; it will be"
                )
