"""TLS for the broker: the listener's server credentials (reloadable) and the channels
brokers open to each other.

``ServerTls`` builds grpc's *dynamic* server credentials: grpc asks ``_fetch`` for the
certificate configuration before each new TLS handshake, and ``_fetch`` answers "no
change" (None) until ``request_reload`` (SIGHUP, ``broker.server``) marks the files to be
read again. New connections then get the new certificate; established connections keep
theirs and are not dropped (their TLS session is already keyed). A reload that fails
(a missing or half-written file) is logged and the previous certificate stays.

``ssl.client.auth``: ``required`` makes grpc demand and verify a client certificate
against ``ssl.cafile``; ``none`` asks for none. grpcio's Python API has no "request but do
not require" mode (its server credentials either require and verify, or do not ask), so
``requested`` is served as ``none`` and says so in the log at start (docs/security.md).
With a client certificate, ``principal_from_auth_context`` names the caller
``User:<subject>``, Kafka's default principal builder (``User:CN=alice,O=Tidelog``).

``InterBrokerChannels`` is the one place brokers open channels to each other (replica
fetchers, ControlledShutdown): plaintext, or TLS trusting ``ssl.cafile`` and presenting
the broker's own certificate (mutual TLS), and for SASL_* a session from the
``Authenticate`` handshake as ``inter.broker.sasl.username`` (``broker.grpc.auth_client``).

Thread-safe: ``ServerTls`` guards its state with ``_lock``; grpc calls ``_fetch`` from its
own threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from tidelog.broker.security_config import SecurityConfig
from tidelog.storage.errors import InvalidConfigError

__all__ = [
    "InterBrokerChannels",
    "ServerTls",
    "principal_from_auth_context",
    "principal_from_peer_certificate",
]

log = logging.getLogger(__name__)


def _read(path: str, key: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidConfigError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None


def principal_from_auth_context(auth_context: Mapping[str, Sequence[bytes]]) -> str | None:
    """``User:<certificate subject>`` from a verified client certificate, else None.

    grpc reports the subject as ``x509_subject`` (RFC 2253 order, most specific first, as
    Java's ``X500Principal.getName()`` prints it, which is what Kafka's default principal
    builder uses).
    """
    if not auth_context:
        return None
    subjects = auth_context.get("x509_subject") or ()
    for subject in subjects:
        text = subject.decode(errors="replace") if isinstance(subject, bytes) else str(subject)
        if text:
            return f"User:{text}"
    names = auth_context.get("x509_common_name") or ()
    for name in names:
        text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        if text:
            return f"User:CN={text}"
    return None


# Python's ``getpeercert()`` long attribute names -> RFC 2253's short ones.
_RFC2253_NAMES = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "stateOrProvinceName": "ST",
    "localityName": "L",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_RFC2253_SPECIAL = ',+"\\<>;'


def _rfc2253_value(value: str) -> str:
    out = "".join(f"\\{c}" if c in _RFC2253_SPECIAL else c for c in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def principal_from_peer_certificate(certificate: Mapping[str, object] | None) -> str | None:
    """``User:<subject>`` from a verified peer certificate as Python's ``ssl`` gives it
    (``SSLSocket.getpeercert()``), in the same RFC 2253 form as grpc's ``x509_subject``
    (most specific first: ``User:CN=alice,O=Tidelog``), so both listeners name one client
    certificate alike; None without a certificate."""
    if not certificate:
        return None
    subject = certificate.get("subject")
    if not isinstance(subject, tuple) or not subject:
        return None
    rdns = []
    for rdn in reversed(subject):
        parts = [f"{_RFC2253_NAMES.get(name, name)}={_rfc2253_value(value)}" for name, value in rdn]
        rdns.append("+".join(parts))
    return "User:" + ",".join(rdns)


class ServerTls:
    """The listener's TLS material, reloadable. Build with ``load`` (reads the files)."""

    def __init__(self, config: SecurityConfig, key: bytes, chain: bytes, ca: bytes | None) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._reload = False  # guarded by _lock
        self._current = (key, chain, ca)  # guarded by _lock
        self.reloads = 0  # how many reloads took effect (tests, logs)

    @classmethod
    def load(cls, config: SecurityConfig) -> ServerTls:
        """Read ``ssl.keyfile``, ``ssl.certfile`` and ``ssl.cafile``.

        Raises ``InvalidConfigError`` naming the setting whose file cannot be read.
        """
        assert config.ssl_keyfile is not None
        assert config.ssl_certfile is not None
        key = _read(config.ssl_keyfile, "ssl.keyfile")
        chain = _read(config.ssl_certfile, "ssl.certfile")
        ca = _read(config.ssl_cafile, "ssl.cafile") if config.ssl_cafile else None
        if config.ssl_client_auth == "requested":
            log.warning(
                "ssl.client.auth=requested: grpcio cannot ask for an optional client "
                "certificate; served as 'none' (use 'required' for mutual TLS)"
            )
        return cls(config, key, chain, ca)

    def _certificate_configuration(self, key: bytes, chain: bytes, ca: bytes | None) -> Any:
        roots = ca if self._config.ssl_client_auth == "required" else None
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=roots)

    def server_credentials(self) -> grpc.ServerCredentials:
        """Dynamic credentials that pick up ``request_reload`` on the next handshake."""
        with self._lock:
            key, chain, ca = self._current
        return grpc.dynamic_ssl_server_credentials(
            self._certificate_configuration(key, chain, ca),
            self._fetch,
            require_client_authentication=self._config.ssl_client_auth == "required",
        )

    def request_reload(self) -> None:
        """Read the certificate files again before the next TLS handshake (SIGHUP)."""
        with self._lock:
            self._reload = True
        log.info("TLS certificates will be reloaded on the next connection")

    def reload_now(self) -> bool:
        """Read the files at once (what the next handshake would do); False on failure."""
        self.request_reload()
        return self._fetch() is not None

    def _fetch(self) -> Any:
        with self._lock:
            if not self._reload:
                return None
            self._reload = False
        try:
            loaded = ServerTls.load(self._config)
        except InvalidConfigError as exc:
            log.error("TLS reload failed, keeping the previous certificate: %s", exc)
            return None
        with self._lock:
            self._current = loaded._current
            self.reloads += 1
        log.info("TLS certificates reloaded from %s", self._config.ssl_certfile)
        try:
            return self._certificate_configuration(*loaded._current)
        except Exception:  # grpc validates the PEM pair lazily; never break handshakes
            log.exception("TLS reload produced an unusable configuration")
            return None


