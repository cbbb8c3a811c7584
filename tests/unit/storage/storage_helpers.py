"""Helpers for the storage tests (a plain module, so test files can import it)."""

from __future__ import annotations

import os

from kafka.record.default_records import DefaultRecordBatchBuilder

from oncelog.storage.partition_log import PartitionLog


def build_batch(count: int = 1, timestamp: int = 1000, value_size: int = 10) -> bytearray:
    """A valid uncompressed v2 batch (varint records, CRC32C) of `count` records, base offset 0."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1, base_sequence=-1,
        batch_size=1 << 30,
    )
    for i in range(count):
        builder.append(i, timestamp=timestamp + i, key=None, value=b"v" * value_size, headers=[])
    return builder.build()


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now




def abandon(plog: PartitionLog) -> None:
    """Simulate a crash: drop every fd without writing anything (no final index entries, no fsync)."""
    for segment in plog.segments:
        for index in (segment.offset_index, segment.time_index):
            if index._fd is not None:
                os.close(index._fd)
                index._fd = None
        os.close(segment.fd)
        segment._closed = True
    for fd in plog._pending_fds:
        os.close(fd)
    plog._pending_fds = []
    if plog._dir_fd is not None:
        os.close(plog._dir_fd)
        plog._dir_fd = None
    plog._segments = []
    plog._closed = True
