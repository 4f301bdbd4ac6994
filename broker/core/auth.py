"""Authentication on the gRPC listener: the SASL handshake, sessions, and who a call is.

``Authenticator`` is listener-neutral (no grpc import): the listener hands it the call's
``RequestContext``, metadata and TLS auth context, and gets the context back with its
principal, or a ``SaslAuthenticationError``.

**The handshake** (``Authenticate`` RPC, ``docs/security.md``): SCRAM-SHA-256/512 in two
calls (client-first -> server-first + ``handshake_id``; client-final -> server-final +
session token) or PLAIN in one (SASL_SSL only). Pending exchanges are kept by id for
``_HANDSHAKE_TTL_MS`` and only answer the peer (connection) that began them.

**Sessions**: a token is 32 random bytes (``secrets``), kept with the principal, the peer
it was issued to and its expiry (``sasl.session.lifetime.ms``). A call presents it as
metadata ``tidelog-session-token``; it counts only on the connection it was issued on
(the gRPC peer ``ipv4:HOST:PORT`` names one TCP connection), so a token copied elsewhere
is worthless. A missing token is ``SaslAuthenticationError``; an unknown, expired or
foreign one ``SaslSessionExpiredError`` (retriable: the client logs in again on its
current connection). At most ``_MAX_SESSIONS`` are kept; the oldest go first.

**Who a call is** (``RequestContext.principal``): the session's ``User:NAME``; else, with
a verified client certificate, ``User:<subject>``; else None (the authorizer's
``User:ANONYMOUS``). Under SASL_* every call but ``Authenticate`` (and the health and
reflection services, which never reach here) needs a session.

**Failed logins** are counted per peer address (host): after ``sasl.login.failures.max``
failures within ``sasl.login.failure.window.ms`` further attempts from that host are
refused without being checked until the window has passed. Each failure is logged (user,
mechanism, address, reason; never the password or the SCRAM messages) and written to the
audit log.

Thread-safe: one lock (``_lock``) guards the sessions, handshakes and failure counts;
the password hashing runs outside it.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from tidelog.broker.core.audit import audit
from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.scram import ScramError, ScramServer, parse_plain, verify_password
from tidelog.broker.core.users import UserStore
from tidelog.broker.security_config import SecurityConfig
from tidelog.broker.tls import principal_from_auth_context
from tidelog.storage.clock import Clock
from tidelog.storage.errors import (
    SaslAuthenticationError,
    SaslSessionExpiredError,
    UnsupportedSaslMechanismError,
)

__all__ = [
    "AUTHENTICATE_METHOD",
    "SESSION_METADATA_KEY",
    "Authenticator",
    "HandshakeStep",
]

log = logging.getLogger(__name__)

SESSION_METADATA_KEY = "tidelog-session-token"
AUTHENTICATE_METHOD = "Authenticate"
_HANDSHAKE_TTL_MS = 30_000
_MAX_HANDSHAKES = 10_000
_MAX_SESSIONS = 100_000
_FAILED = "authentication failed: invalid credentials"


@dataclass(frozen=True, slots=True)
class HandshakeStep:
    """One answer of the handshake: the server's SASL bytes and, when done, the session."""

    auth_bytes: bytes
    handshake_id: str = ""
    complete: bool = False
    session_token: str = ""
    session_lifetime_ms: int = 0
    principal: str = ""


@dataclass(frozen=True, slots=True)
class _Session:
    principal: str
    peer: str
    expires_ms: int


@dataclass(slots=True)
class _Pending:
    server: ScramServer
    peer: str
    expires_ms: int


