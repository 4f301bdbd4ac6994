"""Incremental fetch sessions (Kafka's KIP-227), for both listeners' Fetch.

A client that fetches many partitions sends every one of them, with its fetch offset,
in every Fetch unless the broker keeps a session: then the first fetch (``session_epoch``
0) names every partition and gets a ``session_id``; each later fetch (epoch 1, 2, ...)
names only the partitions whose fetch offset (or another field) changed or that are new,
lists the ones to drop as forgotten, and is answered with only the partitions that have
something to say (``answered``): records, an error, a divergence, or a high watermark or
log start offset that moved since the last answer. A fetch with epoch -1 closes its
session (a full fetch without one follows).

Kafka consumers use them through the Kafka listener (v7+); followers use them through
the gRPC listener (``broker.cluster.fetcher``), where the session also spares the
leader's reads: an incremental follower fetch skips every partition the follower is
caught up on and nothing moved for (``broker.core.fetch``).

Kafka's rules, kept here:

- session id 0 with epoch -1: a full fetch, no session (every v4-6 fetch is one);
- session id 0 with epoch 0: a new session; answered with its id, or 0 when no slot is
  free (the client goes on with full fetches);
- session id S with epoch 0: S is closed, a new session made;
- session id S with epoch E > 0: S must exist (``FETCH_SESSION_ID_NOT_FOUND``) and E must
  be its next epoch (``INVALID_FETCH_SESSION_EPOCH``); the epoch moves on when the
  request is accepted, before the read, so a retried request is refused, as Kafka's;
- session id S with epoch -1: S is closed, the fetch is answered in full, no session.

The cache holds at most ``max.incremental.fetch.session.cache.slots`` sessions (Kafka's
default 1,000); when it is full, a new session takes the slot of the least recently
used one that has been idle for ``min.incremental.fetch.session.eviction.ms`` (Kafka's
default 120,000 ms), else no session is made. Kafka also prefers evicting smaller
sessions; one size fits here.

Sessions belong to the listener, not to a connection (a client may reconnect and go on
with its session, as in Kafka), and are touched only on the listener's event loop: no
lock. A session remembers, per partition, the fetch offset, partition max bytes and
current leader epoch the client last sent (a follower's also its last fetched epoch and
log start offset), and the high watermark and log start offset last answered.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tidelog.broker.core.fetch import PartitionFetched, PartitionFetchSpec

__all__ = [
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "CachedPartition",
    "FetchSession",
    "FetchSessionCache",
    "SessionError",
    "Update",
    "answered",
    "next_epoch",
]

INITIAL_EPOCH = 0
FINAL_EPOCH = -1

Key = tuple[str, int]


@dataclass(slots=True)
class CachedPartition:
    """What a session remembers of one partition."""

    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int
    # A follower's: the epoch of its last batch and its log start offset (-1: not given).
    last_fetched_epoch: int = -1
    follower_log_start: int = -1
    # Last answered; -1 before the first answer, so a new partition is always answered.
    high_watermark: int = -1
    log_start_offset: int = -1

    def spec(self, key: Key) -> PartitionFetchSpec:
        """The partition as a read names it."""
        return PartitionFetchSpec(
            key[0],
            key[1],
            self.fetch_offset,
            self.max_bytes,
            self.current_leader_epoch,
            self.last_fetched_epoch,
            None,
            self.follower_log_start,
        )

    def changed(self, high_watermark: int, log_start_offset: int) -> bool:
        """Whether the answer's offsets differ from the last ones answered; remembers
        the new ones."""
        moved = high_watermark != self.high_watermark or log_start_offset != self.log_start_offset
        self.high_watermark, self.log_start_offset = high_watermark, log_start_offset
        return moved


@dataclass(slots=True)
class FetchSession:
    """One client's session: its id, the epoch its next fetch must carry, its partitions
    in the order first named (the order Kafka answers them in)."""

    session_id: int
    next_epoch: int
    partitions: OrderedDict[Key, CachedPartition] = field(default_factory=OrderedDict)
    last_used_ms: int = 0


class SessionError(Exception):
    """A fetch that names a session it may not use; ``code`` is Kafka's error name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Update:
    """One partition as a fetch request names it."""

    key: Key
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int
    last_fetched_epoch: int = -1
    follower_log_start: int = -1

    def cached(self) -> CachedPartition:
        return CachedPartition(
            self.fetch_offset,
            self.max_bytes,
            self.current_leader_epoch,
            self.last_fetched_epoch,
            self.follower_log_start,
        )


