"""Produce request decode and Produce response encode, versions 3..11.

Kafka's JSON schema (ProduceRequest.json / ProduceResponse.json) is the spec; the
round-trip tests check these functions against kafka-python's schema-driven codec
for every version.

The request decoder returns each partition's records as a memoryview slice of the
request buffer: the batch goes to CRC check, in-place offset patching and the log
without a copy. Versions 12 (same layout as 11, but it signals transaction V2) and
13 (topic IDs) are deliberately not accepted: advertising them promises semantics,
not just a layout.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .primitives import (
    EMPTY_TAGS,
    INT16,
    INT32,
    MAX_STRING_LENGTH,
    ProtocolError,
    Reader,
    UnsupportedVersionError,
    as_memoryview,
    decode_text,
    encode_compact_nullable_string,
    encode_compact_string,
    encode_nullable_string,
    encode_string,
    encode_uvarint,
    read_uvarint,
    skip_tags_at,
)

__all__ = [
    "MIN_VERSION",
    "MAX_VERSION",
    "FIRST_FLEXIBLE_VERSION",
    "ProduceRequestData",
    "ProducePartitionResponse",
    "decode_produce_request",
    "encode_produce_response",
]

MIN_VERSION = 3
MAX_VERSION = 11
FIRST_FLEXIBLE_VERSION = 9

PartitionRecords = tuple[int, memoryview | None]
TopicRecords = tuple[str, list[PartitionRecords]]


@dataclass(slots=True)
class ProduceRequestData:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    #: [(topic name, [(partition index, records or None)])]; records are slices of the request buffer.
    topics: list[TopicRecords]


_ACKS_TIMEOUT = struct.Struct(">hi")
_INDEX_LEN = struct.Struct(">ii")
_i32 = INT32.unpack_from


def decode_produce_request(body: memoryview, version: int) -> ProduceRequestData:
    """Decode a Produce request body (the bytes after the request header).

    Raises `ProtocolError` on any malformation, including trailing bytes, and
    `UnsupportedVersionError` outside 3..11.
    """
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise UnsupportedVersionError(f"Produce v{version} is not supported ({MIN_VERSION}-{MAX_VERSION})")
    buf = as_memoryview(body)
    try:
        if version >= FIRST_FLEXIBLE_VERSION:
            return _decode_flexible(buf)
        return _decode_classic(buf)
    except (IndexError, struct.error):
        # Fixed-width reads and single-byte peeks are not bounds-checked one by one:
        # running off the end surfaces here instead, at no cost on the valid path.
        raise ProtocolError(f"truncated Produce v{version} request ({len(buf)} bytes)") from None


def _decode_flexible(buf: memoryview) -> ProduceRequestData:
    # Written out with a local position rather than through `Reader`: this runs once
    # per produce request, and method calls were half of its cost. Each varint inlines
    # its one-byte case and falls back to `read_uvarint`.
    end = len(buf)
    pos = 0
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = read_uvarint(buf, pos)
    if n == 0:
        transactional_id = None
    else:
        new = pos + n - 1
        if n - 1 > MAX_STRING_LENGTH or new > end:
            raise ProtocolError(f"transactional id of {n - 1} bytes at offset {pos} is invalid")
        transactional_id = decode_text(buf[pos:new])
        pos = new
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(buf, pos)
    pos += 6
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = read_uvarint(buf, pos)
    # smallest topic: name(1) + partitions(1) + tags(1)
    if n == 0 or (n - 1) * 3 > end - pos:
        raise ProtocolError(f"topic count {n - 1} is null or cannot fit in {end - pos} bytes")
    topics: list[TopicRecords] = []
    for _ in range(n - 1):
        n = buf[pos]
        if n < 0x80:
            pos += 1
        else:
            n, pos = read_uvarint(buf, pos)
        new = pos + n - 1
        if n == 0 or n - 1 > MAX_STRING_LENGTH or new > end:
            raise ProtocolError(f"topic name of {n - 1} bytes at offset {pos} is invalid")
        name = decode_text(buf[pos:new])
        pos = new
        n = buf[pos]
        if n < 0x80:
            pos += 1
        else:
            n, pos = read_uvarint(buf, pos)
        # smallest partition: index(4) + records(1) + tags(1)
        if n == 0 or (n - 1) * 6 > end - pos:
            raise ProtocolError(f"partition count {n - 1} is null or cannot fit in {end - pos} bytes")
        partitions: list[PartitionRecords] = []
        for _ in range(n - 1):
            index = _i32(buf, pos)[0]
            pos += 4
            n = buf[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = read_uvarint(buf, pos)
            if n == 0:
                partitions.append((index, None))
            else:
                new = pos + n - 1
                if new > end:
                    raise ProtocolError(f"records of {n - 1} bytes at offset {pos} overrun the request")
                partitions.append((index, buf[pos:new]))
                pos = new
            if buf[pos]:
                pos = skip_tags_at(buf, pos)
            else:
                pos += 1
        if buf[pos]:
            pos = skip_tags_at(buf, pos)
        else:
            pos += 1
        topics.append((name, partitions))
    if buf[pos]:
        pos = skip_tags_at(buf, pos)
    else:
        pos += 1
    if pos != end:
        raise ProtocolError(f"{end - pos} trailing bytes after Produce request")
    return ProduceRequestData(transactional_id, acks, timeout_ms, topics)


def _decode_classic(buf: memoryview) -> ProduceRequestData:
    r = Reader(buf)
    transactional_id = r.nullable_string()
    acks, timeout_ms = r.unpack(_ACKS_TIMEOUT)
    unpack_index_len = _INDEX_LEN.unpack_from
    topics: list[TopicRecords] = []
    # smallest topic: name(2) + partitions(4); partition: index(4) + records length(4)
    for _ in range(r.array_len(6)):
        name = r.string()
        partitions: list[PartitionRecords] = []
        for _ in range(r.array_len(8)):
            pos = r.pos
            new = pos + 8
            if new > r.end:
                raise ProtocolError(f"truncated partition at offset {pos}")
            index, n = unpack_index_len(buf, pos)
            if n < 0:
                if n != -1:
                    raise ProtocolError(f"records have negative length {n}")
                r.pos = new
                partitions.append((index, None))
                continue
            end = new + n
            if end > r.end:
                raise ProtocolError(f"records of {n} bytes at offset {new} overrun the request")
            r.pos = end
            partitions.append((index, buf[new:end]))
        topics.append((name, partitions))
    r.expect_end("Produce request")
    return ProduceRequestData(transactional_id, acks, timeout_ms, topics)


class ProducePartitionResponse(NamedTuple):
    """One partition's answer. Any tuple with these fields in this order is accepted."""

    index: int
    error_code: int = 0
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    #: [(batch index, message or None)], v8+ (KIP-467: which record sank the batch)
    record_errors: Sequence[tuple[int, str | None]] = ()
    error_message: str | None = None


