"""Config and cluster admin APIs over the core: DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs, DescribeCluster, DescribeLogDirs, ElectLeaders and DeleteRecords.

The configs are ``broker.core.configs``'s and a group's ``broker.core.group_configs``'
(listener-neutral); this module decodes, asks the policy table per resource
(``ALTER_CONFIGS`` / ``DESCRIBE_CONFIGS`` on the topic, on the cluster for a broker
resource, on the group for a GROUP one (32, Kafka 4.x): refused ones answer
``TOPIC_AUTHORIZATION_FAILED`` / ``CLUSTER_AUTHORIZATION_FAILED`` /
``GROUP_AUTHORIZATION_FAILED``, the others are served), calls the core once per
resource and encodes. DescribeConfigs answers every effective key with its source,
synonyms when asked (``include_synonyms``), one line of documentation when asked
(``include_documentation``, v3+) and its type (v3+); a sensitive broker value (a key
naming a password, secret or key) is null. A resource type other than topic (2), broker
(4) or group (32) is ``INVALID_REQUEST``; a resource named twice in one alter request too, as Kafka.

DescribeLogDirs (v1-4): this broker's one data directory (``BrokerCore.describe_log_dirs``),
with each partition asked for (``topics`` null: every one) that has a copy here, its size
and how far its log end is behind the high watermark; the file system's total and usable
bytes (v4). DESCRIBE on the cluster: refused, the answer lists no directory and (v3+)
carries ``CLUSTER_AUTHORIZATION_FAILED``, as Kafka's.

ElectLeaders (v0-2, KIP-460): preferred (``election_type`` 0, v0's only kind) or unclean
(1) elections on the controller (``BrokerCore.elect_leaders``), ALTER on the cluster.
Per partition ``ELECTION_NOT_NEEDED``, ``PREFERRED_LEADER_NOT_AVAILABLE``,
``ELIGIBLE_LEADERS_NOT_AVAILABLE``, ``UNKNOWN_TOPIC_OR_PARTITION``; ``topic_partitions``
null asks for every partition and the answer lists only those that needed an election. A
broker that is not the controller answers ``NOT_CONTROLLER`` (for each named partition
and, v1+, as the top-level error): Kafka's clients send ElectLeaders to the controller.

DeleteRecords (v0-2, KIP-107): DELETE on each topic (a refused topic answers
``TOPIC_AUTHORIZATION_FAILED`` per partition, the others are served), then the core's
``start_delete_records``, the gRPC call's without its blocking wait (the answer comes
from the core's purgatory through the pipeline's bridge: no thread waits for the
followers): per partition the low watermark, or
``OFFSET_OUT_OF_RANGE`` (above the high watermark, below -1), ``UNKNOWN_TOPIC_OR_PARTITION``,
``NOT_LEADER_OR_FOLLOWER``, ``REQUEST_TIMED_OUT`` (the followers did not follow within the
request's ``timeout_ms``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence

from tidelog.broker.core.config_keys import ConfigEntry
from tidelog.broker.core.configs import AlterOp, ConfigChange, ResourceKind
from tidelog.broker.core.offsets import RecordsDeleted, RecordsToDelete
from tidelog.broker.core.operations import Resource, group, topic
from tidelog.broker.core.operations import cluster as the_cluster
from tidelog.broker.kafka.authz import denied, operations_bits, refusals
from tidelog.broker.kafka.cluster import broker_entries
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_code, kafka_error
from tidelog.broker.kafka.listener import Connection

__all__ = [
    "alter_configs",
    "delete_records",
    "describe_cluster",
    "describe_configs",
    "describe_log_dirs",
    "elect_leaders",
    "incremental_alter_configs",
]

_KINDS = {int(k): k for k in ResourceKind}


def _resource(kind: int, name: str) -> Resource:
    if kind == ResourceKind.GROUP:
        return group(name)
    return topic(name) if kind == ResourceKind.TOPIC else the_cluster()


def _entry(entry: ConfigEntry, synonyms: bool, documentation: bool) -> Plain:
    return {
        "name": entry.name,
        "value": entry.value,
        "read_only": entry.read_only,
        "config_source": int(entry.source),
        "is_sensitive": entry.sensitive,
        "synonyms": [
            {"name": s.name, "value": None if entry.sensitive else s.value, "source": int(s.source)}
            for s in entry.synonyms
        ]
        if synonyms
        else [],
        "config_type": int(entry.config_type),
        "documentation": entry.documentation if documentation else None,
    }


def _unknown_kind(kind: int) -> tuple[int, str]:
    return (
        error_code_for("INVALID_REQUEST"),
        f"resource type {kind} has no configs here (2: topic, 4: broker, 32: group)",
    )


def _allowed(conn: Connection, resources: Sequence[Plain]) -> dict[Resource, int]:
    named = [
        _resource(r["resource_type"], r["resource_name"])
        for r in resources
        if r["resource_type"] in _KINDS
    ]
    return refusals(conn, named) if named else {}


async def describe_configs(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """DescribeConfigs (v1-4): topics and brokers (this one, or ``""``: the cluster-wide
    dynamic defaults)."""
    synonyms = bool(request.get("include_synonyms", False))
    documentation = bool(request.get("include_documentation", False))
    decided = _allowed(conn, request["resources"])
    results = []
    for resource in request["resources"]:
        kind = resource["resource_type"]
        name = resource["resource_name"]
        wanted = resource.get("configuration_keys")
        result: Plain = {"resource_type": kind, "resource_name": name, "configs": []}
        if kind not in _KINDS:
            code, message = _unknown_kind(kind)
            result.update(error_code=code, error_message=message)
        elif code := decided[_resource(kind, name)]:
            result.update(error_code=code)
        else:
            try:
                entries = await conn.run(conn.core.describe_configs, _KINDS[kind], name, wanted)
            except Exception as exc:
                code, message = kafka_error(exc)
                result.update(error_code=code, error_message=message)
            else:
                result.update(
                    error_code=NONE,
                    configs=[_entry(e, synonyms, documentation) for e in entries],
                )
        results.append(result)
    return {"results": results}


async def alter_configs(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """AlterConfigs (v0-2): replace a resource's dynamic configs with those given."""
    return await _alter(conn, request, incremental=False)


