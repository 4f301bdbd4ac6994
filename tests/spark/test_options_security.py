"""Security options of the Spark source and sink (no Spark session: plain values)."""

from __future__ import annotations

import pickle

import pytest

from tidelog.spark_sink.options import ReadOptions, WriteOptions


def test_kafka_prefixed_and_plain_security_options() -> None:
    options = ReadOptions.from_mapping(
        {
            "subscribe": "t",
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-256",
            "kafka.sasl.jaas.config": 'ScramLoginModule required username="u" password="p";',
            "ssl.cafile": "/ca.pem",
        },
        streaming=False,
    )
    assert options.security_settings == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "u",
        "sasl_plain_password": "p",
        "ssl_cafile": "/ca.pem",
    }
    assert "sasl_plain_password" not in repr(options)
    assert pickle.loads(pickle.dumps(options)) == options
    write = WriteOptions.from_mapping(
        {"topic": "t", "security.protocol": "SSL", "kafka.ssl.cafile": "/ca.pem"}
    )
    assert write.security_settings == {"security_protocol": "SSL", "ssl_cafile": "/ca.pem"}


def test_security_options_are_validated() -> None:
    with pytest.raises(ValueError, match="sasl_plain_username"):
        WriteOptions.from_mapping({"topic": "t", "kafka.security.protocol": "SASL_SSL"})
    with pytest.raises(ValueError, match="disagree"):
        WriteOptions.from_mapping(
            {"topic": "t", "security.protocol": "SSL", "kafka.security.protocol": "PLAINTEXT"}
        )
    with pytest.raises(ValueError, match="unknown tidelog write option"):
        WriteOptions.from_mapping({"topic": "t", "kafka.ssl.truststore.location": "/x.jks"})
