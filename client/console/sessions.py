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

Background sampling (``start``, called by the application's lifespan): every view then
samples the cluster every ``sample_interval_ms`` (``ClusterView.start_sampling``): the
shared one from the start, a session's own from its login until it ends. A housekeeping
thread drops idle sessions (and stops their samplers) even when no request comes.

Thread-safe: one lock guards the table of sessions; a session's fields are replaced
whole under it.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .sampler import Sampler
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
        sample_interval_ms: how often each view samples the cluster once ``start`` ran.
    """

    def __init__(
        self,
        shared_view: Callable[[], ClusterView] | None,
        *,
        idle_ms: int,
        sample_interval_ms: int = 5_000,
        clock_ms: Callable[[], int] = _monotonic_ms,
    ) -> None:
        self._make_shared = shared_view
        self._shared: ClusterView | None = None
        self._idle_ms = idle_ms
        self._sample_interval_ms = sample_interval_ms
        self._clock_ms = clock_ms
        self._sessions: dict[str, ConsoleSession] = {}
        self._lock = threading.Lock()
        self._sampling = False
        self._housekeeping: threading.Thread | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        """Start background sampling (the shared view at once, each session's view at
        its login) and the housekeeping thread that drops idle sessions. Idempotent."""
        with self._lock:
            if self._sampling:
                return
            self._sampling = True
            self._stopped.clear()
            if self._make_shared is not None and self._shared is None:
                self._shared = self._make_shared()
            views = [self._shared] if self._shared is not None else []
            views += [s.view for s in self._sessions.values() if s.view is not None and s.principal]
            self._housekeeping = threading.Thread(
                target=self._keep_house, name="console-sessions", daemon=True
            )
            self._housekeeping.start()
        for view in views:
            view.start_sampling(self._sample_interval_ms)

    def _keep_house(self) -> None:
        period_s = max(1.0, min(30.0, self._idle_ms / 4000))
        while not self._stopped.wait(period_s):
            self.expire_idle()

    def expire_idle(self) -> int:
        """Drop the sessions idle longer than ``idle_ms`` and close their own views;
        how many were dropped."""
        now = self._clock_ms()
        with self._lock:
            expired = [
                self._sessions.pop(sid)
                for sid, idle in list(self._sessions.items())
                if now - idle.last_used_ms > self._idle_ms
            ]
        for old in expired:
            self._close_view(old)
        return len(expired)

    def samplers(self) -> list[Sampler]:
        """The running background samplers, one per view that has one."""
        with self._lock:
            views = {id(s.view): s.view for s in self._sessions.values() if s.view is not None}
            if self._shared is not None:
                views[id(self._shared)] = self._shared
        return [v.sampler for v in views.values() if v.sampler is not None and v.sampler.running]

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def get_or_create(self, session_id: str | None) -> tuple[ConsoleSession, bool]:
        """The session of a cookie's id, or a new one; and whether it is new."""
        self.expire_idle()
        now = self._clock_ms()
        to_start: ClusterView | None = None
        with self._lock:
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
                    to_start = self._shared if self._sampling else None
                session.view = self._shared
        if to_start is not None:
            to_start.start_sampling(self._sample_interval_ms)
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
            sampling = self._sampling
        if sampling:
            view.start_sampling(self._sample_interval_ms)
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
        """Stop sampling and housekeeping and close every view. The store stays usable
        (a new shared view is made, without sampling until ``start``)."""
        self._stopped.set()
        housekeeping, self._housekeeping = self._housekeeping, None
        if housekeeping is not None:
            housekeeping.join(timeout=5)
        with self._lock:
            self._sampling = False
            sessions = list(self._sessions.values())
            self._sessions.clear()
            shared, self._shared = self._shared, None
        for session in sessions:
            self._close_view(session)
        if shared is not None:
            shared.close()
