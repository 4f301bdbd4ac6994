"""The replica manager's leader side, step by step, against real logs and a manual clock.

No ZooKeeper and no network: views are built by hand, ISR writes are recorded by a fake
writer (the ZooKeeper half is tested in the process tests), and the fetcher pool has no
address to fetch from. What is checked: roles from views, follower progress, the high
watermark, ISR expand and shrink, ``acks=all`` answers, divergence answers and the
new-leader ``OFFSET_NOT_AVAILABLE`` window.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.broker.conftest import make_batch
from tests.storage.conftest import fill_disk_completely, mount_tmpfs
from tidelog.broker.cluster.fetcher import FetcherPool, FetchTarget
from tidelog.broker.cluster.metadata import ClusterMetadata, TopicMetadata
from tidelog.broker.cluster.replicas import IsrProposal, ReplicaManager, ReplicaSettings
from tidelog.broker.cluster.znodes import BrokerRegistration, PartitionState, TopicAssignment
from tidelog.broker.core.fetch import PartitionFetchSpec
from tidelog.broker.core.group_fsync import DURABLE, PENDING
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import (
    FencedLeaderEpochError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetNotAvailableError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.leader_epoch import LEADER_EPOCH_CHECKPOINT
from tidelog.storage.log_manager import LogManager, LogManagerConfig

TOPIC = "t"
ME = 1


class IsrWrites:
    """Records ISR writes; ``hold`` (when set) keeps each write in flight until released."""

    def __init__(self) -> None:
        self.writes: list[tuple[int, tuple[int, ...]]] = []
        self.accept = True
        self.hold: threading.Event | None = None
        self.started = threading.Event()
        self.version = 0

    def __call__(self, proposals: Sequence[IsrProposal]) -> dict[tuple[str, int], int]:
        self.started.set()
        if self.hold is not None:
            assert self.hold.wait(10), "the test never released the ISR write"
        self.writes.extend((epoch, isr) for _t, _p, _leader, epoch, isr, _base in proposals)
        self.version += 1  # the znode version each written state gets
        return {(t, p): self.version for t, p, *_ in proposals} if self.accept else {}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def logs(tmp_path: Path, clock: ManualClock) -> Iterator[LogManager]:
    manager = LogManager.open(tmp_path, LogManagerConfig(), clock)
    manager.create_topic(TOPIC, 1, {"min.insync.replicas": "2"})
    yield manager
    manager.close()


@pytest.fixture
def isr_writes() -> IsrWrites:
    return IsrWrites()


@pytest.fixture
def replicas(
    logs: LogManager, clock: ManualClock, isr_writes: IsrWrites
) -> Iterator[ReplicaManager]:
    partitions = PartitionRegistry(logs, ME, clock, replicated=True)
    fetchers = FetcherPool(ME, partitions, lambda _b: None)
    manager = ReplicaManager(
        ReplicaSettings(ME, replica_lag_time_max_ms=1_000),
        partitions,
        clock,
        isr_writes,
        fetchers,
    )
    manager.start()
    yield manager
    manager.stop()


def view(
    leader: int, epoch: int, isr: tuple[int, ...], registered: tuple[int, ...] = (1, 2, 3)
) -> ClusterMetadata:
    brokers = {b: BrokerRegistration(b, "127.0.0.1", 1000 + b) for b in registered}
    topic = TopicMetadata(
        TopicAssignment(TOPIC, "id", {0: (1, 2, 3)}),
        {0: PartitionState(leader, epoch, isr, 1)},
        {},
    )
    return ClusterMetadata(brokers, 1, {TOPIC: topic})


def follower_fetch(
    replicas: ReplicaManager, logs: LogManager, follower: int, offset: int, **kwargs: int
) -> tuple[int, int] | None:
    spec = PartitionFetchSpec(TOPIC, 0, offset, **kwargs)
    return replicas.on_follower_fetch(follower, spec, logs.get_log(TOPIC, 0))


def eventually(check: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_the_high_watermark_is_the_smallest_log_end_in_the_isr(
    replicas: ReplicaManager, logs: LogManager
) -> None:
    replicas.apply(view(ME, 3, (1, 2, 3)))
    plog = logs.get_log(TOPIC, 0)
    epoch = replicas.leader_epoch_for_append(TOPIC, 0, acks_all=True, current_leader_epoch=3)
    assert epoch == 3
    plog.append(make_batch([b"a", b"b", b"c"]), leader_epoch=epoch)
    replicas.after_append(TOPIC, 0)
    assert plog.high_watermark == 0  # no follower has it yet
    assert replicas.ack_status(plog, 3) == PENDING
    assert follower_fetch(replicas, logs, 2, 3, last_fetched_epoch=3) is None
    assert plog.high_watermark == 0  # follower 3 is in the ISR too
    assert follower_fetch(replicas, logs, 3, 2) is None
    assert plog.high_watermark == 2
    assert follower_fetch(replicas, logs, 3, 3) is None
    assert plog.high_watermark == 3
    assert replicas.ack_status(plog, 3) == DURABLE


def test_requests_with_other_epochs_are_fenced(replicas: ReplicaManager) -> None:
    replicas.apply(view(ME, 3, (1, 2, 3)))
    with pytest.raises(FencedLeaderEpochError):
        replicas.leader_epoch_for_append(TOPIC, 0, acks_all=False, current_leader_epoch=2)
    with pytest.raises(UnknownLeaderEpochError):
        replicas.check_epoch(TOPIC, 0, 4)
    replicas.apply(view(2, 4, (1, 2, 3)))  # now a follower
    with pytest.raises(NotLeaderOrFollowerError):
        replicas.leader_epoch_for_append(TOPIC, 0, acks_all=False, current_leader_epoch=-1)


def test_isr_shrinks_and_expands_and_acks_all_follows(
    replicas: ReplicaManager, logs: LogManager, clock: ManualClock, isr_writes: IsrWrites
) -> None:
    replicas.apply(view(ME, 1, (1, 2, 3)))
    plog = logs.get_log(TOPIC, 0)
    plog.append(make_batch([b"a"]), leader_epoch=1)
    follower_fetch(replicas, logs, 2, 1)
    clock.advance(1_500)  # follower 3 never fetched: not caught up for 1.5 s > 1 s
    follower_fetch(replicas, logs, 2, 1)
    replicas.check_lagging()
    eventually(lambda: isr_writes.writes == [(1, (1, 2))])
    eventually(lambda: plog.high_watermark == 1)  # 3 left the ISR; 1 and 2 have offset 0
    assert replicas.counts() == (1, 1)  # under-replicated, led
    # min.insync.replicas = 2: still enough.
    replicas.leader_epoch_for_append(TOPIC, 0, acks_all=True, current_leader_epoch=-1)
    clock.advance(1_500)
    replicas.check_lagging()  # now 2 lags too
    eventually(lambda: isr_writes.writes[-1] == (1, (1,)))
    with pytest.raises(NotEnoughReplicasError):
        replicas.leader_epoch_for_append(TOPIC, 0, acks_all=True, current_leader_epoch=-1)
    plog.append(make_batch([b"b"]), leader_epoch=1)
    replicas.after_append(TOPIC, 0)
    assert isinstance(replicas.ack_status(plog, 2), NotEnoughReplicasAfterAppendError)
    # Follower 3 catches up (fetches from the log end): it rejoins.
    follower_fetch(replicas, logs, 3, 2)
    eventually(lambda: isr_writes.writes[-1] == (1, (1, 3)))
    assert replicas.ack_status(plog, 2) == DURABLE


def test_a_follower_behind_the_leaders_epoch_is_told_where_it_diverged(
    replicas: ReplicaManager, logs: LogManager
) -> None:
    plog = logs.get_log(TOPIC, 0)
    replicas.apply(view(ME, 2, (1, 2, 3)))
    plog.append(make_batch([b"a", b"b"]), leader_epoch=2)
    replicas.apply(view(ME, 5, (1, 2, 3)))  # a new term: epoch 5 starts at offset 2
    plog.append(make_batch([b"c"]), leader_epoch=5)
    # The follower wrote offsets 2..3 at epoch 3 (as a leader nobody followed).
    assert follower_fetch(replicas, logs, 2, 4, last_fetched_epoch=3) == (2, 2)
    assert follower_fetch(replicas, logs, 2, 2, last_fetched_epoch=2) is None


def test_a_new_leader_answers_offset_not_available_until_its_high_watermark_is_known(
    replicas: ReplicaManager, logs: LogManager
) -> None:
    plog = logs.get_log(TOPIC, 0)
    replicas.apply(view(2, 1, (1, 2, 3)))  # a follower first
    plog.append_as_follower(b"", b"")
    leader_log = make_batch([b"a", b"b", b"c"])
    plog.append(leader_log, leader_epoch=1)  # (as if replicated)
    plog.set_high_watermark(1)
    replicas.apply(view(ME, 2, (1, 3)))  # broker 2 died; this one leads from offset 3
    with pytest.raises(OffsetNotAvailableError):
        replicas.check_epoch(TOPIC, 0, -1)
    follower_fetch(replicas, logs, 3, 3, last_fetched_epoch=1)
    assert plog.high_watermark == 3
    replicas.check_epoch(TOPIC, 0, -1)  # readable now


def test_the_high_watermark_waits_for_a_member_whose_joining_is_being_written(
    replicas: ReplicaManager, logs: LogManager, isr_writes: IsrWrites
) -> None:
    """Kafka's maximal ISR: once the write lands the controller may elect the new member,
    so the high watermark must not pass its log end while the write is in flight (else
    an acknowledged record is missing from a leader the controller may elect)."""
    replicas.apply(view(ME, 1, (1, 2)))
    plog = logs.get_log(TOPIC, 0)
    plog.append(make_batch([b"a"]), leader_epoch=1)
    follower_fetch(replicas, logs, 2, 1)
    assert plog.high_watermark == 1
    isr_writes.hold = threading.Event()
    follower_fetch(replicas, logs, 3, 1)  # caught up to the high watermark: joins
    assert isr_writes.started.wait(5)
    plog.append(make_batch([b"b"]), leader_epoch=1)
    replicas.after_append(TOPIC, 0)
    follower_fetch(replicas, logs, 2, 2)
    assert plog.high_watermark == 1  # 3, joining, has only offset 0
    assert replicas.ack_status(plog, 2) == PENDING
    isr_writes.hold.set()
    eventually(lambda: isr_writes.writes == [(1, (1, 2, 3))])
    assert plog.high_watermark == 1
    follower_fetch(replicas, logs, 3, 2)
    assert plog.high_watermark == 2
    assert replicas.ack_status(plog, 2) == DURABLE


class RecordingFetchers(FetcherPool):
    """The real pool, noting which partitions it was told to fetch."""

    def __init__(self, logs: LogManager) -> None:
        super().__init__(ME, logs, lambda _b: None)
        self.fetching: dict[tuple[str, int], int] = {}  # -> leader

    def add(self, target: FetchTarget) -> None:
        super().add(target)
        self.fetching[target.key] = target.leader

    def remove(self, key: tuple[str, int]) -> None:
        super().remove(key)
        self.fetching.pop(key, None)


def test_a_follower_starts_fetching_once_its_leader_shows_up_in_the_view(
    logs: LogManager, clock: ManualClock, isr_writes: IsrWrites
) -> None:
    """CI: a view named broker 3 leader (epoch 0) before this broker's view had broker 3's
    registration; the follower did not fetch then, and a later view with broker 3 live,
    the same leader and epoch, changed nothing: it never fetched, the high watermark
    never moved, and a group's offset commit (acks=all) timed out."""
    fetchers = RecordingFetchers(logs)
    manager = ReplicaManager(
        ReplicaSettings(ME, replica_lag_time_max_ms=1_000),
        PartitionRegistry(logs, ME, clock, replicated=True),
        clock,
        isr_writes,
        fetchers,
    )
    manager.start()
    try:
        complete = view(3, 0, (1, 2, 3))
        early = ClusterMetadata(
            {b: r for b, r in complete.brokers.items() if b != 3}, 1, complete.topics
        )
        manager.apply(early)
        assert (TOPIC, 0) not in fetchers.fetching  # no live leader to fetch from
        manager.apply(complete)
        assert fetchers.fetching.get((TOPIC, 0)) == 3
        manager.apply(early)  # the leader's registration went (its session expired)
        assert (TOPIC, 0) not in fetchers.fetching
    finally:
        manager.stop()
        fetchers.stop()


