"""The Tidelog client: ``Producer``, ``Consumer``, ``AdminClient``, and the errors to catch.

::

    from tidelog.client import AclBinding, AdminClient, Consumer, Producer, TopicPartition

Modelled on kafka-python. The error classes are ``storage.errors``' (one hierarchy for
the broker and the client, rebuilt from the broker's stable code strings); the ones an
application catches are re-exported here, the authorization ones included, as are the
access-control values ``AclBinding`` and ``AclFilter`` that ``AdminClient.create_acls``,
``describe_acls`` and ``delete_acls`` take (DESIGN.md's contract). ``client.types`` holds
the admin answer types, ``client.config`` the configuration dataclasses.
"""

from __future__ import annotations

from tidelog.client.acls import AclBinding, AclFilter
from tidelog.client.admin import AdminClient
from tidelog.client.consumer import Consumer
from tidelog.client.errors import (
    AcknowledgementOutcomeUnknownError,
    BufferExhaustedError,
    ClosedError,
    LogTruncationError,
    TransactionAbortedError,
)
from tidelog.client.producer import Producer
from tidelog.client.share_consumer import ShareConsumer
from tidelog.client.types import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndTimestamp,
    RecordMetadata,
    TopicPartition,
)
from tidelog.storage.errors import (
    BrokerBusyError,
    BrokerUnavailableError,
    ClientError,
    ClusterAuthorizationFailedError,
    CorruptRecordError,
    GroupAuthorizationFailedError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidTopicError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    RecordTooLargeError,
    RequestError,
    ResourceNotFoundError,
    SaslAuthenticationError,
    TidelogError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    TransactionAbortableError,
    UnknownTopicOrPartitionError,
)

__all__ = [
    "AcknowledgementOutcomeUnknownError",
    "AclBinding",
    "AclFilter",
    "AdminClient",
    "BrokerBusyError",
    "BrokerUnavailableError",
    "BufferExhaustedError",
    "ClientError",
    "ClosedError",
    "ClusterAuthorizationFailedError",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "CorruptRecordError",
    "GroupAuthorizationFailedError",
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidRequestError",
    "InvalidTopicError",
    "InvalidTxnStateError",
    "KafkaTimeoutError",
    "LogTruncationError",
    "OffsetAndTimestamp",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "Producer",
    "ProducerFencedError",
    "RecordMetadata",
    "RecordTooLargeError",
    "RequestError",
    "ResourceNotFoundError",
    "SaslAuthenticationError",
    "ShareConsumer",
    "TidelogError",
    "TopicAlreadyExistsError",
    "TopicAuthorizationFailedError",
    "TopicPartition",
    "TransactionAbortableError",
    "TransactionAbortedError",
    "UnknownTopicOrPartitionError",
]
