"""Wire primitives for the hand-written hot-path codecs.

The `Reader` walks a `memoryview` and never copies payload bytes: `bytes`-typed
fields come back as memoryview slices of the caller's buffer, so a produce batch can
go from the socket buffer to the log untouched.

Malformed input is the normal case for a server, so every read is bounds-checked and
fails with `ProtocolError`, never with `struct.error`/`IndexError` leaking from the
internals. Lengths are checked against the bytes that remain *before* anything is
allocated: an array that claims 2**31 elements in a 12-byte request fails at once
instead of building a huge list (the failure mode that lets one request abort a
broker written against a naive decoder).

Strings decode with ``errors="replace"`` because Kafka's Java decoder does the same
(`new String(bytes, UTF_8)` substitutes U+FFFD); a client with an odd client id must
not be disconnected by oncelog when a Kafka broker would serve it, and a mangled topic
name still fails later, per topic, as an unknown or invalid topic.
"""

from __future__ import annotations

import struct

__all__ = [
    "ProtocolError",
    "UnsupportedVersionError",
    "Reader",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "UINT32",
    "EMPTY_TAGS",
    "MAX_STRING_LENGTH",
    "as_memoryview",
    "read_uvarint",
    "skip_tags_at",
    "decode_text",
    "encode_uvarint",
    "encode_varint",
    "encode_varlong",
    "encode_string",
    "encode_nullable_string",
    "encode_compact_string",
    "encode_compact_nullable_string",
    "encode_bytes",
    "encode_nullable_bytes",
    "encode_compact_bytes",
    "encode_compact_nullable_bytes",
    "encode_array_len",
    "encode_compact_array_len",
    "encode_compact_nullable_array_len",
]


class ProtocolError(Exception):
    """The bytes on the wire do not form a valid message: the connection should be closed.

    Kafka answers a request it cannot parse by closing the connection (there is no
    correlation-safe way to answer garbage), so handlers let this propagate.
    """


class UnsupportedVersionError(ProtocolError):
    """A codec was asked for an API version it does not implement.

    Separate from plain malformation so the dispatcher can tell a version-table bug
    (or a client ignoring ApiVersions) from corrupted bytes.
    """


INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
UINT32 = struct.Struct(">I")

#: A tagged-fields section with no tags: oncelog never emits optional tagged fields.
EMPTY_TAGS = b"\x00"

#: Kafka rejects strings longer than a signed int16 can describe, compact or not.
MAX_STRING_LENGTH = 0x7FFF

_MAX_INT32 = 0x7FFFFFFF

_i8 = INT8.unpack_from
_i16 = INT16.unpack_from
_i32 = INT32.unpack_from
_i64 = INT64.unpack_from
_u32 = UINT32.unpack_from


def as_memoryview(buf: bytes | bytearray | memoryview) -> memoryview:
    """A flat unsigned-byte view of `buf`, without copying.

    Slicing and `struct.unpack_from` on a view of another format or shape would count
    items instead of bytes; normalising once at the entry point keeps every offset a
    byte offset.
    """
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        if not mv.c_contiguous:
            raise ProtocolError("buffer is not contiguous")
        mv = mv.cast("B")
    return mv


def read_uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    """(value, next position) of the unsigned varint at `pos`; as Kafka's readUnsignedVarint.

    At most 5 bytes and 32 bits: the byte limit bounds the loop on garbage, and values
    above 2**32-1 cannot come from a conforming writer, so they are rejected rather
    than wrapped. Codecs inline the one-byte case and call this for the rest.
    """
    start = pos
    value = 0
    shift = 0
    try:
        while True:
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 28:
                raise ProtocolError(f"varint longer than 5 bytes at offset {start}")
    except IndexError:
        raise ProtocolError(f"truncated varint at offset {start}") from None
    if value > 0xFFFFFFFF:
        raise ProtocolError(f"varint exceeds 32 bits at offset {start}")
    return value, pos