class InterBrokerChannels:
    """Opens the channels one broker uses to call another. Thread-safe (immutable)."""

    def __init__(self, config: SecurityConfig) -> None:
        self._config = config
        self._credentials: grpc.ChannelCredentials | None = None
        if config.tls:
            ca = _read(config.ssl_cafile, "ssl.cafile") if config.ssl_cafile else None
            key = _read(config.ssl_keyfile, "ssl.keyfile") if config.ssl_keyfile else None
            chain = _read(config.ssl_certfile, "ssl.certfile") if config.ssl_certfile else None
            self._credentials = grpc.ssl_channel_credentials(ca, key, chain)
        if config.sasl and not (
            config.inter_broker_sasl_username and config.inter_broker_sasl_password
        ):
            log.warning(
                "security.protocol %s without inter.broker.sasl.username/password: "
                "calls to other brokers will be refused",
                config.protocol,
            )

    def channel(self, address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A channel to ``HOST:PORT`` with this broker's security. The caller closes it."""
        if self._credentials is None:
            channel = grpc.insecure_channel(address, options=list(options))
        else:
            channel = grpc.secure_channel(address, self._credentials, options=list(options))
        config = self._config
        if config.sasl and config.inter_broker_sasl_username and config.inter_broker_sasl_password:
            from tidelog.broker.grpc.auth_client import SessionInterceptor

            return grpc.intercept_channel(
                channel,
                *SessionInterceptor.for_channel(
                    channel,
                    config.inter_broker_sasl_mechanism,
                    config.inter_broker_sasl_username,
                    config.inter_broker_sasl_password,
                ),
            )
        return channel
