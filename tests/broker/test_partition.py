"""``Partition`` on its own: roles and epochs, the append window, ISR and high watermark.

Real ``PartitionLog``s in temporary directories and a manual clock; no replica manager,
no network. ISR writes are done by hand (``begin_isr_write`` / ``finish_isr_write``), as
the replica manager's ISR thread does them.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.broker.conftest import make_batch
from tidelog.broker.core.group_fsync import DURABLE, PENDING, GroupFsync
from tidelog.broker.core.partition import Partition
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.core.produce import DelayedProduce, PartitionAppend, PartitionProduced
from tidelog.storage.checkpoint import LOG_START_OFFSET_CHECKPOINT, read_offsets
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import (
    FencedLeaderEpochError,
    InvalidRequestError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.records import iter_batch_headers

TOPIC = "t"
ME = 1
REPLICAS = (1, 2, 3)


def _open(directory: Path, clock: ManualClock, min_isr: int = 2) -> LogManager:
    logs = LogManager.open(directory, LogManagerConfig(), clock)
    logs.create_topic(TOPIC, 1, {"min.insync.replicas": str(min_isr)})
    return logs


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def logs(tmp_path: Path, clock: ManualClock) -> Iterator[LogManager]:
    manager = _open(tmp_path, clock)
    yield manager
    manager.close()


@pytest.fixture
def partition(logs: LogManager, clock: ManualClock) -> Partition:
    return PartitionRegistry(logs, ME, clock, replicated=True).get(TOPIC, 0)


def _batch_epochs(partition: Partition) -> list[int]:
    data = partition.log.read(partition.log.log_start_offset, 1 << 30).records
    return [h.partition_leader_epoch for _, h in iter_batch_headers(data)]


def test_a_single_node_partition_leads_unreplicated(logs: LogManager, clock: ManualClock) -> None:
    single = PartitionRegistry(logs, ME, clock, replicated=False).get(TOPIC, 0)
    result = single.append_as_leader(make_batch([b"a"]), acks_all=True, current_leader_epoch=7)
    assert result.base_offset == 0
    assert _batch_epochs(single) == [-1]  # the producer's value, as before: no stamp
    assert single.log.high_watermark == 1  # not tracked: the log end
    assert single.ack_status(1) == DURABLE  # min.insync.replicas 2 is not checked
    single.check_epoch(7)
    with pytest.raises(InvalidRequestError):
        single.on_follower_fetch(2, 0)
    with pytest.raises(ValueError, match="unreplicated"):
        single.make_leader(1, REPLICAS, REPLICAS)


def test_roles_epochs_and_fencing(partition: Partition) -> None:
    with pytest.raises(NotLeaderOrFollowerError):
        partition.append_as_leader(make_batch([b"a"]), acks_all=False)
    assert partition.make_leader(3, REPLICAS, REPLICAS)
    assert not partition.make_leader(3, REPLICAS, (1,))  # same term: nothing changes
    assert partition.log.latest_epoch == 3
    partition.append_as_leader(make_batch([b"a"]), acks_all=False, current_leader_epoch=3)
    with pytest.raises(FencedLeaderEpochError):
        partition.append_as_leader(make_batch([b"b"]), acks_all=False, current_leader_epoch=2)
    with pytest.raises(UnknownLeaderEpochError):
        partition.check_epoch(4)
    assert partition.make_follower(2, 4)  # it led
    assert not partition.make_follower(2, 4)
    with pytest.raises(NotLeaderOrFollowerError):
        partition.append_as_leader(make_batch([b"c"]), acks_all=False)
    assert isinstance(partition.ack_status(1), NotLeaderOrFollowerError)
    assert not partition.resign()
    assert _batch_epochs(partition) == [3]


def test_a_produce_that_sees_the_new_epoch_is_never_refused(partition: Partition) -> None:
    """The window ``make_leader`` closes: the epoch recorded in the log, the role not yet
    set. A producer that learned the new epoch (here: from the log itself, as early as
    anyone can) and produces with it is accepted; produces racing with an unchecked
    epoch are accepted or answered NOT_LEADER_OR_FOLLOWER, and nothing is stored under
    an epoch older than one the log already began."""
    partition.make_leader(0, REPLICAS, (1,))
    failures: list[BaseException] = []
    done = threading.Event()

    def racing_producer() -> None:
        while not done.is_set():
            try:
                partition.append_as_leader(make_batch([b"r"]), acks_all=False)
            except NotLeaderOrFollowerError:
                pass
            except BaseException as exc:  # anything else is a failure
                failures.append(exc)

    def observing_producer(epoch: int) -> None:
        while partition.log.latest_epoch < epoch:
            pass
        try:
            partition.append_as_leader(
                make_batch([b"o"]), acks_all=False, current_leader_epoch=epoch
            )
        except BaseException as exc:
            failures.append(exc)

    racer = threading.Thread(target=racing_producer)
    racer.start()
    try:
        for epoch in range(1, 60):
            observer = threading.Thread(target=observing_producer, args=(epoch,))
            observer.start()
            assert partition.make_leader(epoch, REPLICAS, (1,))
            # Once make_leader returned, a produce at the new epoch is accepted.
            result = partition.append_as_leader(
                make_batch([b"n"]), acks_all=False, current_leader_epoch=epoch
            )
            assert not result.duplicate
            observer.join(10)
            assert not observer.is_alive()
    finally:
        done.set()
        racer.join(10)
    assert failures == []
    epochs = _batch_epochs(partition)
    assert epochs == sorted(epochs)  # never an old epoch after a newer one
    assert epochs[-1] == 59


def test_follower_progress_moves_the_isr_and_the_high_watermark(
    partition: Partition, clock: ManualClock
) -> None:
    partition.make_leader(1, REPLICAS, (1, 2))
    partition.append_as_leader(make_batch([b"a", b"b"]), acks_all=True)
    assert partition.log.high_watermark == 0
    assert partition.ack_status(2) == PENDING
    assert partition.on_follower_fetch(2, 2, last_fetched_epoch=1) is None
    assert partition.log.high_watermark == 2
    assert partition.ack_status(2) == DURABLE
    # Follower 3 caught up to the high watermark: proposed for the ISR.
    assert partition.on_follower_fetch(3, 2) is None
    change = partition.begin_isr_write()
    assert change is not None
    assert change.isr == (1, 2, 3)
    assert partition.finish_isr_write(change, written=True) == (0, 1)
    assert partition.replication_state() == (True, False)
    # 3 stops fetching: dropped after the lag time; below min ISR (2) acks=all refuses.
    clock.advance(2_000)
    partition.on_follower_fetch(2, 2)
    assert partition.maybe_shrink_isr(clock.monotonic_ms(), 1_000)
    change = partition.begin_isr_write()
    assert change is not None
    assert change.isr == (1, 2)
    assert partition.finish_isr_write(change, written=True) == (1, 0)
    clock.advance(2_000)
    assert partition.maybe_shrink_isr(clock.monotonic_ms(), 1_000)
    change = partition.begin_isr_write()
    assert change is not None
    assert change.isr == (1,)
    assert partition.finish_isr_write(change, written=False) is None  # not written: kept
    assert partition.replication_state() == (True, True)
    assert partition.maybe_shrink_isr(clock.monotonic_ms(), 1_000)
    change = partition.begin_isr_write()
    assert change is not None
    partition.finish_isr_write(change, written=True)
    with pytest.raises(NotEnoughReplicasError):
        partition.append_as_leader(make_batch([b"c"]), acks_all=True)
    partition.append_as_leader(make_batch([b"c"]), acks_all=False)
    assert isinstance(partition.ack_status(3), NotEnoughReplicasAfterAppendError)
    assert partition.log.high_watermark == 2  # strict min ISR: it stays


def test_a_diverging_follower_is_told_where_its_epoch_ended(partition: Partition) -> None:
    partition.make_leader(2, REPLICAS, REPLICAS)
    partition.append_as_leader(make_batch([b"a", b"b"]), acks_all=False)
    partition.make_leader(5, REPLICAS, REPLICAS)
    partition.append_as_leader(make_batch([b"c"]), acks_all=False)
    assert partition.on_follower_fetch(2, 4, last_fetched_epoch=3) == (2, 2)
    assert partition.on_follower_fetch(2, 2, last_fetched_epoch=2) is None


def test_wait_replicated_returns_once_the_followers_have_it(partition: Partition) -> None:
    partition.make_leader(1, REPLICAS, (1, 2))
    partition.append_as_leader(make_batch([b"a"]), acks_all=True)
    waiter = threading.Thread(target=partition.wait_replicated, args=(1, 10_000))
    waiter.start()
    partition.on_follower_fetch(2, 1)
    waiter.join(10)
    assert not waiter.is_alive()
    assert partition.log.high_watermark == 1


def test_delete_records_waits_for_every_isr_members_log_start(
    partition: Partition, logs: LogManager
) -> None:
    """The leader's start moves and is checkpointed at once; the low watermark (what the
    answer waits for, ``broker.core.delete_records``) counts the ISR's followers as they
    report theirs (a replica outside the ISR is not waited for)."""
    partition.make_leader(1, REPLICAS, (1, 2))
    partition.append_as_leader(make_batch([b"a", b"b", b"c", b"d"]), acks_all=True)
    partition.on_follower_fetch(2, 4)  # the high watermark reaches 4
    with pytest.raises(OffsetOutOfRangeError, match="high watermark"):
        partition.delete_records(5)
    with pytest.raises(OffsetOutOfRangeError):
        partition.delete_records(-2)
    assert partition.delete_records(3) == 3
    assert partition.log.log_start_offset == 3
    checkpoint = read_offsets(logs.data_dir / LOG_START_OFFSET_CHECKPOINT)
    assert checkpoint[(TOPIC, 0)] == 3
    assert partition.low_watermark() == -1  # follower 2 has not reported one yet
    partition.on_follower_fetch(2, 4, log_start_offset=3)
    assert partition.low_watermark() == 3
    assert partition.delete_records(-1) == 4  # -1: the high watermark
    partition.make_follower(2, 2)
    with pytest.raises(NotLeaderOrFollowerError):
        partition.delete_records(4)


def test_a_follower_takes_its_leaders_log_start(
    partition: Partition, logs: LogManager, tmp_path: Path, clock: ManualClock
) -> None:
    fetched = _leader_bytes(tmp_path / "leader", clock, 3, [b"a", b"b", b"c"])
    partition.make_follower(2, 3)
    # The leader's start (2) above this follower's high watermark (1): capped there.
    assert partition.append_as_follower(2, 3, fetched, b"", 1, 2)
    assert partition.log.log_start_offset == 1
    assert partition.append_as_follower(2, 3, b"", b"", 3, 2)
    assert partition.log.log_start_offset == 2
    checkpoint = read_offsets(logs.data_dir / LOG_START_OFFSET_CHECKPOINT)
    assert checkpoint[(TOPIC, 0)] == 2  # durable before the next fetch reports it
    assert partition.append_as_follower(2, 3, b"", b"", 3, 1)  # never moves down
    assert partition.log.log_start_offset == 2


class PartitionMachine(RuleBasedStateMachine):
    """A replicated partition against a model: the ISR, each follower's log end, the
    high watermark. Invariants: the high watermark never passes the log end or the log
    end of a written ISR member, never goes down, and moves only while the written ISR
    has ``min.insync.replicas`` (2) members; ``acks=all`` is ``DURABLE`` only below the
    high watermark with enough in-sync replicas; batch epochs never go down."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp())
        self.clock = ManualClock()
        self.logs = _open(self.directory, self.clock)
        self.partition = PartitionRegistry(self.logs, ME, self.clock, replicated=True).get(TOPIC, 0)
        self.epoch = -1
        self.leading = False
        self.isr: set[int] = set()  # the written ISR (the state znode's)
        self.version = 0  # the state znode's version (the partition epoch)
        self.views: list[tuple[int, int, tuple[int, ...]]] = []  # (epoch, version, ISR)
        self.ends: dict[int, int] = {}
        self.high_watermark = 0

    def teardown(self) -> None:
        self.logs.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    @initialize(isr=st.sets(st.sampled_from((2, 3))))
    def lead(self, isr: set[int]) -> None:
        self.elect(isr)

    def elect(self, isr: set[int]) -> None:
        self.epoch += 1
        self.version += 1
        self.isr = {ME, *isr}
        assert self.partition.make_leader(
            self.epoch, REPLICAS, tuple(sorted(self.isr)), (), self.version
        )
        self.leading = True
        self.ends = {}

    @rule(isr=st.sets(st.sampled_from((2, 3))))
    def new_term(self, isr: set[int]) -> None:
        self.elect(isr)

    @rule()
    def follow(self) -> None:
        self.epoch += 1
        self.partition.make_follower(2, self.epoch)
        self.leading = False

    @precondition(lambda self: self.leading)
    @rule(records=st.integers(1, 3), acks_all=st.booleans())
    def append(self, records: int, acks_all: bool) -> None:
        try:
            result = self.partition.append_as_leader(
                make_batch([b"x"] * records), acks_all=acks_all
            )
        except NotEnoughReplicasError:
            assert acks_all
            assert len(self.isr) < 2
            return
        status = self.partition.ack_status(result.last_offset + 1)
        if status == DURABLE:
            assert len(self.isr) >= 2
            assert self.partition.log.high_watermark > result.last_offset

    @precondition(lambda self: self.leading)
    @rule(follower=st.sampled_from((2, 3)), data=st.data())
    def follower_fetch(self, follower: int, data: st.DataObject) -> None:
        end = self.partition.log.log_end_offset
        offset = data.draw(st.integers(max(self.ends.get(follower, 0), 0), end))
        assert self.partition.on_follower_fetch(follower, offset) is None
        self.ends[follower] = offset

    @precondition(lambda self: self.leading)
    @rule(written=st.booleans())
    def write_isr(self, written: bool) -> None:
        change = self.partition.begin_isr_write()
        if change is None:
            return
        # ZooKeeper refuses a change made from an ISR it no longer holds (isr_writes).
        if written and set(change.base) == self.isr:
            self.version += 1
            self.isr = set(change.isr)
            self.views.append((self.epoch, self.version, change.isr))
            self.partition.finish_isr_write(change, True, self.version)
        else:
            self.partition.finish_isr_write(change, False)

    @precondition(lambda self: self.leading and len(self.isr) == 3)
    @rule(dead=st.sampled_from((2, 3)))
    def controller_drops_a_dead_follower(self, dead: int) -> None:
        # At the same leader epoch (KAFKA-15021); the leader hears of it from a view.
        self.version += 1
        self.isr.discard(dead)
        self.views.append((self.epoch, self.version, tuple(sorted(self.isr))))

    @precondition(lambda self: self.leading and bool(self.views))
    @rule(data=st.data())
    def a_view_arrives(self, data: st.DataObject) -> None:
        # Any view the watcher read, possibly older than the leader's own last write.
        epoch, version, isr = data.draw(st.sampled_from(self.views))
        self.partition.update_isr(epoch, isr, version)

    @precondition(lambda self: self.leading)
    @rule()
    def lag(self) -> None:
        self.clock.advance(2_000)
        self.partition.maybe_shrink_isr(self.clock.monotonic_ms(), 1_000)

    @invariant()
    def the_high_watermark_is_safe(self) -> None:
        plog = self.partition.log
        high_watermark = plog.high_watermark
        assert high_watermark <= plog.log_end_offset
        assert high_watermark >= self.high_watermark
        if self.leading and high_watermark > self.high_watermark:
            assert len(self.isr) >= 2
            for member in self.isr - {ME}:
                # Every written ISR member fetched this term, and has it.
                assert high_watermark <= self.ends[member]
        self.high_watermark = high_watermark

    @invariant()
    def epochs_never_go_down(self) -> None:
        epochs = _batch_epochs(self.partition)
        assert epochs == sorted(epochs)


PartitionMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_partition_state_machine = PartitionMachine.TestCase


# --- the follower side: every fetched write checks the role -----------------------------------


def _leader_bytes(directory: Path, clock: ManualClock, epoch: int, values: list[bytes]) -> bytes:
    """The bytes a leader at ``epoch`` serves for ``values`` (offsets and epoch stamped)."""
    logs = _open(directory, clock)
    try:
        leader = PartitionRegistry(logs, 2, clock, replicated=True).get(TOPIC, 0)
        leader.make_leader(epoch, REPLICAS, REPLICAS)
        for value in values:
            leader.append_as_leader(make_batch([value]), acks_all=False, current_leader_epoch=-1)
        return leader.log.read(0, 1 << 30).records
    finally:
        logs.close()


def test_a_follower_writes_only_for_the_leader_and_epoch_it_follows(
    partition: Partition, tmp_path: Path, clock: ManualClock
) -> None:
    fetched = _leader_bytes(tmp_path / "leader", clock, 3, [b"a", b"b"])
    # Not a follower yet (no role): nothing is written.
    assert not partition.append_as_follower(2, 3, fetched, b"", 2)
    assert partition.log.log_end_offset == 0
    partition.make_follower(2, 3)
    # An answer from another leader, or from the same one at an older epoch: refused.
    assert not partition.append_as_follower(3, 3, fetched, b"", 2)
    assert not partition.append_as_follower(2, 2, fetched, b"", 2)
    assert partition.truncate_diverged(2, 2, 1, 0) is None
    assert partition.start_over_at(2, 2, 100) is None
    assert partition.log.log_end_offset == 0
    assert partition.append_as_follower(2, 3, fetched, b"", 1)
    assert partition.log.log_end_offset == 2
    assert partition.log.high_watermark == 1  # the leader's, capped at this log's end
    assert _batch_epochs(partition) == [3, 3]  # the leader's stamps, unchanged
    # The leader says the log diverged after offset 1 (epoch 3 ends there on it).
    assert partition.truncate_diverged(2, 3, 3, 1) == (2, 1)
    assert partition.log.log_end_offset == 1