def test_a_leadership_refused_by_a_full_disk_is_taken_once_space_is_freed(
    tmp_path: Path, clock: ManualClock, isr_writes: IsrWrites
) -> None:
    # Issue #29 (disk-full): the view making this broker leader may be the last one for
    # a long time; a leader that could not record its epoch must not stay roleless.
    mount_point = tmp_path / "disk"
    reason = mount_tmpfs(mount_point, 1024 * 1024)
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(f"needs a tmpfs (run as root): {reason}")
    manager = LogManager.open(mount_point / "data", LogManagerConfig(), clock)
    partitions = PartitionRegistry(manager, ME, clock, replicated=True)
    fetchers = FetcherPool(ME, partitions, lambda _b: None)
    replicas = ReplicaManager(
        ReplicaSettings(ME, replica_lag_time_max_ms=200), partitions, clock, isr_writes, fetchers
    )
    replicas.start()
    fillers: list[Path] = []
    try:
        manager.create_topic(TOPIC, 1, {"min.insync.replicas": "1"})
        replicas.apply(view(2, 1, (1, 2, 3)))  # a follower first
        fillers = fill_disk_completely(mount_point)
        replicas.apply(view(1, 2, (1, 2, 3)))  # the epoch checkpoint cannot be written
        with pytest.raises(NotLeaderOrFollowerError):
            replicas.leader_epoch_for_append(TOPIC, 0, acks_all=False, current_leader_epoch=-1)
        for filler in fillers:
            filler.unlink()
        # No new view: the lag thread's retry takes the role.
        eventually(lambda: partitions.get(TOPIC, 0).leader_epoch == 2)
        assert manager.get_log(TOPIC, 0).latest_epoch == 2
    finally:
        for filler in fillers:
            filler.unlink(missing_ok=True)
        replicas.stop()
        manager.close()
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_leader_learns_a_reassignment_s_replicas_after_its_epoch(
    replicas: ReplicaManager, logs: LogManager
) -> None:
    """The metadata watcher reads the topic znode and the state znodes apart: a leader may
    see a reassignment's new epoch with the old replica list, then the new list at the
    same epoch. It must take the list: the adding replica 4's fetches are served (they
    were refused for good before, and the move never completed)."""
    brokers = {b: BrokerRegistration(b, "127.0.0.1", 9000 + b) for b in (1, 2, 3, 4)}

    def moving(assignment: tuple[int, ...], adding: tuple[int, ...]) -> ClusterMetadata:
        topic = TopicMetadata(
            TopicAssignment(TOPIC, "id", {0: assignment}, {0: adding} if adding else {}),
            {0: PartitionState(ME, 5, (1, 2, 3), 1)},
            {},
        )
        return ClusterMetadata(brokers, 1, {TOPIC: topic})

    replicas.apply(moving((1, 2, 3), ()))  # epoch 5 read before the new list
    with pytest.raises(UnknownTopicOrPartitionError):
        follower_fetch(replicas, logs, 4, 0)
    replicas.apply(moving((4, 1, 2, 3), (4,)))  # the list, at the same epoch
    assert follower_fetch(replicas, logs, 4, 0) is None


