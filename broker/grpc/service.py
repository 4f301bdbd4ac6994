"""The gRPC listener's half that knows no threading model: one handler per RPC.

This module owns the table of unary handlers (``UNARY_HANDLERS``, gathered by area from
``broker.grpc.admin_service``, ``broker.grpc.data_service``, ``broker.grpc.group_service``,
``broker.grpc.security_service`` and ``broker.grpc.transaction_service``, plus ``Metadata``
here), the call context every
serving model builds, and ``generic_handler``, which registers the table and the four
data-path methods. An RPC name appears in exactly one area's table.

Each unary RPC of ``tidelog.v1.Broker`` is a plain function ``(core, request, context) ->
response``: it converts the request into plain values, calls one ``BrokerCore`` method and
converts the answer back. It blocks (storage work) and raises ``TidelogError``s; it knows
nothing of gRPC's servicer contexts; the serving model (``broker.grpc.listener``) runs it on
its executor through the request pipeline (``broker.core.pipeline``: authorization on the
policy table, metrics, classification), and errors are rendered once, by the model's
wrapper, through ``broker.grpc.errors``. Protobuf types stop here; record bytes pass
through untouched in both directions.

The data path (``Produce``, ``ProduceStream``, ``Fetch``, ``FetchStream``) parks work in the
core's purgatories, so the serving model drives it itself; the conversions it needs are
in ``broker.grpc.data_service`` (``fetch_spec``, ``fetch_response``, ``produce_parts``,
``produce_response``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.facade import BrokerCore
from tidelog.broker.grpc.admin_service import ADMIN_HANDLERS
from tidelog.broker.grpc.authorize import (
    filter_metadata,
    filter_response,
)
from tidelog.broker.grpc.data_service import DATA_HANDLERS
from tidelog.broker.grpc.group_service import GROUP_HANDLERS
from tidelog.broker.grpc.parse import DEFAULT_MAX_ENTRIES, parsing_handler
from tidelog.broker.grpc.security_service import SECURITY_HANDLERS
from tidelog.broker.grpc.share_service import SHARE_HANDLERS
from tidelog.broker.grpc.transaction_service import TRANSACTION_HANDLERS, filter_transactions
from tidelog.proto.tidelog.v1 import broker_pb2 as pb

__all__ = [
    "BROKER_SERVICE_NAME",
    "CLIENT_ID_METADATA_KEY",
    "UNARY_HANDLERS",
    "UnaryHandler",
    "call_context",
    "generic_handler",
    "message_types",
    "request_context",
    "wait_cap_ms",
]

log = logging.getLogger(__name__)

BROKER_SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Broker"].full_name
CLIENT_ID_METADATA_KEY = "tidelog-client-id"

UnaryHandler = Callable[[BrokerCore, Any, RequestContext], Any]

# A long poll answers this much before the call's own deadline, so the answer arrives.
_DEADLINE_MARGIN_MS = 50
_DAY_S = 86_400.0


def message_types(method: str) -> tuple[Any, Any]:
    """The request and response message classes of ``method``."""
    descriptor = pb.DESCRIPTOR.services_by_name["Broker"].methods_by_name[method]
    return getattr(pb, descriptor.input_type.name), getattr(pb, descriptor.output_type.name)


def request_context(
    peer: str, metadata: Iterable[tuple[str, str | bytes]] | None
) -> RequestContext:
    """The context of a gRPC call from its peer and invocation metadata."""
    client_id = ""
    for key, value in metadata or ():
        if key == CLIENT_ID_METADATA_KEY:
            client_id = value if isinstance(value, str) else value.decode(errors="replace")
    return RequestContext("grpc", peer, client_id)


def call_context(core: BrokerCore, context: Any, method: str) -> RequestContext:
    """The authenticated ``RequestContext`` of a gRPC call in either serving model:
    ``request_context`` plus the principal ``core.authenticator`` finds (``broker.core.auth``;
    raises ``SaslAuthenticationError`` when the listener needs a session and has none)."""
    metadata = context.invocation_metadata()
    caller = request_context(context.peer(), metadata)
    authenticator = core.authenticator
    if authenticator is None:
        return caller
    auth_context = context.auth_context() if authenticator.config.tls else None
    return authenticator.identify(caller, metadata, auth_context, method)


def wait_cap_ms(time_remaining_s: float | None) -> int | None:
    """How long a long poll may wait within the call's deadline (None: no deadline)."""
    # A call without a deadline reports a huge (or, on some versions, no) time left.
    if time_remaining_s is None or not math.isfinite(time_remaining_s):
        return None
    if time_remaining_s >= _DAY_S:
        return None
    return max(int(time_remaining_s * 1000) - _DEADLINE_MARGIN_MS, 0)


# --- cluster metadata ---------------------------------------------------------------------


