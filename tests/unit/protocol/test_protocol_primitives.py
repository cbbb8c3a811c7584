"""Reader and writer primitives: values, bounds, and the refusal to allocate on lies."""

from __future__ import annotations

import array
import struct
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.protocol.primitives import (
    EMPTY_TAGS,
    ProtocolError,
    Reader,
    as_memoryview,
    encode_array_len,
    encode_bytes,
    encode_compact_array_len,
    encode_compact_bytes,
    encode_compact_nullable_array_len,
    encode_compact_nullable_bytes,
    encode_compact_nullable_string,
    encode_compact_string,
    encode_nullable_bytes,
    encode_nullable_string,
    encode_string,
    encode_uvarint,
    encode_varint,
    encode_varlong,
)


def _ref_uvarint(n: int) -> bytes:
    """Independent LEB128 reference, written differently from the codec on purpose."""
    groups = []
    while True:
        groups.append(n & 0x7F)
        n >>= 7
        if not n:
            break
    return bytes([g | 0x80 for g in groups[:-1]] + [groups[-1]])


# -- fixed width ------------------------------------------------------------------------------------


def test_fixed_width_reads() -> None:
    data = struct.pack(">bhiqI", -5, -300, -70000, -(2**40), 0xFFFFFFFE)
    r = Reader(data)
    assert (r.int8(), r.int16(), r.int32(), r.int64(), r.uint32()) == (-5, -300, -70000, -(2**40), 0xFFFFFFFE)
    assert r.remaining() == 0
    r.expect_end()


@pytest.mark.parametrize("method,size", [("int8", 1), ("int16", 2), ("int32", 4), ("int64", 8), ("uint32", 4)])
def test_fixed_width_truncated(method: str, size: int) -> None:
    for n in range(size):
        r = Reader(b"\x01" * n)
        with pytest.raises(ProtocolError):
            getattr(r, method)()
        assert r.pos == 0


def test_unpack_and_skip_bounds() -> None:
    r = Reader(b"\x00\x01\x00\x02\x03")
    assert r.unpack(struct.Struct(">hh")) == (1, 2)
    with pytest.raises(ProtocolError):
        r.unpack(struct.Struct(">h"))
    with pytest.raises(ProtocolError):
        r.skip(2)
    with pytest.raises(ProtocolError):
        r.skip(-1)
    r.skip(1)
    r.expect_end()


def test_expect_end_rejects_trailing() -> None:
    r = Reader(b"\x00\x00\x00\x01\xff")
    r.int32()
    with pytest.raises(ProtocolError, match="trailing"):
        r.expect_end()


def test_reader_start_offset_checked() -> None:
    assert Reader(b"abc", 3).remaining() == 0
    with pytest.raises(ProtocolError):
        Reader(b"abc", 4)
    with pytest.raises(ProtocolError):
        Reader(b"abc", -1)


def test_reader_normalises_non_byte_views() -> None:
    words = array.array("i", [1, 2])
    r = Reader(memoryview(words))
    assert r.remaining() == 8
    mv = as_memoryview(memoryview(b"abcd").cast("B", (2, 2)))
    assert mv.ndim == 1 and len(mv) == 4


# -- varints ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 0x7F, 0x80, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000, 2**31 - 1, 2**32 - 1])
def test_uvarint_boundaries(n: int) -> None:
    enc = encode_uvarint(n)
    assert enc == _ref_uvarint(n)
    r = Reader(enc + b"\xaa")
    assert r.uvarint() == n
    assert r.remaining() == 1


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_uvarint_roundtrip(n: int) -> None:
    enc = encode_uvarint(n)
    assert enc == _ref_uvarint(n)
    r = Reader(enc)
    assert r.uvarint() == n
    r.expect_end()


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_varint_zigzag_roundtrip(n: int) -> None:
    enc = encode_varint(n)
    assert enc == _ref_uvarint(2 * n if n >= 0 else -2 * n - 1)
    r = Reader(enc)
    assert r.varint() == n
    r.expect_end()


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_varlong_zigzag_roundtrip(n: int) -> None:
    enc = encode_varlong(n)
    assert enc == _ref_uvarint(2 * n if n >= 0 else -2 * n - 1)
    r = Reader(enc)
    assert r.varlong() == n
    r.expect_end()