def test_many_followed_partitions_stop_with_one_wait_per_fetcher(
    logs: LogManager, clock: ManualClock
) -> None:
    """Issue #34: a broker resigning 9,000 followed partitions waited, per partition, for
    the answer its fetcher was applying; ``remove_many`` waits once per fetcher, and
    still only returns when no answer for any of them is being applied."""
    partitions = PartitionRegistry(logs, ME, clock, replicated=True)
    pool = FetcherPool(ME, partitions, lambda _b: None)
    try:
        keys = [(f"t{i}", 0) for i in range(50)]
        for topic, partition in keys:
            pool.add(FetchTarget(topic, partition, 2, 0))
        fetcher = pool._owner[keys[0]]
        assert all(pool._owner[key] is fetcher for key in keys)
        fetcher.applying.acquire()  # an answer is being applied
        done = threading.Event()
        stopper = threading.Thread(target=lambda: (pool.remove_many(keys), done.set()))
        stopper.start()
        assert not done.wait(0.3)  # still waiting for the answer being applied
        fetcher.applying.release()
        assert done.wait(5)
        stopper.join()
        assert not any(key in pool._owner for key in keys)
        assert fetcher._targets == {}
    finally:
        pool.stop()


def test_a_partition_without_a_local_log_fails_alone_and_is_taken_once_it_has_one(
    logs: LogManager, clock: ManualClock, isr_writes: IsrWrites
) -> None:
    """A topic whose local log could not be created (the open-file limit at 10,000
    partitions, a full disk) made the whole view's apply raise: no other partition of it
    took its role. Now that partition fails alone and is retried with the view."""
    logs.create_topic("other", 2, {"min.insync.replicas": "1"})
    brokers = {b: BrokerRegistration(b, "127.0.0.1", 1000 + b) for b in (1, 2, 3)}

    def led_topic(name: str, partitions: int) -> TopicMetadata:
        return TopicMetadata(
            TopicAssignment(name, name, dict.fromkeys(range(partitions), (1, 2, 3))),
            {p: PartitionState(ME, 1, (1, 2, 3), 1) for p in range(partitions)},
            {},
        )

    partitions = PartitionRegistry(logs, ME, clock, replicated=True)
    replicas = ReplicaManager(
        ReplicaSettings(ME, replica_lag_time_max_ms=200),
        partitions,
        clock,
        isr_writes,
        FetcherPool(ME, partitions, lambda _b: None),
    )
    replicas.start()
    try:
        # "missing" is in the cluster's metadata but has no log on this broker (yet).
        topics = {"other": led_topic("other", 2), "missing": led_topic("missing", 1)}
        replicas.apply(ClusterMetadata(brokers, 1, topics))
        assert [partitions.get("other", p).leader_epoch for p in range(2)] == [1, 1]
        logs.create_topic("missing", 1, {"min.insync.replicas": "1"})
        # No new view: the lag thread's retry takes the role.
        eventually(lambda: partitions.get("missing", 0).leader_epoch == 1)
    finally:
        replicas.stop()


