"""ACL bindings shared through ZooKeeper: added on one broker, in force on every other."""

from __future__ import annotations

import itertools
import threading
import time

from tidelog.broker.cluster.acls import ZooKeeperAclStore
from tidelog.broker.cluster.store import ClusterStore
from tidelog.broker.cluster.testing import ZooKeeperServer
from tidelog.broker.core.acl import AclBinding, AclFilter, Operation, ResourceType
from tidelog.broker.core.acl_store import Acls

_chroots = itertools.count()


def binding(principal: str, name: str) -> AclBinding:
    return AclBinding.parse(
        principal=principal,
        host="*",
        operation="READ",
        permission="ALLOW",
        resource_type="TOPIC",
        resource_name=name,
    )


def test_bindings_reach_every_broker_and_racing_writers_both_land(
    zookeeper: ZooKeeperServer,
) -> None:
    connect = f"{zookeeper.connect_string}/acls-{next(_chroots)}"
    stores = [ClusterStore.connect(connect, session_timeout_ms=4_000) for _ in range(2)]
    try:
        first, second = (ZooKeeperAclStore.open(s) for s in stores)
        acls = Acls(second, enabled=True)
        assert not acls.allowed("User:a", "h", Operation.READ, ResourceType.TOPIC, "t")
        first.add([binding("User:a", "t")])
        deadline = time.monotonic() + 10
        while not acls.allowed("User:a", "h", Operation.READ, ResourceType.TOPIC, "t"):
            assert time.monotonic() < deadline, "the other broker never saw the binding"
            time.sleep(0.05)
        # Two brokers adding at once: compare-and-set keeps both.
        threads = [
            threading.Thread(target=store.add, args=([binding(f"User:{i}", "u")],))
            for i, store in enumerate((first, second))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        deadline = time.monotonic() + 10
        while {b.principal for b in first.bindings()} != {"User:0", "User:1", "User:a"}:
            assert time.monotonic() < deadline, f"lost a racing write: {first.bindings()}"
            time.sleep(0.05)
        assert len(second.remove(AclFilter(resource_name="u"))) == 2
        deadline = time.monotonic() + 10
        while [b.principal for b in first.bindings()] != ["User:a"]:
            assert time.monotonic() < deadline, "the removal never reached the other broker"
            time.sleep(0.05)
    finally:
        for store in stores:
            store.close()
