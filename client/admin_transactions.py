"""The transaction calls of ``AdminClient`` (``client.admin``): ``list_transactions``,
``describe_transactions`` and ``abort_transaction``, Kafka's
``Admin.listTransactions``/``describeTransactions``/``abortTransaction`` (what
``kafka-transactions.sh list|describe|abort`` do; ``tidelog transactions``).

``abort_transaction`` is the operator's way out of a *hanging* transaction: one a
partition holds open (its last stable offset stuck, read_committed consumers stalled)
while its coordinator no longer knows it (its state lost, or a client bug before KIP-890).
It writes an ABORT marker straight to the partition's leader (WriteTxnMarkers, as Kafka's
admin client: the caller needs CLUSTER_ACTION on the cluster), with the producer id and
epoch and the coordinator epoch ``describe_producers`` shows. Aborting a transaction its
coordinator still runs is the operator's mistake to avoid (the coordinator's own markers
come later and change nothing there; that part of the transaction is lost), which is why
``tidelog transactions find-hanging`` checks the coordinators first.

``TransactionAdminCalls`` is mixed into ``AdminClient`` and is not used alone. Each
broker coordinates the transactional ids of the ``__transaction_state`` partitions it
leads, so a listing asks every live broker and joins the answers (sorted by id); a
description asks each id's coordinator (FindCoordinator key type 1), as Kafka's admin
client does. The calls are not in the ``Connection`` protocol: they go over the
connection's gRPC transport (``InvalidRequestError`` on another connection), as
``client.admin_security``'s.

Thread-safe, as ``AdminClient`` is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tidelog.client.cluster import BrokerNode
from tidelog.client.connection import Connection
from tidelog.client.grpc_connection import GrpcConnection
from tidelog.client.routing import ROUTING_ERRORS, ClusterConnections
from tidelog.client.types import (
    AbortTransactionSpec,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import (
    InvalidRequestError,
    LeaderNotAvailableError,
    TidelogError,
    UnknownTopicOrPartitionError,
    error_for_code,
)

__all__ = ["TransactionAdminCalls"]


def _grpc(connection: Connection, method: str, request: object, timeout_ms: int) -> Any:
    if not isinstance(connection, GrpcConnection):
        raise InvalidRequestError(f"{method} needs a gRPC connection")
    transport = connection.transport
    return transport.call(
        getattr(transport.stub, method), request, what=method, timeout_ms=timeout_ms
    )


class TransactionAdminCalls:
    """``AdminClient``'s transaction calls. Thread-safe; needs ``_connections``."""

    _connections: ClusterConnections

    def list_transactions(
        self,
        state_filters: Iterable[str] = (),
        producer_id_filters: Iterable[int] = (),
        duration_filter_ms: int = -1,
        *,
        timeout_ms: int | None = None,
    ) -> list[TransactionListing]:
        """Every transactional id the cluster's coordinators know, sorted by id: only
        those in one of ``state_filters`` (Kafka's names: ``Ongoing``, ``PrepareCommit``,
        ``CompleteAbort``...; none: every state), of one of ``producer_id_filters``, and
        with ``duration_filter_ms`` >= 0 only transactions open at least that long (the
        hanging ones). Needs DESCRIBE on each id listed (the others are left out).
        ``ValueError`` for a state name Kafka does not have."""
        request = pb.ListTransactionsRequest(
            state_filters=list(state_filters),
            producer_id_filters=list(producer_id_filters),
            duration_filter_ms=max(duration_filter_ms, 0),
        )

        def ask(connection: Connection, timeout: int) -> Any:
            # A broker's refusal is kept for after the round (raised then, as Kafka's
            # listing fails when a broker does), so every broker is asked and a dead one
            # is noticed (routing errors are the round's own business).
            try:
                return _grpc(connection, "ListTransactions", request, timeout)
            except ROUTING_ERRORS:
                raise
            except TidelogError as exc:
                return exc

        answers = self._connections.run_on_every_broker(
            ask, what="ListTransactions", timeout_ms=timeout_ms
        )
        for answer in answers.values():
            if isinstance(answer, TidelogError):
                raise answer
        found: dict[str, TransactionListing] = {}
        for answer in answers.values():
            if answer.unknown_state_filters:
                raise ValueError(
                    f"unknown transaction states: {list(answer.unknown_state_filters)}"
                )
            for t in answer.transactions:
                found[t.transactional_id] = TransactionListing(
                    t.transactional_id, t.producer_id, t.state, t.coordinator_id
                )
        return [found[tid] for tid in sorted(found)]

    def describe_transactions(
        self, transactional_ids: Iterable[str], *, timeout_ms: int | None = None
    ) -> dict[str, TransactionDescription]:
        """Each id's state at its coordinator: producer id and epoch, timeout, when its
        open transaction began and the partitions in it. Raises the first id's error:
        ``TransactionalIdNotFoundError``, ``TransactionalIdAuthorizationFailedError``
        (DESCRIBE on the id)."""
        out: dict[str, TransactionDescription] = {}
        for tid in dict.fromkeys(transactional_ids):
            request = pb.DescribeTransactionsRequest(transactional_ids=[tid])

            def ask(connection: Connection, timeout: int, request: Any = request) -> Any:
                return _grpc(connection, "DescribeTransactions", request, timeout)

            answer = self._connections.run(
                self._coordinator_of(tid), ask, what="DescribeTransactions", timeout_ms=timeout_ms
            )
            (described,) = answer.transactions
            if described.error_code:
                raise error_for_code(described.error_code, f"{tid!r}: {described.error_message}")
            out[tid] = TransactionDescription(
                transactional_id=described.transactional_id,
                coordinator_id=described.coordinator_id,
                state=described.state,
                producer_id=described.producer_id,
                producer_epoch=described.producer_epoch,
                transaction_timeout_ms=described.transaction_timeout_ms,
                transaction_start_time_ms=described.transaction_start_time_ms,
                partitions=tuple(
                    TopicPartition(t.topic, p) for t in described.topics for p in t.partitions
                ),
            )
        return out

    def abort_transaction(
        self, spec: AbortTransactionSpec, *, timeout_ms: int | None = None
    ) -> None:
        """Abort ``spec``'s open transaction on its partition: an ABORT marker written by
        the partition's leader (replicated before it answers), so the last stable offset
        moves past it and read_committed consumers never see its records. Raises the
        partition's error: ``InvalidProducerEpochError`` (the producer has a newer
        epoch there), ``TransactionCoordinatorFencedError`` (a newer coordinator epoch
        wrote there since), ``ClusterAuthorizationFailedError``, ``InvalidRequestError``
        for ids no producer could have. A producer with no open transaction there is
        answered as done (the marker changes nothing). A leader that moved, or that does
        not know the partition yet, is looked up and asked again until ``timeout_ms``."""
        tp = spec.partition
        request = pb.WriteTxnMarkersRequest(
            markers=[
                pb.TxnMarkerEntry(
                    producer_id=spec.producer_id,
                    producer_epoch=spec.producer_epoch,
                    commit=False,
                    coordinator_epoch=spec.coordinator_epoch,
                    partitions=[pb.TxnMarkerPartition(topic=tp.topic, partition=tp.partition)],
                )
            ],
            broker_id=-1,  # an operator's, not a coordinator's
        )

        def ask(connection: Connection, timeout: int) -> None:
            answer = _grpc(connection, "WriteTxnMarkers", request, timeout)
            for marker in answer.markers:
                for part in marker.partitions:
                    if not part.error_code:
                        continue
                    error = error_for_code(part.error_code, f"{tp}: abort of {spec}")
                    if isinstance(error, UnknownTopicOrPartitionError):
                        # The metadata named this broker the leader, so the partition
                        # exists: the broker's own view is behind (a topic created a
                        # moment ago). Kafka's AbortTransactionHandler looks the leader
                        # up again too.
                        raise LeaderNotAvailableError(
                            f"{tp}: the leader does not know the partition yet ({error})"
                        )
                    raise error

        self._connections.run(
            self._connections.route_leader(tp),
            ask,
            what=f"WriteTxnMarkers {tp}",
            timeout_ms=timeout_ms,
        )

    def _coordinator_of(self, transactional_id: str) -> Any:
        """A route to ``transactional_id``'s coordinator (asked again on every attempt:
        a routing error means it moved)."""
        connections = self._connections

        def route(timeout_ms: int) -> Connection:
            answer = _grpc(
                connections.any_broker(timeout_ms),
                "FindCoordinator",
                pb.FindCoordinatorRequest(group_id=transactional_id, key_type=1),
                timeout_ms,
            )
            found = answer.coordinator
            node = BrokerNode(found.id, found.host, found.port)
            return connections.connection_to(connections.address_of(node))

        return route