def skip_tags_at(buf: memoryview, pos: int) -> int:
    """Position after the tagged-fields section at `pos`, keeping nothing.

    The hot-path codecs have no use for any tag their versions define (ClusterId,
    ReplicaState, ...), and a broker must ignore tags it does not know, so skipping
    everything is both correct and the cheapest option.
    """
    end = len(buf)
    count, pos = read_uvarint(buf, pos)
    if count * 2 > end - pos:  # each tag is at least a tag byte and a size byte
        raise ProtocolError(f"{count} tagged fields cannot fit in {end - pos} bytes")
    for _ in range(count):
        if pos >= end:
            raise ProtocolError(f"truncated tagged field at offset {pos}")
        if buf[pos] < 0x80:
            pos += 1
        else:
            _, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > end:
            raise ProtocolError(f"tagged field of {size} bytes overruns the buffer")
    return pos


_TEXT_CACHE: dict[bytes, str] = {}
_TEXT_CACHE_MAX_ENTRIES = 4096
_TEXT_CACHE_MAX_KEY = 255


def decode_text(view: memoryview) -> str:
    """UTF-8 text of `view`, memoised for the short strings that repeat on every request.

    Topic names and client ids recur on every produce and fetch; a dict hit is cheaper
    than decoding. The cache stops growing at a fixed size, so a client inventing names
    cannot make it grow without bound.
    """
    key = view.tobytes()
    text = _TEXT_CACHE.get(key)
    if text is None:
        text = key.decode("utf-8", "replace")
        if len(key) <= _TEXT_CACHE_MAX_KEY and len(_TEXT_CACHE) < _TEXT_CACHE_MAX_ENTRIES:
            _TEXT_CACHE[key] = text
    return text


