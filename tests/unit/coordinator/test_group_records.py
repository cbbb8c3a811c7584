"""`__consumer_offsets` record codecs: Kafka's byte layouts, every readable version, damage refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.coordinator.group.records import (
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    RecordFormatError,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)


def s16(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def test_offset_key_layout_is_kafkas():
    assert encode_offset_key("g", "t", 3) == struct.pack(">h", 1) + s16("g") + s16("t") + struct.pack(">i", 3)
    assert decode_key(encode_offset_key("g", "t", 3)) == OffsetKey("g", "t", 3)
    # key version 0 is an offset commit too (older brokers wrote it)
    assert decode_key(struct.pack(">h", 0) + s16("g") + s16("t") + struct.pack(">i", 1)) == OffsetKey("g", "t", 1)


def test_group_key_and_foreign_record_types():
    assert encode_group_key("grp") == struct.pack(">h", 2) + s16("grp")
    assert decode_key(encode_group_key("grp")) == GroupKey("grp")
    # KIP-848 consumer-group records (types 3+) are not ours: skipped, not an error
    assert decode_key(struct.pack(">h", 5) + s16("grp")) is None


def test_offset_value_v3_layout_and_v1_with_expiry():
    value = OffsetValue(42, 7, "meta", 1234)
    raw = encode_offset_value(value)
    assert raw == struct.pack(">hqi", 3, 42, 7) + s16("meta") + struct.pack(">q", 1234)
    assert decode_offset_value(raw) == value
    expiring = OffsetValue(5, -1, "", 100, 900)
    raw1 = encode_offset_value(expiring)
    assert struct.unpack_from(">h", raw1)[0] == 1
    assert decode_offset_value(raw1) == expiring


def test_offset_value_old_and_flexible_versions():
    v0 = struct.pack(">hq", 0, 9) + s16("m") + struct.pack(">q", 77)
    assert decode_offset_value(v0) == OffsetValue(9, -1, "m", 77)
    # v4: compact string (uvarint length+1) and an empty tag buffer
    v4 = struct.pack(">hqi", 4, 10, 3) + bytes([2]) + b"x" + struct.pack(">q", 55) + bytes([0])
    assert decode_offset_value(v4) == OffsetValue(10, 3, "x", 55)


def test_group_value_roundtrip_v3():
    value = GroupValue("consumer", 4, "range", "m-1", 999, [
        MemberValue("m-1", "inst", "client", "/127.0.0.1", 3000, 1000, b"sub", b"asg"),
        MemberValue("m-2", None, "client2", "/10.0.0.1", 4000, 2000, b"", b""),
    ])
    raw = encode_group_value(value)
    assert struct.unpack_from(">h", raw)[0] == 3
    assert decode_group_value(raw) == value


def test_group_value_v0_uses_session_timeout_as_rebalance_timeout():
    member = s16("m") + s16("c") + s16("/h") + struct.pack(">i", 1500) + struct.pack(">i", 1) + b"s" \
        + struct.pack(">i", 1) + b"a"
    raw = struct.pack(">h", 0) + s16("consumer") + struct.pack(">i", 2) + s16("range") + s16("m") \
        + struct.pack(">i", 1) + member
    decoded = decode_group_value(raw)
    assert decoded.members == [MemberValue("m", None, "c", "/h", 1500, 1500, b"s", b"a")]
    assert decoded.current_state_timestamp == -1


def test_empty_group_value_has_null_protocol_and_leader():
    value = GroupValue("consumer", 7, None, None, 5, [])
    assert decode_group_value(encode_group_value(value)) == value


@pytest.mark.parametrize("raw", [b"", b"\x00", struct.pack(">h", 3) + b"\x00\x00\x00", struct.pack(">h", 99)])
def test_damaged_values_are_refused(raw):
    with pytest.raises((RecordFormatError, struct.error)):
        decode_offset_value(raw)
    with pytest.raises((RecordFormatError, struct.error)):
        decode_group_value(raw)


@given(st.text(max_size=30), st.text(max_size=30), st.integers(0, 2**31 - 1), st.integers(-1, 2**62),
       st.integers(-1, 2**31 - 1), st.text(max_size=50), st.integers(0, 2**50))
def test_offset_records_roundtrip(group, topic, partition, offset, epoch, metadata, ts):
    assert decode_key(encode_offset_key(group, topic, partition)) == OffsetKey(group, topic, partition)
    value = OffsetValue(offset, epoch, metadata, ts)
    assert decode_offset_value(encode_offset_value(value)) == value
