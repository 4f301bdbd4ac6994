"""A follower's incremental fetch session on the leader (issue #34), against real logs, the
replica manager and the fetch path, with a manual clock.

An incremental follower fetch skips the partitions the follower is idle on
(``Partition.follower_idle``): what is checked is that skipping loses nothing a read
did. The idle follower stays in the ISR (its caught-up time is refreshed; without a
fetch the same clock shrinks the ISR), an append to an idle partition wakes a parked
session fetch and is answered, a leadership that moved away answers its error, a caught-up
follower outside the ISR is still proposed for it, and the answers hold only what moved.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.broker.cluster.test_replicas import IsrWrites, eventually
from tests.broker.conftest import make_batch
from tidelog.broker.cluster.fetcher import FetcherPool
from tidelog.broker.cluster.metadata import ClusterMetadata, TopicMetadata
from tidelog.broker.cluster.replicas import ReplicaManager, ReplicaSettings
from tidelog.broker.cluster.znodes import BrokerRegistration, PartitionState, TopicAssignment
from tidelog.broker.core.delayed import Purgatory
from tidelog.broker.core.fetch import (
    DelayedFetch,
    FetchPath,
    FetchSpec,
    PartitionFetched,
    PartitionFetchSpec,
)
from tidelog.broker.core.fetch_sessions import FetchSession, FetchSessionCache, Update, answered
from tidelog.broker.core.metrics import BrokerMetrics
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.storage.clock import ManualClock
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.records import iter_batch_headers

TOPIC = "s"
ME, FOLLOWER = 1, 2
EPOCH = ME  # every leadership's epoch is its leader's id (Leader.view)
PARTITIONS = 4
LAG_MS = 1_000


class Leader:
    """Broker ``ME`` leading every partition of ``TOPIC``, with its fetch path."""

    def __init__(self, root: Path, clock: ManualClock) -> None:
        self.clock = clock
        self.logs = LogManager.open(root, LogManagerConfig(), clock)
        self.logs.create_topic(TOPIC, PARTITIONS, {})
        self.partitions = PartitionRegistry(self.logs, ME, clock, replicated=True)
        self.isr_writes = IsrWrites()
        self.replicas = ReplicaManager(
            ReplicaSettings(ME, replica_lag_time_max_ms=LAG_MS),
            self.partitions,
            clock,
            self.isr_writes,
            FetcherPool(ME, self.partitions, lambda _b: None),
        )
        self.purgatory: Purgatory[tuple[str, int]] = Purgatory("fetch", clock)
        self.path = FetchPath(
            self.partitions,
            self.purgatory,
            BrokerMetrics(),
            clock,
            fetch_max_bytes=1 << 20,
            fetch_max_wait_ms=60_000,
        )
        self.sessions = FetchSessionCache(10, 120_000, clock.monotonic_ms)
        self.replicas.start()

    def view(self, leaders: dict[int, int] | None = None, isr: Sequence[int] = (1, 2)) -> None:
        """Leaders by partition (default: this broker), epoch 1 + the leader's id."""
        leaders = leaders or {}
        brokers = {b: BrokerRegistration(b, "127.0.0.1", 1000 + b) for b in (1, 2)}
        states = {}
        for p in range(PARTITIONS):
            leader = leaders.get(p, ME)
            states[p] = PartitionState(leader, leader, tuple(isr), 1)
        topic = TopicMetadata(
            TopicAssignment(TOPIC, "id", dict.fromkeys(range(PARTITIONS), (1, 2))), states, {}
        )
        self.replicas.apply(ClusterMetadata(brokers, 1, {TOPIC: topic}))

    def append(self, partition: int, value: bytes) -> None:
        self.logs.get_log(TOPIC, partition).append(make_batch([value]), leader_epoch=ME)
        self.replicas.after_append(TOPIC, partition)
        self.path.on_append(TOPIC, partition)

    def close(self) -> None:
        self.replicas.stop()
        self.purgatory.close()
        self.logs.close()


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    made = Leader(tmp_path, ManualClock())
    yield made
    made.close()


class Follower:
    """The follower's side of one session: its log ends, as it fetched them."""

    def __init__(self, leader: Leader) -> None:
        self.leader = leader
        self.ends = dict.fromkeys(range(PARTITIONS), 0)
        self.session: FetchSession | None = None
        self.woken = 0

    def fetch(self, named: Sequence[int] | None = None, max_wait_ms: int = 0) -> Answers | None:
        """A session fetch naming ``named`` (None: a full one, opening the session): the
        answers by partition, or None if it parked (``woken`` counts its wake-ups)."""
        leader = self.leader
        parts = range(PARTITIONS) if named is None else named
        updates = [Update((TOPIC, p), self.ends[p], 0, EPOCH, -1, 0) for p in parts]
        if named is None or self.session is None:
            session_id, epoch = 0, 0
        else:
            session_id, epoch = self.session.session_id, self.session.next_epoch
        session, self.incremental = leader.sessions.resolve(session_id, epoch, updates, list)
        assert session is not None
        self.session = session
        spec = FetchSpec(
            [PartitionFetchSpec(TOPIC, p, self.ends[p], 0, EPOCH, -1, None, 0) for p in parts],
            max_wait_ms=max_wait_ms,
            min_bytes=1,
            replica_id=FOLLOWER,
            session=session,
        )
        self.pending = leader.path.begin(spec, self._wake)
        return self.step()

    def _wake(self) -> None:
        self.woken += 1

    def step(self) -> Answers | None:
        """Step the last fetch again (after a wake-up)."""
        answers = self.leader.path.step(self.pending)
        if answers is None:
            return None
        kept = {a.partition: a for a in answered(self.session, answers, self.incremental)}
        for partition, a in kept.items():
            for _, header in iter_batch_headers(a.records, validate=False):
                self.ends[partition] = header.next_offset
        return kept


