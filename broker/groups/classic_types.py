"""The values of Kafka's classic group protocol as ``broker.groups.classic`` takes and
answers them: a decoded JoinGroup, the answers to JoinGroup and SyncGroup, the outcomes
(``ClassicError``, named after Kafka's errors), the states, and the views DescribeGroups,
``describe_group`` and OffsetDelete read. Split from ``classic`` (the state machine) so that
the protocol's vocabulary reads in one place; ``classic`` re-exports every name.

Frozen values, thread-safe.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tidelog.broker.groups.coordinator import MemberView

__all__ = [
    "DEFAULT_INITIAL_REBALANCE_DELAY_MS",
    "MAX_SESSION_TIMEOUT_MS",
    "MIN_SESSION_TIMEOUT_MS",
    "ClassicError",
    "ClassicGroupDescription",
    "ClassicGroupSnapshot",
    "ClassicMemberDescription",
    "ClassicSubscriptions",
    "GroupState",
    "JoinRequest",
    "JoinResult",
    "SyncResult",
]

# Kafka's group.min/max.session.timeout.ms defaults.
MIN_SESSION_TIMEOUT_MS = 6_000
MAX_SESSION_TIMEOUT_MS = 1_800_000


class ClassicError(enum.Enum):
    """A classic-protocol outcome, by Kafka's error name (``NONE``: success)."""

    NONE = "NONE"
    UNKNOWN_MEMBER_ID = "UNKNOWN_MEMBER_ID"
    ILLEGAL_GENERATION = "ILLEGAL_GENERATION"
    REBALANCE_IN_PROGRESS = "REBALANCE_IN_PROGRESS"
    INCONSISTENT_GROUP_PROTOCOL = "INCONSISTENT_GROUP_PROTOCOL"
    MEMBER_ID_REQUIRED = "MEMBER_ID_REQUIRED"
    INVALID_GROUP_ID = "INVALID_GROUP_ID"
    INVALID_SESSION_TIMEOUT = "INVALID_SESSION_TIMEOUT"
    FENCED_INSTANCE_ID = "FENCED_INSTANCE_ID"
    # A SyncGroup whose group metadata could not be stored (Kafka's storeGroup errors).
    NOT_COORDINATOR = "NOT_COORDINATOR"
    COORDINATOR_NOT_AVAILABLE = "COORDINATOR_NOT_AVAILABLE"
    UNKNOWN_SERVER_ERROR = "UNKNOWN_SERVER_ERROR"


# Kafka's group.initial.rebalance.delay.ms default.
DEFAULT_INITIAL_REBALANCE_DELAY_MS = 3_000


class GroupState(enum.Enum):
    """Kafka's classic group states (the names DescribeGroups reports)."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinRequest:
    """A JoinGroup, decoded. ``require_known_member_id``: KIP-394 (JoinGroup v4+)."""

    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    require_known_member_id: bool


@dataclass(frozen=True, slots=True)
class JoinResult:
    """What a JoinGroup is answered with."""

    error: ClassicError
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # leader only


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What a SyncGroup is answered with."""

    error: ClassicError
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class ClassicMemberDescription:
    """One member as DescribeGroups shows it (metadata of the chosen protocol)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    member_metadata: bytes
    member_assignment: bytes


@dataclass(frozen=True, slots=True)
class ClassicGroupDescription:
    """A classic group as DescribeGroups shows it."""

    group_id: str
    group_state: str
    protocol_type: str
    protocol_data: str
    members: tuple[ClassicMemberDescription, ...]


@dataclass(frozen=True, slots=True)
class ClassicGroupSnapshot:
    """A classic group as ``GroupManager.describe_group`` shows it: state name,
    generation and members (topics and partitions decoded for "consumer" groups)."""

    group_id: str
    state: str
    generation: int
    members: tuple[MemberView, ...]


@dataclass(frozen=True, slots=True)
class ClassicSubscriptions:
    """A classic group's live members as OffsetDelete (KIP-496) sees them: how many, their
    protocol type, and the topics they subscribe to (None: some member's subscription
    does not parse, or the group's type is not "consumer": every topic, to be safe, as
    Kafka's ``GroupMetadata.isSubscribedToTopic``)."""

    members: int
    protocol_type: str
    topics: frozenset[str] | None

    def subscribes_to(self, topic: str) -> bool:
        """Whether a live member may be consuming ``topic``."""
        return self.members > 0 and (self.topics is None or topic in self.topics)
