"""The audit log: one JSON line per security event (who, what, when, from where).

``audit(event)`` is the one entry point, for every listener and every security
component: authentication failures and user changes (``broker.core.auth``,
``broker.grpc.security_service``), and authorization denials and ACL changes (the
authorizer). Each event is a flat dict; the function adds ``time`` (ISO 8601, UTC,
milliseconds) when the event has none, and writes it as one JSON line (keys sorted) to
the ``tidelog.audit`` logger at INFO. Events never carry a password or a credential:
callers pass names, principals, addresses and outcomes.

Conventional keys: ``event`` (``authentication_failed``, ``user_upserted``,
``user_deleted``, ``authorization_denied``, ``acl_created``, ``acl_deleted``), ``principal``
(who: ``User:NAME`` or None), ``peer``/``host`` (from where), ``listener``, ``mechanism``,
``user`` (the user acted on), ``reason``.

Where the lines go: the ``tidelog.audit`` logger propagates to the process's logging like
any other; the broker setting ``audit.log.file`` additionally appends the bare JSON lines
to a file (``configure_file``), which is what an auditor reads.

Thread-safe (``logging`` is).
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["AUDIT_LOGGER_NAME", "audit", "configure_file"]

AUDIT_LOGGER_NAME = "tidelog.audit"

_log = logging.getLogger(AUDIT_LOGGER_NAME)
_files_lock = threading.Lock()
_files: dict[str, logging.Handler] = {}  # guarded by _files_lock: path -> its handler


def audit(event: dict[str, Any]) -> None:
    """Write ``event`` as one JSON line to the audit log (adds ``time`` if absent).

    Values that JSON cannot carry are written as their ``str``. Never raises for a bad
    value: an audit line that cannot be written is logged as an error instead.
    """
    line = dict(event)
    line.setdefault(
        "time", datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )
    try:
        text = json.dumps(line, sort_keys=True, default=str, separators=(",", ":"))
    except (TypeError, ValueError):
        _log.error("unserialisable audit event with keys %s", sorted(line))
        return
    _log.info("%s", text)


def configure_file(path: str | Path) -> None:
    """Also append audit lines to ``path`` (one bare JSON line each). Idempotent per path."""
    key = str(Path(path).resolve())
    with _files_lock:
        if key in _files:
            return
        handler = logging.FileHandler(key, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.setLevel(logging.INFO)
        _log.addHandler(handler)
        if _log.level == logging.NOTSET or _log.level > logging.INFO:
            _log.setLevel(logging.INFO)
        _files[key] = handler
