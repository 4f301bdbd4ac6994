"""Share-coordinator calls from this broker to another (issue #32 step 2b): a share
partition's leader reads, initializes and writes its state at the leader of the key's
``__share_group_state`` partition (Kafka's ReadShareGroupState, InitializeShareGroupState
and WriteShareGroupState between brokers), over the inter-broker channel
(``InterBrokerChannels``, as ``broker.cluster.txn_peers``; CLUSTER_ACTION there).

Decided:

* Unlike the transaction peers' calls, these raise: the caller
  (``SharePartitionManager``) must not act on a state it could not make durable, and
  answers the share partition's error. The other broker's answered error is raised as
  itself (``error_for_code``: ``NOT_COORDINATOR``, ``COORDINATOR_LOAD_IN_PROGRESS``,
  ``FENCED_LEADER_EPOCH``...); a broker not in the view, not reachable or not answering
  within ``CALL_TIMEOUT_MS`` raises ``CoordinatorNotAvailableError`` (retriable: the
  client asks again, by then the view may name a new coordinator).
* A write that timed out may have been applied. Nothing was handed out or answered on
  it; the state it wrote is one the leader would write again (the next write of those
  offsets carries the same or later states), and a reload reads whichever landed.
* **A group's configs** live with the group's records at its coordinator
  (``broker.core.group_configs``). A share partition's leader that is not the
  coordinator reads them there when it loads a share partition (``group_configs``), so
  a dead-letter topic or a delivery limit set on the group holds on every broker; a
  GROUP resource's DescribeConfigs / IncrementalAlterConfigs / AlterConfigs that
  reached another broker is forwarded there (``describe_group_configs``,
  ``alter_group_configs``, marked ``forwarded``: the coordinator answers, never forwards
  again).
* One channel per destination address, kept open; ``close`` closes them and every call
  after raises ``CoordinatorNotAvailableError``.
* The share-group admin in a cluster (``broker.core.share_admin``) adds three:
  ``read_summaries`` (ReadShareGroupStateSummary: one state partition's share
  partitions of a group, at its share coordinator), ``delete_state``
  (DeleteShareGroupState) and ``describe_partition`` (a share partition's statistics at
  its topic partition's leader; an unreachable leader raises
  ``LeaderNotAvailableError``). Reads and writes name the state epoch the leader loaded
  at, an admin's initialize the new one (``state_epoch``; FENCED_STATE_EPOCH).

Thread-safe.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tidelog.broker.cluster.peer_stubs import PeerStubs, answered_code
from tidelog.broker.core.config_keys import ConfigEntry, ConfigSynonym, ConfigType, Source
from tidelog.broker.core.configs import ConfigChange
from tidelog.broker.share.partition import SharePartitionStats
from tidelog.broker.share.records import (
    ACKNOWLEDGED,
    ARCHIVED,
    DEAD_LETTER_STATES,
    ShareSnapshot,
    ShareStateKey,
    StateBatch,
)
from tidelog.broker.tls import InterBrokerChannels
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import (
    CoordinatorNotAvailableError,
    LeaderNotAvailableError,
    TidelogError,
    error_for_code,
)

__all__ = [
    "CALL_TIMEOUT_MS",
    "GrpcSharePeers",
    "SharePartitionAtLeader",
    "ShareStateSummary",
    "batches_from_pb",
    "batches_to_pb",
    "key_from_pb",
    "state_epoch_of",
    "state_from_pb",
    "state_to_pb",
    "stats_from_pb",
    "stats_to_pb",
    "summary_from_pb",
    "summary_of",
    "summary_to_pb",
]

log = logging.getLogger(__name__)

# Below the client's share-fetch call timeout, so a stuck coordinator answers the
# partition's error rather than failing the whole call.
CALL_TIMEOUT_MS = 10_000


class GrpcSharePeers:
    """The share coordinator's calls to another broker (module docstring)."""

    def __init__(
        self,
        broker_id: int,
        channels: InterBrokerChannels,
        address_of: Callable[[int], str | None],
        timeout_ms: int = CALL_TIMEOUT_MS,
    ) -> None:
        self._broker_id = broker_id
        self._timeout_s = timeout_ms / 1000
        # After close every lookup is None: each call answers "unreachable".
        self._stubs = PeerStubs(channels, address_of)
        self._stub = self._stubs.stub

    def read_state(
        self, coordinator: int, key: ShareStateKey, leader_epoch: int
    ) -> ShareSnapshot | None:
        request = pb.ReadShareGroupStateRequest(key=self._key(key, leader_epoch))
        answer: pb.ShareGroupStateResponse = self._call(coordinator, "ReadShareGroupState", request)
        return state_from_pb(answer) if answer.found else None

    def initialize(
        self,
        coordinator: int,
        key: ShareStateKey,
        start_offset: int,
        leader_epoch: int,
        state_epoch: int | None = None,
    ) -> ShareSnapshot:
        request = pb.InitializeShareGroupStateRequest(
            key=self._key(key, leader_epoch, state_epoch), start_offset=start_offset
        )
        return state_from_pb(self._call(coordinator, "InitializeShareGroupState", request))

    def write(
        self,
        coordinator: int,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        state_epoch: int | None = None,
        *,
        transaction: tuple[int, int] | None = None,
    ) -> ShareSnapshot | None:
        """``transaction`` (producer id, epoch): written as a record of that transaction
        (a dead-letter transaction's archiving), pending at the coordinator until its
        marker; answered None."""
        request = pb.WriteShareGroupStateRequest(
            key=self._key(key, leader_epoch, state_epoch),
            start_offset=start_offset,
            batches=batches_to_pb(batches),
        )
        if transaction is not None:
            request.producer_id, request.producer_epoch = transaction
        answer = self._call(coordinator, "WriteShareGroupState", request)
        return None if transaction is not None else state_from_pb(answer)

    def read_summaries(
        self, coordinator: int, group_id: str, state_partition: int
    ) -> list[ShareStateSummary]:
        """ReadShareGroupStateSummary: ``group_id``'s share partitions in state partition
        ``state_partition``, at its share coordinator."""
        request = pb.ReadShareGroupStateSummaryRequest(
            group_id=group_id, state_partition=state_partition, broker_id=self._broker_id
        )
        answer: pb.ReadShareGroupStateSummaryResponse = self._invoke(
            coordinator, "ReadShareGroupStateSummary", request
        )
        return [summary_from_pb(group_id, s) for s in answer.states]

    def delete_state(self, coordinator: int, key: ShareStateKey) -> None:
        """DeleteShareGroupState: tombstones for ``key`` at its share coordinator."""
        request = pb.DeleteShareGroupStateRequest(key=self._key(key, 0))
        self._invoke(coordinator, "DeleteShareGroupState", request)

    def describe_partition(
        self,
        leader: int,
        group_id: str,
        topic: str,
        partition: int,
        state_epoch: int | None,
        with_stats: bool,
    ) -> SharePartitionAtLeader:
        """``topic``-``partition`` at ``leader`` (its leader in this broker's view): its
        high watermark and leader epoch and, ``with_stats``, the share partition's
        statistics."""
        request = pb.DescribeSharePartitionRequest(
            group_id=group_id,
            topic=topic,
            partition=partition,
            state_epoch=state_epoch,
            with_stats=with_stats,
        )
        try:
            answer: pb.DescribeSharePartitionResponse = self._invoke(
                leader, "DescribeSharePartition", request
            )
        except CoordinatorNotAvailableError as exc:  # the leader, not a coordinator
            raise LeaderNotAvailableError(f"{topic}-{partition}: {exc}") from None
        return SharePartitionAtLeader(
            answer.high_watermark,
            answer.leader_epoch,
            stats_from_pb(answer.stats) if answer.HasField("stats") else None,
        )

    def group_configs(self, coordinator: int, group_id: str) -> dict[str, str]:
        """The configs set on ``group_id`` at its coordinator (the GROUP resource's
        entries the group set), for a share partition's leader loading one of its share
        partitions."""
        return {
            e.name: e.value
            for e in self.describe_group_configs(coordinator, group_id, None)
            if e.source == Source.GROUP_CONFIG and e.value is not None
        }

    def describe_group_configs(
        self, coordinator: int, group_id: str, keys: Sequence[str] | None
    ) -> list[ConfigEntry]:
        """DescribeConfigs of the GROUP resource at the group's coordinator (a forwarded
        call: answered there, never forwarded again)."""
        request = pb.DescribeConfigsRequest(
            resource=pb.ConfigResource(type=pb.CONFIG_RESOURCE_TYPE_GROUP, name=group_id),
            keys=list(keys or ()),
            forwarded=True,
        )
        answer: pb.DescribeConfigsResponse = self._invoke(coordinator, "DescribeConfigs", request)
        return [_entry_from_pb(e) for e in answer.entries]

    def alter_group_configs(
        self,
        coordinator: int,
        group_id: str,
        changes: Sequence[ConfigChange],
        *,
        validate_only: bool,
    ) -> None:
        """IncrementalAlterConfigs of the GROUP resource at the group's coordinator (a
        forwarded call, as ``describe_group_configs``)."""
        request = pb.IncrementalAlterConfigsRequest(
            resource=pb.ConfigResource(type=pb.CONFIG_RESOURCE_TYPE_GROUP, name=group_id),
            alterations=[
                pb.ConfigAlteration(
                    name=c.name,
                    operation=int(c.op),  # type: ignore[arg-type]
                    value=c.value or "",
                )
                for c in changes
            ],
            validate_only=validate_only,
            forwarded=True,
        )
        self._invoke(coordinator, "IncrementalAlterConfigs", request)

    def close(self) -> None:
        self._stubs.close()

    def _key(
        self, key: ShareStateKey, leader_epoch: int, state_epoch: int | None = None
    ) -> pb.ShareStateKeyRef:
        return pb.ShareStateKeyRef(
            group_id=key.group_id,
            topic_id=key.topic_id.bytes,
            partition=key.partition,
            leader_epoch=leader_epoch,
            broker_id=self._broker_id,
            state_epoch=state_epoch,
        )

    def _call(self, coordinator: int, method: str, request: Any) -> pb.ShareGroupStateResponse:
        answer: pb.ShareGroupStateResponse = self._invoke(coordinator, method, request)
        return answer

    def _invoke(self, coordinator: int, method: str, request: Any) -> Any:
        stub = self._stub(coordinator)
        if stub is None:
            raise CoordinatorNotAvailableError(
                f"share coordinator {coordinator} is not in this broker's view"
            )
        try:
            answer = getattr(stub, method)(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            raise _raised(exc, coordinator, method) from None
        except ValueError:  # the channel was closed under the call (the broker stops)
            raise CoordinatorNotAvailableError("this broker is stopping") from None
        return answer


def _raised(exc: grpc.RpcError, coordinator: int, method: str) -> TidelogError:
    failed: Any = exc  # failed calls are both RpcError and Call (the stubs cannot say so)
    details = failed.details() if hasattr(failed, "details") else repr(exc)
    code = answered_code(exc)
    if code is not None:
        return error_for_code(code, str(details or ""))
    log.info("%s at broker %d failed: %s", method, coordinator, details)
    return CoordinatorNotAvailableError(f"share coordinator {coordinator}: {details}")


def _entry_from_pb(entry: Any) -> ConfigEntry:
    try:
        config_type = ConfigType[entry.type]
    except KeyError:
        config_type = ConfigType.UNKNOWN
    return ConfigEntry(
        entry.name,
        entry.value if entry.HasField("value") else None,
        Source(entry.source),
        entry.read_only,
        entry.sensitive,
        config_type,
        entry.documentation,
        tuple(
            ConfigSynonym(s.name, s.value if s.HasField("value") else None, Source(s.source))
            for s in entry.synonyms
        ),
    )


def batches_to_pb(batches: tuple[StateBatch, ...]) -> list[pb.ShareStateBatch]:
    return [
        pb.ShareStateBatch(
            first_offset=b.first_offset,
            last_offset=b.last_offset,
            delivery_state=b.delivery_state,
            delivery_count=b.delivery_count,
        )
        for b in batches
    ]


def batches_from_pb(batches: Any) -> tuple[StateBatch, ...]:
    """Raises ``ValueError`` for a batch ``StateBatch`` refuses."""
    return tuple(
        StateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
        for b in batches
    )


def state_to_pb(state: ShareSnapshot | None) -> pb.ShareGroupStateResponse:
    if state is None:
        return pb.ShareGroupStateResponse(found=False)
    return pb.ShareGroupStateResponse(
        found=True,
        snapshot_epoch=state.snapshot_epoch,
        state_epoch=state.state_epoch,
        leader_epoch=state.leader_epoch,
        start_offset=state.start_offset,
        create_timestamp_ms=state.create_timestamp_ms,
        write_timestamp_ms=state.write_timestamp_ms,
        batches=batches_to_pb(state.batches),
    )


def state_from_pb(answer: pb.ShareGroupStateResponse) -> ShareSnapshot:
    return ShareSnapshot(
        answer.snapshot_epoch,
        answer.state_epoch,
        answer.leader_epoch,
        answer.start_offset,
        answer.create_timestamp_ms,
        answer.write_timestamp_ms,
        batches_from_pb(answer.batches),
    )


@dataclass(frozen=True, slots=True)
class SharePartitionAtLeader:
    """A topic partition as its leader answers DescribeSharePartition."""

    high_watermark: int
    leader_epoch: int
    stats: SharePartitionStats | None


@dataclass(frozen=True, slots=True)
class ShareStateSummary:
    """One share partition's summary at its share coordinator (ReadShareGroupStateSummary):
    its start offset, state and leader epochs, and the records at or above the start
    already done (acknowledged, archived or waiting for their dead-letter copy)."""

    key: ShareStateKey
    start_offset: int
    state_epoch: int
    leader_epoch: int
    done_records: int


def summary_of(key: ShareStateKey, state: ShareSnapshot) -> ShareStateSummary:
    """``key``'s summary from its state (the coordinator's side)."""
    done = sum(
        b.last_offset - max(b.first_offset, state.start_offset) + 1
        for b in state.batches
        if b.delivery_state in (ACKNOWLEDGED, ARCHIVED, *DEAD_LETTER_STATES)
        and b.last_offset >= state.start_offset
    )
    return ShareStateSummary(key, state.start_offset, state.state_epoch, state.leader_epoch, done)


def summary_to_pb(summary: ShareStateSummary) -> pb.ShareStateSummary:
    return pb.ShareStateSummary(
        topic_id=summary.key.topic_id.bytes,
        partition=summary.key.partition,
        start_offset=summary.start_offset,
        state_epoch=summary.state_epoch,
        leader_epoch=summary.leader_epoch,
        done_records=summary.done_records,
    )


def summary_from_pb(group_id: str, answer: pb.ShareStateSummary) -> ShareStateSummary:
    key = ShareStateKey(group_id, uuid.UUID(bytes=answer.topic_id), answer.partition)
    return ShareStateSummary(
        key, answer.start_offset, answer.state_epoch, answer.leader_epoch, answer.done_records
    )


def stats_to_pb(topic: str, partition: int, stats: SharePartitionStats) -> pb.SharePartitionSummary:
    return pb.SharePartitionSummary(
        topic=topic,
        partition=partition,
        start_offset=stats.start_offset,
        end_offset=stats.end_offset,
        acquired=stats.acquired,
        available=stats.available,
        archived=stats.archived,
        acknowledged=stats.acknowledged,
        delivery_counts=[
            pb.DeliveryCountBucket(delivery_count=count, records=records)
            for count, records in stats.delivery_counts
        ],
        dead_lettered=stats.dead_lettered,
    )


def stats_from_pb(answer: pb.SharePartitionSummary) -> SharePartitionStats:
    return SharePartitionStats(
        start_offset=answer.start_offset,
        end_offset=answer.end_offset,
        acquired=answer.acquired,
        available=answer.available,
        acknowledged=answer.acknowledged,
        archived=answer.archived,
        delivery_counts=tuple((b.delivery_count, b.records) for b in answer.delivery_counts),
        dead_lettered=answer.dead_lettered,
    )


def key_from_pb(ref: pb.ShareStateKeyRef) -> tuple[ShareStateKey, int]:
    """The key and the leader epoch a request names. Raises ``ValueError`` for a key no
    share partition has (an empty or too long group id, a topic id not 16 bytes, a
    negative partition or epoch)."""
    if not ref.group_id or len(ref.group_id.encode()) > 0x7FFF:
        raise ValueError("the group id must be 1 to 32,767 bytes of UTF-8")
    if ref.partition < 0 or ref.leader_epoch < 0:
        raise ValueError("the partition and the leader epoch must not be negative")
    key = ShareStateKey(ref.group_id, uuid.UUID(bytes=ref.topic_id), ref.partition)
    return key, ref.leader_epoch


def state_epoch_of(ref: pb.ShareStateKeyRef) -> int | None:
    """The state epoch a request names (None: unset, not checked)."""
    return ref.state_epoch if ref.HasField("state_epoch") else None
