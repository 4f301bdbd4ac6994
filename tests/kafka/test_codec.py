"""Property tests of the Kafka codec (``broker.kafka.codec``, kio) against a second codec,
kafka-python's ``kafka.protocol``, for every API version the listener advertises.

- Responses: random plain values -> ``encode_response`` -> kafka-python decodes the frame
  (header included) to the same values. That is what every client does with our bytes.
- Requests: random plain values -> kio writes them -> kafka-python decodes them to the same
  values (so kio's bytes are Kafka's) and ``decode_request`` gives back the values we
  started from (so what a client sends is what a handler sees).

Values are generated from kio's schema of each version, field by field. Tagged fields keep
their defaults (both codecs omit them then); kafka-python reports absent tagged structs as
None where kio has a default struct, so they are left out of the comparison.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import types
import typing
import uuid
from typing import Any

import hypothesis.strategies as st
import kafka.protocol.admin
import kafka.protocol.consumer
import kafka.protocol.metadata
import kafka.protocol.producer
import pytest
from hypothesis import HealthCheck, given, settings
from kafka.protocol.api_message import ApiMessage
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from tidelog.broker.kafka.codec import (
    build,
    decode_request,
    encode_response,
    parse_header,
    to_plain,
)
from tidelog.broker.kafka.handlers import HANDLERS
from tidelog.broker.kafka.tags import strip_unknown_tags
from tidelog.broker.kafka.versions import ADVERTISED

# Imported for their side effect: each module defines (registers) its message classes.
_MODULES = (
    kafka.protocol.admin,
    kafka.protocol.consumer,
    kafka.protocol.producer,
    kafka.protocol.metadata,
)

pytestmark = pytest.mark.timeout(300)

# Produce 0-2 are advertised for old librdkafka's sake but not served (kio lacks them).
SERVED = [
    (key, version)
    for key, (low, high) in sorted(ADVERTISED.items())
    for version in range(low, high + 1)
    if not (key == 0 and version < 3)
]
# kafka-python has no ConsumerGroupHeartbeat (68) or ConsumerGroupDescribe (69, KIP-848):
# their second codec in tests/kafka is librdkafka itself (test_groups.py's
# group.protocol=consumer tests, test_consumer_group_describe.py); here the heartbeat is
# checked as a kio round trip (test_kip848_heartbeat_round_trips). Nor has it the share
# group APIs (76-79, KIP-932) and their offset admin (90-92): test_share_groups.py and
# test_share_admin.py check requests and answers byte by byte against the published schemas.
NOT_IN_KAFKA_PYTHON = (68, 69, 76, 77, 78, 79, 90, 91, 92)
VERSIONS = [(key, version) for key, version in SERVED if key not in NOT_IN_KAFKA_PYTHON]


def _kafka_python_classes() -> dict[tuple[int, bool], type]:
    found: dict[tuple[int, bool], type] = {}
    stack: list[type] = [ApiMessage]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if getattr(cls, "_class_version", None) is None and cls is not ApiMessage:
            api_key = getattr(cls, "API_KEY", None)
            if isinstance(api_key, int):  # abstract helpers have no schema
                found[(api_key, cls.is_request())] = cls  # type: ignore[attr-defined]
    return found


KP = _kafka_python_classes()


# --- values from kio's schemas --------------------------------------------------------------

_INTS = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "timedelta_i32": (0, 2**31 - 1),
    "timedelta_i64": (0, 2**40),
    "datetime_i64": (-1, 2**41),
}

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@functools.cache
def _plain_strategy(cls: type) -> st.SearchStrategy[dict[str, Any]]:
    hints = typing.get_type_hints(cls)
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        if "tag" in f.metadata:
            continue
        parts[f.name] = _field_strategy(f.metadata.get("kafka_type"), hints[f.name])
    return st.fixed_dictionaries(parts)


def _field_strategy(kafka_type: str | None, hint: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    nullable = False
    if origin in (typing.Union, types.UnionType):
        nullable = type(None) in args
        inner = [a for a in args if a is not type(None)]
        hint = inner[0]
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
    if origin is tuple:
        item = args[0]
        if isinstance(item, type) and dataclasses.is_dataclass(item):
            values: st.SearchStrategy[Any] = st.lists(_plain_strategy(item), max_size=3)
        else:
            values = st.lists(_field_strategy(None, item), max_size=3)
    elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
        values = _plain_strategy(hint)
    else:
        values = _scalar(kafka_type, hint)
        if kafka_type == "datetime_i64":
            return values  # null is written as -1: generate -1 itself
    return st.none() | values if nullable else values


def _scalar(kafka_type: str | None, hint: Any) -> st.SearchStrategy[Any]:
    if kafka_type is None:  # array items carry their type in the hint's name
        kafka_type = {"i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64"}.get(
            getattr(hint, "__name__", ""), "string" if hint is str else None
        )
        if kafka_type is None and isinstance(hint, type) and issubclass(hint, int):
            kafka_type = "int32"
        if kafka_type is None and isinstance(hint, type) and issubclass(hint, str):
            kafka_type = "string"
    if kafka_type in _INTS:
        low, high = _INTS[kafka_type]
        return st.integers(low, high)
    if kafka_type == "bool":
        return st.booleans()
    if kafka_type == "string":
        return _TEXT
    if kafka_type in ("bytes", "records"):
        return st.binary(max_size=16)
    if kafka_type == "uuid":
        return st.builds(uuid.UUID, int=st.integers(0, 2**128 - 1))
    if kafka_type == "error_code":
        return st.sampled_from([int(e) for e in ErrorCode])
    if kafka_type == "float64":
        return st.floats(allow_nan=False)
    raise AssertionError(f"no strategy for {kafka_type} {hint}")


# --- comparing with kafka-python's view ---------------------------------------------------------


# kio's name -> kafka-python's, where the two codecs' schemas name a field differently.
_ALIASES: dict[str, tuple[str, ...]] = {
    "cluster_authorized_operations": ("authorized_operations",),
    "topic_authorized_operations": ("authorized_operations",),
}


def _same(ours: Any, theirs: Any, cls: type | None, where: str) -> None:
    if isinstance(ours, dict):
        assert cls is not None
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if "tag" in f.metadata or f.name not in ours:
                continue
            key = next(
                (k for k in (f.name, f"{f.name}_ms", *_ALIASES.get(f.name, ())) if k in theirs),
                f.name,
            )
            assert key in theirs, f"{where}.{f.name} missing in {sorted(theirs)}"
            _same(ours[f.name], theirs[key], _struct_of(hints[f.name]), f"{where}.{f.name}")
        return
    if isinstance(ours, list):
        assert isinstance(theirs, list), where
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _same(a, b, cls, f"{where}[{i}]")
        return
    if isinstance(theirs, set):
        # kafka-python turns "authorized operations" bitfields into sets of operations,
        # dropping bits it has no name for: not comparable, and answered as "not asked"
        # (INT32_MIN) by the listener anyway.
        return
    if theirs is None and ours == -(2**31) and where.endswith("authorized_operations"):
        return  # kafka-python reads INT32_MIN ("not asked for") as None
    if isinstance(ours, uuid.UUID) and theirs is None and ours.int == 0:
        return  # kio reads the all-zero topic id as None ("no id")
    if isinstance(ours, bytes | bytearray | memoryview):
        assert bytes(theirs) == bytes(ours), where
        return
    assert theirs == ours, f"{where}: {theirs!r} != {ours!r}"


def _struct_of(hint: Any) -> type | None:
    for candidate in (hint, *typing.get_args(hint)):
        for inner in (candidate, *typing.get_args(candidate)):
            if isinstance(inner, type) and dataclasses.is_dataclass(inner):
                return inner
    return None


def _settings() -> Any:
    return settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(("api_key", "version"), VERSIONS)
def test_responses_decode_in_kafka_python_as_encoded(api_key: int, version: int) -> None:
    schema = load_response_schema(api_key, version)
    kp_class = KP[(api_key, False)][version]

    @_settings()
    @given(body=_plain_strategy(schema), correlation_id=st.integers(-(2**31), 2**31 - 1))
    def check(body: dict[str, Any], correlation_id: int) -> None:
        if api_key == 18:
            # kafka-python reads an ApiVersions answer with an error as v0 (KIP-511's
            # fallback form, tested in test_malformed): compare the success form here.
            body = {**body, "error_code": 0}
        frame = encode_response(api_key, version, correlation_id, body)
        assert int.from_bytes(frame[:4], "big", signed=True) == len(frame) - 4
        decoded = kp_class.decode(frame[4:], header=True)
        assert decoded.header.correlation_id == correlation_id
        _same(body, decoded.to_dict(json=False), schema, f"api{api_key}v{version}")

    check()


@pytest.mark.parametrize(("api_key", "version"), VERSIONS)
def test_requests_written_by_kio_read_the_same_in_both_codecs(api_key: int, version: int) -> None:
    schema = load_request_schema(api_key, version)
    kp_class = KP[(api_key, True)][version]

    @_settings()
    @given(
        body=_plain_strategy(schema),
        client_id=st.none() | _TEXT,
        correlation_id=st.integers(-(2**31), 2**31 - 1),
    )
    def check(body: dict[str, Any], client_id: str | None, correlation_id: int) -> None:
        header = schema.__header_schema__
        out = io.BytesIO()
        entity_writer(header)(
            out,
            build(
                header,
                {
                    "request_api_key": api_key,
                    "request_api_version": version,
                    "correlation_id": correlation_id,
                    "client_id": client_id,
                },
            ),
        )
        entity_writer(schema)(out, build(schema, body))
        frame = out.getvalue()
        parsed = parse_header(frame)
        assert (parsed.api_key, parsed.api_version, parsed.correlation_id) == (
            api_key,
            version,
            correlation_id,
        )
        assert parsed.client_id == (client_id or "")
        ours = decode_request(api_key, version, frame, parsed.body_offset)
        _same(body, ours, schema, "decode_request")
        theirs = kp_class.decode(frame, header=True)
        _same(body, theirs.to_dict(json=False), schema, f"kafka-python api{api_key}v{version}")

    check()


@pytest.mark.parametrize("version", [0, 1])
def test_kip848_heartbeat_round_trips(version: int) -> None:
    request_schema = load_request_schema(68, version)
    response_schema = load_response_schema(68, version)

    @_settings()
    @given(request=_plain_strategy(request_schema), response=_plain_strategy(response_schema))
    def check(request: dict[str, Any], response: dict[str, Any]) -> None:
        header = request_schema.__header_schema__
        out = io.BytesIO()
        entity_writer(header)(
            out,
            build(
                header,
                {
                    "request_api_key": 68,
                    "request_api_version": version,
                    "correlation_id": 3,
                    "client_id": "c",
                },
            ),
        )
        entity_writer(request_schema)(out, build(request_schema, request))
        frame = out.getvalue()
        parsed = parse_header(frame)
        _same(
            request,
            decode_request(68, version, frame, parsed.body_offset),
            request_schema,
            "decode_request",
        )
        encoded = encode_response(68, version, 3, response)
        assert encoded[4:8] == (3).to_bytes(4, "big")
        assert encoded[8] == 0  # response header v1: no tagged fields
        decoded, _ = entity_reader(response_schema)(encoded, 9)
        _same(response, to_plain(decoded), response_schema, "kio reader")

    check()


def test_every_advertised_api_has_a_handler_and_nothing_else_does() -> None:
    assert set(HANDLERS) == set(ADVERTISED)


def test_unknown_header_tags_are_skipped() -> None:
    # A flexible (v2) request header with two tagged fields nobody defined (KIP-482).
    frame = (
        b"\x00\x03\x00\x09"  # Metadata v9
        + (7).to_bytes(4, "big")
        + b"\x00\x02id"  # client_id
        + b"\x02"  # two tags
        + b"\x05\x03abc"  # tag 5, 3 bytes
        + b"\x7f\x00"  # tag 127, empty
    )
    parsed = parse_header(frame)
    assert parsed.correlation_id == 7
    assert parsed.client_id == "id"
    assert parsed.body_offset == len(frame)


FLEXIBLE = [
    (key, version) for key, version in SERVED if load_request_schema(key, version).__flexible__
]


@pytest.mark.parametrize(("api_key", "version"), FLEXIBLE)
def test_unknown_tagged_fields_in_a_body_are_skipped(api_key: int, version: int) -> None:
    # KIP-482: tags the schema does not know are skipped (kio alone raises on them).
    schema = load_request_schema(api_key, version)

    @_settings()
    @given(body=_plain_strategy(schema))
    def check(body: dict[str, Any]) -> None:
        out = io.BytesIO()
        entity_writer(schema)(out, build(schema, body))
        written = out.getvalue()
        assert strip_unknown_tags(schema, written, 0) == written  # nothing unknown: as is
        assert written[-1] == 0  # the top-level tag section is empty (defaults omitted)
        with_tags = written[:-1] + b"\x02" + b"\x63\x03abc" + b"\x64\x00"  # tags 99, 100
        assert strip_unknown_tags(schema, with_tags, 0) == written
        _same(body, decode_request(api_key, version, with_tags, 0), schema, "decode_request")

    check()
