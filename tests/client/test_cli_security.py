"""``tidelog users`` and ``--command-config`` against a broker that requires SCRAM."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.client.test_cli import tidelog
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient
from tidelog.client.security import settings_from_properties

pytestmark = pytest.mark.timeout(120)


def test_properties_file_settings() -> None:
    text = """
# Kafka tools' client properties
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
username="root" password="p\\"w";
ssl.ca.location = /etc/ca.pem
"""
    # A continuation line is not supported; the JAAS entry sits on one line.
    text = text.replace("\\\n", "")
    assert settings_from_properties(text) == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "root",
        "sasl_plain_password": 'p"w',
        "ssl_cafile": "/etc/ca.pem",
    }
    with pytest.raises(ValueError, match=r"unknown setting 'ssl\.truststore\.location'"):
        settings_from_properties("ssl.truststore.location=/x.jks")


def test_super_user_before_the_first_start_then_users_through_the_cli(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    password_file = tmp_path / "root.password"
    password_file.write_text("root-secret\n")
    made = tidelog(
        "users", "add", "root", "--password-file", str(password_file), "--data-dir", str(data_dir)
    )
    assert made.returncode == 0, made.stderr
    assert "root-secret" not in (data_dir / "scram-credentials.json").read_text()
    config = tmp_path / "client.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
        "sasl.username=root\nsasl.password=root-secret\n"
    )
    with InProcessBroker(data_dir, settings={"security.protocol": "SASL_PLAINTEXT"}) as broker:
        common = ("--bootstrap", broker.address, "--command-config", str(config))
        added = tidelog("users", "add", "erin", *common, "--mechanism", "SCRAM-SHA-512",
                        stdin="erin-secret\n")  # fmt: skip
        assert added.returncode == 0, added.stderr
        listed = tidelog("users", "list", *common)
        assert listed.returncode == 0, listed.stderr
        assert "erin" in listed.stdout
        assert "root" in listed.stdout
        with AdminClient(
            broker.address,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username="erin",
            sasl_plain_password="erin-secret",
        ) as admin:
            admin.list_topics()
        deleted = tidelog("users", "delete", "erin", *common)
        assert deleted.returncode == 0, deleted.stderr
        assert "erin" not in tidelog("users", "list", *common).stdout
        # Without the settings the broker refuses, in one line.
        refused = tidelog("topics", "list", "--bootstrap", broker.address)
        assert refused.returncode == 1
        assert "SASL_AUTHENTICATION_FAILED" in refused.stderr
        assert "Traceback" not in refused.stderr
        created = tidelog("topics", "create", "audited", *common)
        assert created.returncode == 0, created.stderr
