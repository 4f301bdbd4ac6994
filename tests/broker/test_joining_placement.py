"""A broker still joining its cluster (``Membership.joining``: ``JoiningPlacement``,
``JoiningTopicAdmin``, ``UnavailableProducerIds``) is not a single node: it describes no
topic (it would show every partition without a leader, as if offline: seen in a rolling
restart), coordinates no group, administers no topic and hands out no producer id. It
answers retriable errors, which clients retry, and serves once its membership joined."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tidelog.broker.config import BrokerConfig
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.core.membership import Membership
from tidelog.broker.core.placement import LocalPlacement
from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.manager import OffsetCommitEntry
from tidelog.storage.errors import (
    BrokerUnavailableError,
    LeaderNotAvailableError,
    NotControllerError,
    NotCoordinatorError,
)


class _Admin:
    """A joined broker's topic administration, recording the calls."""

    def __init__(self, core: list[BrokerCore]) -> None:
        self._core = core
        self.created: list[str] = []

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str],
        *,
        assignment: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        self.created.append(name)
        self._core[0].logs.create_topic(name, partitions, config)

    def delete_topic(self, name: str) -> None:
        raise NotImplementedError

    def create_partitions(
        self, name: str, total: int, *, assignment: Sequence[Sequence[int]] | None = None
    ) -> None:
        raise NotImplementedError

    def alter_topic_config(self, name: str, config: Mapping[str, str]) -> None:
        raise NotImplementedError

    def elect_leaders(
        self, unclean: bool, partitions: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], str]:
        return {}

    def controlled_shutdown(self, broker_id: int) -> int:
        return 0


class _ProducerIds:
    def init(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        return 5, 0

    def init_keyed(self, key: str) -> tuple[int, int]:
        return 6, 0


@pytest.fixture
def joining(tmp_path: Path) -> Iterator[tuple[BrokerCore, Membership]]:
    membership = Membership.joining(0)
    core = BrokerCore.open(BrokerConfig(data_dir=tmp_path), membership=membership)
    try:
        yield core, membership
    finally:
        core.close()


def test_a_joining_broker_describes_no_topic_until_it_has_the_view(
    joining: tuple[BrokerCore, Membership],
) -> None:
    core, membership = joining
    core.logs.create_topic("joining", 2, {})
    with pytest.raises(LeaderNotAvailableError, match="joining the cluster"):
        core.describe_topic("joining")
    membership.join(LocalPlacement(0, "c"), _Admin([core]), _ProducerIds(), None)
    described = core.describe_topic("joining")
    assert [p.leader for p in described.partitions] == [0, 0]


def test_a_joining_broker_coordinates_no_group_and_administers_no_topic(
    joining: tuple[BrokerCore, Membership],
) -> None:
    """While joining, the core must not take the broker for a single node: its offsets
    cache holds its whole local log, whose tail may never have been replicated (a
    restarted coordinator once answered a commit the new coordinator never had, and the
    group's committed offset was seen going backwards)."""
    core, membership = joining
    with pytest.raises((NotCoordinatorError, LeaderNotAvailableError)):
        core.fetch_offsets("joining-g", None)
    with pytest.raises((NotCoordinatorError, LeaderNotAvailableError)):
        core.commit_offsets("joining-g", "", -1, [OffsetCommitEntry(TopicPartition("t", 0), 7)])
    with pytest.raises(NotControllerError, match="joining the cluster"):
        core.create_topic("made-while-joining", 1, {})
    with pytest.raises(BrokerUnavailableError, match="joining the cluster"):
        core.init_producer_id(-1, -1)
    assert "made-while-joining" not in {t.name for t in core.list_topics(include_internal=False)}

    admin = _Admin([core])
    membership.join(LocalPlacement(0, "c"), admin, _ProducerIds(), None)
    assert core.init_producer_id(-1, -1) == (5, 0)
    core.create_topic("made-after-joining", 1, {})
    assert admin.created == ["made-after-joining"]
    with pytest.raises(ValueError, match="already joined"):
        membership.join(LocalPlacement(0, "c"), admin, _ProducerIds(), None)


def test_a_single_node_never_joins(tmp_path: Path) -> None:
    core = BrokerCore.open(BrokerConfig(data_dir=tmp_path))
    try:
        assert core.topic_admin is None
        with pytest.raises(ValueError, match="already joined"):
            core.membership.join(LocalPlacement(0, "c"), _Admin([core]), _ProducerIds(), None)
    finally:
        core.close()
