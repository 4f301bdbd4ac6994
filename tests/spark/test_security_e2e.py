"""The Spark sink and source against a broker that requires SASL_SSL (SCRAM-SHA-512)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.broker.testing_tls import TestPki
from tidelog.client import AdminClient

pytestmark = [pytest.mark.spark]


@pytest.fixture
def secure_broker(tmp_path: Path) -> Iterator[tuple[InProcessBroker, dict[str, str]]]:
    pki = TestPki.create(tmp_path / "pki")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    FileUserStore.open(data_dir).upsert(
        "spark", credential_from_password("SCRAM-SHA-512", "spark-secret")
    )
    with InProcessBroker(data_dir, settings=pki.broker_settings("SASL_SSL")) as broker:
        options = {
            "kafka.bootstrap.servers": broker.address,
            "kafka.security.protocol": "SASL_SSL",
            "kafka.ssl.cafile": str(pki.ca_cert),
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule"
            ' required username="spark" password="spark-secret";',
        }
        yield broker, options


def test_write_and_read_over_sasl_ssl(
    spark: Any, secure_broker: tuple[InProcessBroker, dict[str, str]]
) -> None:
    broker, options = secure_broker
    client = {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": options["kafka.ssl.cafile"],
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "spark",
        "sasl_plain_password": "spark-secret",
    }
    with AdminClient(broker.address, **client) as admin:
        admin.create_topic("secure-spark", partitions=2)
    rows = [(f"k{i}", f"v{i}") for i in range(10)]
    df = spark.createDataFrame(rows, "key string, value string")
    df.write.format("tidelog").mode("append").options(**options).option(
        "topic", "secure-spark"
    ).save()
    read = (
        spark.read.format("tidelog")
        .options(**options)
        .option("subscribe", "secure-spark")
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
        .collect()
    )
    assert sorted(r.value for r in read) == sorted(v for _, v in rows)
    with pytest.raises(Exception, match=r"SASL_AUTHENTICATION_FAILED|invalid credentials"):
        spark.read.format("tidelog").options(
            **{**options, "kafka.sasl.jaas.config": 'x required username="spark" password="no";'}
        ).option("subscribe", "secure-spark").load().collect()
