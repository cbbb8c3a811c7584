from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatch as AioBatch
from kafka.record.default_records import DefaultRecordBatch as KpBatch

from oncelog.records.batch import CONTROL_MASK, TRANSACTIONAL_MASK, read_header
from oncelog.records.builder import build_batch
from oncelog.records.control import (
    ControlRecordError,
    ControlType,
    EndTxnMarker,
    build_marker,
    control_key,
    end_txn_marker_value,
    parse_control_key,
    parse_marker,
)
from oncelog.records.reader import read_batches


@pytest.mark.parametrize("commit", [True, False])
def test_marker_round_trip(commit):
    batch = build_marker(1234, 7, commit, 42, 1_700_000_000_000, base_offset=99, partition_leader_epoch=3)
    header = read_header(batch)
    assert header.attributes & CONTROL_MASK and header.attributes & TRANSACTIONAL_MASK
    assert header.compression == 0
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (1234, 7, -1)
    assert (header.base_offset, header.leader_epoch, header.record_count) == (99, 3, 1)
    assert parse_marker(batch) == EndTxnMarker(1234, 7, commit, 42, 1_700_000_000_000)
    assert parse_marker(batch).control_type == (ControlType.COMMIT if commit else ControlType.ABORT)


@pytest.mark.parametrize("commit", [True, False])
def test_marker_wire_layout_read_by_kafka_python_and_aiokafka(commit):
    batch = bytes(build_marker(5, 1, commit, 9, 1000))
    kp = KpBatch(batch)
    assert kp.validate_crc() and kp.is_control_batch and kp.is_transactional
    (record,) = list(kp)
    assert record.commit is commit and record.abort is not commit and record.version == 0
    assert record.key == b"\x00\x00\x00" + (b"\x01" if commit else b"\x00")
    assert record.value == b"\x00\x00\x00\x00\x00\x09"
    aio = AioBatch(batch)
    assert aio.validate_crc() and aio.is_control_batch
    assert [r.key for r in aio] == [record.key]


def test_marker_in_a_fetch_is_flagged():
    data = bytes(build_batch([(b"k", b"v", [], 1)], base_offset=0, producer_id=5, producer_epoch=1,
                             base_sequence=0, transactional=True)
                 + build_marker(5, 1, False, 3, 2, base_offset=1))
    data_batch, marker_batch = read_batches(data)
    assert not data_batch.is_control and data_batch.marker is None
    assert marker_batch.is_control
    assert marker_batch.marker == EndTxnMarker(5, 1, False, 3, 2)


def test_newer_versions_parse_by_their_version_0_fields():
    assert parse_control_key(b"\x00\x01\x00\x01extra") == ControlType.COMMIT
    assert parse_control_key(control_key(ControlType.LEADER_CHANGE)) == 2
    assert end_txn_marker_value(-1) == b"\x00\x00\xff\xff\xff\xff"


def test_bad_control_records():
    with pytest.raises(ControlRecordError):
        parse_control_key(b"\x00")
    with pytest.raises(ControlRecordError):
        parse_control_key(b"\xff\xff\x00\x00")
    with pytest.raises(ControlRecordError, match="not a control batch"):
        parse_marker(build_batch([(b"k", b"v", [], 1)]))
    leader_change = build_batch([(control_key(ControlType.LEADER_CHANGE), b"\x00\x00", [], 1)], control=True,
                                transactional=True, producer_id=1, producer_epoch=0)
    with pytest.raises(ControlRecordError, match="not a transaction marker"):
        parse_marker(leader_change)
    short_value = build_batch([(control_key(ControlType.COMMIT), b"\x00\x00", [], 1)], control=True,
                              transactional=True, producer_id=1, producer_epoch=0)
    with pytest.raises(ControlRecordError, match="value"):
        parse_marker(short_value)
    with pytest.raises(ValueError):
        build_marker(-1, 0, True, 0, 0)
