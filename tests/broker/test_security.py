"""TLS and SASL on a real broker (docs/security.md): certificates made by ``openssl``.

Each test runs an ``InProcessBroker`` on 127.0.0.1:0 with a temporary data directory and
talks to it with the real client or the generated stub.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from tests.broker.conftest import error_code
from tidelog.broker.core.auth import SESSION_METADATA_KEY
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import CREDENTIALS_FILE, FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.grpc_connection import GrpcConnection
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import (
    BrokerUnavailableError,
    ResourceNotFoundError,
    SaslAuthenticationError,
    UnsupportedSaslMechanismError,
)

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    store = FileUserStore.open(path)
    store.upsert("alice", credential_from_password("SCRAM-SHA-256", "alice-secret"))
    store.upsert("alice", credential_from_password("SCRAM-SHA-512", "alice-secret"))
    return path


def sasl(
    pki: TestPki, protocol: str, mechanism: str, user: str = "alice", password: str = "alice-secret"
) -> dict[str, str]:
    settings = pki.client_settings(protocol) if protocol.endswith("SSL") else {}
    return {
        **settings,
        "security_protocol": protocol,
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }


def round_trip(address: str, **security: str) -> list[bytes]:
    with AdminClient(address, request_timeout_ms=10_000, **security) as admin:
        admin.create_topic("events", partitions=1)
    with Producer(address, request_timeout_ms=10_000, **security) as producer:
        producer.send("events", b"one").result(timeout=TIMEOUT_S)
        producer.send("events", b"two").result(timeout=TIMEOUT_S)
    with Consumer(address, auto_offset_reset="earliest", **security) as consumer:
        consumer.assign([TopicPartition("events", 0)])
        values: list[bytes] = []
        for _ in range(20):
            values += [r.value for r in consumer.poll(timeout_ms=500) if r.value is not None]
            if len(values) >= 2:
                break
    return values


# --- TLS ----------------------------------------------------------------------------------


def test_tls_produce_and_consume(pki: TestPki) -> None:
    with InProcessBroker(settings=pki.broker_settings("SSL")) as broker:
        assert round_trip(broker.address, **pki.client_settings("SSL")) == [b"one", b"two"]


def test_plaintext_client_cannot_talk_to_a_tls_listener(pki: TestPki) -> None:
    with (
        InProcessBroker(settings=pki.broker_settings("SSL")) as broker,
        AdminClient(broker.address, request_timeout_ms=1_500) as admin,
        pytest.raises(BrokerUnavailableError),
    ):
        admin.list_topics()


def test_client_refuses_a_broker_certificate_from_an_unknown_ca(
    pki: TestPki, tmp_path: Path
) -> None:
    other = TestPki.create(tmp_path / "other", name="other")
    with (
        InProcessBroker(settings=pki.broker_settings("SSL")) as broker,
        AdminClient(
            broker.address, request_timeout_ms=1_500, **other.client_settings("SSL")
        ) as admin,
        pytest.raises(BrokerUnavailableError),
    ):
        admin.list_topics()


def test_client_refuses_an_expired_broker_certificate(pki: TestPki, tmp_path: Path) -> None:
    cert, key = pki.issue("expired-server", "/CN=localhost", server=True, days=-1)
    settings = {**pki.broker_settings("SSL"), "ssl.certfile": str(cert), "ssl.keyfile": str(key)}
    with (
        InProcessBroker(settings=settings) as broker,
        AdminClient(
            broker.address, request_timeout_ms=1_500, **pki.client_settings("SSL")
        ) as admin,
        pytest.raises(BrokerUnavailableError),
    ):
        admin.list_topics()


def _audit_lines(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_mutual_tls_names_the_caller_by_its_certificate_subject(
    pki: TestPki, tmp_path: Path
) -> None:
    audit_file = tmp_path / "audit.log"
    settings = {**pki.broker_settings("SSL", "required"), "audit.log.file": str(audit_file)}
    with InProcessBroker(settings=settings) as broker:
        security = pki.client_settings("SSL", certificate=True)
        with AdminClient(broker.address, request_timeout_ms=10_000, **security) as admin:
            admin.upsert_user("bob", "bob-secret")  # audited with the caller's principal
    upserts = [e for e in _audit_lines(audit_file) if e.get("event") == "user_upserted"]
    assert upserts
    assert upserts[-1]["user"] == "bob"
    assert upserts[-1]["principal"] == "User:CN=alice,O=Tidelog"
    assert "bob-secret" not in audit_file.read_text()


def test_mutual_tls_refuses_missing_untrusted_and_expired_client_certificates(
    pki: TestPki, tmp_path: Path
) -> None:
    other = TestPki.create(tmp_path / "other", name="other")
    expired_cert, expired_key = pki.issue("expired-client", "/CN=old", days=-1)
    with InProcessBroker(settings=pki.broker_settings("SSL", "required")) as broker:
        for security in (
            pki.client_settings("SSL"),  # no certificate
            {
                **pki.client_settings("SSL"),
                "ssl_certfile": str(other.client_cert),
                "ssl_keyfile": str(other.client_key),
            },
            {
                **pki.client_settings("SSL"),
                "ssl_certfile": str(expired_cert),
                "ssl_keyfile": str(expired_key),
            },
        ):
            with (
                AdminClient(broker.address, request_timeout_ms=1_500, **security) as admin,
                pytest.raises(BrokerUnavailableError),
            ):
                admin.list_topics()
        with AdminClient(broker.address, **pki.client_settings("SSL", certificate=True)) as admin:
            assert admin.list_topics() is not None


def _served_certificate(port: int, ca: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as wrapped,
    ):
        der = wrapped.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(pem: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.read_text())


def test_certificates_reload_without_dropping_connections(pki: TestPki, tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(pki.server_cert, live / "server.pem")
    shutil.copy(pki.server_key, live / "server.key")
    settings = {
        **pki.broker_settings("SSL"),
        "ssl.certfile": str(live / "server.pem"),
        "ssl.keyfile": str(live / "server.key"),
    }
    with InProcessBroker(settings=settings) as broker:
        assert _served_certificate(broker.port, pki.ca_cert) == _der(pki.server_cert)
        credentials = grpc.ssl_channel_credentials(pki.ca_cert.read_bytes())
        with grpc.secure_channel(broker.address, credentials) as channel:
            stub = pb_grpc.BrokerStub(channel)
            stub.ListTopics(pb.ListTopicsRequest(), timeout=TIMEOUT_S)
            new_cert, new_key = pki.issue("renewed-server", "/CN=localhost", server=True)
            shutil.copy(new_cert, live / "server.pem")
            shutil.copy(new_key, live / "server.key")
            broker.server.reload_certificates()  # what SIGHUP does
            assert _served_certificate(broker.port, pki.ca_cert) == _der(new_cert)
            # The connection made before the reload still serves calls.
            call = stub.ListTopics.with_call(pb.ListTopicsRequest(), timeout=TIMEOUT_S)
            assert call[1].code() == grpc.StatusCode.OK
        assert broker.server.tls is not None
        assert broker.server.tls.reloads == 1


# --- SASL ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_over_tls(pki: TestPki, data_dir: Path, mechanism: str) -> None:
    with InProcessBroker(data_dir, settings=pki.broker_settings("SASL_SSL")) as broker:
        values = round_trip(broker.address, **sasl(pki, "SASL_SSL", mechanism))
    assert values == [b"one", b"two"]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_wrong_password(pki: TestPki, data_dir: Path, mechanism: str) -> None:
    with InProcessBroker(data_dir, settings={"security.protocol": "SASL_PLAINTEXT"}) as broker:
        security = sasl(pki, "SASL_PLAINTEXT", mechanism, password="wrong")
        with (
            AdminClient(broker.address, request_timeout_ms=5_000, **security) as admin,
            pytest.raises(SaslAuthenticationError, match="invalid credentials"),
        ):
            admin.list_topics()
        unknown = sasl(pki, "SASL_PLAINTEXT", mechanism, user="nobody")
        with (
            AdminClient(broker.address, request_timeout_ms=5_000, **unknown) as admin,
            pytest.raises(SaslAuthenticationError, match="invalid credentials"),
        ):
            admin.list_topics()


def test_plain_over_tls_only(pki: TestPki, data_dir: Path) -> None:
    with pytest.raises(ValueError, match="SASL_SSL"):
        AdminClient("127.0.0.1:1", **sasl(pki, "SASL_PLAINTEXT", "PLAIN"))
    settings = {"security.protocol": "SASL_PLAINTEXT", "sasl.enabled.mechanisms": "PLAIN"}
    with InProcessBroker(data_dir, settings=settings) as broker:
        with broker.channel() as channel, pytest.raises(grpc.RpcError) as refused:
            pb_grpc.BrokerStub(channel).Authenticate(
                pb.AuthenticateRequest(mechanism="PLAIN", auth_bytes=b"\0alice\0alice-secret"),
                timeout=TIMEOUT_S,
            )
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_code(refused.value) == UnsupportedSaslMechanismError.code
    settings = {**pki.broker_settings("SASL_SSL"), "sasl.enabled.mechanisms": "PLAIN"}
    with InProcessBroker(data_dir, settings=settings) as broker:
        assert round_trip(broker.address, **sasl(pki, "SASL_SSL", "PLAIN")) == [b"one", b"two"]


def test_failed_logins_are_rate_limited_and_logged_without_the_password(
    pki: TestPki, data_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    audit_file = tmp_path / "audit.log"
    settings = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.login.failures.max": 3,
        "audit.log.file": str(audit_file),
    }
    caplog.set_level(logging.INFO)
    with InProcessBroker(data_dir, settings=settings) as broker:
        wrong = sasl(pki, "SASL_PLAINTEXT", "SCRAM-SHA-256", password="guess-123")
        for _ in range(3):
            with (
                AdminClient(broker.address, request_timeout_ms=5_000, **wrong) as admin,
                pytest.raises(SaslAuthenticationError, match="invalid credentials"),
            ):
                admin.list_topics()
        right = sasl(pki, "SASL_PLAINTEXT", "SCRAM-SHA-256")
        with (
            AdminClient(broker.address, request_timeout_ms=5_000, **right) as admin,
            pytest.raises(SaslAuthenticationError, match="too many failed logins"),
        ):
            admin.list_topics()
    failures = [e for e in _audit_lines(audit_file) if e["event"] == "authentication_failed"]
    assert len(failures) == 3
    assert {f["user"] for f in failures} == {"alice"}
    assert failures[0]["host"] == "127.0.0.1"
    assert all("time" in f and "peer" in f for f in failures)
    assert "guess-123" not in audit_file.read_text()
    assert "guess-123" not in caplog.text


def test_a_successful_login_does_not_reset_the_failure_count(pki: TestPki, data_dir: Path) -> None:
    """Someone with one valid account cannot interleave their own logins with guesses at
    another user's password to stay under the limit."""
    settings = {"security.protocol": "SASL_PLAINTEXT", "sasl.login.failures.max": 3}
    right = sasl(pki, "SASL_PLAINTEXT", "SCRAM-SHA-256")
    wrong = sasl(pki, "SASL_PLAINTEXT", "SCRAM-SHA-256", user="bob", password="guess")
    with InProcessBroker(data_dir, settings=settings) as broker:
        for _ in range(3):
            with AdminClient(broker.address, request_timeout_ms=5_000, **right) as admin:
                admin.list_topics()
            with (
                AdminClient(broker.address, request_timeout_ms=5_000, **wrong) as admin,
                pytest.raises(SaslAuthenticationError, match="invalid credentials"),
            ):
                admin.list_topics()
        with (
            AdminClient(broker.address, request_timeout_ms=5_000, **wrong) as admin,
            pytest.raises(SaslAuthenticationError, match="too many failed logins"),
        ):
            admin.list_topics()


