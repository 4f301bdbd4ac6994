"""SASL on the Kafka listener: SaslHandshake and SaslAuthenticate over the broker's own
``Authenticator`` (``broker.core.auth``), so the same users, mechanisms and failed-login limits
apply as on the gRPC listener.

With ``security.protocol`` SASL_PLAINTEXT or SASL_SSL, a connection must authenticate
before anything but ApiVersions, SaslHandshake and SaslAuthenticate (anything else closes
it, as Kafka does with ``ILLEGAL_SASL_STATE``). The flow (KIP-152):

1. SaslHandshake v1 names the mechanism; the answer lists the enabled ones
   (``sasl.enabled.mechanisms``), with ``UNSUPPORTED_SASL_MECHANISM`` if it is not one.
2. SaslAuthenticate carries the mechanism's messages: PLAIN in one round (TLS only, as on
   the gRPC listener), SCRAM-SHA-256/512 in two. Success sets the connection's principal
   (``User:NAME``), which the ACL checks (``broker.kafka.authz``) use; a failure answers
   ``SASL_AUTHENTICATION_FAILED`` and closes the connection.
3. SaslHandshake v0 (before KIP-152): the tokens then come as raw size-prefixed frames
   without Kafka headers, answered the same way (``raw_token``).

Re-authentication (KIP-368): with ``connections.max.reauth.ms`` above 0, SaslAuthenticate
v1+ answers the session's lifetime, and the client logs in again on the live connection
(SaslHandshake, SaslAuthenticate) before it ends; a request other than those (and
ApiVersions) after it ended closes the connection, as Kafka does (so do clients that
cannot re-authenticate: SaslAuthenticate v0, or raw tokens). A re-authentication must keep
the mechanism and the principal (``ILLEGAL_SASL_STATE`` /
``SASL_AUTHENTICATION_FAILED``, connection closed). With 0 the session lasts as long as
the connection.
"""

from __future__ import annotations

import dataclasses
import time

from tidelog.broker.kafka.codec import Plain, RequestHeader
from tidelog.broker.kafka.errors import NONE, error_code_for, kafka_error
from tidelog.broker.kafka.listener import Connection
from tidelog.storage.errors import UnsupportedSaslMechanismError

__all__ = ["raw_token", "sasl_authenticate", "sasl_handshake"]


async def sasl_handshake(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """SaslHandshake (v0-1): choose the mechanism for this connection."""
    authenticator = conn.core.authenticator
    enabled = list(authenticator.config.sasl_enabled_mechanisms) if authenticator else []
    mechanism = str(request["mechanism"]).upper()
    if authenticator is None or not conn.settings.sasl or mechanism not in enabled:
        return {"error_code": error_code_for("UNSUPPORTED_SASL_MECHANISM"), "mechanisms": enabled}
    if conn.authenticated and mechanism != conn.sasl_mechanism:
        conn.close_after_response = True  # KIP-368: a re-authentication keeps its mechanism
        return {"error_code": error_code_for("ILLEGAL_SASL_STATE"), "mechanisms": enabled}
    conn.sasl_mechanism = mechanism
    conn.handshake_id = ""
    conn.raw_sasl = header.api_version == 0
    return {"error_code": NONE, "mechanisms": enabled}


async def sasl_authenticate(conn: Connection, header: RequestHeader, request: Plain) -> Plain:
    """SaslAuthenticate (v0-2): one step of the mechanism's exchange."""
    answer, code, message = await _step(conn, bytes(request["auth_bytes"]))
    lifetime_ms = 0
    if not code and conn.session_expires_at is not None:
        lifetime_ms = max(int((conn.session_expires_at - time.monotonic()) * 1000), 1)
    return {
        "error_code": code,
        "error_message": message,
        "auth_bytes": answer,
        "session_lifetime": lifetime_ms,
    }


async def raw_token(conn: Connection, token: bytes) -> bytes | None:
    """A raw SASL token after SaslHandshake v0: the raw answer, or None to close."""
    answer, code, _ = await _step(conn, token)
    return None if code else answer


async def _step(conn: Connection, auth_bytes: bytes) -> tuple[bytes, int, str | None]:
    authenticator = conn.core.authenticator
    if authenticator is None or not conn.sasl_mechanism:
        conn.close_after_response = True
        return b"", error_code_for("ILLEGAL_SASL_STATE"), "SaslHandshake first"
    try:
        step = await conn.run(
            authenticator.authenticate,
            conn.context,
            conn.sasl_mechanism,
            auth_bytes,
            conn.handshake_id,
            conn.tls,
        )
    except UnsupportedSaslMechanismError as exc:
        conn.close_after_response = True
        return b"", error_code_for("UNSUPPORTED_SASL_MECHANISM"), str(exc)
    except Exception as exc:
        conn.close_after_response = True
        code, message = kafka_error(exc)
        return b"", code, message
    if step.complete:
        if conn.authenticated and step.principal != conn.context.principal:
            conn.close_after_response = True
            return (
                b"",
                error_code_for("SASL_AUTHENTICATION_FAILED"),
                "a re-authentication cannot change the principal",
            )
        conn.context = dataclasses.replace(conn.context, principal=step.principal)
        conn.authenticated = True
        reauth_ms = authenticator.config.connections_max_reauth_ms
        conn.session_expires_at = (
            time.monotonic() + step.session_lifetime_ms / 1000 if reauth_ms > 0 else None
        )
        conn.raw_sasl = False
        conn.handshake_id = ""
    else:
        conn.handshake_id = step.handshake_id
    return step.auth_bytes, NONE, None
