"""Admin APIs over the core: DescribeConfigs, DescribeCluster, DescribeLogDirs,
ElectLeaders and DeleteRecords.

DescribeConfigs answers a topic with every effective config key (Kafka's tools and test
suites expect all of them, not only overrides): ``DYNAMIC_TOPIC_CONFIG`` (1) for the
topic's overrides, ``DEFAULT_CONFIG`` (5) for the rest; a broker (resource type 4) with the
broker's effective settings as ``STATIC_BROKER_CONFIG`` (4), values of keys that name a
password or secret hidden (``is_sensitive``). Synonyms and documentation are not given.

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
``delete_records``, the gRPC call's: per partition the low watermark, or
``OFFSET_OUT_OF_RANGE`` (above the high watermark, below -1), ``UNKNOWN_TOPIC_OR_PARTITION``,
``NOT_LEADER_OR_FOLLOWER``, ``REQUEST_TIMED_OUT`` (the followers did not follow within the
request's ``timeout_ms``).
"""

from __future__ import annotations

from tidelog.broker.core.offsets import RecordsToDelete
from tidelog.broker.core.operations import cluster as the_cluster
from tidelog.broker.core.operations import topic
from tidelog.broker.kafka.authz import denied, operations_bits, refusals
from tidelog.broker.kafka.cluster import broker_entries
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_code, kafka_error
from tidelog.broker.kafka.listener import Connection
from tidelog.storage.errors import InvalidRequestError

__all__ = [
    "delete_records",
    "describe_cluster",
    "describe_configs",
    "describe_log_dirs",
    "elect_leaders",
]

TOPIC = 2
BROKER = 4
_DYNAMIC_TOPIC_CONFIG = 1
_STATIC_BROKER_CONFIG = 4
_DEFAULT_CONFIG = 5


def _config(name: str, value: str | None, source: int, sensitive: bool = False) -> Plain:
    return {
        "name": name,
        "value": None if sensitive else value,
        "read_only": source == _STATIC_BROKER_CONFIG,
        "config_source": source,
        "is_sensitive": sensitive,
        "synonyms": [],
        "config_type": 0,
        "documentation": None,
    }


async def describe_configs(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """DescribeConfigs (v1-4): topics and this broker."""
    results = []
    for resource in request["resources"]:
        kind = resource["resource_type"]
        name = resource["resource_name"]
        wanted = resource.get("configuration_keys")
        result: Plain = {"resource_type": kind, "resource_name": name, "error_code": NONE}
        code = denied(conn, topic(name) if kind == TOPIC else the_cluster())
        if code:
            result.update(error_code=code, configs=[])
            results.append(result)
            continue
        try:
            configs = await conn.run(_configs, conn, kind, name)
        except Exception as exc:
            code, message = kafka_error(exc)
            result.update(error_code=code, error_message=message, configs=[])
        else:
            if configs is None:
                result.update(
                    error_code=error_code_for("INVALID_REQUEST"),
                    error_message=f"resource type {kind} is not described here",
                    configs=[],
                )
            else:
                result["configs"] = [c for c in configs if wanted is None or c["name"] in wanted]
        results.append(result)
    return {"results": results}


def _configs(conn: Connection, kind: int, name: str) -> list[Plain] | None:
    core = conn.core
    if kind == TOPIC:
        view = core.describe_topic(name)
        overrides = core.logs.topic(name).overrides
        return [
            _config(k, v, _DYNAMIC_TOPIC_CONFIG if k in overrides else _DEFAULT_CONFIG)
            for k, v in sorted(view.config.items())
        ]
    if kind == BROKER:
        if name not in ("", str(core.config.broker_id)):
            raise InvalidRequestError(f"broker {name!r} is not this broker")
        secret = ("password", "secret", "key")
        return [
            _config(k, v, _STATIC_BROKER_CONFIG, any(s in k for s in secret))
            for k, v in sorted(core.config.to_mapping().items())
        ]
    return None


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
        "brokers": broker_entries(conn.kafka_brokers(), "broker_id"),
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
    answers = await conn.run(conn.core.delete_records, wanted, timeout_ms) if wanted else []
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