def test_varint_range_checked_on_encode() -> None:
    with pytest.raises(ValueError):
        encode_varint(2**31)
    with pytest.raises(ValueError):
        encode_varlong(-(2**63) - 1)
    with pytest.raises(ValueError):
        encode_uvarint(-1)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x80",
        b"\xff\xff",
        b"\xff\xff\xff\xff",  # truncated before the 5th byte
        b"\xff\xff\xff\xff\xff\x01",  # 6 bytes
        b"\xff\xff\xff\xff\x7f",  # 5 bytes but 35 bits
        b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80",
    ],
)
def test_uvarint_malformed(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        Reader(data).uvarint()


def test_varlong_malformed() -> None:
    with pytest.raises(ProtocolError):
        Reader(b"\xff" * 10 + b"\x01").varlong()
    with pytest.raises(ProtocolError):
        Reader(b"\xff" * 9 + b"\x7f").varlong()  # 10 bytes, 70 bits
    with pytest.raises(ProtocolError):
        Reader(b"\xff" * 5).varlong()
    assert Reader(b"\xff" * 9 + b"\x01").varlong() == -(2**63)


# -- strings ----------------------------------------------------------------------------------------


@given(st.text(max_size=200))
def test_strings_roundtrip(s: str) -> None:
    data = encode_string(s) + encode_nullable_string(s) + encode_compact_string(s) + encode_compact_nullable_string(s)
    r = Reader(data)
    assert r.string() == s
    assert r.nullable_string() == s
    assert r.compact_string() == s
    assert r.compact_nullable_string() == s
    r.expect_end()


def test_null_strings() -> None:
    r = Reader(encode_nullable_string(None) + encode_compact_nullable_string(None))
    assert r.nullable_string() is None
    assert r.compact_nullable_string() is None
    r.expect_end()


def test_string_errors() -> None:
    with pytest.raises(ProtocolError):
        Reader(b"\xff\xff").string()  # null in a non-nullable string
    with pytest.raises(ProtocolError):
        Reader(b"\xff\xfe").nullable_string()  # -2
    with pytest.raises(ProtocolError):
        Reader(b"\x80\x00").nullable_string()  # -32768
    with pytest.raises(ProtocolError):
        Reader(b"\x00\x05abc").string()  # overruns
    with pytest.raises(ProtocolError):
        Reader(b"\x00").compact_string()  # null in a non-nullable compact string
    with pytest.raises(ProtocolError):
        Reader(encode_uvarint(0x8001) + b"a" * 0x8000).compact_string()  # longer than int16 allows
    with pytest.raises(ProtocolError):
        Reader(b"\x05ab").compact_nullable_string()


def test_invalid_utf8_is_replaced_like_kafka() -> None:
    assert Reader(b"\x00\x02a\xff").string() == "a\ufffd"


def test_string_encode_limit() -> None:
    encode_string("a" * 0x7FFF)
    with pytest.raises(ValueError):
        encode_string("a" * 0x8000)
    with pytest.raises(ValueError):
        encode_compact_string("\u00e9" * 0x4000)  # 2 bytes each in UTF-8


# -- bytes ------------------------------------------------------------------------------------------


def test_bytes_are_zero_copy_slices() -> None:
    payload = b"0123456789"
    buf = bytearray(b"xx" + encode_bytes(payload) + encode_compact_bytes(payload) + encode_nullable_bytes(None))
    r = Reader(memoryview(buf)[2:])
    a = r.bytes_()
    b = r.compact_bytes()
    assert r.nullable_bytes() is None
    r.expect_end()
    assert a == payload and b == payload
    assert a.obj is buf and b.obj is buf
    buf[6] = ord("X")  # proves it is a view, not a copy
    assert bytes(a)[0] == ord("X")


def test_null_and_bad_bytes() -> None:
    assert Reader(encode_compact_nullable_bytes(None)).compact_nullable_bytes() is None
    assert Reader(encode_compact_nullable_bytes(b"")).compact_nullable_bytes() == b""
    with pytest.raises(ProtocolError):
        Reader(b"\xff\xff\xff\xff").bytes_()
    with pytest.raises(ProtocolError):
        Reader(b"\xff\xff\xff\xfe").nullable_bytes()
    with pytest.raises(ProtocolError):
        Reader(b"\x00").compact_bytes()
    with pytest.raises(ProtocolError):
        Reader(b"\x7f\xff\xff\xff").nullable_bytes()
    with pytest.raises(ProtocolError):
        Reader(b"\xff\xff\xff\xff\x0f").compact_nullable_bytes()


# -- arrays -----------------------------------------------------------------------------------------


def test_array_lengths() -> None:
    r = Reader(encode_array_len(2) + b"\x00" * 8)
    assert r.array_len(4) == 2
    r = Reader(encode_compact_array_len(3) + b"\x00" * 3)
    assert r.compact_array_len() == 3
    assert Reader(encode_compact_nullable_array_len(None)).compact_nullable_array_len() is None
    assert Reader(encode_array_len(-1)).nullable_array_len() is None


@pytest.mark.parametrize(
    "data,method",
    [
        (b"\x7f\xff\xff\xff", "array_len"),
        (b"\x7f\xff\xff\xff", "nullable_array_len"),
        (b"\xff\xff\xff\xff", "array_len"),  # null where not allowed
        (b"\xff\xff\xff\xfe", "nullable_array_len"),
        (b"\x80\x00\x00\x00", "array_len"),
        (b"\xff\xff\xff\xff\x0f", "compact_array_len"),  # the varint that aborts kio
        (b"\xff\xff\xff\xff\x07", "compact_nullable_array_len"),
        (b"\x00", "compact_array_len"),  # null where not allowed
    ],
)
def test_absurd_array_lengths_fail_without_allocating(data: bytes, method: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError):
            getattr(Reader(data + b"\x00" * 16), method)()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


def test_array_length_uses_min_item_size() -> None:
    data = encode_array_len(3) + b"\x00" * 11
    with pytest.raises(ProtocolError):
        Reader(data).array_len(4)
    assert Reader(data).array_len(3) == 3


# -- tagged fields ----------------------------------------------------------------------------------


def test_skip_tags() -> None:
    r = Reader(EMPTY_TAGS + b"\x02" + b"\x00\x03abc" + b"\x81\x01\x00" + b"!")
    r.skip_tags()
    assert r.pos == 1
    r.skip_tags()
    assert bytes(r.buf[r.pos:]) == b"!"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x01",  # one tag, no bytes
        b"\x01\x00\x05abc",  # size overruns
        b"\xff\xff\xff\xff\x0f",  # absurd count
        b"\x02\x00\x00",  # second tag missing
        b"\x01\x00\xff\xff\xff\xff\x7f",  # absurd size varint
    ],
)
def test_skip_tags_malformed(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        Reader(data).skip_tags()
