"""The pgoutput decoder against an encoder written here from the protocol's message table
(PostgreSQL's ``proto.c``): every message round-trips, and damaged payloads are refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.client.cdc.pgoutput import (
    Begin,
    Binary,
    Column,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputError,
    Relation,
    Toast,
    Truncate,
    TupleData,
    Type,
    Update,
    decode,
    pg_time_to_ms,
)


def _string(text: str) -> bytes:
    return text.encode() + b"\0"


def _tuple(data: TupleData) -> bytes:
    out = struct.pack(">h", len(data))
    for value in data:
        if value is None:
            out += b"n"
        elif value is Toast.UNCHANGED:
            out += b"u"
        elif isinstance(value, Binary):
            out += b"b" + struct.pack(">i", len(value.data)) + value.data
        else:
            assert isinstance(value, bytes)
            out += b"t" + struct.pack(">i", len(value)) + value
    return out


def encode(message: Message) -> bytes:
    if isinstance(message, Begin):
        return b"B" + struct.pack(">QqI", message.final_lsn, message.commit_time_us, message.xid)
    if isinstance(message, Commit):
        return b"C" + struct.pack(
            ">bQQq", message.flags, message.commit_lsn, message.end_lsn, message.commit_time_us
        )
    if isinstance(message, Origin):
        return b"O" + struct.pack(">Q", message.commit_lsn) + _string(message.name)
    if isinstance(message, Relation):
        out = b"R" + struct.pack(">I", message.oid) + _string(message.schema)
        out += _string(message.name) + message.replica_identity.encode()
        out += struct.pack(">h", len(message.columns))
        for column in message.columns:
            out += struct.pack(">b", 1 if column.key else 0) + _string(column.name)
            out += struct.pack(">Ii", column.type_oid, column.type_modifier)
        return out
    if isinstance(message, Type):
        return (
            b"Y" + struct.pack(">I", message.oid) + _string(message.schema) + _string(message.name)
        )
    if isinstance(message, Insert):
        return b"I" + struct.pack(">I", message.relation_oid) + b"N" + _tuple(message.new)
    if isinstance(message, Update):
        out = b"U" + struct.pack(">I", message.relation_oid)
        if message.old_kind is not None:
            assert message.old is not None
            out += message.old_kind.encode() + _tuple(message.old)
        return out + b"N" + _tuple(message.new)
    if isinstance(message, Delete):
        return (
            b"D"
            + struct.pack(">I", message.relation_oid)
            + message.old_kind.encode()
            + _tuple(message.old)
        )
    assert isinstance(message, Truncate)
    out = b"T" + struct.pack(">ib", len(message.relation_oids), message.options)
    return out + b"".join(struct.pack(">I", oid) for oid in message.relation_oids)


u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=20
)
values = st.one_of(
    st.none(),
    st.just(Toast.UNCHANGED),
    st.binary(max_size=40),
    st.builds(Binary, st.binary(max_size=40)),
)
tuples = st.lists(values, max_size=8).map(tuple)
columns = st.builds(Column, names, u32, st.integers(-(2**31), 2**31 - 1), st.booleans())
messages = st.one_of(
    st.builds(Begin, u64, i64, u32),
    st.builds(Commit, st.just(0), u64, u64, i64),
    st.builds(Origin, u64, names),
    st.builds(
        Relation,
        u32,
        names,
        names,
        st.sampled_from("dnfi"),
        st.lists(columns, max_size=6).map(tuple),
    ),
    st.builds(Type, u32, names, names),
    st.builds(Insert, u32, tuples),
    st.one_of(
        st.builds(Update, u32, st.none(), st.none(), tuples),
        st.builds(Update, u32, st.sampled_from("KO"), tuples, tuples),
    ),
    st.builds(Delete, u32, st.sampled_from("KO"), tuples),
    st.builds(Truncate, st.integers(0, 3), st.lists(u32, max_size=5).map(tuple)),
)


@given(messages)
def test_every_message_round_trips(message: Message) -> None:
    assert decode(encode(message)) == message


@given(messages, st.data())
def test_a_cut_payload_is_refused(message: Message, data: st.DataObject) -> None:
    payload = encode(message)
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(PgOutputError):
        decode(payload[:cut])


@given(messages, st.binary(min_size=1, max_size=4))
def test_trailing_bytes_are_refused(message: Message, extra: bytes) -> None:
    with pytest.raises(PgOutputError, match="trailing"):
        decode(encode(message) + extra)


@pytest.mark.parametrize(
    "payload",
    [b"S\x00\x00\x00\x01\x01", b"M\x01", b"c", b"x"],
    ids=["stream-start", "message", "stream-commit", "unknown"],
)
def test_messages_of_later_protocol_versions_are_refused(payload: bytes) -> None:
    with pytest.raises(PgOutputError, match="protocol version 1"):
        decode(payload)


def test_an_unknown_column_kind_is_refused() -> None:
    payload = b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"z"
    with pytest.raises(PgOutputError, match="column kind"):
        decode(payload)


def test_pg_time_zero_is_2000_01_01() -> None:
    assert pg_time_to_ms(0) == 946_684_800_000
    assert pg_time_to_ms(1_500) == 946_684_800_001
