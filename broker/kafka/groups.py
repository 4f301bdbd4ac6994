"""Group handlers: the classic protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) over
the core's ``broker.groups.classic`` (``core.groups.classic``), and ListGroups /
DescribeGroups over both kinds of group. Each handler decodes, makes one call, and encodes;
JoinGroup and SyncGroup await the parked request's future (``asyncio.wrap_future``), so a
closed connection cancels it, which the classic coordinator reads as "not waiting".

In cluster mode a classic group lives on its coordinator only (the leader of its
``__consumer_offsets`` partition, as FindCoordinator answers): JoinGroup, SyncGroup,
Heartbeat and LeaveGroup reaching another broker answer ``NOT_COORDINATOR`` (and
``COORDINATOR_NOT_AVAILABLE`` while that partition has no leader), so the members find
the coordinator again, as Kafka's do. Without it, members that found a new coordinator
and members still on the old one would form two groups each owning every partition.
While the coordinator still loads the group's offsets partition (its classic groups come
back from their metadata records, issue #27), JoinGroup, SyncGroup and LeaveGroup answer
``COORDINATOR_LOAD_IN_PROGRESS`` (clients retry) and a Heartbeat answers NONE, as Kafka's
coordinator answers a heartbeat "blindly" while loading: the member keeps its session and
its next heartbeat reaches the loaded group, instead of rejoining.

SyncGroup runs on the listener's thread pool: the leader's stores the group's metadata
record (fsync, replication) before anyone is answered.

DeleteGroups deletes a group with neither classic nor KIP-848 members, and its committed
offsets, one result per group.

ListGroups lists the groups the core lists (those this broker coordinates: classic groups
with members, Tidelog's own KIP-848 groups and groups with committed offsets only), each
once, a classic group with its protocol type and state. v5 (KIP-848's group types)
gives each group's type (``classic``, ``consumer``, ``share``) and filters on
``types_filter``; only v5 lists share groups too (protocol type ``share``), since an
older client would take them for consumer groups. DescribeGroups answers
``NOT_COORDINATOR`` (or ``COORDINATOR_LOAD_IN_PROGRESS``) off the group's coordinator, as
Kafka's does, then a classic group from its state here; any other group from the core, as
an ``Empty`` group when it has no classic members (its KIP-848 members are not shown
through this API). A former coordinator therefore never answers from the groups it held
before its offsets partition moved (``GroupManager.unload_resigned``).
"""

from __future__ import annotations

import asyncio

from tidelog.broker.core.operations import group
from tidelog.broker.groups.classic import ClassicError, JoinRequest
from tidelog.broker.kafka.authz import denied, operations_bits, refusals, visible
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_error
from tidelog.broker.kafka.listener import Connection
from tidelog.storage.errors import CoordinatorLoadInProgressError, LeaderNotAvailableError

__all__ = [
    "classic_error_code",
    "delete_groups",
    "describe_groups",
    "heartbeat",
    "join_group",
    "leave_group",
    "list_groups",
    "not_coordinator",
    "sync_group",
]


def classic_error_code(error: ClassicError) -> int:
    """Kafka's number for a classic-protocol outcome (``ClassicError`` is named after
    Kafka's errors)."""
    return NONE if error is ClassicError.NONE else error_code_for(error.value)


def _protocol_type_check(request: Plain, actual: str | None, code: int) -> int:
    given = request.get("protocol_type")
    if code == NONE and given is not None and actual is not None and given != actual:
        return error_code_for("INCONSISTENT_GROUP_PROTOCOL")
    return code


async def not_coordinator(conn: Connection, group_id: str) -> int:
    """NONE if this broker coordinates ``group_id`` (always on a single node) and has
    loaded it, else Kafka's code telling the member to find the coordinator again or to
    retry (``COORDINATOR_LOAD_IN_PROGRESS``)."""
    if conn.core.config.zookeeper_connect is None:
        return NONE  # a single node (a joining broker is not one: it coordinates nothing)
    try:
        coordinator = await conn.run(conn.core.find_coordinator, group_id)
        if coordinator.broker_id != conn.core.config.broker_id:
            return error_code_for("NOT_COORDINATOR")
        await conn.run(conn.core.check_group_loaded, group_id)
    except LeaderNotAvailableError:
        return error_code_for("COORDINATOR_NOT_AVAILABLE")
    except CoordinatorLoadInProgressError:
        return error_code_for("COORDINATOR_LOAD_IN_PROGRESS")
    except Exception as exc:
        return kafka_error(exc)[0]
    return NONE


