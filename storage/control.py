"""Control batches: the end-transaction markers (COMMIT, ABORT) a partition leader writes.

A transaction ends, on every partition it wrote to, with one *control batch* that the
partition's leader appends when the transaction coordinator asks (WriteTxnMarkers). Its
layout is a normal v2 batch (``storage.records``) with these fields fixed (Kafka's
``MemoryRecords.withEndTransactionMarker``, ``EndTransactionMarker``, ``ControlRecordType``):

* attributes: transactional (bit 4) and control (bit 5) set, no compression, CreateTime;
* producer id and epoch: the transaction's (under transactions v2, the bumped epoch);
* base sequence -1; exactly one record, at offset delta 0; timestamp: the broker's clock;
* record key, 4 bytes big-endian::

      0  int16  version   0
      2  int16  type      0 = ABORT, 1 = COMMIT; 2-6 are other control records (KRaft's)

* record value, 6 bytes big-endian (readers accept longer values, for later versions)::

      0  int16  version            0
      2  int32  coordinator epoch  the coordinator's epoch when it wrote the marker

A data reader skips every control record; only ABORT and COMMIT end a transaction, the
other types (which Tidelog never writes) are ignored: ``read_marker`` answers None.

Decisions (Kafka's, ``ControlRecordType.parseTypeId`` and
``EndTransactionMarker.deserializeValue``): a key shorter than 4 bytes or with a negative
version is corrupt; a newer key or value version is read as version 0 (fields are only
ever added at the end); a value shorter than 6 bytes, or a marker record without a value,
is corrupt. Pure functions on bytes, thread-safe.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from tidelog.storage.errors import CorruptRecordError

# ``storage.records`` re-exports the builder, and must be imported before it (it imports
# ``storage.batch_builder`` at its end).
from tidelog.storage.records import (
    NO_PARTITION_LEADER_EPOCH,
    NO_SEQUENCE,
    BatchBuilder,
    BatchHeader,
    decode_batch,
)

__all__ = [
    "CONTROL_KEY_VERSION",
    "CONTROL_VALUE_VERSION",
    "ControlRecordType",
    "EndTxnMarker",
    "build_marker",
    "control_record_type",
    "is_marker_batch",
    "marker_key",
    "marker_value",
    "parse_marker",
    "read_marker",
]

CONTROL_KEY_VERSION = 0
CONTROL_VALUE_VERSION = 0
_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinator epoch


class ControlRecordType(enum.IntEnum):
    """The two control record types that end a transaction (others exist: 2-6)."""

    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    """A decoded COMMIT or ABORT marker. Immutable."""

    commit: bool
    coordinator_epoch: int


def marker_key(commit: bool) -> bytes:
    """The control record key of a COMMIT (``commit``) or ABORT marker."""
    kind = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    return _KEY.pack(CONTROL_KEY_VERSION, kind)


def marker_value(coordinator_epoch: int) -> bytes:
    """The control record value: version 0 and the coordinator epoch."""
    return _VALUE.pack(CONTROL_VALUE_VERSION, coordinator_epoch)


def control_record_type(key: bytes | None) -> int:
    """The type in a control record's key (any int16: callers ignore what they do not know).

    Raises ``CorruptRecordError`` for a missing or short key, or a negative version.
    """
    if key is None or len(key) < _KEY.size:
        raise CorruptRecordError(f"control record key of {0 if key is None else len(key)} bytes")
    version, kind = _KEY.unpack_from(key)
    if version < 0:
        raise CorruptRecordError(f"control record key version {version}")
    return int(kind)


def parse_marker(key: bytes | None, value: bytes | None) -> EndTxnMarker | None:
    """The marker a control record holds, or None when it is another kind of control record.

    Raises ``CorruptRecordError`` for a malformed key, or a marker value that is missing,
    shorter than 6 bytes or of a negative version.
    """
    kind = control_record_type(key)
    if kind not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        return None
    if value is None or len(value) < _VALUE.size:
        size = 0 if value is None else len(value)
        raise CorruptRecordError(f"end-transaction marker value of {size} bytes")
    version, coordinator_epoch = _VALUE.unpack_from(value)
    if version < 0:
        raise CorruptRecordError(f"end-transaction marker value version {version}")
    return EndTxnMarker(kind == ControlRecordType.COMMIT, coordinator_epoch)


def build_marker(
    producer_id: int,
    producer_epoch: int,
    *,
    commit: bool,
    coordinator_epoch: int,
    timestamp_ms: int,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """One control batch holding one COMMIT or ABORT marker (see the module docstring).

    Raises ``ValueError`` for an out-of-range field (as ``BatchBuilder``).
    """
    builder = BatchBuilder(
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        is_transactional=True,
        is_control=True,
        partition_leader_epoch=partition_leader_epoch,
    )
    builder.append(timestamp_ms, marker_key(commit), marker_value(coordinator_epoch))
    return builder.build()


def read_marker(buf: bytes | bytearray | memoryview, position: int = 0) -> EndTxnMarker | None:
    """The marker of the control batch at ``position`` (its first record), or None.

    None for a batch that is not a transactional control batch, holds no record (the
    cleaner may leave one empty) or holds another kind of control record. Raises
    ``CorruptRecordError`` for bytes that do not decode.
    """
    header, records = decode_batch(buf, position, validate=False)
    if not is_marker_batch(header) or not records:
        return None
    first = records[0]
    return parse_marker(first.key, first.value)


def is_marker_batch(header: BatchHeader) -> bool:
    """Whether ``header`` is a control batch that may hold an end-transaction marker."""
    return header.is_control and header.is_transactional
