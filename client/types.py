"""The value types of the client's public API.

``TopicPartition`` is a frozen, hashable dataclass (DESIGN.md), defined once for every
layer in ``storage.types`` and re-exported here. The types built once per record
(``RecordMetadata`` for every send, ``ConsumerRecord`` for every record read) are
``NamedTuple``s, as kafka-python's are: a tuple subclass is the cheapest Python object to
build with named fields (the consumer builds hundreds of thousands per second), compares
and hashes by value and unpacks like a tuple. The admin answers are frozen dataclasses.

Everything here is immutable and thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tidelog.storage.types import TopicPartition

__all__ = [
    "AbortTransactionSpec",
    "AlterConfigOp",
    "ConfigEntry",
    "ConfigResource",
    "ConfigSynonym",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "GroupDescription",
    "GroupMember",
    "GroupPartitionLag",
    "GroupSummary",
    "Header",
    "LogDirDescription",
    "LogDirReplica",
    "OffsetAndTimestamp",
    "PartitionDescription",
    "PartitionReassignment",
    "QuotaEntity",
    "RecordMetadata",
    "TopicDescription",
    "TopicPartition",
    "TopicSummary",
    "TransactionDescription",
    "TransactionListing",
]

Header = tuple[str, bytes | None]
"""A record header: a UTF-8 key and a value that may be None, as Kafka's."""


class RecordMetadata(NamedTuple):
    """Where a sent record landed: its offset, and its timestamp as the log keeps it.

    ``timestamp_ms`` is the producer's CreateTime, or the broker's append time on a
    ``LogAppendTime`` topic. With ``acks=0`` the broker tells nothing: ``offset`` is -1.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


class ConsumerRecord(NamedTuple):
    """One record read from a partition. ``value`` None is a tombstone.

    Three times (``DESIGN.md``, "Three timestamps per record"): ``timestamp_ms`` is the
    record's own (the producer's clock when the event happened, or LogAppendTime);
    ``sent_timestamp_ms`` the producer's clock when the request carrying its batch was sent
    and ``received_timestamp_ms`` the broker's clock when that request arrived (None when
    unknown: older producers, other protocols); ``corrected_timestamp_ms`` =
    ``timestamp_ms + received - sent``, the event time on the broker's clock, or
    ``timestamp_ms`` when either is unknown. Sent and received are per batch, so the
    correction is one number for every record of a batch. The corrected time is derived
    on access (a property, not a field: the decoders would otherwise build an int per
    record, ~12% of decoding); it takes no part in equality, being a function of the rest.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    sent_timestamp_ms: int | None = None
    received_timestamp_ms: int | None = None

    @property
    def corrected_timestamp_ms(self) -> int:
        """``timestamp_ms + received - sent``; ``timestamp_ms`` when either is unknown."""
        sent = self.sent_timestamp_ms
        received = self.received_timestamp_ms
        if sent is None or received is None:
            return self.timestamp_ms
        return self.timestamp_ms + received - sent


