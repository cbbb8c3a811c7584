"""Interop: our builder read by kafka-python and aiokafka; their builders read by our reader."""

from __future__ import annotations

import random

import pytest
from aiokafka.record.default_records import DefaultRecordBatch as AioBatch
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioBuilder
from aiokafka.record.default_records import _DefaultRecordBatchPy as AioPyBatch
from kafka.record.default_records import DefaultRecordBatch as KpBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KpBuilder
from kafka.record.util import encode_varint as kp_encode_varint

from oncelog.records.batch import HEADER_SIZE, TIMESTAMP_TYPE_MASK, read_header
from oncelog.records.builder import BatchBuilder, NewRecord, build_batch, zigzag_varint
from oncelog.records.compression import XERIAL_MAGIC
from oncelog.records.reader import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    CorruptRecordsError,
    complete_size,
    read_batches,
)

RECORDS = [
    NewRecord(b"key-0", b"value-0", [("h1", b"a"), ("h2", None)], 1_700_000_000_000),
    NewRecord(None, b"no key", [], 1_700_000_000_005),
    NewRecord(b"no value", None, [("", b"")], 1_699_999_999_990),  # earlier than the first: negative delta
    NewRecord(b"", b"", [("ключ", b"\x00\xff")], 1_700_000_000_001),
    NewRecord(b"k" * 300, b"v" * 70_000, [], 1_700_000_000_002),  # multi-byte varint lengths
]
EXPECTED_MAX_TS = 1_700_000_000_005


def _check_records(decoded, base_offset=0, log_append_time=None):
    assert len(decoded) == len(RECORDS)
    for i, (rec, want) in enumerate(zip(decoded, RECORDS, strict=True)):
        assert rec.offset == base_offset + i
        assert rec.key == want.key
        assert rec.value == want.value
        assert [(k, v) for k, v in rec.headers] == [(k, v) for k, v in want.headers]
        assert rec.timestamp == (want.timestamp_ms if log_append_time is None else log_append_time)


# --- varints ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, encoded", [
    (0, b"\x00"), (-1, b"\x01"), (1, b"\x02"), (63, b"\x7e"), (-64, b"\x7f"), (64, b"\x80\x01"),
    (-65, b"\x81\x01"), (300, b"\xd8\x04"), ((1 << 63) - 1, b"\xfe" + b"\xff" * 8 + b"\x01"),
    (-(1 << 63), b"\xff" * 9 + b"\x01"),
])
def test_zigzag_varint_known_values(value, encoded):
    assert zigzag_varint(value) == encoded


def test_zigzag_varint_matches_kafka_python():
    rng = random.Random(7)
    values = [rng.randint(-(1 << 31), (1 << 31) - 1) for _ in range(2000)]
    values += [rng.randint(-(1 << 63), (1 << 63) - 1) for _ in range(2000)]
    for v in values:
        out = bytearray()
        kp_encode_varint(v, out.append)
        assert zigzag_varint(v) == bytes(out), v


def test_zigzag_varint_out_of_range():
    with pytest.raises(ValueError):
        zigzag_varint(1 << 63)


# --- our builder, their readers ---------------------------------------------------------------------

@pytest.mark.parametrize("codec", [0, 1])
def test_our_batches_read_by_kafka_python(codec):
    batch = build_batch(RECORDS, compression=codec, base_offset=42, producer_id=9, producer_epoch=3,
                        base_sequence=17, partition_leader_epoch=5)
    theirs = KpBatch(bytes(batch))
    assert theirs.validate_crc()
    assert theirs.base_offset == 42
    assert theirs.leader_epoch == 5
    assert theirs.compression_type == codec
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (9, 3, 17)
    assert theirs.last_offset_delta == len(RECORDS) - 1
    assert theirs.records_count == len(RECORDS)
    assert theirs.first_timestamp == RECORDS[0].timestamp_ms
    assert theirs.max_timestamp == EXPECTED_MAX_TS
    assert not theirs.is_transactional and not theirs.is_control_batch
    assert theirs.size_in_bytes == len(batch)
    _check_records(list(theirs), base_offset=42)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("impl", [AioBatch, AioPyBatch], ids=["cython", "python"])
def test_our_batches_read_by_aiokafka(codec, impl):
    batch = build_batch(RECORDS, compression=codec, base_offset=7, producer_id=1, producer_epoch=0,
                        base_sequence=0, transactional=True)
    theirs = impl(bytes(batch))
    assert theirs.validate_crc()
    assert theirs.compression_type == codec
    assert theirs.is_transactional
    assert theirs.next_offset == 7 + len(RECORDS)
    _check_records(list(theirs), base_offset=7)


