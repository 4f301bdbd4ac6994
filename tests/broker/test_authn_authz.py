"""Authentication feeding authorization: SCRAM users and mutual TLS subjects as ACL
principals (``broker.core.auth`` fills ``RequestContext.principal``; ``broker.grpc.authorize``
checks it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.acls import AclBinding
from tidelog.storage.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError

pytestmark = pytest.mark.timeout(120)


def login(user: str, password: str) -> dict[str, str]:
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }


@contextmanager
def alice_may_read_orders(tmp_path: Path) -> Iterator[InProcessBroker]:
    """A broker with SCRAM and the authorizer on, super user ``admin``, a topic
    ``orders`` and a user ``alice`` allowed to READ it, nothing more."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    FileUserStore.open(data_dir).upsert(
        "admin", credential_from_password("SCRAM-SHA-256", "admin-secret")
    )
    settings = {
        "security.protocol": "SASL_PLAINTEXT",
        "authorizer.enabled": "true",
        "super.users": "User:admin",
    }
    with InProcessBroker(data_dir, settings=settings) as broker:
        with AdminClient(broker.address, **login("admin", "admin-secret")) as admin:
            admin.upsert_user("alice", "alice-secret", "SCRAM-SHA-256")
            admin.create_topic("orders", 1)
            admin.create_acls([AclBinding("User:alice", "READ", resource_name="orders")])
        yield broker


def test_scram_users_are_acl_principals(tmp_path: Path) -> None:
    with alice_may_read_orders(tmp_path) as broker:
        admin_login = login("admin", "admin-secret")
        with Producer(broker.address, acks=1, **admin_login) as producer:
            producer.send("orders", b"by admin").result(timeout=10)
        alice = login("alice", "alice-secret")
        with Consumer(broker.address, auto_offset_reset="earliest", **alice) as consumer:
            consumer.assign([TopicPartition("orders", 0)])
            values: list[bytes] = []
            for _ in range(20):
                values += [r.value for r in consumer.poll(timeout_ms=300) if r.value]
                if values:
                    break
        assert values == [b"by admin"]
        with (
            Producer(broker.address, acks=1, enable_idempotence=False, **alice) as producer,
            pytest.raises(TopicAuthorizationFailedError),
        ):
            producer.send("orders", b"by alice").result(timeout=10)
        with (
            AdminClient(broker.address, **alice) as admin,
            pytest.raises(ClusterAuthorizationFailedError),
        ):
            admin.upsert_user("mallory", "x")


def test_an_idempotent_producer_refused_a_producer_id_fails_at_once(tmp_path: Path) -> None:
    """Without WRITE on any topic (nor IDEMPOTENT_WRITE) the broker refuses the producer
    id: the producer fails its records with ClusterAuthorizationFailedError at once, as
    Kafka's does, instead of retrying until delivery_timeout_ms; later sends raise it.
    With WRITE on a topic (KIP-679) the same user produces idempotently."""
    with alice_may_read_orders(tmp_path) as broker:
        admin_login = login("admin", "admin-secret")
        alice = login("alice", "alice-secret")
        started = time.monotonic()
        with Producer(broker.address, acks="all", delivery_timeout_ms=60_000, **alice) as p:
            future = p.send("orders", b"refused")
            with pytest.raises(ClusterAuthorizationFailedError):
                future.result(timeout=30)
            assert time.monotonic() - started < 15  # not the 60 s delivery timeout
            with pytest.raises(ClusterAuthorizationFailedError, match="must be closed"):
                p.send("orders", b"again")
        with AdminClient(broker.address, **admin_login) as admin:
            admin.create_acls([AclBinding("User:alice", "WRITE", resource_name="orders")])
        with Producer(broker.address, acks="all", **alice) as producer:
            assert producer.send("orders", b"allowed").result(timeout=30).offset == 0


def test_certificate_subject_is_the_acl_principal(tmp_path: Path) -> None:
    pki = TestPki.create(tmp_path / "pki")
    settings = {
        **pki.broker_settings("SSL", "required"),
        "authorizer.enabled": "true",
        "super.users": "User:CN=alice,O=Tidelog",
    }
    client = pki.client_settings("SSL", certificate=True)
    with (
        InProcessBroker(settings=settings) as broker,
        AdminClient(broker.address, **client) as admin,
    ):
        admin.create_topic("by-subject", 1)  # a super user by its certificate
        assert "by-subject" in [t.name for t in admin.list_topics()]
