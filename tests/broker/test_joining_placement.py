"""A broker still joining its cluster (``JoiningPlacement``, ``JoiningTopicAdmin``) is not a
single node: it describes no topic (it would show every partition without a leader, as
if offline: seen in a rolling restart), coordinates no group and administers no topic.
It answers retriable errors, which clients retry, and serves once it has joined."""

from __future__ import annotations

import pytest

from broker.placement import JoiningPlacement, JoiningTopicAdmin
from broker.testing import InProcessBroker
from client import AdminClient, Consumer, TopicPartition
from storage.errors import LeaderNotAvailableError, NotControllerError, NotCoordinatorError


def test_a_joining_broker_describes_no_topic_until_it_has_the_view() -> None:
    with InProcessBroker() as broker, AdminClient(broker.address) as admin:
        admin.create_topic("joining", 2)
        core = broker.server.core
        joined = core.placement
        core.placement = JoiningPlacement(0)
        try:
            with pytest.raises(LeaderNotAvailableError, match="joining the cluster"):
                admin.describe_topic("joining", timeout_ms=2_000)
        finally:
            core.placement = joined
        described = admin.describe_topic("joining", timeout_ms=10_000)
        assert [p.leader for p in described.partitions] == [0, 0]


def test_a_joining_broker_coordinates_no_group_and_administers_no_topic() -> None:
    """While joining, the core must not take the broker for a single node: its offsets
    cache holds its whole local log, whose tail may never have been replicated (a
    restarted coordinator once answered a commit the new coordinator never had, and the
    group's committed offset was seen going backwards)."""
    tp = TopicPartition("joining-groups", 0)
    with InProcessBroker() as broker, AdminClient(broker.address) as admin:
        admin.create_topic(tp.topic, 1)
        with Consumer(broker.address, group_id="joining-g") as consumer:
            consumer.commit({tp: 7})
            assert consumer.committed(tp) == 7
            core = broker.server.core
            joined_placement, joined_admin = core.placement, core.topic_admin
            core.placement = JoiningPlacement(0)
            core.topic_admin = JoiningTopicAdmin(0)
            try:
                with pytest.raises((NotCoordinatorError, LeaderNotAvailableError)):
                    consumer.committed(tp, timeout_ms=2_000)
                with pytest.raises(NotControllerError):
                    admin.create_topic("made-while-joining", 1, timeout_ms=2_000)
                # Asked directly (a client with stale metadata), the core refuses too.
                with pytest.raises(NotControllerError, match="joining the cluster"):
                    core.create_topic("made-while-joining", 1, {})
            finally:
                core.placement, core.topic_admin = joined_placement, joined_admin
            assert consumer.committed(tp, timeout_ms=10_000) == 7
        assert "made-while-joining" not in {t.name for t in admin.list_topics()}
