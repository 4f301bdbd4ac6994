"""The Tidelog client: ``Producer``, ``Consumer``, ``AdminClient``, and the errors to catch.

::

    from client import AdminClient, Consumer, Producer, TopicPartition

Modelled on kafka-python. The error classes are ``storage.errors``' (one hierarchy for
the broker and the client, rebuilt from the broker's stable code strings); the ones an
application catches are re-exported here. ``client.types`` holds the admin answer types,
``client.config`` the configuration dataclasses.
"""

from __future__ import annotations

from client.admin import AdminClient
from client.consumer import Consumer
from client.producer import Producer
from client.types import ConsumerRecord, OffsetAndTimestamp, RecordMetadata, TopicPartition
from storage.errors import (
    BrokerBusyError,
    BrokerUnavailableError,
    BufferExhaustedError,
    ClientError,
    ClosedError,
    CorruptRecordError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidTopicError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    RequestError,
    ResourceNotFoundError,
    SaslAuthenticationError,
    TidelogError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

__all__ = [
    "AdminClient",
    "BrokerBusyError",
    "BrokerUnavailableError",
    "BufferExhaustedError",
    "ClientError",
    "ClosedError",
    "Consumer",
    "ConsumerRecord",
    "CorruptRecordError",
    "InvalidConfigError",
    "InvalidPartitionsError",
    "InvalidRequestError",
    "InvalidTopicError",
    "KafkaTimeoutError",
    "OffsetAndTimestamp",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "Producer",
    "RecordMetadata",
    "RecordTooLargeError",
    "RequestError",
    "ResourceNotFoundError",
    "SaslAuthenticationError",
    "TidelogError",
    "TopicAlreadyExistsError",
    "TopicPartition",
    "UnknownTopicOrPartitionError",
]