async def incremental_alter_configs(
    conn: Connection, header: RequestHeader, request: Plain
) -> Plain:
    """IncrementalAlterConfigs (v0-1): SET, DELETE, APPEND, SUBTRACT per key."""
    return await _alter(conn, request, incremental=True)


async def _alter(conn: Connection, request: Plain, *, incremental: bool) -> Plain:
    validate_only = bool(request.get("validate_only", False))
    resources = request["resources"]
    decided = _allowed(conn, resources)
    seen: dict[tuple[int, str], int] = {}
    for r in resources:
        key = (r["resource_type"], r["resource_name"])
        seen[key] = seen.get(key, 0) + 1
    responses = []
    for resource in resources:
        kind = resource["resource_type"]
        name = resource["resource_name"]
        answer: Plain = {"resource_type": kind, "resource_name": name, "error_code": NONE}
        responses.append(answer)
        if kind not in _KINDS:
            code, message = _unknown_kind(kind)
            answer.update(error_code=code, error_message=message)
            continue
        if code := decided[_resource(kind, name)]:
            answer.update(error_code=code)
            continue
        if seen[(kind, name)] > 1:
            answer.update(
                error_code=error_code_for("INVALID_REQUEST"),
                error_message=f"resource {name!r} (type {kind}) is named more than once",
            )
            continue
        try:
            changes = [
                ConfigChange(
                    c["name"],
                    AlterOp(c["config_operation"]) if incremental else AlterOp.SET,
                    c.get("value"),
                )
                for c in resource["configs"]
            ]
        except ValueError:
            answer.update(
                error_code=error_code_for("INVALID_REQUEST"),
                error_message="config_operation must be 0 (SET), 1 (DELETE), 2 (APPEND) "
                "or 3 (SUBTRACT)",
            )
            continue
        try:
            await conn.run(
                functools.partial(
                    conn.core.alter_configs,
                    _KINDS[kind],
                    name,
                    changes,
                    incremental=incremental,
                    validate_only=validate_only,
                )
            )
        except Exception as exc:
            code, message = kafka_error(exc)
            answer.update(error_code=code, error_message=message)
    return {"responses": responses}