def test_calls_need_a_session_token_bound_to_their_connection(pki: TestPki, data_dir: Path) -> None:
    with InProcessBroker(data_dir, settings={"security.protocol": "SASL_PLAINTEXT"}) as broker:
        with broker.channel() as channel:
            stub = pb_grpc.BrokerStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.ListTopics(pb.ListTopicsRequest(), timeout=TIMEOUT_S)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error_code(refused.value) == "SASL_AUTHENTICATION_FAILED"
            stream = stub.FetchStream(iter([pb.FetchRequest()]), timeout=TIMEOUT_S)
            with pytest.raises(grpc.RpcError) as streamed:
                list(stream)
            assert streamed.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # A token obtained on one connection is worthless on another.
        with AdminClient(broker.address, **sasl(pki, "SASL_PLAINTEXT", "SCRAM-SHA-256")) as admin:
            admin.list_topics()
            connection = admin._connections.route_any()(5_000)
            assert isinstance(connection, GrpcConnection)
            session = connection.transport._session
            assert session is not None
            assert session.token is not None
            token = session.token
        with broker.channel() as other:
            with pytest.raises(grpc.RpcError) as stolen:
                pb_grpc.BrokerStub(other).ListTopics(
                    pb.ListTopicsRequest(),
                    timeout=TIMEOUT_S,
                    metadata=((SESSION_METADATA_KEY, token),),
                )
            assert error_code(stolen.value) == "SASL_SESSION_EXPIRED"


