"""A share group's dead-letter transaction's calls to other brokers (issue #32 step 5 in
a cluster, ``broker.core.share_dlq``): InitProducerId / AddPartitionsToTxn / EndTxn at
the transactional id's coordinator and the copies' Produce at the dead-letter
partition's leader, when those are other brokers.

Decided:

* **The clients' own calls** (``InitTransactions``, ``AddPartitionsToTxn``, ``EndTxn``,
  ``Produce`` with the transactional id), sent as a transactional producer sends them,
  over the inter-broker channel (``InterBrokerChannels``: the TLS and principal of the
  replica fetchers, ``txn_peers`` and ``share_peers``). No new inter-broker API: the
  coordinator and the leader serve these exactly as a client's, with their checks
  (fencing, KIP-890 verification of the copies' partition, ``acks=all``). Under an
  authorizer the inter-broker user is authorized as any caller: it needs WRITE on the
  ``__tidelog.dlq:`` transactional ids and on the dead-letter topics (a super user, as
  Kafka's brokers usually are, has both).
* Why not Tidelog's client ``Producer`` inside the broker: the archiving's
  ``__share_group_state`` partition must join the transaction without a produce to it
  (the write goes to the share coordinator as WriteShareGroupState), which the
  ``Producer`` cannot do; and it would bring a second metadata cache, its threads and a
  bootstrap list into the broker for four calls.
* Every call raises: an error the other broker answered as itself (``error_for_code``:
  ``NOT_COORDINATOR``, ``CONCURRENT_TRANSACTIONS``, ``PRODUCER_FENCED``...); a broker not
  in the view, unreachable or not answering within ``CALL_TIMEOUT_MS`` as
  ``CoordinatorNotAvailableError`` (the transaction calls) or
  ``NotLeaderOrFollowerError`` (the produce). The caller aborts and retries the whole
  transaction later (or, for EndTxn(commit), asks again: ``CoreDeadLetters``).
* One channel per destination address, kept open (``PeerStubs``); ``close`` closes them.

Thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from tidelog.broker.cluster.peer_stubs import PeerStubs, answered_code
from tidelog.broker.tls import InterBrokerChannels
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import (
    CoordinatorNotAvailableError,
    NotLeaderOrFollowerError,
    TidelogError,
    error_for_code,
)

__all__ = ["CALL_TIMEOUT_MS", "GrpcDeadLetterPeers"]

log = logging.getLogger(__name__)

# As txn_peers: below Kafka's request.timeout.ms, so a stuck broker fails the attempt
# (aborted, retried by the dead-letter pass) rather than hold the share partition long.
CALL_TIMEOUT_MS = 15_000

TopicPartition = tuple[str, int]


class GrpcDeadLetterPeers:
    """The dead-letter transaction's calls to other brokers (module docstring)."""

    def __init__(
        self,
        channels: InterBrokerChannels,
        address_of: Callable[[int], str | None],
        timeout_ms: int = CALL_TIMEOUT_MS,
    ) -> None:
        self._timeout_s = timeout_ms / 1000
        self._stubs = PeerStubs(channels, address_of)

    def init_producer_id(
        self, broker_id: int, transactional_id: str, timeout_ms: int
    ) -> tuple[int, int]:
        request = pb.InitTransactionsRequest(
            transactional_id=transactional_id, transaction_timeout_ms=timeout_ms
        )
        answer = self._call(broker_id, "InitTransactions", request, CoordinatorNotAvailableError)
        return answer.producer_id, answer.producer_epoch

    def add_partitions(
        self,
        broker_id: int,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        partitions: Sequence[TopicPartition],
    ) -> None:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        request = pb.AddPartitionsToTxnRequest(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=epoch,
            partitions=[pb.TopicPartitions(topic=t, partitions=p) for t, p in by_topic.items()],
        )
        self._call(broker_id, "AddPartitionsToTxn", request, CoordinatorNotAvailableError)

    def end_transaction(
        self, broker_id: int, transactional_id: str, producer_id: int, epoch: int, commit: bool
    ) -> None:
        request = pb.EndTxnRequest(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=epoch,
            commit=commit,
        )
        self._call(broker_id, "EndTxn", request, CoordinatorNotAvailableError)

    def produce(
        self, broker_id: int, transactional_id: str, target: TopicPartition, data: bytes
    ) -> None:
        """``data`` (transactional batches) appended to ``target`` at its leader,
        ``acks=all``."""
        request = pb.ProduceRequest(
            acks=-1,
            timeout_ms=int(self._timeout_s * 1000),
            transactional_id=transactional_id,
            topics=[
                pb.ProduceTopicData(
                    topic=target[0],
                    partitions=[pb.ProducePartitionData(partition=target[1], records=data)],
                )
            ],
        )
        answer = self._call(broker_id, "Produce", request, NotLeaderOrFollowerError)
        for result in answer.results:
            if result.error_code:
                raise error_for_code(result.error_code, result.error_message)

    def close(self) -> None:
        self._stubs.close()

    def _call(
        self, broker_id: int, method: str, request: Any, unreachable: type[TidelogError]
    ) -> Any:
        stub = self._stubs.stub(broker_id)
        if stub is None:
            raise unreachable(f"broker {broker_id} is not in this broker's view")
        try:
            return getattr(stub, method)(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            failed: Any = exc  # failed calls are both RpcError and Call
            details = str(failed.details()) if hasattr(failed, "details") else repr(exc)
            code = answered_code(exc)
            if code is not None:
                raise error_for_code(code, details) from None
            log.info("%s at broker %d failed: %s", method, broker_id, details)
            raise unreachable(f"{method} at broker {broker_id}: {details}") from None
        except ValueError:  # the channel was closed under the call (the broker stops)
            raise unreachable("this broker is stopping") from None
