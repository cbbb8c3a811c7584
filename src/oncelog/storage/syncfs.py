"""One `syncfs` per filesystem for a whole flush round (`oncelog.fsync.method=syncfs`).

A round fdatasyncs every log it covers, and on ext4 each fdatasync pays a device cache flush of its own even
when the journal commit before it already carried the file: the round's cost grows with the partitions it
covers. `syncfs` writes and commits everything dirty on the filesystem with one journal commit and one cache
flush. Measured on this machine's ext4 (docs/latency.md §6): 2 files 0.40 ms against 0.25 ms, 16 files 2.2 ms
against 0.41 ms, 64 files 9.4 ms against 0.87 ms.

The price is that it also writes what other programs left dirty on that filesystem, so it is for a data
directory on a filesystem of its own; that is why it is not the default.

It is as durable as a fdatasync of each file: syncfs returns only once every dirty page and the metadata of the
filesystem are on disk. Errors: since Linux 5.8 syncfs reports a writeback error of any file of the filesystem
that happened since the file description it is called through was opened (the superblock's error sequence), so
an I/O error of a log's file is never lost. It cannot say whose error it was, so on an error the round falls back
to fdatasyncing each file (storage/flusher.py), which reports each file's own error to its own log. Before 5.8
syncfs did not report writeback errors at all: the method is refused there (`supported`).
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Iterable

from .libc import libc_function

MIN_KERNEL = (5, 8)  # syncfs reports writeback errors from here on (errseq on the superblock)

_syncfs = libc_function("syncfs", [ctypes.c_int])


def kernel_version(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of a Linux release string such as '6.1.0-18-amd64'; (0, 0) if it cannot be read."""
    parts = (release if release is not None else platform.release()).split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return 0, 0


def supported() -> str | None:
    """None when `oncelog.fsync.method=syncfs` can be used here, else why not."""
    if _syncfs is None:
        return "syncfs is not available on this platform (Linux only)"
    if kernel_version() < MIN_KERNEL:
        return (f"syncfs reports I/O errors only from Linux {MIN_KERNEL[0]}.{MIN_KERNEL[1]} on; this kernel is "
                f"{platform.release()}")
    return None


def sync_filesystems(fds: Iterable[int]) -> OSError | None:
    """One syncfs per filesystem the fds live on (called through the first fd of each); the first error, if
    any. The fds stay open."""
    assert _syncfs is not None
    seen: set[int] = set()
    for fd in fds:
        try:
            device = os.fstat(fd).st_dev
        except OSError as exc:
            return exc
        if device in seen:
            continue
        seen.add(device)
        if _syncfs(fd) != 0:
            errno = ctypes.get_errno()
            return OSError(errno, os.strerror(errno))
    return None
