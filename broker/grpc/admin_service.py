"""The gRPC handlers of cluster administration: topics, configs, partitions, elections,
reassignments, log directories, client quotas, controlled shutdown, the controller's
``Envelope`` of forwarded calls, and the transaction calls between brokers
(``WriteTxnMarkers``, ``VerifyTxnPartition``: ``broker.transactions.markers``).

Plain functions ``(core, request, context) -> response`` like the rest of
``broker.grpc.service``'s table (which includes ``ADMIN_HANDLERS``): convert the request,
call one ``BrokerCore`` method, convert the answer. Authorization happened before, in the
request pipeline (``broker.core.pipeline``); what a listing may show is filtered after, by
``broker.grpc.authorize``. Errors are raised as ``TidelogError``s and rendered once by the
serving model. A request the proto can express but the domain cannot mean (an unknown
config resource type or operation, an election that is both or neither preferred and
unclean) is INVALID_REQUEST here, before the core is called.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from tidelog.broker.core.configs import AlterOp, ConfigChange, ResourceKind
from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.core.topics import TopicView
from tidelog.broker.transactions.markers import TxnMarker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import InvalidRequestError

__all__ = ["ADMIN_HANDLERS"]

log = logging.getLogger(__name__)


def _create_topic(
    core: BrokerCore, request: pb.CreateTopicRequest, context: RequestContext
) -> pb.TopicDescription:
    assignment = [(p, tuple(r.brokers)) for p, r in enumerate(request.replica_assignment)]
    return _topic_description(
        core.create_topic(
            request.name,
            request.partitions or None,
            dict(request.config),
            replication_factor=request.replication_factor or None,
            assignment=assignment or None,
        )
    )


def _delete_topic(
    core: BrokerCore, request: pb.DeleteTopicRequest, context: RequestContext
) -> pb.DeleteTopicResponse:
    core.delete_topic(request.name)
    return pb.DeleteTopicResponse()


def _list_topics(
    core: BrokerCore, request: pb.ListTopicsRequest, context: RequestContext
) -> pb.ListTopicsResponse:
    return pb.ListTopicsResponse(
        topics=[
            pb.TopicSummary(name=t.name, partitions=t.partitions, internal=t.internal)
            for t in core.list_topics(request.include_internal)
        ]
    )


def _describe_topic(
    core: BrokerCore, request: pb.DescribeTopicRequest, context: RequestContext
) -> pb.TopicDescription:
    return _topic_description(core.describe_topic(request.name))


def _alter_topic_config(
    core: BrokerCore, request: pb.AlterTopicConfigRequest, context: RequestContext
) -> pb.TopicDescription:
    return _topic_description(
        core.alter_topic_config(request.name, dict(request.set), list(request.delete))
    )


def _config_kind(resource: pb.ConfigResource) -> ResourceKind:
    try:
        return ResourceKind(resource.type)
    except ValueError:
        raise InvalidRequestError(
            "resource type must be CONFIG_RESOURCE_TYPE_TOPIC, CONFIG_RESOURCE_TYPE_BROKER "
            "or CONFIG_RESOURCE_TYPE_GROUP"
        ) from None


def _describe_configs(
    core: BrokerCore, request: pb.DescribeConfigsRequest, context: RequestContext
) -> pb.DescribeConfigsResponse:
    entries = core.describe_configs(
        _config_kind(request.resource),
        request.resource.name,
        list(request.keys) or None,
        forwarded=request.forwarded,
    )
    return pb.DescribeConfigsResponse(
        entries=[
            pb.ConfigEntry(
                name=e.name,
                value=e.value,
                source=pb.ConfigSource.Value(f"CONFIG_SOURCE_{e.source.name}"),
                read_only=e.read_only,
                sensitive=e.sensitive,
                type=e.config_type.name,
                documentation=e.documentation,
                synonyms=[
                    pb.ConfigSynonym(
                        name=s.name,
                        value=None if e.sensitive else s.value,
                        source=pb.ConfigSource.Value(f"CONFIG_SOURCE_{s.source.name}"),
                    )
                    for s in e.synonyms
                ],
            )
            for e in entries
        ]
    )


def _incremental_alter_configs(
    core: BrokerCore, request: pb.IncrementalAlterConfigsRequest, context: RequestContext
) -> pb.IncrementalAlterConfigsResponse:
    if any(a.operation not in AlterOp._value2member_map_ for a in request.alterations):
        raise InvalidRequestError("unknown config operation (SET, DELETE, APPEND, SUBTRACT)")
    changes = [
        ConfigChange(
            a.name,
            AlterOp(a.operation),
            None if a.operation == pb.CONFIG_OPERATION_DELETE else a.value,
        )
        for a in request.alterations
    ]
    core.alter_configs(
        _config_kind(request.resource),
        request.resource.name,
        changes,
        incremental=True,
        validate_only=request.validate_only,
        forwarded=request.forwarded,
    )
    return pb.IncrementalAlterConfigsResponse()


def _create_partitions(
    core: BrokerCore, request: pb.CreatePartitionsRequest, context: RequestContext
) -> pb.CreatePartitionsResponse:
    answers = core.create_partitions(
        [(t.name, t.count) for t in request.topics],
        validate_only=request.validate_only,
        assignments={
            t.name: [tuple(r.brokers) for r in t.replica_assignment]
            for t in request.topics
            if t.replica_assignment
        },
    )
    return pb.CreatePartitionsResponse(
        results=[
            pb.CreatePartitionsTopicResult(
                name=a.name,
                error_code=a.error_code,
                error_message=a.error_message,
                partitions=a.partitions,
            )
            for a in answers
        ]
    )


def _elect_leaders(
    core: BrokerCore, request: pb.ElectLeadersRequest, context: RequestContext
) -> pb.ElectLeadersResponse:
    if request.preferred == request.unclean:
        raise InvalidRequestError("ask for exactly one of a preferred or an unclean election")
    wanted = [(t.topic, p) for t in request.partitions for p in t.partitions] or None
    results = core.elect_leaders(request.unclean, wanted)
    return pb.ElectLeadersResponse(
        moved=sum(1 for code in results.values() if not code),
        results=[
            pb.ElectionResult(topic=topic, partition=partition, error_code=code)
            for (topic, partition), code in results.items()
        ],
    )


def _describe_log_dirs(
    core: BrokerCore, request: pb.DescribeLogDirsRequest, context: RequestContext
) -> pb.DescribeLogDirsResponse:
    wanted = [(t.topic, p) for t in request.partitions for p in t.partitions] or None
    found = core.describe_log_dirs(wanted)
    return pb.DescribeLogDirsResponse(
        path=found.path,
        total_bytes=found.total_bytes,
        usable_bytes=found.usable_bytes,
        partitions=[
            pb.LogDirPartition(
                topic=p.topic,
                partition=p.partition,
                size_bytes=p.size_bytes,
                offset_lag=p.offset_lag,
            )
            for p in found.partitions
        ],
        error_code=found.error_code,
        error_message=found.error_message,
    )


def _alter_partition_reassignments(
    core: BrokerCore, request: pb.AlterPartitionReassignmentsRequest, context: RequestContext
) -> pb.AlterPartitionReassignmentsResponse:
    wanted = {
        (t.topic, t.partition): None if t.cancel else list(t.replicas) for t in request.partitions
    }
    results = core.alter_partition_reassignments(wanted)
    return pb.AlterPartitionReassignmentsResponse(
        results=[
            pb.ReassignmentResult(topic=topic, partition=partition, error_code=code)
            for (topic, partition), code in results.items()
        ]
    )


def _list_partition_reassignments(
    core: BrokerCore, request: pb.ListPartitionReassignmentsRequest, context: RequestContext
) -> pb.ListPartitionReassignmentsResponse:
    wanted = [(t.topic, p) for t in request.partitions for p in t.partitions] or None
    found = core.list_partition_reassignments(wanted)
    return pb.ListPartitionReassignmentsResponse(
        reassignments=[
            pb.OngoingReassignment(
                topic=topic,
                partition=partition,
                replicas=list(replicas),
                adding_replicas=list(adding),
                removing_replicas=list(removing),
            )
            for (topic, partition), (replicas, adding, removing) in sorted(found.items())
        ]
    )


def _controlled_shutdown(
    core: BrokerCore, request: pb.ControlledShutdownRequest, context: RequestContext
) -> pb.ControlledShutdownResponse:
    return pb.ControlledShutdownResponse(moved=core.controlled_shutdown(request.broker_id))


def _envelope(
    core: BrokerCore, request: pb.EnvelopeRequest, context: RequestContext
) -> pb.EnvelopeResponse:
    # A topic admin call another broker forwarded to this controller (already authorized
    # there for its caller; here the sender must be a broker: CLUSTER_ACTION).
    try:
        arguments = json.loads(request.arguments or b"{}")
    except ValueError as exc:
        raise InvalidRequestError(f"envelope arguments are not JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise InvalidRequestError("envelope arguments must be a JSON object")
    log.info(
        "running %s forwarded by broker %d for %s",
        request.call,
        request.broker_id,
        request.principal or "an unauthenticated caller",
    )
    result = core.run_forwarded(request.call, arguments)
    return pb.EnvelopeResponse(result=json.dumps(result).encode())


def _write_txn_markers(
    core: BrokerCore, request: pb.WriteTxnMarkersRequest, context: RequestContext
) -> pb.WriteTxnMarkersResponse:
    # A transaction coordinator's markers for partitions this broker leads (issue #28;
    # the sender is a broker: CLUSTER_ACTION). The same core call as Kafka's api 27.
    markers = [
        TxnMarker(
            m.producer_id,
            m.producer_epoch,
            m.commit,
            m.coordinator_epoch,
            tuple((p.topic, p.partition) for p in m.partitions),
        )
        for m in request.markers
    ]
    answers = core.write_txn_markers(markers)
    return pb.WriteTxnMarkersResponse(
        markers=[
            pb.TxnMarkerEntry(
                producer_id=m.producer_id,
                producer_epoch=m.producer_epoch,
                commit=m.commit,
                coordinator_epoch=m.coordinator_epoch,
                partitions=[
                    pb.TxnMarkerPartition(
                        topic=t, partition=p, error_code=codes.get((t, p), "UNKNOWN_SERVER_ERROR")
                    )
                    for t, p in m.partitions
                ],
            )
            for m, codes in zip(markers, answers, strict=True)
        ]
    )


def _verify_txn_partition(
    core: BrokerCore, request: pb.VerifyTxnPartitionRequest, context: RequestContext
) -> pb.VerifyTxnPartitionResponse:
    # A partition leader's KIP-890 check with this broker as the id's coordinator.
    code = core.verify_txn_partition(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        (request.topic, request.partition),
        add=request.add,
    )
    return pb.VerifyTxnPartitionResponse(error_code=code)


def _alter_client_quotas(
    core: BrokerCore, request: pb.AlterClientQuotasRequest, context: RequestContext
) -> pb.AlterClientQuotasResponse:
    core.alter_client_quotas(
        request.client_id, dict(request.set), list(request.delete), user=request.user or None
    )
    return pb.AlterClientQuotasResponse()


def _describe_client_quotas(
    core: BrokerCore, request: pb.DescribeClientQuotasRequest, context: RequestContext
) -> pb.DescribeClientQuotasResponse:
    found = core.describe_client_quotas(
        request.client_id or None,
        user=request.user or None,
        include_users=request.include_users,
    )
    return pb.DescribeClientQuotasResponse(
        entries=[
            pb.ClientQuotaEntry(
                client_id=entity.client_id or "", user=entity.user or "", quotas=values
            )
            for entity, values in found.items()
        ]
    )


def _topic_description(view: TopicView) -> pb.TopicDescription:
    return pb.TopicDescription(
        name=view.name,
        internal=view.internal,
        config=dict(view.config),
        partitions=[
            pb.PartitionDescription(
                partition=p.partition,
                log_start_offset=p.log_start_offset,
                log_end_offset=p.log_end_offset,
                high_watermark=p.high_watermark,
                size_bytes=p.size_bytes,
                segments=p.segments,
                leader=p.leader,
                leader_epoch=p.leader_epoch,
                replicas=p.replicas,
                isr=p.isr,
                elr=p.elr,
                last_known_elr=p.last_known_elr,
            )
            for p in view.partitions
        ],
    )


ADMIN_HANDLERS: dict[str, Callable[[BrokerCore, Any, RequestContext], Any]] = {
    "CreateTopic": _create_topic,
    "DeleteTopic": _delete_topic,
    "ListTopics": _list_topics,
    "DescribeTopic": _describe_topic,
    "AlterTopicConfig": _alter_topic_config,
    "DescribeConfigs": _describe_configs,
    "IncrementalAlterConfigs": _incremental_alter_configs,
    "CreatePartitions": _create_partitions,
    "ElectLeaders": _elect_leaders,
    "AlterPartitionReassignments": _alter_partition_reassignments,
    "ListPartitionReassignments": _list_partition_reassignments,
    "DescribeLogDirs": _describe_log_dirs,
    "ControlledShutdown": _controlled_shutdown,
    "Envelope": _envelope,
    "WriteTxnMarkers": _write_txn_markers,
    "VerifyTxnPartition": _verify_txn_partition,
    "AlterClientQuotas": _alter_client_quotas,
    "DescribeClientQuotas": _describe_client_quotas,
}
