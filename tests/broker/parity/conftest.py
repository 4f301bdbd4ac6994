"""The parity package's broker: one ``InProcessBroker`` with TLS, SCRAM and the authorizer
on (``secure``), and a driver per listener logged in as alice (``both``), built once for
the whole package, as they were for the single module the package was split from.

The tests share that broker, each on names of its own, in any order (the listing of
groups looks only at its own).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.broker.parity.support import (
    LISTENERS,
    MECHANISM,
    PASSWORD,
    USER,
    Secure,
    _Grpc,
    _grpc,
    _Kafka,
    _KafkaSession,
)
from tidelog.broker.core.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from tidelog.broker.core.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, QuotaEntity
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki


@pytest.fixture(scope="package")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    root = tmp_path_factory.mktemp("parity")
    pki = TestPki.create(root / "pki")
    data = root / "data"
    data.mkdir()
    users = FileUserStore.open(data)
    users.upsert(USER, credential_from_password(MECHANISM, PASSWORD))
    settings = {
        **pki.broker_settings("SASL_SSL"),
        "sasl.enabled.mechanisms": MECHANISM,
        "authorizer.enabled": "true",
        "kafka.listen": "127.0.0.1:0",
    }
    with InProcessBroker(data, settings=settings) as broker:
        core = broker.server.core

        def allow(operation: Operation, kind: ResourceType, name: str) -> None:
            core.acls.create(
                [
                    AclBinding(
                        f"User:{USER}",
                        "*",
                        operation,
                        Permission.ALLOW,
                        kind,
                        name,
                        PatternType.PREFIXED,
                    )
                ]
            )

        # alice may do everything on "ok-" topics and groups, but has no cluster ACL (a
        # CreateTopics allowed by the topic alone); "ro-" topics she may only read.
        for operation in (
            Operation.WRITE,
            Operation.READ,
            Operation.DESCRIBE,
            Operation.CREATE,
            Operation.DELETE,
        ):
            allow(operation, ResourceType.TOPIC, "ok-")
        allow(Operation.READ, ResourceType.TOPIC, "ro-")
        allow(Operation.DESCRIBE, ResourceType.TOPIC, "ro-")
        allow(Operation.READ, ResourceType.GROUP, "ok-")
        allow(Operation.DESCRIBE, ResourceType.GROUP, "ok-")
        # "del-" groups she may delete (DeleteGroups, OffsetDelete), and only that.
        allow(Operation.DELETE, ResourceType.GROUP, "del-")
        # "ok-" transactional ids she may use and describe.
        allow(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, "ok-")
        allow(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, "ok-")
        for listener in LISTENERS:
            core.create_topic(f"ok-{listener}-data", 1, {})
            core.create_topic(f"ro-{listener}", 1, {})
            core.create_topic(f"hidden-{listener}", 1, {})
            # Quotas far above anything here: the meters count, nothing is throttled.
            core.quotas.alter(
                QuotaEntity(USER, f"parity-{listener}"),
                {PRODUCER_BYTE_RATE: 1e15, CONSUMER_BYTE_RATE: 1e15},
                [],
            )
        yield Secure(broker, pki)


@pytest.fixture(scope="package")
def both(secure: Secure) -> Iterator[dict[str, Any]]:
    transport = _grpc(secure)
    session = _KafkaSession(secure, "parity-kafka")
    try:
        yield {"grpc": _Grpc(transport), "kafka": _Kafka(session)}
    finally:
        transport.close()
        session.close()
