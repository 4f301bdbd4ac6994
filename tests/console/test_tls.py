"""``tidelog console`` in front of a TLS + SCRAM broker (``SASL_SSL``): the console reads
the protocol, the mechanism and the CA from ``--command-config``, a person logs in with a
SCRAM user, and the pages work with that user's clients over TLS."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.console.conftest import console_client, csrf_token
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_broker(pki: TestPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data_dir = tmp_path_factory.mktemp("tls-data")
    users = FileUserStore.open(data_dir)
    users.upsert("alice", credential_from_password("SCRAM-SHA-512", "alice-secret"))
    with InProcessBroker(data_dir, settings=pki.broker_settings("SASL_SSL")) as broker:
        yield broker


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _token(page: httpx.Response) -> str:
    found = _CSRF.search(page.text)
    assert found, page.text
    return found.group(1)


def test_console_logs_in_over_tls_with_the_ca_of_command_config(
    pki: TestPki, tls_broker: InProcessBroker, tmp_path: Path
) -> None:
    properties = tmp_path / "console.properties"
    properties.write_text(
        f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nssl.cafile={pki.ca_cert}\n"
    )
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tidelog.client.cli", "console", "--bootstrap", tls_broker.address,
         "--listen", f"127.0.0.1:{port}", "--command-config", str(properties)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20) as web:
            deadline = time.monotonic() + 30
            while True:
                try:
                    first = web.get("/topics")
                    break
                except httpx.TransportError:
                    assert process.poll() is None, process.communicate(timeout=5)
                    assert time.monotonic() < deadline, "the console did not start"
                    time.sleep(0.2)
            assert first.status_code == 303
            assert first.headers["location"] == "/login?next=/topics"
            login = web.get("/login")
            refused = web.post(
                "/login",
                data={"csrf_token": _token(login), "username": "alice", "password": "wrong"},
            )
            assert refused.status_code == 401
            assert "refused this user name and password" in refused.text
            signed = web.post(
                "/login",
                data={
                    "csrf_token": _token(refused),
                    "username": "alice",
                    "password": "alice-secret",
                    "next": "/topics",
                },
            )
            assert signed.status_code == 303, signed.text
            topics = web.get("/topics")
            assert topics.status_code == 200
            assert "Signed in as" in topics.text
            token = _token(topics)
            created = web.post("/topics", data={"csrf_token": token, "name": "over-tls"})
            assert created.status_code == 303
            sent = web.post(
                "/topics/over-tls/produce",
                data={"csrf_token": token, "partition": "0", "value": "encrypted on the wire"},
            )
            assert sent.status_code == 303
            shown = web.get(sent.headers["location"])
            assert "Sent: partition 0, offset 0." in shown.text
            assert "encrypted on the wire" in shown.text
            for path in ("/", "/groups", "/security", "/api/charts/overview"):
                assert web.get(path).status_code == 200, path
            assert web.post("/logout", data={"csrf_token": token}).status_code == 303
            assert web.get("/topics").status_code == 303
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)
    assert process.returncode == 0, err
    assert "alice-secret" not in out + err


def test_without_the_ca_the_login_says_the_cluster_cannot_be_reached(
    tls_broker: InProcessBroker,
) -> None:
    security = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512"}
    config = {"security": security, "request_timeout_ms": 2_000}
    with console_client(tls_broker.address, **config) as web:
        answer = web.post(
            "/login",
            data={
                "csrf_token": csrf_token(web, "/login"),
                "username": "alice",
                "password": "alice-secret",
            },
        )
        assert answer.status_code == 401
        assert "could not be reached" in answer.text
        assert web.get("/topics").status_code == 303
