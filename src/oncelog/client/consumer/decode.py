"""One fetched partition's record bytes -> the Messages the application sees.

Work is per batch wherever it can be: the 61-byte header is unpacked with one struct call,
the CRC is one crc32c call over the batch, aborted transactions and control batches are
dropped by their headers without decoding a record, and compressed batches are inflated by
`oncelog.records.compression` (xerial snappy, every lz4 frame). The only per-record work is the
unavoidable decode, done by aiokafka's Cython parser, whose output is turned into Messages by
C-level `map` calls (no Python frame per record).

Records stay plain tuples until the application takes them (`DecodedFetch.kinds` says which
Message class each run of them gets): a batch without headers gives exact tuples of atomic values,
which the garbage collector stops tracking, so thousands of records waiting in the prefetch
buffer cost no collector time (Message instances made up front cost more than the decode itself).

read_committed follows Kafka's consumer: the response lists the aborted transactions of the
fetched range as (producer id, first offset); a producer's transactional batches are dropped
from its aborted transaction's first offset up to its ABORT marker. The broker already stops a
read_committed fetch at the last stable offset, so nothing beyond it is ever decoded here.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from functools import partial
from operator import attrgetter, itemgetter
from typing import NamedTuple

import crc32c
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatch

from oncelog.client.types import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Message, message_class
from oncelog.records.batch import (
    COMPRESSION_MASK,
    CONTROL_MASK,
    CRC_START,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    OFF_MAGIC,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    read_header,
    read_prefix,
)
from oncelog.records.compression import CompressionError, inflate_batch
from oncelog.records.control import ControlRecordError, ControlType, parse_control_key

_RECORD_WITH_HEADERS = attrgetter("offset", "timestamp", "key", "value", "headers")
_HEADERS_OF_TUPLE = itemgetter(4)
_WITHOUT_HEADERS = itemgetter(0, 1, 2, 3)
_new_tuple = tuple.__new__

Record = tuple  # (offset, timestamp, key, value[, headers]): a Message's contents


class CorruptRecords(Exception):
    """A batch that fails its CRC or cannot be parsed; the consumer stops at it instead of skipping data."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class DecodedFetch(NamedTuple):
    records: list[Record]
    # (first index, Message class) runs over `records`, in order; usually one run per fetch.
    kinds: list[tuple[int, type[Message]]]
    # The offset after the last whole batch (control and aborted batches included): the next fetch
    # offset, and the position once every message is consumed. `fetch_offset` when no batch was whole.
    next_offset: int
    # Bytes of whole batches; 0 with non-empty records means one batch is larger than the fetch size.
    size: int

    def messages(self) -> list[Message]:
        """All records as Messages (the consumer makes them one by one as the application takes them)."""
        out: list[Message] = []
        if not self.kinds:
            return out
        bounds = [start for start, _ in self.kinds[1:]] + [len(self.records)]
        for (start, cls), end in zip(self.kinds, bounds, strict=True):
            out += map(partial(_new_tuple, cls), self.records[start:end])
        return out


