"""The direct Produce codec (``broker.kafka.produce_codec``) against kio's: for every
version the listener serves (3-12), a decoded request is exactly ``decode_request``'s
plain values and an encoded answer exactly ``encode_response``'s bytes; what it leaves
to kio (leader hints, unknown tags, damaged frames) it declines with None."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer

from tidelog.broker.kafka.codec import (
    _request_schema,
    build,
    decode_request,
    encode_response,
)
from tidelog.broker.kafka.produce_codec import decode_produce, encode_produce_response

VERSIONS = list(range(3, 13))
PREFIX = b"header-bytes"  # stands for the request header: the body starts after it

names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20
)
requests = st.fixed_dictionaries(
    {
        "transactional_id": st.none() | names,
        "acks": st.sampled_from([-1, 0, 1, 2]),
        "timeout": st.integers(0, 2**31 - 1),
        "topic_data": st.lists(
            st.fixed_dictionaries(
                {
                    "name": names,
                    "partition_data": st.lists(
                        st.fixed_dictionaries(
                            {
                                "index": st.integers(-(2**31), 2**31 - 1),
                                "records": st.none() | st.binary(max_size=300),
                            }
                        ),
                        max_size=4,
                    ),
                }
            ),
            max_size=3,
        ),
    }
)
partitions = st.fixed_dictionaries(
    {
        "index": st.integers(0, 2**31 - 1),
        "error_code": st.integers(-1, 120),
        "base_offset": st.integers(-1, 2**62),
        "log_append_time": st.just(-1) | st.integers(0, 2**42),
        "log_start_offset": st.integers(-1, 2**62),
    },
    optional={"error_message": st.none() | names},
)
answers = st.fixed_dictionaries(
    {
        "responses": st.lists(
            st.fixed_dictionaries(
                {"name": names, "partition_responses": st.lists(partitions, max_size=4)}
            ),
            max_size=3,
        )
    },
    optional={"throttle_time": st.integers(0, 2**31 - 1)},
)


def _body(version: int, plain: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    schema = _request_schema(0, version)
    entity_writer(schema)(out, build(schema, plain))
    return out.getvalue()


@settings(max_examples=40, deadline=None)
@given(request=requests)
@pytest.mark.parametrize("version", VERSIONS)
def test_a_request_decodes_as_kio_decodes_it(version: int, request: dict[str, Any]) -> None:
    frame = PREFIX + _body(version, request)
    expected = decode_request(0, version, frame, len(PREFIX))
    assert decode_produce(version, frame, len(PREFIX)) == expected


@settings(max_examples=40, deadline=None)
@given(answer=answers, correlation_id=st.integers(-(2**31), 2**31 - 1))
@pytest.mark.parametrize("version", VERSIONS)
def test_an_answer_encodes_as_kio_encodes_it(
    version: int, answer: dict[str, Any], correlation_id: int
) -> None:
    expected = encode_response(0, version, correlation_id, answer)
    assert encode_produce_response(version, correlation_id, answer) == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_cut_or_padded_frames_are_left_to_kio(version: int) -> None:
    request = {
        "transactional_id": None,
        "acks": 1,
        "timeout": 30_000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"r" * 70}]}],
    }
    frame = PREFIX + _body(version, request)
    assert decode_produce(version, frame, len(PREFIX)) is not None
    for cut in (1, 5, 40, len(frame) - len(PREFIX) - 1):
        assert decode_produce(version, frame[: len(frame) - cut], len(PREFIX)) is None
    assert decode_produce(version, frame + b"\0", len(PREFIX)) is None


def test_an_unknown_tag_is_left_to_kio() -> None:
    request = {
        "transactional_id": None,
        "acks": 1,
        "timeout": 30_000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"r"}]}],
    }
    body = _body(10, request)
    assert body[-1] == 0  # the request's (empty) tag section
    tagged = PREFIX + body[:-1] + bytes([1, 7, 1, 0x55])  # one tag: 7, one byte
    assert decode_produce(10, tagged, len(PREFIX)) is None
    assert decode_request(0, 10, tagged, len(PREFIX))["acks"] == 1  # kio skips it


@pytest.mark.parametrize("version", [10, 12])
def test_leader_hints_are_left_to_kio(version: int) -> None:
    partition = {
        "index": 0,
        "error_code": 6,
        "base_offset": -1,
        "log_append_time": -1,
        "log_start_offset": -1,
        "current_leader": {"leader_id": 2, "leader_epoch": 4},
    }
    answer = {"responses": [{"name": "t", "partition_responses": [partition]}]}
    assert encode_produce_response(version, 1, answer) is None
    endpoints = {"node_id": 2, "host": "h", "port": 9092, "rack": None}
    plain = {"responses": [], "node_endpoints": [endpoints]}
    assert encode_produce_response(version, 1, plain) is None