Answers = dict[int, PartitionFetched]


def test_a_full_fetch_answers_every_partition_and_an_idle_one_nothing(leader: Leader) -> None:
    leader.view()
    follower = Follower(leader)
    full = follower.fetch()
    assert full is not None
    assert sorted(full) == list(range(PARTITIONS))
    assert all(a.high_watermark == 0 and not a.error_code for a in full.values())
    assert follower.fetch([]) == {}  # nothing moved: nothing to say
    leader.append(2, b"x")
    moved = follower.fetch([])
    assert moved is not None
    assert list(moved) == [2]
    assert follower.ends[2] == 1
    # The follower names its new log end: the high watermark moves, and is answered.
    answer = follower.fetch([2])
    assert answer is not None
    assert list(answer) == [2]
    assert answer[2].high_watermark == 1
    assert follower.fetch([]) == {}


def test_an_idle_follower_stays_in_the_isr_and_one_that_stops_fetching_leaves(
    leader: Leader,
) -> None:
    leader.view()
    follower = Follower(leader)
    follower.fetch()
    clock = leader.clock
    for _ in range(3):
        clock.advance(LAG_MS // 2 + 100)  # 1.8 s in all, past the lag time
        assert follower.fetch([]) == {}  # idle: skipped, but counted as caught up
        assert not any(shrink(leader, p) for p in range(PARTITIONS))
    clock.advance(LAG_MS + 100)  # no fetch at all now: the same check shrinks
    assert all(shrink(leader, p) for p in range(PARTITIONS))
    eventually(lambda: len(leader.isr_writes.writes) == PARTITIONS)
    assert {isr for _epoch, isr in leader.isr_writes.writes} == {(ME,)}


def shrink(leader: Leader, partition: int) -> bool:
    """Whether the lag check proposes dropping a lagging member of ``partition``'s ISR."""
    return leader.partitions.get(TOPIC, partition).maybe_shrink_isr(
        leader.clock.monotonic_ms(), LAG_MS
    )


def test_an_append_to_an_idle_partition_wakes_the_parked_session_fetch(leader: Leader) -> None:
    leader.view()
    follower = Follower(leader)
    follower.fetch()
    assert follower.fetch([], max_wait_ms=30_000) is None  # parked on all four
    assert follower.woken == 0
    leader.append(3, b"late")
    assert follower.woken == 1
    answer = follower.step()
    assert answer is not None
    assert list(answer) == [3]
    assert answer[3].records
    assert follower.ends[3] == 1


def test_a_leadership_moved_away_is_answered_not_skipped(leader: Leader) -> None:
    leader.view()
    follower = Follower(leader)
    follower.fetch()
    assert follower.fetch([]) == {}
    leader.view({1: FOLLOWER})  # partition 1 is led by the follower now
    answer = follower.fetch([])
    assert answer is not None
    assert list(answer) == [1]
    assert answer[1].error_code in ("NOT_LEADER_OR_FOLLOWER", "FENCED_LEADER_EPOCH")


def test_a_caught_up_follower_outside_the_isr_is_proposed_until_it_joins(
    leader: Leader,
) -> None:
    leader.view(isr=(ME,))
    leader.isr_writes.accept = False  # the first proposal is refused (a stale ZooKeeper)
    follower = Follower(leader)
    follower.fetch()
    eventually(lambda: len(leader.isr_writes.writes) == PARTITIONS)
    leader.isr_writes.accept = True
    # Idle and at the log end, but outside the ISR: read, not skipped, so proposed again.
    follower.fetch([])
    eventually(lambda: len(leader.isr_writes.writes) == 2 * PARTITIONS)
    eventually(lambda: leader.replicas.counts() == (0, PARTITIONS))  # none under-replicated
    assert {isr for _epoch, isr in leader.isr_writes.writes} == {(ME, FOLLOWER)}


def test_a_parked_fetch_answers_an_event_for_the_key_it_names(leader: Leader) -> None:
    """``DelayedFetch.is_satisfied_by``: an event on one partition checks that partition
    alone (a session's fetch parks under every partition it holds); the whole check
    still sees every partition."""
    logs = [leader.logs.get_log(TOPIC, p) for p in range(PARTITIONS)]
    seen = [(plog, plog.log_end_offset, plog.log_start_offset) for plog in logs]
    parked = DelayedFetch(None, seen, lambda: None, replica=True)
    leader.logs.get_log(TOPIC, 2).append(make_batch([b"x"]), leader_epoch=ME)
    assert parked.is_satisfied()
    assert parked.is_satisfied_by((TOPIC, 2))
    assert not parked.is_satisfied_by((TOPIC, 1))
    assert not parked.is_satisfied_by(("other", 2))
