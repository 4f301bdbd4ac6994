"""Type stub of the optional C extension ``client/cdc/_pgnative.c`` (its docstring has
the contract)."""

from collections.abc import Callable
from typing import Any

EncodeChange = Callable[[bytes, dict[int, Any], bytes, list[Any]], bool]

def encode_change(
    payload: bytes, specs: dict[int, Any], source_head: bytes, records: list[Any]
) -> bool: ...
