"""Where partitions live and who leads them, as the core sees it: one seam, two answers.

``BrokerCore`` asks a ``Placement`` three things: the cluster as a client should see it
(brokers, controller, cluster id: Kafka's Metadata), each partition's leader, replicas,
ISR and leader epoch, and, before every produce, fetch and offset lookup, whether this
broker leads the partition (``check_leader`` raises ``NotLeaderOrFollowerError`` or, for
a partition without a leader, ``LeaderNotAvailableError``: both retriable, so clients
refresh their metadata and retry).

* ``LocalPlacement``: a single node (no ``zookeeper.connect``, the embedded default). The
  node is broker ``broker.id`` (0 by default), controller and leader of every partition at
  epoch 0, the only replica and ISR member.
* ``JoiningPlacement``: cluster mode before the broker has the cluster's view: it leads
  nothing (``LEADER_NOT_AVAILABLE``, retriable), so nothing is written here that another
  broker leads, and it describes no topic (``check_joined``): a restarting broker would
  otherwise show every partition without a leader, as if offline. Its companion
  ``JoiningTopicAdmin`` refuses topic administration; together they keep the core from
  taking a joining broker for a single node (which would coordinate groups from its own
  log's unreplicated tail: committed offsets seen going backwards after a restart).
* ``broker.cluster.node.ClusterPlacement``: cluster mode, from the ZooKeeper view.

Both are thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidelog.storage.errors import LeaderNotAvailableError, NotControllerError

__all__ = [
    "BrokerEndpoint",
    "ClusterView",
    "Growth",
    "JoiningPlacement",
    "JoiningTopicAdmin",
    "LocalPlacement",
    "NewTopic",
    "PartitionPlacement",
    "Placement",
]

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    """Where clients reach a broker: its gRPC endpoint, and its Kafka listener's
    (``kafka``: ``(host, port)``; None when it has none or, on a single node, when the
    Kafka listener answers with its own)."""

    broker_id: int
    host: str
    port: int
    kafka: tuple[str, int] | None = None
    rack: str | None = None  # ``broker.rack``


@dataclass(frozen=True, slots=True)
class PartitionPlacement:
    """One partition's leadership: leader -1 means none (offline). ``elr`` and
    ``last_known_elr``: KIP-966's eligible leader replicas and last known ELR
    (``broker.cluster.election``), kept in cluster mode only; empty on a single node."""

    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What Metadata answers besides topics. ``cut_off``: this broker has lost touch with
    the cluster's coordinator and vouches for no role (``broker.cluster.session``)."""

    cluster_id: str
    broker_id: int
    controller_id: int
    brokers: Sequence[BrokerEndpoint] = field(default_factory=tuple)
    cut_off: bool = False


class Placement(Protocol):
    """Leadership as the core needs it. Implementations are thread-safe."""

    def cluster(self) -> ClusterView:
        """Brokers, controller and this broker's id."""
        ...

    def topics(self) -> Mapping[str, int] | None:
        """The cluster's topics and partition counts, or None: the local log manager's."""
        ...

    def partition(self, topic: str, partition: int) -> PartitionPlacement:
        """Leader, epoch, replicas and ISR of a partition the caller knows exists."""
        ...

    def check_leader(self, topic: str, partition: int) -> None:
        """Raise unless this broker leads the partition now."""
        ...

    def confirm_leader(self, topic: str, partition: int) -> None:
        """``check_leader`` against the coordinator itself, not this broker's view (which
        may lag a leadership change): for reads that must not be stale. Raises as
        ``check_leader`` does."""
        ...

    def check_joined(self) -> None:
        """Raise ``LeaderNotAvailableError`` (retriable) while this broker has no view of
        the cluster yet: its answers about leaders would say "none" for every partition."""
        ...


