"""The gRPC listener's rendering of an error: the one table from Tidelog errors to gRPC
status codes, and the trailing metadata that carries the code string.

A call that fails as a whole ends with the gRPC status from ``STATUS_BY_ERROR`` and the
error's stable ``code`` string in the trailing metadata key ``tidelog-error-code``; the client
rebuilds the exact exception class from it (``storage.errors.error_for_code``). Which code
and message a client may see is decided by the listener-neutral ``broker.core.errors.classify``;
this module only renders that ``Outcome`` in gRPC's terms.

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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

import grpc

from tidelog.broker.core.errors import Outcome, classify
from tidelog.storage.errors import (
    BrokerBusyError,
    BrokerUnavailableError,
    ClusterAuthorizationFailedError,
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    CorruptRecordError,
    ElectionNotNeededError,
    EligibleLeadersNotAvailableError,
    FencedInstanceIdError,
    FencedLeaderEpochError,
    FencedMemberEpochError,
    FencedStateEpochError,
    GroupAuthorizationFailedError,
    GroupError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    GroupNotEmptyError,
    GroupSubscribedToTopicError,
    InternalError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidRecordError,
    InvalidRecordStateError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTimestampError,
    InvalidTopicError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    LogDirFullError,
    MaxConnectionsError,
    MaxConnectionsPerIpError,
    NoReassignmentInProgressError,
    NotAuthorizedError,
    NotControllerError,
    NotCoordinatorError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetNotAvailableError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    PolicyViolationError,
    PreferredLeaderNotAvailableError,
    ProducerFencedError,
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
    TransactionAbortableError,
    TransactionalIdAuthorizationFailedError,
    TransactionalIdNotFoundError,
    TransactionCoordinatorFencedError,
    TransactionError,
    UnknownLeaderEpochError,
    UnknownMemberIdError,
    UnknownProducerIdError,
    UnknownTopicOrPartitionError,
    UnreleasedInstanceIdError,
    UnstableOffsetCommitError,
    UnsupportedCompressionTypeError,
    UnsupportedSaslMechanismError,
)

__all__ = [
    "ERROR_CODE_METADATA_KEY",
    "STATUS_BY_CODE",
    "STATUS_BY_ERROR",
    "WireError",
    "abort_with",
    "render",
    "to_wire",
]

ERROR_CODE_METADATA_KEY = "tidelog-error-code"

# The one table. Lookup walks the exception's MRO, so a subclass without its own row gets
# its parent's status; every concrete class the broker raises has a row so that the table
# reads as the contract. Of the ClientError classes a broker raises only two, for calls
# of its own that got no answer: KafkaTimeoutError and BrokerUnavailableError.
STATUS_BY_ERROR: dict[type[TidelogError], grpc.StatusCode] = {
    RequestError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    CorruptRecordError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidRecordError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidTimestampError: grpc.StatusCode.INVALID_ARGUMENT,
    PolicyViolationError: grpc.StatusCode.FAILED_PRECONDITION,
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
    OffsetNotAvailableError: grpc.StatusCode.UNAVAILABLE,
    OutOfOrderSequenceError: grpc.StatusCode.FAILED_PRECONDITION,
    InvalidProducerEpochError: grpc.StatusCode.FAILED_PRECONDITION,
    UnknownProducerIdError: grpc.StatusCode.FAILED_PRECONDITION,
    GroupError: grpc.StatusCode.FAILED_PRECONDITION,
    UnknownMemberIdError: grpc.StatusCode.NOT_FOUND,
    FencedMemberEpochError: grpc.StatusCode.FAILED_PRECONDITION,
    StaleMemberEpochError: grpc.StatusCode.FAILED_PRECONDITION,
    FencedInstanceIdError: grpc.StatusCode.FAILED_PRECONDITION,
    UnreleasedInstanceIdError: grpc.StatusCode.FAILED_PRECONDITION,
    GroupNotEmptyError: grpc.StatusCode.FAILED_PRECONDITION,
    GroupIdNotFoundError: grpc.StatusCode.NOT_FOUND,
    GroupSubscribedToTopicError: grpc.StatusCode.FAILED_PRECONDITION,
    UnstableOffsetCommitError: grpc.StatusCode.UNAVAILABLE,  # retriable: its marker comes
    InvalidRecordStateError: grpc.StatusCode.FAILED_PRECONDITION,
    GroupMaxSizeReachedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    TransactionError: grpc.StatusCode.FAILED_PRECONDITION,
    ProducerFencedError: grpc.StatusCode.FAILED_PRECONDITION,
    ConcurrentTransactionsError: grpc.StatusCode.UNAVAILABLE,
    CoordinatorNotAvailableError: grpc.StatusCode.UNAVAILABLE,
    InvalidProducerIdMappingError: grpc.StatusCode.FAILED_PRECONDITION,
    InvalidTransactionTimeoutError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidTxnStateError: grpc.StatusCode.FAILED_PRECONDITION,
    TransactionCoordinatorFencedError: grpc.StatusCode.FAILED_PRECONDITION,
    TransactionAbortableError: grpc.StatusCode.ABORTED,
    TransactionalIdNotFoundError: grpc.StatusCode.NOT_FOUND,
    NotAuthorizedError: grpc.StatusCode.PERMISSION_DENIED,
    ResourceNotFoundError: grpc.StatusCode.NOT_FOUND,
    SaslAuthenticationError: grpc.StatusCode.UNAUTHENTICATED,
    SaslSessionExpiredError: grpc.StatusCode.UNAUTHENTICATED,
    UnsupportedSaslMechanismError: grpc.StatusCode.UNAUTHENTICATED,
    TopicAuthorizationFailedError: grpc.StatusCode.PERMISSION_DENIED,
    GroupAuthorizationFailedError: grpc.StatusCode.PERMISSION_DENIED,
    TransactionalIdAuthorizationFailedError: grpc.StatusCode.PERMISSION_DENIED,
    ClusterAuthorizationFailedError: grpc.StatusCode.PERMISSION_DENIED,
    SecurityDisabledError: grpc.StatusCode.FAILED_PRECONDITION,
    NotControllerError: grpc.StatusCode.FAILED_PRECONDITION,
    ElectionNotNeededError: grpc.StatusCode.FAILED_PRECONDITION,
    InvalidReplicaAssignmentError: grpc.StatusCode.INVALID_ARGUMENT,
    NoReassignmentInProgressError: grpc.StatusCode.FAILED_PRECONDITION,
    PreferredLeaderNotAvailableError: grpc.StatusCode.UNAVAILABLE,
    EligibleLeadersNotAvailableError: grpc.StatusCode.UNAVAILABLE,
    NotLeaderOrFollowerError: grpc.StatusCode.FAILED_PRECONDITION,
    LeaderNotAvailableError: grpc.StatusCode.UNAVAILABLE,
    NotCoordinatorError: grpc.StatusCode.FAILED_PRECONDITION,
    CoordinatorLoadInProgressError: grpc.StatusCode.UNAVAILABLE,
    FencedLeaderEpochError: grpc.StatusCode.FAILED_PRECONDITION,
    FencedStateEpochError: grpc.StatusCode.FAILED_PRECONDITION,
    UnknownLeaderEpochError: grpc.StatusCode.UNAVAILABLE,
    NotEnoughReplicasError: grpc.StatusCode.UNAVAILABLE,
    NotEnoughReplicasAfterAppendError: grpc.StatusCode.UNAVAILABLE,
    # An acks=all produce whose replication outlasted its timeout (Kafka answers the
    # partition REQUEST_TIMED_OUT; the client's timeout class carries that code).
    KafkaTimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    # A dependency of this broker (ZooKeeper, the controller) is not there yet: retriable.
    BrokerUnavailableError: grpc.StatusCode.UNAVAILABLE,
    StorageError: grpc.StatusCode.INTERNAL,
    LogDirFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    InternalError: grpc.StatusCode.INTERNAL,
    BrokerBusyError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    MaxConnectionsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    MaxConnectionsPerIpError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    QueuedMaxRequestsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    QueuedMaxRequestBytesError: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


# The same table by code string: codes are unique per row (tests/broker/test_errors.py),
# and a class without a row of its own inherits its parent's code with its status.
STATUS_BY_CODE: Mapping[str, grpc.StatusCode] = {
    cls.code: status for cls, status in STATUS_BY_ERROR.items()
}


@dataclass(frozen=True, slots=True)
class WireError:
    """What the client learns of an error: status, stable code string (None: no code is
    sent, the status says it all), safe message."""

    status: grpc.StatusCode
    code: str | None
    message: str


def render(outcome: Outcome) -> WireError:
    """A classified error in gRPC's terms (no code: ``UNAVAILABLE``, the broker stops)."""
    if outcome.code is None:
        return WireError(grpc.StatusCode.UNAVAILABLE, None, outcome.message)
    status = STATUS_BY_CODE.get(outcome.code, grpc.StatusCode.INTERNAL)
    return WireError(status, outcome.code, outcome.message)


def to_wire(exc: BaseException) -> WireError:
    """Classify (``broker.core.errors.classify``: logs what may not be sent) and render."""
    return render(classify(exc))


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
