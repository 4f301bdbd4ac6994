"""KIP-966 for ZooKeeper mode, without processes: ELR rules, strict min ISR, the marker.

The election rules are pure (``broker.cluster.election``): hand-made states for the
cases the design names, and a hypothesis property over any state, live set and set of
uncleanly restarted replicas. The high watermark's strict min ISR is checked on a real
``ReplicaManager`` (no ZooKeeper), the partition-state and registration JSON on bytes,
and the clean-shutdown marker's broker epoch on a real data directory. The processes
are ``test_elr_processes.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.broker.conftest import make_batch
from tidelog.broker.cluster.election import crashed_replicas, reconcile, with_elr
from tidelog.broker.cluster.fetcher import FetcherPool
from tidelog.broker.cluster.metadata import ClusterMetadata, TopicMetadata
from tidelog.broker.cluster.replicas import ReplicaManager, ReplicaSettings
from tidelog.broker.cluster.znodes import (
    NO_LEADER,
    BrokerRegistration,
    PartitionState,
    TopicAssignment,
    decode_broker,
    decode_partition_state,
    encode_broker,
    encode_partition_state,
)
from tidelog.broker.core.fetch import PartitionFetchSpec
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.storage.checkpoint import CLEAN_SHUTDOWN_MARKER
from tidelog.storage.clock import ManualClock
from tidelog.storage.log_manager import LogManager, LogManagerConfig

pytestmark = pytest.mark.timeout(60)

REPLICAS = (1, 2, 3)
ALL = {1, 2, 3}


def state(
    leader: int,
    *isr: int,
    elr: tuple[int, ...] = (),
    lke: tuple[int, ...] = (),
    lkl: int = NO_LEADER,
    epoch: int = 4,
    zxid: int = 100,
) -> PartitionState:
    return PartitionState(leader, epoch, tuple(isr), 7, elr, lke, lkl, zxid)


# --- the znodes ----------------------------------------------------------------------------


def test_a_state_without_elr_keys_reads_as_before_and_is_written_as_before() -> None:
    old = b'{"controller_epoch":3,"isr":[1,2],"leader":1,"leader_epoch":5,"version":1}'
    decoded = decode_partition_state(old)
    assert decoded == PartitionState(1, 5, (1, 2), 3)
    assert decoded.elr == ()
    assert decoded.last_known_leader == NO_LEADER
    assert encode_partition_state(decoded) == old  # byte for byte: older brokers read it


def test_elr_fields_round_trip() -> None:
    full = state(NO_LEADER, 3, elr=(1,), lke=(2,), lkl=3, zxid=4_294_967_396)
    assert decode_partition_state(encode_partition_state(full)) == full
    document = json.loads(encode_partition_state(full))
    assert document["elr"] == [1]
    assert document["last_known_elr"] == [2]


def test_a_registration_reports_its_previous_broker_epoch() -> None:
    unclean = BrokerRegistration(1, "h", 1, 0, (), -1)
    assert not decode_broker(1, encode_broker(unclean)).shut_down_cleanly
    clean = BrokerRegistration(1, "h", 1, 0, (), 77)
    assert decode_broker(1, encode_broker(clean)) == clean
    older = decode_broker(1, b'{"version":1,"host":"h","port":1,"ts":0}')
    assert older.previous_broker_epoch is None
    assert older.shut_down_cleanly


# --- ELR bookkeeping -----------------------------------------------------------------------


def test_replicas_leaving_an_isr_below_min_isr_become_the_elr() -> None:
    before = state(1, 1, 2, 3)
    # 3 leaves: the ISR is still at min ISR 2, nobody is eligible beyond it.
    assert with_elr(before, state(1, 1, 2), 2) == state(1, 1, 2)
    # 2 leaves next: below min ISR, 2 holds every committed record (the HW stopped).
    shrunk = with_elr(state(1, 1, 2), state(1, 1), 2)
    assert shrunk.elr == (2,)
    assert shrunk.last_known_elr == ()
    # Back at min ISR: both lists empty.
    assert with_elr(shrunk, state(1, 1, 3, elr=(2,)), 2).elr == ()


def test_a_crashed_replica_goes_to_the_last_known_elr() -> None:
    after = with_elr(state(1, 1, elr=(2, 3)), state(1, 1, elr=(2, 3)), 2, crashed={3})
    assert after.elr == (2,)
    assert after.last_known_elr == (3,)


# --- the election order ----------------------------------------------------------------------


def test_last_replica_standing_restarted_uncleanly_is_not_elected_before_the_elr() -> None:
    """RF 3, min ISR 2: 1 left the ISR while it was at min ISR (not eligible), 2 below
    it (eligible), 3 led alone and restarted after an unclean shutdown."""
    offline = reconcile(
        REPLICAS,
        state(3, 3, elr=(2,)),
        {1, 3},
        crashed={3},
        min_isr=2,
        controller_epoch=8,
        brokers_zxid=200,
    )
    assert offline is not None
    assert offline.state == PartitionState(NO_LEADER, 5, (), 8, (2,), (3,), 3, 200)
    # 2 comes back (cleanly): it is elected, alone in the ISR; 3 is still not eligible.
    back = reconcile(REPLICAS, offline.state, {1, 2, 3}, min_isr=2, controller_epoch=8)
    assert back is not None
    assert back.state.leader == 2
    assert back.state.isr == (2,)
    assert back.state.elr == ()
    assert back.state.last_known_elr == (3,)
    assert not back.unclean
    assert not back.last_known_leader


def test_without_the_unclean_shutdown_the_last_isr_member_leads_again() -> None:
    elected = reconcile(
        REPLICAS, state(NO_LEADER, 3, elr=(2,), lkl=3), {1, 3}, min_isr=2, controller_epoch=8
    )
    assert elected is not None
    assert elected.state.leader == 3
    assert elected.state.isr == (3,)
    assert elected.state.elr == (2,)  # still eligible: 3 may fail again


def test_a_live_elr_member_leads_when_no_isr_member_is_live() -> None:
    elected = reconcile(REPLICAS, state(3, 3, elr=(2,)), {1, 2}, min_isr=2, controller_epoch=8)
    assert elected is not None
    assert elected.state.leader == 2
    assert elected.state.isr == (2,)
    assert elected.state.elr == (3,)  # the dead last ISR member holds everything too


def test_the_last_known_leader_only_when_isr_and_elr_are_both_empty() -> None:
    everyone_crashed = state(NO_LEADER, 3, elr=(2,), lkl=3)
    elected = reconcile(
        REPLICAS, everyone_crashed, ALL, crashed={2, 3}, min_isr=2, controller_epoch=8
    )
    assert elected is not None
    assert elected.last_known_leader
    assert elected.state.leader == 3
    assert elected.state.isr == (3,)
    assert elected.state.elr == ()
    assert elected.state.last_known_elr == ()
    # One eligible replica left (dead): wait for it.
    waiting = reconcile(
        REPLICAS, everyone_crashed, {1, 3}, crashed={3}, min_isr=2, controller_epoch=8
    )
    assert waiting is not None
    assert waiting.state.leader == NO_LEADER


def test_unclean_election_only_if_allowed() -> None:
    stuck = state(NO_LEADER, 3, elr=(2,), lkl=3)
    assert reconcile(REPLICAS, stuck, {1}, min_isr=2, controller_epoch=8) is None
    unclean = reconcile(REPLICAS, stuck, {1}, min_isr=2, unclean_allowed=True, controller_epoch=8)
    assert unclean is not None
    assert unclean.unclean
    assert unclean.state.leader == 1
    assert unclean.state.elr == ()


def test_an_elr_change_alone_keeps_the_leader_epoch() -> None:
    changed = reconcile(
        REPLICAS,
        state(1, 1, elr=(2,)),
        ALL,
        crashed={2},
        min_isr=2,
        controller_epoch=8,
        brokers_zxid=300,
    )
    assert changed is not None
    assert changed.state == PartitionState(1, 4, (1,), 8, (), (2,), NO_LEADER, 300)


def test_an_unclean_restart_is_handled_once_per_partition() -> None:
    epochs = {1: 150, 2: 250, 3: 90}
    before = state(1, 1, 2, zxid=200)
    assert crashed_replicas(REPLICAS, before, 210, epochs, {2, 3}) == {2}  # 3 registered before
    handled = reconcile(
        REPLICAS, before, ALL, crashed={2}, min_isr=2, controller_epoch=8, brokers_zxid=260
    )
    assert handled is not None
    assert handled.state.isr == (1,)
    assert handled.state.leader_epoch == 4  # the leader stays: its epoch too
    assert handled.state.last_known_elr == (2,)
    # 2 catches up and rejoins (a leader write, which carries the bound): not again.
    rejoined = with_elr(handled.state, replace(handled.state, isr=(1, 2)), 2)
    assert crashed_replicas(REPLICAS, rejoined, 400, epochs, {2, 3}) == set()


@given(
    isr=st.lists(st.sampled_from(REPLICAS), max_size=3, unique=True),
    elr=st.lists(st.sampled_from(REPLICAS), max_size=3, unique=True),
    leader=st.sampled_from((NO_LEADER, *REPLICAS)),
    live=st.sets(st.sampled_from(REPLICAS)),
    crashed=st.sets(st.sampled_from(REPLICAS)),
    min_isr=st.integers(1, 3),
    unclean=st.booleans(),
)
def test_a_clean_election_picks_a_live_isr_or_elr_member_that_did_not_crash(
    isr: list[int],
    elr: list[int],
    leader: int,
    live: set[int],
    crashed: set[int],
    min_isr: int,
    unclean: bool,
) -> None:
    if leader != NO_LEADER and leader not in isr:
        isr = [leader, *isr]  # a leader is an ISR member
    elr = [r for r in elr if r not in isr]
    crashed &= live  # only a registered broker reports an unclean restart
    before = state(leader, *isr, elr=tuple(elr))
    elected = reconcile(
        REPLICAS,
        before,
        live,
        crashed=crashed,
        min_isr=min_isr,
        unclean_allowed=unclean,
        controller_epoch=8,
    )
    if elected is None:
        return
    after = elected.state
    assert not set(after.isr) & set(after.elr)
    if len(after.isr) >= min_isr:
        assert after.elr == ()
        assert after.last_known_elr == ()
    if after.leader == NO_LEADER:
        assert not (live & (set(isr) | set(elr)) - crashed)  # nobody eligible was live
        assert not unclean or not live
        return
    assert after.leader in live
    assert after.leader in after.isr
    if elected.unclean or elected.last_known_leader:
        assert after.isr == (after.leader,)
        assert after.elr == ()
        if elected.last_known_leader:
            assert not set(isr) - crashed
            assert not set(elr) - crashed
        return
    assert not set(after.isr) & crashed
    assert not set(after.elr) & crashed
    if after.leader != leader:
        assert after.leader in (set(isr) | set(elr)) - crashed
    # A leader change bumps the epoch; an ISR shrink under the same leader, or anything
    # else, does not (KAFKA-15021).
    bumped = after.leader != before.leader
    assert after.leader_epoch == before.leader_epoch + (1 if bumped else 0)


# --- strict min ISR --------------------------------------------------------------------------


class _Writes:
    def __init__(self) -> None:
        self.isrs: list[tuple[int, ...]] = []

    def __call__(self, _t: str, _p: int, _leader: int, _epoch: int, isr: tuple[int, ...]) -> bool:
        self.isrs.append(isr)
        return True


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[LogManager]:
    manager = LogManager.open(tmp_path, LogManagerConfig(), ManualClock())
    manager.create_topic("t", 1, {"min.insync.replicas": "2"})
    yield manager
    manager.close()


def _view(isr: tuple[int, ...]) -> ClusterMetadata:
    brokers = {b: BrokerRegistration(b, "127.0.0.1", 1000 + b) for b in REPLICAS}
    topic = TopicMetadata(
        TopicAssignment("t", "id", {0: REPLICAS}), {0: PartitionState(1, 3, isr, 1)}, {}
    )
    return ClusterMetadata(brokers, 1, {"t": topic})


def test_the_high_watermark_stays_while_the_isr_is_below_min_isr(logs: LogManager) -> None:
    partitions = PartitionRegistry(logs, 1, ManualClock(), replicated=True)
    replicas = ReplicaManager(
        ReplicaSettings(1),
        partitions,
        ManualClock(),
        _Writes(),
        FetcherPool(1, partitions, lambda _b: None),
    )
    plog = logs.get_log("t", 0)
    replicas.apply(_view((1,)))
    plog.append(make_batch([b"acks=1 record"]), leader_epoch=3)
    replicas.after_append("t", 0)
    assert plog.high_watermark == 0  # alone in the ISR, min ISR 2: consumers see nothing
    # Follower 2 has it too, but is not in the ISR yet: still nothing.
    replicas.on_follower_fetch(2, PartitionFetchSpec("t", 0, 1), plog)
    assert plog.high_watermark == 0


def test_with_enough_in_sync_replicas_the_high_watermark_moves(logs: LogManager) -> None:
    partitions = PartitionRegistry(logs, 1, ManualClock(), replicated=True)
    replicas = ReplicaManager(
        ReplicaSettings(1),
        partitions,
        ManualClock(),
        _Writes(),
        FetcherPool(1, partitions, lambda _b: None),
    )
    plog = logs.get_log("t", 0)
    replicas.apply(_view((1, 2)))
    plog.append(make_batch([b"a"]), leader_epoch=3)
    replicas.on_follower_fetch(2, PartitionFetchSpec("t", 0, 1), plog)
    assert plog.high_watermark == 1


# --- the clean-shutdown marker ---------------------------------------------------------------


def test_the_marker_carries_the_broker_epoch_to_the_next_open(tmp_path: Path) -> None:
    first = LogManager.open(tmp_path, LogManagerConfig(), ManualClock())
    assert first.previous_broker_epoch == -1  # a new directory: nothing to vouch for
    first.record_broker_epoch(4_294_967_300)
    first.close()
    second = LogManager.open(tmp_path, LogManagerConfig(), ManualClock())
    assert second.previous_broker_epoch == 4_294_967_300
    assert not (tmp_path / CLEAN_SHUTDOWN_MARKER).exists()  # removed at open
    # A crash now (no close): the next open finds no marker.
    third = LogManager.open(tmp_path, LogManagerConfig(), ManualClock())
    assert third.previous_broker_epoch == -1
    third.close()
    (tmp_path / CLEAN_SHUTDOWN_MARKER).write_bytes(b'{"version": 0}\n')  # an older marker
    fourth = LogManager.open(tmp_path, LogManagerConfig(), ManualClock())
    assert fourth.previous_broker_epoch == 0  # clean, no epoch recorded
    fourth.close()
