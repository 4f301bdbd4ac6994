"""KIP-554 on the Kafka listener: DescribeUserScramCredentials (50) and
AlterUserScramCredentials (51) with confluent-kafka's AdminClient, over the broker's own
user store (issue #27).

A broker with SASL/SCRAM on both listeners and the authorizer on: ``admin`` is a super
user, ``bob`` an ordinary one. A user made through the Kafka API logs in with its new
password on the Kafka listener (librdkafka's SCRAM) and on the gRPC listener (Tidelog's
client), and the same store answers gRPC's ``ListUsers``; Kafka's per-user refusals and
the cluster authorization come back with Kafka's codes.
"""

from __future__ import annotations

import io
import socket
import struct
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import confluent_kafka.admin as kadmin
import pytest
from kio.schema.alter_user_scram_credentials.v0.request import (
    AlterUserScramCredentialsRequest as AlterRequest,
)
from kio.schema.alter_user_scram_credentials.v0.request import (
    ScramCredentialUpsertion as Upsertion,
)
from kio.schema.alter_user_scram_credentials.v0.response import (
    AlterUserScramCredentialsResponse as AlterResponse,
)
from kio.schema.describe_user_scram_credentials.v0.request import (
    DescribeUserScramCredentialsRequest as DescribeRequest,
)
from kio.schema.describe_user_scram_credentials.v0.request import UserName as DescribeName
from kio.schema.describe_user_scram_credentials.v0.response import (
    DescribeUserScramCredentialsResponse as DescribeResponse,
)
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i32

from tests.kafka.conftest import kafka_login_works
from tests.kafka.raw import SaslSession, read_frame
from tidelog import client
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.storage.errors import TidelogError

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 20.0
SHA256 = kadmin.ScramMechanism.SCRAM_SHA_256
SHA512 = kadmin.ScramMechanism.SCRAM_SHA_512


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data = tmp_path_factory.mktemp("scram-admin")
    users = FileUserStore.open(data)
    for name in ("admin", "bob"):
        users.upsert(name, credential_from_password("SCRAM-SHA-256", f"{name}-secret"))
    settings = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
        "authorizer.enabled": "true",
        "super.users": "User:admin",
        "kafka.listen": "127.0.0.1:0",
        "sasl.login.failures.max": "1000",
    }
    with InProcessBroker(data, settings=settings) as running:
        yield running