async def join_group(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """JoinGroup (v0-7): waits for the rebalance (``ClassicGroups.join``)."""
    session_timeout_ms = int(request["session_timeout"])
    code = denied(conn, group(request["group_id"]))
    code = code or await not_coordinator(conn, request["group_id"])
    if code:
        return {"error_code": code, "generation_id": -1, "member_id": request["member_id"]}
    joined = conn.core.groups.classic.join(
        JoinRequest(
            group_id=request["group_id"],
            member_id=request["member_id"],
            group_instance_id=request.get("group_instance_id"),
            client_id=conn.context.client_id,
            client_host=conn.context.host,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=int(request.get("rebalance_timeout", session_timeout_ms)),
            protocol_type=request["protocol_type"],
            protocols=tuple((p["name"], bytes(p["metadata"])) for p in request["protocols"]),
            require_known_member_id=header.api_version >= 4,
        )
    )
    result = await asyncio.wrap_future(joined)
    return {
        "error_code": classic_error_code(result.error),
        "generation_id": result.generation_id,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name or ("" if header.api_version < 7 else None),
        "leader": result.leader,
        "member_id": result.member_id,
        "members": [
            {"member_id": m, "group_instance_id": instance, "metadata": metadata}
            for m, instance, metadata in result.members
        ],
    }


async def sync_group(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """SyncGroup (v0-5): the leader's assignments out to every member."""
    code = denied(conn, group(request["group_id"]))
    code = code or await not_coordinator(conn, request["group_id"])
    if code:
        return {"error_code": code}
    # On the thread pool: the leader's SyncGroup writes the group's metadata record.
    synced = await conn.run(
        conn.core.groups.classic.sync,
        request["group_id"],
        request["member_id"],
        request["generation_id"],
        {a["member_id"]: bytes(a["assignment"]) for a in request.get("assignments", [])},
        request.get("group_instance_id"),  # v3+ (KIP-345)
    )
    result = await asyncio.wrap_future(synced)
    code = classic_error_code(result.error)
    return {
        "error_code": _protocol_type_check(request, result.protocol_type, code),
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name,
        "assignment": result.assignment,
    }


async def heartbeat(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """Heartbeat (v0-4); NONE, unanswered by the group, while the coordinator loads it
    (module docstring)."""
    code = denied(conn, group(request["group_id"]))
    code = code or await not_coordinator(conn, request["group_id"])
    if code == error_code_for("COORDINATOR_LOAD_IN_PROGRESS"):
        return {"error_code": NONE}
    if code:
        return {"error_code": code}
    error = conn.core.groups.classic.heartbeat(
        request["group_id"],
        request["member_id"],
        request["generation_id"],
        request.get("group_instance_id"),  # v3+ (KIP-345)
    )
    return {"error_code": classic_error_code(error)}


async def leave_group(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """LeaveGroup (v0-4): one member (v0-2) or a batch (v3+, KIP-345: a static member may
    be named by its ``group_instance_id`` alone); READ on the group, as Kafka's
    ``handleLeaveGroupRequest`` asks, before anything else is answered."""
    classic = conn.core.groups.classic
    group_id = request["group_id"]
    code = denied(conn, group(group_id))
    code = code or await not_coordinator(conn, group_id)
    if code:
        return {"error_code": code, "members": []}
    if "members" not in request:
        return {"error_code": classic_error_code(classic.leave(group_id, request["member_id"]))}
    members = [
        {
            "member_id": m["member_id"],
            "group_instance_id": m.get("group_instance_id"),
            "error_code": classic_error_code(
                classic.leave(group_id, m["member_id"], m.get("group_instance_id"))
            ),
        }
        for m in request["members"]
    ]
    return {"error_code": NONE, "members": members}


async def list_groups(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """ListGroups (v0-5): classic groups and the core's groups; ``states_filter`` (v4),
    ``types_filter`` and share groups (v5)."""
    groups: dict[str, Plain] = {}
    shares = conn.core.shares if header.api_version >= 5 else None
    try:
        listed = await conn.run(conn.core.list_groups)
        typed = await conn.run(shares.list_groups) if shares is not None else []
    except Exception as exc:
        code, _ = kafka_error(exc)
        return {"error_code": code, "groups": []}
    types = {g.group_id: g.group_type for g in typed}
    for g in listed:
        state = "Stable" if g.members else "Empty"
        groups[g.group_id] = {
            "group_id": g.group_id,
            "protocol_type": "consumer",
            "group_state": state,
            "group_type": types.get(g.group_id, "consumer"),
        }
    for t in typed:
        if t.group_type == "share":
            groups[t.group_id] = {
                "group_id": t.group_id,
                "protocol_type": "share",
                "group_state": t.state,
                "group_type": "share",
            }
    for group_id, protocol_type, state in conn.core.groups.classic.list_groups():
        if group_id not in groups:
            continue  # not coordinated here (any more): the core lists every group it has
        groups[group_id] = {
            "group_id": group_id,
            "protocol_type": protocol_type,
            "group_state": state,
            "group_type": "classic",
        }
    # A listing: DESCRIBE on the cluster shows every group, else each group the caller
    # may describe; the others are left out silently, as Kafka does (no audit line).
    shown = set(visible(conn, list(groups)))
    groups = {group_id: g for group_id, g in groups.items() if group_id in shown}
    wanted = {s.lower() for s in request.get("states_filter") or []}
    kinds = {t.lower() for t in request.get("types_filter") or []}
    return {
        "error_code": NONE,
        "groups": [
            g
            for _, g in sorted(groups.items())
            if (not wanted or g["group_state"].lower() in wanted)
            and (not kinds or g["group_type"] in kinds)
        ],
    }


async def describe_groups(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """DescribeGroups (v0-5); with ``include_authorized_operations`` (v3+) each described
    group carries the caller's authorized operations on it (KIP-430)."""
    answers = []
    for group_id in request["groups"]:
        code = denied(conn, group(group_id)) or await not_coordinator(conn, group_id)
        if code:
            answers.append({"error_code": code, "group_id": group_id, "members": []})
            continue
        described = conn.core.groups.classic.describe(group_id)
        if described is not None:
            answers.append(
                {
                    "error_code": NONE,
                    "group_id": described.group_id,
                    "group_state": described.group_state,
                    "protocol_type": described.protocol_type,
                    "protocol_data": described.protocol_data,
                    "members": [
                        {
                            "member_id": m.member_id,
                            "group_instance_id": m.group_instance_id,
                            "client_id": m.client_id,
                            "client_host": m.client_host,
                            "member_metadata": m.member_metadata,
                            "member_assignment": m.member_assignment,
                        }
                        for m in described.members
                    ],
                }
            )
            continue
        try:
            await conn.run(conn.core.describe_group, group_id)
        except Exception as exc:
            code, _ = kafka_error(exc)
            if code == error_code_for("GROUP_ID_NOT_FOUND"):
                code = NONE  # Kafka answers an unknown group as Dead, without error
                answers.append(
                    {
                        "error_code": code,
                        "group_id": group_id,
                        "group_state": "Dead",
                        "protocol_type": "",
                        "protocol_data": "",
                        "members": [],
                    }
                )
                continue
            answers.append({"error_code": code, "group_id": group_id, "members": []})
            continue
        answers.append(
            {
                "error_code": NONE,
                "group_id": group_id,
                "group_state": "Empty",
                "protocol_type": "consumer",
                "protocol_data": "",
                "members": [],
            }
        )
    asked = bool(request.get("include_authorized_operations"))
    for answer in answers:
        if answer["error_code"] == NONE:
            answer["authorized_operations"] = operations_bits(
                conn, group(answer["group_id"]), asked
            )
    return {"groups": answers}


async def delete_groups(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """DeleteGroups (v0-2): one result per group, in request order, as Kafka answers it:
    ``GROUP_AUTHORIZATION_FAILED`` without DELETE on the group, ``NOT_COORDINATOR`` on a
    broker that does not coordinate it, ``NON_EMPTY_GROUP`` while it has members (classic
    or KIP-848), ``GROUP_ID_NOT_FOUND`` for a group unknown here; else it is deleted with
    its committed offsets (``GroupManager.delete_group``, the gRPC ``DeleteGroup``'s call).
    """
    ids = list(dict.fromkeys(request.get("groups_names") or []))
    decided = refusals(conn, [group(group_id) for group_id in ids])
    results = []
    for group_id in ids:
        code = decided[group(group_id)]
        if not code and not group_id:
            code = error_code_for("INVALID_GROUP_ID")  # as Kafka's validateGroupStatus
        if not code:
            try:
                await conn.run(conn.core.delete_group, group_id)
            except Exception as exc:
                code, _ = kafka_error(exc)
        results.append({"group_id": group_id, "error_code": code})
    return {"results": results}
