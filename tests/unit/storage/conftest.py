"""Fixtures for the storage tests: real v2 batches (kafka-python's builder) and logs in tmp_path."""

from __future__ import annotations

import pytest
from tests.unit.storage.storage_helpers import Clock, abandon, build_batch

from oncelog.config import load_broker_config
from oncelog.records.batch import read_header
from oncelog.storage.partition_log import PartitionLog


@pytest.fixture
def make_batch():
    return build_batch


@pytest.fixture
def append():
    """append(plog, count=1, timestamp=1000, value_size=10) -> (base offset, batch bytes as written)."""

    def do(plog: PartitionLog, count: int = 1, timestamp: int = 1000, value_size: int = 10):
        buf = build_batch(count, timestamp, value_size)
        base = plog.append(buf, read_header(buf))
        return base, bytes(buf)

    return do


@pytest.fixture
def topic_config():
    def make(**overrides):
        return load_broker_config().topic_config({k.replace("_", "."): v for k, v in overrides.items()})

    return make


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def open_log(tmp_path, topic_config, clock):
    """open_log(clean=True, fsync=True, recovery_point=0, log_start_offset=0, **topic overrides)."""
    opened: list[PartitionLog] = []

    def do(clean: bool = True, fsync: bool = True, recovery_point: int = 0, log_start_offset: int = 0,
           directory=None, **overrides) -> PartitionLog:
        plog = PartitionLog.open(
            directory or tmp_path / "t-0", "t", 0, topic_config(**overrides), recovery_point=recovery_point,
            log_start_offset=log_start_offset, clean=clean, now_ms=clock, fsync=fsync,
        )
        opened.append(plog)
        return plog

    yield do
    for plog in opened:
        plog.close()


@pytest.fixture
def crash():
    return abandon
