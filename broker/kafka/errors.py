"""Tidelog's error codes rendered as Kafka's numeric error codes, in one table: the Kafka
listener's half of the error contract (``broker.core.errors.classify`` decides the code and the
safe message, listener-neutrally; ``broker.grpc.errors`` is the gRPC listener's half).

The core reports errors as stable strings (``storage.errors``, ``broker.core.errors``); most
are Kafka's own names already (``UNKNOWN_TOPIC_OR_PARTITION``, ``NOT_COORDINATOR``...),
so the number is kio's ``ErrorCode`` of the same name. The few Tidelog-only codes are
mapped in ``_ALIASES``; anything else is ``UNKNOWN_SERVER_ERROR`` (-1), which clients do
not retry.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from tidelog.broker.core.errors import Outcome, classify
from tidelog.storage.errors import InternalError

__all__ = ["NONE", "error_code_for", "error_name", "kafka_code", "kafka_error", "render"]

NONE = 0

# Tidelog code -> Kafka name, where the names differ.
_ALIASES = {
    "LOG_DIR_FULL": "KAFKA_STORAGE_ERROR",
    "GROUP_ERROR": "UNKNOWN_SERVER_ERROR",
    "NOT_AUTHORIZED": "CLUSTER_AUTHORIZATION_FAILED",
    "REQUEST_TOO_LARGE": "MESSAGE_TOO_LARGE",
    "BROKER_BUSY": "THROTTLING_QUOTA_EXCEEDED",
    "QUEUED_MAX_REQUESTS_REACHED": "THROTTLING_QUOTA_EXCEEDED",
    "QUEUED_MAX_REQUEST_BYTES_REACHED": "THROTTLING_QUOTA_EXCEEDED",
    "MAX_CONNECTIONS_REACHED": "THROTTLING_QUOTA_EXCEEDED",
    "MAX_CONNECTIONS_PER_IP_REACHED": "THROTTLING_QUOTA_EXCEEDED",
    "SASL_SESSION_EXPIRED": "SASL_AUTHENTICATION_FAILED",
    "BROKER_UNAVAILABLE": "BROKER_NOT_AVAILABLE",
    "CLOSED": "BROKER_NOT_AVAILABLE",
    "INTERNAL": "UNKNOWN_SERVER_ERROR",
    "TRANSACTION_ERROR": "UNKNOWN_SERVER_ERROR",
}


def kafka_code(code: str) -> int:
    """Kafka's number for a Tidelog error code string ("" is 0, no error)."""
    if not code:
        return NONE
    name = _ALIASES.get(code, code).lower()
    try:
        return int(ErrorCode[name])
    except KeyError:
        return int(ErrorCode.unknown_server_error)


def render(outcome: Outcome) -> tuple[int, str]:
    """(Kafka error number, message) for a classified error (no code: the broker stops,
    ``INTERNAL``'s number, as before the classification was neutral)."""
    return kafka_code(outcome.code or InternalError.code), outcome.message


def kafka_error(exc: BaseException) -> tuple[int, str]:
    """(Kafka error number, message) for an exception the core raised."""
    return render(classify(exc))


def error_code_for(name: str) -> int:
    """Kafka's number for one of its error names (``"INVALID_REQUEST"``)."""
    return int(ErrorCode[name.lower()])


def error_name(number: int) -> str:
    """Kafka's name of an error number (``29`` -> ``"TOPIC_AUTHORIZATION_FAILED"``); ``OK``
    for 0, ``UNKNOWN_SERVER_ERROR`` for a number Kafka does not define."""
    if number == NONE:
        return "OK"
    try:
        return ErrorCode(number).name.upper()
    except ValueError:
        return "UNKNOWN_SERVER_ERROR"