def test_no_fetched_write_lands_once_this_broker_leads(
    partition: Partition, tmp_path: Path, clock: ManualClock
) -> None:
    """A fetch answer applied after ``make_leader`` (a fetcher not yet removed) is refused:
    the new leader's log is its own from the moment it leads."""
    fetched = _leader_bytes(tmp_path / "leader", clock, 3, [b"late"])
    partition.make_follower(2, 3)
    partition.make_leader(4, REPLICAS, (1,))
    assert not partition.append_as_follower(2, 3, fetched, b"", 1)
    assert partition.start_over_at(2, 3, 50) is None
    assert partition.log.log_end_offset == 0
    assert partition.log.log_start_offset == 0


def test_a_leader_takes_a_new_replica_list_at_the_same_epoch(partition: Partition) -> None:
    """A reassignment's new replica list may reach the leader after its new epoch (two
    znodes read apart): the adding replica's fetches must be served from then on."""
    partition.make_leader(1, (1, 2), (1, 2))
    with pytest.raises(UnknownTopicOrPartitionError):
        partition.on_follower_fetch(3, 0, 1)
    assert partition.update_replicas(1, (1, 2, 3))
    assert partition.on_follower_fetch(3, 0, 1) is None
    assert not partition.update_replicas(1, (1, 2, 3))  # nothing new
    assert not partition.update_replicas(2, (1, 3))  # another epoch: not this term's
    assert partition.update_replicas(1, (1, 3))
    with pytest.raises(UnknownTopicOrPartitionError):
        partition.on_follower_fetch(2, 0, 1)


