"""The consumer's position lookups: where a partition without a position starts, and
whether a held position is still valid after a leader change (KIP-320).

``PositionLookups.update`` gives every partition awaiting a position one: the group's
committed offset (with ``group_id``; validated before it is fetched when it carries a
leader epoch), else ``auto_offset_reset`` (ListOffsets earliest or latest; ``none`` raises
``OffsetOutOfRangeError``). ``validate`` asks each leader where a position's epoch ends
(``OffsetForLeaderEpoch``, ``client.fetcher.check_position``): a valid position is fetched
again, a truncated one moves back to the first offset that may differ (unknown: reset by
``auto_offset_reset``), and with ``none`` ``LogTruncationError`` is raised until the
application seeks. A broker without the API leaves positions unchecked, as Kafka's
consumer does. Answers are applied only to partitions not reassigned or sought
meanwhile (the state's ``epoch`` is compared). An assigned topic missing from the
metadata is looked into every ``MISSING_TOPIC_RECHECK_MS``, and a refusal no retry can
cure (not authorized, an illegal name) is raised from ``poll``.

With ``raise_retriable`` False (``poll``), a retriable failure is logged and
``retry_at`` set one ``retry_backoff_ms`` ahead instead of raising.

Not thread-safe: the consumer's thread calls it (as the ``Consumer`` is used), taking
the consumer's ``lock`` around the subscription state, which the fetch session's threads
share.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping

from tidelog.client.config import ISOLATION_LEVELS, ConsumerConfig
from tidelog.client.connection import CommittedOffset
from tidelog.client.errors import LogTruncationError
from tidelog.client.fetcher import SubscriptionState, check_position
from tidelog.client.offsets import (
    fetch_committed_offsets,
    list_offsets,
    offsets_for_leader_epochs,
)
from tidelog.client.routing import ClusterConnections
from tidelog.client.topic_errors import first_refusal, topic_errors
from tidelog.client.types import TopicPartition
from tidelog.storage.errors import (
    InvalidRequestError,
    OffsetOutOfRangeError,
    TidelogError,
    UnknownTopicOrPartitionError,
)

__all__ = [
    "EARLIEST",
    "LATEST",
    "MISSING_TOPIC_RECHECK_MS",
    "PositionLookups",
    "monotonic_ms",
]

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1
MISSING_TOPIC_RECHECK_MS = 500


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class PositionLookups:
    """Position lookups and validation for one ``Consumer``."""

    def __init__(
        self,
        config: ConsumerConfig,
        connections: ClusterConnections,
        subscriptions: SubscriptionState,
        lock: threading.Lock,
    ) -> None:
        self._config = config
        self._connections = connections
        self._subscriptions = subscriptions
        self._lock = lock
        self.retry_at = 0  # no lookup from ``poll`` before this (monotonic ms)
        self._refusal_check_at = 0  # when to look again for assigned topics refused

    def update(self, deadline_ms: int, *, raise_retriable: bool) -> None:
        """Give every partition without a position one (committed offset or reset)."""
        with self._lock:
            states = self._subscriptions.partitions
            needs = {
                tp: (states[tp].reset, states[tp].epoch)
                for tp in self._subscriptions.needs_position()
            }
        if not needs:
            return
        timeout_ms = max(deadline_ms - monotonic_ms(), 1)
        try:
            committed: dict[TopicPartition, CommittedOffset] = {}
            undecided = [tp for tp, (reset, _) in needs.items() if reset is None]
            if self._config.group_id is not None and undecided:
                committed = self.fetch_committed(undecided, timeout_ms, tolerate_unsupported=True)
            targets: dict[TopicPartition, int] = {}
            for tp, (reset, _) in needs.items():
                if reset is None and tp in committed:
                    continue
                strategy = reset or self._config.auto_offset_reset
                if strategy == "none":
                    raise OffsetOutOfRangeError(
                        f"{tp} has no committed offset and auto_offset_reset is 'none'"
                    )
                targets[tp] = EARLIEST if strategy == "earliest" else LATEST
            found = (
                self.list_offsets(targets, max(deadline_ms - monotonic_ms(), 1)) if targets else {}
            )
        except TidelogError as exc:
            if isinstance(exc, UnknownTopicOrPartitionError):
                self.check_assigned_topics(monotonic_ms(), timeout_ms)
            if raise_retriable or not exc.retriable:
                raise
            log.info("could not look up positions yet: %s", exc)
            self.retry_at = monotonic_ms() + self._config.retry_backoff_ms
            return
        with self._lock:
            for tp, (_, epoch) in needs.items():
                state = self._subscriptions.partitions.get(tp)
                if state is None or state.epoch != epoch or state.position is not None:
                    continue  # reassigned or sought meanwhile
                if tp in committed:
                    # With its committed leader epoch, checked before it is fetched.
                    at = committed[tp]
                    self._subscriptions.seek(tp, at.offset, at.leader_epoch, validate=True)
                    log.debug("position of %s set to %s", tp, at)
                    continue
                offset = found.get(tp)
                if offset is None:
                    continue
                self._subscriptions.seek(tp, offset)
                log.debug("position of %s set to %d", tp, offset)

    def validate(self, deadline_ms: int, *, raise_retriable: bool) -> None:
        """Check the positions awaiting validation against their leaders (KIP-320).

        Valid ones are fetched again; a truncated one moves back to the first offset that
        may differ (unknown: reset by ``auto_offset_reset``), or with ``'none'`` raises
        ``LogTruncationError`` and stays awaiting validation until the application seeks.
        """
        with self._lock:
            wanted = self._subscriptions.needs_validation()
            versions = {tp: self._subscriptions.partitions[tp].epoch for tp in wanted}
        if not wanted:
            return
        try:
            answers = offsets_for_leader_epochs(
                self._connections,
                {tp: (epoch, -1) for tp, (_, epoch) in wanted.items()},
                max(deadline_ms - monotonic_ms(), 1),
            )
        except InvalidRequestError as exc:
            # A broker from before OffsetForLeaderEpoch (UNIMPLEMENTED): the positions
            # cannot be checked, so they are read on, as Kafka's consumer does with a
            # broker that lacks the API.
            log.warning("cannot validate positions (%s): reading on unchecked", exc)
            with self._lock:
                for tp in wanted:
                    state = self._subscriptions.partitions.get(tp)
                    if state is not None and state.epoch == versions[tp]:
                        self._subscriptions.validated(tp)
            return
        except TidelogError as exc:
            if raise_retriable or not exc.retriable:
                raise
            log.info("could not validate positions yet: %s", exc)
            self.retry_at = monotonic_ms() + self._config.retry_backoff_ms
            return
        strategy = self._config.auto_offset_reset
        truncated: dict[TopicPartition, int | None] = {}
        with self._lock:
            for tp, answer in answers.items():
                state = self._subscriptions.partitions.get(tp)
                if state is None or state.epoch != versions[tp] or not state.awaiting_validation:
                    continue  # reassigned, sought or validated meanwhile
                position, _ = wanted[tp]
                found = check_position(position, answer.leader_epoch, answer.end_offset)
                if found is None:
                    self._subscriptions.validated(tp)
                elif strategy == "none":
                    truncated[tp] = found.divergent_offset
                elif found.divergent_offset is not None:
                    log.warning(
                        "%s: the log was truncated under offset %d; reading on from %d",
                        tp,
                        position,
                        found.divergent_offset,
                    )
                    self._subscriptions.seek(tp, found.divergent_offset, found.divergent_epoch)
                else:
                    log.warning(
                        "%s: the log was truncated under offset %d at an unknown offset; "
                        "resetting to %s",
                        tp,
                        position,
                        strategy,
                    )
                    self._subscriptions.request_reset(tp, strategy)
        if truncated:
            described = ", ".join(
                f"{tp} at {wanted[tp][0]} (first divergent offset {offset})"
                for tp, offset in sorted(truncated.items())
            )
            raise LogTruncationError(
                f"the log was truncated under the position of {described} and "
                "auto_offset_reset is 'none'; seek to go on",
                dict(truncated),
            )

    def check_assigned_topics(self, now: int, timeout_ms: int) -> None:
        """Raise ``_raise_refused_topics``'s error for an assigned topic missing from the
        metadata (its partitions are never fetched: no leader is known). Looked at every
        ``MISSING_TOPIC_RECHECK_MS`` (the cached metadata answers; a topic missing from
        it costs one Metadata request by name each time)."""
        if now < self._refusal_check_at:
            return
        self._refusal_check_at = now + MISSING_TOPIC_RECHECK_MS
        with self._lock:
            topics = {tp.topic for tp in self._subscriptions.partitions}
        if not topics:
            return
        try:
            metadata = self._connections.metadata(timeout_ms=timeout_ms)
        except TidelogError:
            return  # the fetch path logs it and tries again
        missing = {t for t in topics if metadata.partition_count(t) is None}
        if missing:
            self._raise_refused_topics(missing, timeout_ms)

    def _raise_refused_topics(self, topics: set[str], timeout_ms: int) -> None:
        """Raise why an assigned topic is missing from the metadata when no retry can
        cure it: ``TopicAuthorizationFailedError`` (the principal may not describe it;
        a listing of every topic leaves such topics out) or ``InvalidTopicError`` (an
        illegal name), as Kafka's consumer raises them from ``poll``. A topic that just
        does not exist (yet), or a lookup that fails, is left to the usual retries."""
        try:
            metadata = self._connections.metadata(timeout_ms=timeout_ms)
            missing = sorted(t for t in topics if metadata.partition_count(t) is None)
            refusal = first_refusal(topic_errors(self._connections, missing, timeout_ms=timeout_ms))
        except TidelogError as exc:  # the caller goes on with the error it had
            log.info("could not ask why %s are missing: %s", ", ".join(sorted(topics)), exc)
            return
        if refusal is not None:
            raise refusal

    def list_offsets(
        self, queries: Mapping[TopicPartition, int], timeout_ms: int
    ) -> dict[TopicPartition, int]:
        # At the consumer's isolation level: a read_committed consumer's latest (its
        # seek_to_end, its end_offsets) is the last stable offset, as Kafka's.
        answers = list_offsets(
            self._connections,
            queries,
            timeout_ms,
            isolation_level=ISOLATION_LEVELS[self._config.isolation_level],
        )
        return {tp: offset for tp, (offset, _) in answers.items()}

    def fetch_committed(
        self,
        partitions: Iterable[TopicPartition],
        timeout_ms: int,
        *,
        tolerate_unsupported: bool = False,
    ) -> dict[TopicPartition, CommittedOffset]:
        group_id = self._config.group_id
        assert group_id is not None
        try:
            # A read_committed consumer waits out an offset pending in a transaction
            # (KIP-447), as Kafka's: it must not resume before a committed input.
            return fetch_committed_offsets(
                self._connections,
                group_id,
                partitions,
                timeout_ms,
                require_stable=self._config.isolation_level == "read_committed",
            )
        except InvalidRequestError as exc:
            if not tolerate_unsupported:
                raise
            log.warning(
                "no committed offsets for group %s (%s): using auto_offset_reset", group_id, exc
            )
            return {}