class LocalPlacement:
    """A single node: it leads everything. Thread-safe (immutable but for the endpoint)."""

    def __init__(self, broker_id: int, cluster_id: str, rack: str | None = None) -> None:
        self._broker_id = broker_id
        self._cluster_id = cluster_id
        self._rack = rack
        self._endpoint = BrokerEndpoint(broker_id, "127.0.0.1", 0, rack=rack)
        self._placement = PartitionPlacement(broker_id, 0, (broker_id,), (broker_id,))

    def advertise(self, host: str, port: int) -> None:
        """The address clients use (known once the listener is bound)."""
        self._endpoint = BrokerEndpoint(self._broker_id, host, port, rack=self._rack)

    def cluster(self) -> ClusterView:
        return ClusterView(self._cluster_id, self._broker_id, self._broker_id, (self._endpoint,))

    def topics(self) -> Mapping[str, int] | None:
        return None

    def partition(self, topic: str, partition: int) -> PartitionPlacement:
        return self._placement

    def check_leader(self, topic: str, partition: int) -> None:
        return None

    def confirm_leader(self, topic: str, partition: int) -> None:
        return None

    def check_joined(self) -> None:
        return None


class JoiningPlacement:
    """Cluster mode until the view arrives: no topics, no leadership. Thread-safe."""

    def __init__(self, broker_id: int) -> None:
        self._broker_id = broker_id

    def cluster(self) -> ClusterView:
        return ClusterView("", self._broker_id, NO_LEADER, ())

    def topics(self) -> Mapping[str, int] | None:
        return {}

    def partition(self, topic: str, partition: int) -> PartitionPlacement:
        return PartitionPlacement(NO_LEADER, -1, (), ())

    def check_leader(self, topic: str, partition: int) -> None:
        raise LeaderNotAvailableError(
            f"broker {self._broker_id} is joining the cluster; {topic}-{partition} is not "
            "served here yet"
        )

    def confirm_leader(self, topic: str, partition: int) -> None:
        self.check_leader(topic, partition)

    def check_joined(self) -> None:
        raise LeaderNotAvailableError(
            f"broker {self._broker_id} is joining the cluster and does not know its "
            "partitions' leaders yet; ask again"
        )


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create in a cluster (``TopicAdmin.create_topics``): its partition
    count and replication factor, placed by the controller's round robin, or ``manual``,
    (partition, replicas) pairs with the preferred leader first, written as given."""

    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str]
    manual: list[tuple[int, tuple[int, ...]]] | None = None


@dataclass(frozen=True, slots=True)
class Growth:
    """A topic to grow to ``total`` partitions (``TopicAdmin.create_partitions_many``),
    placed by the controller's round robin or ``manual``: one replica list per new
    partition, in order."""

    name: str
    total: int
    manual: list[tuple[int, ...]] | None = None


class JoiningTopicAdmin:
    """Cluster mode's topic administration until the broker has joined: every call is
    refused with ``NotControllerError`` (retriable: clients ask the controller they find
    in another broker's metadata). Without it the core would take a joining broker for a
    single node and create topics, or coordinate groups, on its own. Thread-safe."""

    def __init__(self, broker_id: int) -> None:
        self._broker_id = broker_id

    def _refuse(self) -> NotControllerError:
        return NotControllerError(
            f"broker {self._broker_id} is joining the cluster; ask the controller"
        )

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str],
        *,
        assignment: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        raise self._refuse()

    def delete_topic(self, name: str) -> None:
        raise self._refuse()

    def create_topics(
        self, specs: Sequence[NewTopic], timeout_ms: int
    ) -> dict[str, Exception | None]:
        raise self._refuse()

    def delete_topics(self, names: Sequence[str], timeout_ms: int) -> dict[str, Exception | None]:
        raise self._refuse()

    def create_partitions_many(
        self, growths: Sequence[Growth], timeout_ms: int
    ) -> dict[str, Exception | None]:
        raise self._refuse()

    def create_partitions(
        self, name: str, total: int, *, assignment: Sequence[Sequence[int]] | None = None
    ) -> None:
        raise self._refuse()

    def alter_topic_config(self, name: str, config: Mapping[str, str]) -> None:
        raise self._refuse()

    def elect_leaders(
        self, unclean: bool, partitions: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], str]:
        raise self._refuse()

    def alter_partition_reassignments(
        self, targets: Mapping[tuple[str, int], Sequence[int] | None]
    ) -> dict[tuple[str, int], str]:
        raise self._refuse()

    def list_partition_reassignments(
        self, partitions: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        raise self._refuse()

    def controlled_shutdown(self, broker_id: int) -> int:
        raise self._refuse()

    def run_forwarded(self, call: str, arguments: Mapping[str, Any]) -> Any:
        raise self._refuse()
