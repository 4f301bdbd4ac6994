"""Transaction calls from this broker to another (issue #28): the gRPC half of
``broker.transactions.markers.TxnPeers``.

A transaction coordinator sends ``WriteTxnMarkers`` to each partition's leader, and a
partition leader asks a transactional id's coordinator ``VerifyTxnPartition`` (KIP-890
part 1) before it appends a transactional batch. Both go over the inter-broker channel
(``InterBrokerChannels``: the TLS and principal of the replica fetchers and the
forwarded admin calls), to the broker's gRPC endpoint in this broker's view of the
cluster now (read per call: nothing is cached but the channel to an address).

Decided:

* Neither call raises. A broker that is not in the view, cannot be reached, or does not
  answer within ``CALL_TIMEOUT_MS`` is an error name for every partition asked about:
  ``NOT_LEADER_OR_FOLLOWER`` for a marker (the coordinator retries it on the leader its
  view shows next, as Kafka's marker channel re-enqueues a disconnected request) and
  ``COORDINATOR_NOT_AVAILABLE`` for a verification (the produce path answers it as
  retriable). A marker call that timed out may have been written: markers are
  idempotent, so the retry is harmless.
* An error the other broker answered as a whole (its pipeline refused the call: no
  CLUSTER_ACTION, the broker closing) is that error's name for every partition.
* One channel per destination address, kept open (a produce path that verifies every
  transactional batch must not pay a TCP and TLS handshake per batch); ``close`` closes
  them, and every call after that answers as if the other broker were unreachable (the
  broker is stopping; its coordinator's marker thread may still be finishing a round).

Thread-safe: the channel cache is guarded by one lock; gRPC channels are thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from tidelog.broker.cluster.peer_stubs import PeerStubs, answered_code
from tidelog.broker.tls import InterBrokerChannels
from tidelog.broker.transactions.markers import TxnMarker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb

__all__ = ["CALL_TIMEOUT_MS", "GrpcTxnPeers"]

log = logging.getLogger(__name__)

# Kafka's request.timeout.ms is 30 s; a marker's leader waits up to that for its in-sync
# replicas, but a stopped leader would hold the coordinator's marker thread as long, so
# the coordinator asks again sooner.
CALL_TIMEOUT_MS = 15_000
_MARKER_UNREACHABLE = "NOT_LEADER_OR_FOLLOWER"
_COORDINATOR_UNREACHABLE = "COORDINATOR_NOT_AVAILABLE"

TopicPartition = tuple[str, int]


class GrpcTxnPeers:
    """``TxnPeers`` over gRPC (module docstring). Thread-safe; ``close`` once."""

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

    def write_txn_markers(
        self, broker_id: int, markers: Sequence[TxnMarker]
    ) -> list[dict[TopicPartition, str]]:
        request = pb.WriteTxnMarkersRequest(
            broker_id=self._broker_id,
            markers=[
                pb.TxnMarkerEntry(
                    producer_id=m.producer_id,
                    producer_epoch=m.producer_epoch,
                    commit=m.commit,
                    coordinator_epoch=m.coordinator_epoch,
                    partitions=[
                        pb.TxnMarkerPartition(topic=t, partition=p) for t, p in m.partitions
                    ],
                )
                for m in markers
            ],
        )

        def failed(code: str) -> list[dict[TopicPartition, str]]:
            return [dict.fromkeys(m.partitions, code) for m in markers]

        stub = self._stub(broker_id)
        if stub is None:
            return failed(_MARKER_UNREACHABLE)
        try:
            answer = stub.WriteTxnMarkers(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            code = answered_code(exc) or _MARKER_UNREACHABLE
            log.info("WriteTxnMarkers to broker %d failed: %s", broker_id, _describe(exc))
            return failed(code)
        except ValueError:  # the channel was closed under the call (the broker stops)
            return failed(_MARKER_UNREACHABLE)
        out: list[dict[TopicPartition, str]] = []
        for entry in answer.markers:
            out.append({(p.topic, p.partition): p.error_code for p in entry.partitions})
        return out if len(out) == len(markers) else failed(_MARKER_UNREACHABLE)

    def verify_txn_partition(
        self,
        broker_id: int,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        tp: TopicPartition,
        *,
        add: bool = False,
    ) -> str:
        stub = self._stub(broker_id)
        if stub is None:
            return _COORDINATOR_UNREACHABLE
        request = pb.VerifyTxnPartitionRequest(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            topic=tp[0],
            partition=tp[1],
            broker_id=self._broker_id,
            add=add,
        )
        try:
            answer = stub.VerifyTxnPartition(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            log.info("VerifyTxnPartition at broker %d failed: %s", broker_id, _describe(exc))
            return answered_code(exc) or _COORDINATOR_UNREACHABLE
        except ValueError:  # the channel was closed under the call (the broker stops)
            return _COORDINATOR_UNREACHABLE
        return str(answer.error_code)

    def close(self) -> None:
        self._stubs.close()


def _describe(exc: grpc.RpcError) -> str:
    failed: Any = exc
    if hasattr(failed, "code") and hasattr(failed, "details"):
        return f"{failed.code()}: {failed.details()}"
    return repr(exc)
