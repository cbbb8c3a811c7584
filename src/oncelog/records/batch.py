"""RecordBatch v2 (magic 2) header access without per-record work.

The hot path never decodes records: it unpacks the fixed 61-byte header with one
`struct` call, checks the CRC32C over the bytes the CRC covers, and patches the
fields the broker owns (base offset, partition leader epoch, and for LogAppendTime
topics the max timestamp) in place. Base offset and leader epoch sit before the
CRC-covered range, so assigning offsets never re-computes the CRC.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import crc32c

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # base offset (8) + batch length (4): the part not counted in batch length
MAGIC = 2
CRC_START = 21  # the CRC covers attributes .. end of batch

OFF_BASE_OFFSET = 0
OFF_LENGTH = 8
OFF_LEADER_EPOCH = 12
OFF_MAGIC = 16
OFF_CRC = 17
OFF_ATTRIBUTES = 21
OFF_LAST_OFFSET_DELTA = 23
OFF_BASE_TIMESTAMP = 27
OFF_MAX_TIMESTAMP = 35
OFF_PRODUCER_ID = 43
OFF_PRODUCER_EPOCH = 51
OFF_BASE_SEQUENCE = 53
OFF_RECORD_COUNT = 57

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_PREFIX = struct.Struct(">qi")
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_UI = struct.Struct(">I")
_H = struct.Struct(">h")


class BatchHeader(NamedTuple):
    base_offset: int
    length: int  # bytes after the length field; whole batch = LOG_OVERHEAD + length
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record, wrapping at 2^31-1 the way producers wrap."""
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % 0x80000000


def read_header(buf, offset: int = 0) -> BatchHeader:
    """Unpack the fixed header at `offset`; the caller guarantees 61 bytes are there."""
    return BatchHeader._make(_HEADER.unpack_from(buf, offset))


def read_prefix(buf, offset: int = 0) -> tuple[int, int]:
    """(base offset, batch length) from the first 12 bytes."""
    return _PREFIX.unpack_from(buf, offset)


def compute_crc(buf, offset: int, size: int) -> int:
    """CRC32C of the CRC-covered part of the batch that starts at `offset`."""
    mv = memoryview(buf)
    return crc32c.crc32c(mv[offset + CRC_START : offset + size])


def crc_ok(buf, offset: int, header: BatchHeader) -> bool:
    return compute_crc(buf, offset, header.size) == header.crc


def set_base_offset(buf, offset: int, base_offset: int) -> None:
    _Q.pack_into(buf, offset + OFF_BASE_OFFSET, base_offset)


def set_leader_epoch(buf, offset: int, epoch: int) -> None:
    _I.pack_into(buf, offset + OFF_LEADER_EPOCH, epoch)


def set_log_append_time(buf, offset: int, size: int, timestamp_ms: int) -> None:
    """Mark the batch LogAppendTime with `timestamp_ms` as its max timestamp, and re-CRC.

    Consumers take every record's timestamp from the max timestamp of such a batch.
    """
    attrs = _H.unpack_from(buf, offset + OFF_ATTRIBUTES)[0] | TIMESTAMP_TYPE_MASK
    _H.pack_into(buf, offset + OFF_ATTRIBUTES, attrs)
    _Q.pack_into(buf, offset + OFF_MAX_TIMESTAMP, timestamp_ms)
    _UI.pack_into(buf, offset + OFF_CRC, compute_crc(buf, offset, size))


def rewrite_crc(buf, offset: int, size: int) -> None:
    _UI.pack_into(buf, offset + OFF_CRC, compute_crc(buf, offset, size))


def iter_headers(buf, start: int = 0, end: int | None = None):
    """Yield (position, header) for each whole batch in buf[start:end]; stops at a torn tail."""
    end = len(buf) if end is None else end
    pos = start
    while pos + HEADER_SIZE <= end:
        header = read_header(buf, pos)
        if header.length < HEADER_SIZE - LOG_OVERHEAD or pos + header.size > end:
            return
        yield pos, header
        pos += header.size


MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # the smallest legal value of the length field (no records)
HEADER_SIZE_UP_TO_MAGIC = OFF_MAGIC + 1


def pack_header(buf, offset: int, header: BatchHeader) -> None:
    """Write all 61 header bytes; the CRC field is written as given (call `rewrite_crc` after)."""
    _HEADER.pack_into(buf, offset, *header)