def decode_fetch(topic: str, partition: int, records: bytes | memoryview | None, fetch_offset: int, *,
                 read_committed: bool, aborted: Sequence[tuple[int, int]] | None = None,
                 check_crcs: bool = True) -> DecodedFetch:
    """Messages at offsets >= `fetch_offset` in the whole batches of `records`; a trailing partial batch is left.

    Raises CorruptRecords for the first batch at or after `fetch_offset` that fails its CRC or
    does not parse; messages of earlier batches are lost with it, and the next fetch from
    `fetch_offset` meets the same batch again, as the Java consumer does.
    """
    out: list[Record] = []
    kinds: list[tuple[int, type[Message]]] = []
    if not records:
        return DecodedFetch(out, kinds, fetch_offset, 0)
    view = memoryview(records)
    end = view.nbytes
    pos = 0
    next_offset = fetch_offset
    # (first offset, producer id) min-heap of aborted transactions not yet reached; pids in an aborted txn
    pending_aborts: list[tuple[int, int]] = []
    aborted_pids: set[int] = set()
    if read_committed and aborted:
        pending_aborts = [(first, pid) for pid, first in aborted]
        heapq.heapify(pending_aborts)
    while pos + LOG_OVERHEAD <= end:
        base_offset, length = read_prefix(view, pos)
        size = LOG_OVERHEAD + length
        if pos + HEADER_SIZE > end or pos + size > end:
            break  # a partial batch cut by the fetch size
        if view[pos + OFF_MAGIC] != MAGIC:
            raise CorruptRecords(f"{topic}-{partition}: batch at offset {base_offset} has magic "
                                 f"{view[pos + OFF_MAGIC]}; only magic 2 is supported", base_offset)
        if length < MIN_BATCH_LENGTH:
            raise CorruptRecords(f"{topic}-{partition}: batch at offset {base_offset} has an impossible "
                                 f"length {length}", base_offset)
        body = view[pos : pos + size]
        pos += size
        header = read_header(body)
        last_offset = base_offset + header.last_offset_delta
        if last_offset < fetch_offset:
            continue  # fetches may start inside the log before the requested offset
        if check_crcs and crc32c.crc32c(body[CRC_START:]) != header.crc:
            raise CorruptRecords(f"{topic}-{partition}: batch at offset {base_offset} fails its CRC check",
                                 base_offset)
        next_offset = last_offset + 1
        attributes = header.attributes
        if read_committed and header.producer_id >= 0:
            while pending_aborts and pending_aborts[0][0] <= last_offset:
                aborted_pids.add(heapq.heappop(pending_aborts)[1])
            if attributes & CONTROL_MASK:
                if header.producer_id in aborted_pids and _is_abort_marker(topic, partition, body, attributes, base_offset):
                    aborted_pids.discard(header.producer_id)
                continue
            if attributes & TRANSACTIONAL_MASK and header.producer_id in aborted_pids:
                continue
        if attributes & CONTROL_MASK:
            continue
        timestamp_type = TIMESTAMP_LOG_APPEND_TIME if attributes & TIMESTAMP_TYPE_MASK else TIMESTAMP_CREATE_TIME
        leader_epoch = header.leader_epoch if header.leader_epoch >= 0 else None
        batch_records, has_headers = _decode_batch(topic, partition, body, attributes, base_offset)
        if base_offset < fetch_offset:
            batch_records = [r for r in batch_records if r[0] >= fetch_offset]
        if not batch_records:
            continue
        cls = message_class(topic, partition, timestamp_type, leader_epoch, has_headers)
        if not kinds or kinds[-1][1] is not cls:
            kinds.append((len(out), cls))
        out += batch_records
    return DecodedFetch(out, kinds, next_offset, pos)


def _decode_batch(topic: str, partition: int, body: memoryview, attributes: int,
                  base_offset: int) -> tuple[list[Record], bool]:
    """The batch's records as tuples, and whether any has headers (then every tuple carries its list)."""
    try:
        if attributes & COMPRESSION_MASK:
            body = memoryview(inflate_batch(body))
        # Streamed (each parsed record freed at once), then narrowed when no record has headers: measured
        # cheaper than keeping the parsed records for a look at their headers first.
        records = list(map(_RECORD_WITH_HEADERS, DefaultRecordBatch(body)))
        if any(map(_HEADERS_OF_TUPLE, records)):
            return records, True
        return list(map(_WITHOUT_HEADERS, records)), False
    except CompressionError as exc:
        raise CorruptRecords(f"{topic}-{partition}: batch at offset {base_offset} cannot be decompressed: {exc}",
                             base_offset) from exc
    except (CorruptRecordException, ValueError, IndexError, OverflowError) as exc:
        raise CorruptRecords(f"{topic}-{partition}: batch at offset {base_offset} has malformed records: {exc}",
                             base_offset) from exc


def _is_abort_marker(topic: str, partition: int, body: memoryview, attributes: int, base_offset: int) -> bool:
    try:
        if attributes & COMPRESSION_MASK:  # Kafka never compresses markers, but the format allows it
            body = memoryview(inflate_batch(body))
        record = next(iter(DefaultRecordBatch(body)), None)
        return record is not None and parse_control_key(record.key) == ControlType.ABORT
    except (CompressionError, CorruptRecordException, ControlRecordError, ValueError, IndexError) as exc:
        raise CorruptRecords(f"{topic}-{partition}: control batch at offset {base_offset} is malformed: {exc}",
                             base_offset) from exc
