"""A share partition's in-flight records as **runs**: maximal ranges of consecutive offsets
in one state, with one delivery count and, while acquired, one member and one lock
deadline (``broker.share.partition`` keeps its window as a sorted list of them).

Why ranges (issue #32's acknowledgement overhead): a share partition first held one
object an offset in a dict, and every operation walked the whole window (lock expiry,
the start offset, the window's size), so the broker spent its time on bookkeeping per
offset (``benchmarks/share_bench.py``'s no-work phase: 500 records a poll, four members,
a 2,000-record window). Kafka's ``SharePartition`` keeps one entry per fetched batch and
splits it into per-offset state only when acknowledgements differ inside the batch;
runs are the same idea without the batch boundaries: an acquisition of 500 new records
is one run, its ACCEPT of one range rewrites that run, and a run splits only where the
states differ. Operations cost by the number of runs they touch, not by offsets.

Decisions:

* **Gaps** (offsets that are not records a consumer sees) are no run at all, as they
  were no entry before: a compacted topic's holes cost nothing.
* **Runs are values** (``Run``, a named tuple): an operation plans on a copy of the list
  and the plan is applied by swapping the list in, so a failed plan (an
  acknowledgement refused) changes nothing (``SharePartition`` plans, then applies).
* **Neighbours are joined** only when everything about them is equal (state, count,
  member, deadline): two acquisitions by one member keep their own deadlines (the lock
  expires per record, as Kafka's does).

Pure functions on lists of runs; no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from tidelog.broker.share.records import AVAILABLE, StateBatch

__all__ = ["ACQUIRED", "Run", "diff_durable", "join", "persisted_batches", "split_at"]

ACQUIRED = 1  # Kafka's RecordState id; the others are records.AVAILABLE/ACKNOWLEDGED/ARCHIVED


class Run(NamedTuple):
    """Offsets ``first``..``last`` (inclusive), all in ``state``, each delivered
    ``deliveries`` times; while Acquired, held by ``member`` until ``deadline`` (the caller's
    clock, ms)."""

    first: int
    last: int
    state: int
    deliveries: int
    member: str = ""
    deadline: int = 0

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    @property
    def persisted_state(self) -> int:
        """The state as ``__share_group_state`` keeps it (an acquisition's lock is memory
        only: Acquired is kept as Available)."""
        return AVAILABLE if self.state == ACQUIRED else self.state


def _first(run: Run) -> int:
    return run.first


def split_at(runs: list[Run], offset: int) -> int:
    """Make ``offset`` the start of a run if a run covers it (splitting that run in
    two); returns the index of the first run starting at or after ``offset``."""
    i = bisect_right(runs, offset, key=_first) - 1
    if i >= 0:
        run = runs[i]
        if run.first < offset <= run.last:
            runs[i : i + 1] = [run._replace(last=offset - 1), run._replace(first=offset)]
        if run.first < offset:
            return i + 1
        return i
    return 0


def join(runs: Iterable[Run]) -> list[Run]:
    """``runs`` (sorted, disjoint) with contiguous neighbours equal in everything but
    their offsets joined."""
    out: list[Run] = []
    for run in runs:
        if out:
            last = out[-1]
            if (
                last.last + 1 == run.first
                and last.state == run.state
                and last.deliveries == run.deliveries
                and last.member == run.member
                and last.deadline == run.deadline
            ):
                out[-1] = last._replace(last=run.last)
                continue
        out.append(run)
    return out


def persisted_batches(runs: Iterable[tuple[int, int, int, int]]) -> tuple[StateBatch, ...]:
    """``(first, last, persisted state, count)`` pieces (sorted, disjoint) as state
    batches, contiguous neighbours of equal state and count joined."""
    out: list[list[int]] = []
    for first, last, state, count in runs:
        if out:
            prev = out[-1]
            if prev[1] + 1 == first and prev[2] == state and prev[3] == count:
                prev[1] = last
                continue
        out.append([first, last, state, count])
    return tuple(StateBatch(*piece) for piece in out)


def diff_durable(old: Sequence[Run], new: Sequence[Run], start: int) -> tuple[StateBatch, ...]:
    """The state batches whose persisted form (state, count) differs between ``old`` and
    ``new`` (both sorted and disjoint), at or above ``start``: offsets in ``new`` that
    ``old`` lacks or held otherwise. Offsets ``new`` lacks (dropped) are not written:
    the start offset moving says they are done. One merge walk over both lists."""
    pieces: list[tuple[int, int, int, int]] = []
    i = 0
    n_old = len(old)
    for run in new:
        if run.last < start:
            continue
        first = max(run.first, start)
        want = (run.persisted_state, run.deliveries)
        while i < n_old and old[i].last < first:
            i += 1
        j = i
        offset = first
        while offset <= run.last:
            if j < n_old and old[j].first <= offset:
                o = old[j]
                end = min(o.last, run.last)
                if (o.persisted_state, o.deliveries) != want:
                    pieces.append((offset, end, want[0], want[1]))
                offset = end + 1
                if o.last <= run.last:
                    j += 1
            else:  # not in ``old`` up to the next old run (or the run's end): new
                end = run.last if j >= n_old else min(run.last, old[j].first - 1)
                pieces.append((offset, end, want[0], want[1]))
                offset = end + 1
        i = j
    return persisted_batches(pieces)