def test_log_append_time_batch_read_by_kafka_python():
    batch = build_batch(RECORDS, log_append_time=True, max_timestamp=1_800_000_000_000)
    theirs = KpBatch(bytes(batch))
    assert theirs.timestamp_type == 1
    _check_records(list(theirs), log_append_time=1_800_000_000_000)
    ours = read_batches(batch)[0]
    assert ours.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    _check_records(ours.records, log_append_time=1_800_000_000_000)


def test_incremental_builder_matches_one_shot_and_tracks_size():
    builder = BatchBuilder()
    for i, rec in enumerate(RECORDS):
        assert builder.append(*rec) == i
    assert builder.record_count == len(RECORDS)
    built = builder.build(producer_id=4, producer_epoch=1, base_sequence=100)
    assert builder.size_in_bytes() == len(built)
    assert built == build_batch(RECORDS, producer_id=4, producer_epoch=1, base_sequence=100)


def test_builder_defaults_timestamp_to_now():
    batch = build_batch([(b"k", b"v")])
    header = read_header(batch)
    import time

    assert abs(header.base_timestamp - time.time() * 1000) < 60_000


def test_builder_refuses_inconsistent_producer_fields():
    with pytest.raises(ValueError):
        build_batch([])
    with pytest.raises(ValueError):
        build_batch([(b"k", b"v", [], 1)], transactional=True)
    with pytest.raises(ValueError):
        build_batch([(b"k", b"v", [], 1)], producer_id=3, producer_epoch=0)


# --- their builders, our reader ---------------------------------------------------------------------

def _fill(builder, base_offset=0):
    for i, rec in enumerate(RECORDS):
        builder.append(i, rec.timestamp_ms, rec.key, rec.value, list(rec.headers))
    return builder


@pytest.mark.parametrize("codec", [0, 1])
def test_kafka_python_batches_read_by_us(codec):
    builder = _fill(KpBuilder(magic=2, compression_type=codec, is_transactional=0, producer_id=11,
                              producer_epoch=2, base_sequence=5, batch_size=10**7))
    data = bytes(builder.build())
    (batch,) = read_batches(data)
    assert batch.compression == codec
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (11, 2, 5)
    assert batch.timestamp_type == TIMESTAMP_CREATE_TIME
    _check_records(batch.records)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_aiokafka_batches_read_by_us(codec):
    builder = _fill(AioBuilder(magic=2, compression_type=codec, is_transactional=1, producer_id=11,
                               producer_epoch=2, base_sequence=5, batch_size=10**7))
    data = bytes(builder.build())
    if codec == 2:
        assert data[HEADER_SIZE : HEADER_SIZE + 8] == XERIAL_MAGIC  # the Java-style framing
    (batch,) = read_batches(data)
    assert batch.compression == codec
    assert batch.is_transactional and not batch.is_control
    _check_records(batch.records)


# --- reader behaviour -------------------------------------------------------------------------------

def test_several_batches_and_a_partial_tail():
    first = build_batch(RECORDS[:2], base_offset=100)
    second = build_batch(RECORDS[2:], base_offset=102, compression=4)
    third = build_batch(RECORDS[:1], base_offset=105)
    buf = bytes(first + second + third)
    for cut in (len(third) - 1, len(third) - 20, len(third) - 50, len(third) - 60):
        data = buf[: len(buf) - cut]
        batches = read_batches(data)
        assert [b.base_offset for b in batches] == [100, 102]
        assert complete_size(data) == len(first) + len(second)
    batches = read_batches(buf)
    assert [b.next_offset for b in batches] == [102, 105, 106]
    assert [r.offset for b in batches for r in b.records] == list(range(100, 106))
    assert read_batches(b"") == []


def test_headers_only_mode():
    buf = bytes(build_batch(RECORDS, base_offset=3) + build_batch(RECORDS, base_offset=8, compression=1))
    batches = read_batches(buf, decode=False)
    assert [(b.base_offset, b.last_offset, b.records) for b in batches] == [(3, 7, []), (8, 12, [])]


def test_crc_mismatch_raises_unless_disabled():
    batch = build_batch(RECORDS, base_offset=3)
    batch[len(batch) // 2] ^= 0x01  # inside the 70 KB value: records still parse
    with pytest.raises(CorruptRecordsError, match="CRC") as info:
        read_batches(batch)
    assert info.value.base_offset == 3
    assert len(read_batches(batch, check_crc=False)) == 1


def test_legacy_magic_and_broken_records_raise(patch_header):
    batch = build_batch(RECORDS)
    legacy = bytearray(batch)
    legacy[16] = 1
    with pytest.raises(CorruptRecordsError, match="magic"):
        read_batches(legacy)
    too_many = patch_header(bytearray(batch), record_count=len(RECORDS) + 1, last_offset_delta=len(RECORDS))
    with pytest.raises(CorruptRecordsError, match="malformed"):
        read_batches(too_many)


def test_log_append_time_attribute_constant():
    assert TIMESTAMP_TYPE_MASK == 0x08
