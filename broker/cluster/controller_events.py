"""The controller's event queue: events, and how a burst of them is coalesced.

As Kafka's ``ControllerEventManager``, kazoo's callbacks and admin calls only put events
on one queue, and one thread takes them in order. Issue #34: under a burst (a
CreateTopics of hundreds of topics, many clients creating topics at once, a broker
flapping) handling each event alone repeats work that one pass does for all, so the
event thread takes everything queued at once (``take_burst``) and coalesces it
(``coalesce``) before handling it:

* a re-read-and-decide event (``brokers``, ``election``, ``reassign``, ``rebalance``,
  ``min_isr_default``) queued several times runs once, at its **last** position: each
  run re-reads everything from ZooKeeper, so the last one sees all that the earlier
  ones would have (Kafka coalesces its ``BrokerChange`` and ``TopicChange`` events the
  same way: the handler reads the current children, not the event's);
* adjacent batchable calls of the same kind (``create_topics``, ``delete_topics``,
  ``create_partitions``) are
  merged into one, whose items are the union in order: one pipelined read, one
  round of transactions (``broker.cluster.topic_changes``), each caller answered with
  its own items' results. Only adjacent ones: a call never moves past another event, so
  a delete queued after a create of the same topic still runs after it.

``stop`` ends the burst: what follows it is not handled.

**Urgent calls** (``UrgentLane``): a controlled shutdown is asked by a broker that stops
within its 15 s bound whatever the answer (``ClusterNode.stop``). At 10,000 partitions a
``brokers`` event after a restart ran 13-40 s (issue #34): a shutdown queued behind it
always timed out and its leaderships moved only when the broker's session ended. Urgent
calls go to their own lane, which the event thread serves before each event and between
the write rounds of a long one (``election_writes``). Safe because what they decide is
written by compare-and-set at the versions they read: an event's remaining writes for a
partition an urgent call changed meanwhile fail alone and are decided again from a fresh
read (a ``brokers`` event), as any concurrent change. Kafka's ZooKeeper-era controller
queues ``ControlledShutdown`` with its other events; its events are shorter.

Not thread-safe by itself: the controller's event thread is its only user.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from tidelog.storage.errors import (
    InvalidPartitionsError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

__all__ = ["BATCHED", "URGENT", "Event", "UrgentLane", "answer_merged", "coalesce", "take_burst"]

# Call kinds whose items a merged event handles together; any other kind but "call" and
# "stop" is a re-read-and-decide event.
BATCHED = frozenset({"create_topics", "delete_topics", "create_partitions"})
# The wake-up an urgent call leaves in the main queue (the call itself is in the lane).
URGENT = "urgent"


@dataclass(slots=True)
class Event:
    """``kind``: ``call`` (run ``run``), one of ``BATCHED`` (``items``, answered with a
    dict by item key), ``stop``, or a re-read-and-decide kind. ``merged``: the events a
    batched event stands for (their futures get their share of the answer)."""

    kind: str
    run: Callable[[], Any] | None = None
    result: Future[Any] = field(default_factory=Future)
    items: list[Any] = field(default_factory=list)
    merged: list[Event] = field(default_factory=list)


class UrgentLane:
    """Urgent calls, taken ahead of the main queue's events (the module docstring).
    Thread-safe: any thread puts, the event thread takes."""

    def __init__(self, events: queue.Queue[Event]) -> None:
        self._events = events
        self._urgent: queue.Queue[Event] = queue.Queue()

    def put(self, event: Event) -> None:
        """Queue ``event`` (a ``call``) and wake the event thread if it is idle."""
        self._urgent.put(event)
        self._events.put(Event(URGENT))

    def take(self) -> list[Event]:
        """Every urgent call queued now, oldest first."""
        return take_burst(self._urgent, None)


def take_burst(events: queue.Queue[Event], first: Event | None) -> list[Event]:
    """``first`` (if any) and everything queued behind it now."""
    burst = [] if first is None else [first]
    while True:
        try:
            burst.append(events.get_nowait())
        except queue.Empty:
            return burst


def coalesce(burst: list[Event]) -> list[Event]:
    """The burst as it is handled (the module docstring's rules)."""
    burst = [e for e in burst if e.kind != URGENT]  # wake-ups: the lane is served first
    if any(e.kind == "stop" for e in burst):
        burst = burst[: next(i for i, e in enumerate(burst) if e.kind == "stop") + 1]
    last_at = {e.kind: i for i, e in enumerate(burst) if _is_decide(e.kind)}
    out: list[Event] = []
    for i, event in enumerate(burst):
        if _is_decide(event.kind) and last_at[event.kind] != i:
            continue
        previous = out[-1] if out else None
        if event.kind in BATCHED and previous is not None and previous.kind == event.kind:
            if not previous.merged:
                previous = Event(previous.kind, items=list(previous.items), merged=[previous])
                out[-1] = previous
            previous.items.extend(event.items)
            previous.merged.append(event)
            continue
        out.append(event)
    return out


def _is_decide(kind: str) -> bool:
    return kind not in BATCHED and kind not in ("call", "stop")


def answer_merged(event: Event, results: Mapping[str, Any]) -> None:
    """Answer each caller a (merged) batched event stands for with its own items'
    results, by topic name: the first caller to name a topic gets its result, a later
    one the error a second request would have got."""
    claimed: set[str] = set()
    for each in event.merged or [event]:
        answer: dict[str, Any] = {}
        for item in each.items:
            name = item if isinstance(item, str) else str(item.name)
            if name in answer:
                continue  # named twice by one caller: one answer (its handler refuses it)
            if name in claimed:
                answer[name] = _contested(event.kind, name)
            else:
                answer[name] = results.get(name)
        claimed.update(answer)
        each.result.set_result(answer)


def _contested(kind: str, name: str) -> Exception:
    """What a caller gets for a topic an earlier caller of the same batch named: what
    its request would have met right after the other's."""
    if kind == "create_topics":
        return TopicAlreadyExistsError(f"topic {name!r} already exists")
    if kind == "delete_topics":
        return UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
    return InvalidPartitionsError(f"topic {name!r} was grown by another request meanwhile; retry")