class Reader:
    """A bounds-checked cursor over a byte buffer.

    The attributes are public so a codec can read several fixed-width fields with one
    `unpack` call (see `unpack`), which is where most of the hot path's speed comes from.
    """

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0) -> None:
        self.buf: memoryview = as_memoryview(buf)
        self.end: int = len(self.buf)
        if not 0 <= pos <= self.end:
            raise ProtocolError(f"start offset {pos} outside a buffer of {self.end} bytes")
        self.pos: int = pos

    # -- position -------------------------------------------------------------------------------

    def remaining(self) -> int:
        return self.end - self.pos

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise ProtocolError(f"cannot skip {n} bytes at offset {self.pos} of {self.end}")
        self.pos += n

    def expect_end(self, what: str = "message") -> None:
        """Reject trailing bytes: they mean the sender and we disagree on the layout,
        and answering a request we misread is worse than closing the connection."""
        if self.pos != self.end:
            raise ProtocolError(f"{self.end - self.pos} trailing bytes after {what}")

    # -- fixed width ----------------------------------------------------------------------------

    def unpack(self, st: struct.Struct) -> tuple:
        """Read consecutive fixed-width fields in one call."""
        pos = self.pos
        new = pos + st.size
        if new > self.end:
            raise ProtocolError(f"need {st.size} bytes at offset {pos}, have {self.end - pos}")
        self.pos = new
        return st.unpack_from(self.buf, pos)

    def int8(self) -> int:
        pos = self.pos
        if pos + 1 > self.end:
            raise ProtocolError(f"truncated int8 at offset {pos}")
        self.pos = pos + 1
        return _i8(self.buf, pos)[0]

    def int16(self) -> int:
        pos = self.pos
        if pos + 2 > self.end:
            raise ProtocolError(f"truncated int16 at offset {pos}")
        self.pos = pos + 2
        return _i16(self.buf, pos)[0]

    def int32(self) -> int:
        pos = self.pos
        if pos + 4 > self.end:
            raise ProtocolError(f"truncated int32 at offset {pos}")
        self.pos = pos + 4
        return _i32(self.buf, pos)[0]

    def int64(self) -> int:
        pos = self.pos
        if pos + 8 > self.end:
            raise ProtocolError(f"truncated int64 at offset {pos}")
        self.pos = pos + 8
        return _i64(self.buf, pos)[0]

    def uint32(self) -> int:
        pos = self.pos
        if pos + 4 > self.end:
            raise ProtocolError(f"truncated uint32 at offset {pos}")
        self.pos = pos + 4
        return _u32(self.buf, pos)[0]

    # -- varints --------------------------------------------------------------------------------

    def uvarint(self) -> int:
        """Unsigned varint (see `read_uvarint`)."""
        pos = self.pos
        if pos < self.end:
            b = self.buf[pos]
            if b < 0x80:  # the overwhelmingly common single-byte case
                self.pos = pos + 1
                return b
        value, self.pos = read_uvarint(self.buf, pos)
        return value

    def _uvarlong(self) -> int:
        buf = self.buf
        pos = self.pos
        end = self.end
        value = 0
        shift = 0
        while True:
            if pos >= end:
                raise ProtocolError(f"truncated varlong at offset {self.pos}")
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 63:
                raise ProtocolError(f"varlong longer than 10 bytes at offset {self.pos}")
        if value > 0xFFFFFFFFFFFFFFFF:
            raise ProtocolError(f"varlong exceeds 64 bits at offset {self.pos}")
        self.pos = pos
        return value

    def varint(self) -> int:
        """Zigzag-encoded signed 32-bit varint (record-level fields)."""
        v = self.uvarint()
        return (v >> 1) ^ -(v & 1)

    def varlong(self) -> int:
        """Zigzag-encoded signed 64-bit varint (record-level fields)."""
        v = self._uvarlong()
        return (v >> 1) ^ -(v & 1)

    # -- strings --------------------------------------------------------------------------------

    def _text(self, n: int) -> str:
        pos = self.pos
        new = pos + n
        if new > self.end:
            raise ProtocolError(f"string of {n} bytes at offset {pos} overruns the buffer")
        self.pos = new
        return decode_text(self.buf[pos:new])

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise ProtocolError(f"non-nullable string has length {n}")
        return self._text(n)

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n < 0:
            if n == -1:
                return None
            raise ProtocolError(f"string has negative length {n}")
        return self._text(n)

    def compact_string(self) -> str:
        n = self.uvarint() - 1
        if n < 0:
            raise ProtocolError("non-nullable compact string is null")
        if n > MAX_STRING_LENGTH:
            raise ProtocolError(f"compact string of {n} bytes exceeds {MAX_STRING_LENGTH}")
        return self._text(n)

    def compact_nullable_string(self) -> str | None:
        n = self.uvarint() - 1
        if n < 0:
            return None
        if n > MAX_STRING_LENGTH:
            raise ProtocolError(f"compact string of {n} bytes exceeds {MAX_STRING_LENGTH}")
        return self._text(n)

    # -- bytes (zero-copy) ----------------------------------------------------------------------

    def _view(self, n: int) -> memoryview:
        pos = self.pos
        new = pos + n
        if new > self.end:
            raise ProtocolError(f"{n} bytes at offset {pos} overrun the buffer ({self.end - pos} left)")
        self.pos = new
        return self.buf[pos:new]

    def bytes_(self) -> memoryview:
        n = self.int32()
        if n < 0:
            raise ProtocolError(f"non-nullable bytes has length {n}")
        return self._view(n)

    def nullable_bytes(self) -> memoryview | None:
        n = self.int32()
        if n < 0:
            if n == -1:
                return None
            raise ProtocolError(f"bytes has negative length {n}")
        return self._view(n)

    def compact_bytes(self) -> memoryview:
        n = self.uvarint() - 1
        if n < 0:
            raise ProtocolError("non-nullable compact bytes is null")
        return self._view(n)

    def compact_nullable_bytes(self) -> memoryview | None:
        n = self.uvarint() - 1
        if n < 0:
            return None
        return self._view(n)

    # -- arrays ---------------------------------------------------------------------------------

    def _check_count(self, n: int, min_item_size: int) -> int:
        if n * min_item_size > self.end - self.pos:
            raise ProtocolError(
                f"array of {n} items (>= {min_item_size} bytes each) cannot fit in the "
                f"{self.end - self.pos} bytes left at offset {self.pos}"
            )
        return n

    def array_len(self, min_item_size: int = 1) -> int:
        """Length of a non-nullable int32-counted array, checked against the bytes left.

        `min_item_size` is the smallest encoding of one element; passing the real
        figure makes the check tight enough that no decoder loop can run more than
        `remaining / min_item_size` times.
        """
        n = self.int32()
        if n < 0:
            raise ProtocolError(f"non-nullable array has length {n}")
        return self._check_count(n, min_item_size)

    def nullable_array_len(self, min_item_size: int = 1) -> int | None:
        n = self.int32()
        if n < 0:
            if n == -1:
                return None
            raise ProtocolError(f"array has negative length {n}")
        return self._check_count(n, min_item_size)

    def compact_array_len(self, min_item_size: int = 1) -> int:
        n = self.uvarint() - 1
        if n < 0:
            raise ProtocolError("non-nullable compact array is null")
        return self._check_count(n, min_item_size)

    def compact_nullable_array_len(self, min_item_size: int = 1) -> int | None:
        n = self.uvarint() - 1
        if n < 0:
            return None
        return self._check_count(n, min_item_size)

    # -- tagged fields --------------------------------------------------------------------------

    def skip_tags(self) -> None:
        """Skip a tagged-fields section (see `skip_tags_at`)."""
        pos = self.pos
        if pos < self.end and self.buf[pos] == 0:  # no tags: almost always
            self.pos = pos + 1
        else:
            self.pos = skip_tags_at(self.buf, pos)


