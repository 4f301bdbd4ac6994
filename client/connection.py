"""The connection layer: what the client says to one broker, in domain values.

``Connection`` is the seam (a ``typing.Protocol``): calls take and return the values of
``client.types`` and ``client.cluster``, never protobuf. Two implementations:

- ``GrpcConnection`` here: one ``client.transport.Transport`` (the only module that
  touches grpc) plus the protobuf conversions;
- ``client.testing.InMemoryCluster``: brokers in memory whose leaders can move, for unit
  tests of routing without sockets.

Per-partition errors come back as values (``ListOffsetsResult.error``) rather than being
raised, so the router (``client.routing``) can send just the failed partitions to their
new leader. A call's own failure is raised as the exact ``TidelogError``.

Calls not yet in the protocol (produce and fetch streams, group heartbeats, group admin
and quotas) still go through ``GrpcConnection.transport``; moving them here is the rest
of issue 13's client work (see ``docs/client.md``).

Thread-safe: ``GrpcConnection`` holds no state but its transport, which is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from client.cluster import BrokerNode, ClusterMetadata, PartitionMetadata, TopicMetadata
from client.group_member import HeartbeatAnswer, HeartbeatRequest
from client.transport import Transport
from client.types import PartitionDescription, TopicDescription, TopicPartition
from proto.tidelog.v1 import broker_pb2 as pb
from storage.errors import InternalError, TidelogError, error_for_code

__all__ = [
    "Connection",
    "ConnectionFactory",
    "GrpcConnection",
    "ListOffsetsResult",
    "grpc_connections",
    "topic_description",
]


@dataclass(frozen=True, slots=True)
class ListOffsetsResult:
    """One partition's ``ListOffsets`` answer: offset -1 when no record is that recent."""

    offset: int = -1
    timestamp_ms: int = -1
    error: TidelogError | None = None


class Connection(Protocol):
    """What a client asks one broker. Every call takes a timeout in ms (None: default)."""

    @property
    def address(self) -> str: ...

    def metadata(
        self, topics: Sequence[str] = (), *, include_internal: bool, timeout_ms: int | None
    ) -> ClusterMetadata:
        """Brokers, controller and leaders; ``topics`` empty: every topic."""
        ...

    def find_coordinator(self, group_id: str, *, timeout_ms: int | None) -> BrokerNode:
        """The broker coordinating ``group_id``."""
        ...

    def list_offsets(
        self, queries: Mapping[TopicPartition, int], *, timeout_ms: int | None
    ) -> dict[TopicPartition, ListOffsetsResult]:
        """Per partition -2 earliest, -1 latest, else a timestamp in ms."""
        ...

    def commit_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, int],
        *,
        member_id: str,
        member_epoch: int,
        timeout_ms: int | None,
    ) -> dict[TopicPartition, TidelogError]:
        """Commit; returns the partitions that failed with their errors."""
        ...

    def fetch_committed(
        self, group_id: str, partitions: Iterable[TopicPartition], *, timeout_ms: int | None
    ) -> dict[TopicPartition, int]:
        """Committed offsets (partitions without one are left out)."""
        ...

    def heartbeat(
        self,
        group_id: str,
        request: HeartbeatRequest,
        *,
        client_id: str,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        timeout_ms: int | None,
    ) -> HeartbeatAnswer:
        """One ``ConsumerGroupHeartbeat`` to the group's coordinator."""
        ...

    def describe_topic(self, name: str, *, timeout_ms: int | None) -> TopicDescription: ...

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str],
        *,
        timeout_ms: int | None,
    ) -> TopicDescription:
        """``partitions`` 0 and ``replication_factor`` 0: the broker's defaults."""
        ...

    def delete_topic(self, name: str, *, timeout_ms: int | None) -> None: ...

    def alter_topic_config(
        self,
        name: str,
        set_config: Mapping[str, str],
        delete: Sequence[str],
        *,
        timeout_ms: int | None,
    ) -> TopicDescription: ...

    def create_partitions(
        self, topic: str, total_count: int, *, validate_only: bool, timeout_ms: int | None
    ) -> int:
        """Grow ``topic``; returns the new partition count."""
        ...

    def close(self) -> None: ...


class ConnectionFactory(Protocol):
    """Opens a ``Connection`` to one ``HOST:PORT`` (no I/O until the first call)."""

    def __call__(self, address: str) -> Connection: ...


