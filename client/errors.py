"""The errors only the client library raises: no broker ever sends them, so they are not
part of the protocol's vocabulary (``storage.errors``, which both sides share) and
``error_for_code`` does not know them. All are ``TidelogError`` subclasses: one
``except TidelogError`` still catches everything the client raises.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidelog.client.types import TopicPartition
from tidelog.storage.errors import ClientError, OffsetOutOfRangeError

__all__ = [
    "AcknowledgementOutcomeUnknownError",
    "BufferExhaustedError",
    "ClosedError",
    "LogTruncationError",
    "TransactionAbortedError",
]


class ClosedError(ClientError):
    """The object was closed by its owner; it will not work again."""

    code = "CLOSED"


class BufferExhaustedError(ClientError):
    """The producer's buffer stayed full for ``max_block_ms``."""

    code = "BUFFER_EXHAUSTED"
    retriable = True


class TransactionAbortedError(ClientError):
    """The record was not sent: its transaction was aborted first (``abort_transaction``,
    or an earlier failure that made the transaction abortable). Kafka's
    ``TransactionAbortedException``."""

    code = "TRANSACTION_ABORTED"


class AcknowledgementOutcomeUnknownError(ClientError):
    """A share consumer's acknowledgements may or may not have been applied: a request
    carrying them got no answer (the broker died, the stream broke, the call timed out)
    and the broker refused them when they went again (``InvalidRecordStateError``: the
    member no longer holds the records), which is what it says of acknowledgements it
    applied the first time too. Not retriable: sending them again cannot tell. The
    error of the unanswered request is ``__cause__``. Kafka's share consumer reports the
    refusal itself; Tidelog does not claim "not applied" where it cannot know."""

    code = "ACKNOWLEDGEMENT_OUTCOME_UNKNOWN"


class LogTruncationError(OffsetOutOfRangeError):
    """The log was truncated under the consumer's position (KIP-320; Kafka's
    ``LogTruncationException``): a leader change cut records the consumer had already
    read, so reading on from its position would skip what replaced them.

    Raised by the consumer (never sent by a broker) when it validates a position with
    OffsetForLeaderEpoch and has no ``auto_offset_reset`` policy (``'none'``).
    ``divergent_offsets`` maps each truncated partition to the first offset that may
    differ (where to ``seek`` to read the new records), None where the leader could not
    tell (no common leader epoch). A subclass of ``OffsetOutOfRangeError``, as in Kafka.
    """

    code = "LOG_TRUNCATION"

    def __init__(
        self,
        message: str = "",
        divergent_offsets: Mapping[TopicPartition, int | None] | None = None,
    ) -> None:
        super().__init__(message)
        self.divergent_offsets: dict[TopicPartition, int | None] = dict(divergent_offsets or {})