def test_client_logs_in_again_after_the_broker_restarts(pki: TestPki, data_dir: Path) -> None:
    with InProcessBroker(data_dir, settings={"security.protocol": "SASL_PLAINTEXT"}) as broker:
        security = sasl(pki, "SASL_PLAINTEXT", "SCRAM-SHA-512")
        with AdminClient(broker.address, request_timeout_ms=15_000, **security) as admin:
            admin.create_topic("kept", partitions=1)
            broker.restart()
            assert "kept" in [t.name for t in admin.list_topics()]


def test_users_through_the_admin_client_are_durable(pki: TestPki, data_dir: Path) -> None:
    settings = {"security.protocol": "SASL_PLAINTEXT"}
    admin_login = sasl(pki, "SASL_PLAINTEXT", "SCRAM-SHA-256")
    with InProcessBroker(data_dir, settings=settings) as broker:
        with AdminClient(broker.address, **admin_login) as admin:
            admin.upsert_user("carol", "carol-secret", "SCRAM-SHA-512", iterations=8192)
            assert admin.list_users()["carol"] == {"SCRAM-SHA-512": 8192}
        broker.restart()
        carol = sasl(pki, "SASL_PLAINTEXT", "SCRAM-SHA-512", "carol", "carol-secret")
        with AdminClient(broker.address, **carol) as admin:
            admin.list_topics()
        with AdminClient(broker.address, **admin_login) as admin:
            admin.delete_user("carol")
            assert "carol" not in admin.list_users()
            with pytest.raises(ResourceNotFoundError):
                admin.delete_user("carol")
            with pytest.raises(ValueError, match="iterations"):
                admin.upsert_user("dave", "pw", iterations=1000)
    stored = (data_dir / CREDENTIALS_FILE).read_text()
    assert "alice-secret" not in stored
    assert "carol" not in stored
    assert (data_dir / CREDENTIALS_FILE).stat().st_mode & 0o077 == 0