def grpc_connections(
    *,
    client_id: str,
    request_timeout_ms: int,
    reconnect_backoff_max_ms: int,
    reuse: Transport | None = None,
) -> ConnectionFactory:
    """A factory of ``GrpcConnection``s with these settings.

    ``reuse``: a transport the client already holds; its address gets a connection over
    it rather than a second channel to the same broker.
    """

    def connect(address: str) -> Connection:
        if reuse is not None and reuse.address == address:
            return GrpcConnection(reuse)
        return GrpcConnection(
            Transport(
                address,
                client_id=client_id,
                request_timeout_ms=request_timeout_ms,
                reconnect_backoff_max_ms=reconnect_backoff_max_ms,
            )
        )

    return connect


class GrpcConnection:
    """A ``Connection`` over gRPC. Thread-safe; ``close`` once.

    Args:
        transport: the channel to the broker (owned: ``close`` closes it).
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    @property
    def address(self) -> str:
        return self.transport.address

    def metadata(
        self, topics: Sequence[str] = (), *, include_internal: bool, timeout_ms: int | None
    ) -> ClusterMetadata:
        answer = self.transport.call(
            self.transport.stub.Metadata,
            pb.MetadataRequest(topics=list(topics), include_internal=include_internal),
            what="Metadata",
            timeout_ms=timeout_ms,
        )
        return ClusterMetadata(
            cluster_id=answer.cluster_id,
            controller_id=answer.controller_id,
            broker_id=answer.broker_id,
            brokers={b.id: BrokerNode(b.id, b.host, b.port) for b in answer.brokers},
            topics={
                t.name: TopicMetadata(
                    t.name,
                    tuple(
                        PartitionMetadata(
                            p.partition, p.leader, p.leader_epoch, tuple(p.replicas), tuple(p.isr)
                        )
                        for p in sorted(t.partitions, key=lambda p: p.partition)
                    ),
                    t.internal,
                    t.error_code,
                )
                for t in answer.topics
            },
        )

    def find_coordinator(self, group_id: str, *, timeout_ms: int | None) -> BrokerNode:
        answer = self.transport.call(
            self.transport.stub.FindCoordinator,
            pb.FindCoordinatorRequest(group_id=group_id),
            what=f"FindCoordinator {group_id}",
            timeout_ms=timeout_ms,
        )
        node = answer.coordinator
        return BrokerNode(node.id, node.host, node.port)

    def list_offsets(
        self, queries: Mapping[TopicPartition, int], *, timeout_ms: int | None
    ) -> dict[TopicPartition, ListOffsetsResult]:
        response = self.transport.call(
            self.transport.stub.ListOffsets,
            pb.ListOffsetsRequest(
                partitions=[
                    pb.ListOffsetsPartition(topic=tp.topic, partition=tp.partition, timestamp_ms=ts)
                    for tp, ts in queries.items()
                ]
            ),
            what="ListOffsets",
            timeout_ms=timeout_ms,
        )
        out: dict[TopicPartition, ListOffsetsResult] = {}
        for result in response.results:
            tp = TopicPartition(result.topic, result.partition)
            if result.error_code:
                error = error_for_code(result.error_code, f"{tp}: {result.error_message}")
                out[tp] = ListOffsetsResult(error=error)
            else:
                out[tp] = ListOffsetsResult(result.offset, result.timestamp_ms)
        return out

    def commit_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, int],
        *,
        member_id: str,
        member_epoch: int,
        timeout_ms: int | None,
    ) -> dict[TopicPartition, TidelogError]:
        response = self.transport.call(
            self.transport.stub.OffsetCommit,
            pb.OffsetCommitRequest(
                group_id=group_id,
                member_id=member_id,
                member_epoch=member_epoch,
                offsets=[
                    pb.CommittedOffset(topic=tp.topic, partition=tp.partition, offset=offset)
                    for tp, offset in offsets.items()
                ],
            ),
            what="OffsetCommit",
            timeout_ms=timeout_ms,
        )
        return {
            TopicPartition(r.topic, r.partition): error_for_code(
                r.error_code, f"{r.topic}-{r.partition}: {r.error_message}"
            )
            for r in response.results
            if r.error_code
        }

    def fetch_committed(
        self, group_id: str, partitions: Iterable[TopicPartition], *, timeout_ms: int | None
    ) -> dict[TopicPartition, int]:
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        response = self.transport.call(
            self.transport.stub.OffsetFetch,
            pb.OffsetFetchRequest(
                group_id=group_id,
                partitions=[
                    pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()
                ],
            ),
            what="OffsetFetch",
            timeout_ms=timeout_ms,
        )
        out: dict[TopicPartition, int] = {}
        for entry in response.offsets:
            if entry.error_code:
                raise error_for_code(
                    entry.error_code, f"{entry.topic}-{entry.partition}: {entry.error_message}"
                )
            if entry.offset >= 0:
                out[TopicPartition(entry.topic, entry.partition)] = entry.offset
        return out

    def heartbeat(
        self,
        group_id: str,
        request: HeartbeatRequest,
        *,
        client_id: str,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        timeout_ms: int | None,
    ) -> HeartbeatAnswer:
        by_topic: dict[str, list[int]] = {}
        for tp in request.owned:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        answer = self.transport.call(
            self.transport.stub.ConsumerGroupHeartbeat,
            pb.ConsumerGroupHeartbeatRequest(
                group_id=group_id,
                member_id=request.member_id,
                member_epoch=request.member_epoch,
                rebalance_timeout_ms=rebalance_timeout_ms,
                session_timeout_ms=session_timeout_ms,
                subscribed_topic_names=request.subscription,
                owned_partitions=[
                    pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()
                ],
                client_id=client_id,
            ),
            what="ConsumerGroupHeartbeat",
            timeout_ms=timeout_ms,
        )
        return HeartbeatAnswer(
            answer.member_id,
            answer.member_epoch,
            answer.heartbeat_interval_ms,
            frozenset(TopicPartition(a.topic, p) for a in answer.assignment for p in a.partitions),
        )

    def describe_topic(self, name: str, *, timeout_ms: int | None) -> TopicDescription:
        answer = self.transport.call(
            self.transport.stub.DescribeTopic,
            pb.DescribeTopicRequest(name=name),
            what=f"DescribeTopic {name}",
            timeout_ms=timeout_ms,
        )
        return topic_description(answer)

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str],
        *,
        timeout_ms: int | None,
    ) -> TopicDescription:
        answer = self.transport.call(
            self.transport.stub.CreateTopic,
            pb.CreateTopicRequest(
                name=name,
                partitions=partitions,
                config=dict(config),
                replication_factor=replication_factor,
            ),
            what=f"CreateTopic {name}",
            timeout_ms=timeout_ms,
        )
        return topic_description(answer)

    def delete_topic(self, name: str, *, timeout_ms: int | None) -> None:
        self.transport.call(
            self.transport.stub.DeleteTopic,
            pb.DeleteTopicRequest(name=name),
            what=f"DeleteTopic {name}",
            timeout_ms=timeout_ms,
        )

    def alter_topic_config(
        self,
        name: str,
        set_config: Mapping[str, str],
        delete: Sequence[str],
        *,
        timeout_ms: int | None,
    ) -> TopicDescription:
        answer = self.transport.call(
            self.transport.stub.AlterTopicConfig,
            pb.AlterTopicConfigRequest(name=name, set=dict(set_config), delete=list(delete)),
            what=f"AlterTopicConfig {name}",
            timeout_ms=timeout_ms,
        )
        return topic_description(answer)

    def create_partitions(
        self, topic: str, total_count: int, *, validate_only: bool, timeout_ms: int | None
    ) -> int:
        answer = self.transport.call(
            self.transport.stub.CreatePartitions,
            pb.CreatePartitionsRequest(
                topics=[pb.CreatePartitionsTopic(name=topic, count=total_count)],
                validate_only=validate_only,
            ),
            what=f"CreatePartitions {topic}",
            timeout_ms=timeout_ms,
        )
        for result in answer.results:
            if result.error_code:
                raise error_for_code(result.error_code, result.error_message)
            if result.name == topic:
                return int(result.partitions)
        raise InternalError(f"the broker's CreatePartitions answer has no result for {topic!r}")

    def close(self) -> None:
        self.transport.close()


def topic_description(answer: pb.TopicDescription) -> TopicDescription:
    """A ``TopicDescription`` message as the public value."""
    return TopicDescription(
        name=answer.name,
        partitions=tuple(
            PartitionDescription(
                partition=p.partition,
                log_start_offset=p.log_start_offset,
                log_end_offset=p.log_end_offset,
                high_watermark=p.high_watermark,
                size_bytes=p.size_bytes,
                segments=p.segments,
                leader=p.leader,
                replicas=tuple(p.replicas),
                isr=tuple(p.isr),
                leader_epoch=p.leader_epoch,
            )
            for p in sorted(answer.partitions, key=lambda p: p.partition)
        ),
        config=dict(sorted(answer.config.items())),
        internal=answer.internal,
    )
