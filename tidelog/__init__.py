"""Tidelog, installed under one name.

::

    from tidelog import AdminClient, Consumer, Producer, TopicPartition

The short form re-exports the client's public names (``tidelog.client``); the layers are
``tidelog.client``, ``tidelog.broker``, ``tidelog.storage``, ``tidelog.proto`` and
``tidelog.spark_sink``, and PySpark's entry module ``pyspark_tidelog`` stays top-level for
Spark's discovery.

In the repository the five folders stay at the top, where the project's layout puts them;
this folder holds a relative symbolic link to each, so a checkout (or an editable install,
which puts the repository root on ``sys.path``) imports ``tidelog.client`` from
``client/``, and a wheel holds real copies under ``tidelog/`` (setuptools follows the
links). Nothing may import the bare names (``import client``): the same file under two
module names would make two sets of classes (``tests/test_architecture.py`` checks it).
The names below load on first use, so ``import tidelog.broker`` does not import the
client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidelog.client import (
        AclBinding,
        AclFilter,
        AdminClient,
        BrokerBusyError,
        BrokerUnavailableError,
        BufferExhaustedError,
        ClientError,
        ClosedError,
        ClusterAuthorizationFailedError,
        Consumer,
        ConsumerGroupMetadata,
        ConsumerRecord,
        CorruptRecordError,
        GroupAuthorizationFailedError,
        InvalidConfigError,
        InvalidPartitionsError,
        InvalidRequestError,
        InvalidTopicError,
        InvalidTxnStateError,
        KafkaTimeoutError,
        LogTruncationError,
        OffsetAndTimestamp,
        OffsetOutOfRangeError,
        OutOfOrderSequenceError,
        Producer,
        ProducerFencedError,
        RecordMetadata,
        RecordTooLargeError,
        RequestError,
        ResourceNotFoundError,
        SaslAuthenticationError,
        ShareConsumer,
        TidelogError,
        TopicAlreadyExistsError,
        TopicAuthorizationFailedError,
        TopicPartition,
        TransactionAbortableError,
        TransactionAbortedError,
        UnknownTopicOrPartitionError,
    )

__all__ = [
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


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'tidelog' has no attribute {name!r}")
    value = getattr(importlib.import_module("tidelog.client"), name)
    globals()[name] = value
    return value
