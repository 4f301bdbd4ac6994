"""``GrpcConnection``: the ``client.connection.Connection`` protocol over gRPC, and
``grpc_connections``, the factory the facades (``Producer``, ``Consumer``, ``AdminClient``,
``KeyedProducer``) open connections with.

Each call builds its request (``client.grpc_conversions``), makes one call on a
``client.transport.Transport`` (the only module that touches grpc) and reads the answer
back into domain values. A call's own failure is raised as the exact ``TidelogError`` the
transport rebuilds from the status; per-partition errors come back as values, so the
router (``client.routing``) can resend just the failed partitions.

Thread-safe: ``GrpcConnection`` holds no state but its transport, which is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tidelog.client.cluster import BrokerNode, ClusterMetadata, PartitionMetadata, TopicMetadata
from tidelog.client.connection import (
    CommittedOffset,
    Connection,
    ConnectionFactory,
    EpochEndResult,
    FetchStream,
    ListOffsetsResult,
    ProduceAnswer,
    ProduceCall,
    ProducerState,
    ProduceStream,
)
from tidelog.client.group_member import HeartbeatAnswer, HeartbeatRequest
from tidelog.client.grpc_conversions import (
    GrpcFetchStream,
    GrpcProduceStream,
    config_resource,
    partition_errors,
    produce_answer,
    produce_request,
    source_name,
    topic_description,
    topic_partitions,
)
from tidelog.client.security import ClientSecurity
from tidelog.client.transport import Transport
from tidelog.client.types import (
    AlterConfigOp,
    ConfigEntry,
    ConfigResource,
    ConfigSynonym,
    GroupDescription,
    GroupMember,
    GroupPartitionLag,
    GroupSummary,
    LogDirDescription,
    LogDirReplica,
    PartitionReassignment,
    QuotaEntity,
    TopicDescription,
    TopicPartition,
    TopicSummary,
)
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import InternalError, TidelogError, error_for_code

__all__ = ["GrpcConnection", "grpc_connections"]


def grpc_connections(
    *,
    client_id: str,
    request_timeout_ms: int,
    reconnect_backoff_max_ms: int,
    max_send_bytes: int = 1024 * 1024,
    reuse: Transport | None = None,
    security: ClientSecurity | None = None,
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
                max_send_bytes=max_send_bytes,
                security=security,
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
            brokers={
                b.id: BrokerNode(b.id, b.host, b.port, b.rack or None) for b in answer.brokers
            },
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
        self,
        queries: Mapping[TopicPartition, int],
        *,
        timeout_ms: int | None,
        isolation_level: int = 0,
    ) -> dict[TopicPartition, ListOffsetsResult]:
        response = self.transport.call(
            self.transport.stub.ListOffsets,
            pb.ListOffsetsRequest(
                partitions=[
                    pb.ListOffsetsPartition(topic=tp.topic, partition=tp.partition, timestamp_ms=ts)
                    for tp, ts in queries.items()
                ],
                isolation_level=isolation_level,
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
        leader_epochs: Mapping[TopicPartition, int] | None = None,
    ) -> dict[TopicPartition, TidelogError]:
        epochs = leader_epochs or {}
        response = self.transport.call(
            self.transport.stub.OffsetCommit,
            pb.OffsetCommitRequest(
                group_id=group_id,
                member_id=member_id,
                member_epoch=member_epoch,
                offsets=[
                    pb.CommittedOffset(
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=offset,
                        leader_epoch=epochs.get(tp, -1),
                    )
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
        found = self.fetch_committed_offsets(group_id, partitions, timeout_ms=timeout_ms)
        return {tp: committed.offset for tp, committed in found.items()}

    def offsets_for_leader_epochs(
        self, queries: Mapping[TopicPartition, tuple[int, int]], *, timeout_ms: int | None
    ) -> dict[TopicPartition, EpochEndResult]:
        response = self.transport.call(
            self.transport.stub.OffsetForLeaderEpoch,
            pb.OffsetForLeaderEpochRequest(
                partitions=[
                    pb.OffsetForLeaderEpochPartition(
                        topic=tp.topic,
                        partition=tp.partition,
                        leader_epoch=epoch,
                        current_leader_epoch=current if current >= 0 else None,
                    )
                    for tp, (epoch, current) in queries.items()
                ]
            ),
            what="OffsetForLeaderEpoch",
            timeout_ms=timeout_ms,
        )
        out: dict[TopicPartition, EpochEndResult] = {}
        for result in response.results:
            tp = TopicPartition(result.topic, result.partition)
            if result.error_code:
                error = error_for_code(result.error_code, f"{tp}: {result.error_message}")
                out[tp] = EpochEndResult(error=error)
            else:
                out[tp] = EpochEndResult(result.leader_epoch, result.end_offset)
        return out

    def fetch_committed_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition],
        *,
        timeout_ms: int | None,
        require_stable: bool = False,
    ) -> dict[TopicPartition, CommittedOffset]:
        response = self.transport.call(
            self.transport.stub.OffsetFetch,
            pb.OffsetFetchRequest(
                group_id=group_id,
                partitions=topic_partitions(partitions),
                require_stable=require_stable,
            ),
            what="OffsetFetch",
            timeout_ms=timeout_ms,
        )
        out: dict[TopicPartition, CommittedOffset] = {}
        for entry in response.offsets:
            if entry.error_code:
                raise error_for_code(
                    entry.error_code, f"{entry.topic}-{entry.partition}: {entry.error_message}"
                )
            if entry.offset >= 0:
                # A broker from before KIP-320 support sends no epoch: unknown (-1).
                epoch = entry.leader_epoch if entry.HasField("leader_epoch") else -1
                out[TopicPartition(entry.topic, entry.partition)] = CommittedOffset(
                    entry.offset, epoch
                )
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
        answer = self.transport.call(
            self.transport.stub.ConsumerGroupHeartbeat,
            pb.ConsumerGroupHeartbeatRequest(
                group_id=group_id,
                member_id=request.member_id,
                member_epoch=request.member_epoch,
                rebalance_timeout_ms=rebalance_timeout_ms,
                session_timeout_ms=session_timeout_ms,
                subscribed_topic_names=request.subscription,
                owned_partitions=topic_partitions(request.owned),
                client_id=client_id,
                group_instance_id=request.instance_id,
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

    def list_topics(self, *, include_internal: bool, timeout_ms: int | None) -> list[TopicSummary]:
        answer = self.transport.call(
            self.transport.stub.ListTopics,
            pb.ListTopicsRequest(include_internal=include_internal),
            what="ListTopics",
            timeout_ms=timeout_ms,
        )
        return [TopicSummary(t.name, t.partitions, t.internal) for t in answer.topics]

    def list_groups(self, *, timeout_ms: int | None) -> list[GroupSummary]:
        answer = self.transport.call(
            self.transport.stub.ListGroups,
            pb.ListGroupsRequest(),
            what="ListGroups",
            timeout_ms=timeout_ms,
        )
        return [
            GroupSummary(g.group_id, g.state, g.members, g.type or "consumer")
            for g in answer.groups
        ]

    def describe_group(self, group_id: str, *, timeout_ms: int | None) -> GroupDescription:
        answer = self.transport.call(
            self.transport.stub.DescribeGroup,
            pb.DescribeGroupRequest(group_id=group_id),
            what=f"DescribeGroup {group_id}",
            timeout_ms=timeout_ms,
        )
        return GroupDescription(
            group_id=answer.group_id,
            state=answer.state,
            group_epoch=answer.group_epoch,
            members=tuple(
                GroupMember(
                    member_id=m.member_id,
                    client_id=m.client_id,
                    member_epoch=m.member_epoch,
                    subscribed_topics=tuple(m.subscribed_topic_names),
                    assignment=tuple(
                        TopicPartition(a.topic, p) for a in m.assignment for p in a.partitions
                    ),
                    instance_id=(m.group_instance_id if m.HasField("group_instance_id") else None),
                )
                for m in answer.members
            ),
            partitions=tuple(
                GroupPartitionLag(
                    tp=TopicPartition(p.topic, p.partition),
                    committed_offset=None if p.committed_offset < 0 else p.committed_offset,
                    log_end_offset=p.log_end_offset,
                    lag=p.lag,
                    member_id=p.member_id,
                )
                for p in answer.partitions
            ),
        )

    def delete_group(self, group_id: str, *, timeout_ms: int | None) -> None:
        self.transport.call(
            self.transport.stub.DeleteGroup,
            pb.DeleteGroupRequest(group_id=group_id),
            what=f"DeleteGroup {group_id}",
            timeout_ms=timeout_ms,
        )

    def delete_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition], *, timeout_ms: int | None
    ) -> dict[TopicPartition, TidelogError | None]:
        answer = self.transport.call(
            self.transport.stub.OffsetDelete,
            pb.OffsetDeleteRequest(
                group_id=group_id,
                partitions=topic_partitions(partitions),
            ),
            what=f"OffsetDelete {group_id}",
            timeout_ms=timeout_ms,
        )
        out: dict[TopicPartition, TidelogError | None] = {}
        for result in answer.results:
            tp = TopicPartition(result.topic, result.partition)
            out[tp] = (
                error_for_code(result.error_code, f"{tp}: {result.error_message}")
                if result.error_code
                else None
            )
        return out

    def alter_client_quotas(
        self,
        client_id: str,
        set_quotas: Mapping[str, float],
        delete: Sequence[str],
        *,
        user: str = "",
        timeout_ms: int | None,
    ) -> None:
        self.transport.call(
            self.transport.stub.AlterClientQuotas,
            pb.AlterClientQuotasRequest(
                client_id=client_id, user=user, set=dict(set_quotas), delete=list(delete)
            ),
            what=f"AlterClientQuotas {user or ''}/{client_id}",
            timeout_ms=timeout_ms,
        )

    def describe_client_quotas(
        self,
        client_id: str,
        *,
        user: str = "",
        include_users: bool = False,
        timeout_ms: int | None,
    ) -> dict[QuotaEntity, dict[str, float]]:
        answer = self.transport.call(
            self.transport.stub.DescribeClientQuotas,
            pb.DescribeClientQuotasRequest(
                client_id=client_id, user=user, include_users=include_users
            ),
            what="DescribeClientQuotas",
            timeout_ms=timeout_ms,
        )
        return {
            QuotaEntity(entry.user or None, entry.client_id or None): dict(entry.quotas)
            for entry in answer.entries
        }

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
        replica_assignment: Sequence[Sequence[int]] = (),
        timeout_ms: int | None,
    ) -> TopicDescription:
        answer = self.transport.call(
            self.transport.stub.CreateTopic,
            pb.CreateTopicRequest(
                name=name,
                partitions=partitions,
                config=dict(config),
                replication_factor=replication_factor,
                replica_assignment=[pb.ReplicaList(brokers=r) for r in replica_assignment],
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

    def elect_leaders(
        self,
        unclean: bool,
        partitions: Iterable[TopicPartition] | None,
        *,
        timeout_ms: int | None,
    ) -> dict[TopicPartition, TidelogError | None]:
        answer = self.transport.call(
            self.transport.stub.ElectLeaders,
            pb.ElectLeadersRequest(
                preferred=not unclean,
                unclean=unclean,
                partitions=topic_partitions(partitions or ()),
            ),
            what="ElectLeaders",
            timeout_ms=timeout_ms,
        )
        return partition_errors(answer.results)

    def alter_partition_reassignments(
        self,
        targets: Mapping[TopicPartition, Sequence[int] | None],
        *,
        timeout_ms: int | None,
    ) -> dict[TopicPartition, TidelogError | None]:
        answer = self.transport.call(
            self.transport.stub.AlterPartitionReassignments,
            pb.AlterPartitionReassignmentsRequest(
                partitions=[
                    pb.ReassignmentTarget(
                        topic=tp.topic,
                        partition=tp.partition,
                        replicas=list(target or ()),
                        cancel=target is None,
                    )
                    for tp, target in targets.items()
                ]
            ),
            what="AlterPartitionReassignments",
            timeout_ms=timeout_ms,
        )
        return partition_errors(answer.results)

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None, *, timeout_ms: int | None
    ) -> dict[TopicPartition, PartitionReassignment]:
        answer = self.transport.call(
            self.transport.stub.ListPartitionReassignments,
            pb.ListPartitionReassignmentsRequest(partitions=topic_partitions(partitions or ())),
            what="ListPartitionReassignments",
            timeout_ms=timeout_ms,
        )
        return {
            TopicPartition(r.topic, r.partition): PartitionReassignment(
                tuple(r.replicas), tuple(r.adding_replicas), tuple(r.removing_replicas)
            )
            for r in answer.reassignments
        }

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

    def describe_configs(
        self, resource: ConfigResource, keys: Sequence[str], *, timeout_ms: int | None
    ) -> list[ConfigEntry]:
        answer = self.transport.call(
            self.transport.stub.DescribeConfigs,
            pb.DescribeConfigsRequest(resource=config_resource(resource), keys=list(keys)),
            what=f"DescribeConfigs {resource.type} {resource.name!r}",
            timeout_ms=timeout_ms,
        )
        return [
            ConfigEntry(
                name=e.name,
                value=e.value if e.HasField("value") else None,
                source=source_name(e.source),
                read_only=e.read_only,
                sensitive=e.sensitive,
                type=e.type,
                documentation=e.documentation,
                synonyms=tuple(
                    ConfigSynonym(
                        s.name, s.value if s.HasField("value") else None, source_name(s.source)
                    )
                    for s in e.synonyms
                ),
            )
            for e in answer.entries
        ]

    def incremental_alter_configs(
        self,
        resource: ConfigResource,
        changes: Sequence[AlterConfigOp],
        *,
        validate_only: bool,
        timeout_ms: int | None,
    ) -> None:
        self.transport.call(
            self.transport.stub.IncrementalAlterConfigs,
            pb.IncrementalAlterConfigsRequest(
                resource=config_resource(resource),
                alterations=[
                    pb.ConfigAlteration(
                        name=c.name,
                        operation=pb.ConfigOperation.Value(f"CONFIG_OPERATION_{c.op.upper()}"),
                        value=c.value or "",
                    )
                    for c in changes
                ],
                validate_only=validate_only,
            ),
            what=f"IncrementalAlterConfigs {resource.type} {resource.name!r}",
            timeout_ms=timeout_ms,
        )

    def create_partitions(
        self,
        topic: str,
        total_count: int,
        *,
        validate_only: bool,
        replica_assignment: Sequence[Sequence[int]] = (),
        timeout_ms: int | None,
    ) -> int:
        answer = self.transport.call(
            self.transport.stub.CreatePartitions,
            pb.CreatePartitionsRequest(
                topics=[
                    pb.CreatePartitionsTopic(
                        name=topic,
                        count=total_count,
                        replica_assignment=[pb.ReplicaList(brokers=r) for r in replica_assignment],
                    )
                ],
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

    def init_producer_id(
        self, *, producer_key: str = "", timeout_ms: int | None
    ) -> tuple[int, int]:
        request = (
            pb.InitProducerIdRequest(producer_key=producer_key)
            if producer_key
            else pb.InitProducerIdRequest(producer_id=-1, producer_epoch=-1)
        )
        answer = self.transport.call(
            self.transport.stub.InitProducerId,
            request,
            what="InitProducerId",
            timeout_ms=timeout_ms,
        )
        return answer.producer_id, answer.producer_epoch

    def describe_log_dirs(
        self, partitions: Iterable[TopicPartition] | None, *, timeout_ms: int | None
    ) -> LogDirDescription:
        answer = self.transport.call(
            self.transport.stub.DescribeLogDirs,
            pb.DescribeLogDirsRequest(partitions=topic_partitions(partitions or ())),
            what="DescribeLogDirs",
            timeout_ms=timeout_ms,
        )
        if answer.error_code:
            raise error_for_code(answer.error_code, answer.error_message)
        return LogDirDescription(
            answer.path,
            answer.total_bytes,
            answer.usable_bytes,
            {
                TopicPartition(p.topic, p.partition): LogDirReplica(p.size_bytes, p.offset_lag)
                for p in answer.partitions
            },
        )

    def delete_records(
        self, offsets: Mapping[TopicPartition, int], *, timeout_ms: int | None
    ) -> dict[TopicPartition, int | TidelogError]:
        timeout = self.transport.request_timeout_ms if timeout_ms is None else max(timeout_ms, 1)
        response = self.transport.call(
            self.transport.stub.DeleteRecords,
            pb.DeleteRecordsRequest(
                partitions=[
                    pb.DeleteRecordsPartition(topic=tp.topic, partition=tp.partition, offset=o)
                    for tp, o in offsets.items()
                ],
                # The broker's wait ends before the call's deadline, so a follower that
                # is slow to follow answers REQUEST_TIMED_OUT, not DEADLINE_EXCEEDED.
                timeout_ms=max(timeout - min(timeout // 5, 2_000), 1),
            ),
            what="DeleteRecords",
            timeout_ms=timeout,
        )
        out: dict[TopicPartition, int | TidelogError] = {}
        for result in response.results:
            tp = TopicPartition(result.topic, result.partition)
            if result.error_code:
                out[tp] = error_for_code(result.error_code, f"{tp}: {result.error_message}")
            else:
                out[tp] = result.low_watermark
        return out

    def describe_producers(
        self,
        partitions: Iterable[TopicPartition],
        producer_id: int | None,
        *,
        timeout_ms: int | None,
    ) -> dict[TopicPartition, list[ProducerState] | TidelogError]:
        answer = self.transport.call(
            self.transport.stub.DescribeProducers,
            pb.DescribeProducersRequest(
                partitions=topic_partitions(partitions),
                producer_id=producer_id,  # None: the field absent, every producer
            ),
            what="DescribeProducers",
            timeout_ms=timeout_ms,
        )
        out: dict[TopicPartition, list[ProducerState] | TidelogError] = {}
        for part in answer.partitions:
            tp = TopicPartition(part.topic, part.partition)
            if part.error_code:
                out[tp] = error_for_code(part.error_code, f"{tp}: {part.error_message}")
            else:
                out[tp] = [
                    ProducerState(
                        s.producer_id,
                        s.producer_epoch,
                        s.last_sequence,
                        s.last_timestamp_ms,
                        s.last_offset,
                        s.coordinator_epoch,
                        s.current_txn_start_offset,
                    )
                    for s in part.producers
                ]
        return out

    def produce(self, call: ProduceCall, *, timeout_ms: int | None) -> ProduceAnswer:
        answer = self.transport.call(
            self.transport.stub.Produce,
            produce_request(call),
            what="Produce",
            timeout_ms=timeout_ms,
        )
        return produce_answer(answer)

    def open_produce_stream(self) -> ProduceStream:
        return GrpcProduceStream(
            self.transport.open_stream(
                self.transport.stub.ProduceStream, "ProduceStream", wait_for_ready=False
            )
        )

    def open_fetch_stream(self) -> FetchStream:
        return GrpcFetchStream(
            self.transport.open_stream(
                self.transport.stub.FetchStream, "FetchStream", wait_for_ready=False
            )
        )

    def close(self) -> None:
        self.transport.close()
