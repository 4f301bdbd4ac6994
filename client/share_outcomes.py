"""Acknowledgements whose outcome a share consumer cannot know (``ShareConsumer``).

A request carrying acknowledgements that got no answer (``BrokerUnavailableError`` from a
broker that died, a broken share fetch stream, a timeout) may have been applied. The
consumer keeps them and sends them again (a retriable failure, as Kafka's). If the
first one was applied, the second is refused: the member no longer holds the records
(``InvalidRecordStateError``), exactly what the broker answers for acknowledgements
that were never applied because the lock had expired. Reporting that refusal as the
outcome would say "not applied" of an ACCEPT that was (the fault harness's share checker
caught it after a SIGKILL). ``UnsureAcknowledgements`` remembers which offsets went out
in an unanswered request, and a later refusal of any of them is reported as
``AcknowledgementOutcomeUnknownError`` (its cause the unanswered request's error). A
success is a success either way; an offset leaves the record once settled.
"""

from __future__ import annotations

from collections.abc import Iterable

from tidelog.client.errors import AcknowledgementOutcomeUnknownError
from tidelog.client.types import TopicPartition
from tidelog.storage.errors import InvalidRecordStateError, TidelogError

__all__ = ["UnsureAcknowledgements"]


class UnsureAcknowledgements:
    """Offsets per partition last sent in a request without an answer, with its error.
    Not thread-safe: the consumer calls it under its acknowledgement lock."""

    def __init__(self) -> None:
        self._unsure: dict[TopicPartition, dict[int, TidelogError]] = {}

    def unanswered(self, tp: TopicPartition, offsets: Iterable[int], error: TidelogError) -> None:
        """``offsets`` of ``tp`` went out in a request that got no answer (``error``)."""
        known = self._unsure.setdefault(tp, {})
        for offset in offsets:
            known.setdefault(offset, error)

    def outcome(
        self, tp: TopicPartition, offsets: Iterable[int], error: TidelogError | None
    ) -> TidelogError | None:
        """The outcome to report for ``offsets`` of ``tp`` settled with ``error`` (None:
        applied): a refusal of offsets an unanswered request carried is unknown."""
        known = self._unsure.get(tp)
        if not known:
            return error
        earlier: TidelogError | None = None
        for offset in offsets:
            found = known.pop(offset, None)
            earlier = earlier or found
        if not known:
            del self._unsure[tp]
        if earlier is None or not isinstance(error, InvalidRecordStateError):
            return error
        unknown = AcknowledgementOutcomeUnknownError(
            f"{tp}: acknowledgements sent in a request that got no answer ({earlier}) and "
            f"refused when sent again ({error}): they may have been applied"
        )
        unknown.__cause__ = earlier
        return unknown