def _metadata(
    core: BrokerCore, request: pb.MetadataRequest, context: RequestContext
) -> pb.MetadataResponse:
    cluster, topics = core.metadata(list(request.topics), request.include_internal)
    return pb.MetadataResponse(
        cluster_id=cluster.cluster_id,
        controller_id=cluster.controller_id,
        broker_id=cluster.broker_id,
        brokers=[
            pb.BrokerEndpoint(id=b.broker_id, host=b.host, port=b.port, rack=b.rack or "")
            for b in cluster.brokers
        ],
        topics=[
            pb.TopicMetadata(
                name=t.name,
                error_code=t.error_code,
                internal=t.internal,
                partitions=[
                    pb.PartitionMetadata(
                        partition=p,
                        leader=placed.leader,
                        leader_epoch=placed.leader_epoch,
                        replicas=placed.replicas,
                        isr=placed.isr,
                    )
                    for p, placed in enumerate(t.partitions)
                ],
            )
            for t in topics
        ],
    )


# The unary RPCs that are plain storage work, by RPC name (the data path's four streaming
# and long-polling methods are the serving model's own), gathered from their areas.
UNARY_HANDLERS: dict[str, UnaryHandler] = {
    **ADMIN_HANDLERS,  # topics, configs, partitions, elections, quotas (broker.grpc.admin_service)
    **DATA_HANDLERS,  # offsets, producer ids, record deletion (broker.grpc.data_service)
    **GROUP_HANDLERS,  # consumer groups and their coordinator (broker.grpc.group_service)
    "Metadata": _metadata,
    **SECURITY_HANDLERS,  # Authenticate, SCRAM users, ACLs (broker.grpc.security_service)
    **TRANSACTION_HANDLERS,  # the transaction coordinator (broker.grpc.transaction_service)
    **SHARE_HANDLERS,  # share groups, issue #32 (broker.grpc.share_service)
}


def _authorized(method: str, handler: UnaryHandler) -> UnaryHandler:
    """``handler`` with its listing filtered by ``broker.grpc.authorize`` (what the caller may
    not describe is left out, silently; nothing when the authorizer is disabled). The
    request itself was authorized by the request pipeline before the call
    (``broker.core.pipeline``, resources from ``broker.grpc.authorize.resources_of``)."""

    def run(core: BrokerCore, request: Any, context: RequestContext) -> Any:
        acls = core.acls
        if not acls.enabled:
            return handler(core, request, context)
        response = handler(core, request, context)
        if method == "Metadata":
            return filter_metadata(acls, request, response, context)
        if method == "ListTransactions":
            return filter_transactions(acls, response, context)
        return filter_response(acls, method, response, context)

    return run


def generic_handler(
    unary: Callable[[str, UnaryHandler], Any],
    produce: Any,
    fetch: Any,
    produce_stream: Any,
    fetch_stream: Any,
    *,
    share_fetch_stream: Any = None,
    max_request_entries: int = DEFAULT_MAX_ENTRIES,
) -> grpc.GenericRpcHandler:
    """The ``grpc.GenericRpcHandler`` of ``tidelog.v1.Broker`` for one serving model.

    ``unary(name, handler)`` wraps each table entry as the model runs it; the four
    data-path methods are the model's own. The model (``grpc_async``) builds its handler
    here, so an RPC added to the table is served without touching it.
    """
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for name, handler in UNARY_HANDLERS.items():
        request_type, response_type = message_types(name)
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            parsing_handler(
                request_type,
                unary(name, _authorized(name, handler)),
                streaming=False,
                max_entries=max_request_entries,
            ),
            response_serializer=response_type.SerializeToString,
        )
    # Fetch answers are serialized by fetch_response already (records spliced in).
    for name, method, streaming, request_type, serializer in (
        ("Produce", produce, False, pb.ProduceRequest, pb.ProduceResponse.SerializeToString),
        ("Fetch", fetch, False, pb.FetchRequest, None),
        (
            "ProduceStream",
            produce_stream,
            True,
            pb.ProduceRequest,
            pb.ProduceResponse.SerializeToString,
        ),
        ("FetchStream", fetch_stream, True, pb.FetchRequest, None),
        # Share groups' fetch stream (broker.grpc.share_stream), when the model has one.
        *(
            ()
            if share_fetch_stream is None
            else (
                (
                    "ShareFetchStream",
                    share_fetch_stream,
                    True,
                    pb.ShareFetchRequest,
                    pb.ShareFetchResponse.SerializeToString,
                ),
            )
        ),
    ):
        make = (
            grpc.stream_stream_rpc_method_handler
            if streaming
            else grpc.unary_unary_rpc_method_handler
        )
        # Bodies are parsed by broker.grpc.parse, not by gRPC: a malformed one is
        # INVALID_REQUEST, not INTERNAL (see there).
        handlers[name] = make(
            parsing_handler(
                request_type, method, streaming=streaming, max_entries=max_request_entries
            ),
            response_serializer=serializer,
        )
    return grpc.method_handlers_generic_handler(BROKER_SERVICE_NAME, handlers)
