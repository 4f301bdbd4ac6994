"""Console sessions: who is logged in, their clients, and the CSRF token of their forms.

A browser gets an opaque random session id in a cookie (``HttpOnly``, ``SameSite=Strict``)
and nothing else: credentials never travel back to the browser, never sit in a URL and
are never logged. The server keeps, per session, a random CSRF token that every form
carries in a hidden field and every POST must echo (compared in constant time), flash
messages for the page after a redirect, and the session's ``ClusterView``.

Without authentication every session shares one ``ClusterView`` (the console's own
anonymous clients and one chart history). With authentication each login makes a view
of its own, built with that user's credentials: one set of clients per session, acting
with that principal's permissions and no more. Logging out, or leaving a session idle
for ``idle_ms``, closes its clients.

Thread-safe: one lock guards the table of sessions; a session's fields are replaced
whole under it.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .view import ClusterView

__all__ = ["ConsoleSession", "SessionStore"]

COOKIE_NAME = "tidelog_console"


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass
class ConsoleSession:
    """One browser's session. Mutable; reached only through ``SessionStore``."""

    session_id: str
    csrf_token: str
    last_used_ms: int
    view: ClusterView | None = None
    principal: str | None = None
    flashes: list[tuple[str, str]] = field(default_factory=list)

    def flash(self, kind: str, message: str) -> None:
        """Keep a message (``kind``: ``ok`` or ``error``) for the next page shown."""
        self.flashes.append((kind, message))

    def take_flashes(self) -> list[tuple[str, str]]:
        """The messages kept so far, forgotten once taken."""
        taken, self.flashes = self.flashes, []
        return taken

    def csrf_ok(self, token: object) -> bool:
        """Whether a form's token is this session's (constant-time)."""
        return isinstance(token, str) and secrets.compare_digest(token, self.csrf_token)


class SessionStore:
    """The console's sessions by id. Thread-safe.

    Args:
        shared_view: the view every session uses without authentication (None: each
            session logs in and gets its own).
        idle_ms: sessions unused this long are dropped and their views closed.
    """

    def __init__(
        self,
        shared_view: Callable[[], ClusterView] | None,
        *,
        idle_ms: int,
        clock_ms: Callable[[], int] = _monotonic_ms,
    ) -> None:
        self._make_shared = shared_view
        self._shared: ClusterView | None = None
        self._idle_ms = idle_ms
        self._clock_ms = clock_ms
        self._sessions: dict[str, ConsoleSession] = {}
        self._lock = threading.Lock()

    def get_or_create(self, session_id: str | None) -> tuple[ConsoleSession, bool]:
        """The session of a cookie's id, or a new one; and whether it is new."""
        now = self._clock_ms()
        expired = []
        with self._lock:
            for sid, idle in list(self._sessions.items()):
                if now - idle.last_used_ms > self._idle_ms:
                    expired.append(self._sessions.pop(sid))
            found = self._sessions.get(session_id or "")
            created = found is None
            if found is None:
                found = ConsoleSession(
                    session_id=secrets.token_urlsafe(32),
                    csrf_token=secrets.token_urlsafe(32),
                    last_used_ms=now,
                )
                self._sessions[found.session_id] = found
            session = found
            session.last_used_ms = now
            if self._make_shared is not None and session.view is None:
                if self._shared is None:
                    self._shared = self._make_shared()
                session.view = self._shared
        for old in expired:
            self._close_view(old)
        return session, created

    def log_in(self, session: ConsoleSession, view: ClusterView, principal: str) -> None:
        """Give ``session`` a view of its own (closing any it had) and a new CSRF token
        and id, so a token or cookie seen before the login is worth nothing after it."""
        with self._lock:
            old = self._sessions.pop(session.session_id, None)
            previous = session.view
            session.view = view
            session.principal = principal
            session.session_id = secrets.token_urlsafe(32)
            session.csrf_token = secrets.token_urlsafe(32)
            self._sessions[session.session_id] = session
        if old is not None and previous is not None and previous is not self._shared:
            previous.close()

    def log_out(self, session: ConsoleSession) -> None:
        """Forget ``session`` and close its own view."""
        with self._lock:
            self._sessions.pop(session.session_id, None)
        self._close_view(session)

    def _close_view(self, session: ConsoleSession) -> None:
        view, session.view = session.view, None
        if view is not None and view is not self._shared:
            view.close()

    def close(self) -> None:
        """Close every view. The store stays usable (a new shared view is made)."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
            shared, self._shared = self._shared, None
        for session in sessions:
            self._close_view(session)
        if shared is not None:
            shared.close()
