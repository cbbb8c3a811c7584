"""One round of cleaning of one partition: build the offset map over the dirty range, then rewrite the closed
segments below the round's end into grouped, cleaned segments (docs/log-cleaner.md §1-3).

Runs in a worker process, on files only: the request names the partition directory and the closed segments (whose
sizes are final: only the active segment grows), and the cleaned segments are written into a scratch directory
(`SCRATCH_DIR` inside the partition directory) and fsynced there. Nothing in the partition directory changes
here; the event loop swaps the result in (`swap.py`) if the log did not change meanwhile, and a crash before that
leaves only scratch files, which the next load removes. A source segment deleted before it was opened (retention,
truncation) raises FileNotFoundError: the round is given up and tried again later.

Only segments that end at or below `first_uncleanable` are read, so nothing at or above the high watermark or the
last stable offset is ever rewritten (Kafka may rewrite the part of a segment past its uncleanable offset; here a
replica never rewrites a batch its leader could still cut or a transaction could still reach).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from ...records.batch import BatchHeader, crc_ok, read_header
from ..index import INT32_MAX
from ..segment import LOG_SUFFIX, LogSegment, scan_batches, segment_path
from ..segment_swap import SCRATCH_DIR
from ..txn_index import SUFFIX as TXN_INDEX_SUFFIX
from ..txn_index import AbortedTxn, encode_entries
from .batch_filter import CleanRules, TransactionTracker, add_to_map, control_type, filter_batch
from .offset_map import OffsetMap
from .throttler import Throttler

READ_CHUNK = 1 << 20
OFFSET_INDEX_ENTRY = 8  # bytes of one offset-index entry (Kafka's relative offset + position)


class UncleanableError(Exception):
    """This partition cannot be cleaned as it is: the cleaner marks it uncleanable and says why."""


class DedupeBufferTooSmall(UncleanableError):
    """The first dirty batch alone has more keys than the offset map may hold."""


class CorruptSegment(UncleanableError):
    """A closed segment holds a batch that fails its CRC or ends before the segment does."""


@dataclass(frozen=True, slots=True)
class SourceSegment:
    base_offset: int
    next_offset: int  # after its last batch (its base offset when empty)
    size: int  # bytes: final, the segment is closed
    largest_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class RoundRequest:
    directory: str
    segments: tuple[SourceSegment, ...]  # closed segments from the log start, in offset order
    first_dirty: int  # the cleaner checkpoint: below it the log was cleaned already
    first_uncleanable: int  # min(active segment, last stable offset, high watermark, min.compaction.lag.ms)
    dedupe_buffer_bytes: int
    now_ms: int
    delete_retention_ms: int
    last_batch_of_producer: dict[int, int]
    aborted: tuple[AbortedTxn, ...]  # the partition's aborted transactions that end at or above the first segment
    segment_bytes: int
    max_index_bytes: int
    index_interval_bytes: int
    io_max_bytes_per_second: float = math.inf  # this round's share of log.cleaner.io.max.bytes.per.second
    marker_epoch_of_producer: dict[int, int] = field(default_factory=dict)  # see batch_filter.CleanRules


@dataclass(frozen=True, slots=True)
class CleanedGroup:
    base_offset: int
    source_bases: tuple[int, ...]
    size: int
    next_offset: int  # the last source segment's next offset: the cleaned one covers the same offsets


@dataclass(frozen=True, slots=True)
class RoundResult:
    end_offset: int  # the new cleaner checkpoint: everything below it is clean
    groups: tuple[CleanedGroup, ...]
    bytes_read: int
    bytes_written: int
    records_kept: int
    records_removed: int
    seconds: float
    map_keys: int = 0
    map_capacity: int = 0
    throttled_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def cleanable(segments: tuple[SourceSegment, ...], first_uncleanable: int) -> list[SourceSegment]:
    """The segments a round may rewrite: those that end at or below the first uncleanable offset."""
    out = []
    for seg in segments:
        if seg.next_offset > first_uncleanable:
            break
        out.append(seg)
    return out


def group_by_size(segments: list[SourceSegment], segment_bytes: int, max_index_bytes: int) -> list[list[SourceSegment]]:
    """Consecutive segments merged while the group stays under segment.bytes, under segment.index.bytes worth of
    index entries (one a batch at most, as Kafka bounds it by the sources' index sizes: here by their bytes over
    the smallest batch), and within 32-bit relative offsets (Kafka's groupSegmentsBySize)."""
    groups: list[list[SourceSegment]] = []
    i = 0
    while i < len(segments):
        group = [segments[i]]
        size = segments[i].size
        i += 1
        while i < len(segments):
            nxt = segments[i]
            if size + nxt.size > segment_bytes:
                break
            if nxt.next_offset - 1 - group[0].base_offset > INT32_MAX:
                break
            if (size + nxt.size) // 61 * OFFSET_INDEX_ENTRY > max_index_bytes:
                break
            group.append(nxt)
            size += nxt.size
            i += 1
        groups.append(group)
    return groups


def _batches(directory: str, seg: SourceSegment) -> Iterator[tuple[memoryview, BatchHeader]]:
    """Every batch of a closed segment, CRC-checked; CorruptSegment at a damaged or missing batch."""
    path = segment_path(directory, seg.base_offset, LOG_SUFFIX)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    end = 0
    try:
        for pos, header, body in scan_batches(fd, 0, seg.size, READ_CHUNK, with_body=True):
            assert body is not None
            if not crc_ok(body, 0, header):
                raise CorruptSegment(f"{path}: the batch at offset {header.base_offset} (position {pos}) fails "
                                     f"its CRC")
            end = pos + header.size
            yield body, header
    finally:
        os.close(fd)
    if end != seg.size:
        raise CorruptSegment(f"{path}: batches end at position {end}, the segment at {seg.size}")


def build_offset_map(req: RoundRequest, segments: list[SourceSegment],
                     throttler: Throttler | None = None) -> tuple[OffsetMap, int, int]:
    """The map over the dirty part of `segments`: (map, the round's end offset, bytes read)."""
    throttler = throttler or Throttler(req.io_max_bytes_per_second)
    offset_map = OffsetMap(req.dedupe_buffer_bytes)
    tracker = TransactionTracker(req.aborted)
    end = segments[-1].next_offset if segments else req.first_dirty
    read = 0
    for seg in segments:
        if seg.next_offset <= req.first_dirty:
            continue
        for body, header in _batches(req.directory, seg):
            if header.last_offset < req.first_dirty:
                continue
            read += header.size
            throttler.account(header.size)
            if header.is_control:
                tracker.control_batch(header, control_type(body, header))
                continue
            aborted = tracker.data_batch(header)
            if not add_to_map(offset_map, body, header, aborted):
                if len(offset_map) == 0:
                    raise DedupeBufferTooSmall(
                        f"a batch of {header.record_count} records at offset {header.base_offset} does not fit "
                        f"an offset map of {offset_map.capacity} keys (log.cleaner.dedupe.buffer.size)")
                return offset_map, header.base_offset, read
    return offset_map, end, read


def run_round(req: RoundRequest) -> RoundResult:
    """Map, then rewrite; the cleaned groups are in the scratch directory, fsynced. See the module docstring."""
    started = time.monotonic()
    segments = cleanable(req.segments, req.first_uncleanable)
    if not segments or segments[-1].next_offset <= req.first_dirty:
        return RoundResult(req.first_dirty, (), 0, 0, 0, 0, time.monotonic() - started)
    throttler = Throttler(req.io_max_bytes_per_second)
    offset_map, end, read = build_offset_map(req, segments, throttler)
    to_clean = [s for s in segments if s.base_offset < end]
    scratch = os.path.join(req.directory, SCRATCH_DIR)
    os.makedirs(scratch, exist_ok=True)
    rules = CleanRules(offset_map, req.now_ms, req.delete_retention_ms, req.last_batch_of_producer,
                       req.marker_epoch_of_producer)
    tracker = TransactionTracker(req.aborted)
    groups: list[CleanedGroup] = []
    written = kept = removed = 0
    for group in group_by_size(to_clean, req.segment_bytes, req.max_index_bytes):
        base = group[0].base_offset
        out = LogSegment.create(scratch, base, index_interval_bytes=req.index_interval_bytes,
                                max_index_bytes=req.max_index_bytes, now_ms=req.now_ms)
        indexed = len(tracker.index)
        try:
            for seg in group:
                for body, header in _batches(req.directory, seg):
                    read += header.size
                    throttler.account(header.size)
                    result = filter_batch(body, rules, tracker)
                    kept += result.records_kept
                    removed += result.records_removed
                    if result.data is None:
                        continue
                    data = result.data
                    out.append(data, header.last_offset, read_header(data).max_timestamp, len(data))
                    throttler.account(len(data))
            out.seal_time_index()
            out.offset_index.write_pending()
            out.time_index.write_pending()
            out.sync()
            size = out.size
        finally:
            out.close()
        entries = tracker.index[indexed:]
        if entries:
            _write_file(segment_path(scratch, base, TXN_INDEX_SUFFIX), encode_entries(entries))
        written += size
        groups.append(CleanedGroup(base, tuple(s.base_offset for s in group), size, group[-1].next_offset))
    _fsync_dir(scratch)
    return RoundResult(end, tuple(groups), read, written, kept, removed, time.monotonic() - started,
                       map_keys=len(offset_map), map_capacity=offset_map.capacity,
                       throttled_seconds=throttler.slept)


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
