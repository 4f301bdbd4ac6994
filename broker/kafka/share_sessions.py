"""KIP-932 share sessions on the Kafka listener: per (group, member), the partitions a
member's ShareFetch reads and the epoch its next ShareFetch or ShareAcknowledge must carry
(the rules are ``broker.kafka.share``'s docstring). Used on the listener loop's thread only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from tidelog.storage.types import TopicPartition

__all__ = [
    "MAX_SHARE_SESSIONS",
    "SHARE_SESSION_IDLE_MS",
    "ShareSession",
    "ShareSessionError",
    "ShareSessions",
]

MAX_SHARE_SESSIONS = 2_000  # Kafka's group.share.max.share.sessions default
SHARE_SESSION_IDLE_MS = 45_000  # Kafka's group.share.session.timeout.ms default
_MAX_EPOCH = 2**31 - 1


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(slots=True)
class ShareSession:
    """One member's session: its partitions (an ordered set) and its next epoch."""

    partitions: dict[TopicPartition, None]
    next_epoch: int = 1
    used_ms: int = field(default_factory=_now_ms)


class ShareSessionError(Exception):
    """A session refused: ``code`` is Kafka's error name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ShareSessions:
    """The share sessions of one listener, by (group, member). Not thread-safe."""

    def __init__(self, capacity: int = MAX_SHARE_SESSIONS) -> None:
        self._capacity = capacity
        self._sessions: dict[tuple[str, str], ShareSession] = {}

    def partitions(self, key: tuple[str, str]) -> list[TopicPartition]:
        """The partitions of ``key``'s session (none without one)."""
        session = self._sessions.get(key)
        return list(session.partitions) if session else []

    def open(self, key: tuple[str, str], partitions: Iterable[TopicPartition]) -> ShareSession:
        """A new session (epoch 0), replacing ``key``'s; when full, sessions idle for
        ``SHARE_SESSION_IDLE_MS`` are evicted first. Raises ``ShareSessionError``."""
        self._sessions.pop(key, None)
        if len(self._sessions) >= self._capacity:
            now = _now_ms()
            idle = [k for k, s in self._sessions.items() if now - s.used_ms > SHARE_SESSION_IDLE_MS]
            for stale in idle:
                del self._sessions[stale]
        if len(self._sessions) >= self._capacity:
            raise ShareSessionError("SHARE_SESSION_LIMIT_REACHED", "too many share sessions")
        session = ShareSession(dict.fromkeys(partitions))
        self._sessions[key] = session
        return session

    def advance(self, key: tuple[str, str], epoch: int) -> ShareSession:
        """The session at ``epoch`` (> 0), moved to its next epoch (wrapping to 1).
        Raises ``ShareSessionError``."""
        session = self._sessions.get(key)
        if session is None:
            raise ShareSessionError(
                "SHARE_SESSION_NOT_FOUND", f"no share session for member {key[1]}"
            )
        if epoch != session.next_epoch:
            raise ShareSessionError(
                "INVALID_SHARE_SESSION_EPOCH",
                f"share session epoch {epoch}, expected {session.next_epoch}",
            )
        session.next_epoch = 1 if epoch == _MAX_EPOCH else epoch + 1
        session.used_ms = _now_ms()
        return session

    def close(self, key: tuple[str, str]) -> None:
        """End ``key``'s session, if any."""
        self._sessions.pop(key, None)
