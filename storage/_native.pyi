"""Types of the C extension ``storage._native`` (``storage/_native.c``)."""

from collections.abc import Sequence
from typing import Any, TypeVar

_Buffer = bytes | bytearray | memoryview
_Row = TypeVar("_Row", bound=tuple[Any, ...])
_T = TypeVar("_T")

def decode_records(
    buf: _Buffer,
    start: int,
    end: int,
    count: int,
    base_offset: int,
    base_timestamp: int,
    append_time: int | None,
    last_offset_delta: int,
    batch_position: int,
    row_type: type[_Row],
    prefix: tuple[Any, Any] | None,
    times: tuple[int | None, int | None] | None = None,
    /,
) -> list[_Row]: ...
def encode_records_into(
    out: bytearray,
    timestamps: Sequence[int],
    keys: Sequence[_Buffer | None],
    values: Sequence[_Buffer | None],
    headers: Sequence[Sequence[tuple[str, _Buffer | None]]],
    base_timestamp: int,
    first_delta: int,
    /,
) -> None: ...
def murmur2(data: _Buffer, /) -> int: ...
def murmur2_partitions(keys: Sequence[_Buffer], partitions: int, /) -> list[int]: ...
def new_untracked(cls: type[_T], /) -> _T: ...
def track_all(objects: Sequence[object], /) -> None: ...

class ColumnBuilder:
    def __init__(self, include_headers: bool = False) -> None: ...
    @property
    def rows(self) -> int: ...
    @property
    def data_bytes(self) -> int: ...
    @property
    def last_offset(self) -> int | None: ...
    @property
    def include_headers(self) -> bool: ...
    def append_records(
        self,
        buf: _Buffer,
        start: int,
        end: int,
        count: int,
        base_offset: int,
        base_timestamp: int,
        append_time: int | None,
        last_offset_delta: int,
        batch_position: int,
        min_offset: int,
        /,
    ) -> int: ...
    def finish(self) -> tuple[Any, ...]: ...
