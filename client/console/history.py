"""Time series the console charts: produce/consume rates and group lag, from polled values.

The console has no metrics store of its own. Each time it looks at the cluster (the
background ``Sampler``, a page view, a live refresh) it hands ``History`` what it saw,
stamped with ``now_ms``: the sum of the log end offsets of every topic (records ever
appended: its growth is the produce rate), the sum of every group's committed offsets
(its growth is the consume rate), and each group's total lag. ``History`` keeps the
samples of the last ``window_ms`` and turns counters into rates per second between
consecutive samples. A counter that goes down (a topic deleted, offsets reset) gives no
rate for that step rather than a negative one.

Pure and clock-free (the caller passes ``now_ms``); thread-safe: one lock guards the
samples, since the web server answers requests on several threads.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["History", "Point", "Series"]

# Samples closer together than this are merged (the latest wins): several requests in
# the same instant must not make rates out of millisecond steps.
_MIN_STEP_MS = 500


@dataclass(frozen=True, slots=True)
class Point:
    """One point of a chart: a wall-clock time in ms and a value (None: unknown)."""

    time_ms: int
    value: float | None


@dataclass(frozen=True, slots=True)
class Series:
    """A named line of a chart."""

    name: str
    points: tuple[Point, ...]


@dataclass(frozen=True, slots=True)
class _Sample:
    time_ms: int
    topic_end_offsets: Mapping[str, int] | None  # None: not looked at
    committed_total: int | None
    group_lag: Mapping[str, int]


class History:
    """The samples of the last ``window_ms``, oldest first. Thread-safe.

    Args:
        window_ms: how far back charts reach (default 10 minutes).
        max_samples: a bound on memory whatever the polling rate.
    """

    def __init__(self, *, window_ms: int = 600_000, max_samples: int = 2_000) -> None:
        if window_ms <= 0 or max_samples < 2:
            raise ValueError("window_ms must be positive and max_samples at least 2")
        self.window_ms = window_ms
        self._samples: deque[_Sample] = deque(maxlen=max_samples)
        self._lock = threading.Lock()

    def record(
        self,
        now_ms: int,
        *,
        topic_end_offsets: Mapping[str, int] | None = None,
        committed_total: int | None = None,
        group_lag: Mapping[str, int] | None = None,
    ) -> None:
        """Add what was seen at ``now_ms``; None: not looked at this time (each rate is
        computed between the samples that have its counter).

        ``topic_end_offsets``: per topic, the sum of its partitions' log end offsets
        (offline partitions left out by the caller). ``committed_total``: the sum of
        every group's committed offsets. ``group_lag``: per group, its total lag.
        """
        with self._lock:
            last = self._samples[-1] if self._samples else None
            if last is not None and now_ms - last.time_ms < _MIN_STEP_MS:
                # Too close to the last sample to make a rate of: merged into it. A
                # counter it already has is kept (its steps stay >= _MIN_STEP_MS); one
                # it lacks is added (one page look records topics, then groups).
                self._samples[-1] = _Sample(
                    time_ms=last.time_ms,
                    topic_end_offsets=_merged(last.topic_end_offsets, topic_end_offsets),
                    committed_total=(
                        last.committed_total
                        if last.committed_total is not None
                        else committed_total
                    ),
                    group_lag={**last.group_lag, **(group_lag or {})},
                )
                return
            self._samples.append(
                _Sample(
                    time_ms=now_ms,
                    topic_end_offsets=(
                        dict(topic_end_offsets) if topic_end_offsets is not None else None
                    ),
                    committed_total=committed_total,
                    group_lag=dict(group_lag or {}),
                )
            )
            while self._samples and self._samples[0].time_ms < now_ms - self.window_ms:
                self._samples.popleft()

    def _snapshot(self) -> list[_Sample]:
        with self._lock:
            return list(self._samples)

    def produce_rate(self) -> Series:
        """Records appended per second, all topics together: per step, the growth of
        each topic seen at both ends (a topic created or deleted in between is left out
        of that step rather than counted as a jump)."""
        points: list[Point] = []
        looked = [s for s in self._snapshot() if s.topic_end_offsets is not None]
        for before, after in itertools.pairwise(looked):
            seconds = (after.time_ms - before.time_ms) / 1000
            start, end = before.topic_end_offsets, after.topic_end_offsets
            if start is None or end is None or seconds <= 0:
                points.append(Point(after.time_ms, None))
                continue
            grown = sum(
                max(0, offset - start[name]) for name, offset in end.items() if name in start
            )
            points.append(Point(after.time_ms, grown / seconds))
        return Series("produced/s", tuple(points))

    def consume_rate(self) -> Series:
        """Offsets committed per second, all groups together."""
        return Series("consumed/s", _rates(self._snapshot(), lambda s: s.committed_total))

    def topic_rates(self) -> dict[str, float]:
        """Per topic, records appended per second over the last two samples that have it."""
        samples = [s for s in self._snapshot() if s.topic_end_offsets is not None]
        rates: dict[str, float] = {}
        if len(samples) < 2:
            return rates
        before, after = samples[-2], samples[-1]
        seconds = (after.time_ms - before.time_ms) / 1000
        if seconds <= 0 or before.topic_end_offsets is None or after.topic_end_offsets is None:
            return rates
        for name, end in after.topic_end_offsets.items():
            previous = before.topic_end_offsets.get(name)
            if previous is not None and end >= previous:
                rates[name] = (end - previous) / seconds
        return rates

    def group_lag(self, group_id: str) -> Series:
        """A group's total lag at each sample that had it."""
        return Series(
            f"lag of {group_id}",
            tuple(
                Point(s.time_ms, float(s.group_lag[group_id]))
                for s in self._snapshot()
                if group_id in s.group_lag
            ),
        )


def _merged(
    kept: Mapping[str, int] | None, seen: Mapping[str, int] | None
) -> dict[str, int] | None:
    """A sample's per-topic counters merged with a look too close after it: the values it
    has stay (its steps stay >= _MIN_STEP_MS), topics it lacks (created since) are added,
    so a topic's first value is not lost and its growth after counts."""
    if kept is None and seen is None:
        return None
    return {**(seen or {}), **(kept or {})}


def _rates(samples: list[_Sample], counter: Callable[[_Sample], int | None]) -> tuple[Point, ...]:
    """Per step between consecutive samples, the counter's growth per second."""
    points: list[Point] = []
    looked = [s for s in samples if counter(s) is not None]
    for before, after in itertools.pairwise(looked):
        start, end = counter(before), counter(after)
        seconds = (after.time_ms - before.time_ms) / 1000
        if start is None or end is None or seconds <= 0 or end < start:
            points.append(Point(after.time_ms, None))
        else:
            points.append(Point(after.time_ms, (end - start) / seconds))
    return tuple(points)