class FetchSessionCache:
    """The listener's sessions, by id. Loop thread only."""

    def __init__(self, slots: int, eviction_ms: int, clock_ms: Callable[[], int]) -> None:
        self._slots = slots
        self._eviction_ms = eviction_ms
        self._clock_ms = clock_ms
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()  # LRU first
        # Random non-zero ids, as Kafka's: a session id from before a restart is not
        # found (not taken for another client's session).
        self._random = random.Random()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def close(self, session_id: int) -> None:
        self._sessions.pop(session_id, None)

    def create(self, updates: Iterable[Update]) -> FetchSession | None:
        """A new session holding ``updates`` (epoch 1 next), or None when every slot is
        taken by a session used within the eviction time."""
        now = self._clock_ms()
        if len(self._sessions) >= self._slots:
            if self._slots <= 0:
                return None
            oldest_id, oldest = next(iter(self._sessions.items()))
            if now - oldest.last_used_ms < self._eviction_ms:
                return None
            del self._sessions[oldest_id]
        session_id = self._random.randint(1, 0x7FFFFFFF)
        while session_id in self._sessions:
            session_id = self._random.randint(1, 0x7FFFFFFF)
        session = FetchSession(session_id, INITIAL_EPOCH + 1, last_used_ms=now)
        for u in updates:
            session.partitions[u.key] = u.cached()
        self._sessions[session_id] = session
        return session

    def resolve(
        self,
        session_id: int,
        epoch: int,
        updates: Sequence[Update],
        forgotten: Callable[[], Iterable[Key]],
    ) -> tuple[FetchSession | None, bool]:
        """The session a fetch asks for, by the rules above (None: a full fetch without
        one), and whether the fetch is incremental. ``forgotten``: the request's, read
        only for an incremental fetch.

        Raises:
            SessionError: ``FETCH_SESSION_ID_NOT_FOUND`` or ``INVALID_FETCH_SESSION_EPOCH``.
        """
        if epoch == FINAL_EPOCH:
            if session_id:
                self.close(session_id)
            return None, False
        if epoch == INITIAL_EPOCH:
            if session_id:
                self.close(session_id)
            return self.create(updates), False
        return self.continue_session(session_id, epoch, updates, forgotten()), True

    def continue_session(
        self, session_id: int, epoch: int, updates: Sequence[Update], forgotten: Iterable[Key]
    ) -> FetchSession:
        """Apply an incremental fetch to its session (added or changed partitions, then
        the forgotten ones removed) and move its epoch on.

        Raises:
            SessionError: ``FETCH_SESSION_ID_NOT_FOUND`` or ``INVALID_FETCH_SESSION_EPOCH``.
        """
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionError(
                "FETCH_SESSION_ID_NOT_FOUND", f"no fetch session {session_id} (evicted or closed)"
            )
        if epoch != session.next_epoch:
            raise SessionError(
                "INVALID_FETCH_SESSION_EPOCH",
                f"fetch session {session_id} expects epoch {session.next_epoch}, got {epoch}",
            )
        for u in updates:
            cached = session.partitions.get(u.key)
            if cached is None:
                session.partitions[u.key] = u.cached()
            else:
                cached.fetch_offset = u.fetch_offset
                cached.max_bytes = u.max_bytes
                cached.current_leader_epoch = u.current_leader_epoch
                cached.last_fetched_epoch = u.last_fetched_epoch
                cached.follower_log_start = u.follower_log_start
        for key in forgotten:
            session.partitions.pop(key, None)
        session.next_epoch = next_epoch(session.next_epoch)
        session.last_used_ms = self._clock_ms()
        self._sessions.move_to_end(session_id)
        return session


def answered(
    session: FetchSession | None, answers: Sequence[PartitionFetched], incremental: bool
) -> list[PartitionFetched]:
    """What to answer of ``answers``: all of a full fetch, only the partitions with
    something to say of an incremental one (the others' regions closed: never sent).
    Remembers each partition's offsets as answered."""
    if session is None:
        return list(answers)
    kept = []
    cached_of = session.partitions.get
    for a in answers:
        cached = cached_of((a.topic, a.partition))
        moved = cached is None or cached.changed(a.high_watermark, a.log_start_offset)
        if incremental and not (moved or a.size or a.error_code or a.diverging is not None):
            if a.region is not None:
                a.region.close()
            continue
        kept.append(a)
    return kept


def next_epoch(epoch: int) -> int:
    """The session epoch after ``epoch``: Kafka's wrap from Integer.MAX_VALUE to 1 (0 and
    -1 are reserved)."""
    return 1 if epoch >= 0x7FFFFFFF else epoch + 1
