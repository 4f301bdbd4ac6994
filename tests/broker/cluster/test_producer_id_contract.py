"""One contract for every ``ProducerIdSource``: the local file and ZooKeeper.

What a producer may rely on whichever mode the broker runs in. The cluster-only
behaviour (blocks, races, other brokers) is in ``test_producer_ids.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tidelog.broker.cluster.producer_ids import ZooKeeperProducerIds
from tidelog.broker.cluster.store import ClusterStore
from tidelog.broker.core.producer_ids import (
    ProducerIdManager,
    ProducerIdSource,
    UnavailableProducerIds,
)
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import (
    BrokerUnavailableError,
    InvalidProducerEpochError,
    InvalidRequestError,
    UnknownProducerIdError,
)

DAY_MS = 86_400_000
_chroots = itertools.count()

Factory = Callable[[ManualClock], ProducerIdSource]


@pytest.fixture(params=["local", "zookeeper"])
def build(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    stores: list[ClusterStore] = []
    if request.param == "local":

        def local(clock: ManualClock) -> ProducerIdSource:
            return ProducerIdManager.open(tmp_path, clock, DAY_MS)

        yield local
        return
    zookeeper = request.getfixturevalue("zookeeper")
    connect = f"{zookeeper.connect_string}/contract-{next(_chroots)}"

    def in_zookeeper(clock: ManualClock) -> ProducerIdSource:
        store = ClusterStore.connect(connect, session_timeout_ms=4_000)
        stores.append(store)
        return ZooKeeperProducerIds(store, 1, clock, DAY_MS, sweep_interval_ms=600_000)

    yield in_zookeeper
    for store in stores:
        store.close()


def test_new_ids_are_distinct_with_epoch_zero(build: Factory) -> None:
    source = build(ManualClock())
    answers = [source.init(-1, -1) for _ in range(5)]
    assert {epoch for _, epoch in answers} == {0}
    assert len({pid for pid, _ in answers}) == 5


def test_a_bump_fences_the_previous_epoch(build: Factory) -> None:
    source = build(ManualClock())
    pid, epoch = source.init(-1, -1)
    assert source.init(pid, epoch) == (pid, epoch + 1)
    with pytest.raises(InvalidProducerEpochError):
        source.init(pid, epoch)
    assert source.init(pid, epoch + 1) == (pid, epoch + 2)


def test_an_expired_epoch_entry_trusts_the_producer(build: Factory) -> None:
    clock = ManualClock()
    source = build(clock)
    pid, _ = source.init(-1, -1)
    clock.advance(DAY_MS + 1)
    assert source.init(pid, 5) == (pid, 6)


def test_unknown_ids_and_malformed_requests_are_refused(build: Factory) -> None:
    source = build(ManualClock())
    source.init(-1, -1)
    with pytest.raises(UnknownProducerIdError):
        source.init(10**9, 0)
    for pid, epoch in [(-1, 0), (0, -1), (-2, -2), (0, 32768)]:
        with pytest.raises(InvalidRequestError):
            source.init(pid, epoch)
    for key in ("", "k" * 1025):
        with pytest.raises(InvalidRequestError):
            source.init_keyed(key)


def test_a_key_keeps_its_id_until_it_expires(build: Factory) -> None:
    clock = ManualClock()
    source = build(clock)
    plain, _ = source.init(-1, -1)
    first = source.init_keyed("spark:q:0:0")
    assert first[1] == 0
    assert first[0] != plain
    assert source.init_keyed("spark:q:0:0") == first
    assert source.init_keyed("spark:q:1:0")[0] not in (first[0], plain)
    clock.advance(DAY_MS - 1)
    assert source.init_keyed("spark:q:0:0") == first  # used: refreshed
    clock.advance(DAY_MS + 1)
    fresh = source.init_keyed("spark:q:0:0")
    assert fresh[1] == 0
    assert fresh[0] != first[0]


def test_a_joining_broker_serves_no_ids_yet() -> None:
    joining = UnavailableProducerIds(3)
    for call in (lambda: joining.init(-1, -1), lambda: joining.init_keyed("k")):
        with pytest.raises(BrokerUnavailableError, match="joining") as raised:
            call()
        assert raised.value.retriable