# -- writers ------------------------------------------------------------------------------------

_SMALL_UVARINTS = tuple(bytes((i,)) for i in range(0x80))


_U16 = struct.Struct(">H")


def encode_uvarint(n: int) -> bytes:
    """Unsigned varint (LEB128), the length prefix of every compact field.

    One and two bytes (lengths below 16 KiB) are special-cased: they cover names,
    arrays, and most record batches in a fetch response.
    """
    if n < 0x80:
        if n < 0:
            raise ValueError(f"unsigned varint cannot encode {n}")
        return _SMALL_UVARINTS[n]
    if n < 0x4000:
        return _U16.pack(((n & 0x7F) | 0x80) << 8 | (n >> 7))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_varint(n: int) -> bytes:
    """Zigzag signed 32-bit varint."""
    if not -0x80000000 <= n <= _MAX_INT32:
        raise ValueError(f"{n} does not fit a varint")
    return encode_uvarint(((n << 1) ^ (n >> 31)) & 0xFFFFFFFF)


def encode_varlong(n: int) -> bytes:
    """Zigzag signed 64-bit varint."""
    if not -0x8000000000000000 <= n <= 0x7FFFFFFFFFFFFFFF:
        raise ValueError(f"{n} does not fit a varlong")
    return encode_uvarint(((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF)


def _utf8(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > MAX_STRING_LENGTH:
        raise ValueError(f"string of {len(b)} bytes exceeds the protocol maximum {MAX_STRING_LENGTH}")
    return b


_NULL_STRING = INT16.pack(-1)
_NULL_BYTES = INT32.pack(-1)
_NULL_COMPACT = b"\x00"


def encode_string(s: str) -> bytes:
    b = _utf8(s)
    return INT16.pack(len(b)) + b


def encode_nullable_string(s: str | None) -> bytes:
    return _NULL_STRING if s is None else encode_string(s)


def encode_compact_string(s: str) -> bytes:
    b = _utf8(s)
    return encode_uvarint(len(b) + 1) + b


def encode_compact_nullable_string(s: str | None) -> bytes:
    return _NULL_COMPACT if s is None else encode_compact_string(s)


def encode_bytes(b: bytes | bytearray | memoryview) -> bytes:
    return INT32.pack(len(b)) + bytes(b)


def encode_nullable_bytes(b: bytes | bytearray | memoryview | None) -> bytes:
    return _NULL_BYTES if b is None else encode_bytes(b)


def encode_compact_bytes(b: bytes | bytearray | memoryview) -> bytes:
    return encode_uvarint(len(b) + 1) + bytes(b)


def encode_compact_nullable_bytes(b: bytes | bytearray | memoryview | None) -> bytes:
    return _NULL_COMPACT if b is None else encode_compact_bytes(b)


def encode_array_len(n: int) -> bytes:
    return INT32.pack(n)


def encode_compact_array_len(n: int) -> bytes:
    return encode_uvarint(n + 1)


def encode_compact_nullable_array_len(n: int | None) -> bytes:
    return _NULL_COMPACT if n is None else encode_uvarint(n + 1)
