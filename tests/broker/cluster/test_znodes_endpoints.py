"""A broker registration's listeners (``znodes``): Kafka's ``endpoints`` and
``listener_security_protocol_map``, written beside the gRPC ``host``/``port``, and older
registrations without them still read."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.cluster.znodes import (
    KAFKA_LISTENER,
    BrokerRegistration,
    ListenerEndpoint,
    ZnodeError,
    decode_broker,
    encode_broker,
)

_hosts = st.one_of(
    st.sampled_from(["127.0.0.1", "broker-1", "::1", "fe80::1", "kafka.example.com"]),
    st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
)
_protocols = st.sampled_from(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"])


@given(
    broker_id=st.integers(0, 2**31 - 1),
    host=_hosts,
    port=st.integers(0, 65535),
    kafka=st.one_of(st.none(), st.tuples(_hosts, st.integers(0, 65535), _protocols)),
)
def test_registration_round_trips(
    broker_id: int, host: str, port: int, kafka: tuple[str, int, str] | None
) -> None:
    endpoints = () if kafka is None else (ListenerEndpoint(KAFKA_LISTENER, *kafka),)
    registration = BrokerRegistration(broker_id, host, port, 1_700_000_000_000, endpoints)
    assert decode_broker(broker_id, encode_broker(registration)) == registration


def test_kafka_form_is_written() -> None:
    registration = BrokerRegistration(
        3, "10.0.0.3", 7410, 5, (ListenerEndpoint(KAFKA_LISTENER, "::1", 9092, "SASL_SSL"),)
    )
    document = json.loads(encode_broker(registration))
    assert document == {
        "version": 1,
        "host": "10.0.0.3",
        "port": 7410,
        "ts": 5,
        "endpoints": ["KAFKA://[::1]:9092"],
        "listener_security_protocol_map": {"KAFKA": "SASL_SSL"},
    }
    assert registration.endpoint(KAFKA_LISTENER) == ListenerEndpoint(
        "KAFKA", "::1", 9092, "SASL_SSL"
    )
    assert registration.endpoint("OTHER") is None


def test_registration_without_listeners_reads_as_none() -> None:
    old = b'{"version":1,"host":"127.0.0.1","port":7001,"ts":12}'
    registration = decode_broker(1, old)
    assert registration == BrokerRegistration(1, "127.0.0.1", 7001, 12)
    assert registration.endpoint(KAFKA_LISTENER) is None
    # A broker without other listeners writes what it wrote before they existed.
    assert json.loads(encode_broker(registration)) == json.loads(old)


def test_endpoint_without_a_protocol_entry_is_plaintext() -> None:
    data = b'{"version":1,"host":"h","port":1,"ts":0,"endpoints":["KAFKA://h:9092"]}'
    assert decode_broker(1, data).endpoint(KAFKA_LISTENER) == ListenerEndpoint(
        "KAFKA", "h", 9092, "PLAINTEXT"
    )


@pytest.mark.parametrize(
    "extra",
    [
        '"endpoints":"KAFKA://h:1"',
        '"endpoints":["h:1"]',
        '"endpoints":["KAFKA://h"]',
        '"endpoints":["KAFKA://:1"]',
        '"endpoints":["KAFKA://h:x"]',
        '"endpoints":["KAFKA://h:1"],"listener_security_protocol_map":{"KAFKA":"TLS"}',
        '"endpoints":["KAFKA://h:1"],"listener_security_protocol_map":[]',
    ],
)
def test_bad_listeners_are_refused(extra: str) -> None:
    data = ('{"version":1,"host":"h","port":1,"ts":0,' + extra + "}").encode()
    with pytest.raises(ZnodeError, match="/brokers/ids/1"):
        decode_broker(1, data)
