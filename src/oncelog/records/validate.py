"""Broker-side validation of one produced partition payload (KIP-467).

Checks run in Kafka's order (`ProduceRequest.validateRecords`, `UnifiedLog.analyzeAndValidateRecords`,
`LogValidator`). Batch-level problems stop at the first one and carry no record list; record-level
problems are all collected, each with its index in the batch, so a KIP-467 client can fail only the
culprits (DESIGN §3, §4).

This is the produce hot path. An uncompressed batch for a topic that is not compacted and has no
timestamp bound is validated by one header unpack, a few integer comparisons and one crc32c call:
no record is looked at. Records are walked (with aiokafka's Cython parser) only when the semantics
need them: a compacted topic (keys), a timestamp bound (CreateTime window), a LogAppendTime bit
set by the producer, or a compressed batch (its records must parse to exactly the declared count).

Decisions where Kafka's behaviour is an accident rather than a rule:
- A batch length that runs past the buffer is CORRUPT_MESSAGE (retriable: a torn request may be a
  transport fault). Kafka's iterator just sees no batch and answers INVALID_RECORD.
- Bytes after the batch are INVALID_RECORD (one batch per partition). Kafka silently trims a
  trailing partial batch; accepting bytes we never validate is how corruption gets stored.
- An unknown codec id (5-7) is UNSUPPORTED_COMPRESSION_TYPE. Kafka fails on it with an
  IllegalArgumentException that reaches the client as UNKNOWN_SERVER_ERROR; 76 says what is wrong
  and is not retriable. It is checked after the CRC, so a flipped attribute bit stays CORRUPT_MESSAGE.
- A compressed payload that does not decompress, records that do not parse, a record count that
  does not match the header and non-consecutive offset deltas are INVALID_RECORD (not retriable:
  the CRC matched, so the producer built it this way and a retry sends the same bytes).
- A producer-set LogAppendTime bit is INVALID_TIMESTAMP for every record, whatever the topic's
  timestamp type (Kafka lets it through on CreateTime topics when the timestamp is in range).
- A transactional batch without a producer id is INVALID_RECORD (Kafka stores it; no reader can
  resolve such a transaction).
- On the walked path only: a header key that is not UTF-8 fails the batch with INVALID_RECORD (Java
  would decode it with replacement characters); the fast path does not look at headers at all.
- On the fast path a record count that the record bytes cannot possibly hold (7 bytes per record
  at least) is INVALID_RECORD: a free check that stops absurd counts from reaching the log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import crc32c
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatch

from oncelog.config import LONG_MAX, TopicConfig
from oncelog.errors import ErrorCode
from oncelog.records.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_MASK,
    COMPRESSION_NAMES,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CONTROL_MASK,
    CRC_START,
    HEADER_SIZE,
    HEADER_SIZE_UP_TO_MAGIC,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    OFF_MAGIC,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    read_header,
)
from oncelog.records.compression import CompressionError, inflate_batch, library_level, recompress_batch

# Failure kinds: one broker metric each (Kafka's BrokerTopicStats names in comments).
KIND_NO_KEY_COMPACTED = "no_key_compacted"  # NoKeyCompactedTopicRecordsPerSec
KIND_INVALID_MAGIC = "invalid_magic"  # InvalidMagicNumberRecordsPerSec
KIND_INVALID_CRC = "invalid_crc"  # InvalidMessageCrcRecordsPerSec
KIND_INVALID_OFFSET_OR_SEQUENCE = "invalid_offset_or_sequence"  # InvalidOffsetOrSequenceRecordsPerSec
KIND_INVALID_TIMESTAMP = "invalid_timestamp"
KIND_MESSAGE_TOO_LARGE = "message_too_large"
KIND_CORRUPT_MESSAGE = "corrupt_message"  # truncated or impossible lengths
KIND_UNSUPPORTED_COMPRESSION = "unsupported_compression"
KIND_INVALID_RECORD = "invalid_record"  # everything else that is INVALID_RECORD
FAILURE_KINDS = (
    KIND_NO_KEY_COMPACTED, KIND_INVALID_MAGIC, KIND_INVALID_CRC, KIND_INVALID_OFFSET_OR_SEQUENCE,
    KIND_INVALID_TIMESTAMP, KIND_MESSAGE_TOO_LARGE, KIND_CORRUPT_MESSAGE, KIND_UNSUPPORTED_COMPRESSION,
    KIND_INVALID_RECORD,
)

SUMMARY_RECORD_ERRORS = 3  # how many record errors the batch's ErrorMessage spells out, as in Kafka
MIN_RECORD_SIZE = 7  # length, attributes, timestamp delta, offset delta, key len, value len, header count
# Upper bound on a produced batch's decompressed records: a guard against decompression bombs, far
# above anything a client batches (Kafka clients default to 16 KiB batches, 1 MiB requests).
MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024
_ZSTD_MIN_PRODUCE_VERSION = 7

# compression.type -> the codec batches are stored in; None: as the producer sent them.
TOPIC_CODECS: Mapping[str, int | None] = MappingProxyType({
    "producer": None, "uncompressed": COMPRESSION_NONE, "gzip": COMPRESSION_GZIP, "snappy": COMPRESSION_SNAPPY,
    "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD,
})
_LEVEL_KEYS = {COMPRESSION_GZIP: "compression.gzip.level", COMPRESSION_LZ4: "compression.lz4.level",
               COMPRESSION_ZSTD: "compression.zstd.level"}

_EMPTY_COUNTS: Mapping[str, int] = MappingProxyType({})
_NO_RECORD_ERRORS: Sequence[tuple[int, str]] = ()


@dataclass(slots=True)
class ValidationResult:
    ok: bool
    error: ErrorCode
    # (batch index, message) for each failing record; empty for batch-level failures.
    record_errors: Sequence[tuple[int, str]]
    # The partition response's ErrorMessage.
    message: str | None
    # The parsed header whenever the buffer held a readable one (also on most failures).
    header: BatchHeader | None
    # The metric the batch failure counts in; None when ok.
    failure_kind: str | None
    # How many failures of each kind to add to the metrics: {failure_kind: 1} for a batch-level
    # failure, per-record counts for record-level ones (Kafka counts each keyless record).
    kind_counts: Mapping[str, int]


def _fail(error: ErrorCode, kind: str, message: str, header: BatchHeader | None = None) -> ValidationResult:
    return ValidationResult(False, error, _NO_RECORD_ERRORS, message, header, kind, {kind: 1})


def validate_produce(
    records: bytes | bytearray | memoryview | None,
    topic: TopicConfig,
    now_ms: int,
    *,
    partition: str = "",
    api_version: int | None = None,
    walk_records: bool = False,
) -> ValidationResult:
    """Validate one partition's Records from a Produce request.

    `partition` names the topic-partition in messages ("orders-3"). `api_version` is the Produce
    version, needed for zstd (v7+). `walk_records=True` parses every record even where the
    semantics do not need it (a paranoid mode, and what tests use to check record structure).
    """
    where = f"topic partition {partition}" if partition else "this partition"
    if records is None:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_RECORD,
                     f"The produce request carries no record batch for {where}")
    if type(records) is not memoryview:
        records = memoryview(records)  # slicing below must not copy
    n = records.nbytes
    if n < HEADER_SIZE:
        return _short(records, n, where)
    header = read_header(records)
    if header.magic != MAGIC:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_MAGIC,
                     f"Produce requests may only carry record batches with magic 2; got magic {header.magic} "
                     f"for {where}")
    length = header.length
    if length < MIN_BATCH_LENGTH:
        return _fail(ErrorCode.CORRUPT_MESSAGE, KIND_CORRUPT_MESSAGE,
                     f"Record batch length {length} is below the minimum of {MIN_BATCH_LENGTH} for {where}")
    size = LOG_OVERHEAD + length
    if size > n:
        return _fail(ErrorCode.CORRUPT_MESSAGE, KIND_CORRUPT_MESSAGE,
                     f"Record batch for {where} declares {size} bytes but only {n} were sent")
    if size < n:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_RECORD,
                     f"Produce requests must carry exactly one record batch per partition; {n - size} bytes "
                     f"follow the first batch for {where}", header)
    if header.base_offset != 0:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_OFFSET_OR_SEQUENCE,
                     f"The base offset of a produced record batch must be 0, not {header.base_offset}, for {where}",
                     header)
    values = topic.values
    max_bytes = values["max.message.bytes"]
    if size > max_bytes:
        return _fail(ErrorCode.MESSAGE_TOO_LARGE, KIND_MESSAGE_TOO_LARGE,
                     f"The record batch of {size} bytes for {where} exceeds max.message.bytes ({max_bytes})",
                     header)
    if crc32c.crc32c(records[CRC_START:]) != header.crc:
        return _fail(ErrorCode.CORRUPT_MESSAGE, KIND_INVALID_CRC,
                     f"Record batch for {where} fails its CRC32C check (stored {header.crc:#010x})", header)
    attributes = header.attributes
    codec = attributes & COMPRESSION_MASK
    if codec > COMPRESSION_ZSTD:
        return _fail(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, KIND_UNSUPPORTED_COMPRESSION,
                     f"Unknown compression codec id {codec} in the record batch for {where}", header)
    if codec == COMPRESSION_ZSTD and api_version is not None and api_version < _ZSTD_MIN_PRODUCE_VERSION:
        return _fail(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, KIND_UNSUPPORTED_COMPRESSION,
                     f"zstd compression needs Produce version 7 or later, got version {api_version}", header)
    count = header.record_count
    if count <= 0:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_OFFSET_OR_SEQUENCE,
                     f"Record batch for {where} declares {count} records; it needs at least one", header)
    if header.last_offset_delta != count - 1:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_OFFSET_OR_SEQUENCE,
                     f"Record batch for {where} has last offset delta {header.last_offset_delta} "
                     f"but {count} records", header)
    if attributes & CONTROL_MASK:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_RECORD,
                     f"Clients may not write control batches (to {where})", header)
    if header.producer_id >= 0 and header.base_sequence < 0:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_OFFSET_OR_SEQUENCE,
                     f"Invalid base sequence {header.base_sequence} in a batch from producer id "
                     f"{header.producer_id} for {where}", header)
    if attributes & TRANSACTIONAL_MASK and header.producer_id < 0:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_RECORD,
                     f"A transactional record batch needs a producer id (for {where})", header)

    compacted = "compact" in values["cleanup.policy"]
    before = values["message.timestamp.before.max.ms"]
    after = values["message.timestamp.after.max.ms"]
    bounded = (before < LONG_MAX or after < LONG_MAX) and values["message.timestamp.type"] == "CreateTime"
    producer_log_append_time = attributes & TIMESTAMP_TYPE_MASK
    target = TOPIC_CODECS[values["compression.type"]]
    # A batch the broker recompresses is walked as Kafka's compressed path walks it: its records must parse to
    # exactly the declared count before they are stored under a codec the producer did not choose.
    if codec or compacted or bounded or producer_log_append_time or walk_records or (
            target is not None and target != codec):
        return _walk(records, header, codec, compacted, bounded, now_ms - before, now_ms + after,
                     bool(producer_log_append_time), where)
    if count * MIN_RECORD_SIZE > length - MIN_BATCH_LENGTH:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_OFFSET_OR_SEQUENCE,
                     f"Record batch for {where} declares {count} records, more than its "
                     f"{length - MIN_BATCH_LENGTH} record bytes can hold", header)
    return ValidationResult(True, ErrorCode.NONE, _NO_RECORD_ERRORS, None, header, None, _EMPTY_COUNTS)


def stored_codec(topic: TopicConfig, source: int) -> int | None:
    """The codec a batch sent with `source` must be stored in, or None when it is stored as sent.

    Kafka keeps a batch whose codec is the topic's compression.type (or any batch under 'producer') and
    rebuilds every other one with the topic's codec; 'uncompressed' decompresses.
    """
    target = TOPIC_CODECS[topic.values["compression.type"]]
    return None if target is None or target == source else target


def convert_codec(records: bytes | bytearray | memoryview, header: BatchHeader, topic: TopicConfig, target: int,
                  *, partition: str = "") -> ValidationResult | bytearray:
    """The validated batch rebuilt in codec `target` at the topic's level for it, or why it cannot be stored.

    A rebuilt batch is checked against max.message.bytes again (Kafka does: decompressing can grow a
    batch past it), and answers MESSAGE_TOO_LARGE when it grew too big.
    """
    where = f"topic partition {partition}" if partition else "this partition"
    name = COMPRESSION_NAMES[target] if target else "uncompressed"
    level_key = _LEVEL_KEYS.get(target)
    level = library_level(target, topic.values[level_key]) if level_key else None
    try:
        rebuilt = recompress_batch(records, target, level, MAX_DECOMPRESSED_BYTES)
    except CompressionError as exc:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_RECORD,
                     f"The record batch for {where} cannot be stored as {name}: {exc}", header)
    max_bytes = topic.values["max.message.bytes"]
    if len(rebuilt) > max_bytes:
        return _fail(ErrorCode.MESSAGE_TOO_LARGE, KIND_MESSAGE_TOO_LARGE,
                     f"The record batch for {where} is {len(rebuilt)} bytes once stored as "
                     f"{name} (compression.type), above max.message.bytes ({max_bytes})", header)
    return rebuilt


def _short(records: memoryview, n: int, where: str) -> ValidationResult:
    """Buffers shorter than a batch header: nothing to validate beyond saying why."""
    if n == 0:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_RECORD,
                     f"The produce request carries no record batch for {where}")
    if n >= HEADER_SIZE_UP_TO_MAGIC and records[OFF_MAGIC] != MAGIC:
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_MAGIC,
                     f"Produce requests may only carry record batches with magic 2; got magic "
                     f"{records[OFF_MAGIC]} for {where}")
    return _fail(ErrorCode.CORRUPT_MESSAGE, KIND_CORRUPT_MESSAGE,
                 f"Truncated record batch for {where}: {n} bytes, less than a batch header")


def _walk(records: bytes | bytearray | memoryview, header: BatchHeader, codec: int, compacted: bool,
          bounded: bool, lowest: int, highest: int, log_append_time: bool, where: str) -> ValidationResult:
    """Parse every record; collect per-record errors, stop at the first structural one."""
    if codec:
        try:
            records = inflate_batch(records, MAX_DECOMPRESSED_BYTES)
        except CompressionError as exc:
            return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_RECORD,
                         f"The {COMPRESSION_NAMES[codec]} records of the batch for {where} cannot be "
                         f"decompressed: {exc}", header)
    errors: list[tuple[int, str]] = []
    timestamp_errors = 0
    key_errors = 0
    index = 0
    try:
        for record in DefaultRecordBatch(records):
            if record.offset != index:
                return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_OFFSET_OR_SEQUENCE,
                             f"Record {index} of the batch for {where} has offset delta {record.offset}; "
                             f"offset deltas must run 0, 1, 2, ...", header)
            if compacted and record.key is None:
                errors.append((index, f"A compacted topic needs a key on every record; {where} got a "
                                      f"record without one"))
                key_errors += 1
            elif log_append_time:
                errors.append((index, "Producers must not set the LogAppendTime timestamp type; "
                                      "the broker assigns log append times"))
                timestamp_errors += 1
            elif bounded:
                timestamp = record.timestamp
                if (timestamp < lowest or timestamp > highest) and timestamp != -1:
                    errors.append((index, f"Timestamp {timestamp} is outside the range {where} accepts, "
                                          f"[{lowest}, {highest}]"))
                    timestamp_errors += 1
            index += 1
    except (CorruptRecordException, ValueError, IndexError, OverflowError) as exc:  # incl. UnicodeDecodeError
        if index >= header.record_count:
            detail = f"bytes are left after the {header.record_count} records the header declares ({exc})"
        else:
            detail = f"record {index} of {header.record_count} is malformed ({exc})"
        return _fail(ErrorCode.INVALID_RECORD, KIND_INVALID_RECORD,
                     f"Record batch for {where} is malformed: {detail}", header)
    if not errors:
        return ValidationResult(True, ErrorCode.NONE, _NO_RECORD_ERRORS, None, header, None, _EMPTY_COUNTS)
    counts: dict[str, int] = {}
    if key_errors:
        counts[KIND_NO_KEY_COMPACTED] = key_errors
    if timestamp_errors:
        counts[KIND_INVALID_TIMESTAMP] = timestamp_errors
        error, kind, what = ErrorCode.INVALID_TIMESTAMP, KIND_INVALID_TIMESTAMP, "invalid timestamps"
    else:
        error, kind, what = ErrorCode.INVALID_RECORD, KIND_NO_KEY_COMPACTED, "invalid records"
    shown = "; ".join(f"record {i}: {message}" for i, message in errors[:SUMMARY_RECORD_ERRORS])
    more = f" (and {len(errors) - SUMMARY_RECORD_ERRORS} more)" if len(errors) > SUMMARY_RECORD_ERRORS else ""
    summary = f"{len(errors)} of {header.record_count} records rejected for {what}: {shown}{more}"
    return ValidationResult(False, error, errors, summary, header, kind, counts)
