"""What the client knows about the cluster: brokers, leaders, and when to ask again.

Pure values and a pure engine, no I/O:

- ``parse_bootstrap_list``: ``"h1:p1,h2:p2"`` to a tuple of checked addresses;
- ``BrokerNode``, ``PartitionMetadata``, ``TopicMetadata``, ``ClusterMetadata``: one
  ``Metadata`` answer as values (``ClusterMetadata.leader_for`` routes a partition);
- ``MetadataCache``: the last answer and the decision when to refresh it. A refresh is due
  when the answer is older than ``metadata_max_age_ms`` or something reported it stale
  (``NOT_LEADER_OR_FOLLOWER``, ``LEADER_NOT_AVAILABLE``, a lost connection); refreshes
  forced one after another back off 100 ms, 200 ms, ... up to 1 s (Kafka's
  ``retry.backoff.ms`` with KIP-580's exponential backoff), so a partition without a
  leader does not turn the client into a metadata storm;
- ``BrokerAvoidance``: which broker to ask first for metadata or for a call any broker
  answers. A broker whose connection failed is avoided for a backoff growing 1 s, 2 s, ...
  up to 10 s (Kafka's ``reconnect.backoff.ms``); a broker whose answer proved wrong (a
  metadata answer without the leader, or one that routed a call to a broker that refused
  it with ``NOT_LEADER_OR_FOLLOWER``) is asked after the others, the one suspected longest
  ago first, so successive refreshes rotate through the known brokers instead of asking a
  broker cut off from the cluster again and again (issue #33).

Not thread-safe: the owner (``client.routing.ClusterConnections``) holds its lock around
every call. Times are ``now_ms`` from the owner's monotonic clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tidelog.client.types import TopicPartition

__all__ = [
    "NO_LEADER",
    "BrokerAvoidance",
    "BrokerNode",
    "ClusterMetadata",
    "MetadataCache",
    "PartitionMetadata",
    "TopicMetadata",
    "format_address",
    "parse_bootstrap_list",
]

NO_LEADER = -1
"""``PartitionMetadata.leader`` of an offline partition (and of a controller-less cluster)."""

_INITIAL_BACKOFF_MS = 100
_MAX_BACKOFF_MS = 1_000
_INITIAL_UNREACHABLE_BACKOFF_MS = 1_000
_MAX_UNREACHABLE_BACKOFF_MS = 10_000


def parse_bootstrap_list(value: object) -> tuple[str, ...]:
    """The addresses of a bootstrap list ``"h1:p1,h2:p2"`` (IPv6 as ``[::1]:p``).

    Blanks around addresses are dropped; duplicates are kept once, in order. Raises
    ``ValueError`` for anything but a non-empty list of ``HOST:PORT`` with a port in
    1-65535.
    """
    if not isinstance(value, str):
        raise ValueError(
            f"bootstrap_servers must be a 'HOST:PORT[,HOST:PORT...]' string, got {value!r}"
        )
    addresses: list[str] = []
    for part in value.split(","):
        address = part.strip()
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bootstrap_servers: expected HOST:PORT[,HOST:PORT...], got {value!r}")
        if address not in addresses:
            addresses.append(address)
    return tuple(addresses)


def format_address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets as gRPC wants it."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class BrokerNode:
    """One broker of the cluster as clients reach it."""

    id: int
    host: str
    port: int
    rack: str | None = None  # the broker's ``broker.rack``

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    """Where one partition lives. ``leader`` is ``NO_LEADER`` while it is offline."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """One topic of a ``Metadata`` answer; ``error_code`` is "" when it was found."""

    name: str
    partitions: tuple[PartitionMetadata, ...]
    internal: bool = False
    error_code: str = ""
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """One ``Metadata`` answer: brokers, the controller, and topics with their leaders.

    ``controller_id`` is ``NO_LEADER`` while there is no controller; ``broker_id`` is the
    broker that answered. Immutable; a refresh builds a new one.
    """

    cluster_id: str
    controller_id: int
    broker_id: int
    brokers: Mapping[int, BrokerNode] = field(default_factory=dict)
    topics: Mapping[str, TopicMetadata] = field(default_factory=dict)

    def partition(self, tp: TopicPartition) -> PartitionMetadata | None:
        """The partition's metadata, None if the topic or partition is not known."""
        topic = self.topics.get(tp.topic)
        if topic is None or topic.error_code:
            return None
        for partition in topic.partitions:
            if partition.partition == tp.partition:
                return partition
        return None

    def leader_for(self, tp: TopicPartition) -> BrokerNode | None:
        """The broker leading ``tp``; None if unknown, offline, or its broker is not listed."""
        partition = self.partition(tp)
        if partition is None or partition.leader == NO_LEADER:
            return None
        return self.brokers.get(partition.leader)

    def partition_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has; None if the answer does not know it."""
        found = self.topics.get(topic)
        if found is None or found.error_code:
            return None
        return len(found.partitions)

    @property
    def controller(self) -> BrokerNode | None:
        return self.brokers.get(self.controller_id)


class MetadataCache:
    """The last ``ClusterMetadata`` and when to fetch the next. Not thread-safe.

    Args:
        max_age_ms: refresh an answer this old even if nothing reported it stale.
    """

    def __init__(self, max_age_ms: int) -> None:
        if max_age_ms < 0:
            raise ValueError(f"max_age_ms must be >= 0, got {max_age_ms}")
        self.max_age_ms = max_age_ms
        self.current: ClusterMetadata | None = None
        self._updated_ms = 0
        self._stale = True
        self._last_attempt_ms: int | None = None
        self._forced_attempts = 0  # refreshes in a row that were forced: the backoff grows

    def backoff_ms(self) -> int:
        """How long after the last attempt the next forced refresh may go out."""
        if self._forced_attempts == 0:
            return 0
        return min(_INITIAL_BACKOFF_MS << min(self._forced_attempts - 1, 10), _MAX_BACKOFF_MS)

    def mark_stale(self) -> None:
        """Something showed the answer is wrong (a moved leader, a lost connection)."""
        self._stale = True

    def next_refresh_ms(self) -> int:
        """The earliest time a refresh is due (may be in the past)."""
        if self.current is None or self._stale:
            if self._last_attempt_ms is None:
                return 0
            return self._last_attempt_ms + self.backoff_ms()
        return self._updated_ms + self.max_age_ms

    def refresh_due(self, now_ms: int) -> bool:
        """Whether to fetch metadata now."""
        return now_ms >= self.next_refresh_ms()

    def attempted(self, now_ms: int) -> None:
        """A refresh is going out now (call before asking, whatever the outcome)."""
        if self._stale and self._last_attempt_ms is not None:
            self._forced_attempts += 1
        elif self._forced_attempts == 0 and self._stale:
            self._forced_attempts = 1
        self._last_attempt_ms = now_ms

    def update(self, metadata: ClusterMetadata, now_ms: int) -> None:
        """A refresh answered: the cache is fresh until ``max_age_ms`` or ``mark_stale``."""
        self.current = metadata
        self._updated_ms = now_ms
        self._stale = False

    def confirmed(self) -> None:
        """A call routed by the cache succeeded: the next forced refresh starts at 100 ms."""
        self._forced_attempts = 0


class BrokerAvoidance:
    """Which of the known brokers to ask first. Not thread-safe.

    Brokers are named by address. ``order`` keeps the caller's order (its preference)
    for the brokers in good standing and moves the others to the end: first the suspected
    ones, the one suspected longest ago first; last the unreachable ones still in their
    backoff, the one whose backoff ends first first. Nobody is ever dropped: with every
    broker avoided, the least bad one is still asked.

    An unreachable broker's backoff starts at 1 s and doubles with each failure in a row
    up to 10 s; once it has passed, the broker is in good standing again (its next failure
    backs off longer); an answer from it forgets its failures. Suspicion lasts until the
    broker's answer is used successfully (``trusted``).
    """

    def __init__(
        self,
        *,
        initial_backoff_ms: int = _INITIAL_UNREACHABLE_BACKOFF_MS,
        max_backoff_ms: int = _MAX_UNREACHABLE_BACKOFF_MS,
    ) -> None:
        if initial_backoff_ms < 1 or max_backoff_ms < initial_backoff_ms:
            raise ValueError(
                "expected 1 <= initial_backoff_ms <= max_backoff_ms, got"
                f" {initial_backoff_ms} and {max_backoff_ms}"
            )
        self._initial_backoff_ms = initial_backoff_ms
        self._max_backoff_ms = max_backoff_ms
        self._failures: dict[str, tuple[int, int]] = {}  # address -> (in a row, until ms)
        self._suspected: dict[str, int] = {}  # address -> when (a sequence number)
        self._sequence = 0

    def unreachable(self, address: str, now_ms: int) -> None:
        """A connection to ``address`` failed: avoid it for a growing backoff."""
        count = self._failures.get(address, (0, 0))[0] + 1
        backoff = min(self._initial_backoff_ms << min(count - 1, 16), self._max_backoff_ms)
        self._failures[address] = (count, now_ms + backoff)

    def reachable(self, address: str) -> None:
        """``address`` answered: forget its connection failures."""
        self._failures.pop(address, None)

    def suspect(self, address: str) -> None:
        """``address`` gave an answer that proved wrong: ask the others first."""
        self._sequence += 1
        self._suspected[address] = self._sequence

    def trusted(self, address: str) -> None:
        """An answer of ``address`` was used successfully: it is in good standing."""
        self._suspected.pop(address, None)

    def backing_off(self, address: str, now_ms: int) -> bool:
        """Whether ``address`` failed to connect and its backoff has not passed."""
        failure = self._failures.get(address)
        return failure is not None and now_ms < failure[1]

    def order(self, addresses: Iterable[str], now_ms: int) -> list[str]:
        """``addresses`` (duplicates dropped) in the order to try them (see the class)."""
        good: list[str] = []
        suspected: list[str] = []
        waiting: list[str] = []
        for address in dict.fromkeys(addresses):
            if self.backing_off(address, now_ms):
                waiting.append(address)
            elif address in self._suspected:
                suspected.append(address)
            else:
                good.append(address)
        suspected.sort(key=lambda a: self._suspected[a])
        waiting.sort(key=lambda a: self._failures[a][1])
        return good + suspected + waiting