async def describe_cluster(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """DescribeCluster (v0-1): every live broker's Kafka endpoint (those with a Kafka
    listener, as Metadata lists them), the controller, and the caller's authorized
    operations on the cluster when asked (KIP-430)."""
    cluster, _ = await conn.run(conn.core.metadata, [], False)
    return {
        "error_code": NONE,
        "endpoint_type": 1,
        "cluster_id": cluster.cluster_id,
        "controller_id": cluster.controller_id,
        "brokers": broker_entries(conn.kafka_brokers(), "broker_id", conn.kafka_racks()),
        "cluster_authorized_operations": operations_bits(
            conn,
            the_cluster(),
            bool(request.get("include_cluster_authorized_operations")),
        ),
    }


_PREFERRED, _UNCLEAN = 0, 1


async def elect_leaders(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """ElectLeaders (v0-2): see the module docstring."""
    election_type = request.get("election_type", _PREFERRED)
    named = request.get("topic_partitions")
    wanted = (
        None
        if named is None
        else [(t["topic"], p) for t in named for p in dict.fromkeys(t["partitions"])]
    )

    def answer(top: int, results: dict[tuple[str, int], tuple[int, str | None]]) -> Plain:
        by_topic: dict[str, list[Plain]] = {}
        for (name, partition), (code, message) in results.items():
            by_topic.setdefault(name, []).append(
                {"partition_id": partition, "error_code": code, "error_message": message}
            )
        return {
            "error_code": top,
            "replica_election_results": [
                {"topic": name, "partition_result": parts} for name, parts in by_topic.items()
            ],
        }

    def every(code: int, message: str | None) -> Plain:
        return answer(code, dict.fromkeys(wanted or (), (code, message)))

    if election_type not in (_PREFERRED, _UNCLEAN):
        return every(error_code_for("INVALID_REQUEST"), f"unknown election type {election_type}")
    refused = denied(conn, the_cluster())
    if refused:
        return every(refused, None)
    try:
        results = await conn.run(conn.core.elect_leaders, election_type == _UNCLEAN, wanted)
    except Exception as exc:
        code, message = kafka_error(exc)
        return every(code, message)
    return answer(NONE, {key: (kafka_code(code), code or None) for key, code in results.items()})


async def describe_log_dirs(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """DescribeLogDirs (v1-4): see the module docstring."""
    refused = denied(conn, the_cluster())
    if refused:
        return {"error_code": refused, "results": []}
    named = request.get("topics")
    wanted = None if named is None else [(t["topic"], p) for t in named for p in t["partitions"]]
    found = await conn.run(conn.core.describe_log_dirs, wanted)
    by_topic: dict[str, list[Plain]] = {}
    for p in found.partitions:
        by_topic.setdefault(p.topic, []).append(
            {
                "partition_index": p.partition,
                "partition_size": p.size_bytes,
                "offset_lag": p.offset_lag,
                "is_future_key": False,
            }
        )
    return {
        "error_code": NONE,
        "results": [
            {
                "error_code": kafka_code(found.error_code),
                "log_dir": found.path,
                "topics": [{"name": n, "partitions": parts} for n, parts in by_topic.items()],
                "total_bytes": found.total_bytes,
                "usable_bytes": found.usable_bytes,
            }
        ],
    }


async def delete_records(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """DeleteRecords (v0-2): see the module docstring."""
    decided = refusals(conn, [topic(t["name"]) for t in request["topics"]])
    refused = {resource.name: code for resource, code in decided.items() if code}
    wanted = [
        RecordsToDelete(t["name"], p["partition_index"], p["offset"])
        for t in request["topics"]
        if t["name"] not in refused
        for p in t["partitions"]
    ]
    timeout_ms = max(request["timeout"], 0)
    answers: list[RecordsDeleted] = []
    if wanted:
        # The log starts move on the executor; the wait for the followers holds no thread
        # (the core's purgatory delivers through the pipeline's bridge).
        bridge = conn.listener.pipeline.bridge
        answered: asyncio.Future[list[RecordsDeleted]] = bridge.loop.create_future()
        deliver = bridge.resolver(answered)
        await conn.run(conn.core.start_delete_records, wanted, timeout_ms, deliver)
        answers = await answered
    by_topic: dict[str, list[Plain]] = {}
    for t in request["topics"]:
        if t["name"] in refused:
            by_topic.setdefault(t["name"], []).extend(
                {
                    "partition_index": p["partition_index"],
                    "low_watermark": -1,
                    "error_code": refused[t["name"]],
                }
                for p in t["partitions"]
            )
    for a in answers:
        by_topic.setdefault(a.topic, []).append(
            {
                "partition_index": a.partition,
                "low_watermark": a.low_watermark,
                "error_code": kafka_code(a.error_code),
            }
        )
    return {"topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()]}
