"""The client's security: TLS channels and the SASL login (SCRAM-SHA-256/512, PLAIN).

``ClientSecurity`` holds the kafka-python settings every client config has
(``security_protocol``, ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``,
``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``) and opens channels
with them (``open_channel``): plaintext for PLAINTEXT/SASL_PLAINTEXT, TLS for
SSL/SASL_SSL (the broker's certificate verified against ``ssl_cafile``, or the system's
roots without it; ``ssl_certfile``/``ssl_keyfile`` present a client certificate for mutual
TLS).

``Session`` is the SASL login of one channel (``client.transport`` owns one per channel):
it runs the broker's ``Authenticate`` handshake (``docs/security.md``) and keeps the
session token, which every call then carries as metadata ``tidelog-session-token``. The
token is valid on the connection it was issued on only; when the channel reconnects the
broker answers ``SASL_SESSION_EXPIRED`` and the transport logs in again and repeats the
call.

The SCRAM client side is RFC 5802 / RFC 7677 with hashlib/hmac; the password never
leaves this process (SCRAM sends a proof; ``salted_credential`` sends SaltedPassword for
``AdminClient.upsert_user``, as Kafka's AlterUserScramCredentials). ``client`` may not
import ``broker``, so this is the client library's own copy of the exchange
(``broker.core.scram`` is the broker's). The password is kept out of ``repr``.

Thread-safe: ``ClientSecurity`` is immutable; ``Session`` guards its token with a lock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import SaslAuthenticationError

__all__ = [
    "MECHANISMS",
    "PROTOCOLS",
    "SECURITY_PROPERTY_NAMES",
    "SESSION_METADATA_KEY",
    "ClientSecurity",
    "Session",
    "login",
    "salted_credential",
    "settings_from_mapping",
    "settings_from_properties",
]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
SESSION_METADATA_KEY = "tidelog-session-token"
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
_MIN_ITERATIONS = 4096
_MAX_ITERATIONS = 16384  # Kafka's bound (broker.core.scram.MAX_ITERATIONS)
_GS2 = "n,,"


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientSecurity:
    """A client's security settings (kafka-python's names). Validated when built:
    ``ValueError`` names the setting."""

    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    sasl_mechanism: str = "SCRAM-SHA-512"
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_settings(
            self.security_protocol,
            self.sasl_mechanism,
            self.sasl_plain_username,
            self.sasl_plain_password,
            self.ssl_certfile,
            self.ssl_keyfile,
        )

    @classmethod
    def of(cls, config: Any) -> ClientSecurity:
        """The security settings of any client config (they share the field names)."""
        return cls(
            security_protocol=config.security_protocol,
            ssl_cafile=config.ssl_cafile,
            ssl_certfile=config.ssl_certfile,
            ssl_keyfile=config.ssl_keyfile,
            sasl_mechanism=config.sasl_mechanism,
            sasl_plain_username=config.sasl_plain_username,
            sasl_plain_password=config.sasl_plain_password,
        )

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def open_channel(self, address: str, options: Sequence[tuple[str, Any]]) -> grpc.Channel:
        """A channel to ``address`` with these settings. Raises ``ValueError`` if a
        certificate file cannot be read."""
        if not self.tls:
            return grpc.insecure_channel(address, options=list(options))
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(self.ssl_cafile, "ssl_cafile"),
            private_key=_read(self.ssl_keyfile, "ssl_keyfile"),
            certificate_chain=_read(self.ssl_certfile, "ssl_certfile"),
        )
        return grpc.secure_channel(address, credentials, options=list(options))


def check_settings(
    protocol: str,
    mechanism: str,
    username: str | None,
    password: str | None,
    certfile: str | None,
    keyfile: str | None,
) -> None:
    """Validate the security settings of a client config; raises ``ValueError``."""
    if protocol not in PROTOCOLS:
        raise ValueError(
            f"security_protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
        )
    if mechanism not in MECHANISMS:
        raise ValueError(
            f"sasl_mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}"
        )
    if protocol.startswith("SASL_") and (not username or password is None):
        raise ValueError(
            f"security_protocol {protocol} needs sasl_plain_username and sasl_plain_password"
        )
    if mechanism == "PLAIN" and protocol == "SASL_PLAINTEXT":
        raise ValueError("sasl_mechanism PLAIN sends the password: use security_protocol SASL_SSL")
    if bool(certfile) != bool(keyfile):
        raise ValueError("ssl_certfile and ssl_keyfile go together (a client certificate)")


def _read(path: str | None, name: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{name}: cannot read {path}: {exc.strerror or exc}") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        if len(part) >= 2 and part[1] == "=":
            out.setdefault(part[0], part[2:])
    return out


def salted_credential(
    mechanism: str, password: str, iterations: int = _MIN_ITERATIONS
) -> tuple[bytes, bytes]:
    """(salt, SaltedPassword) for ``upsert_user``: a random 32-byte salt and PBKDF2."""
    if mechanism not in _HASHES:
        raise ValueError(f"mechanism must be SCRAM-SHA-256 or SCRAM-SHA-512, got {mechanism!r}")
    if not _MIN_ITERATIONS <= iterations <= _MAX_ITERATIONS:
        raise ValueError(
            f"iterations must be between {_MIN_ITERATIONS} and {_MAX_ITERATIONS}, got {iterations}"
        )
    salt = secrets.token_bytes(32)
    return salt, hashlib.pbkdf2_hmac(_HASHES[mechanism], password.encode(), salt, iterations)


class Session:
    """The SASL login of one channel and its token. Thread-safe (``_lock``)."""

    def __init__(self, security: ClientSecurity) -> None:
        self._security = security
        self._lock = threading.Lock()
        self._token: str | None = None  # guarded by _lock
        self.principal: str | None = None

    @property
    def token(self) -> str | None:
        with self._lock:
            return self._token

    def invalidate(self, token: str | None) -> None:
        """Forget ``token`` (the broker no longer takes it); a newer one is kept."""
        with self._lock:
            if self._token == token:
                self._token = None

    def ensure(
        self, authenticate: Callable[[pb.AuthenticateRequest], pb.AuthenticateResponse]
    ) -> str:
        """The token, logging in first if there is none. ``authenticate`` makes one
        ``Authenticate`` call (the transport's, with its deadline and error mapping).

        Raises ``SaslAuthenticationError`` (wrong credentials, refused) or whatever the
        call raises.
        """
        with self._lock:
            if self._token is not None:
                return self._token
            token, principal = login(self._security, authenticate)
            self._token = token
            self.principal = principal
            return token


def login(
    security: ClientSecurity,
    authenticate: Callable[[pb.AuthenticateRequest], pb.AuthenticateResponse],
) -> tuple[str, str]:
    """Run the SASL handshake through ``authenticate`` (one ``Authenticate`` call each);
    (session token, principal). Raises ``SaslAuthenticationError`` if the broker's
    answers are not valid or its SCRAM signature is wrong (it does not know our
    credential)."""
    mechanism = security.sasl_mechanism
    user = security.sasl_plain_username or ""
    password = security.sasl_plain_password or ""
    if mechanism == "PLAIN":
        answer = authenticate(
            pb.AuthenticateRequest(mechanism=mechanism, auth_bytes=f"\0{user}\0{password}".encode())
        )
        if not answer.complete:
            raise SaslAuthenticationError("PLAIN: the broker did not complete the login")
        return answer.session_token, answer.principal
    hash_name = _HASHES[mechanism]
    name = user.replace("=", "=3D").replace(",", "=2C")
    bare = f"n={name},r={_b64(secrets.token_bytes(24))}"
    first = authenticate(
        pb.AuthenticateRequest(mechanism=mechanism, auth_bytes=f"{_GS2}{bare}".encode())
    )
    server_first = first.auth_bytes.decode()
    attributes = _attributes(server_first)
    nonce = attributes.get("r", "")
    iterations = int(attributes.get("i", "0") or 0)
    if not nonce.startswith(_attributes(bare)["r"]) or not (
        _MIN_ITERATIONS <= iterations <= _MAX_ITERATIONS
    ):
        raise SaslAuthenticationError("SCRAM: the broker's first message is not valid")
    salted = hashlib.pbkdf2_hmac(
        hash_name, password.encode(), base64.b64decode(attributes.get("s", "")), iterations
    )
    without_proof = f"c={_b64(_GS2.encode())},r={nonce}"
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    client_key = hmac.new(salted, b"Client Key", hash_name).digest()
    stored_key = hashlib.new(hash_name, client_key).digest()
    signature = hmac.new(stored_key, auth_message, hash_name).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    final = authenticate(
        pb.AuthenticateRequest(
            mechanism=mechanism,
            handshake_id=first.handshake_id,
            auth_bytes=f"{without_proof},p={_b64(proof)}".encode(),
        )
    )
    server_key = hmac.new(salted, b"Server Key", hash_name).digest()
    expected = hmac.new(server_key, auth_message, hash_name).digest()
    verifier = _attributes(final.auth_bytes.decode()).get("v", "")
    try:
        given = base64.b64decode(verifier, validate=True)
    except ValueError:
        given = b""
    if not final.complete or not hmac.compare_digest(given, expected):
        # The broker does not know our credential: it is not the broker we trust.
        raise SaslAuthenticationError("SCRAM: the broker's signature is wrong")
    return final.session_token, final.principal


# Kafka tool property names (``--command-config``) -> kafka-python setting names.
_PROPERTY_NAMES = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "ssl.cafile": "ssl_cafile",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certfile": "ssl_certfile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.keyfile": "ssl_keyfile",
    "ssl.key.location": "ssl_keyfile",
    "sasl.username": "sasl_plain_username",
    "sasl.plain.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "sasl.plain.password": "sasl_plain_password",
}
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def settings_from_properties(text: str) -> dict[str, str]:
    """Kafka tools' ``--command-config`` file (Java properties) -> client settings.

    Takes ``security.protocol``, ``sasl.mechanism``, the ``ssl.*`` file names (Tidelog's
    ``ssl.cafile``/``ssl.certfile``/``ssl.keyfile`` or librdkafka's ``ssl.ca.location``/
    ``ssl.certificate.location``/``ssl.key.location``), ``sasl.username``/``sasl.password``
    and ``sasl.jaas.config`` (its ``username="..."`` and ``password="..."``). ``#`` and
    ``!`` start comments; ``=`` or ``:`` separate key and value. Raises ``ValueError`` for
    a key it does not know (Java key stores, ``ssl.truststore.*``, are not supported: give
    PEM files).
    """
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)$", line)
        if match is None:
            raise ValueError(f"line {number}: expected KEY=VALUE, got {raw!r}")
        key, value = match.group(1), match.group(2).strip()
        try:
            out.update(settings_from_mapping({key: value}))
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
    return out


SECURITY_PROPERTY_NAMES = frozenset([*_PROPERTY_NAMES, "sasl.jaas.config"])


def settings_from_mapping(properties: Mapping[str, str]) -> dict[str, str]:
    """Kafka-named security properties (``SECURITY_PROPERTY_NAMES``) -> client settings.

    ``sasl.jaas.config`` gives its ``username="..."`` and ``password="..."``. Raises
    ``ValueError`` for another key.
    """
    out: dict[str, str] = {}
    for key, value in properties.items():
        if key == "sasl.jaas.config":
            options = {k: v.replace('\\"', '"') for k, v in _JAAS_OPTION.findall(value)}
            if "username" in options:
                out["sasl_plain_username"] = options["username"]
            if "password" in options:
                out["sasl_plain_password"] = options["password"]
            continue
        if key not in _PROPERTY_NAMES:
            known = ", ".join(sorted(SECURITY_PROPERTY_NAMES))
            raise ValueError(f"unknown setting {key!r}; known: {known}")
        out[_PROPERTY_NAMES[key]] = value.strip()
    return out
