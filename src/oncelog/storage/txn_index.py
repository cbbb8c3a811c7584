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


class TxnIndex:
    def __init__(self, directory: str | os.PathLike, name: str) -> None:
        self.directory = Path(directory)
        self.name = name
        self.entries: list[AbortedTxn] = []
        self._dirty_files: set[Path] = set()

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
        path = self._path(segment_base)
        with open(path, "ab") as f:
            f.write(_ENTRY.pack(0, entry.producer_id, entry.first_offset, entry.last_offset,
                                entry.last_stable_offset))
        self._dirty_files.add(path)
        insort(self.entries, entry)

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
        path.unlink(missing_ok=True)

    def sync(self) -> None:
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
