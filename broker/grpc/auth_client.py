"""The broker's own SASL login, for calls to other brokers under SASL_PLAINTEXT/SASL_SSL.

``SessionInterceptor`` wraps an inter-broker channel (``broker.tls.InterBrokerChannels``):
before the first call it runs the ``Authenticate`` handshake (``broker.core.scram.ScramClient``,
or PLAIN) on the raw channel as ``inter.broker.sasl.username`` and adds the session token
to every call's metadata. A call answered ``SASL_SESSION_EXPIRED`` (the channel
reconnected; tokens are bound to one connection) drops the token so the next call logs in
again; the replica fetchers retry after their backoff anyway.

Thread-safe: the token is guarded by ``_lock``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import grpc

from tidelog.broker.core.auth import SESSION_METADATA_KEY
from tidelog.broker.core.scram import ScramClient, ScramError
from tidelog.broker.grpc.errors import ERROR_CODE_METADATA_KEY
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

__all__ = ["SessionInterceptor"]

log = logging.getLogger(__name__)

_LOGIN_TIMEOUT_S = 10.0


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class SessionInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds a session token to each call, logging in when there is none."""

    def __init__(self, login: Callable[[], str]) -> None:
        self._login = login
        self._lock = threading.Lock()
        self._token: str | None = None  # guarded by _lock

    @classmethod
    def for_channel(
        cls, channel: grpc.Channel, mechanism: str, user: str, password: str
    ) -> tuple[SessionInterceptor]:
        """The interceptor for ``channel`` (the raw one, which the login uses)."""
        stub = pb_grpc.BrokerStub(channel)

        def login() -> str:
            if mechanism == "PLAIN":
                answer = stub.Authenticate(
                    pb.AuthenticateRequest(
                        mechanism=mechanism, auth_bytes=f"\0{user}\0{password}".encode()
                    ),
                    timeout=_LOGIN_TIMEOUT_S,
                )
                return str(answer.session_token)
            scram = ScramClient(mechanism, user, password)
            first = stub.Authenticate(
                pb.AuthenticateRequest(mechanism=mechanism, auth_bytes=scram.first()),
                timeout=_LOGIN_TIMEOUT_S,
            )
            final = stub.Authenticate(
                pb.AuthenticateRequest(
                    mechanism=mechanism,
                    handshake_id=first.handshake_id,
                    auth_bytes=scram.final(first.auth_bytes),
                ),
                timeout=_LOGIN_TIMEOUT_S,
            )
            scram.check(final.auth_bytes)
            return str(final.session_token)

        return (cls(login),)

    def _details(self, details: Any) -> tuple[_CallDetails, str]:
        with self._lock:
            if self._token is None:
                try:
                    self._token = self._login()
                except ScramError as exc:
                    log.error("inter-broker login failed: %s", exc)
                    raise
            token = self._token
        metadata = [*(details.metadata or ()), (SESSION_METADATA_KEY, token)]
        return (
            _CallDetails(
                details.method,
                details.timeout,
                metadata,
                details.credentials,
                details.wait_for_ready,
                details.compression,
            ),
            token,
        )

    def _check(self, call: Any, token: str) -> None:
        try:
            trailing = call.trailing_metadata() or ()
        except Exception:  # still running (a stream): nothing to learn yet
            return
        for key, value in trailing:
            if key == ERROR_CODE_METADATA_KEY and value == "SASL_SESSION_EXPIRED":
                with self._lock:
                    if self._token == token:
                        self._token = None

    def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        details, token = self._details(client_call_details)
        call = continuation(details, request)
        self._check(call, token)
        return call

    def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        details, _token = self._details(client_call_details)
        return continuation(details, request_iterator)
