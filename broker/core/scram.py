"""SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677) and PLAIN, on bytes and strings only.

Pure: no socket, file, clock or thread. ``broker.core.auth`` drives these state machines over
the ``Authenticate`` RPC; ``broker.core.users`` stores what ``ScramCredential`` holds.

The stored credential is Kafka's (``ScramCredential``): salt, iterations (>= 4096),
StoredKey = H(HMAC(SaltedPassword, "Client Key")) and ServerKey = HMAC(SaltedPassword,
"Server Key"), with SaltedPassword = PBKDF2-HMAC(password, salt, iterations). Neither the
password nor SaltedPassword is kept: StoredKey verifies a client proof and ServerKey signs
the server's answer, and neither lets anyone log in (RFC 5802 section 9).

The exchange, two round trips::

    client-first   n,,n=USER,r=CNONCE
    server-first   r=CNONCE+SNONCE,s=SALT_B64,i=ITERATIONS
    client-final   c=biws,r=CNONCE+SNONCE,p=PROOF_B64
    server-final   v=SERVER_SIGNATURE_B64          (or e=invalid-proof: a failure)

An unknown user gets a server-first built from a fake credential derived from the name
(same shape, stable per name) so that the answer does not tell which users exist; the
proof then fails like a wrong password. Every comparison of secrets is constant-time
(``hmac.compare_digest``). Primitives are hashlib/hmac from the standard library.

PLAIN (RFC 4616, ``\\0USER\\0PASSWORD``) is verified against the same stored credential:
the password is salted and hashed with the stored salt and iterations and compared with
StoredKey; it is accepted over TLS only (``broker.core.auth`` enforces that).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

__all__ = [
    "MAX_ITERATIONS",
    "MECHANISMS",
    "MIN_ITERATIONS",
    "ScramClient",
    "ScramCredential",
    "ScramError",
    "ScramServer",
    "credential_from_password",
    "credential_from_salted",
    "parse_plain",
    "salted_password",
    "verify_password",
]

MIN_ITERATIONS = 4096
# Kafka's bound too: each login costs the broker this many HMACs, so an absurd count set
# by an admin (or demanded by a rogue server of a client) would be a denial of service.
MAX_ITERATIONS = 16384
# Mechanism name -> hashlib name.
MECHANISMS: dict[str, str] = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
_NONCE_BYTES = 24
_GS2_HEADER = "n,,"


class ScramError(ValueError):
    """A malformed or failed exchange; the message is safe to show the client."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the broker keeps of one user's password for one mechanism (Kafka's format)."""

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_text(self) -> str:
        """Kafka's ZooKeeper form: ``salt=..,stored_key=..,server_key=..,iterations=N``."""
        b64 = base64.b64encode
        return (
            f"salt={b64(self.salt).decode()},stored_key={b64(self.stored_key).decode()},"
            f"server_key={b64(self.server_key).decode()},iterations={self.iterations}"
        )

    @classmethod
    def from_text(cls, mechanism: str, text: str) -> ScramCredential:
        """Parse ``to_text``'s form. Raises ``ScramError`` if it is not one."""
        fields = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
        try:
            return cls(
                mechanism,
                base64.b64decode(fields["salt"], validate=True),
                int(fields["iterations"]),
                base64.b64decode(fields["stored_key"], validate=True),
                base64.b64decode(fields["server_key"], validate=True),
            )
        except (KeyError, ValueError) as exc:
            raise ScramError(f"not a stored {mechanism} credential: {exc}") from None


