"""Records of a v2 batch as byte ranges, for code that must drop some records and keep the rest unchanged.

The log cleaner (storage/cleaner/) keeps a subset of a batch's records. Decoding each record into Python objects
and encoding it again would cost a copy of every key, value and header and could change bytes (header order,
empty vs null). Here a record is walked only as far as the cleaner needs, its key and whether its value is null,
and the rest of it (key length through the last header) is kept as a slice of the source, written back verbatim.
Only the record's timestamp delta may change (a batch that gets a delete horizon gets a new base timestamp,
KIP-534), so the record is re-framed from its parts, not copied whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from .builder import zigzag_varint


class RawRecordError(ValueError):
    """The records section does not parse as the header's record count says."""


class RawRecord(NamedTuple):
    attributes: int
    timestamp_delta: int
    offset_delta: int
    key: bytes | None
    value_is_null: bool
    tail: memoryview  # from the key length to the end of the record's headers, as stored


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """A zigzag varint at `pos`: (value, position after it)."""
    shift = 0
    raw = 0
    while True:
        if pos >= end or shift > 63:
            raise RawRecordError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def walk(records: memoryview, count: int) -> Iterator[RawRecord]:
    """The `count` records of an uncompressed records section (what follows a batch's 61-byte header).
    RawRecordError if the bytes do not hold exactly that many well-formed records."""
    end = len(records)
    pos = 0
    for _ in range(count):
        length, pos = _varint(records, pos, end)
        stop = pos + length
        if length < 0 or stop > end:
            raise RawRecordError("record length beyond the records section")
        if pos >= stop:
            raise RawRecordError("empty record")
        attributes = records[pos]
        timestamp_delta, p = _varint(records, pos + 1, stop)
        offset_delta, p = _varint(records, p, stop)
        tail_start = p
        key_length, p = _varint(records, p, stop)
        if key_length < 0:
            key = None
        else:
            if p + key_length > stop:
                raise RawRecordError("key beyond the record")
            key = bytes(records[p:p + key_length])
            p += key_length
        value_length, p = _varint(records, p, stop)
        if value_length > 0 and p + value_length > stop:
            raise RawRecordError("value beyond the record")
        yield RawRecord(attributes, timestamp_delta, offset_delta, key, value_length < 0, records[tail_start:stop])
        pos = stop
    if pos != end:
        raise RawRecordError(f"{end - pos} bytes after the {count} records the header declares")


def encode(record: RawRecord, timestamp_delta: int) -> bytes:
    """`record` framed again with `timestamp_delta`: byte-identical to the source when the delta is unchanged."""
    body = b"".join((bytes((record.attributes,)), zigzag_varint(timestamp_delta), zigzag_varint(record.offset_delta),
                     record.tail))
    return zigzag_varint(len(body)) + body
