"""A seeded random fault schedule for the fault harness (issue #29). Pure: no clock, no I/O.

A schedule is a list of ``Step``\\ s, each ``(at_s, kind, duration_s)`` plus what the
nemesis needs to apply it the same way again: which broker it aims at (``role``: the
controller, a partition's leader, or any broker, and ``pick``, an integer that chooses
among the candidates at run time) and the fault's parameters (``params``: netem
settings, a one-way cut's direction, which side ZooKeeper is on). Steps never overlap:
each fault is started at ``at_s`` seconds after the workloads began, healed
``duration_s`` later, and followed by a quiet gap for the cluster to recover before the
next one. ``make_schedule(seed, duration_s)`` draws everything from one
``random.Random(seed)``, so the same seed and duration give the same schedule on any
machine (thread timing and the network stay nondeterministic: a seed replays the
schedule, not necessarily a bug). ``Schedule.describe()`` is the text the run prints and
saves so that a failure can be replayed with ``--seed``.

Coverage: when ``duration_s`` leaves room for one step of every kind at the shortest
fault and gap lengths, the first ``len(kinds)`` steps are every kind once, in a random
order, at lengths scaled down to fit; the rest of the time is filled with kinds drawn at
random. Otherwise as many distinct kinds as fit are drawn. Every step ends (its heal)
before ``duration_s``.

Fault kinds (what each does: ``tests/faults/nemesis.py`` and ``docs/reliability.md``):
``isolate``, ``split``, ``bridge``, ``one-way``, ``zk-cut``, ``peers-cut``, ``netem``,
``kill``, ``pause``, ``restart``, ``rolling-restart``, ``disk-full`` (the brokers' data
directories on small file systems, ``smalldisk``), and ``power-loss`` when the run has a
broker on the lossy file system.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BASE_KINDS",
    "FAULT_KINDS",
    "MIN_FAULT_S",
    "MIN_GAP_S",
    "MIN_STEP_S",
    "ROLLING_MIN_S",
    "Schedule",
    "Step",
    "make_schedule",
]

FAULT_KINDS: tuple[str, ...] = (
    "isolate",  # a minority (one broker) cut from the other brokers and ZooKeeper
    "split",  # brokers split majority/minority, ZooKeeper on one side
    "bridge",  # two sides, one broker sees both
    "one-way",  # a broker drops only inbound, or only outbound, packets from its peers
    "zk-cut",  # the controller or a leader cut from ZooKeeper only
    "peers-cut",  # the reverse: cut from the other brokers, ZooKeeper still reachable
    "netem",  # a slow, lossy, reordering link (tc netem)
    "kill",  # SIGKILL, restarted at heal
    "pause",  # SIGSTOP, SIGCONT at heal
    "restart",  # SIGTERM (graceful), restarted at heal
    "rolling-restart",  # every broker gracefully restarted in turn
    "disk-full",  # a partition's leader's or follower's data disk filled, freed at heal
    "power-loss",  # SIGKILL + the lossy file system forgets unsynced writes, restart
)
BASE_KINDS: tuple[str, ...] = tuple(k for k in FAULT_KINDS if k != "power-loss")
"""The kinds every run can apply (``power-loss`` needs a broker on the lossy file system)."""

_ROLES: dict[str, tuple[str, ...]] = {
    "isolate": ("controller", "leader", "any"),
    "split": ("controller", "leader", "any"),
    "bridge": ("any",),
    "one-way": ("controller", "leader", "any"),
    "zk-cut": ("controller", "leader"),
    "peers-cut": ("controller", "leader"),
    "netem": ("leader", "any"),
    "kill": ("controller", "leader", "any"),
    "pause": ("controller", "leader", "any"),
    "restart": ("controller", "leader", "any"),
    "rolling-restart": ("any",),
    "disk-full": ("leader", "follower"),
    "power-loss": ("lossy",),
}

# The shortest fault and the shortest quiet gap after one: below these a fault is too
# short to be noticed (a ZooKeeper session is 4 s) or the cluster has no time to recover.
MIN_FAULT_S = 4.0
MIN_GAP_S = 3.0
MIN_STEP_S = MIN_FAULT_S + MIN_GAP_S
# Lengths for a long run: long enough for sessions to expire, ISRs to shrink and
# leaders to move, and for clients' retries and timeouts to play out.
LONG_FAULT_S = (6.0, 25.0)
LONG_GAP_S = (5.0, 15.0)
# A rolling restart restarts every broker in turn: it needs time whatever the schedule.
ROLLING_MIN_S = 15.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One fault: start at ``at_s``, heal at ``at_s + duration_s``. Immutable.

    ``role`` says which broker the fault aims at (``controller``, ``leader`` of
    partition ``pick % partitions`` of the queue topic, ``follower``: a replica of that
    partition that does not lead it, ``any`` broker ``pick % n``, or ``lossy``: the
    broker on the lossy file system); ``pick`` also orders the other
    brokers where a fault needs sides. ``params`` are ``(name, value)`` pairs.
    """

    at_s: float
    kind: str
    duration_s: float
    role: str
    pick: int
    params: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}")
        if self.at_s < 0 or self.duration_s <= 0:
            raise ValueError(f"a step starts at >= 0 s and lasts > 0 s: {self}")

    @property
    def end_s(self) -> float:
        return self.at_s + self.duration_s

    def param(self, name: str, default: str = "") -> str:
        return dict(self.params).get(name, default)

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.params)
        return (
            f"{self.at_s:7.1f}s +{self.duration_s:5.1f}s  {self.kind:<15} "
            f"{self.role}#{self.pick}{'  ' + extra if extra else ''}"
        )


