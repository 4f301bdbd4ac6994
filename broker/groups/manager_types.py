"""The values the group manager (``broker.groups.manager``) takes and answers: its
configuration, an offset commit's entries and results, the listings, descriptions and lag
of groups, and offset reset targets. Split from ``manager`` (the facade over the two group
protocols and the offset store) so that its vocabulary reads in one place; ``manager``
re-exports every name.

Frozen values, thread-safe.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.classic import DEFAULT_INITIAL_REBALANCE_DELAY_MS
from tidelog.broker.groups.coordinator import CoordinatorConfig, MemberView
from tidelog.broker.groups.offset_records import MAX_STRING_BYTES, NO_LEADER_EPOCH
from tidelog.broker.groups.offset_store import OffsetStoreConfig

__all__ = [
    "GroupConfig",
    "GroupDescription",
    "GroupLag",
    "GroupListing",
    "OffsetCommitEntry",
    "OffsetResult",
    "PartitionLag",
    "ResetKind",
    "ResetTarget",
    "Selection",
]

# topic -> partitions; an empty list means "every partition" (see each method).
Selection = Mapping[str, Sequence[int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupConfig:
    """Everything the group coordinator obeys (built from ``BrokerConfig``)."""

    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    offsets: OffsetStoreConfig = field(default_factory=OffsetStoreConfig)
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    # group.initial.rebalance.delay.ms: classic groups only (KIP-848 groups assign on
    # every heartbeat, so a late member costs them no second rebalance of everyone).
    initial_rebalance_delay_ms: int = DEFAULT_INITIAL_REBALANCE_DELAY_MS

    def __post_init__(self) -> None:
        if not 0 <= self.offset_metadata_max_bytes <= MAX_STRING_BYTES:
            raise ValueError(f"offset.metadata.max.bytes must be 0..{MAX_STRING_BYTES}")
        if self.initial_rebalance_delay_ms < 0:
            raise ValueError("group.initial.rebalance.delay.ms must be >= 0")


@dataclass(frozen=True, slots=True)
class OffsetCommitEntry:
    """One partition of an ``OffsetCommit``: the next offset to read, free metadata and
    the leader epoch of the last record consumed (KIP-320's ``committed_leader_epoch``;
    -1 or any negative value: unknown, stored as -1)."""

    tp: TopicPartition
    offset: int
    metadata: str = ""
    leader_epoch: int = NO_LEADER_EPOCH


@dataclass(frozen=True, slots=True)
class OffsetResult:
    """One partition's committed offset (-1: none) with its leader epoch (-1: none or
    unknown), or its error (``error_code`` set)."""

    tp: TopicPartition
    offset: int = -1
    metadata: str = ""
    error_code: str = ""
    error_message: str = ""
    leader_epoch: int = NO_LEADER_EPOCH


@dataclass(frozen=True, slots=True)
class GroupListing:
    """A group as ``ListGroups`` shows it."""

    group_id: str
    state: str
    members: int


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of a group: committed offset (-1 none), log end, lag, owner ("")."""

    tp: TopicPartition
    committed_offset: int
    log_start_offset: int
    log_end_offset: int
    lag: int
    member_id: str


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A group as ``DescribeGroup`` shows it."""

    group_id: str
    state: str
    group_epoch: int
    members: tuple[MemberView, ...]
    partitions: tuple[PartitionLag, ...]


@dataclass(frozen=True, slots=True)
class GroupLag:
    """One partition's lag for the metrics."""

    group_id: str
    tp: TopicPartition
    committed_offset: int
    lag: int


class ResetKind(enum.Enum):
    """Where ``reset_offsets`` moves the committed offsets."""

    EARLIEST = "earliest"
    LATEST = "latest"
    OFFSET = "offset"
    TIMESTAMP = "timestamp"


@dataclass(frozen=True, slots=True)
class ResetTarget:
    """A reset target; ``value`` is the offset or the timestamp (ms) for those kinds."""

    kind: ResetKind
    value: int = 0
