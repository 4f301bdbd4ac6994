"""A broker still joining its cluster (``JoiningPlacement``) describes no topic: it would
show every partition without a leader, as if the partition were offline (seen in a
rolling restart, from the broker coming back). It answers ``LEADER_NOT_AVAILABLE``,
which clients retry, and describes the topic once it has the cluster's view."""

from __future__ import annotations

import pytest

from broker.placement import JoiningPlacement
from broker.testing import InProcessBroker
from client import AdminClient
from storage.errors import LeaderNotAvailableError


def test_a_joining_broker_describes_no_topic_until_it_has_the_view() -> None:
    with InProcessBroker() as broker, AdminClient(broker.address) as admin:
        admin.create_topic("joining", 2)
        core = broker.server.core
        joined = core.placement
        core.placement = JoiningPlacement(0)
        try:
            with pytest.raises(LeaderNotAvailableError, match="joining the cluster"):
                admin.describe_topic("joining", timeout_ms=600)
        finally:
            core.placement = joined
        described = admin.describe_topic("joining", timeout_ms=10_000)
        assert [p.leader for p in described.partitions] == [0, 0]
