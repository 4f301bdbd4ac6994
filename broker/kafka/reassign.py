"""AlterPartitionReassignments (45) and ListPartitionReassignments (46), KIP-455.

Both run on the controller (``BrokerCore.alter_partition_reassignments``,
``list_partition_reassignments``; the controller's algorithm is in
``broker.cluster.reassignment``). Alter needs ALTER on the cluster, List DESCRIBE on it;
refused, the answer's top-level error is ``CLUSTER_AUTHORIZATION_FAILED`` (Alter repeats it
for every named partition), as Kafka's. A broker that is not the controller answers
``NOT_CONTROLLER`` at the top: Kafka's clients send both to the controller and retry there.

Alter's per-partition errors: ``INVALID_REPLICA_ASSIGNMENT`` (an empty target, a broker
named twice, a broker that is not live), ``NO_REASSIGNMENT_IN_PROGRESS`` (a cancel, null
``replicas``, of a partition that is not moving), ``UNKNOWN_TOPIC_OR_PARTITION``. v1's
``allow_replication_factor_change`` false refuses a target of another size than the
partition's replicas with ``INVALID_REPLICATION_FACTOR`` (KIP-860). ``timeout`` is not
waited on: the answer says the reassignment started, not that it finished (Kafka's too).
"""

from __future__ import annotations

from collections.abc import Sequence

from tidelog.broker.core.operations import cluster as the_cluster
from tidelog.broker.kafka.authz import denied
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_code, kafka_error
from tidelog.broker.kafka.listener import Connection

__all__ = ["alter_partition_reassignments", "list_partition_reassignments"]


async def alter_partition_reassignments(
    conn: Connection, header: RequestHeader, request: Plain
) -> Plain:
    """AlterPartitionReassignments (v0-1): see the module docstring."""
    wanted: dict[tuple[str, int], Sequence[int] | None] = {}
    for t in request["topics"]:
        for p in t["partitions"]:
            replicas = p.get("replicas")
            wanted[(t["name"], p["partition_index"])] = (
                None if replicas is None else [int(r) for r in replicas]
            )

    def answer(
        top: int, message: str | None, results: dict[tuple[str, int], tuple[int, str | None]]
    ) -> Plain:
        by_topic: dict[str, list[Plain]] = {}
        for (name, partition), (code, text) in results.items():
            by_topic.setdefault(name, []).append(
                {"partition_index": partition, "error_code": code, "error_message": text}
            )
        return {
            "error_code": top,
            "error_message": message,
            "responses": [{"name": n, "partitions": parts} for n, parts in by_topic.items()],
        }

    refused = denied(conn, the_cluster())
    if refused:
        return answer(refused, None, dict.fromkeys(wanted, (refused, None)))
    results: dict[tuple[str, int], tuple[int, str | None]] = {}
    if not request.get("allow_replication_factor_change", True):
        # KIP-860: the caller asked that no partition change its replication factor.
        try:
            current = await conn.run(conn.core.metadata, sorted({t for t, _ in wanted}), False)
        except Exception as exc:
            code, message = kafka_error(exc)
            return answer(code, message, {})
        factors = {
            (t.name, index): len(p.replicas)
            for t in current[1]
            for index, p in enumerate(t.partitions)
        }
        for key, target in list(wanted.items()):
            if target is not None and key in factors and len(target) != factors[key]:
                results[key] = (
                    error_code_for("INVALID_REPLICATION_FACTOR"),
                    f"{key[0]}-{key[1]} has {factors[key]} replicas; the target has "
                    f"{len(target)} and allow_replication_factor_change is false",
                )
                del wanted[key]
    try:
        found = await conn.run(conn.core.alter_partition_reassignments, wanted)
    except Exception as exc:
        top, message = kafka_error(exc)
        return answer(top, message, {})
    for key, name in found.items():
        results[key] = (kafka_code(name), name or None)
    return answer(NONE, None, results)


async def list_partition_reassignments(
    conn: Connection, header: RequestHeader, request: Plain
) -> Plain:
    """ListPartitionReassignments (v0): see the module docstring."""
    refused = denied(conn, the_cluster())
    if refused:
        return {"error_code": refused, "error_message": None, "topics": []}
    named = request.get("topics")
    wanted = (
        None if named is None else [(t["name"], p) for t in named for p in t["partition_indexes"]]
    )
    try:
        found = await conn.run(conn.core.list_partition_reassignments, wanted)
    except Exception as exc:
        code, message = kafka_error(exc)
        return {"error_code": code, "error_message": message, "topics": []}
    by_topic: dict[str, list[Plain]] = {}
    for (name, partition), (replicas, adding, removing) in sorted(found.items()):
        by_topic.setdefault(name, []).append(
            {
                "partition_index": partition,
                "replicas": list(replicas),
                "adding_replicas": list(adding),
                "removing_replicas": list(removing),
            }
        )
    return {
        "error_code": NONE,
        "error_message": None,
        "topics": [{"name": n, "partitions": parts} for n, parts in by_topic.items()],
    }
