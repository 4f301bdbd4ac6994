"""The share groups' records in ``__consumer_offsets`` (``broker.share.groups_records``):
round trips, the documented bytes, and every cut record refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.groups.offset_records import decode_group_key
from tidelog.broker.groups.offset_records import decode_key as decode_offset_key
from tidelog.broker.groups.offset_store import record_key_group
from tidelog.broker.share.groups_records import (
    CONFIG_TYPE,
    CURRENT_ASSIGNMENT_TYPE,
    GROUP_METADATA_TYPE,
    MEMBER_METADATA_TYPE,
    TARGET_MEMBER_TYPE,
    TARGET_METADATA_TYPE,
    CurrentAssignmentValue,
    GroupMetadataValue,
    MemberMetadataValue,
    RecordKey,
    decode_configs,
    decode_current,
    decode_group_metadata,
    decode_key,
    decode_member_metadata,
    decode_partitions,
    decode_target_epoch,
    encode_configs,
    encode_current,
    encode_group_metadata,
    encode_key,
    encode_member_metadata,
    encode_partitions,
    encode_target_epoch,
)
from tidelog.storage.types import TopicPartition

pytestmark = pytest.mark.timeout(60)

_text = st.text(max_size=12)
_int32 = st.integers(-(2**31), 2**31 - 1)
_partitions = st.frozensets(
    st.builds(TopicPartition, st.text(min_size=1, max_size=8), st.integers(0, 2**31 - 1)),
    max_size=6,
)
_member_types = st.sampled_from((MEMBER_METADATA_TYPE, TARGET_MEMBER_TYPE, CURRENT_ASSIGNMENT_TYPE))
_group_types = st.sampled_from((GROUP_METADATA_TYPE, TARGET_METADATA_TYPE, CONFIG_TYPE))
_keys = st.builds(RecordKey, _member_types, _text, st.text(min_size=1, max_size=12)) | st.builds(
    RecordKey, _group_types, _text
)


@given(_keys)
def test_keys_round_trip_and_are_no_other_kinds_key(key: RecordKey) -> None:
    data = encode_key(key)
    assert decode_key(data) == key
    assert record_key_group(data) == (key.record_type, key.group_id)
    assert decode_offset_key(data) is None
    assert decode_group_key(data) is None


# Each codec with a strategy of its values.
_CODECS: list[tuple[Callable[..., bytes], Callable[[bytes], object], st.SearchStrategy[object]]] = [
    (
        encode_member_metadata,
        decode_member_metadata,
        st.builds(MemberMetadataValue, st.none() | _text, _text, _text, st.frozensets(_text)),
    ),
    (
        encode_group_metadata,
        decode_group_metadata,
        st.builds(GroupMetadataValue, _int32, st.dictionaries(_text, _int32, max_size=4)),
    ),
    (encode_target_epoch, decode_target_epoch, _int32),
    (encode_partitions, decode_partitions, _partitions),
    (
        encode_current,
        decode_current,
        st.builds(CurrentAssignmentValue, _int32, _int32, _partitions),
    ),
    (encode_configs, decode_configs, st.dictionaries(_text, _text, max_size=4)),
]


@pytest.mark.parametrize("codec", range(len(_CODECS)), ids=lambda i: _CODECS[i][0].__name__)
@given(data=st.data())
def test_values_round_trip_and_a_cut_value_is_refused(codec: int, data: st.DataObject) -> None:
    encode, decode, values = _CODECS[codec]
    value = data.draw(values)
    encoded = encode(value)
    assert decode(encoded) == value
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(ValueError, match=r"cut|bad|null"):
        decode(encoded[:cut])
    with pytest.raises(ValueError, match="trailing"):
        decode(encoded + b"\x00")


@given(_keys, st.data())
def test_a_cut_key_is_refused(key: RecordKey, data: st.DataObject) -> None:
    encoded = encode_key(key)
    cut = data.draw(st.integers(2, len(encoded) - 1))
    with pytest.raises(ValueError, match="cut"):
        decode_key(encoded[:cut])


def test_the_documented_layout() -> None:
    assert encode_key(RecordKey(MEMBER_METADATA_TYPE, "g", "m1")) == (
        b"\x00\x0a" + b"\x00\x01g" + b"\x00\x02m1"
    )
    assert encode_key(RecordKey(GROUP_METADATA_TYPE, "g")) == b"\x00\x0b\x00\x01g"
    assert encode_member_metadata(MemberMetadataValue(None, "c", "h", frozenset({"t"}))) == (
        b"\x00\x00"  # version 0
        + b"\x00"  # rack id: null
        + b"\x02c"  # client id: compact string
        + b"\x02h"  # client host
        + b"\x02\x02t"  # one topic name
        + b"\x00"  # no tagged fields
    )
    assert encode_current(
        CurrentAssignmentValue(3, 2, frozenset({TopicPartition("t", 1), TopicPartition("t", 0)}))
    ) == (
        b"\x00\x00"
        + (3).to_bytes(4, "big")
        + (2).to_bytes(4, "big")
        + b"\x00"  # state: stable
        + b"\x02"  # one topic
        + b"\x02t"
        + b"\x03"  # two partitions, in order
        + (0).to_bytes(4, "big")
        + (1).to_bytes(4, "big")
        + b"\x00"  # the topic's tagged fields
        + b"\x00"
    )


def test_unknown_tagged_fields_are_skipped() -> None:
    plain = encode_target_epoch(7)
    tagged = plain[:-1] + b"\x01" + b"\x05" + b"\x02" + b"xy"  # one tag (5) of 2 bytes
    assert decode_target_epoch(tagged) == 7


def test_bad_records_are_refused() -> None:
    with pytest.raises(ValueError, match="version"):
        decode_target_epoch(b"\x00\x01" + bytes(5))
    with pytest.raises(ValueError, match="member id"):
        encode_key(RecordKey(MEMBER_METADATA_TYPE, "g"))
    with pytest.raises(ValueError, match="no member id"):
        encode_key(RecordKey(GROUP_METADATA_TYPE, "g", "m"))
    with pytest.raises(ValueError, match="not a share group record type"):
        encode_key(RecordKey(1, "g"))
    assert decode_key(b"\x00\x01\x00\x01g") is None  # an offset commit's type
    with pytest.raises(ValueError, match="null"):
        decode_member_metadata(b"\x00\x00\x00\x00\x02h\x01\x00")  # a null client id
