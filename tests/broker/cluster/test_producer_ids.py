"""``ZooKeeperProducerIds`` against a real ZooKeeper: blocks, races, deaths, keyed ids, sweep.

Each allocator has its own ``ClusterStore`` (its own session), as each broker does.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from urllib.parse import unquote

import pytest

from tidelog.broker.cluster.producer_ids import PRODUCER_ID_BLOCK_SIZE, ZooKeeperProducerIds
from tidelog.broker.cluster.store import ClusterStore
from tidelog.broker.cluster.testing import ZooKeeperServer
from tidelog.broker.cluster.znodes import (
    ProducerIdBlock,
    ZnodeError,
    decode_producer_id_block,
    encode_producer_id_block,
    producer_key_name,
)
from tidelog.broker.core.producer_ids import MAX_PRODUCER_EPOCH
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import (
    InvalidProducerEpochError,
    InvalidRequestError,
    UnknownProducerIdError,
)

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
_chroots = itertools.count()

Allocator = Callable[..., ZooKeeperProducerIds]


@pytest.fixture
def connect(zookeeper: ZooKeeperServer) -> str:
    return f"{zookeeper.connect_string}/pids-{next(_chroots)}"


@pytest.fixture
def stores() -> Iterator[list[ClusterStore]]:
    opened: list[ClusterStore] = []
    yield opened
    for store in opened:
        store.close()


@pytest.fixture
def allocator(connect: str, stores: list[ClusterStore]) -> Allocator:
    """``allocator(broker_id, clock, **settings)``: a new allocator on its own session."""

    def build(
        broker_id: int, clock: ManualClock | None = None, **settings: int
    ) -> ZooKeeperProducerIds:
        store = ClusterStore.connect(connect, session_timeout_ms=4_000)
        stores.append(store)
        settings.setdefault("sweep_interval_ms", DAY_MS)
        return ZooKeeperProducerIds(store, broker_id, clock or ManualClock(), DAY_MS, **settings)

    return build


# --- pure: znode names and block JSON ---------------------------------------------------


@pytest.mark.parametrize("key", ["spark:q1:0:0", "a/b", ".", "..", "x y%z", "é✓", "/" * 1024])
def test_key_names_are_single_valid_znode_names_and_reversible(key: str) -> None:
    name = producer_key_name(key)
    assert "/" not in name
    assert name not in (".", "..")
    assert name.isascii()
    assert unquote(name) == key


def test_block_json_is_kafkas_and_reads_kafkas_string_ends() -> None:
    block = ProducerIdBlock(3, 1000, 1999)
    assert decode_producer_id_block(encode_producer_id_block(block)) == block
    kafka = b'{"version":1,"broker":3,"block_start":"1000","block_end":"1999"}'
    assert decode_producer_id_block(kafka) == block
    with pytest.raises(ZnodeError):
        decode_producer_id_block(b'{"version":1,"broker":3,"block_start":5,"block_end":4}')


# --- blocks ----------------------------------------------------------------------------


def test_ids_come_from_blocks_claimed_in_turn(allocator: Allocator) -> None:
    one, two = allocator(1), allocator(2)
    assert [one.init(-1, -1) for _ in range(3)] == [(0, 0), (1, 0), (2, 0)]
    assert two.init(-1, -1) == (PRODUCER_ID_BLOCK_SIZE, 0)
    assert one.block == ProducerIdBlock(1, 0, PRODUCER_ID_BLOCK_SIZE - 1)
    assert two.block == ProducerIdBlock(2, 1000, 1999)
    assert one.init(-1, -1) == (3, 0)  # one keeps drawing from its own block


def test_a_used_up_block_is_followed_by_a_new_one(allocator: Allocator) -> None:
    one, two = allocator(1, block_size=3), allocator(2, block_size=3)
    assert [one.init(-1, -1)[0] for _ in range(3)] == [0, 1, 2]
    assert two.init(-1, -1)[0] == 3
    assert one.init(-1, -1)[0] == 6  # block 3..5 is two's
    assert one.block == ProducerIdBlock(1, 6, 8)


def test_racing_allocators_never_hand_out_an_id_twice(allocator: Allocator) -> None:
    # Small blocks, so the two sessions race for the znode many times.
    allocators = [allocator(1, block_size=7), allocator(2, block_size=7)]
    per_thread = 120
    got: list[list[int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def draw(source: ZooKeeperProducerIds) -> None:
        ids: list[int] = []
        try:
            start.wait()
            for _ in range(per_thread):
                ids.append(source.init(-1, -1)[0])
        except BaseException as exc:
            errors.append(exc)
        got.append(ids)

    threads = [threading.Thread(target=draw, args=(allocators[i % 2],)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    every = [pid for ids in got for pid in ids]
    assert len(every) == 6 * per_thread
    assert len(set(every)) == len(every)


def test_a_broker_that_died_mid_block_starts_a_fresh_block(
    allocator: Allocator, stores: list[ClusterStore]
) -> None:
    first_life = allocator(1)
    assert [first_life.init(-1, -1)[0] for _ in range(5)] == [0, 1, 2, 3, 4]
    stores[0].close()  # the broker dies: 5..999 were never handed out and never will be
    second_life = allocator(1)
    assert second_life.init(-1, -1) == (1000, 0)
    assert allocator(2).init(-1, -1) == (2000, 0)


# --- epochs ----------------------------------------------------------------------------


def test_epoch_bumps_on_any_broker(allocator: Allocator) -> None:
    one, two = allocator(1), allocator(2)
    pid, _ = one.init(-1, -1)
    assert one.init(pid, 0) == (pid, 1)
    with pytest.raises(InvalidProducerEpochError, match="epoch 0 is not the current epoch 1"):
        one.init(pid, 0)
    # Two has no record of pid: an id within a claimed block is known, the epoch trusted.
    assert two.init(pid, 1) == (pid, 2)
    # An id of a block claimed after two last looked is known too (two re-reads the znode).
    three = allocator(3)
    later, _ = three.init(-1, -1)
    assert later == 1000
    assert two.init(later, 0) == (later, 1)


def test_unknown_ids_and_malformed_requests(allocator: Allocator) -> None:
    one = allocator(1)
    with pytest.raises(UnknownProducerIdError):
        one.init(0, 0)  # no block claimed at all yet
    one.init(-1, -1)
    with pytest.raises(UnknownProducerIdError):
        one.init(PRODUCER_ID_BLOCK_SIZE, 0)  # beyond every claimed block
    for pid, epoch in [(-1, 0), (0, -1), (-2, -2), (0, MAX_PRODUCER_EPOCH + 1)]:
        with pytest.raises(InvalidRequestError):
            one.init(pid, epoch)
    with pytest.raises(InvalidRequestError):
        one.init_keyed("")


def test_an_exhausted_epoch_gets_a_fresh_id(allocator: Allocator) -> None:
    pid, _ = allocator(1).init(-1, -1)
    # Another broker has no record of pid, so it trusts the epoch, which is the last one.
    assert allocator(2).init(pid, MAX_PRODUCER_EPOCH) == (PRODUCER_ID_BLOCK_SIZE, 0)


# --- keyed ids -------------------------------------------------------------------------


def test_a_key_has_one_id_on_every_broker(allocator: Allocator) -> None:
    clock = ManualClock()
    one, two = allocator(1, clock), allocator(2, clock)
    first = one.init_keyed("spark:q1:0:0")
    assert two.init_keyed("spark:q1:0:0") == first
    assert one.init_keyed("spark:q1:0:0") == first
    assert two.init_keyed("spark:q1:1:0") != first
    for odd in ("a/b", "..", "é✓"):
        assert one.init_keyed(odd) == two.init_keyed(odd)


def _race_for_key(allocators: list[ZooKeeperProducerIds], key: str) -> list[tuple[int, int]]:
    """Every allocator asks for ``key`` at once, each from its own thread."""
    answers: list[tuple[int, int]] = []
    start = threading.Barrier(len(allocators))

    def ask(source: ZooKeeperProducerIds) -> None:
        start.wait()
        answers.append(source.init_keyed(key))

    threads = [threading.Thread(target=ask, args=(a,)) for a in allocators]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def test_brokers_racing_for_a_new_key_agree(allocator: Allocator) -> None:
    allocators = [allocator(broker_id) for broker_id in (1, 2, 3)]
    for round_number in range(5):
        answers = _race_for_key(allocators, f"race-{round_number}")
        assert len(answers) == 3
        assert len(set(answers)) == 1, answers


def test_a_key_used_within_the_expiration_keeps_its_id(allocator: Allocator) -> None:
    clock = ManualClock()
    one, two = allocator(1, clock), allocator(2, clock)
    pid, _ = one.init_keyed("k")
    for _ in range(3):
        clock.advance(DAY_MS - HOUR_MS)  # each use refreshes the key
        assert two.init_keyed("k") == (pid, 0)


def test_an_expired_key_gets_a_fresh_id_never_used_before(allocator: Allocator) -> None:
    clock = ManualClock()
    one, two = allocator(1, clock), allocator(2, clock)
    old, _ = one.init_keyed("k")
    other, _ = one.init(-1, -1)
    clock.advance(DAY_MS + 1)
    fresh, epoch = two.init_keyed("k")
    assert epoch == 0
    assert fresh not in (old, other)
    assert one.init_keyed("k") == (fresh, 0)


def test_expired_keys_are_swept(allocator: Allocator, stores: list[ClusterStore]) -> None:
    clock = ManualClock()
    one = allocator(1, clock, sweep_interval_ms=10 * DAY_MS, sweep_max_reads=3)  # by hand
    for index in range(5):
        one.init_keyed(f"old-{index}")
    clock.advance(DAY_MS - HOUR_MS)
    one.init_keyed("recent")
    clock.advance(2 * HOUR_MS)  # the five are expired now, "recent" is not
    store = stores[0]
    assert len(store.producer_key_names()) == 6
    # At most sweep_max_reads keys are looked at per sweep; the cursor moves on.
    assert one.sweep_expired_keys() == 3
    assert one.sweep_expired_keys() == 2
    assert store.producer_key_names() == [producer_key_name("recent")]
    assert one.sweep_expired_keys() == 0


def test_a_sweep_runs_by_itself_once_due(allocator: Allocator, stores: list[ClusterStore]) -> None:
    clock = ManualClock()
    one = allocator(1, clock, sweep_interval_ms=10 * 60_000)
    two = allocator(2, clock, sweep_interval_ms=10 * 60_000)
    one.init_keyed("gone")
    clock.advance(DAY_MS + 1)
    two.init(-1, -1)  # the sweep is due on two: it removes the expired key
    assert stores[0].producer_key_names() == []
    one.init_keyed("fresh")
    two.init(-1, -1)  # not due again yet: nothing looked at, nothing removed
    assert stores[0].producer_key_names() == [producer_key_name("fresh")]
