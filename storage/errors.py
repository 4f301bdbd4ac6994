"""The one Tidelog error hierarchy.

Every error that can cross the wire lives here, so that the broker can map it to a gRPC
status and the client can rebuild the exact class from its stable ``code`` string. The
module sits in ``storage`` because ``storage`` is the bottom of the dependency graph: the
broker and the client both already depend on it (the client only on ``storage.records``
and this module, which import nothing else of ours).

::

    TidelogError(code, retriable)
    ├── StorageError                      KAFKA_STORAGE_ERROR  retriable (no details to clients)
    │   └── LogDirFullError               LOG_DIR_FULL         retriable
    ├── RequestError                      (the request is at fault; retrying it won't help)
    │   ├── CorruptRecordError            CORRUPT_MESSAGE
    │   ├── InvalidRecordError            INVALID_RECORD (e.g. a key-less record, compacted topic)
    │   ├── InvalidTimestampError         INVALID_TIMESTAMP (message.timestamp.before/after.max.ms)
    │   ├── RecordTooLargeError           MESSAGE_TOO_LARGE
    │   ├── RequestTooLargeError          REQUEST_TOO_LARGE
    │   ├── UnsupportedCompressionTypeError  UNSUPPORTED_COMPRESSION_TYPE
    │   ├── InvalidTopicError             INVALID_TOPIC_EXCEPTION
    │   ├── TopicAlreadyExistsError       TOPIC_ALREADY_EXISTS
    │   ├── InvalidConfigError            INVALID_CONFIG
    │   ├── PolicyViolationError          POLICY_VIOLATION
    │   ├── InvalidRequestError           INVALID_REQUEST
    │   ├── InvalidPartitionsError        INVALID_PARTITIONS
    │   ├── InvalidReplicationFactorError  INVALID_REPLICATION_FACTOR
    │   ├── InvalidReplicaAssignmentError  INVALID_REPLICA_ASSIGNMENT
    │   ├── NoReassignmentInProgressError  NO_REASSIGNMENT_IN_PROGRESS
    │   ├── OffsetOutOfRangeError         OFFSET_OUT_OF_RANGE
    │   ├── OffsetNotAvailableError       OFFSET_NOT_AVAILABLE retriable
    │   ├── UnknownTopicOrPartitionError  UNKNOWN_TOPIC_OR_PARTITION   retriable
    │   ├── OutOfOrderSequenceError       OUT_OF_ORDER_SEQUENCE_NUMBER
    │   ├── InvalidProducerEpochError     INVALID_PRODUCER_EPOCH
    │   ├── UnknownProducerIdError        UNKNOWN_PRODUCER_ID
    │   ├── GroupError                    (consumer-group protocol)
    │   │   ├── UnknownMemberIdError      UNKNOWN_MEMBER_ID
    │   │   ├── FencedMemberEpochError    FENCED_MEMBER_EPOCH
    │   │   ├── StaleMemberEpochError     STALE_MEMBER_EPOCH
    │   │   ├── FencedInstanceIdError     FENCED_INSTANCE_ID (a newer static incarnation)
    │   │   ├── UnreleasedInstanceIdError UNRELEASED_INSTANCE_ID (a static member still in use)
    │   │   ├── GroupNotEmptyError        NON_EMPTY_GROUP
    │   │   ├── GroupIdNotFoundError      GROUP_ID_NOT_FOUND
    │   │   ├── GroupSubscribedToTopicError  GROUP_SUBSCRIBED_TO_TOPIC
    │   │   ├── GroupMaxSizeReachedError  GROUP_MAX_SIZE_REACHED (group.share.max.size)
    │   │   └── UnstableOffsetCommitError UNSTABLE_OFFSET_COMMIT  retriable
    │   ├── InvalidRecordStateError       INVALID_RECORD_STATE (share groups: not acquired by you)
    │   ├── NotControllerError            NOT_CONTROLLER       retriable
    │   ├── NotLeaderOrFollowerError      NOT_LEADER_OR_FOLLOWER  retriable
    │   ├── LeaderNotAvailableError       LEADER_NOT_AVAILABLE    retriable
    │   ├── NotCoordinatorError           NOT_COORDINATOR      retriable
    │   ├── CoordinatorLoadInProgressError  COORDINATOR_LOAD_IN_PROGRESS  retriable
    │   ├── FencedLeaderEpochError        FENCED_LEADER_EPOCH  retriable
    │   ├── FencedStateEpochError         FENCED_STATE_EPOCH   retriable (share state reset)
    │   ├── UnknownLeaderEpochError       UNKNOWN_LEADER_EPOCH retriable
    │   ├── NotEnoughReplicasError        NOT_ENOUGH_REPLICAS  retriable
    │   ├── NotEnoughReplicasAfterAppendError  NOT_ENOUGH_REPLICAS_AFTER_APPEND  retriable
    │   ├── NotAuthorizedError            NOT_AUTHORIZED
    │   │   ├── TopicAuthorizationFailedError    TOPIC_AUTHORIZATION_FAILED
    │   │   ├── GroupAuthorizationFailedError    GROUP_AUTHORIZATION_FAILED
    │   │   ├── TransactionalIdAuthorizationFailedError  TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    │   │   └── ClusterAuthorizationFailedError  CLUSTER_AUTHORIZATION_FAILED
    │   ├── SecurityDisabledError         SECURITY_DISABLED
    │   ├── ResourceNotFoundError         RESOURCE_NOT_FOUND (e.g. an unknown SCRAM user)
    │   └── SaslAuthenticationError       SASL_AUTHENTICATION_FAILED (gRPC UNAUTHENTICATED)
    │       ├── SaslSessionExpiredError   SASL_SESSION_EXPIRED       retriable
    │       └── UnsupportedSaslMechanismError UNSUPPORTED_SASL_MECHANISM
    │   └── TransactionError              (the transaction coordinator's answers, issue #28)
    │       ├── ProducerFencedError       PRODUCER_FENCED (a newer instance of the transactional id)
    │       ├── ConcurrentTransactionsError  CONCURRENT_TRANSACTIONS  retriable
    │       ├── CoordinatorNotAvailableError COORDINATOR_NOT_AVAILABLE retriable
    │       ├── InvalidProducerIdMappingError INVALID_PRODUCER_ID_MAPPING
    │       ├── InvalidTransactionTimeoutError INVALID_TRANSACTION_TIMEOUT
    │       ├── InvalidTxnStateError      INVALID_TXN_STATE (a plain batch in a transaction)
    │       ├── TransactionAbortableError TRANSACTION_ABORTABLE (abort, then go on)
    │       ├── TransactionCoordinatorFencedError TRANSACTION_COORDINATOR_FENCED
    │       └── TransactionalIdNotFoundError TRANSACTIONAL_ID_NOT_FOUND
    ├── BrokerBusyError                   (a broker limit refused the call at once) retriable
    │   ├── MaxConnectionsError           MAX_CONNECTIONS_REACHED
    │   ├── MaxConnectionsPerIpError      MAX_CONNECTIONS_PER_IP_REACHED
    │   ├── QueuedMaxRequestsError        QUEUED_MAX_REQUESTS_REACHED
    │   └── QueuedMaxRequestBytesError    QUEUED_MAX_REQUEST_BYTES_REACHED
    ├── ClientError                       (a call that got no answer)
    │   ├── BrokerUnavailableError        BROKER_UNAVAILABLE   retriable
    │   └── KafkaTimeoutError             REQUEST_TIMED_OUT    retriable
    └── InternalError                     INTERNAL             (anything unexpected)

Code strings follow Kafka's error names where Kafka has one, so people who know Kafka can
read them. ``error_for_code`` turns a code string back into its class.

What is here is the protocol's vocabulary, which both sides speak (Kafka's
``org.apache.kafka.common.errors``): the errors a broker answers with, and the two a
caller meets when no answer comes (``BrokerUnavailableError``, ``KafkaTimeoutError``,
raised by the client library and by a broker calling another broker). Errors that only the
client library raises and no broker ever sends live in ``client.errors``
(``ClosedError``, ``BufferExhaustedError``, ``LogTruncationError``).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "BrokerBusyError",
    "BrokerUnavailableError",
    "ClientError",
    "ClusterAuthorizationFailedError",
    "ConcurrentTransactionsError",
    "CoordinatorLoadInProgressError",
    "CoordinatorNotAvailableError",
    "CorruptRecordError",
    "ElectionNotNeededError",
    "EligibleLeadersNotAvailableError",
    "FencedLeaderEpochError",
    "FencedMemberEpochError",
    "FencedStateEpochError",
    "GroupAuthorizationFailedError",
    "GroupError",
    "GroupIdNotFoundError",
    "GroupMaxSizeReachedError",
    "GroupNotEmptyError",
    "GroupSubscribedToTopicError",
    "InternalError",
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidProducerEpochError",
    "InvalidProducerIdMappingError",
    "InvalidRecordError",
    "InvalidRecordStateError",
    "InvalidReplicaAssignmentError",
    "InvalidReplicationFactorError",
    "InvalidRequestError",
    "InvalidTimestampError",
    "InvalidTopicError",
    "InvalidTransactionTimeoutError",
    "InvalidTxnStateError",
    "KafkaTimeoutError",
    "LeaderNotAvailableError",
    "LogDirFullError",
    "MaxConnectionsError",
    "MaxConnectionsPerIpError",
    "NoReassignmentInProgressError",
    "NotAuthorizedError",
    "NotControllerError",
    "NotCoordinatorError",
    "NotEnoughReplicasAfterAppendError",
    "NotEnoughReplicasError",
    "NotLeaderOrFollowerError",
    "OffsetNotAvailableError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "PolicyViolationError",
    "PreferredLeaderNotAvailableError",
    "ProducerFencedError",
    "QueuedMaxRequestBytesError",
    "QueuedMaxRequestsError",
    "RecordTooLargeError",
    "RequestError",
    "RequestTooLargeError",
    "ResourceNotFoundError",
    "SaslAuthenticationError",
    "SaslSessionExpiredError",
    "SecurityDisabledError",
    "StaleMemberEpochError",
    "StorageError",
    "TidelogError",
    "TopicAlreadyExistsError",
    "TopicAuthorizationFailedError",
    "TransactionAbortableError",
    "TransactionCoordinatorFencedError",
    "TransactionError",
    "TransactionalIdAuthorizationFailedError",
    "TransactionalIdNotFoundError",
    "UnknownLeaderEpochError",
    "UnknownMemberIdError",
    "UnknownProducerIdError",
    "UnknownTopicOrPartitionError",
    "UnstableOffsetCommitError",
    "UnsupportedCompressionTypeError",
    "UnsupportedSaslMechanismError",
    "error_for_code",
]


class TidelogError(Exception):
    """Base of every Tidelog error. ``code`` is stable across versions and processes."""

    code: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    retriable: ClassVar[bool] = False


# --- storage faults: the broker's own problem; clients see only the code -------------


class StorageError(TidelogError):
    """The broker could not read or write its log directory.

    Retriable, as Kafka's ``KafkaStorageException``: a write answered with it may or may
    not be stored (appended, then the fsync failed or the broker stopped), so a producer
    sends the same bytes again (to the partition's next leader, which recognises a stored
    batch by its sequence) rather than treating it as refused.
    """

    code = "KAFKA_STORAGE_ERROR"
    retriable = True


class LogDirFullError(StorageError):
    """The disk holding the log directory is full; nothing was appended."""

    code = "LOG_DIR_FULL"
    retriable = True


# --- request errors: the request is at fault ----------------------------------------


class RequestError(TidelogError):
    """The request cannot be served as it stands."""

    code = "INVALID_REQUEST"


class CorruptRecordError(RequestError):
    """Batch bytes are truncated, malformed or fail their CRC-32C check."""

    code = "CORRUPT_MESSAGE"


class InvalidRecordError(RequestError):
    """A well-formed record the topic does not accept (Kafka's ``InvalidRecordException``):
    a record without a key sent to a compacted topic."""

    code = "INVALID_RECORD"


class InvalidTimestampError(RequestError):
    """A record's CreateTime is further from the broker's clock than the topic allows
    (``message.timestamp.before.max.ms`` / ``message.timestamp.after.max.ms``, KIP-937)."""

    code = "INVALID_TIMESTAMP"


class RecordTooLargeError(RequestError):
    """A batch is larger than ``max.message.bytes`` / ``message.max.bytes``."""

    code = "MESSAGE_TOO_LARGE"


class RequestTooLargeError(RequestError):
    """The whole request is larger than the broker accepts."""

    code = "REQUEST_TOO_LARGE"


class UnsupportedCompressionTypeError(RequestError):
    """A batch compressed with a codec this broker does not store.

    Refused at produce time, so the log never holds what the cleaner and consumers
    cannot read. Every codec Kafka defines is stored (``storage.compression``); ids 5-7
    name no codec and are ``CorruptRecordError``s, so this is not raised today.
    """

    code = "UNSUPPORTED_COMPRESSION_TYPE"


class InvalidTopicError(RequestError):
    """A topic name that does not match ``[A-Za-z0-9._-]{1,249}`` or is ``.``/``..``."""

    code = "INVALID_TOPIC_EXCEPTION"


class TopicAlreadyExistsError(RequestError):
    """A topic of that name exists already."""

    code = "TOPIC_ALREADY_EXISTS"


class InvalidConfigError(RequestError):
    """An unknown configuration key or a value out of range."""

    code = "INVALID_CONFIG"


class PolicyViolationError(RequestError):
    """A valid request a broker policy refuses (Kafka's ``PolicyViolationException``):
    ``min.insync.replicas`` above a topic's replication factor."""

    code = "POLICY_VIOLATION"


class InvalidRequestError(RequestError):
    """The request is malformed in a way no other error describes."""

    code = "INVALID_REQUEST"


class InvalidPartitionsError(RequestError):
    """A partition count that is not a positive integer, or a decrease in partitions."""

    code = "INVALID_PARTITIONS"


class InvalidReplicationFactorError(RequestError):
    """A replication factor below 1 or above the number of live brokers."""

    code = "INVALID_REPLICATION_FACTOR"


class InvalidReplicaAssignmentError(RequestError):
    """A reassignment's target replicas are empty, repeat a broker or name one that is not
    live (KIP-455)."""

    code = "INVALID_REPLICA_ASSIGNMENT"


class NoReassignmentInProgressError(RequestError):
    """A reassignment was cancelled for a partition that is not being reassigned."""

    code = "NO_REASSIGNMENT_IN_PROGRESS"


class OffsetOutOfRangeError(RequestError):
    """An offset below the log start offset or above the log end offset."""

    code = "OFFSET_OUT_OF_RANGE"


class UnknownTopicOrPartitionError(RequestError):
    """No such topic, or no such partition of it. Retriable: it may be being created."""

    code = "UNKNOWN_TOPIC_OR_PARTITION"
    retriable = True


class OutOfOrderSequenceError(RequestError):
    """An idempotent producer's batch skipped sequence numbers."""

    code = "OUT_OF_ORDER_SEQUENCE_NUMBER"


class InvalidProducerEpochError(RequestError):
    """An idempotent producer's epoch is older than the one the broker knows (fenced)."""

    code = "INVALID_PRODUCER_EPOCH"


class UnknownProducerIdError(RequestError):
    """The producer id was never handed out by this broker."""

    code = "UNKNOWN_PRODUCER_ID"


class GroupError(RequestError):
    """Base of the consumer-group protocol errors."""

    code = "GROUP_ERROR"


class UnknownMemberIdError(GroupError):
    """The member id is not (or no longer) part of the group."""

    code = "UNKNOWN_MEMBER_ID"


class FencedMemberEpochError(GroupError):
    """The member's epoch is behind the coordinator's: it must rejoin."""

    code = "FENCED_MEMBER_EPOCH"


class StaleMemberEpochError(GroupError):
    """An offset commit carried an epoch that no longer owns the partition."""

    code = "STALE_MEMBER_EPOCH"


class FencedInstanceIdError(GroupError):
    """A static member's instance id now belongs to another member id (a newer incarnation
    of the same consumer joined): this one must stop, not rejoin."""

    code = "FENCED_INSTANCE_ID"


class UnreleasedInstanceIdError(GroupError):
    """A static member joined with an instance id that a live member still uses (it has
    not left with epoch -2): retry once the other has left, or pick another id."""

    code = "UNRELEASED_INSTANCE_ID"


class GroupNotEmptyError(GroupError):
    """The operation needs a group with no active members."""

    code = "NON_EMPTY_GROUP"


class GroupIdNotFoundError(GroupError):
    """No group of that id exists."""

    code = "GROUP_ID_NOT_FOUND"


class GroupSubscribedToTopicError(GroupError):
    """A group's committed offset cannot be deleted while a live member subscribes to its
    topic (Kafka's OffsetDelete, KIP-496)."""

    code = "GROUP_SUBSCRIBED_TO_TOPIC"


class GroupMaxSizeReachedError(GroupError):
    """A new member would take the group past its maximum size (``group.share.max.size``
    for a share group, issue #32)."""

    code = "GROUP_MAX_SIZE_REACHED"


class UnstableOffsetCommitError(GroupError):
    """The group's offset of a partition is pending in an undecided transaction
    (OffsetFetch with ``require_stable``, KIP-447): ask again once its marker is written."""

    code = "UNSTABLE_OFFSET_COMMIT"
    retriable = True


class InvalidRecordStateError(RequestError):
    """A share-group acknowledgement of a record that is not acquired by that member
    (never acquired, its lock expired, already acknowledged, or another member's): Kafka's
    ``INVALID_RECORD_STATE`` (KIP-932). Nothing of that acknowledgement was applied."""

    code = "INVALID_RECORD_STATE"


class NotControllerError(RequestError):
    """A controller operation reached a broker that is not (or no longer) the controller."""

    code = "NOT_CONTROLLER"
    retriable = True


class ElectionNotNeededError(RequestError):
    """ElectLeaders: the partition already has the leader asked for (its preferred
    replica, or, for an unclean election, a live one)."""

    code = "ELECTION_NOT_NEEDED"


class PreferredLeaderNotAvailableError(RequestError):
    """ElectLeaders: the preferred replica is dead or out of the ISR; it cannot lead now."""

    code = "PREFERRED_LEADER_NOT_AVAILABLE"
    retriable = True


class EligibleLeadersNotAvailableError(RequestError):
    """ElectLeaders: no live replica can lead the partition (an unclean election with
    every replica down)."""

    code = "ELIGIBLE_LEADERS_NOT_AVAILABLE"
    retriable = True


class NotLeaderOrFollowerError(RequestError):
    """This broker does not lead the partition: refresh the metadata, go to the leader."""

    code = "NOT_LEADER_OR_FOLLOWER"
    retriable = True


class LeaderNotAvailableError(RequestError):
    """The partition has no leader right now (offline, or an election is under way)."""

    code = "LEADER_NOT_AVAILABLE"
    retriable = True


class NotCoordinatorError(RequestError):
    """This broker is not the group's coordinator: find the coordinator again."""

    code = "NOT_COORDINATOR"
    retriable = True


class CoordinatorLoadInProgressError(RequestError):
    """This broker just became the group's coordinator and is still loading its committed
    offsets (or waiting for its followers to hold all of them): retry shortly."""

    code = "COORDINATOR_LOAD_IN_PROGRESS"
    retriable = True


class OffsetNotAvailableError(RequestError):
    """A new leader has not yet established its high watermark (its followers have not
    caught up with the log it took over): what consumers may read is not known yet. Not
    data loss: retry."""

    code = "OFFSET_NOT_AVAILABLE"
    retriable = True


class FencedLeaderEpochError(RequestError):
    """The request named an older leader epoch than the broker's: the client's metadata
    is stale. Refresh it and retry."""

    code = "FENCED_LEADER_EPOCH"
    retriable = True


class FencedStateEpochError(RequestError):
    """A share partition's state was reset or deleted by an admin (its state epoch moved
    on) after its leader loaded it: the leader drops its memory and reloads. Kafka's
    ``FENCED_STATE_EPOCH``; retriable here: the leader reloads, so a retry finds the
    current state."""

    code = "FENCED_STATE_EPOCH"
    retriable = True


class UnknownLeaderEpochError(RequestError):
    """The request named a newer leader epoch than the broker knows: the broker has not
    caught up with the controller yet. Retry."""

    code = "UNKNOWN_LEADER_EPOCH"
    retriable = True


class NotEnoughReplicasError(RequestError):
    """``acks=all`` and fewer in-sync replicas than ``min.insync.replicas``: nothing was
    appended."""

    code = "NOT_ENOUGH_REPLICAS"
    retriable = True


class NotEnoughReplicasAfterAppendError(RequestError):
    """``acks=all``: appended on the leader, but the in-sync replicas fell below
    ``min.insync.replicas`` before it was replicated. A retry may store it again unless the
    producer is idempotent."""

    code = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    retriable = True


class NotAuthorizedError(RequestError):
    """The caller may not do this."""

    code = "NOT_AUTHORIZED"


class ResourceNotFoundError(RequestError):
    """The named resource (a SCRAM user) does not exist."""

    code = "RESOURCE_NOT_FOUND"


class SaslAuthenticationError(RequestError):
    """Authentication failed or is missing: wrong credentials, too many failed logins
    from this address, a call without a session on a listener that requires one
    (gRPC ``UNAUTHENTICATED``). The message never says which part was wrong."""

    code = "SASL_AUTHENTICATION_FAILED"


class SaslSessionExpiredError(SaslAuthenticationError):
    """The call's session token is unknown here, expired, or belongs to another
    connection (the channel reconnected, the broker restarted). Retriable: the client
    authenticates again on its current connection and repeats the call."""

    code = "SASL_SESSION_EXPIRED"
    retriable = True


class UnsupportedSaslMechanismError(SaslAuthenticationError):
    """The mechanism is not in the listener's ``sasl.enabled.mechanisms`` (or PLAIN
    without TLS)."""

    code = "UNSUPPORTED_SASL_MECHANISM"


class TopicAuthorizationFailedError(NotAuthorizedError):
    """The principal may not do this to the topic (an ACL denies it or none allows it)."""

    code = "TOPIC_AUTHORIZATION_FAILED"


class GroupAuthorizationFailedError(NotAuthorizedError):
    """The principal may not do this to the consumer group."""

    code = "GROUP_AUTHORIZATION_FAILED"


class TransactionalIdAuthorizationFailedError(NotAuthorizedError):
    """The caller may not use (WRITE) or see (DESCRIBE) this transactional id."""

    code = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"


class ClusterAuthorizationFailedError(NotAuthorizedError):
    """The principal may not do this to the cluster (an administrative call)."""

    code = "CLUSTER_AUTHORIZATION_FAILED"


class SecurityDisabledError(RequestError):
    """An ACL call on a broker without an authorizer (``authorizer.enabled=false``)."""

    code = "SECURITY_DISABLED"


# --- limits: the broker is full right now; the same call later may well succeed -------


# --- transactions: the coordinator's answers (issue #28) --------------------------------


class TransactionError(RequestError):
    """Base of the transaction coordinator's refusals."""

    code = "TRANSACTION_ERROR"


class ProducerFencedError(TransactionError):
    """A newer instance initialised this transactional id (or a timeout aborted the
    transaction under a bumped epoch): this producer must close."""

    code = "PRODUCER_FENCED"


class ConcurrentTransactionsError(TransactionError):
    """Another transition of the transactional id is in flight, or its last transaction
    is still completing: retry shortly."""

    code = "CONCURRENT_TRANSACTIONS"
    retriable = True


class CoordinatorNotAvailableError(TransactionError):
    """The coordinator could not make a transition durable (too few in-sync replicas,
    or a timeout): retry."""

    code = "COORDINATOR_NOT_AVAILABLE"
    retriable = True


class InvalidProducerIdMappingError(TransactionError):
    """The producer id is not the transactional id's (or the id is unknown)."""

    code = "INVALID_PRODUCER_ID_MAPPING"


class InvalidTransactionTimeoutError(TransactionError):
    """``transaction.timeout.ms`` is not positive or exceeds the broker's
    ``transaction.max.timeout.ms``."""

    code = "INVALID_TRANSACTION_TIMEOUT"


class InvalidTxnStateError(TransactionError):
    """The request does not fit the transaction's state: on a partition, a
    non-transactional batch from a producer whose transaction there is still open."""

    code = "INVALID_TXN_STATE"


class TransactionCoordinatorFencedError(TransactionError):
    """An end-transaction marker carries a coordinator epoch older than the one the
    partition already saw for that producer: a newer coordinator owns the transaction."""

    code = "TRANSACTION_COORDINATOR_FENCED"


class TransactionAbortableError(TransactionError):
    """The transaction cannot go on (a partition was written to before it was added):
    abort it, then begin again."""

    code = "TRANSACTION_ABORTABLE"


class TransactionalIdNotFoundError(TransactionError):
    """No such transactional id (DescribeTransactions)."""

    code = "TRANSACTIONAL_ID_NOT_FOUND"


class BrokerBusyError(TidelogError):
    """A broker limit refused the call at once (gRPC ``RESOURCE_EXHAUSTED``). Retriable:
    back off and try again, or spread the load. The code names the limit reached."""

    code = "BROKER_BUSY"
    retriable = True


class MaxConnectionsError(BrokerBusyError):
    """The broker serves ``max.connections`` connections already."""

    code = "MAX_CONNECTIONS_REACHED"


class MaxConnectionsPerIpError(BrokerBusyError):
    """The broker serves ``max.connections.per.ip`` connections from this address."""

    code = "MAX_CONNECTIONS_PER_IP_REACHED"


class QueuedMaxRequestsError(BrokerBusyError):
    """``queued.max.requests`` requests already wait for the broker's storage threads."""

    code = "QUEUED_MAX_REQUESTS_REACHED"


class QueuedMaxRequestBytesError(BrokerBusyError):
    """``queued.max.request.bytes`` of produce data are already in flight in the broker."""

    code = "QUEUED_MAX_REQUEST_BYTES_REACHED"


# --- errors of a call without an answer ------------------------------------------------


class ClientError(TidelogError):
    """A call that got no answer: raised by the caller itself (the client library, or a
    broker calling another), never sent by a broker."""

    code = "CLIENT_ERROR"


class BrokerUnavailableError(ClientError):
    """The broker could not be reached before the deadline."""

    code = "BROKER_UNAVAILABLE"
    retriable = True


class KafkaTimeoutError(ClientError):
    """A blocking call ran out of time."""

    code = "REQUEST_TIMED_OUT"
    retriable = True


class InternalError(TidelogError):
    """Something unexpected; the broker logs the detail and sends none of it."""

    code = "INTERNAL"


def _all_subclasses(cls: type[TidelogError]) -> list[type[TidelogError]]:
    out: list[type[TidelogError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


# Concrete classes only: an abstract base shares its code with one concrete class
# (RequestError/InvalidRequestError), and the concrete one must win.
def _index_by_code() -> dict[str, type[TidelogError]]:
    by_code: dict[str, type[TidelogError]] = {}
    classes: list[type[TidelogError]] = [TidelogError, *_all_subclasses(TidelogError)]
    for cls in classes:
        if cls.__subclasses__() and cls.code in by_code:
            continue
        by_code[cls.code] = cls
    return by_code


_BY_CODE = _index_by_code()


def error_for_code(code: str, message: str = "") -> TidelogError:
    """Return an instance of the error class whose ``code`` is ``code``.

    An unknown code (a newer broker, say) becomes a plain ``TidelogError`` that keeps the
    code in its message, so nothing is silently lost.
    """
    cls = _BY_CODE.get(code)
    if cls is None:
        return TidelogError(f"[{code}] {message}" if message else code)
    return cls(message)