@dataclass(frozen=True, slots=True)
class Schedule:
    """A seed and the steps drawn from it. Immutable."""

    seed: int
    duration_s: float
    steps: tuple[Step, ...]

    def kinds(self) -> frozenset[str]:
        return frozenset(step.kind for step in self.steps)

    def describe(self) -> str:
        lines = [
            f"seed {self.seed}, {self.duration_s:.0f} s, {len(self.steps)} step(s), "
            f"{len(self.kinds())} kind(s)"
        ]
        lines.extend("  " + step.describe() for step in self.steps)
        return "\n".join(lines)


def make_schedule(
    seed: int,
    duration_s: float,
    *,
    kinds: Sequence[str] = BASE_KINDS,
    fault_s: tuple[float, float] = LONG_FAULT_S,
    gap_s: tuple[float, float] = LONG_GAP_S,
) -> Schedule:
    """The schedule of ``seed`` for ``duration_s`` seconds of workload (module docstring).

    ``fault_s`` and ``gap_s`` bound each fault's length and the quiet gap after it; when
    every kind would not fit at those lengths, the coverage pass scales them down (never
    below ``MIN_FAULT_S``/``MIN_GAP_S``). Raises ``ValueError`` for an unknown kind, an
    empty ``kinds``, or bounds that are not ordered and at least the minimums.
    """
    if not kinds or any(kind not in FAULT_KINDS for kind in kinds):
        raise ValueError(f"kinds must be a non-empty subset of {FAULT_KINDS}: {kinds}")
    bounds = (("fault_s", fault_s, MIN_FAULT_S), ("gap_s", gap_s, MIN_GAP_S))
    for name, (low, high), floor in bounds:
        if not floor <= low <= high:
            raise ValueError(f"{name} must be ordered and at least {floor}: {(low, high)}")
    if duration_s < 0:
        raise ValueError(f"duration_s must be >= 0: {duration_s}")
    rng = random.Random(seed)
    steps: list[Step] = []
    now = 0.0
    # Coverage pass: every kind once, at lengths that let all of them fit.
    order = list(dict.fromkeys(kinds))
    rng.shuffle(order)
    needed = sum(_shortest(kind) + MIN_GAP_S for kind in order)
    if needed <= duration_s:
        # Each step's length above the minimums, shrunk by one factor so that all fit.
        extras = [
            (
                max(0.0, rng.uniform(*fault_s) - _shortest(kind)),
                max(0.0, rng.uniform(*gap_s) - MIN_GAP_S),
            )
            for kind in order
        ]
        total = sum(fault + gap for fault, gap in extras)
        scale = 1.0 if needed + total <= duration_s else (duration_s - needed) / total
        for kind, (fault_extra, gap_extra) in zip(order, extras, strict=True):
            fault = _shortest(kind) + fault_extra * scale
            steps.append(_step(rng, kind, now, fault))
            now += fault + MIN_GAP_S + gap_extra * scale
    else:
        for kind in order:
            if now + _shortest(kind) + MIN_GAP_S > duration_s:
                continue
            steps.append(_step(rng, kind, now, _shortest(kind)))
            now += _shortest(kind) + MIN_GAP_S
    # Fill the rest at the full lengths.
    while True:
        kind = rng.choice(order)
        fault = max(_shortest(kind), rng.uniform(*fault_s))
        gap = rng.uniform(*gap_s)
        if now + fault > duration_s:
            break
        steps.append(_step(rng, kind, now, fault))
        now += fault + gap
    return Schedule(seed, float(duration_s), tuple(steps))


def _shortest(kind: str) -> float:
    return ROLLING_MIN_S if kind == "rolling-restart" else MIN_FAULT_S


def _step(rng: random.Random, kind: str, at_s: float, duration_s: float) -> Step:
    role = rng.choice(_ROLES[kind])
    pick = rng.randrange(1_000)
    params: tuple[tuple[str, str], ...] = ()
    if kind == "split":
        params = (("zookeeper", rng.choice(("majority", "minority"))),)
    elif kind == "one-way":
        params = (("drop", rng.choice(("inbound", "outbound"))),)
    elif kind == "netem":
        delay = rng.choice((20, 50, 100, 200))
        params = (
            ("delay_ms", str(delay)),
            ("jitter_ms", str(delay // 4)),
            ("loss_percent", str(rng.choice((0, 1, 5, 20)))),
            ("reorder_percent", str(rng.choice((0, 10, 25)))),
        )
    # Rounded down to 0.1 s, so printed steps are the steps and still end in time.
    return Step(
        at_s=math.floor(at_s * 10) / 10,
        kind=kind,
        duration_s=max(0.1, math.floor(duration_s * 10) / 10),
        role=role,
        pick=pick,
        params=params,
    )
