"""The one table from Tidelog errors to gRPC status codes, and the helpers that apply it.

A call that fails as a whole ends with the gRPC status from ``STATUS_BY_ERROR`` and the
error's stable ``code`` string in the trailing metadata key ``tidelog-error-code``; the client
rebuilds the exact exception class from it (``storage.errors.error_for_code``). Errors of one
partition inside an answer carry the same code strings in ``error_code``
(``partition_error``).

What a client sees of an error:

- request errors (``RequestError`` and below): the code and the error's message, which
  describes the request, never the broker's internals;
- storage faults (``StorageError``): the code and a fixed message; the detail goes to the
  broker's log only;
- anything else (a bug): ``INTERNAL`` with the code ``INTERNAL`` and no detail; logged with
  its traceback.

A broker that is shutting down answers new calls ``UNAVAILABLE`` without the metadata key
(``ShuttingDownError``), exactly what a client sees when the broker is gone, so clients
treat both the same way (retriable ``BrokerUnavailableError``).

A limit reached (``BrokerBusyError``: ``max.connections``, ``max.connections.per.ip``,
``queued.max.requests``, ``queued.max.request.bytes``) is ``RESOURCE_EXHAUSTED`` with the
code naming the limit; the client rebuilds the retriable error from it.

A request larger than ``socket.request.max.bytes`` is refused by gRPC itself before any
handler runs: ``RESOURCE_EXHAUSTED`` without the metadata key. The client maps that status
without a code to ``REQUEST_TOO_LARGE``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import NoReturn

import grpc

from storage.errors import (
    BrokerBusyError,
    ClusterAuthorizationFailedError,
    CoordinatorLoadInProgressError,
    CorruptRecordError,
    FencedLeaderEpochError,
    FencedMemberEpochError,
    GroupAuthorizationFailedError,
    GroupError,
    GroupIdNotFoundError,
    GroupNotEmptyError,
    InternalError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidProducerEpochError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    LogDirFullError,
    LogTruncationError,
    MaxConnectionsError,
    MaxConnectionsPerIpError,
    NotAuthorizedError,
    NotControllerError,
    NotCoordinatorError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetNotAvailableError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    QueuedMaxRequestBytesError,
    QueuedMaxRequestsError,
    RecordTooLargeError,
    RequestError,
    RequestTooLargeError,
    ResourceNotFoundError,
    SaslAuthenticationError,
    SaslSessionExpiredError,
    SecurityDisabledError,
    StaleMemberEpochError,
    StorageError,
    TidelogError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    UnknownLeaderEpochError,
    UnknownMemberIdError,
    UnknownProducerIdError,
    UnknownTopicOrPartitionError,
    UnsupportedCompressionTypeError,
    UnsupportedSaslMechanismError,
)

__all__ = [
    "ERROR_CODE_METADATA_KEY",
    "MAX_MESSAGE_CHARS",
    "STATUS_BY_ERROR",
    "ShuttingDownError",
    "WireError",
    "abort_with",
    "partition_error",
    "to_wire",
]

log = logging.getLogger(__name__)

ERROR_CODE_METADATA_KEY = "tidelog-error-code"

_STORAGE_MESSAGE = "the broker could not read or write its log directory"
# A message quotes the request (a topic name, a config value), and travels as the
# grpc-message trailer: gRPC refuses trailers over 16 KiB on the client's side, so a
# request with a 70 KB name would be answered "received metadata size exceeds hard
# limit" instead of its error. Messages are cut to this many characters.
MAX_MESSAGE_CHARS = 1_000
_DISK_FULL_LOG_EVERY_S = 1.0
_INTERNAL_MESSAGE = "internal broker error"

# The one table. Lookup walks the exception's MRO, so a subclass without its own row gets
# its parent's status; every concrete class the broker raises has a row so that the table
# reads as the contract. Client-side classes (ClientError) never come from a broker.
STATUS_BY_ERROR: dict[type[TidelogError], grpc.StatusCode] = {
    RequestError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    CorruptRecordError: grpc.StatusCode.INVALID_ARGUMENT,
    RecordTooLargeError: grpc.StatusCode.INVALID_ARGUMENT,
    RequestTooLargeError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    UnsupportedCompressionTypeError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidTopicError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidConfigError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidPartitionsError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidReplicationFactorError: grpc.StatusCode.INVALID_ARGUMENT,
    TopicAlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    UnknownTopicOrPartitionError: grpc.StatusCode.NOT_FOUND,
    OffsetOutOfRangeError: grpc.StatusCode.OUT_OF_RANGE,
    LogTruncationError: grpc.StatusCode.OUT_OF_RANGE,  # consumer-side only; for completeness
    OffsetNotAvailableError: grpc.StatusCode.UNAVAILABLE,
    OutOfOrderSequenceError: grpc.StatusCode.FAILED_PRECONDITION,
    InvalidProducerEpochError: grpc.StatusCode.FAILED_PRECONDITION,
    UnknownProducerIdError: grpc.StatusCode.FAILED_PRECONDITION,
    GroupError: grpc.StatusCode.FAILED_PRECONDITION,
    UnknownMemberIdError: grpc.StatusCode.NOT_FOUND,
    FencedMemberEpochError: grpc.StatusCode.FAILED_PRECONDITION,
    StaleMemberEpochError: grpc.StatusCode.FAILED_PRECONDITION,
    GroupNotEmptyError: grpc.StatusCode.FAILED_PRECONDITION,
    GroupIdNotFoundError: grpc.StatusCode.NOT_FOUND,
    NotAuthorizedError: grpc.StatusCode.PERMISSION_DENIED,
    ResourceNotFoundError: grpc.StatusCode.NOT_FOUND,
    SaslAuthenticationError: grpc.StatusCode.UNAUTHENTICATED,
    SaslSessionExpiredError: grpc.StatusCode.UNAUTHENTICATED,
    UnsupportedSaslMechanismError: grpc.StatusCode.UNAUTHENTICATED,
    TopicAuthorizationFailedError: grpc.StatusCode.PERMISSION_DENIED,
    GroupAuthorizationFailedError: grpc.StatusCode.PERMISSION_DENIED,
    ClusterAuthorizationFailedError: grpc.StatusCode.PERMISSION_DENIED,
    SecurityDisabledError: grpc.StatusCode.FAILED_PRECONDITION,
    NotControllerError: grpc.StatusCode.FAILED_PRECONDITION,
    NotLeaderOrFollowerError: grpc.StatusCode.FAILED_PRECONDITION,
    LeaderNotAvailableError: grpc.StatusCode.UNAVAILABLE,
    NotCoordinatorError: grpc.StatusCode.FAILED_PRECONDITION,
    CoordinatorLoadInProgressError: grpc.StatusCode.UNAVAILABLE,
    FencedLeaderEpochError: grpc.StatusCode.FAILED_PRECONDITION,
    UnknownLeaderEpochError: grpc.StatusCode.UNAVAILABLE,
    NotEnoughReplicasError: grpc.StatusCode.UNAVAILABLE,
    NotEnoughReplicasAfterAppendError: grpc.StatusCode.UNAVAILABLE,
    # An acks=all produce whose replication outlasted its timeout (Kafka answers the
    # partition REQUEST_TIMED_OUT; the client's timeout class carries that code).
    KafkaTimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    StorageError: grpc.StatusCode.INTERNAL,
    LogDirFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    InternalError: grpc.StatusCode.INTERNAL,
    BrokerBusyError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    MaxConnectionsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    MaxConnectionsPerIpError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    QueuedMaxRequestsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    QueuedMaxRequestBytesError: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


class ShuttingDownError(Exception):
    """The broker is stopping and takes no new work. Not a ``TidelogError``: it never
    travels as a code string, only as the transport-level ``UNAVAILABLE``."""


@dataclass(frozen=True, slots=True)
class WireError:
    """What the client learns of an error: status, stable code string (None: no code is
    sent, the status says it all), safe message."""

    status: grpc.StatusCode
    code: str | None
    message: str


def to_wire(exc: BaseException) -> WireError:
    """Translate any exception into what may be sent to a client, logging what may not.

    Request errors keep their message; storage faults and unexpected exceptions are logged
    here (with traceback) and answered with a fixed message.
    """
    if isinstance(exc, ShuttingDownError):
        return WireError(grpc.StatusCode.UNAVAILABLE, None, str(exc))
    if isinstance(exc, TidelogError):
        for cls in type(exc).__mro__:
            status = STATUS_BY_ERROR.get(cls)
            if status is not None:
                break
        else:
            status = None
        if isinstance(exc, RequestError | BrokerBusyError | KafkaTimeoutError) and status:
            return WireError(status, exc.code, _bounded(str(exc) or exc.code))
        if isinstance(exc, LogDirFullError):
            # Expected while the disk is full, and retried by every producer: a traceback
            # per refused produce would flood the log (on that same disk, often). One
            # line at most every second says it.
            _log_disk_full(exc)
            return WireError(status or grpc.StatusCode.INTERNAL, exc.code, _STORAGE_MESSAGE)
        if isinstance(exc, StorageError):
            log.error("storage fault answered as %s", exc.code, exc_info=exc)
            return WireError(status or grpc.StatusCode.INTERNAL, exc.code, _STORAGE_MESSAGE)
    log.error("unexpected error answered as INTERNAL", exc_info=exc)
    return WireError(grpc.StatusCode.INTERNAL, InternalError.code, _INTERNAL_MESSAGE)


_disk_full_logged_at = [0.0]  # monotonic seconds of the last line (a race logs twice)


def _log_disk_full(exc: LogDirFullError) -> None:
    now = time.monotonic()
    if now - _disk_full_logged_at[0] >= _DISK_FULL_LOG_EVERY_S:
        _disk_full_logged_at[0] = now
        log.error("log directory full, produce refused with LOG_DIR_FULL: %s", exc)


def _bounded(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 30] + f"... ({len(message)} characters)"


def partition_error(exc: BaseException) -> tuple[str, str]:
    """``(error_code, error_message)`` for one partition's result inside an answer."""
    wire = to_wire(exc)
    return wire.code or InternalError.code, wire.message


def abort_with(
    context: grpc.ServicerContext, exc: BaseException, wire: WireError | None = None
) -> NoReturn:
    """End the call with the status, code metadata and message for ``exc`` (``wire`` if
    the caller translated it already: ``to_wire`` logs, so translate once).

    ``context.abort`` raises; callers use it in an ``except`` block so it is not caught again.
    """
    if wire is None:
        wire = to_wire(exc)
    if wire.code is not None:
        context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, wire.code),))
    context.abort(wire.status, wire.message)
