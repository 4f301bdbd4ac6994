"""Checks the hostile-input tests share: how a call was answered, and the log read back."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import Message

from tidelog.broker.grpc.errors import ERROR_CODE_METADATA_KEY
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import CorruptRecordError
from tidelog.storage.records import decode_batch, iter_batch_headers

# Codes a hostile request must never provoke: each means the broker failed, not the request.
FAULT_CODES = frozenset(
    {"INTERNAL", "UNKNOWN_SERVER_ERROR", "KAFKA_STORAGE_ERROR", "STORAGE_ERROR"}
)
READ_TIMEOUT_S = 30.0


@dataclass
class Tally:
    """How calls were answered, by outcome (``OK``, a code string, or a bare status).
    Thread-safe (``record``)."""

    outcomes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def calls(self) -> int:
        return sum(self.outcomes.values())

    def record(self, outcome: str, problems: list[str]) -> None:
        with self._lock:
            self.outcomes[outcome] += 1
            self.problems += problems


def error_code(error: grpc.RpcError) -> str | None:
    for item in error.trailing_metadata() or ():  # type: ignore[attr-defined]
        if item.key == ERROR_CODE_METADATA_KEY:
            return str(item.value)
    return None


def answer_problem(error: grpc.RpcError) -> str | None:
    """What is wrong with how the broker ended a call (None: a clear error)."""
    status = error.code()  # type: ignore[attr-defined]
    code = error_code(error)
    if code is None:
        # gRPC itself refuses a message over socket.request.max.bytes, before any handler.
        if status == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return None
        return f"{status.name} without an error code: {error.details()!r}"  # type: ignore[attr-defined]
    if status == grpc.StatusCode.INTERNAL or code in FAULT_CODES:
        return f"{status.name} {code}: {error.details()!r}"  # type: ignore[attr-defined]
    return None


def partition_faults(message: Message) -> list[str]:
    """Every ``error_code`` inside an answer that names a broker fault."""
    faults = []
    for descriptor, value in message.ListFields():
        if descriptor.name == "error_code" and value in FAULT_CODES:
            faults.append(f"{type(message).__name__}: {value}")
        elif descriptor.message_type is not None:
            if descriptor.message_type.GetOptions().map_entry:
                continue
            items = value if descriptor.is_repeated else [value]
            for item in items:
                faults += partition_faults(item)
    return faults


def check_call(tally: Tally, what: Callable[[], str], call: Callable[[], Any]) -> None:
    """Make one call and record how it was answered (problems in ``tally.problems``,
    described by ``what()``)."""
    try:
        answer = call()
    except grpc.RpcError as error:
        problem = answer_problem(error)
        outcome = error_code(error) or error.code().name  # type: ignore[attr-defined]
        tally.record(outcome, [f"{what()}: {problem}"] if problem else [])
        return
    faults = []
    for item in answer if isinstance(answer, list) else [answer]:
        if isinstance(item, Message):
            faults += partition_faults(item)
    tally.record("OK", [f"{what()}: {fault}" for fault in faults])


# Request bytes outstanding at most (a larger request goes alone). Calls of a few huge
# requests (a 70,000-character name repeated 2,000 times, and its three broken copies)
# held in a window of 64 took this test process past 8 GiB on a loaded machine, where
# the broker answers them slowly (tests/conftest.py's watchdog stopped it).
WINDOW_BYTES = 256 * 1024 * 1024


class Sender:
    """Calls made on a few threads while hypothesis draws the next inputs (drawing costs
    as much as a call). At most ``window`` calls, and ``window_bytes`` of their requests,
    are outstanding. Not thread-safe: one thread sends."""

    def __init__(
        self, tally: Tally, *, workers: int = 4, window: int = 64, window_bytes: int = WINDOW_BYTES
    ) -> None:
        self._tally = tally
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="fuzz")
        self._window = window
        self._window_bytes = window_bytes
        self._room = threading.Condition()
        self._calls = 0
        self._bytes = 0

    def send(self, what: Callable[[], str], call: Callable[[], Any], size_bytes: int = 0) -> None:
        """Send ``call`` (its request ``size_bytes`` long) once there is room for it."""
        with self._room:
            self._room.wait_for(
                lambda: (
                    self._calls < self._window
                    and (self._calls == 0 or self._bytes + size_bytes <= self._window_bytes)
                )
            )
            self._calls += 1
            self._bytes += size_bytes

        def run() -> None:
            try:
                check_call(self._tally, what, call)
            finally:
                with self._room:
                    self._calls -= 1
                    self._bytes -= size_bytes
                    self._room.notify_all()

        self._pool.submit(run)

    def close(self) -> None:
        """Wait for every call sent."""
        self._pool.shutdown(wait=True)


def mutations(raw: bytes) -> list[bytes]:
    """Cheap malformed variants of a serialized request: cut in half, one byte flipped,
    one byte dropped (deterministic: no drawing)."""
    if len(raw) < 2:
        return [raw + b"\xff"]
    flipped = bytearray(raw)
    flipped[len(raw) * 37 // 100] ^= 0xA5
    middle = len(raw) // 3
    return [raw[: len(raw) // 2], bytes(flipped), raw[:middle] + raw[middle + 1 :]]


@dataclass
class ReadBack:
    partitions: int = 0
    batches: int = 0
    records: int = 0
    corrupt_batches: list[str] = field(default_factory=list)  # stored, refused by readers
    problems: list[str] = field(default_factory=list)


def read_everything(stub: pb_grpc.BrokerStub) -> ReadBack:
    """Fetch every partition of every topic from its log start to its high watermark,
    validate every batch (framing and CRC) and decode it.

    A batch whose framing or CRC is broken, a gap the fetch cannot cross, or a decoder
    failing with anything but ``CorruptRecordError`` is a problem. A CRC-valid batch whose
    records do not decode (the broker stores batches without decoding them, by design) is
    listed in ``corrupt_batches``: readers refuse it with a clear error.
    """
    result = ReadBack()
    topics = stub.ListTopics(pb.ListTopicsRequest(include_internal=True), timeout=READ_TIMEOUT_S)
    for summary in topics.topics:
        description = stub.DescribeTopic(
            pb.DescribeTopicRequest(name=summary.name), timeout=READ_TIMEOUT_S
        )
        for partition in description.partitions:
            result.partitions += 1
            _read_partition(stub, summary.name, partition, result)
    return result


def _read_partition(
    stub: pb_grpc.BrokerStub, topic: str, partition: pb.PartitionDescription, result: ReadBack
) -> None:
    where = f"{topic}-{partition.partition}"
    offset = partition.log_start_offset
    end = partition.high_watermark
    while offset < end:
        response = stub.Fetch(
            pb.FetchRequest(
                max_bytes=64 * 1024 * 1024,
                partitions=[
                    pb.FetchPartition(
                        topic=topic,
                        partition=partition.partition,
                        fetch_offset=offset,
                        partition_max_bytes=16 * 1024 * 1024,
                    )
                ],
            ),
            timeout=READ_TIMEOUT_S,
        )
        answer = response.results[0]
        if answer.error_code:
            result.problems.append(f"{where} at {offset}: {answer.error_code}")
            return
        if not answer.records:
            result.problems.append(f"{where}: no bytes at {offset} below {end}")
            return
        try:
            headers = list(iter_batch_headers(answer.records, validate=True))
        except CorruptRecordError as exc:
            result.problems.append(f"{where} at {offset}: stored bytes broken: {exc}")
            return
        for position, header in headers:
            result.batches += 1
            try:
                _, records = decode_batch(answer.records, position)
                result.records += len(records)
            except CorruptRecordError as exc:
                result.corrupt_batches.append(f"{where}@{header.base_offset}: {exc}")
            except Exception as exc:
                result.problems.append(f"{where}@{header.base_offset}: decoder {exc!r}")
            offset = max(offset, header.last_offset + 1)
