"""KIP-554 in cluster mode: a SCRAM credential altered through one broker's Kafka listener
is in ZooKeeper (``/config/users``), so every broker takes the new password at its next
login, on both listeners, and a deletion reaches them all the same way (issue #27)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin as kadmin
import pytest

from tests.broker.cluster.conftest import require_zookeeper
from tidelog.broker.cluster.store import ClusterStore
from tidelog.broker.cluster.testing import LocalCluster
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import ZooKeeperUserStore
from tidelog.client import AdminClient
from tidelog.storage.errors import TidelogError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TIMEOUT_S = 20.0


def _kafka(address: str, user: str, password: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": address,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        "error_cb": lambda error: None,
    }


def _kafka_login_works(address: str, user: str, password: str) -> bool:
    producer = confluent_kafka.Producer(_kafka(address, user, password))
    try:
        producer.list_topics(timeout=5)
        return True
    except confluent_kafka.KafkaException:
        return False
    finally:
        producer.flush(1)


def _grpc_login_works(address: str, user: str, password: str) -> bool:
    try:
        with AdminClient(
            address, security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username=user, sasl_plain_password=password, request_timeout_ms=5_000,
        ) as admin:  # fmt: skip
            admin.list_topics()
        return True
    except TidelogError:
        return False


def _alter(address: str, alteration: Any) -> None:
    admin = kadmin.AdminClient(_kafka(address, "admin", "admin-secret"))
    (future,) = admin.alter_user_scram_credentials([alteration]).values()
    future.result(TIMEOUT_S)


def test_a_credential_altered_through_one_broker_reaches_every_broker(tmp_path: Path) -> None:
    require_zookeeper()
    settings = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
        "inter.broker.sasl.username": "broker",
        "inter.broker.sasl.password": "broker-secret",
        "authorizer.enabled": "true",
        "super.users": "User:admin;User:broker",
        "sasl.login.failures.max": "1000",
    }
    with LocalCluster(
        brokers=2, session_timeout_ms=3_000, settings=settings, kafka=True
    ) as cluster:
        store = ClusterStore.connect(f"{cluster.zookeeper.connect_string}/tidelog")
        try:
            users = ZooKeeperUserStore(store)
            for name in ("broker", "admin"):
                users.upsert(name, credential_from_password("SCRAM-SHA-512", f"{name}-secret"))
        finally:
            store.close()
        first, second = (cluster.kafka_address(i) for i in cluster.broker_ids)
        upsertion = kadmin.UserScramCredentialUpsertion(
            "frank",
            kadmin.ScramCredentialInfo(kadmin.ScramMechanism.SCRAM_SHA_512, 4096),
            b"frank-1",
        )
        _alter(first, upsertion)
        assert _kafka_login_works(second, "frank", "frank-1")
        assert _grpc_login_works(cluster.address(2), "frank", "frank-1")

        described = kadmin.AdminClient(_kafka(second, "admin", "admin-secret"))
        found = described.describe_user_scram_credentials(["frank"])["frank"].result(TIMEOUT_S)
        assert [(i.mechanism, i.iterations) for i in found.scram_credential_infos] == [
            (kadmin.ScramMechanism.SCRAM_SHA_512, 4096)
        ]

        _alter(
            second,
            kadmin.UserScramCredentialDeletion("frank", kadmin.ScramMechanism.SCRAM_SHA_512),
        )
        for broker_id in cluster.broker_ids:  # read from ZooKeeper at each login
            assert not _kafka_login_works(cluster.kafka_address(broker_id), "frank", "frank-1")
            assert not _grpc_login_works(cluster.address(broker_id), "frank", "frank-1")
