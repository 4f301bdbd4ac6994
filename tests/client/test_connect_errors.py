"""What a client says when it cannot reach a broker (issue #25 item 6): the whole time it
waited and the first cause, including a TLS mismatch either way, against real brokers."""

from __future__ import annotations

import re

import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki
from tidelog.client import AdminClient
from tidelog.client.transport import describe_unavailable
from tidelog.storage.errors import BrokerUnavailableError

pytestmark = pytest.mark.timeout(120)

TIMEOUT_MS = 3_000

# gRPC's details as grpcio 1.7x/1.8x words them (seen against Tidelog's broker).
TLS_AT_PLAINTEXT = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:32357: Tls"
    " handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL"
    " routines:OPENSSL_internal:WRONG_VERSION_NUMBER: Invalid certificate verification"
    " context: OK"
)
PLAINTEXT_AT_TLS = (
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:28427:"
    " Socket closed"
)
REFUSED = (
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1:"
    " Connection refused"
)


def test_describe_unavailable_names_the_cause() -> None:
    assert describe_unavailable(TLS_AT_PLAINTEXT, tls=True) == (
        "the broker did not answer the TLS handshake (OpenSSL: WRONG_VERSION_NUMBER);"
        " is its listener TLS?"
    )
    assert describe_unavailable(PLAINTEXT_AT_TLS, tls=False).startswith(
        "the broker closed the connection without answering; is its listener TLS?"
    )
    # A TLS client whose connection is closed learns nothing about TLS from it.
    assert describe_unavailable(PLAINTEXT_AT_TLS, tls=True) == PLAINTEXT_AT_TLS
    assert describe_unavailable(PLAINTEXT_AT_TLS) == PLAINTEXT_AT_TLS
    assert describe_unavailable(REFUSED, tls=False).startswith("connection refused")
    assert describe_unavailable("Tls handshake failed: CERTIFICATE_VERIFY_FAILED").startswith(
        "the TLS handshake failed"
    )
    assert describe_unavailable("") == "no details"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki.create(tmp_path_factory.mktemp("pki"))


def waited_ms(message: str) -> int:
    found = re.search(r"gave up after (\d+) ms", message)
    assert found, message
    return int(found.group(1))


def test_a_tls_client_at_a_plaintext_listener_says_so(pki: TestPki) -> None:
    with (
        InProcessBroker() as broker,
        AdminClient(
            broker.address,
            request_timeout_ms=TIMEOUT_MS,
            security_protocol="SSL",
            ssl_cafile=str(pki.ca_cert),
        ) as admin,
        pytest.raises(BrokerUnavailableError) as raised,
    ):
        admin.list_topics()
    message = str(raised.value)
    assert "the broker did not answer the TLS handshake" in message
    assert "is its listener TLS?" in message
    assert TIMEOUT_MS - 100 <= waited_ms(message) <= TIMEOUT_MS + 1_000, message


def test_a_plaintext_client_at_a_tls_listener_says_so(pki: TestPki) -> None:
    with (
        InProcessBroker(settings=pki.broker_settings("SSL")) as broker,
        AdminClient(broker.address, request_timeout_ms=TIMEOUT_MS) as admin,
        pytest.raises(BrokerUnavailableError) as raised,
    ):
        admin.describe_topic("orders")
    message = str(raised.value)
    assert "closed the connection without answering; is its listener TLS?" in message
    assert "without TLS" in message
    assert TIMEOUT_MS - 100 <= waited_ms(message) <= TIMEOUT_MS + 1_000, message
