"""SCRAM and PLAIN on bytes (``broker.core.scram``), against RFC 7677's example and the client
library's own implementation (``client.security``)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from tidelog.broker.core.scram import (
    ScramClient,
    ScramCredential,
    ScramError,
    ScramServer,
    credential_from_password,
    parse_plain,
    verify_password,
)
from tidelog.client.security import ClientSecurity, login
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import SaslAuthenticationError

FAKE_KEY = b"k" * 32


def test_rfc7677_example_verifies_against_the_stored_credential() -> None:
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = credential_from_password("SCRAM-SHA-256", "pencil", 4096, salt)
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    auth_message = (
        f"n=user,r=rOprNGfwEbeRWgbNEkqO,r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,"
        f"c=biws,r={nonce}"
    ).encode()
    proof = base64.b64decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    signature = hmac.new(credential.stored_key, auth_message, "sha256").digest()
    client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
    assert hashlib.sha256(client_key).digest() == credential.stored_key
    server_signature = hmac.new(credential.server_key, auth_message, "sha256").digest()
    assert base64.b64encode(server_signature) == b"6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_exchange_and_wrong_password(mechanism: str) -> None:
    credential = credential_from_password(mechanism, "s3cret")
    assert ScramCredential.from_text(mechanism, credential.to_text()) == credential
    client = ScramClient(mechanism, "a,b=c", "s3cret")
    server = ScramServer(mechanism, FAKE_KEY)
    assert ScramServer.parse_user(client.first()) == "a,b=c"
    server_first = server.first(client.first(), credential)
    client.check(server.final(client.final(server_first)))
    wrong = ScramClient(mechanism, "a,b=c", "guess")
    server = ScramServer(mechanism, FAKE_KEY)
    with pytest.raises(ScramError, match="invalid credentials"):
        server.final(wrong.final(server.first(wrong.first(), credential)))


def test_unknown_users_look_like_known_ones_until_the_proof() -> None:
    client = ScramClient("SCRAM-SHA-256", "ghost", "pw")
    server = ScramServer("SCRAM-SHA-256", FAKE_KEY)
    first = server.first(client.first(), None).decode()
    assert first.startswith("r=")
    assert ",s=" in first
    assert first.endswith(",i=4096")
    again = ScramServer("SCRAM-SHA-256", FAKE_KEY).first(client.first(), None).decode()
    assert first.split(",s=")[1] == again.split(",s=")[1]  # a stable salt per name
    with pytest.raises(ScramError):
        server.final(client.final(first.encode()))


def test_client_library_logs_in_against_the_broker_side() -> None:
    credential = credential_from_password("SCRAM-SHA-512", "pw")
    servers: dict[str, ScramServer] = {}

    def authenticate(request: pb.AuthenticateRequest) -> pb.AuthenticateResponse:
        if not request.handshake_id:
            servers["h"] = ScramServer(request.mechanism, FAKE_KEY)
            first = servers["h"].first(request.auth_bytes, credential)
            return pb.AuthenticateResponse(auth_bytes=first, handshake_id="h")
        final = servers["h"].final(request.auth_bytes)
        return pb.AuthenticateResponse(
            auth_bytes=final, complete=True, session_token="t", principal="User:u"
        )

    security = ClientSecurity(
        security_protocol="SASL_PLAINTEXT", sasl_plain_username="u", sasl_plain_password="pw"
    )
    assert login(security, authenticate) == ("t", "User:u")

    def impostor(request: pb.AuthenticateRequest) -> pb.AuthenticateResponse:
        answer = authenticate(request)
        if answer.complete:
            answer.auth_bytes = b"v=" + base64.b64encode(b"x" * 64)
        return answer

    with pytest.raises(SaslAuthenticationError, match="signature"):
        login(security, impostor)


def test_plain_and_iteration_bounds() -> None:
    assert parse_plain(b"\0alice\0pw") == ("alice", "pw")
    with pytest.raises(ScramError):
        parse_plain(b"alice\0pw")
    credential = credential_from_password("SCRAM-SHA-256", "pw")
    assert verify_password(credential, "pw")
    assert not verify_password(credential, "pW")
    for iterations in (4095, 16385):
        with pytest.raises(ScramError, match="iterations"):
            credential_from_password("SCRAM-SHA-256", "pw", iterations)


def _librdkafka_final(client_first: bytes, server_first: bytes, password: str) -> bytes:
    """The client-final message librdkafka < 2.6.1 sends: the client nonce twice
    (confluentinc/librdkafka#4895), the proof over that very message."""
    bare = client_first.decode()[len("n,,") :]
    attributes = dict(part.split("=", 1) for part in server_first.decode().split(","))
    client_nonce = dict(part.split("=", 1) for part in bare.split(","))["r"]
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(attributes["s"]), int(attributes["i"])
    )
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    without_proof = f"c=biws,r={client_nonce}{attributes['r']}"
    auth_message = f"{bare},{server_first.decode()},{without_proof}".encode()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth_message, "sha256").digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def test_a_repeated_client_nonce_is_taken_only_where_lenient() -> None:
    credential = credential_from_password("SCRAM-SHA-256", "pw")
    for lenient in (True, False):
        client = ScramClient("SCRAM-SHA-256", "kcat", "pw")
        server = ScramServer("SCRAM-SHA-256", FAKE_KEY, lenient_nonce=lenient)
        server_first = server.first(client.first(), credential)
        final = _librdkafka_final(client.first(), server_first, "pw")
        if lenient:
            assert server.final(final).startswith(b"v=")  # the Kafka listener (Kafka 3.9)
        else:
            with pytest.raises(ScramError, match="nonce mismatch"):  # the gRPC listener
                server.final(final)
    # Lenient or not, the server's part of the nonce must be there.
    client = ScramClient("SCRAM-SHA-256", "kcat", "pw")
    server = ScramServer("SCRAM-SHA-256", FAKE_KEY, lenient_nonce=True)
    server_first = server.first(client.first(), credential)
    nonce = server_first.split(b",")[0][2:]
    forged = server_first.replace(nonce, nonce[:-1] + (b"A" if nonce[-1:] != b"A" else b"B"))
    with pytest.raises(ScramError, match="nonce mismatch"):
        server.final(_librdkafka_final(client.first(), forged, "pw"))
