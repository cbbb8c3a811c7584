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
    source: bytes  # the records section the record lies in
    start: int  # where the record starts in `source` (its length varint)
    tail_start: int  # where its key length starts
    stop: int  # where it ends

    @property
    def tail(self) -> memoryview:
        """From the key length to the end of the record's headers, as stored."""
        return memoryview(self.source)[self.tail_start:self.stop]

    @property
    def whole(self) -> bytes:
        """The record as stored, length included: what a batch that keeps it unchanged copies."""
        return self.source[self.start:self.stop]


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
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


def walk(records: bytes | bytearray | memoryview, count: int) -> Iterator[RawRecord]:
    """The `count` records of an uncompressed records section (what follows a batch's 61-byte header).
    RawRecordError if the bytes do not hold exactly that many well-formed records.

    This is the cleaner's per-record loop, the one place it touches every record, so the common one-byte
    and two-byte varints are read inline and the key is the only slice taken (the rest are positions)."""
    buf = records if isinstance(records, bytes) else bytes(records)
    end = len(buf)
    pos = 0
    try:
        for _ in range(count):
            start = pos
            b = buf[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                b = (b & 0x7F) | (buf[pos + 1] << 7)
                length = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                length, pos = _varint(buf, pos, end)
            stop = pos + length
            if length <= 0 or stop > end:
                raise RawRecordError("record length beyond the records section" if length > 0 else "empty record")
            attributes = buf[pos]
            p = pos + 1
            b = buf[p]
            if b < 0x80:
                timestamp_delta = (b >> 1) ^ -(b & 1)
                p += 1
            elif buf[p + 1] < 0x80:
                b = (b & 0x7F) | (buf[p + 1] << 7)
                timestamp_delta = (b >> 1) ^ -(b & 1)
                p += 2
            else:
                timestamp_delta, p = _varint(buf, p, stop)
            b = buf[p]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                p += 1
            elif buf[p + 1] < 0x80:
                b = (b & 0x7F) | (buf[p + 1] << 7)
                offset_delta = (b >> 1) ^ -(b & 1)
                p += 2
            else:
                offset_delta, p = _varint(buf, p, stop)
            tail_start = p
            b = buf[p]
            if b < 0x80:
                key_length = (b >> 1) ^ -(b & 1)
                p += 1
            elif buf[p + 1] < 0x80:
                b = (b & 0x7F) | (buf[p + 1] << 7)
                key_length = (b >> 1) ^ -(b & 1)
                p += 2
            else:
                key_length, p = _varint(buf, p, stop)
            if key_length < 0:
                key = None
            else:
                if p + key_length > stop:
                    raise RawRecordError("key beyond the record")
                key = buf[p:p + key_length]
                p += key_length
            b = buf[p]
            if b < 0x80:
                value_length = (b >> 1) ^ -(b & 1)
                p += 1
            elif buf[p + 1] < 0x80:
                b = (b & 0x7F) | (buf[p + 1] << 7)
                value_length = (b >> 1) ^ -(b & 1)
                p += 2
            else:
                value_length, p = _varint(buf, p, stop)
            if p > stop or (value_length > 0 and p + value_length > stop):
                raise RawRecordError("value beyond the record")
            yield RawRecord(attributes, timestamp_delta, offset_delta, key, value_length < 0, buf, start,
                            tail_start, stop)
            pos = stop
    except IndexError:
        raise RawRecordError("a record runs past the records section") from None
    if pos != end:
        raise RawRecordError(f"{end - pos} bytes after the {count} records the header declares")


def encode(record: RawRecord, timestamp_delta: int) -> bytes:
    """`record` framed again with `timestamp_delta`: byte-identical to the source when the delta is unchanged."""
    if timestamp_delta == record.timestamp_delta:
        return record.whole
    body = b"".join((bytes((record.attributes,)), zigzag_varint(timestamp_delta), zigzag_varint(record.offset_delta),
                     record.tail))
    return zigzag_varint(len(body)) + body
