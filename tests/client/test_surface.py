"""The public surface of the client package and its value types."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest

from tidelog import client
from tidelog.client.types import ConsumerRecord, RecordMetadata, TopicPartition


def test_package_exports() -> None:
    assert set(client.__all__) == {
        "AdminClient",
        "Consumer",
        "Producer",
        "TopicPartition",
        "RecordMetadata",
        "ConsumerRecord",
        "OffsetAndTimestamp",
        # the errors applications catch: the protocol's (storage.errors) and the client's
        # own (client.errors), one TidelogError hierarchy
        "TidelogError",
        "ClientError",
        "RequestError",
        "BrokerUnavailableError",
        "BrokerBusyError",
        "KafkaTimeoutError",
        "ClosedError",
        "BufferExhaustedError",
        "CorruptRecordError",
        "InvalidConfigError",
        "InvalidPartitionsError",
        "InvalidRequestError",
        "InvalidTopicError",
        "OffsetOutOfRangeError",
        "LogTruncationError",  # KIP-320: the consumer's truncation detection
        "OutOfOrderSequenceError",
        "RecordTooLargeError",
        "TopicAlreadyExistsError",
        "UnknownTopicOrPartitionError",
        # security (docs/security.md; DESIGN.md: AclBinding importable from client)
        "SaslAuthenticationError",
        "ResourceNotFoundError",
        "TopicAuthorizationFailedError",
        "GroupAuthorizationFailedError",
        "ClusterAuthorizationFailedError",
        "AclBinding",
        "AclFilter",
        # transactions (docs/transactions.md; DESIGN.md: Kafka's error names)
        "ConsumerGroupMetadata",
        "ProducerFencedError",
        "InvalidTxnStateError",
        "TransactionAbortableError",
        "TransactionAbortedError",
        # share groups (issue #32, docs/share-groups.md)
        "ShareConsumer",
        "AcknowledgementOutcomeUnknownError",  # an acknowledgement that may have applied
    }
    from tidelog.client import errors as client_errors
    from tidelog.storage import errors

    for name in client.__all__:
        if name.endswith("Error"):
            defined = getattr(client_errors, name, None) or getattr(errors, name)
            assert getattr(client, name) is defined
            assert issubclass(defined, errors.TidelogError)
    # Each class is defined once: the client's own are not also in the protocol's module.
    assert not set(client_errors.__all__) & set(errors.__all__)


def test_acl_values_import_from_client_as_the_contract_says() -> None:
    """DESIGN.md: ``create_acls([AclBinding(...)])`` with ``AclBinding`` importable from
    ``client``; the same classes as ``client.acls``', with the contract's defaults."""
    from tidelog.client import AclBinding, AclFilter, acls

    assert AclBinding is acls.AclBinding
    assert AclFilter is acls.AclFilter
    binding = AclBinding("User:alice", "READ", "TOPIC", "orders")
    assert (binding.pattern_type, binding.permission, binding.host) == ("LITERAL", "ALLOW", "*")
    assert AclFilter().principal is None


def _client_modules() -> list[str]:
    """Every module of ``client`` and of its command line package ``client.cli``."""
    from tidelog.client import cli

    names = {m.name for m in pkgutil.iter_modules(client.__path__, "tidelog.client.")}
    names.update(m.name for m in pkgutil.iter_modules(cli.__path__, "tidelog.client.cli."))
    return sorted(names)


@pytest.mark.parametrize("module_name", _client_modules())
def test_modules_declare_all(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = module.__all__
    assert len(exported) == len(set(exported))
    assert all(hasattr(module, name) for name in exported)


def test_topic_partition_is_frozen_hashable_and_ordered() -> None:
    tp = TopicPartition("t", 1)
    assert tp == TopicPartition("t", 1)
    assert len({tp, TopicPartition("t", 1), TopicPartition("t", 2)}) == 2
    assert sorted([TopicPartition("t", 2), TopicPartition("s", 9), tp]) == [
        TopicPartition("s", 9),
        tp,
        TopicPartition("t", 2),
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        tp.partition = 3  # type: ignore[misc]
    assert str(tp) == "t-1"


def test_record_types_are_named_tuples() -> None:
    record = ConsumerRecord("t", 0, 5, 1_000, b"k", b"v", (("h", b"x"),))
    assert record.offset == 5
    assert record[7:] == (None, None)  # sent and received default to unknown
    assert record.corrected_timestamp_ms == 1_000  # so the corrected time is the record's
    timed = record._replace(sent_timestamp_ms=10, received_timestamp_ms=25)
    assert timed.corrected_timestamp_ms == 1_015
    assert record.headers == (("h", b"x"),)
    topic, partition, offset, timestamp_ms = RecordMetadata("t", 0, 5, 1_000)
    assert (topic, partition, offset, timestamp_ms) == ("t", 0, 5, 1_000)


def test_the_client_does_not_import_the_broker() -> None:
    import subprocess
    import sys

    code = "import sys, client, client.cli; print('broker' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