def _kafka(broker: InProcessBroker, user: str, password: str, mechanism: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": f"127.0.0.1:{broker.server.kafka_port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def _admin(broker: InProcessBroker, user: str = "admin") -> kadmin.AdminClient:
    return kadmin.AdminClient(_kafka(broker, user, f"{user}-secret", "SCRAM-SHA-256"))


def _kafka_login_works(broker: InProcessBroker, user: str, password: str, mechanism: str) -> bool:
    """Whether librdkafka logs in as ``user`` and gets an answer (list_topics)."""
    return kafka_login_works(_kafka(broker, user, password, mechanism))


def _grpc_login_works(broker: InProcessBroker, user: str, password: str, mechanism: str) -> bool:
    try:
        with client.AdminClient(
            broker.address, security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
            sasl_plain_username=user, sasl_plain_password=password, request_timeout_ms=5_000,
        ) as admin:  # fmt: skip
            admin.list_topics()
        return True
    except TidelogError:
        return False


def _alter(admin: kadmin.AdminClient, alterations: list[Any]) -> dict[str, str | None]:
    """user -> None (done) or the Kafka error name."""
    out: dict[str, str | None] = {}
    for user, future in admin.alter_user_scram_credentials(alterations).items():
        try:
            future.result(TIMEOUT_S)
            out[user] = None
        except confluent_kafka.KafkaException as exc:
            out[user] = exc.args[0].name()
    return out


def _upsert(user: str, password: str, mechanism: Any = SHA512, iterations: int = 8192) -> Any:
    return kadmin.UserScramCredentialUpsertion(
        user, kadmin.ScramCredentialInfo(mechanism, iterations), password.encode()
    )


def test_a_user_made_through_kafka_logs_in_on_both_listeners(broker: InProcessBroker) -> None:
    admin = _admin(broker)
    assert _alter(admin, [_upsert("carol", "carol-1"), _upsert("carol", "carol-1", SHA256, 4096)])
    assert _alter(admin, [_upsert("dave", "dave-1")]) == {"dave": None}
    described = admin.describe_user_scram_credentials(["carol"])["carol"].result(TIMEOUT_S)
    infos = {(i.mechanism, i.iterations) for i in described.scram_credential_infos}
    assert infos == {(SHA256, 4096), (SHA512, 8192)}
    everyone = admin.describe_user_scram_credentials().result(TIMEOUT_S)
    assert {"admin", "bob", "carol", "dave"} <= set(everyone)

    assert _kafka_login_works(broker, "carol", "carol-1", "SCRAM-SHA-512")
    assert _grpc_login_works(broker, "carol", "carol-1", "SCRAM-SHA-256")
    assert not _kafka_login_works(broker, "carol", "wrong", "SCRAM-SHA-512")

    # A new password through Kafka: the old one is refused, the new one logs in.
    assert _alter(admin, [_upsert("carol", "carol-2")]) == {"carol": None}
    assert not _kafka_login_works(broker, "carol", "carol-1", "SCRAM-SHA-512")
    assert _kafka_login_works(broker, "carol", "carol-2", "SCRAM-SHA-512")
    assert _grpc_login_works(broker, "carol", "carol-2", "SCRAM-SHA-512")
    # gRPC's ListUsers reads the same store.
    with client.AdminClient(
        broker.address, security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="admin", sasl_plain_password="admin-secret",
    ) as grpc_admin:  # fmt: skip
        assert grpc_admin.list_users()["carol"] == {"SCRAM-SHA-256": 4096, "SCRAM-SHA-512": 8192}

    # Deletion by mechanism: SHA-512 gone, SHA-256 still logs in.
    assert _alter(admin, [kadmin.UserScramCredentialDeletion("carol", SHA512)]) == {"carol": None}
    assert not _kafka_login_works(broker, "carol", "carol-2", "SCRAM-SHA-512")
    assert _kafka_login_works(broker, "carol", "carol-1", "SCRAM-SHA-256")


def test_kafkas_refusals_per_user(broker: InProcessBroker) -> None:
    admin = _admin(broker)
    results = _alter(
        admin,
        [
            kadmin.UserScramCredentialDeletion("nobody", SHA256),
            _upsert("too-few", "x", iterations=4095),
            _upsert("too-many", "x", iterations=16385),
            _upsert("twice", "a"),
            _upsert("twice", "b"),
            _upsert("fine", "fine-1"),
        ],
    )
    assert results == {
        "nobody": "RESOURCE_NOT_FOUND",
        "too-few": "UNACCEPTABLE_CREDENTIAL",
        "too-many": "UNACCEPTABLE_CREDENTIAL",
        "twice": "DUPLICATE_RESOURCE",
        "fine": None,
    }
    # Nothing of a refused user was stored; the good one was.
    everyone = admin.describe_user_scram_credentials().result(TIMEOUT_S)
    assert "fine" in everyone
    assert not {"too-few", "too-many", "twice"} & set(everyone)

    missing = admin.describe_user_scram_credentials(["nobody"])["nobody"]
    with pytest.raises(confluent_kafka.KafkaException) as caught:
        missing.result(TIMEOUT_S)
    assert caught.value.args[0].name() == "RESOURCE_NOT_FOUND"


def _raw(
    broker: InProcessBroker, api_key: int, request: Any, response_class: Any, user: str = "admin"
) -> Any:
    """One raw v0 request as ``user`` (logged in with SCRAM first): kio writes the body,
    the flexible header v2 is written here."""
    body = io.BytesIO()
    entity_writer(type(request))(body, request)
    client_id = b"test-scram-raw"
    header = struct.pack(">hhih", api_key, 0, 100, len(client_id)) + client_id + b"\x00"
    frame = header + body.getvalue()
    sock = socket.create_connection(("127.0.0.1", broker.server.kafka_port), TIMEOUT_S)
    session = SaslSession(sock, "test-scram-raw")
    try:
        assert session.login(user, f"{user}-secret").error_code == 0
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        answer = read_frame(sock)
    finally:
        session.close()
    assert answer is not None, "the broker hung up"
    assert struct.unpack_from(">i", answer)[0] == 100
    response, _ = entity_reader(response_class)(answer, 5)
    return response


def test_raw_requests_for_what_librdkafka_refuses_to_send(broker: InProcessBroker) -> None:
    """A user described twice, an empty name and an unknown mechanism: confluent-kafka
    checks these before sending; Kafka's broker answers them anyway."""
    twice = DescribeRequest(users=(DescribeName(name="admin"), DescribeName(name="admin")))
    answer = _raw(broker, 50, twice, DescribeResponse)
    assert [(r.user, r.error_code) for r in answer.results] == [
        ("admin", ErrorCode.duplicate_resource)
    ]
    fields = {"iterations": i32(4096), "salt": b"s" * 16, "salted_password": b"p" * 32}
    upsertions = (
        Upsertion(name="", mechanism=i8(1), **fields),
        Upsertion(name="erin", mechanism=i8(3), **fields),
    )
    answer = _raw(broker, 51, AlterRequest(deletions=(), upsertions=upsertions), AlterResponse)
    assert {r.user: r.error_code for r in answer.results} == {
        "": ErrorCode.unacceptable_credential,
        "erin": ErrorCode.unsupported_sasl_mechanism,
    }


def test_an_ordinary_user_is_refused_with_cluster_authorization_failed(
    broker: InProcessBroker,
) -> None:
    admin = _admin(broker, "bob")
    assert _alter(admin, [_upsert("mallory", "m")]) == {"mallory": "CLUSTER_AUTHORIZATION_FAILED"}
    # Raw: confluent-kafka 2.16.1 crashes its process on a describe refused as a whole
    # (the answer Kafka gives: top-level error, no results).
    answer = _raw(broker, 50, DescribeRequest(users=None), DescribeResponse, user="bob")
    assert (answer.error_code, answer.results) == (ErrorCode.cluster_authorization_failed, ())
    assert not _kafka_login_works(broker, "mallory", "m", "SCRAM-SHA-512")