class Authenticator:
    """Handshakes, sessions and the principal of each call. Thread-safe."""

    def __init__(self, config: SecurityConfig, users: UserStore, clock: Clock) -> None:
        self.config = config
        self.users = users
        self._clock = clock
        self._fake_key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # guarded by _lock
        self._pending: OrderedDict[str, _Pending] = OrderedDict()  # guarded by _lock
        self._failures: dict[str, deque[int]] = {}  # guarded by _lock: host -> times

    # --- every call ---------------------------------------------------------------------

    def identify(
        self,
        caller: RequestContext,
        metadata: Iterable[tuple[str, str | bytes]] | None,
        auth_context: Mapping[str, Sequence[bytes]] | None,
        method: str,
    ) -> RequestContext:
        """``caller`` with its principal; raises ``SaslAuthenticationError`` when the
        listener needs a session and the call has no valid one."""
        token = ""
        for key, value in metadata or ():
            if key == SESSION_METADATA_KEY:
                token = value if isinstance(value, str) else value.decode(errors="replace")
        if token:
            session = self._session(token, caller.peer)
            if session is None:
                if method == AUTHENTICATE_METHOD:
                    return caller
                raise SaslSessionExpiredError(
                    "the session token is unknown, expired or from another connection: "
                    "authenticate again"
                )
            return replace(caller, principal=session.principal)
        if self.config.sasl and method != AUTHENTICATE_METHOD:
            raise SaslAuthenticationError(
                f"this listener ({self.config.protocol}) requires authentication: "
                "call Authenticate first and send the session token"
            )
        principal = principal_from_auth_context(auth_context or {})
        return replace(caller, principal=principal) if principal else caller

    def _session(self, token: str, peer: str) -> _Session | None:
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            session = self._sessions.get(token)
            if session is None:
                return None
            if session.expires_ms <= now_ms:
                del self._sessions[token]
                return None
        if not secrets.compare_digest(session.peer, peer):
            return None
        return session

    # --- the handshake ------------------------------------------------------------------

    def authenticate(
        self,
        caller: RequestContext,
        mechanism: str,
        auth_bytes: bytes,
        handshake_id: str,
        tls: bool,
    ) -> HandshakeStep:
        """One step of the handshake for ``caller``'s connection.

        Raises:
            UnsupportedSaslMechanismError: the mechanism is not enabled (or PLAIN without TLS).
            SaslAuthenticationError: wrong credentials, a malformed exchange, or too many
                failed logins from this address.
        """
        mechanism = mechanism.upper()
        host = caller.host
        if mechanism not in self.config.sasl_enabled_mechanisms:
            self._fail(caller, mechanism, "", "mechanism not enabled")
            raise UnsupportedSaslMechanismError(
                f"mechanism {mechanism!r} is not enabled; enabled: "
                f"{', '.join(self.config.sasl_enabled_mechanisms)}"
            )
        if mechanism == "PLAIN" and not tls:
            self._fail(caller, mechanism, "", "PLAIN without TLS")
            raise UnsupportedSaslMechanismError("PLAIN is accepted over TLS only (SASL_SSL)")
        self._check_rate(host)
        if mechanism == "PLAIN":
            return self._plain(caller, auth_bytes)
        if not handshake_id:
            return self._scram_first(caller, mechanism, auth_bytes)
        return self._scram_final(caller, mechanism, auth_bytes, handshake_id)

    def _plain(self, caller: RequestContext, auth_bytes: bytes) -> HandshakeStep:
        try:
            user, password = parse_plain(auth_bytes)
        except (ScramError, UnicodeDecodeError):
            self._fail(caller, "PLAIN", "", "malformed PLAIN message")
            raise SaslAuthenticationError("malformed PLAIN message") from None
        credential = None
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            credential = credential or self.users.get(user, mechanism)
        if credential is None or not verify_password(credential, password):
            self._fail(caller, "PLAIN", user, "invalid credentials")
            raise SaslAuthenticationError(_FAILED)
        return self._open_session(caller, user, b"")

    def _scram_first(
        self, caller: RequestContext, mechanism: str, auth_bytes: bytes
    ) -> HandshakeStep:
        # Kafka's listener takes librdkafka's repeated nonce, as Kafka 3.9 did (scram.py).
        server = ScramServer(mechanism, self._fake_key, lenient_nonce=caller.listener == "kafka")
        try:
            user = ScramServer.parse_user(auth_bytes)
            server_first = server.first(auth_bytes, self.users.get(user, mechanism))
        except (ScramError, UnicodeDecodeError) as exc:
            self._fail(caller, mechanism, "", "malformed client-first message")
            raise SaslAuthenticationError(str(exc)) from None
        handshake_id = secrets.token_urlsafe(16)
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            self._prune_locked(now_ms)
            self._pending[handshake_id] = _Pending(server, caller.peer, now_ms + _HANDSHAKE_TTL_MS)
            while len(self._pending) > _MAX_HANDSHAKES:
                self._pending.popitem(last=False)
        return HandshakeStep(server_first, handshake_id=handshake_id)

    def _scram_final(
        self, caller: RequestContext, mechanism: str, auth_bytes: bytes, handshake_id: str
    ) -> HandshakeStep:
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            pending = self._pending.pop(handshake_id, None)
        if (
            pending is None
            or pending.expires_ms <= now_ms
            or pending.peer != caller.peer
            or pending.server.mechanism != mechanism
        ):
            self._fail(caller, mechanism, "", "unknown or expired handshake")
            raise SaslAuthenticationError(
                "unknown or expired handshake: start again with the client-first message"
            )
        user = pending.server.user or ""
        try:
            server_final = pending.server.final(auth_bytes)
        except (ScramError, UnicodeDecodeError):
            self._fail(caller, mechanism, user, "invalid credentials")
            raise SaslAuthenticationError(_FAILED) from None
        return self._open_session(caller, user, server_final)

    def _open_session(
        self, caller: RequestContext, user: str, server_final: bytes
    ) -> HandshakeStep:
        token = secrets.token_urlsafe(32)
        principal = f"User:{user}"
        lifetime_ms = self.config.sasl_session_lifetime_ms
        if self.config.connections_max_reauth_ms > 0:  # KIP-368
            lifetime_ms = min(lifetime_ms, self.config.connections_max_reauth_ms)
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            self._sessions[token] = _Session(principal, caller.peer, now_ms + lifetime_ms)
            while len(self._sessions) > _MAX_SESSIONS:
                self._sessions.popitem(last=False)
            # A success does not clear the address's failures: one valid account must not
            # let its holder reset the count between guesses at other users' passwords.
        log.info("authenticated %s from %s", principal, caller.peer)
        return HandshakeStep(
            server_final,
            complete=True,
            session_token=token,
            session_lifetime_ms=lifetime_ms,
            principal=principal,
        )

    # --- failed logins ------------------------------------------------------------------

    def _check_rate(self, host: str) -> None:
        now_ms = self._clock.monotonic_ms()
        window = self.config.sasl_login_failure_window_ms
        with self._lock:
            times = self._failures.get(host)
            if times is None:
                return
            while times and times[0] <= now_ms - window:
                times.popleft()
            if not times:
                del self._failures[host]
                return
            if len(times) < self.config.sasl_login_failures_max:
                return
            retry_ms = times[0] + window - now_ms
        log.warning("login attempt from %s refused: too many failed logins", host)
        audit({"event": "authentication_refused", "host": host, "reason": "rate limited"})
        raise SaslAuthenticationError(
            f"too many failed logins from {host}: try again in {max(retry_ms, 1)} ms"
        )

    def _fail(self, caller: RequestContext, mechanism: str, user: str, reason: str) -> None:
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            times = self._failures.setdefault(caller.host, deque())
            times.append(now_ms)
            while len(times) > self.config.sasl_login_failures_max:
                times.popleft()
        log.warning(
            "authentication failed: user %r, mechanism %s, from %s: %s",
            user,
            mechanism,
            caller.peer,
            reason,
        )
        audit(
            {
                "event": "authentication_failed",
                "user": user,
                "mechanism": mechanism,
                "peer": caller.peer,
                "host": caller.host,
                "listener": caller.listener,
                "reason": reason,
            }
        )

    def _prune_locked(self, now_ms: int) -> None:
        while self._pending:
            first = next(iter(self._pending.values()))
            if first.expires_ms > now_ms:
                break
            self._pending.popitem(last=False)
