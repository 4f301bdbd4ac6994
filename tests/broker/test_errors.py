"""The error table: every broker-side error has a status; nothing internal leaks."""

from __future__ import annotations

import logging

import grpc
import pytest

from tidelog.broker.core.errors import ShuttingDownError, classify, partition_error
from tidelog.broker.grpc.errors import STATUS_BY_CODE, STATUS_BY_ERROR, to_wire
from tidelog.storage import errors
from tidelog.storage.errors import (
    ClientError,
    TidelogError,
)


def _concrete_broker_side_errors() -> list[type[TidelogError]]:
    out = []
    for name in errors.__all__:
        cls = getattr(errors, name)
        if (
            isinstance(cls, type)
            and issubclass(cls, TidelogError)
            and cls is not TidelogError
            and not issubclass(cls, ClientError)
        ):
            out.append(cls)
    return out


@pytest.mark.parametrize("cls", _concrete_broker_side_errors(), ids=lambda c: c.__name__)
def test_every_broker_error_has_its_own_row(cls: type[TidelogError]) -> None:
    assert cls in STATUS_BY_ERROR, f"{cls.__name__} needs a row in STATUS_BY_ERROR"
    wire = to_wire(cls("detail"))
    assert wire.code == cls.code
    assert wire.status == STATUS_BY_ERROR[cls]
    assert wire.status != grpc.StatusCode.OK


def test_request_errors_keep_their_message() -> None:
    wire = to_wire(errors.OffsetOutOfRangeError("offset 9 is past the end 3"))
    assert (wire.status, wire.code) == (grpc.StatusCode.OUT_OF_RANGE, "OFFSET_OUT_OF_RANGE")
    assert wire.message == "offset 9 is past the end 3"
    assert to_wire(errors.TopicAlreadyExistsError("x")).status == grpc.StatusCode.ALREADY_EXISTS
    assert to_wire(errors.UnknownTopicOrPartitionError("x")).status == grpc.StatusCode.NOT_FOUND


def test_storage_faults_hide_their_details(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="tidelog.broker.core.errors"):
        wire = to_wire(errors.StorageError("/secret/path/00000.log: EIO"))
    assert wire.code == "KAFKA_STORAGE_ERROR"
    assert "/secret" not in wire.message
    assert "/secret/path" in caplog.text  # the operator still sees it
    full = to_wire(errors.LogDirFullError("/secret/path"))
    assert (full.status, full.code) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "LOG_DIR_FULL")
    assert "/secret" not in full.message


def test_unexpected_exceptions_become_internal_without_detail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="tidelog.broker.core.errors"):
        wire = to_wire(KeyError("internal-state-name"))
    assert (wire.status, wire.code) == (grpc.StatusCode.INTERNAL, "INTERNAL")
    assert "internal-state-name" not in wire.message
    assert "internal-state-name" in caplog.text
    assert partition_error(ValueError("x"))[0] == "INTERNAL"


def test_a_client_side_error_raised_in_the_broker_is_a_bug() -> None:
    wire = to_wire(errors.ClientError("no answer"))
    assert (wire.status, wire.code) == (grpc.StatusCode.INTERNAL, "INTERNAL")


def test_a_dependency_of_the_broker_not_there_yet_is_retriable() -> None:
    """Issue #29: a broker still joining its cluster (or without ZooKeeper) raises
    BrokerUnavailableError; answered INTERNAL, a producer asking it for an id failed for
    good. It is retriable, and the client rebuilds the same retriable class."""
    outcome = classify(errors.BrokerUnavailableError("broker 1 is joining the cluster"))
    assert (outcome.code, outcome.retriable) == ("BROKER_UNAVAILABLE", True)
    wire = to_wire(errors.BrokerUnavailableError("broker 1 is joining the cluster"))
    assert (wire.status, wire.code) == (grpc.StatusCode.UNAVAILABLE, "BROKER_UNAVAILABLE")
    rebuilt = errors.error_for_code("BROKER_UNAVAILABLE")
    assert type(rebuilt) is errors.BrokerUnavailableError
    assert rebuilt.retriable


def test_shutting_down_is_unavailable_without_a_code() -> None:
    wire = to_wire(ShuttingDownError("stopping"))
    assert wire.status == grpc.StatusCode.UNAVAILABLE
    assert wire.code is None


def test_a_code_has_one_status_so_the_grpc_table_reads_by_code() -> None:
    # Rows may share a code (RequestError and InvalidRequestError), never with two statuses.
    for cls, status in STATUS_BY_ERROR.items():
        assert STATUS_BY_CODE[cls.code] == status, cls.__name__


def test_the_classification_is_wire_free() -> None:
    outcome = classify(errors.OffsetOutOfRangeError("offset 9 is past the end 3"))
    assert (outcome.code, outcome.message) == ("OFFSET_OUT_OF_RANGE", "offset 9 is past the end 3")
    assert outcome.retriable == errors.OffsetOutOfRangeError.retriable
    assert classify(ShuttingDownError("stopping")).code is None
    assert classify(KeyError("x")).code == "INTERNAL"
