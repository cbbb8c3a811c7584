"""Transaction markers: the control batches that end a transaction in a partition's log.

A marker is a batch with the control and transactional bits, base sequence -1 and exactly one
record whose key is {int16 version, int16 type} and whose value, for COMMIT and ABORT, is
{int16 version, int32 coordinator epoch}. Consumers under read_committed use ABORT markers to
drop the aborted records; every consumer skips control batches when handing out records.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatch

from oncelog.records.batch import (
    CONTROL_MASK,
    HEADER_SIZE,
    MIN_BATCH_LENGTH,
    NO_SEQUENCE,
    TRANSACTIONAL_MASK,
    read_header,
)
from oncelog.records.builder import BatchBuilder
from oncelog.records.compression import Buffer, CompressionError, inflate_batch

CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0

_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


class ControlType(IntEnum):
    ABORT = 0
    COMMIT = 1
    # Types Kafka uses in KRaft's metadata log; recognised so they parse instead of failing.
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


class ControlRecordError(ValueError):
    """A control record or marker batch that does not have the shape Kafka defines."""


class EndTxnMarker(NamedTuple):
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    timestamp: int

    @property
    def control_type(self) -> ControlType:
        return ControlType.COMMIT if self.commit else ControlType.ABORT


def control_key(control_type: int) -> bytes:
    return _KEY.pack(CONTROL_KEY_VERSION, control_type)


def end_txn_marker_value(coordinator_epoch: int) -> bytes:
    return _VALUE.pack(END_TXN_MARKER_VERSION, coordinator_epoch)


def parse_control_key(key: Buffer | None) -> int:
    """The control type of a control record's key (an int, so unknown future types still parse).

    Like Kafka, a newer key version is read by its version-0 fields rather than refused.
    """
    if key is None or len(key) < _KEY.size:
        raise ControlRecordError(f"control record key must be at least {_KEY.size} bytes")
    version, control_type = _KEY.unpack_from(key, 0)
    if version < 0:
        raise ControlRecordError(f"control record key has a negative version {version}")
    return control_type


def parse_end_txn_value(value: Buffer | None) -> int:
    """The coordinator epoch of a COMMIT/ABORT record's value."""
    if value is None or len(value) < _VALUE.size:
        raise ControlRecordError(f"transaction marker value must be at least {_VALUE.size} bytes")
    version, coordinator_epoch = _VALUE.unpack_from(value, 0)
    if version < 0:
        raise ControlRecordError(f"transaction marker value has a negative version {version}")
    return coordinator_epoch


def build_marker(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                 timestamp_ms: int, *, base_offset: int = 0, partition_leader_epoch: int = -1) -> bytearray:
    """A COMMIT or ABORT marker batch, ready for the partition's append (base offset patched there)."""
    if producer_id < 0:
        raise ValueError("a transaction marker needs a producer id")
    builder = BatchBuilder(transactional=True, control=True)
    control_type = ControlType.COMMIT if commit else ControlType.ABORT
    builder.append(control_key(control_type), end_txn_marker_value(coordinator_epoch), (), timestamp_ms)
    return builder.build(base_offset=base_offset, producer_id=producer_id, producer_epoch=producer_epoch,
                         base_sequence=NO_SEQUENCE, partition_leader_epoch=partition_leader_epoch)


def parse_marker(batch: Buffer) -> EndTxnMarker:
    """Read a marker batch back (one whole batch, as `build_marker` or the log returns it)."""
    view = memoryview(batch)
    if view.nbytes < HEADER_SIZE:
        raise ControlRecordError("buffer is shorter than a batch header")
    header = read_header(view)
    if header.length < MIN_BATCH_LENGTH or header.size > view.nbytes:
        raise ControlRecordError("batch length does not match the buffer")
    if not header.attributes & CONTROL_MASK:
        raise ControlRecordError("not a control batch")
    if not header.attributes & TRANSACTIONAL_MASK:
        raise ControlRecordError("a transaction marker must be in a transactional batch")
    body = view[: header.size]
    if header.compression:
        try:
            body = memoryview(inflate_batch(body))
        except CompressionError as exc:  # an unknown codec id or corrupt data: not a marker either way
            raise ControlRecordError(f"marker batch does not decompress: {exc}") from exc
    try:
        records = list(DefaultRecordBatch(body))
    except (CorruptRecordException, ValueError, IndexError) as exc:
        raise ControlRecordError(f"marker batch records are malformed: {exc}") from exc
    if len(records) != 1:
        raise ControlRecordError(f"a transaction marker batch holds one record, not {len(records)}")
    record = records[0]
    control_type = parse_control_key(record.key)
    if control_type not in (ControlType.ABORT, ControlType.COMMIT):
        raise ControlRecordError(f"control type {control_type} is not a transaction marker")
    return EndTxnMarker(
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        commit=control_type == ControlType.COMMIT,
        coordinator_epoch=parse_end_txn_value(record.value),
        timestamp=record.timestamp,
    )
