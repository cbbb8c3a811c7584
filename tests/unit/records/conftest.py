"""Fixtures for the records tests, including raw batches our builder would refuse to produce."""

from __future__ import annotations

import pytest

from oncelog.config import load_broker_config
from oncelog.records.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    pack_header,
    read_header,
    rewrite_crc,
)
from oncelog.records.compression import compress


def _raw_batch(record_bytes: bytes, count: int, *, codec: int = 0, last_offset_delta: int | None = None,
              attributes: int = 0, base_offset: int = 0, producer_id: int = -1, producer_epoch: int = -1,
              base_sequence: int = -1, base_timestamp: int = 1000, max_timestamp: int = 1000) -> bytearray:
    """A batch around already-encoded records, with whatever header fields the test wants, valid CRC."""
    payload = compress(codec, record_bytes) if codec else record_bytes
    size = HEADER_SIZE + len(payload)
    header = BatchHeader(base_offset, size - LOG_OVERHEAD, -1, MAGIC, 0, attributes | codec,
                         count - 1 if last_offset_delta is None else last_offset_delta, base_timestamp,
                         max_timestamp, producer_id, producer_epoch, base_sequence, count)
    out = bytearray(size)
    pack_header(out, 0, header)
    out[HEADER_SIZE:] = payload
    rewrite_crc(out, 0, size)
    return out


def _patch_header(batch: bytearray, **fields: int) -> bytearray:
    """Rewrite header fields and re-CRC, so only the field under test is wrong."""
    header = read_header(batch)._replace(**fields)
    pack_header(batch, 0, header)
    rewrite_crc(batch, 0, len(batch))
    return batch


@pytest.fixture
def raw_batch():
    return _raw_batch


@pytest.fixture
def patch_header():
    return _patch_header


@pytest.fixture
def broker_config():
    return load_broker_config()


@pytest.fixture
def topic(broker_config):
    return broker_config.topic_config()
