"""Kafka's SCRAM user APIs (KIP-554): DescribeUserScramCredentials (50) and
AlterUserScramCredentials (51), v0, over ``core.user_admin`` (``broker.core.user_admin``,
the same core call as gRPC's ``UpsertUser``/``DeleteUser``/``ListUsers``, where Kafka's
per-user rules live).

Decode, authorize DESCRIBE (50) or ALTER (51) on the cluster through ``authz.denied`` (the
policy table's ``describe_users`` / ``alter_users``: one audit line when refused), one core
call through ``conn.run``, encode. Refused: Describe answers the top-level
``CLUSTER_AUTHORIZATION_FAILED`` with no results, Alter gives it to every user named, as
Kafka does. Mechanisms travel as Kafka's numbers (1 SCRAM-SHA-256, 2 SCRAM-SHA-512); an
unknown number is kept as ``UNKNOWN(n)`` for the core to refuse with
``UNSUPPORTED_SASL_MECHANISM``.
"""

from __future__ import annotations

from tidelog.broker.core.operations import cluster
from tidelog.broker.core.user_admin import MECHANISM_NUMBERS, UserChange
from tidelog.broker.kafka.authz import denied
from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_code, kafka_error
from tidelog.broker.kafka.listener import Connection

__all__ = ["alter_user_scram_credentials", "describe_user_scram_credentials"]

_BY_NUMBER = {number: name for name, number in MECHANISM_NUMBERS.items()}
_SECURITY_DISABLED = "this broker has no SCRAM user store"


def _mechanism(number: int) -> str:
    return _BY_NUMBER.get(number, f"UNKNOWN({number})")


async def describe_user_scram_credentials(
    conn: Connection, header: RequestHeader, request: Plain
) -> Plain:
    """DescribeUserScramCredentials (v0): see the module docstring."""
    refused = denied(conn, cluster())
    if refused:
        # As Kafka answers it (no message, no results). confluent-kafka 2.16.1 (librdkafka
        # 2.16.0) crashes its own process on any top-level error here, with or without a
        # message: tests ask with raw requests.
        return {"error_code": refused, "error_message": None, "results": []}
    admin = conn.core.user_admin
    if admin is None:
        return {
            "error_code": error_code_for("SECURITY_DISABLED"),
            "error_message": _SECURITY_DISABLED,
            "results": [],
        }
    named = request.get("users")
    names = None if named is None else [u["name"] for u in named]
    try:
        found = await conn.run(admin.describe, names)
    except Exception as exc:
        code, message = kafka_error(exc)
        return {"error_code": code, "error_message": message, "results": []}
    return {
        "error_code": NONE,
        "error_message": None,
        "results": [
            {
                "user": d.name,
                "error_code": kafka_code(d.error),
                "error_message": d.message,
                "credential_infos": [
                    {"mechanism": MECHANISM_NUMBERS[m], "iterations": n}
                    for m, n in d.iterations.items()
                ],
            }
            for d in found
        ],
    }


async def alter_user_scram_credentials(
    conn: Connection, header: RequestHeader, request: Plain
) -> Plain:
    """AlterUserScramCredentials (v0): see the module docstring."""
    changes = [
        UserChange(d["name"], _mechanism(d["mechanism"])) for d in request.get("deletions") or []
    ] + [
        UserChange(
            u["name"],
            _mechanism(u["mechanism"]),
            u["iterations"],
            u["salt"],
            u["salted_password"],
        )
        for u in request.get("upsertions") or []
    ]
    users = list(dict.fromkeys(c.name for c in changes))

    def every(code: int, message: str | None) -> Plain:
        return {
            "results": [{"user": u, "error_code": code, "error_message": message} for u in users]
        }

    refused = denied(conn, cluster())
    if refused:
        return every(refused, None)
    admin = conn.core.user_admin
    if admin is None:
        return every(error_code_for("SECURITY_DISABLED"), _SECURITY_DISABLED)
    try:
        results = await conn.run(admin.alter, changes, conn.context)
    except Exception as exc:
        return every(*kafka_error(exc))
    return {
        "results": [
            {"user": user, "error_code": kafka_code(code), "error_message": message}
            for user, (code, message) in results.items()
        ]
    }