def test_a_views_new_leaderships_are_taken_with_their_epochs_checkpointed(
    tmp_path: Path, clock: ManualClock, isr_writes: IsrWrites
) -> None:
    """Issue #34: a view's new leaderships record their epochs first (unsynced), one flush
    of the file system makes them all durable, then the roles are taken. Each log's
    checkpoint names its new epoch, and a second view with new epochs (the controller's
    ISR shrink bumps them for partitions already led) moves every one on."""
    manager = LogManager.open(tmp_path / "data", LogManagerConfig(), clock)
    try:
        manager.create_topic("many", 6, {})
        partitions = PartitionRegistry(manager, ME, clock, replicated=True)
        replicas = ReplicaManager(
            ReplicaSettings(ME),
            partitions,
            clock,
            isr_writes,
            FetcherPool(ME, partitions, lambda _b: None),
        )
        brokers = {b: BrokerRegistration(b, "127.0.0.1", 1000 + b) for b in (1, 2, 3)}
        for epoch in (4, 5):
            topic = TopicMetadata(
                TopicAssignment("many", "id", dict.fromkeys(range(6), (1, 2, 3))),
                {p: PartitionState(ME, epoch, (1, 2, 3), 1) for p in range(6)},
                {},
            )
            replicas.apply(ClusterMetadata(brokers, 1, {"many": topic}))
            for p in range(6):
                assert partitions.get("many", p).leader_epoch == epoch
                plog = manager.get_log("many", p)
                assert plog.latest_epoch == epoch
                checkpoint = (plog.directory / LEADER_EPOCH_CHECKPOINT).read_text()
                assert checkpoint.splitlines()[-1] == f"{epoch} 0"
        assert replicas.counts() == (0, 6)
    finally:
        manager.close()


