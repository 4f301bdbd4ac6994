"""Which record codec runs: the C extension ``storage._native`` or the pure-Python one.

``storage/_native.c`` (built by ``setup.py`` as an optional extension) carries the hot
loops of the record format: decoding records into tuples or into Arrow-layout columns,
encoding a batch's records, and murmur2. The pure-Python code in ``storage.records``,
``storage.batch_builder``, ``storage.columns`` and ``client.partitioner`` stays the
reference and the fallback: the differential tests hold both to the same results.

The pure path runs when the extension is missing (no C compiler when the package was
installed: setuptools warns and installs the rest) or when ``TIDELOG_PURE_PYTHON`` is set
to anything but ``""``/``"0"``. Read here, at import, and not at a command-line entry
point as other settings are: the codec is chosen once per process, below every entry
point (broker, clients, Spark executors), and an executor has no command line of ours.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

__all__ = ["NATIVE", "PURE_REASON", "native"]

PURE_REASON: str | None = None
"""Why the pure-Python codec runs (None when the extension does)."""

# ``native`` is typed as the extension module (its stub, ``_native.pyi``) though it is None
# on the pure path: callers test ``NATIVE`` first, and mypy then checks every call.
if TYPE_CHECKING:
    from tidelog.storage import _native as native
elif os.environ.get("TIDELOG_PURE_PYTHON", "") not in ("", "0"):
    PURE_REASON = "TIDELOG_PURE_PYTHON is set"
    native = None
else:
    try:
        from tidelog.storage import _native as native
    except ImportError as exc:  # not built: no compiler when the package was installed
        PURE_REASON = f"the C extension storage._native is not built ({exc})"
        native = None

NATIVE: bool = PURE_REASON is None
"""True when ``native`` is the C extension. Callers test this flag, then use ``native``."""
