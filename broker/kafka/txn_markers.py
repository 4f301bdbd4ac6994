"""WriteTxnMarkers (api key 27) on the Kafka listener: a transaction coordinator's COMMIT
or ABORT markers for partitions this broker leads (issue #28, ``docs/transactions.md``).

Tidelog's own coordinators send them to each other over gRPC (``WriteTxnMarkers``,
``broker.cluster.txn_peers``); this is the same operation on Kafka's wire, as Kafka's
``kafka-transactions.sh abort`` and other brokers send it. Both listeners make the one
core call, ``BrokerCore.write_txn_markers``: each marker appended on the leader as an
``acks=all`` write and answered per partition.

Authorization: CLUSTER_ACTION on the cluster (brokers only), as Kafka's ``KafkaApis``;
a caller without it gets ``CLUSTER_AUTHORIZATION_FAILED`` for every partition and
nothing is written. Served from v1 (the flexible version; Kafka 4 removed v0, and the
codec's schemas start at v1).
"""

from __future__ import annotations

from tidelog.broker.core.operations import cluster
from tidelog.broker.kafka.authz import denied
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import kafka_code
from tidelog.broker.kafka.listener import Connection
from tidelog.broker.transactions.markers import TxnMarker

__all__ = ["write_txn_markers"]


async def write_txn_markers(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """WriteTxnMarkers v1: per marker (producer id), per topic, each partition's answer."""
    markers = [
        TxnMarker(
            m["producer_id"],
            m["producer_epoch"],
            bool(m["transaction_result"]),
            m["coordinator_epoch"],
            tuple((t["name"], p) for t in m["topics"] for p in t["partition_indexes"]),
        )
        for m in request["markers"]
    ]
    refused = denied(conn, cluster())
    if refused:
        answers = [dict.fromkeys(m.partitions, refused) for m in markers]
    else:
        written = await conn.run(conn.core.write_txn_markers, markers)
        answers = [{tp: kafka_code(code) for tp, code in found.items()} for found in written]
    results = []
    for marker, codes in zip(markers, answers, strict=True):
        by_topic: dict[str, list[Plain]] = {}
        for name, index in marker.partitions:
            by_topic.setdefault(name, []).append(
                {"partition_index": index, "error_code": codes.get((name, index), 0)}
            )
        results.append(
            {
                "producer_id": marker.producer_id,
                "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()],
            }
        )
    return {"markers": results}