def test_a_fetch_on_a_channel_closed_meanwhile_does_not_end_the_fetcher(
    logs: LogManager, clock: ManualClock
) -> None:
    """``FetcherPool.stop`` closes a fetcher's channel from another thread; a fetch the
    thread was about to send then meets a closed channel (grpc raises ``ValueError``,
    not an ``RpcError``), which ended the thread with a traceback in a stopping broker's
    log (seen at 10,000 partitions). Here the channel is closed just before the fetch
    (from ``address_of``, which the thread calls right before it): the thread goes on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"  # nothing listens there
    partitions = PartitionRegistry(logs, ME, clock, replicated=True)
    close_next = threading.Event()
    calls: list[int] = []

    def address_of(_broker: int) -> str:
        calls.append(1)
        fetcher = pool._owner.get((TOPIC, 0))
        if close_next.is_set() and fetcher is not None and fetcher._channel is not None:
            close_next.clear()
            fetcher._channel.close()
        return address

    pool = FetcherPool(ME, partitions, address_of, backoff_ms=20)
    try:
        pool.add(FetchTarget(TOPIC, 0, 2, 0))
        fetcher = pool._owner[(TOPIC, 0)]
        eventually(lambda: fetcher._channel is not None)
        close_next.set()
        eventually(lambda: not close_next.is_set())
        seen = len(calls)
        eventually(lambda: len(calls) > seen + 1)  # still fetching
        assert fetcher._thread.is_alive()
    finally:
        pool.stop()


def test_a_follower_not_registered_in_the_view_does_not_join_the_isr(
    replicas: ReplicaManager, logs: LogManager, clock: ManualClock, isr_writes: IsrWrites
) -> None:
    """KIP-841's rule: a caught-up follower is proposed for the ISR only while the
    leader's view has it registered (a broker back from a lost ZooKeeper session fetches
    before it registers again; the controller would drop it again as dead)."""
    replicas.apply(view(ME, 1, (1, 2)))
    plog = logs.get_log(TOPIC, 0)
    plog.append(make_batch([b"a"]), leader_epoch=1)
    follower_fetch(replicas, logs, 2, 1)
    assert plog.high_watermark == 1
    replicas.apply(view(ME, 1, (1, 2), registered=(1, 2)))
    follower_fetch(replicas, logs, 3, 1)  # caught up, but not registered
    time.sleep(0.2)
    assert isr_writes.writes == []
    replicas.apply(view(ME, 1, (1, 2)))  # registered again
    follower_fetch(replicas, logs, 3, 1)
    eventually(lambda: isr_writes.writes == [(1, (1, 2, 3))])
