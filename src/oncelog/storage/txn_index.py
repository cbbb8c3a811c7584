"""Aborted transactions of a partition, for read_committed fetches.

A read_committed consumer needs, for the range it fetched, the (producer id, first
offset) of every aborted transaction, so it can drop those records. Entries live in
memory sorted by the offset of their ABORT marker, and on disk in Kafka's `.txnindex`
format next to the segment that holds the marker (entries of 34 bytes: int16 version,
int64 producer id, int64 first offset, int64 last offset, int64 last stable offset).
Files are made durable with the producer-state snapshot; whatever a crash loses after
the snapshot is rebuilt by replaying the markers after it.
"""

from __future__ import annotations

import logging
import os
import struct
from bisect import bisect_left, insort
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

SUFFIX = ".txnindex"
_ENTRY = struct.Struct(">hqqqq")


class AbortedTxn(NamedTuple):
    last_offset: int  # offset of the ABORT marker (sort key)
    producer_id: int
    first_offset: int
    last_stable_offset: int


def encode_entries(entries: list[AbortedTxn]) -> bytes:
    """Entries in the `.txnindex` file format (the cleaner writes a cleaned segment's index with it)."""
    return b"".join(_ENTRY.pack(0, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset)
                    for e in entries)


class TxnIndex:
    def __init__(self, directory: str | os.PathLike, name: str) -> None:
        self.directory = Path(directory)
        self.name = name
        self.entries: list[AbortedTxn] = []
        self._dirty_files: set[Path] = set()
        self._unwritten: dict[Path, list[AbortedTxn]] = {}  # in memory, not yet in their file

    def _path(self, segment_base: int) -> Path:
        return self.directory / f"{segment_base:020d}{SUFFIX}"

    def load(self) -> None:
        entries: list[AbortedTxn] = []
        for item in sorted(os.scandir(self.directory), key=lambda e: e.name):
            if not item.name.endswith(SUFFIX):
                continue
            data = Path(item.path).read_bytes()
            usable = len(data) - len(data) % _ENTRY.size
            if usable != len(data):
                log.warning("%s: %s has a torn tail; keeping %d whole entries", self.name, item.name,
                            usable // _ENTRY.size)
            for pos in range(0, usable, _ENTRY.size):
                _version, pid, first, last, lso = _ENTRY.unpack_from(data, pos)
                entries.append(AbortedTxn(last, pid, first, lso))
        entries.sort()
        self.entries = entries

    def append(self, entry: AbortedTxn, segment_base: int) -> None:
        """Record an ABORT marker that is already in the log. Memory first: read_committed fetches must skip
        the aborted records from now on, whatever the disk says. A failed file write (full disk) is retried
        by `sync`, which fails until it succeeds, so no producer-state snapshot is written past a marker
        whose entry is not on disk (the replay after a crash recreates it)."""
        insort(self.entries, entry)
        path = self._path(segment_base)
        self._unwritten.setdefault(path, []).append(entry)
        self._dirty_files.add(path)
        try:
            self._write_unwritten(path)
        except OSError as exc:
            log.error("%s: aborted-transaction index %s not written (%s); retried at the next snapshot",
                      self.name, path.name, exc)

    def _write_unwritten(self, path: Path) -> None:
        pending = self._unwritten.get(path)
        if not pending:
            return
        data = encode_entries(pending)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            size = os.fstat(fd).st_size
            whole = size - size % _ENTRY.size  # a torn entry of an earlier failed write is overwritten
            written = os.pwrite(fd, data, whole)
            if written != len(data):
                os.ftruncate(fd, whole)
                raise OSError(f"short write to {path.name} ({written} of {len(data)} bytes)")
            if whole != size:
                os.ftruncate(fd, whole + len(data))
        finally:
            os.close(fd)
        del self._unwritten[path]

    def collect(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted transactions overlapping [start, end)."""
        i = bisect_left(self.entries, (start,))
        return [(e.producer_id, e.first_offset) for e in self.entries[i:] if e.first_offset < end]

    def truncate_from(self, offset: int, segment_bases: list[int]) -> None:
        """Forget entries whose marker is at or after `offset` (they will be replayed), in memory and on disk."""
        keep = bisect_left(self.entries, (offset,))
        if keep == len(self.entries):
            return
        self.entries = self.entries[:keep]
        for path, pending in list(self._unwritten.items()):  # or `sync` would write them back
            pending = [e for e in pending if e.last_offset < offset]
            if pending:
                self._unwritten[path] = pending
            else:
                del self._unwritten[path]
        for base in segment_bases:
            path = self._path(base)
            if not path.exists():
                continue
            data = path.read_bytes()
            kept = bytearray()
            for pos in range(0, len(data) - len(data) % _ENTRY.size, _ENTRY.size):
                if _ENTRY.unpack_from(data, pos)[3] < offset:
                    kept += data[pos:pos + _ENTRY.size]
            if len(kept) != len(data):
                path.write_bytes(bytes(kept))
                self._dirty_files.add(path)

    def drop_segment(self, segment_base: int, next_base: int) -> None:
        """A segment was deleted: its entries (markers in [segment_base, next_base)) go with it."""
        self.entries = [e for e in self.entries if not segment_base <= e.last_offset < next_base]
        path = self._path(segment_base)
        self._dirty_files.discard(path)
        self._unwritten.pop(path, None)
        path.unlink(missing_ok=True)

    def take_unsynced_fds(self) -> list[int]:
        """Write what earlier appends could not, and return a read-only fd of every file written since the last
        sync, for the caller to fsync and close (a segment roll's flush round); raises OSError while a write
        still fails."""
        for path in list(self._unwritten):
            self._write_unwritten(path)
        fds: list[int] = []
        for path in list(self._dirty_files):
            try:
                fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            except FileNotFoundError:
                pass
            except OSError:
                for fd in fds:
                    os.close(fd)
                raise
        self._dirty_files.clear()
        return fds

    def sync(self) -> None:
        """Write what earlier appends could not, then fsync; raises OSError while that still fails."""
        for path in list(self._unwritten):
            self._write_unwritten(path)
        for path in list(self._dirty_files):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._dirty_files.clear()
