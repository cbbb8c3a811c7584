"""One log segment: `<base offset>.log` holding whole record batches, plus its offset and time indexes.

The segment never looks inside a batch beyond its 61-byte header. Appends are one `pwrite` at the size the
segment tracks itself (no O_APPEND, so a failed write can be cut off with `ftruncate` and the next one lands
at the right place). Reads and scans use `pread`, so any number of readers share the one fd without seeking,
and a reader holding a `dup` of it keeps reading after the segment is deleted.

Index maintenance follows Kafka's `LogSegment.append`, batch by batch: an offset-index entry (last offset of the
batch, its position) once more than `index.interval.bytes` were appended since the previous entry, and at the
same moment a time-index entry if the segment's max timestamp grew.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

import crc32c

from ..records.batch import CRC_START, HEADER_SIZE, LOG_OVERHEAD, MAGIC, BatchHeader, read_header
from . import delayed_unlink
from .index import INT32_MAX, OffsetIndex, TimeIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"  # a deleted segment's files until file.delete.delay.ms has passed
NO_TIMESTAMP = -1

_MIN_LENGTH = HEADER_SIZE - LOG_OVERHEAD
_TAIL_CHUNK = 64 * 1024
_RECOVER_CHUNK = 1024 * 1024

log = logging.getLogger(__name__)


def segment_path(directory: str, base_offset: int, suffix: str) -> str:
    return os.path.join(directory, f"{base_offset:020d}{suffix}")


def scan_batches(
    fd: int, start: int, end: int, chunk: int, with_body: bool = False
) -> Iterator[tuple[int, BatchHeader, memoryview | None]]:
    """Yield (position, header, batch bytes or None) for each whole batch in [start, end).

    Reads `chunk` bytes at a time and parses every header inside the chunk, so scanning small batches costs
    one pread per chunk, not one per batch. Stops silently at a torn or implausible header: the caller compares
    where it stopped with where it expected to.
    """
    pos = start
    buf = b""
    buf_start = start
    while pos + HEADER_SIZE <= end:
        rel = pos - buf_start
        if rel + HEADER_SIZE > len(buf):
            buf = os.pread(fd, min(chunk, end - pos), pos)
            buf_start, rel = pos, 0
            if len(buf) < HEADER_SIZE:
                return
        header = read_header(buf, rel)
        size = header.length + LOG_OVERHEAD
        if header.length < _MIN_LENGTH or pos + size > end:
            return
        body = None
        if with_body:
            if rel + size > len(buf):
                buf = os.pread(fd, min(max(chunk, size), end - pos), pos)
                buf_start, rel = pos, 0
                if len(buf) < size:
                    return
            body = memoryview(buf)[rel : rel + size]
        yield pos, header, body
        pos += size


class LogSegment:
    """A segment's files and what is known about its batches (next offset, max timestamp)."""

    def __init__(
        self,
        directory: str,
        base_offset: int,
        fd: int,
        size: int,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        index_interval_bytes: int,
        created_ms: int,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.fd = fd
        self.size = size
        self.offset_index = offset_index
        self.time_index = time_index
        self.index_interval_bytes = index_interval_bytes
        self.created_ms = created_ms
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        # Max timestamp of the first batch: Kafka measures segment.ms from it (None: not known yet).
        self.first_batch_timestamp: int | None = None
        self.truncated_bytes = 0  # what recovery cut off when the segment was opened
        self.rebuilt = False  # indexes rebuilt at open (the caller syncs them)
        self.unsynced = False  # bookkeeping of the partition log: bytes written since the last fsync
        self._bytes_since_index = 0
        self._index_full = False
        self._closed = False

    # -- files ------------------------------------------------------------------------------------------
    @property
    def log_path(self) -> str:
        return segment_path(self.directory, self.base_offset, LOG_SUFFIX)

    @classmethod
    def create(
        cls, directory: str, base_offset: int, *, index_interval_bytes: int, max_index_bytes: int, now_ms: int
    ) -> LogSegment:
        path = segment_path(directory, base_offset, LOG_SUFFIX)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        offset_index = OffsetIndex(segment_path(directory, base_offset, INDEX_SUFFIX), base_offset, max_index_bytes)
        time_index = TimeIndex(segment_path(directory, base_offset, TIME_INDEX_SUFFIX), base_offset, max_index_bytes)
        try:
            offset_index.create_file()
            time_index.create_file()
        except OSError:
            os.close(fd)
            offset_index.delete()
            time_index.delete()
            os.unlink(path)
            raise
        return cls(directory, base_offset, fd, 0, offset_index, time_index, index_interval_bytes, now_ms)

    @classmethod
    def open(
        cls,
        directory: str,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_bytes: int,
        now_ms: int,
        recover: bool = False,
        full_check: bool = False,
    ) -> LogSegment:
        """Open an existing segment. `recover` re-validates every batch (CRC included) and rebuilds the indexes;
        otherwise the indexes are sanity-checked (`full_check`: every entry) and rebuilt only when wrong."""
        fd = os.open(segment_path(directory, base_offset, LOG_SUFFIX), os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            offset_index = OffsetIndex.load(
                segment_path(directory, base_offset, INDEX_SUFFIX), base_offset, max_index_bytes
            )
            time_index = TimeIndex.load(
                segment_path(directory, base_offset, TIME_INDEX_SUFFIX), base_offset, max_index_bytes
            )
            segment = cls(directory, base_offset, fd, size, offset_index, time_index, index_interval_bytes, now_ms)
            if recover:
                segment.truncated_bytes = segment.recover()
            else:
                segment._load(full_check)
            offset_index.close()
            time_index.close()
            return segment
        except BaseException:
            os.close(fd)
            raise

    def _load(self, full_check: bool) -> None:
        oi, ti = self.offset_index, self.time_index
        if (oi.missing or ti.missing) and self.size > 0:
            problem: str | None = "index file missing"
        else:
            problem = oi.problem(self.size, full_check) or self._check_last_index_entry()
        if problem is None:
            if not self._load_tail():
                log.warning("segment %s does not end at a batch boundary; recovering it", self.log_path)
                self.truncated_bytes = self.recover()
                return
            problem = ti.problem(self.next_offset, full_check)
        if problem is not None:
            log.warning("rebuilding the indexes of %s: %s", self.log_path, problem)
            self.truncated_bytes = self.rebuild_indexes()

    def _check_last_index_entry(self) -> str | None:
        """The last offset-index entry must point at the start of the batch it names (one pread)."""
        entry = self.offset_index.last_entry
        if entry is None:
            return None
        offset, position = entry
        data = os.pread(self.fd, HEADER_SIZE, position)
        if len(data) < HEADER_SIZE:
            return f"last entry points past the end ({position})"
        header = read_header(data)
        if header.magic != MAGIC or header.last_offset != offset or position + header.size > self.size:
            return f"last entry ({offset}, {position}) does not match the batch there"
        return None

    def _load_tail(self) -> bool:
        """Recompute next offset and max timestamp from the last index entries plus the batches after the last
        offset-index entry (at most about index.interval.bytes). False if the file does not end at a batch
        boundary there."""
        entry = self.offset_index.last_entry
        start = entry[1] if entry else 0
        time_entry = self.time_index.last_entry
        self.max_timestamp, self.offset_of_max_timestamp = time_entry if time_entry else (NO_TIMESTAMP, -1)
        self.next_offset = self.base_offset
        end = start
        for pos, header, _ in scan_batches(self.fd, start, self.size, _TAIL_CHUNK):
            if header.magic != MAGIC:
                break
            self.next_offset = header.base_offset + header.last_offset_delta + 1
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp = header.max_timestamp
                self.offset_of_max_timestamp = self.next_offset - 1
            end = pos + header.length + LOG_OVERHEAD
        self._bytes_since_index = self.size - start if entry else self.size
        self.first_batch_timestamp = None
        self._index_full = self.offset_index.is_full or self.time_index.is_full
        return end == self.size

    # -- append -----------------------------------------------------------------------------------------
    def should_roll(
        self, batch_size: int, max_timestamp: int, last_offset: int, now_ms: Callable[[], int],
        segment_bytes: int, segment_ms: int,
    ) -> bool:
        """Kafka's `LogSegment.shouldRoll`: full by size or index, offsets no longer relative-int32, or old.

        Age is measured like Kafka: from the first batch's timestamp to the incoming batch's timestamp when the
        first batch has one, else from the segment's creation (or load) time to now.
        """
        if self.size == 0:
            return False
        if self.size + batch_size > segment_bytes:
            return True
        if self._index_full:
            return True
        if last_offset - self.base_offset > INT32_MAX:
            return True
        first = self.first_batch_timestamp
        if first is None:
            first = read_header(os.pread(self.fd, HEADER_SIZE, 0)).max_timestamp
            self.first_batch_timestamp = first
        waited = max_timestamp - first if first >= 0 else now_ms() - self.created_ms
        return waited > segment_ms

    def append(self, buf, last_offset: int, max_timestamp: int, size: int) -> None:
        """Write one batch at the end. On OSError nothing in memory changed; the caller truncates the file."""
        position = self.size
        done = os.pwrite(self.fd, buf, position)
        if done != size:
            self._write_rest(buf, done, position, size)
        self.size = position + size
        if position == 0:
            self.first_batch_timestamp = max_timestamp
        self.next_offset = last_offset + 1
        if self._index_batch(position, size, last_offset, max_timestamp):
            self.offset_index.write_pending()
            self.time_index.write_pending()

    def _write_rest(self, buf, done: int, position: int, size: int) -> None:
        view = memoryview(buf)
        while done < size:
            n = os.pwrite(self.fd, view[done:size], position + done)
            if n <= 0:
                raise OSError(f"short write to {self.log_path}")
            done += n

    def _index_batch(self, position: int, size: int, last_offset: int, max_timestamp: int) -> bool:
        """Kafka's per-batch index rule; True when index entries may have been added (in memory)."""
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = last_offset
        if self._bytes_since_index > self.index_interval_bytes:
            self.offset_index.append(last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index = size
            self._index_full = self.offset_index.is_full or self.time_index.is_full
            return True
        self._bytes_since_index += size
        return False

    def set_index_config(self, index_interval_bytes: int, max_index_bytes: int) -> None:
        self.index_interval_bytes = index_interval_bytes
        self.offset_index.set_max_bytes(max_index_bytes)
        self.time_index.set_max_bytes(max_index_bytes)
        self._index_full = self.offset_index.is_full or self.time_index.is_full

    # -- reads ------------------------------------------------------------------------------------------
    @property
    def _seek_chunk(self) -> int:
        # Enough to cover the gap between two index entries in one pread.
        return min(max(8192, self.index_interval_bytes + 2 * HEADER_SIZE), _RECOVER_CHUNK)

    def iter_headers(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of every batch in [start, end), by chunked preads."""
        for pos, header, _ in scan_batches(self.fd, start, self.size if end is None else end, _TAIL_CHUNK):
            yield pos, header

    def position_of(self, offset: int) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch whose last offset is >= `offset` (None: past the end)."""
        if offset >= self.next_offset:
            return None
        start = self.offset_index.lookup(offset)[1]
        for pos, header, _ in scan_batches(self.fd, start, self.size, self._seek_chunk):
            if header.base_offset + header.last_offset_delta >= offset:
                return pos, header
        return None

    def whole_batches_end(self, start: int, limit: int) -> int:
        """The end of the last whole batch that starts at or after `start` and ends at or before `limit`
        (`start` itself if none fits). Scans from the index entry just before `limit`, so it reads at most
        about one index interval of headers."""
        scan_from = max(start, self.offset_index.floor_position(limit))
        end = scan_from if scan_from > start else start
        for pos, header, _ in scan_batches(self.fd, scan_from, limit, self._seek_chunk):
            end = pos + header.length + LOG_OVERHEAD
        return end

    def find_timestamp(self, timestamp: int, min_offset: int) -> tuple[int, int] | None:
        """(offset, max timestamp) of the first batch at or after `min_offset` whose max timestamp is >=
        `timestamp`; the offset is the batch's base offset (clamped to `min_offset`)."""
        if self.max_timestamp < timestamp:
            return None
        _, from_offset = self.time_index.lookup(timestamp)
        start = self.offset_index.lookup(max(from_offset, min_offset))[1]
        for _, header, _ in scan_batches(self.fd, start, self.size, self._seek_chunk):
            if header.max_timestamp >= timestamp and header.base_offset + header.last_offset_delta >= min_offset:
                return max(header.base_offset, min_offset), header.max_timestamp
        return None

    def read(self, position: int, length: int) -> bytes:
        return os.pread(self.fd, length, position)

    @property
    def largest_timestamp(self) -> int:
        """What time retention compares with: the max timestamp, or the file's mtime when batches carry none."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.fstat(self.fd).st_mtime * 1000)

    # -- truncation and recovery --------------------------------------------------------------------------
    def truncate_to(self, position: int) -> None:
        """Cut the file at `position` (a batch boundary) and bring indexes and bookkeeping in line."""
        os.ftruncate(self.fd, position)
        self.size = position
        self.offset_index.truncate_from_position(position)
        self._load_tail()
        self.time_index.truncate_from_offset(self.next_offset)
        self._load_tail()

    def recover(self) -> int:
        """Validate every batch (header sanity, magic 2, CRC32C, increasing offsets), truncate at the first bad
        or torn one, rebuild both indexes. Returns the number of bytes cut off."""
        return self._rebuild(verify=True)

    def rebuild_indexes(self) -> int:
        """Rebuild both indexes from the batch headers (no CRC). Falls back to `recover` if the file does not
        end at a batch boundary; returns the bytes that recovery cut off."""
        return self._rebuild(verify=False)

    def _rebuild(self, verify: bool) -> int:
        oi, ti = self.offset_index, self.time_index
        oi.reset()
        ti.reset()
        self.rebuilt = True
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        self._bytes_since_index = 0
        expected = self.base_offset
        valid_end = 0
        chunk = _RECOVER_CHUNK if verify else _TAIL_CHUNK
        for pos, header, body in scan_batches(self.fd, 0, self.size, chunk, with_body=verify):
            last_offset = header.base_offset + header.last_offset_delta
            if (
                header.magic != MAGIC
                or header.base_offset < expected
                or header.last_offset_delta < 0
                or last_offset - self.base_offset > INT32_MAX
                or (body is not None and crc32c.crc32c(body[CRC_START:]) != header.crc)
            ):
                break
            size = header.length + LOG_OVERHEAD
            self._index_batch(pos, size, last_offset, header.max_timestamp)
            expected = last_offset + 1
            valid_end = pos + size
        if valid_end != self.size and not verify:
            log.warning("segment %s has invalid data after position %d; recovering it", self.log_path, valid_end)
            return self._rebuild(verify=True)
        truncated = self.size - valid_end
        if truncated:
            log.warning("truncating %s at position %d (%d bytes of invalid or torn data)",
                        self.log_path, valid_end, truncated)
            os.ftruncate(self.fd, valid_end)
            self.size = valid_end
        self.next_offset = expected
        self.first_batch_timestamp = None
        self.seal_time_index()
        oi.rewrite()
        ti.rewrite()
        return truncated

    # -- lifecycle ------------------------------------------------------------------------------------------
    def seal_time_index(self) -> None:
        """Make the last time-index entry the segment's max timestamp (Kafka does this on roll and close)."""
        self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)
        self._index_full = self.offset_index.is_full or self.time_index.is_full

    def finish(self, want_fds: bool) -> list[int]:
        """The segment stops being the active one: seal the time index, release the index fds, and return
        duplicates of them for the flusher to fsync when `want_fds`."""
        self.seal_time_index()
        self.offset_index.write_pending()
        self.time_index.write_pending()
        fds: list[int] = []
        if want_fds:
            for index in (self.offset_index, self.time_index):
                fd = index.dup_fd()
                if fd is not None:
                    fds.append(fd)
        self.offset_index.close()
        self.time_index.close()
        return fds

    def sync(self) -> None:
        """fsync the log and both index files (recovery, clean shutdown)."""
        os.fdatasync(self.fd)
        self.offset_index.sync()
        self.time_index.sync()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.seal_time_index()
            self.offset_index.close()
            self.time_index.close()
        finally:
            os.close(self.fd)

    def delete(self, delay_ms: int = 0) -> None:
        """Close and unlink the files. Readers holding a dup of the fd keep reading the old data.

        With `delay_ms` (file.delete.delay.ms) the files are renamed to `<name>.deleted` at once and unlinked
        that much later, as Kafka does: the segment is gone from the log at once, while an operator (or a tool
        that copies the directory) still finds its bytes for a while. Fetches in flight do not need the delay
        here, they hold duplicated fds. A `.deleted` file left by a stop inside the delay is removed when the
        partition is next opened (PartitionLog._list_segments).
        """
        if not self._closed:
            self._closed = True
            os.close(self.fd)
        if delay_ms <= 0:
            try:
                os.unlink(self.log_path)
            except FileNotFoundError:
                pass
            self.offset_index.delete()
            self.time_index.delete()
            return
        renamed: list[str] = []
        try:
            os.rename(self.log_path, self.log_path + DELETED_SUFFIX)
            renamed.append(self.log_path + DELETED_SUFFIX)
        except FileNotFoundError:
            pass
        for index in (self.offset_index, self.time_index):
            path = index.rename_for_deletion(DELETED_SUFFIX)
            if path is not None:
                renamed.append(path)
        if renamed:
            delayed_unlink.schedule(renamed, delay_ms / 1000)

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path!r}, size={self.size}, next_offset={self.next_offset})"
