"""Offset and time indexes of a log segment, in Kafka's on-disk format.

`.index` holds 8-byte entries (int32 offset relative to the segment's base offset, int32 file position of a
batch); `.timeindex` holds 12-byte entries (int64 timestamp, int32 relative offset). Both big-endian, as Kafka
writes them, so Kafka's tools can read an oncelog segment.

Kafka memory-maps preallocated files. Here the entries live in `array`s (compact, and `bisect` works on them
without building Python lists) and are appended to a plain file with `pwrite`, never fsynced on the hot path:
an index can always be rebuilt from its segment, so a torn or stale index costs a rebuild, never data. For
the same reason a failed index write does not fail the append: the file is marked broken and rewritten (or
removed, to be rebuilt at the next open) when it is closed.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right

INT32_MAX = 0x7FFFFFFF

_LITTLE = sys.byteorder == "little"
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")

assert array("i").itemsize == 4 and array("q").itemsize == 8

log = logging.getLogger(__name__)


class _IndexFile:
    """File handling shared by both indexes: the entry cap and which entries are already in the file."""

    entry_size = 0

    def __init__(self, path: str, base_offset: int, max_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_bytes // self.entry_size)
        self.missing = False  # no file on disk when loaded: the caller rebuilds
        self.load_problem: str | None = None
        self._fd: int | None = None
        self._written = 0  # entries [0, _written) are in the file
        self._file_ok = True

    def __len__(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def _encode(self, start: int, end: int) -> bytes:  # pragma: no cover - overridden
        raise NotImplementedError

    def _read_file(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            self.missing = True
            return b""
        whole = len(data) - len(data) % self.entry_size
        if whole != len(data):
            self.load_problem = f"size {len(data)} is not a multiple of {self.entry_size}"
        return data[:whole]

    @property
    def is_full(self) -> bool:
        return len(self) >= self.max_entries

    def set_max_bytes(self, max_bytes: int) -> None:
        self.max_entries = max(1, max_bytes // self.entry_size)

    def _open_fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        return self._fd

    def create_file(self) -> None:
        """Create (or empty) the file now, so that it exists with its segment."""
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self._written = 0
        self._file_ok = True

    def write_pending(self) -> None:
        """Append the entries that are not in the file yet: one pwrite."""
        n = len(self)
        if self._written >= n or not self._file_ok:
            return
        data = self._encode(self._written, n)
        try:
            fd = self._open_fd()
            done = os.pwrite(fd, data, self._written * self.entry_size)
            if done != len(data):
                raise OSError(f"short write ({done} of {len(data)} bytes)")
            self._written = n
        except OSError as exc:
            self._broken(exc)

    def rewrite(self) -> None:
        """Make the file hold exactly the in-memory entries (after a rebuild)."""
        try:
            fd = self._open_fd()
            os.ftruncate(fd, 0)
            data = self._encode(0, len(self))
            if data and os.pwrite(fd, data, 0) != len(data):
                raise OSError("short write")
            self._written = len(self)
            self._file_ok = True
        except OSError as exc:
            self._broken(exc)

    def _truncate_file(self, entries: int) -> None:
        if self._written > entries and self._file_ok:
            try:
                os.ftruncate(self._open_fd(), entries * self.entry_size)
                self._written = entries
            except OSError as exc:
                self._broken(exc)
        self._written = min(self._written, entries)

    def _broken(self, exc: OSError) -> None:
        if self._file_ok:
            log.warning("index file %s could not be written (%s); it will be rebuilt", self.path, exc)
        self._file_ok = False

    def dup_fd(self) -> int | None:
        """A duplicate fd for an fsync in the flusher's thread, or None when the file is not trustworthy."""
        if not self._file_ok:
            return None
        try:
            return os.dup(self._open_fd())
        except OSError:
            return None

    def sync(self) -> None:
        self.write_pending()
        if self._file_ok:
            os.fsync(self._open_fd())

    def close(self) -> None:
        """Release the fd; the entries stay usable in memory and the file is reopened for later appends."""
        self.write_pending()
        if not self._file_ok:
            self.rewrite()
        if not self._file_ok:
            # Better no index than a wrong one: a missing index is rebuilt when the segment is opened.
            try:
                os.unlink(self.path)
            except OSError:
                pass
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def delete(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def rename_for_deletion(self, suffix: str) -> str | None:
        """Close the fd and give the file `suffix` (deleted later, see LogSegment.delete); the new path, or None
        when there was no file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            os.rename(self.path, self.path + suffix)
        except FileNotFoundError:
            return None
        return self.path + suffix


class OffsetIndex(_IndexFile):
    """Sparse map offset -> file position. An entry is (last offset of a batch, position of that batch), as in
    Kafka since the v2 format, so the batch found by a lookup may end exactly at the target offset."""

    entry_size = 8

    def __init__(self, path: str, base_offset: int, max_bytes: int) -> None:
        super().__init__(path, base_offset, max_bytes)
        self._rel = array("i")
        self._pos = array("i")

    @classmethod
    def load(cls, path: str, base_offset: int, max_bytes: int) -> OffsetIndex:
        index = cls(path, base_offset, max_bytes)
        flat = array("i", index._read_file())
        if _LITTLE:
            flat.byteswap()
        index._rel = flat[0::2]
        index._pos = flat[1::2]
        index._written = len(index._rel)
        return index

    def __len__(self) -> int:
        return len(self._rel)

    def _encode(self, start: int, end: int) -> bytes:
        if end - start == 1:
            return _OFFSET_ENTRY.pack(self._rel[start], self._pos[start])
        flat = array("i", bytes(8 * (end - start)))
        flat[0::2] = self._rel[start:end]
        flat[1::2] = self._pos[start:end]
        if _LITTLE:
            flat.byteswap()
        return flat.tobytes()

    def append(self, offset: int, position: int) -> bool:
        """Add an entry in memory (write_pending puts it in the file); False when the index is full."""
        if len(self._rel) >= self.max_entries:
            return False
        rel = offset - self.base_offset
        if self._rel and rel <= self._rel[-1]:
            raise ValueError(f"offset index entry {offset} is not above the last entry in {self.path}")
        self._rel.append(rel)
        self._pos.append(position)
        return True

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry at or below `offset`, or (base offset, 0)."""
        i = bisect_right(self._rel, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self._rel[i], self._pos[i]

    def floor_position(self, position: int) -> int:
        """The position of the last indexed batch that starts at or before `position` (0 if none)."""
        i = bisect_right(self._pos, position) - 1
        return self._pos[i] if i >= 0 else 0

    @property
    def last_entry(self) -> tuple[int, int] | None:
        if not self._rel:
            return None
        return self.base_offset + self._rel[-1], self._pos[-1]

    def entries(self) -> list[tuple[int, int]]:
        return [(self.base_offset + r, p) for r, p in zip(self._rel, self._pos, strict=True)]

    def reset(self) -> None:
        """Forget every entry in memory (a rebuild follows, then `rewrite`)."""
        del self._rel[:]
        del self._pos[:]

    def truncate_from_position(self, position: int) -> None:
        """Drop the entries of batches at or after `position` (the segment was truncated there)."""
        i = bisect_left(self._pos, position)
        del self._rel[i:]
        del self._pos[i:]
        self._truncate_file(i)

    def problem(self, segment_size: int, full: bool) -> str | None:
        """Why this index cannot be trusted, or None. `full` checks every entry (after an unclean shutdown, when
        unsynced pages may be lost); otherwise only the last two, as Kafka does."""
        if self.load_problem:
            return self.load_problem
        rel, pos = self._rel, self._pos
        if not rel:
            return None
        if rel[0] < 0 or pos[0] < 0:
            return "negative entry"
        if pos[-1] >= segment_size:
            return f"position {pos[-1]} is beyond the segment size {segment_size}"
        start = 0 if full else max(0, len(rel) - 2)
        for i in range(start + 1, len(rel)):
            if rel[i] <= rel[i - 1] or pos[i] <= pos[i - 1]:
                return f"entry {i} ({rel[i]}, {pos[i]}) does not follow ({rel[i - 1]}, {pos[i - 1]})"
        return None


class TimeIndex(_IndexFile):
    """Sparse map timestamp -> offset: (max timestamp so far, offset of the batch that first reached it).
    Entries are added only when the max timestamp grows, so timestamps are strictly increasing."""

    entry_size = 12

    def __init__(self, path: str, base_offset: int, max_bytes: int) -> None:
        super().__init__(path, base_offset, max_bytes)
        self._ts = array("q")
        self._rel = array("i")

    @classmethod
    def load(cls, path: str, base_offset: int, max_bytes: int) -> TimeIndex:
        index = cls(path, base_offset, max_bytes)
        data = index._read_file()
        ts, rel = index._ts, index._rel
        for t, r in _TIME_ENTRY.iter_unpack(data):
            ts.append(t)
            rel.append(r)
        index._written = len(ts)
        return index

    def __len__(self) -> int:
        return len(self._ts)

    def _encode(self, start: int, end: int) -> bytes:
        pack = _TIME_ENTRY.pack
        return b"".join(pack(self._ts[i], self._rel[i]) for i in range(start, end))

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> bool:
        """Add (timestamp, offset) in memory if the timestamp grew (Kafka's rule); True when added."""
        if timestamp < 0 or (self._ts and timestamp <= self._ts[-1]):
            return False
        if not skip_full_check and len(self._ts) >= self.max_entries:
            return False
        rel = offset - self.base_offset
        if self._rel and rel < self._rel[-1]:
            return False
        self._ts.append(timestamp)
        self._rel.append(rel)
        return True

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the last entry with a timestamp at or below `timestamp`, or (-1, base offset)."""
        i = bisect_right(self._ts, timestamp) - 1
        if i < 0:
            return -1, self.base_offset
        return self._ts[i], self.base_offset + self._rel[i]

    @property
    def last_entry(self) -> tuple[int, int] | None:
        if not self._ts:
            return None
        return self._ts[-1], self.base_offset + self._rel[-1]

    def entries(self) -> list[tuple[int, int]]:
        return [(t, self.base_offset + r) for t, r in zip(self._ts, self._rel, strict=True)]

    def reset(self) -> None:
        del self._ts[:]
        del self._rel[:]

    def truncate_from_offset(self, offset: int) -> None:
        """Drop the entries that point at `offset` or later."""
        i = bisect_left(self._rel, offset - self.base_offset)
        del self._ts[i:]
        del self._rel[i:]
        self._truncate_file(i)

    def problem(self, next_offset: int, full: bool) -> str | None:
        """Why this index cannot be trusted given the segment's next offset, or None."""
        if self.load_problem:
            return self.load_problem
        ts, rel = self._ts, self._rel
        if not ts:
            return None
        if rel[0] < 0:
            return "negative offset"
        if self.base_offset + rel[-1] >= next_offset:
            return f"offset {self.base_offset + rel[-1]} is beyond the segment's end {next_offset}"
        start = 0 if full else max(0, len(ts) - 2)
        for i in range(start + 1, len(ts)):
            if ts[i] <= ts[i - 1] or rel[i] < rel[i - 1]:
                return f"entry {i} ({ts[i]}, {rel[i]}) does not follow ({ts[i - 1]}, {rel[i - 1]})"
        return None