def test_a_former_replica_deletes_its_records_only_once_resigned(
    partition: Partition,
) -> None:
    partition.make_leader(1, (1, 2), (1,))
    partition.log.append(make_batch([b"a", b"b", b"c"]))
    assert not partition.delete_replica_data()  # still leading: refused
    partition.resign()
    assert partition.delete_replica_data()
    assert (partition.log.log_start_offset, partition.log.log_end_offset) == (0, 0)
    assert not partition.delete_replica_data()  # nothing left


def test_a_parked_acks_all_write_whose_leader_resigned_before_its_fsync_is_not_leader(
    partition: Partition,
) -> None:
    """A reassignment resigns the leader and deletes its log while an ``acks=all`` write
    waits for its fsync, which then never comes. The answer is NOT_LEADER_OR_FOLLOWER
    (retriable, outcome unknown: the new leader may hold the batch, and recognises its
    sequence when it comes again), at once; it was a storage error, which the producer took
    for a refusal and resent under a new producer id, storing a record twice (CI)."""
    assert partition.make_leader(1, REPLICAS, REPLICAS)
    result = partition.append_as_leader(make_batch([b"a"]), acks_all=True)
    end = result.last_offset + 1
    fsync = GroupFsync(lambda _topic, _partition: None)  # never started: no fsync comes
    answers: list[list[PartitionProduced]] = []
    appended = PartitionAppend(TOPIC, 0, result, None, partition)
    parked = DelayedProduce(
        [appended], {id(partition): (partition, end)}, fsync, answers.append, lambda _s: None
    )
    assert fsync.status(partition.log, end) == PENDING
    assert not parked.is_satisfied()
    assert partition.resign()
    assert partition.delete_replica_data()
    assert parked.is_satisfied()
    parked.on_complete()
    [[answer]] = answers
    assert answer.error_code == NotLeaderOrFollowerError.code, answer