class OffsetAndTimestamp(NamedTuple):
    """The answer of ``Consumer.offsets_for_times`` for one partition."""

    offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class TopicSummary:
    """One line of ``AdminClient.list_topics``."""

    name: str
    partitions: int
    internal: bool = False


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    """One partition of ``AdminClient.describe_topic``: offsets, size on disk, placement.

    ``leader`` is the id of the broker leading the partition (-1 while it is offline);
    ``replicas`` the brokers holding it, in assignment order; ``isr`` the in-sync ones;
    ``leader_epoch`` grows with every leader change. ``elr`` (cluster mode, KIP-966) the
    eligible leader replicas: replicas that left the ISR while it was below
    ``min.insync.replicas`` and still hold every committed record, so they may lead when
    no ISR member is live; ``last_known_elr`` the ones that left the ELR because they
    restarted after an unclean shutdown. A single node leads everything: leader 0,
    replicas = isr = (0,), no ELR. The placement fields default for values built by hand
    (tests, older brokers that do not send them).
    """

    partition: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    segments: int
    leader: int = 0
    replicas: tuple[int, ...] = (0,)
    isr: tuple[int, ...] = (0,)
    leader_epoch: int = 0
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic as the broker describes it: partitions, and every effective config."""

    name: str
    partitions: Sequence[PartitionDescription]
    config: Mapping[str, str]
    internal: bool = False


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """A partition being reassigned (Kafka's ListPartitionReassignments): ``replicas`` is
    the union of the ones it had and the target ones, the target first."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]

    @property
    def target(self) -> tuple[int, ...]:
        """The replicas the partition ends with."""
        return tuple(r for r in self.replicas if r not in self.removing_replicas)


@dataclass(frozen=True, slots=True)
class LogDirReplica:
    """One partition's copy in a broker's log directory: its size on disk and how far its
    log end is behind the partition's high watermark (0: not behind)."""

    size_bytes: int
    offset_lag: int


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    """A broker's log directory (Kafka's DescribeLogDirs): its path, the file system's
    size and free space, and the partition copies it holds."""

    path: str
    total_bytes: int
    usable_bytes: int
    replicas: Mapping[TopicPartition, LogDirReplica]


@dataclass(frozen=True, slots=True)
class ConfigResource:
    """What configs belong to: a topic, a broker (``name`` its id as text), every
    broker (type ``"broker"``, name ``""``: the cluster-wide dynamic default), or a group
    (Kafka 4.x's GROUP resource: a share group's ``share.*`` configs and
    ``errors.deadletterqueue.topic.name``)."""

    type: str  # "topic", "broker" or "group"
    name: str

    def __post_init__(self) -> None:
        if self.type not in ("topic", "broker", "group"):
            raise ValueError(
                f"ConfigResource type must be 'topic', 'broker' or 'group', not {self.type!r}"
            )

    @classmethod
    def topic(cls, name: str) -> ConfigResource:
        return cls("topic", name)

    @classmethod
    def broker(cls, broker_id: int | None = None) -> ConfigResource:
        """One broker's configs, or (None) the cluster-wide broker default."""
        return cls("broker", "" if broker_id is None else str(broker_id))

    @classmethod
    def group(cls, group_id: str) -> ConfigResource:
        """A group's configs (asked of the group's coordinator)."""
        return cls("group", group_id)


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    """One place a config's value could come from, most specific first."""

    name: str
    value: str | None
    source: str  # DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, ..., DEFAULT_CONFIG


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One config key as the broker describes it (Kafka's DescribeConfigs entry)."""

    name: str
    value: str | None  # None: sensitive
    source: str  # where ``value`` comes from (``ConfigSynonym.source``'s names)
    read_only: bool
    sensitive: bool
    type: str  # LONG, INT, STRING, LIST, BOOLEAN, DOUBLE
    documentation: str
    synonyms: tuple[ConfigSynonym, ...] = ()


@dataclass(frozen=True, slots=True)
class AlterConfigOp:
    """One change of ``AdminClient.incremental_alter_configs``: ``op`` is ``"set"``,
    ``"delete"`` (back to the default), ``"append"`` or ``"subtract"`` (list-valued keys
    such as ``cleanup.policy``)."""

    name: str
    op: str
    value: str | None = None

    def __post_init__(self) -> None:
        if self.op not in ("set", "delete", "append", "subtract"):
            raise ValueError(
                f"AlterConfigOp op must be set, delete, append or subtract: {self.op!r}"
            )


@dataclass(frozen=True, slots=True, order=True)
class QuotaEntity:
    """Who a client quota is for (``AdminClient.describe_quotas``): a user, a client id,
    or both; None where that part is not given, ``"<default>"`` for every user (client
    id) without an entry of its own."""

    user: str | None = None
    client_id: str | None = None

    def __str__(self) -> str:
        parts = [f"user={self.user}"] if self.user is not None else []
        if self.client_id is not None:
            parts.append(f"client-id={self.client_id}")
        return ",".join(parts)


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """One group of ``list_groups``: its state, member count and type (``consumer``,
    ``classic`` or ``share``, as Kafka's ListGroups v5)."""

    group_id: str
    state: str
    members: int
    group_type: str = "consumer"


@dataclass(frozen=True, slots=True)
class GroupMember:
    """One member of a described group and the partitions it holds."""

    member_id: str
    client_id: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    assignment: tuple[TopicPartition, ...]
    instance_id: str | None = None  # a static member's group.instance.id (KIP-345)


@dataclass(frozen=True, slots=True)
class GroupPartitionLag:
    """One partition of a described group: committed offset (None: none), log end, lag.

    ``log_end_offset`` and ``lag`` are -1 when the partition's leader could not say (an
    offline partition, a deleted topic).
    """

    tp: TopicPartition
    committed_offset: int | None
    log_end_offset: int
    lag: int
    member_id: str


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """``describe_group``: state, epoch, members, and per partition the lag."""

    group_id: str
    state: str
    group_epoch: int
    members: tuple[GroupMember, ...]
    partitions: tuple[GroupPartitionLag, ...]


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """What a transactional producer needs of the consumer whose offsets it commits
    (``Consumer.group_metadata()``, Kafka's ``ConsumerGroupMetadata``, KIP-447): the
    group, the member's generation (its member epoch; -1 outside a group) and id ("" for
    none), and its static instance id. The broker refuses the offsets of a member that is
    no longer the group's at that generation: a zombie consumer's output cannot commit."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class TransactionListing:
    """``AdminClient.list_transactions``: one transactional id a coordinator knows."""

    transactional_id: str
    producer_id: int
    state: str  # Kafka's names: Empty, Ongoing, PrepareCommit, CompleteCommit, ...
    coordinator_id: int


@dataclass(frozen=True, slots=True)
class AbortTransactionSpec:
    """``AdminClient.abort_transaction``: the open transaction of one producer on one
    partition, as ``describe_producers`` shows it (Kafka's ``AbortTransactionSpec``):
    its producer id and epoch and the coordinator epoch of its last marker there."""

    partition: TopicPartition
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """``AdminClient.describe_transactions``: a transactional id's state (Kafka's
    ``kafka-transactions.sh describe``). ``transaction_start_time_ms`` is -1 when no
    transaction is open; ``partitions`` are those of the open (or completing) one."""

    transactional_id: str
    coordinator_id: int
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int
    partitions: tuple[TopicPartition, ...]
