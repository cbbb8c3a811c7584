"""Start the writeback of several files at once, before their fdatasyncs (Linux `sync_file_range`).

A flush round fdatasyncs each log it covers, one after the other. Each fdatasync alone writes its file's pages,
allocates their blocks and commits the filesystem's journal: N logs pay N journal commits and N device cache
flushes. Handing every file's dirty pages to the disk first (SYNC_FILE_RANGE_WRITE, which only starts the I/O)
puts all of the round's block allocations into one journal transaction and its writes into one queue: the first
fdatasync then commits for all, and the others find their data written. Measured on this machine's ext4
(docs/latency.md): 4 files' fdatasyncs 0.63 ms one after the other, 0.45 ms after starting their writeback.

Durability never rests on it: every file is still fdatasynced, and an I/O error is still reported by that
fdatasync (SYNC_FILE_RANGE_WRITE alone does not wait, so it does not consume the file's error state, as
SYNC_FILE_RANGE_WAIT_AFTER would). Where the call does not exist (not Linux), nothing is done.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable

from .libc import libc_function

SYNC_FILE_RANGE_WRITE = 2

_sync_file_range = libc_function("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint])
AVAILABLE = _sync_file_range is not None


def start_writeback(fds: Iterable[int]) -> None:
    """Ask the kernel to start writing every dirty page of each fd (whole file), without waiting. Errors are
    left to the fdatasync that follows."""
    if _sync_file_range is None:
        return
    for fd in fds:
        _sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)