# --- the controller's ISR shrink at the same leader epoch (KAFKA-15021) ----------------------


def test_the_leader_takes_the_controllers_smaller_isr_and_never_an_older_view(
    partition: Partition,
) -> None:
    """The controller drops dead 3 at epoch 1 (version 2): the leader takes it from the
    view and the high watermark stops waiting for 3. 3 comes back and joins (the leader's
    write, version 3); the watcher's older view (version 2, without 3) arriving after
    that is ignored: taken, it would let the high watermark pass 3, which the controller
    may elect."""
    partition.make_leader(1, REPLICAS, REPLICAS, (), 1)
    partition.append_as_leader(make_batch([b"a"]), acks_all=True)
    partition.on_follower_fetch(2, 1)
    assert partition.log.high_watermark == 0  # 3 is in the ISR and has nothing
    assert not partition.update_isr(0, (1, 2), 2)  # another epoch's view: ignored
    assert partition.update_isr(1, (1, 2), 2)
    assert partition.log.high_watermark == 1
    assert partition.replication_state() == (True, True)
    assert not partition.update_isr(1, (1, 2), 2)  # the same view again: nothing new
    # 3 catches up and is proposed; the write is made from the ISR the leader now holds.
    partition.on_follower_fetch(3, 1)
    change = partition.begin_isr_write()
    assert change is not None
    assert (change.isr, change.base) == ((1, 2, 3), frozenset({1, 2}))
    assert partition.finish_isr_write(change, True, 3) == (0, 1)
    assert not partition.update_isr(1, (1, 2), 2)  # older than the leader's own write
    partition.append_as_leader(make_batch([b"b"]), acks_all=True)
    partition.on_follower_fetch(2, 2)
    assert partition.log.high_watermark == 1  # waits for 3, in the ISR
    partition.on_follower_fetch(3, 2)
    assert partition.log.high_watermark == 2


def test_a_leader_write_that_lands_after_a_newer_view_does_not_undo_it(
    partition: Partition, clock: ManualClock
) -> None:
    """The leader's write dropping lagging 2 (version 2: ISR 1, 3) is answered after the
    controller's next change (version 3: dead 3 dropped too, ISR 1) was taken from a
    view: the ISR stays the newer one, below min ISR (2)."""
    partition.make_leader(1, REPLICAS, REPLICAS, (), 1)
    clock.advance(5_000)
    partition.on_follower_fetch(3, 0)
    assert partition.maybe_shrink_isr(clock.monotonic_ms(), 1_000)
    change = partition.begin_isr_write()
    assert change is not None
    assert change.isr == (1, 3)
    assert partition.update_isr(1, (1,), 3)
    assert partition.finish_isr_write(change, True, 2) == (1, 0)  # what the write did
    with pytest.raises(NotEnoughReplicasError):  # ISR {1}, not {1, 3}
        partition.append_as_leader(make_batch([b"a"]), acks_all=True)
    assert not partition.update_isr(1, (1, 3), 2)  # the write's own view, older
    with pytest.raises(NotEnoughReplicasError):
        partition.append_as_leader(make_batch([b"a"]), acks_all=True)
