"""Decode fetched record batches for the Python client.

A Fetch response's records are whole batches followed, often, by a partial batch cut off by
the fetch size: the partial one is skipped, and the consumer fetches it again from its offset.
Records are parsed by aiokafka's Cython parser (about 10x a pure-Python loop); compressed
batches are inflated by our codecs first, so xerial snappy and every lz4 frame work.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import crc32c
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatch

from oncelog.records.batch import (
    COMPRESSION_MASK,
    CRC_START,
    HEADER_SIZE_UP_TO_MAGIC,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    OFF_ATTRIBUTES,
    OFF_MAGIC,
    BatchHeader,
    read_header,
    read_prefix,
)
from oncelog.records.compression import Buffer, CompressionError, inflate_batch
from oncelog.records.control import (
    ControlRecordError,
    ControlType,
    EndTxnMarker,
    parse_control_key,
    parse_end_txn_value,
)

TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1


class CorruptRecordsError(Exception):
    """A fetched batch that fails its CRC or cannot be parsed; the consumer must not skip it silently."""

    def __init__(self, message: str, base_offset: int | None = None) -> None:
        super().__init__(message)
        self.base_offset = base_offset


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(slots=True)
class Batch:
    header: BatchHeader
    records: list[Record] = field(default_factory=list)
    # For a COMMIT/ABORT control batch: the marker. Other control batches leave it None.
    marker: EndTxnMarker | None = None

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def last_offset(self) -> int:
        return self.header.last_offset

    @property
    def next_offset(self) -> int:
        return self.header.next_offset

    @property
    def size(self) -> int:
        return self.header.size

    @property
    def is_control(self) -> bool:
        return self.header.is_control

    @property
    def is_transactional(self) -> bool:
        return self.header.is_transactional

    @property
    def producer_id(self) -> int:
        return self.header.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.header.producer_epoch

    @property
    def base_sequence(self) -> int:
        return self.header.base_sequence

    @property
    def compression(self) -> int:
        return self.header.compression

    @property
    def timestamp_type(self) -> int:
        return TIMESTAMP_LOG_APPEND_TIME if self.header.log_append_time else TIMESTAMP_CREATE_TIME


def decode_batch_records(batch: Buffer) -> list[Record]:
    """Records of one whole batch (compressed or not); CRC not checked here."""
    view = memoryview(batch)
    try:
        if view[OFF_ATTRIBUTES + 1] & COMPRESSION_MASK:
            view = memoryview(inflate_batch(view))
        return [Record(r.offset, r.timestamp, r.key, r.value, r.headers) for r in DefaultRecordBatch(view)]
    except CompressionError as exc:
        raise CorruptRecordsError(f"cannot decompress batch: {exc}") from exc
    except (CorruptRecordException, ValueError, IndexError, OverflowError) as exc:
        raise CorruptRecordsError(f"malformed records: {exc}") from exc


def complete_size(buf: Buffer) -> int:
    """Bytes of `buf` taken by whole batches; what follows is a partial batch (or nothing)."""
    end = len(buf)
    pos = 0
    while pos + LOG_OVERHEAD <= end:
        length = read_prefix(buf, pos)[1]
        if length < MIN_BATCH_LENGTH or pos + LOG_OVERHEAD + length > end:
            break
        pos += LOG_OVERHEAD + length
    return pos


def iter_batches(buf: Buffer, *, check_crc: bool = True, decode: bool = True) -> Iterator[Batch]:
    """Yield every whole batch in `buf`; a trailing partial batch is skipped.

    `check_crc` mirrors the Java consumer's check.crcs (on by default): a torn or flipped byte
    raises CorruptRecordsError rather than reaching the application. With `decode=False` only
    headers are read (offset bookkeeping without record work).
    """
    view = memoryview(buf)
    end = view.nbytes
    pos = 0
    while pos + LOG_OVERHEAD <= end:
        base_offset, length = read_prefix(view, pos)
        if pos + HEADER_SIZE_UP_TO_MAGIC > end:
            return  # partial batch at the end of a fetch
        magic = view[pos + OFF_MAGIC]
        if magic != MAGIC:
            raise CorruptRecordsError(
                f"batch at offset {base_offset} has magic {magic}; only magic 2 is supported", base_offset
            )
        if length < MIN_BATCH_LENGTH:
            raise CorruptRecordsError(f"batch at offset {base_offset} has an impossible length {length}", base_offset)
        size = LOG_OVERHEAD + length
        if pos + size > end:
            return  # partial batch at the end of a fetch
        body = view[pos : pos + size]
        header = read_header(body)
        if check_crc and crc32c.crc32c(body[CRC_START:]) != header.crc:
            raise CorruptRecordsError(f"batch at offset {base_offset} fails its CRC check", base_offset)
        batch = Batch(header)
        if decode:
            try:
                batch.records = decode_batch_records(body)
            except CorruptRecordsError as exc:
                raise CorruptRecordsError(f"batch at offset {base_offset}: {exc}", base_offset) from exc
            if header.is_control and batch.records:
                batch.marker = _marker(header, batch.records[0])
        yield batch
        pos += size


def read_batches(buf: Buffer, *, check_crc: bool = True, decode: bool = True) -> list[Batch]:
    return list(iter_batches(buf, check_crc=check_crc, decode=decode))


def _marker(header: BatchHeader, record: Record) -> EndTxnMarker | None:
    try:
        control_type = parse_control_key(record.key)
        if control_type not in (ControlType.ABORT, ControlType.COMMIT):
            return None
        coordinator_epoch = parse_end_txn_value(record.value)
    except ControlRecordError as exc:
        raise CorruptRecordsError(f"control batch at offset {header.base_offset}: {exc}", header.base_offset) from exc
    return EndTxnMarker(header.producer_id, header.producer_epoch, control_type == ControlType.COMMIT,
                        coordinator_epoch, record.timestamp)
