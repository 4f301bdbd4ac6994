"""Column builders for ``Consumer.poll_columns``: records as Arrow-layout buffers.

Re-exported from ``storage.columns`` (which documents the layout), so readers that want
columns (the Spark source) need nothing below the client: make a builder with
``new_column_builder``, fill it with ``Consumer.poll_columns``, read it out with
``finish_columns``. The builder is the C extension's when it is built
(``NATIVE_COLUMNS``); the pure-Python one is its reference, correct but slower than
``Consumer.poll`` and a conversion of the records.
"""

from __future__ import annotations

from tidelog.storage.columns import ColumnBuffers, ColumnBuilder, finish_columns, new_column_builder
from tidelog.storage.native import NATIVE as NATIVE_COLUMNS

__all__ = [
    "NATIVE_COLUMNS",
    "ColumnBuffers",
    "ColumnBuilder",
    "finish_columns",
    "new_column_builder",
]
