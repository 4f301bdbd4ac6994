"""How the broker classifies an error for a client, whatever the wire: the listener-neutral
half of the error contract (the renderings live with their listeners).

``classify(exc)`` turns any exception into an ``Outcome``: the stable code string of
``storage.errors``' hierarchy, whether a client may retry, and the message it may see.
The gRPC listener renders it as a status plus the code in trailing metadata
(``broker.grpc.errors``); the Kafka listener as Kafka's numeric error code
(``broker.kafka.errors``). Errors of one partition inside an answer carry the same code
strings in ``error_code`` (``partition_error``).

What a client sees of an error:

- request errors (``RequestError`` and below), limits reached (``BrokerBusyError``) and
  replication timeouts (``KafkaTimeoutError``): the code and the error's message, which
  describes the request, never the broker's internals (cut to ``MAX_MESSAGE_CHARS``);
- storage faults (``StorageError``): the code and a fixed message; the detail goes to the
  broker's log only;
- anything else (a bug, or a client-side error raised in the broker): the code
  ``INTERNAL`` and no detail; logged with its traceback.

A broker that is shutting down classifies new calls with no code at all
(``ShuttingDownError``: ``Outcome.code`` is None), so that each listener answers exactly
what a client sees when the broker is gone (gRPC: ``UNAVAILABLE`` without the metadata
key).

This module imports no wire type (``tests/test_architecture.py``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from tidelog.storage.errors import (
    BrokerBusyError,
    BrokerUnavailableError,
    InternalError,
    KafkaTimeoutError,
    LogDirFullError,
    RequestError,
    StorageError,
)

__all__ = [
    "MAX_MESSAGE_CHARS",
    "Outcome",
    "ShuttingDownError",
    "classify",
    "partition_error",
]

log = logging.getLogger(__name__)

_STORAGE_MESSAGE = "the broker could not read or write its log directory"
# A message quotes the request (a topic name, a config value), and travels as the
# grpc-message trailer: gRPC refuses trailers over 16 KiB on the client's side, so a
# request with a 70 KB name would be answered "received metadata size exceeds hard
# limit" instead of its error. Messages are cut to this many characters.
MAX_MESSAGE_CHARS = 1_000
_DISK_FULL_LOG_EVERY_S = 1.0
_INTERNAL_MESSAGE = "internal broker error"


class ShuttingDownError(Exception):
    """The broker is stopping and takes no new work. Not a ``TidelogError``: it never
    travels as a code string, only as the transport's "unavailable"."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a client may learn of an error, in no wire's terms.

    Attributes:
        code: the stable code string (``storage.errors``); None: no code is sent (the
            broker is shutting down: the transport's own "unavailable" says it).
        retriable: the client may retry the request as it is.
        message: the safe message (never a path, a traceback or internal state).
    """

    code: str | None
    retriable: bool
    message: str


def classify(exc: BaseException) -> Outcome:
    """Classify any exception for a client, logging what the client may not see.

    Request errors keep their message; storage faults and unexpected exceptions are logged
    here (with traceback) and classified with a fixed message. Call it once per error: it
    logs.
    """
    if isinstance(exc, ShuttingDownError):
        return Outcome(None, True, str(exc))
    # BrokerUnavailableError raised here: a broker's own dependency (ZooKeeper, the
    # controller, its view of the cluster) is not there yet; retriable, as Kafka's
    # answers in those states are (issue #29: answered INTERNAL, a producer asking for
    # its id from a broker still joining failed for good).
    if isinstance(exc, RequestError | BrokerBusyError | KafkaTimeoutError | BrokerUnavailableError):
        return Outcome(exc.code, exc.retriable, _bounded(str(exc) or exc.code))
    if isinstance(exc, LogDirFullError):
        # Expected while the disk is full, and retried by every producer: a traceback
        # per refused produce would flood the log (on that same disk, often). One
        # line at most every second says it.
        _log_disk_full(exc)
        return Outcome(exc.code, exc.retriable, _STORAGE_MESSAGE)
    if isinstance(exc, StorageError):
        log.error("storage fault answered as %s", exc.code, exc_info=exc)
        return Outcome(exc.code, exc.retriable, _STORAGE_MESSAGE)
    log.error("unexpected error answered as INTERNAL", exc_info=exc)
    return Outcome(InternalError.code, False, _INTERNAL_MESSAGE)


_disk_full_logged_at = [0.0]  # monotonic seconds of the last line (a race logs twice)


def _log_disk_full(exc: LogDirFullError) -> None:
    now = time.monotonic()
    if now - _disk_full_logged_at[0] >= _DISK_FULL_LOG_EVERY_S:
        _disk_full_logged_at[0] = now
        log.error("log directory full, produce refused with LOG_DIR_FULL: %s", exc)


def _bounded(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 30] + f"... ({len(message)} characters)"


def partition_error(exc: BaseException) -> tuple[str, str]:
    """``(error_code, error_message)`` for one partition's result inside an answer."""
    outcome = classify(exc)
    return outcome.code or InternalError.code, outcome.message
