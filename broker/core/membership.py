"""This broker's role, as one object handed to the core at construction: who places the
partitions, who administers topics, where producer ids and SCRAM users come from.

A single node has one role for its whole life (``Membership.single_node``: it leads
everything, administers topics itself, draws producer ids from its data directory). A
broker in a cluster starts *joining* (``Membership.joining``): it leads nothing
(``JoiningPlacement``), refuses topic administration (``JoiningTopicAdmin``) and hands
out no producer ids (``UnavailableProducerIds``), so a client that connects early never
has this broker act as if it were a single node. Once ``ClusterNode.start`` has the
cluster's view, the assembly (``broker.assembly``) calls ``join`` once, and from then on
the core sees the cluster's placement, the node as topic administrator, ZooKeeper's
producer ids and ZooKeeper's users (``/config/users``, the data directory's file as
fallback).

The change of role is this object's state, not attributes assigned onto the core: the
core, the authenticator and the listeners hold the same ``Membership`` from
construction on (issue #26: "nothing assigned after construction").

Thread-safe: a role is one immutable ``Role`` value, read without a lock (one attribute
read) and replaced whole under ``_lock``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tidelog.broker.core.placement import (
    Growth,
    JoiningPlacement,
    JoiningTopicAdmin,
    LocalPlacement,
    NewTopic,
    Placement,
)
from tidelog.broker.core.producer_ids import ProducerIdSource, UnavailableProducerIds
from tidelog.broker.core.users import UserStore, ZooKeeperUserStore

if TYPE_CHECKING:
    from collections.abc import Mapping

    from tidelog.broker.cluster.store import ClusterStore
    from tidelog.broker.core.scram import ScramCredential
    from tidelog.broker.core.users import FileUserStore
    from tidelog.broker.transactions.markers import TxnPeers

__all__ = ["Membership", "Role", "TopicAdmin"]


class TopicAdmin(Protocol):
    """Cluster mode's topic administration (``broker.cluster.node.ClusterNode``).

    Each call returns once this broker's own view and local logs show the change.
    """

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str],
        *,
        assignment: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        """``assignment``: the replicas of partitions ``0..partitions-1`` as given
        (checked for shape by the caller; the controller checks the brokers)."""
        ...

    def delete_topic(self, name: str) -> None: ...

    def create_topics(
        self, specs: Sequence[NewTopic], timeout_ms: int
    ) -> dict[str, Exception | None]:
        """Many topics in one batch: per topic None (created, and every partition led in
        this broker's view, unless ``timeout_ms <= 0``) or its error
        (``KafkaTimeoutError`` for one still pending at ``timeout_ms``)."""
        ...

    def delete_topics(self, names: Sequence[str], timeout_ms: int) -> dict[str, Exception | None]:
        """Many topics in one batch: per topic None (gone from this broker's view,
        unless ``timeout_ms <= 0``) or its error."""
        ...

    def create_partitions_many(
        self, growths: Sequence[Growth], timeout_ms: int
    ) -> dict[str, Exception | None]:
        """Many topics grown in one batch: per topic None (grown, and every new partition
        led in this broker's view, unless ``timeout_ms <= 0``) or its error."""
        ...

    def create_partitions(
        self, name: str, total: int, *, assignment: Sequence[Sequence[int]] | None = None
    ) -> None:
        """``assignment``: one replica list per new partition, in order."""
        ...

    def alter_topic_config(self, name: str, config: Mapping[str, str]) -> None: ...

    def elect_leaders(
        self, unclean: bool, partitions: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], str]: ...

    def alter_partition_reassignments(
        self, targets: Mapping[tuple[str, int], Sequence[int] | None]
    ) -> dict[tuple[str, int], str]: ...

    def list_partition_reassignments(
        self, partitions: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]: ...

    def controlled_shutdown(self, broker_id: int) -> int: ...

    def run_forwarded(self, call: str, arguments: Mapping[str, Any]) -> Any:
        """The controller's half of a call another broker forwarded
        (``broker.cluster.forwarding``): its JSON answer; ``NotControllerError`` if this
        broker is not the controller."""
        ...


@dataclass(frozen=True, slots=True)
class Role:
    """One state of the membership. ``topic_admin`` None: a single node, which
    administers its own topics; ``cluster_store`` None: users from the data directory;
    ``txn_peers`` None: no other broker to send transaction calls to (a single node, or
    a cluster broker still joining)."""

    placement: Placement
    topic_admin: TopicAdmin | None
    producer_ids: ProducerIdSource
    cluster_store: ClusterStore | None = None
    joined: bool = True
    txn_peers: TxnPeers | None = None


class Membership:
    """The broker's current role (module docstring). Thread-safe. Build with
    ``single_node`` or ``joining``."""

    def __init__(self, role: Role, local_placement: LocalPlacement | None = None) -> None:
        self._lock = threading.Lock()
        self._role = role  # replaced whole under _lock; read without it
        self._local_placement = local_placement

    @classmethod
    def single_node(cls, placement: LocalPlacement, producer_ids: ProducerIdSource) -> Membership:
        """A single node's role, fixed for its life."""
        return cls(Role(placement, None, producer_ids), placement)

    @classmethod
    def joining(cls, broker_id: int) -> Membership:
        """A cluster broker before it has the cluster's view (module docstring)."""
        return cls(
            Role(
                JoiningPlacement(broker_id),
                JoiningTopicAdmin(broker_id),
                UnavailableProducerIds(broker_id),
                joined=False,
            )
        )

    def join(
        self,
        placement: Placement,
        topic_admin: TopicAdmin,
        producer_ids: ProducerIdSource,
        cluster_store: ClusterStore | None,
        txn_peers: TxnPeers | None = None,
    ) -> None:
        """The broker has joined: serve the cluster's role from now on. Once.
        ``cluster_store``: where the cluster's users are (None: the data directory's);
        ``txn_peers``: the transaction calls to other brokers (markers, verification).

        Raises ``ValueError`` on a single node or when already joined.
        """
        with self._lock:
            if self._role.joined:
                raise ValueError("this broker's membership has already joined (or is a node)")
            self._role = Role(
                placement, topic_admin, producer_ids, cluster_store, txn_peers=txn_peers
            )

    def advertise(self, host: str, port: int) -> None:
        """A single node's client address, known once its listener is bound; nothing in a
        cluster (the registration in ZooKeeper carries it there)."""
        if self._local_placement is not None:
            self._local_placement.advertise(host, port)

    @property
    def role(self) -> Role:
        """The role now (one consistent value)."""
        return self._role

    @property
    def placement(self) -> Placement:
        return self._role.placement

    @property
    def topic_admin(self) -> TopicAdmin | None:
        return self._role.topic_admin

    @property
    def producer_ids(self) -> ProducerIdSource:
        return self._role.producer_ids

    def users(self, local: FileUserStore) -> UserStore:
        """The SCRAM users as this membership sees them: ``local`` (the data directory's
        file) until the broker joined a cluster, ZooKeeper's with ``local`` as fallback
        after (``broker.core.users``)."""
        return _MembershipUsers(self, local)


class _MembershipUsers:
    """``Membership.users``. Thread-safe."""

    def __init__(self, membership: Membership, local: FileUserStore) -> None:
        self._membership = membership
        self._local = local

    def _store(self) -> UserStore:
        cluster_store = self._membership.role.cluster_store
        if cluster_store is None:
            return self._local
        return ZooKeeperUserStore(cluster_store, self._local)

    def get(self, name: str, mechanism: str) -> ScramCredential | None:
        return self._store().get(name, mechanism)

    def upsert(self, name: str, credential: ScramCredential) -> None:
        self._store().upsert(name, credential)

    def delete(self, name: str, mechanism: str | None) -> bool:
        return self._store().delete(name, mechanism)

    def users(self) -> dict[str, dict[str, ScramCredential]]:
        return self._store().users()