def test_without_security_settings_nothing_changes() -> None:
    with InProcessBroker() as broker:
        assert broker.config.security.protocol == "PLAINTEXT"
        assert round_trip(broker.address) == [b"one", b"two"]


def test_sighup_reloads_the_certificates_of_a_broker_process(pki: TestPki, tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(pki.server_cert, live / "server.pem")
    shutil.copy(pki.server_key, live / "server.key")
    ready = tmp_path / "ready"
    settings = {
        **pki.broker_settings("SSL"),
        "ssl.certfile": str(live / "server.pem"),
        "ssl.keyfile": str(live / "server.key"),
        "metrics.port": "-1",
    }
    command = [sys.executable, "-m", "tidelog.broker", "--listen", "127.0.0.1:0", "--data-dir",
               str(tmp_path / "data"), "--ready-file", str(ready)]  # fmt: skip
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert process.poll() is None, "the broker exited"
            assert time.monotonic() < deadline, "the broker did not start"
            time.sleep(0.05)
        address = ready.read_text().strip()
        port = int(address.rsplit(":", 1)[1])
        credentials = grpc.ssl_channel_credentials(pki.ca_cert.read_bytes())
        with grpc.secure_channel(address, credentials) as channel:
            stub = pb_grpc.BrokerStub(channel)
            stub.ListTopics(pb.ListTopicsRequest(), timeout=TIMEOUT_S)
            new_cert, new_key = pki.issue("sighup-server", "/CN=localhost", server=True)
            shutil.copy(new_cert, live / "server.pem")
            shutil.copy(new_key, live / "server.key")
            process.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while _served_certificate(port, pki.ca_cert) != _der(new_cert):
                assert time.monotonic() < deadline, "the new certificate was not served"
                time.sleep(0.1)
            stub.ListTopics(pb.ListTopicsRequest(), timeout=TIMEOUT_S)  # same connection
        health = [sys.executable, "-m", "tidelog.broker", "healthcheck", "--address", address]
        assert subprocess.run([*health, "--cafile", str(pki.ca_cert)], check=False).returncode == 0
        assert process.poll() is None
    finally:
        process.terminate()
        process.wait(30)


def test_metrics_bind_to_loopback_and_may_require_tls(pki: TestPki) -> None:
    settings = {**pki.broker_settings("SSL"), "metrics.ssl.enable": "true"}
    with InProcessBroker(settings=settings, metrics=True) as broker:
        assert broker.config.effective_metrics_host == "127.0.0.1"
        port = broker.metrics_port
        assert port is not None
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        with urllib.request.urlopen(
            f"https://localhost:{port}/metrics", context=context, timeout=TIMEOUT_S
        ) as answer:
            assert b"tidelog" in answer.read()
        # URLError or a connection reset, as the TLS server meets plain HTTP: any OSError.
        with pytest.raises(OSError):  # noqa: PT011
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT_S)


def test_producer_and_consumer_log_in_again_after_the_broker_restarts(
    pki: TestPki, data_dir: Path
) -> None:
    security = sasl(pki, "SASL_PLAINTEXT", "SCRAM-SHA-256")
    with InProcessBroker(data_dir, settings={"security.protocol": "SASL_PLAINTEXT"}) as broker:
        with AdminClient(broker.address, **security) as admin:
            admin.create_topic("restarts", partitions=1)
        with (
            Producer(broker.address, request_timeout_ms=10_000, **security) as producer,
            Consumer(broker.address, auto_offset_reset="earliest", **security) as consumer,
        ):
            consumer.assign([TopicPartition("restarts", 0)])
            producer.send("restarts", b"before").result(timeout=TIMEOUT_S)
            broker.restart()
            producer.send("restarts", b"after").result(timeout=30)
            values: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(values) < 2 and time.monotonic() < deadline:
                values += [r.value for r in consumer.poll(timeout_ms=500) if r.value]
        assert values == [b"before", b"after"]