_P_V3 = struct.Struct(">ihqq")  # index, error, base offset, log append time
_P_V5 = struct.Struct(">ihqqq")  # + log start offset
# v8: + empty record_errors (int32 0) + null error_message (int16 -1): the usual answer in one pack
_P_V8_PLAIN = struct.Struct(">ihqqqih")
# v9+: + empty compact record_errors (1) + null compact error_message (0) + empty tags (0)
_P_V9_PLAIN = struct.Struct(">ihqqqBBB")
_EMPTY_RECORD_ERRORS = INT32.pack(0)
_EMPTY_COMPACT_ARRAY = b"\x01"
_NULL_STRING = INT16.pack(-1)
_NULL_COMPACT = b"\x00"
_pack_i32 = INT32.pack


def encode_produce_response(
    version: int,
    responses: Sequence[tuple[str, Sequence[ProducePartitionResponse | tuple]]],
    throttle_time_ms: int = 0,
) -> bytes:
    """Encode a Produce response body: `responses` is [(topic, [ProducePartitionResponse])].

    Plain 7-tuples in `ProducePartitionResponse` order are accepted too. v10+ tagged
    fields (CurrentLeader, NodeEndpoints) are left out (zero tags): they only help a
    client find a new leader, and oncelog is a single broker.
    """
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise UnsupportedVersionError(f"Produce v{version} is not supported ({MIN_VERSION}-{MAX_VERSION})")
    out: list[bytes] = []
    add = out.append
    if version >= FIRST_FLEXIBLE_VERSION:
        plain = _P_V9_PLAIN.pack
        add(encode_uvarint(len(responses) + 1))
        for name, partitions in responses:
            add(encode_compact_string(name))
            add(encode_uvarint(len(partitions) + 1))
            for index, error_code, base_offset, append_time, lso, record_errors, message in partitions:
                if not record_errors and message is None:
                    add(plain(index, error_code, base_offset, append_time, lso, 1, 0, 0))
                    continue
                add(_P_V5.pack(index, error_code, base_offset, append_time, lso))
                if record_errors:
                    add(encode_uvarint(len(record_errors) + 1))
                    for batch_index, batch_message in record_errors:
                        add(_pack_i32(batch_index))
                        add(encode_compact_nullable_string(batch_message))
                        add(EMPTY_TAGS)
                else:
                    add(_EMPTY_COMPACT_ARRAY)
                add(_NULL_COMPACT if message is None else encode_compact_string(message))
                add(EMPTY_TAGS)
            add(EMPTY_TAGS)
        add(_pack_i32(throttle_time_ms))
        add(EMPTY_TAGS)
        return b"".join(out)
    add(_pack_i32(len(responses)))
    for name, partitions in responses:
        add(encode_string(name))
        add(_pack_i32(len(partitions)))
        for index, error_code, base_offset, append_time, lso, record_errors, message in partitions:
            if version < 5:
                add(_P_V3.pack(index, error_code, base_offset, append_time))
            elif version < 8:
                add(_P_V5.pack(index, error_code, base_offset, append_time, lso))
            elif not record_errors and message is None:
                add(_P_V8_PLAIN.pack(index, error_code, base_offset, append_time, lso, 0, -1))
            else:
                add(_P_V5.pack(index, error_code, base_offset, append_time, lso))
                if record_errors:
                    add(_pack_i32(len(record_errors)))
                    for batch_index, batch_message in record_errors:
                        add(_pack_i32(batch_index))
                        add(encode_nullable_string(batch_message))
                else:
                    add(_EMPTY_RECORD_ERRORS)
                add(_NULL_STRING if message is None else encode_string(message))
    add(_pack_i32(throttle_time_ms))
    return b"".join(out)