def _hash_name(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise ScramError(f"unsupported mechanism {mechanism!r}") from None


def _hmac(hash_name: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hash_name).digest()


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802 Hi(): PBKDF2-HMAC of the password (SASLprep is not applied: UTF-8 as is,
    as Kafka's Java client does for ASCII passwords)."""
    return hashlib.pbkdf2_hmac(_hash_name(mechanism), password.encode(), salt, iterations)


def credential_from_salted(
    mechanism: str, salt: bytes, iterations: int, salted: bytes
) -> ScramCredential:
    """The stored credential from SaltedPassword (what ``UpsertUser`` carries: the
    password itself never travels to the broker). Raises ``ScramError`` for iterations
    below 4096."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ScramError(
            f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, got {iterations}"
        )
    hash_name = _hash_name(mechanism)
    client_key = _hmac(hash_name, salted, b"Client Key")
    return ScramCredential(
        mechanism,
        salt,
        iterations,
        hashlib.new(hash_name, client_key).digest(),
        _hmac(hash_name, salted, b"Server Key"),
    )


def credential_from_password(
    mechanism: str, password: str, iterations: int = MIN_ITERATIONS, salt: bytes | None = None
) -> ScramCredential:
    """A new stored credential for ``password`` with a random 32-byte salt."""
    salt = secrets.token_bytes(32) if salt is None else salt
    return credential_from_salted(
        mechanism, salt, iterations, salted_password(mechanism, password, salt, iterations)
    )


def verify_password(credential: ScramCredential, password: str) -> bool:
    """Whether ``password`` matches ``credential`` (PLAIN), compared in constant time."""
    again = credential_from_salted(
        credential.mechanism,
        credential.salt,
        credential.iterations,
        salted_password(credential.mechanism, password, credential.salt, credential.iterations),
    )
    return hmac.compare_digest(again.stored_key, credential.stored_key)


def parse_plain(message: bytes) -> tuple[str, str]:
    """``[authzid]\\0user\\0password`` -> (user, password). Raises ``ScramError``."""
    parts = message.split(b"\0")
    if len(parts) != 3 or not parts[1]:
        raise ScramError("malformed PLAIN message")
    authzid, user, password = (p.decode("utf-8", errors="strict") for p in parts)
    if authzid and authzid != user:
        raise ScramError("PLAIN: an authorization id other than the user is not supported")
    return user, password


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ScramError("malformed SCRAM message")
        out.setdefault(part[0], part[2:])
    return out


def _decode_name(name: str) -> str:
    # RFC 5802 saslname: "=2C" is ",", "=3D" is "="; any other "=" is an error.
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise ScramError("malformed user name")
    return name.replace("=2C", ",").replace("=3D", "=")


def _encode_name(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ScramError("malformed base64 in SCRAM message") from None


class ScramServer:
    """The broker's side of one exchange. Not thread-safe (one exchange, one owner).

    ``first(client_first) -> (user, server_first)``, the caller looks the user up and
    passes the credential (None for an unknown user) to ``first``;
    ``final(client_final) -> server_final`` or raises ``ScramError`` on a wrong proof.
    """

    def __init__(self, mechanism: str, fake_key: bytes, *, lenient_nonce: bool = False) -> None:
        self._hash = _hash_name(mechanism)
        self.mechanism = mechanism
        # librdkafka before 2.6.1 (Debian's kcat) sends the client nonce twice in its
        # client-final message (confluentinc/librdkafka#4895). Kafka 3.8.1-3.9 accepted a
        # nonce that ends with the expected one; the Kafka listener does the same (the
        # server's part must still be there and the proof is still checked over the
        # message as sent), the gRPC listener keeps RFC 5802's exact match.
        self._lenient_nonce = lenient_nonce
        self._fake_key = fake_key  # per broker: fake salts must not reveal unknown users
        self.user: str | None = None
        self._credential: ScramCredential | None = None
        self._nonce = ""
        self._auth_prefix = ""

    @staticmethod
    def parse_user(client_first: bytes) -> str:
        """The user name in a client-first message. Raises ``ScramError``."""
        text = client_first.decode("utf-8", errors="strict")
        if not text.startswith(_GS2_HEADER):
            raise ScramError("SCRAM: only the gs2 header 'n,,' is supported (no channel binding)")
        attributes = _attributes(text[len(_GS2_HEADER) :])
        if "n" not in attributes or "r" not in attributes or not attributes["n"]:
            raise ScramError("SCRAM: client-first message without a user or nonce")
        return _decode_name(attributes["n"])

    def first(self, client_first: bytes, credential: ScramCredential | None) -> bytes:
        """Answer the client-first message. ``credential`` None: the user is unknown."""
        user = self.parse_user(client_first)
        bare = client_first.decode()[len(_GS2_HEADER) :]
        client_nonce = _attributes(bare)["r"]
        if credential is None:
            fake = _hmac(self._hash, self._fake_key, user.encode())
            credential = ScramCredential(self.mechanism, fake[:32], MIN_ITERATIONS, b"", b"")
        self.user = user
        self._credential = credential
        self._nonce = client_nonce + _b64(secrets.token_bytes(_NONCE_BYTES))
        server_first = f"r={self._nonce},s={_b64(credential.salt)},i={credential.iterations}"
        self._auth_prefix = f"{bare},{server_first}"
        return server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        """Check the proof; the server-final message. Raises ``ScramError`` if wrong."""
        if self._credential is None:
            raise ScramError("SCRAM: client-final before client-first")
        text = client_final.decode("utf-8", errors="strict")
        without_proof, sep, proof_part = text.rpartition(",p=")
        if not sep:
            raise ScramError("SCRAM: client-final message without a proof")
        attributes = _attributes(without_proof)
        if attributes.get("c") != _b64(_GS2_HEADER.encode()):
            raise ScramError("SCRAM: channel binding mismatch")
        nonce = attributes.get("r", "")
        if self._lenient_nonce and len(nonce) > len(self._nonce):
            nonce = nonce[-len(self._nonce) :]
        if not hmac.compare_digest(nonce.encode(), self._nonce.encode()):
            raise ScramError("SCRAM: nonce mismatch")
        proof = _unb64(proof_part)
        auth_message = f"{self._auth_prefix},{without_proof}".encode()
        credential = self._credential
        signature = _hmac(self._hash, credential.stored_key, auth_message)
        if len(proof) != len(signature) or not credential.stored_key:
            raise ScramError("authentication failed: invalid credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(
            hashlib.new(self._hash, client_key).digest(), credential.stored_key
        ):
            raise ScramError("authentication failed: invalid credentials")
        return f"v={_b64(_hmac(self._hash, credential.server_key, auth_message))}".encode()


class ScramClient:
    """The client's side of one exchange (inter-broker calls; ``client.security`` has the
    client library's own copy, since ``client`` may not import ``broker``). Not
    thread-safe."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self._hash = _hash_name(mechanism)
        self.mechanism = mechanism
        self._user = user
        self._password = password
        self._bare = f"n={_encode_name(user)},r={_b64(secrets.token_bytes(_NONCE_BYTES))}"
        self._server_signature = b""

    def first(self) -> bytes:
        """The client-first message."""
        return f"{_GS2_HEADER}{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        """The client-final message for the server-first one. Raises ``ScramError``."""
        text = server_first.decode()
        attributes = _attributes(text)
        nonce = attributes.get("r", "")
        if not nonce.startswith(_attributes(self._bare)["r"]):
            raise ScramError("SCRAM: the server's nonce does not extend ours")
        iterations = int(attributes.get("i", "0"))
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ScramError(f"SCRAM: the server asks for {iterations} iterations")
        salted = salted_password(
            self.mechanism, self._password, _unb64(attributes["s"]), iterations
        )
        without_proof = f"c={_b64(_GS2_HEADER.encode())},r={nonce}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        client_key = _hmac(self._hash, salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        signature = _hmac(self._hash, stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = _hmac(self._hash, salted, b"Server Key")
        self._server_signature = _hmac(self._hash, server_key, auth_message)
        return f"{without_proof},p={_b64(proof)}".encode()

    def check(self, server_final: bytes) -> None:
        """Verify the server's signature (it knows our credential). Raises ``ScramError``."""
        attributes = _attributes(server_final.decode())
        if "v" not in attributes or not hmac.compare_digest(
            _unb64(attributes["v"]), self._server_signature
        ):
            raise ScramError("SCRAM: the server's signature is wrong")
