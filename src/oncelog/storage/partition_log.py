"""One partition's log: a directory of segments, offset assignment, reads by offset, the high watermark,
retention, DeleteRecords, and recovery after a crash.

Threading: every method runs on the event-loop thread, so nothing here takes a lock. Durability is the one
thing that leaves the loop: `flush_targets` hands duplicated fds to the flusher, which fsyncs them in a worker
thread and then calls `mark_flushed` back on the loop thread.

High watermark = durable end. With fsync enabled, offsets below the high watermark are on disk, so a consumer
never sees a record that a power loss could take back (and acks=all answers wait for the same point). With
fsync disabled the high watermark follows the log end offset at once.

A replicated log (`use_replicated_high_watermark`) splits the two: flushes move only `durable_end`, and the
replica manager moves the high watermark (`set_high_watermark`) to what the in-sync replicas have made durable,
never above this replica's own durable end. Followers cut divergent tails with `truncate_to` and start over
with `truncate_fully_and_start_at`; `advance_log_start` follows the leader's log start offset.
"""

from __future__ import annotations

import logging
import os
import shutil
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ..config import TopicConfig
from ..errors import ErrorCode, KafkaError
from ..records.batch import LOG_OVERHEAD, BatchHeader, set_base_offset
from . import fault_injection, segment_swap
from .segment import DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, LogSegment, segment_path

# Reads up to this size are copied out with pread; larger ones are handed over as a file region for sendfile.
INLINE_READ_MAX = 64 * 1024

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ReadResult:
    """Whole batches from one segment: either `data`, or `length` bytes at `position` of `fd`.

    `fd` is a duplicate owned by the caller, who must close it (`close()` does); it keeps the data readable
    even if retention deletes the segment meanwhile. `first_offset` is the base offset of the first batch,
    which may be below the offset asked for (reads start at the batch that contains it, as in Kafka).
    """

    first_offset: int
    data: bytes | None = b""
    fd: int | None = None
    position: int = 0
    length: int = 0

    @property
    def size(self) -> int:
        return self.length

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class ClosedSegment(NamedTuple):
    """A closed segment as a reader of its files needs it (the log cleaner): its size is final."""

    base_offset: int
    next_offset: int
    size: int
    largest_timestamp: int


class FlushTargets(NamedTuple):
    """What one flush round must make durable for a log: `end_offset` becomes the high watermark once every fd
    in `fds` was fdatasync'ed and every fd in `dir_fds` (the partition directory) fsync'ed. All are
    duplicates owned by the flusher."""

    end_offset: int
    fds: list[int]
    dir_fds: list[int]

    def close(self) -> None:
        for fd in (*self.fds, *self.dir_fds):
            try:
                os.close(fd)
            except OSError:
                pass


class PartitionLog:
    """Use `PartitionLog.open`."""

    def __init__(
        self, directory: str | os.PathLike, topic: str, partition: int, config: TopicConfig,
        *, now_ms: Callable[[], int], fsync: bool,
    ) -> None:
        self.directory = os.fspath(directory)
        self.topic = topic
        self.partition = partition
        self.config = config
        self.fsync_enabled = fsync
        self.offline_reason: str | None = None
        # Hooks for the producer-state and transaction-index modules (snapshot at roll, drop with a segment).
        self.on_roll: Callable[[int], None] | None = None
        self.on_segment_deleted: Callable[[int], None] | None = None
        # Called once before segments are deleted, so state derived from them (producer state) can be
        # snapshotted while the data is still there.
        self.before_delete: Callable[[], None] | None = None
        # Called (once per flush round) when the log gets something to flush; the log manager points it at
        # the flusher's mark_dirty, so acks=0/1 writes move the high watermark too.
        self.on_dirty: Callable[[PartitionLog], None] | None = None
        self._notified = False
        self._now_ms = now_ms
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._log_start = 0
        self._leo = 0
        self._hw = 0  # the high watermark: what readers may see
        self._durable = 0  # the durable end: offsets below it are fsynced (== _hw unless replicated)
        self._replicated = False
        self._recovery_point = 0
        self._size = 0
        self._dir_fd: int | None = None
        self._unsynced: list[LogSegment] = []  # segments with bytes written since their last fdatasync
        self._pending_fds: list[int] = []  # index files of rolled segments, waiting for the next flush round
        self._dir_dirty = False
        # The round in flight: (end offset, active segment, its size). After a truncation the segment is None
        # and the end is capped at the truncation point, since the round's fds do not cover later appends.
        self._flushing: tuple[int, LogSegment | None, int] | None = None
        self._hw_position: tuple[int, LogSegment, int] | None = None  # (high watermark, its segment, position)
        self._durable_position: tuple[int, LogSegment, int] | None = None  # the same for the durable end
        self._unavailable: tuple[ErrorCode, str] | None = None
        self._closed = False
        # Bumped whenever a closed segment changes or goes (retention, DeleteRecords, truncation, start-over, a
        # swap), not by rolls: a rewrite made from the closed segments is swapped in only if it is unchanged.
        self._generation = 0
        self._apply_config(config)

    def _apply_config(self, config: TopicConfig) -> None:
        self._segment_bytes: int = config["segment.bytes"]
        self._segment_ms: int = config["segment.ms"]
        self._index_interval: int = config["index.interval.bytes"]
        self._max_index_bytes: int = config["segment.index.bytes"]
        self._retention_ms: int = config["retention.ms"]
        self._retention_bytes: int = config["retention.bytes"]
        self._deletes: bool = config.deletes
        self._file_delete_delay_ms: int = config["file.delete.delay.ms"]

    # -- opening --------------------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        directory: str | os.PathLike,
        topic: str,
        partition: int,
        config: TopicConfig,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        clean: bool = False,
        now_ms: Callable[[], int] | None = None,
        fsync: bool = True,
    ) -> PartitionLog:
        """Open (or create) the partition directory.

        After an unclean shutdown every segment that may hold offsets >= `recovery_point` is re-validated batch
        by batch; the first bad or torn batch ends the log (later segments are deleted, since offsets after a
        hole cannot be trusted), and what is left is fsynced, so the high watermark starts at the log end.
        After a clean shutdown the files are trusted and only the indexes are sanity-checked.
        """
        if now_ms is None:
            from time import time

            def now_ms() -> int:
                return int(time() * 1000)

        plog = cls(directory, topic, partition, config, now_ms=now_ms, fsync=fsync)
        try:
            plog._load(recovery_point, log_start_offset, clean)
        except BaseException:
            plog._release_fds()
            raise
        return plog

    def _segment_kwargs(self) -> dict:
        return {"index_interval_bytes": self._index_interval, "max_index_bytes": self._max_index_bytes}

    def _load(self, recovery_point: int, log_start_offset: int, clean: bool) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        segment_swap.recover(self.directory)  # a swap a crash interrupted: finished or dropped, never mixed
        bases = self._list_segments()
        first_to_recover = len(bases)
        if not clean:
            first_to_recover = next(
                (i for i in range(len(bases) - 1) if bases[i + 1] > recovery_point), max(len(bases) - 1, 0)
            )
        changed = False
        to_sync: list[LogSegment] = []
        for i, base in enumerate(bases):
            if self._segments and base < self._segments[-1].next_offset:
                log.warning("%s: segment %d overlaps the previous one; dropping it and later segments",
                            self.name, base)
                self._delete_files(bases[i:])
                changed = True
                break
            segment = LogSegment.open(
                self.directory, base, now_ms=self._now_ms(), recover=i >= first_to_recover,
                full_check=not clean, **self._segment_kwargs(),
            )
            self._segments.append(segment)
            if segment.rebuilt:
                to_sync.append(segment)
            if segment.truncated_bytes and i + 1 < len(bases):
                log.warning("%s: segment %d was truncated; deleting the %d later segments",
                            self.name, base, len(bases) - i - 1)
                self._delete_files(bases[i + 1 :])
                changed = True
                break
        if not self._segments:
            self._segments.append(LogSegment.create(
                self.directory, log_start_offset, now_ms=self._now_ms(), **self._segment_kwargs()))
            changed = True
        self._bases = [s.base_offset for s in self._segments]
        self._leo = self._segments[-1].next_offset
        self._log_start = max(log_start_offset, self._segments[0].base_offset)
        if self._log_start > self._leo:
            # The checkpoint says records up to the log start offset were deleted; the files say the log ends
            # earlier (lost data). Kafka starts over at the log start offset; so do we.
            log.warning("%s: log start offset %d is beyond the log end %d; starting an empty log there",
                        self.name, self._log_start, self._leo)
            for segment in self._segments:
                segment.delete()
            to_sync = []
            self._segments = [LogSegment.create(
                self.directory, self._log_start, now_ms=self._now_ms(), **self._segment_kwargs())]
            self._bases = [self._log_start]
            self._leo = self._log_start
            changed = True
        if self._delete_segments_below_start():
            changed = True
        for segment in to_sync:
            if segment in self._segments:
                segment.sync()
        if changed or to_sync:
            os.fsync(self._dir_fd)
        self._dir_dirty = False
        self._size = sum(s.size for s in self._segments)
        self._hw = self._durable = self._recovery_point = self._leo

    def _list_segments(self) -> list[int]:
        """Base offsets of the `.log` files; index files without a log file are removed."""
        logs: set[int] = set()
        indexes: list[tuple[int, str]] = []
        for name in os.listdir(self.directory):
            stem, dot, suffix = name.partition(".")
            if len(stem) != 20 or not stem.isdigit():
                continue
            if name.endswith(DELETED_SUFFIX):
                # Deleted before a stop that came inside file.delete.delay.ms: nothing reads it any more.
                os.unlink(os.path.join(self.directory, name))
                continue
            if "." + suffix == LOG_SUFFIX:
                logs.add(int(stem))
            elif "." + suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                indexes.append((int(stem), name))
        for base, name in indexes:
            if base not in logs:
                os.unlink(os.path.join(self.directory, name))
        return sorted(logs)

    def _delete_files(self, bases: list[int]) -> None:
        for base in bases:
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                try:
                    os.unlink(segment_path(self.directory, base, suffix))
                except FileNotFoundError:
                    pass
            self._call_hook(self.on_segment_deleted, base)

    # -- state ----------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def log_end_offset(self) -> int:
        """The next offset to assign."""
        return self._leo

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def durable_end(self) -> int:
        """Offsets below it are on disk (with fsync disabled: the log end). The high watermark of a single node;
        what a replica reports as replicated in cluster mode."""
        return self._durable

    @property
    def replicated(self) -> bool:
        return self._replicated

    def use_replicated_high_watermark(self, high_watermark: int) -> int:
        """From now on flushes move only the durable end; the owner moves the high watermark with
        `set_high_watermark`. Starts it at `high_watermark` (the replication checkpoint, or the leader's) clamped
        to [log start, durable end]: the one place besides truncation where it may move down, since a single
        node's high watermark (the durable end) may cover records the other replicas never got. Returns it."""
        self._replicated = True
        self._hw = max(self._log_start, min(high_watermark, self._durable))
        self._hw_position = None
        return self._hw

    def set_high_watermark(self, offset: int) -> bool:
        """Move the high watermark up to `offset` (the minimum durable end of the in-sync replicas for a leader,
        the leader's high watermark for a follower), clamped to this replica's durable end; never backwards.
        True if it moved: the caller wakes acks=all waiters (`GroupCommitFlusher.high_watermark_moved`) and
        long-polling fetches."""
        new = min(offset, self._durable)
        if new <= self._hw:
            return False
        self._hw = new
        known = self._durable_position
        self._hw_position = known if known is not None and known[0] == new else None
        return True

    @property
    def recovery_point(self) -> int:
        """Offsets below this are known to be on disk: what the recovery-point checkpoint records. Equal to the
        high watermark with fsync enabled; with fsync disabled it only moves at open and close."""
        return self._recovery_point

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    @property
    def offline(self) -> bool:
        return self.offline_reason is not None

    def _error(self) -> KafkaError:
        assert self._unavailable is not None
        return KafkaError(*self._unavailable)

    def mark_offline(self, reason: str) -> None:
        """Stop serving this log: the files are in an unknown state (failed truncation, failed fsync). Every
        later append and read raises KAFKA_STORAGE_ERROR; nothing more is acknowledged."""
        if self.offline_reason is not None:
            return
        self.offline_reason = reason
        if not self._closed:
            self._unavailable = (ErrorCode.KAFKA_STORAGE_ERROR, f"Log {self.name} is offline: {reason}")
        log.error("partition %s is offline: %s", self.name, reason)
        for fd in self._pending_fds:
            os.close(fd)
        self._pending_fds = []
        if self.fsync_enabled and self._segments:
            self._drop_unsynced_tail()

    def _drop_unsynced_tail(self) -> None:
        """Cut the log back to the high watermark (the last offset a successful fsync covered).

        Past it, after a failed fsync, the bytes may live only in the page cache (Linux marks the pages clean
        whether or not they reached the disk), and every producer waiting for them was told
        KAFKA_STORAGE_ERROR, which clients read as "not written": librdkafka may re-send those records under a
        new epoch. Recovery would keep a tail whose CRCs still match, and the re-sent records would then be in
        the log twice. Cutting it here makes the answer true. If even that fails, the restart's recovery is
        all that is left."""
        durable = self._durable
        try:
            leo = self._leo
            self._cut_tail(durable)
            if leo > durable:
                log.warning("%s: dropped the unsynced offsets %d..%d", self.name, durable, leo - 1)
        except OSError as exc:
            log.error("%s: could not cut the unsynced tail at %d: %s", self.name, durable, exc)

    def _cut_tail(self, offset: int) -> None:
        """Remove the batches from the one containing `offset` on: later segments are deleted (their files
        and, through `on_segment_deleted`, what hangs on them), the segment holding `offset` is cut at that
        batch's start with its indexes. Keeps at least one segment. The log end becomes that batch boundary;
        the other offsets are the caller's to adjust. OSError leaves the files in an unknown state."""
        deleted: list[int] = []
        self._generation += 1
        try:
            while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                segment = self._segments.pop()
                self._bases.pop()
                self._size -= segment.size
                if segment.unsynced:
                    self._unsynced.remove(segment)
                    segment.unsynced = False
                deleted.append(segment.base_offset)
                self._dir_dirty = True
                segment.delete(self._file_delete_delay_ms)
            segment = self._segments[-1]
            if segment.next_offset > offset:
                found = segment.position_of(offset)
                position = found[0] if found is not None else segment.size
                self._size -= segment.size - position
                segment.truncate_to(position)
            self._leo = segment.next_offset
        finally:
            self._hw_position = self._durable_position = None
            for base in deleted:
                self._call_hook(self.on_segment_deleted, base)

    def update_config(self, config: TopicConfig) -> None:
        self.config = config
        self._apply_config(config)
        if self._segments:
            self._segments[-1].set_index_config(self._index_interval, self._max_index_bytes)

    # -- append -------------------------------------------------------------------------------------------
    def append(self, buf, header: BatchHeader, at_offset: int | None = None) -> int:
        """Append one validated v2 batch (`buf` writable, exactly the batch) and return its base offset.

        The base offset (the log end, or `at_offset`) is patched into `buf` in place; the CRC does not cover it,
        so the bytes are written as they are. `at_offset` is for a follower copying its leader's batches, whose
        offsets are already assigned and may skip some (a compacted log keeps gaps where the cleaner removed
        batches); it may not be below the log end. Rolls first when the batch would overflow segment.bytes, the
        segment is older than segment.ms, or an index is full.
        """
        if self._unavailable is not None:
            raise self._error()
        size = header.length + LOG_OVERHEAD
        if size > self._segment_bytes:
            raise KafkaError(
                ErrorCode.RECORD_LIST_TOO_LARGE,
                f"The batch of {size} bytes is larger than the segment size ({self._segment_bytes} bytes)",
            )
        if len(buf) != size:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, f"{len(buf)} bytes given for a batch of {size} bytes")
        base = self._leo
        if at_offset is not None:
            if at_offset < base:
                raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                 f"{self.name}: a batch at {at_offset} cannot follow the log end {base}")
            base = at_offset
        last = base + header.last_offset_delta
        segment = self._segments[-1]
        try:
            roll = segment.should_roll(size, header.max_timestamp, last, self._now_ms, self._segment_bytes,
                                       self._segment_ms)
        except OSError as exc:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Read from {self.name} failed: {exc}") from exc
        if roll:
            segment = self._roll()
        set_base_offset(buf, 0, base)
        position = segment.size
        try:
            segment.append(buf, last, header.max_timestamp, size)
        except OSError as exc:
            self._undo_append(segment, position, exc)
        self._leo = last + 1
        self._size += size
        if not segment.unsynced:
            segment.unsynced = True
            self._unsynced.append(segment)
        if not self.fsync_enabled:
            self._durable = self._leo
            if not self._replicated:
                self._hw = self._leo
        if not self._notified:
            self._notify_dirty()
        return base

    def sync_in_next_round(self, fds: list[int]) -> None:
        """Files written beside the log (a roll's producer-state snapshot and transaction index), whose fsyncs,
        with the directory's, go into the next flush round instead of holding the caller. Takes the fds."""
        if not self.fsync_enabled or self.offline_reason is not None:
            for fd in fds:
                os.close(fd)
            return
        self._pending_fds.extend(fds)
        self._dir_dirty = True
        self._notify_dirty()

    def _notify_dirty(self) -> None:
        if self.on_dirty is not None:
            self._notified = True
            self.on_dirty(self)

    def _undo_append(self, segment: LogSegment, position: int, exc: OSError) -> None:
        try:
            segment.truncate_to(position)
        except OSError as exc2:
            self.mark_offline(f"write failed ({exc}) and the partial batch could not be removed ({exc2})")
        raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Write to {self.name} failed: {exc}") from exc

    def _roll(self) -> LogSegment:
        old = self._segments[-1]
        if old.size == 0:
            return old
        try:
            new = LogSegment.create(self.directory, self._leo, now_ms=self._now_ms(), **self._segment_kwargs())
        except OSError as exc:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Could not roll {self.name}: {exc}") from exc
        self._pending_fds.extend(old.finish(want_fds=self.fsync_enabled))
        self._segments.append(new)
        self._bases.append(new.base_offset)
        self._dir_dirty = True
        self._notify_dirty()
        self._call_hook(self.on_roll, new.base_offset)
        return new

    def roll(self) -> None:
        """Start a new active segment now (if the active one has data)."""
        if self._unavailable is not None:
            raise self._error()
        self._roll()

    def _call_hook(self, hook: Callable[[int], None] | None, offset: int) -> None:
        if hook is not None:
            try:
                hook(offset)
            except Exception:
                log.exception("%s: segment hook failed", self.name)

    # -- rewriting closed segments (the log cleaner) ----------------------------------------------------------
    @property
    def generation(self) -> int:
        return self._generation

    def closed_segments(self) -> tuple[ClosedSegment, ...]:
        """Every segment but the active one, oldest first."""
        return tuple(ClosedSegment(s.base_offset, s.next_offset, s.size, s.largest_timestamp)
                     for s in self._segments[:-1])

    def replace_segments(self, groups: list[tuple[tuple[int, ...], segment_swap.SwapGroup]], generation: int, *,
                         last: bool = True) -> int | None:
        """Put each group's new files (in the scratch directory) in place of its source segments, crash-safely
        (segment_swap's steps). Only if nothing changed the closed segments since `generation` and each group's
        sources are still consecutive closed segments; None (nothing done, the scratch files dropped)
        otherwise, else the new generation (for the next call of the same round: the cleaner swaps a round's
        groups a few at a time, so the event loop is held for one chunk's renames and a few fsyncs). The
        scratch directory goes after the `last` call. Offsets do not change: the high watermark, the log start
        and the log end stay. Reads in flight keep reading the old files through their
        duplicated fds. KAFKA_STORAGE_ERROR (and the log offline) if a rename fails half-way; the next load
        finishes the swap."""
        if self._unavailable is not None or generation != self._generation:
            segment_swap.discard_scratch(self.directory)
            return None
        closed = self._segments[:-1]
        bases = [s.base_offset for s in closed]
        for sources, group in groups:
            i = bases.index(sources[0]) if sources[0] in bases else -1
            if i < 0 or tuple(bases[i:i + len(sources)]) != sources or group.base_offset != sources[0]:
                segment_swap.discard_scratch(self.directory)
                return None
        swap_groups = [group for _sources, group in groups]
        try:
            segment_swap.stage(self.directory, swap_groups)
            fault_injection.crash_point("swap-staged")
            segment_swap.commit(self.directory, swap_groups)
            fault_injection.crash_point("swap-committed")
            for sources, _group in groups:
                i = self._bases.index(sources[0])
                for segment in self._segments[i:i + len(sources)]:
                    segment.delete(self._file_delete_delay_ms)
                    segment_swap.drop_transaction_index(self.directory, segment.base_offset)
            fault_injection.crash_point("swap-old-deleted")
            segment_swap.finish(self.directory, swap_groups)
            for sources, group in groups:
                i = self._bases.index(sources[0])
                old = self._segments[i:i + len(sources)]
                new = LogSegment.open(self.directory, group.base_offset, now_ms=self._now_ms(),
                                      **self._segment_kwargs())
                new.finish(want_fds=False)  # a closed segment: no open index fds
                self._segments[i:i + len(sources)] = [new]
                self._bases[i:i + len(sources)] = [group.base_offset]
                self._size += new.size - sum(s.size for s in old)
        except OSError as exc:
            self.mark_offline(f"swapping in cleaned segments failed: {exc}")
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Swap in {self.name} failed: {exc}") from exc
        finally:
            self._generation += 1
            self._hw_position = self._durable_position = None
        if last:
            segment_swap.discard_scratch(self.directory)
        return self._generation

    # -- reads ---------------------------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None,
             min_one_batch: bool = True) -> ReadResult:
        """Whole batches from the one containing `offset`, from one segment, ending before `upper_bound` (a
        batch boundary: the high watermark by default, or the last stable offset).

        At most `max_bytes`, except that with `min_one_batch` a first batch larger than that is returned
        whole (KIP-74). Cutting at `max_bytes` may leave a partial batch at the end, as in Kafka; clients drop
        it. Cost: an index bisect and a few preads, never a walk over the batches of the range.
        """
        if self._unavailable is not None:
            raise self._error()
        if upper_bound is None:
            upper_bound = self._hw
        if offset < self._log_start or offset > self._leo:
            raise KafkaError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"Offset {offset} is out of range for {self.name}: log start {self._log_start}, end {self._leo}",
            )
        if offset >= upper_bound:
            return ReadResult(offset)
        segments = self._segments
        i = bisect_right(self._bases, offset) - 1
        try:
            while 0 <= i < len(segments):
                segment = segments[i]
                found = segment.position_of(offset)
                if found is None:
                    i += 1
                    continue
                position, header = found
                end = self._end_position(segment, upper_bound)
                first_size = header.length + LOG_OVERHEAD
                limit = max(max_bytes, first_size) if min_one_batch else max_bytes
                length = min(end - position, limit)
                if length < end - position and length > first_size:
                    # Cut at a batch boundary rather than mid-batch: a partial batch costs the consumer a
                    # second fetch of bytes it already received.
                    length = segment.whole_batches_end(position, position + length) - position
                if length <= 0:
                    return ReadResult(header.base_offset)
                if length <= INLINE_READ_MAX:
                    data = segment.read(position, length)
                    return ReadResult(header.base_offset, data=data, position=position, length=len(data))
                return ReadResult(header.base_offset, data=None, fd=os.dup(segment.fd), position=position,
                                  length=length)
        except OSError as exc:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Read from {self.name} failed: {exc}") from exc
        return ReadResult(offset)

    def _end_position(self, segment: LogSegment, upper_bound: int) -> int:
        if upper_bound >= segment.next_offset:
            return segment.size
        known = self._hw_position
        if known is not None and known[0] == upper_bound and known[1] is segment:
            return known[2]
        found = segment.position_of(upper_bound)
        if found is None:
            return segment.size
        if upper_bound == self._hw:
            # A high watermark that moved without a flush round (a replicated log's) is looked up once.
            self._hw_position = (upper_bound, segment, found[0])
        return found[0]

    def iter_batches(self, start_offset: int | None = None, end_offset: int | None = None) -> Iterator[BatchHeader]:
        """Headers of the batches from the one containing `start_offset` (default: the log start) up to
        `end_offset` (exclusive, default: the log end). For rebuilding derived state (producer state, the
        transaction index); do not append while iterating."""
        start = self._log_start if start_offset is None else start_offset
        end = self._leo if end_offset is None else end_offset
        i = max(bisect_right(self._bases, start) - 1, 0)
        for segment in self._segments[i:]:
            if segment.next_offset <= start:
                continue
            found = segment.position_of(start) if start > segment.base_offset else (0, None)
            if found is None:
                continue
            for _, header in segment.iter_headers(found[0]):
                if header.base_offset >= end:
                    return
                yield header

    def offset_for_timestamp(self, timestamp: int, upper_bound: int | None = None) -> tuple[int, int] | None:
        """ListOffsets by time: (offset, timestamp) of the first batch whose max timestamp is >= `timestamp`.

        Kafka decodes that batch and returns the first *record* with such a timestamp; without decoding records
        this returns the batch's base offset (at least the log start offset) and the batch's max timestamp.
        A consumer seeking there reads at most one batch of older records. None if no such batch lies below
        `upper_bound` (default: the high watermark).
        """
        if self._unavailable is not None:
            raise self._error()
        bound = self._hw if upper_bound is None else upper_bound
        try:
            for segment in self._segments:
                if segment.max_timestamp < timestamp or segment.next_offset <= self._log_start:
                    continue
                found = segment.find_timestamp(timestamp, self._log_start)
                if found is not None:
                    return found if found[0] < bound else None
        except OSError as exc:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Read from {self.name} failed: {exc}") from exc
        return None

    def max_timestamp(self) -> tuple[int, int] | None:
        """ListOffsets MAX_TIMESTAMP (-3): (offset, timestamp) of the batch with the largest max timestamp, or
        None for a log without timestamps. The offset is that batch's last offset (Kafka 3.8+ decodes the batch
        to return the exact record; for a batch appended by one producer call they usually coincide)."""
        if self._unavailable is not None:
            raise self._error()
        best: LogSegment | None = None
        for segment in self._segments:
            if segment.max_timestamp < 0 or segment.offset_of_max_timestamp < self._log_start:
                continue
            if best is None or segment.max_timestamp > best.max_timestamp:
                best = segment
        if best is None:
            return None
        return best.offset_of_max_timestamp, best.max_timestamp

    # -- durability (group commit) ----------------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        """Something a flush round would make durable (appended bytes, rolled index files, directory entries)."""
        if not self.fsync_enabled or self.offline_reason is not None:
            return False
        return bool(self._unsynced or self._pending_fds or self._dir_dirty)

    def unflushed_end(self) -> int:
        """The offset the durable end (single node: the high watermark) reaches after the next flush round."""
        return self._leo

    def flush_targets(self) -> FlushTargets:
        """Called on the loop thread at the start of a flush round: the end offset the round covers and the
        fds to sync. The flusher must call `mark_flushed(end_offset)` after syncing, one round at a time."""
        end = self._leo
        self._notified = False
        if not self.fsync_enabled or self.offline_reason is not None:
            return FlushTargets(end, [], [])
        fds: list[int] = []
        dir_fds: list[int] = []
        try:
            for segment in self._unsynced:
                fds.append(os.dup(segment.fd))
            if self._dir_dirty and self._dir_fd is not None:
                dir_fds.append(os.dup(self._dir_fd))
        except OSError:
            FlushTargets(end, fds, dir_fds).close()
            raise
        for segment in self._unsynced:
            segment.unsynced = False
        self._unsynced = []
        fds.extend(self._pending_fds)
        self._pending_fds = []
        self._dir_dirty = False
        active = self._segments[-1]
        self._flushing = (end, active, active.size)
        return FlushTargets(end, fds, dir_fds)

    def mark_flushed(self, end_offset: int) -> None:
        """Everything below `end_offset` is on disk: move the durable end and, unless replicated, the high
        watermark (never backwards)."""
        flushing, self._flushing = self._flushing, None
        known: tuple[int, LogSegment, int] | None = None
        if flushing is not None:
            end, segment, position = flushing
            if segment is None:
                end_offset = min(end_offset, end)  # truncated during the round: later bytes are not covered
            else:
                known = (end, segment, position)
        if end_offset > self._durable:
            self._durable = min(end_offset, self._leo)
            if self.fsync_enabled:
                self._recovery_point = self._durable
            if not self._replicated:
                self._hw = self._durable
        if known is not None and known[0] == self._durable:
            self._durable_position = known
        if known is not None and known[0] == self._hw:
            self._hw_position = known
        elif self._hw_position is not None and self._hw_position[0] != self._hw:
            self._hw_position = None

    # -- deleting old data -------------------------------------------------------------------------------------
    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start offset up to `offset` (<= high watermark) and delete the segments
        that lie entirely below it. Never moves backwards. Returns the new log start offset. (The caller checks
        cleanup.policy, as Kafka answers POLICY_VIOLATION for compacted topics.)"""
        if self._unavailable is not None:
            raise self._error()
        if offset < 0 or offset > self._hw:
            raise KafkaError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"Cannot delete records of {self.name} before {offset}: the high watermark is {self._hw}",
            )
        if offset > self._log_start:
            self._log_start = offset
            self._delete_segments_below_start()
        return self._log_start

    # -- replication: truncation and the leader's log start ---------------------------------------------------
    def truncate_to(self, offset: int) -> int:
        """Remove every batch at or above `offset` (a follower cutting what the leader does not have, at the end
        offset OffsetsForLeaderEpoch gave or the high watermark); returns the new log end offset.

        An `offset` inside a batch removes that whole batch: a log never keeps part of one. Segments above it
        are deleted and the one holding it is cut with its indexes. The high watermark, durable end and
        recovery point come down to the new end; if `offset` is below the first segment the log starts over
        there (`truncate_fully_and_start_at`), and a log start above the new end comes down to it, as in
        Kafka. With fsync enabled everything left is synced before returning, so the cut survives a crash and
        the durable end is the new log end. KAFKA_STORAGE_ERROR (and the log offline) if the files could not be
        changed. The caller rebuilds what derives from the log (`Partition.truncate_to`) and checkpoints."""
        if self._unavailable is not None:
            raise self._error()
        if offset < 0:
            raise ValueError(f"Cannot truncate {self.name} to the negative offset {offset}")
        if offset >= self._leo:
            return self._leo
        if offset < self._segments[0].base_offset:
            self.truncate_fully_and_start_at(offset)
            return self._leo
        old_end = self._leo
        try:
            self._cut_tail(offset)
        except OSError as exc:
            self.mark_offline(f"truncation to {offset} failed: {exc}")
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Truncation of {self.name} failed: {exc}") from exc
        if self._log_start > self._leo:
            log.warning("%s: truncation to %d moves the log start offset down from %d", self.name, self._leo,
                        self._log_start)
            self._log_start = self._leo
        log.info("%s: truncated from %d to %d", self.name, old_end, self._leo)
        self._after_truncation()
        return self._leo

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and start an empty log at `offset` (log start = log end = high watermark =
        `offset`): a follower whose log end lies below the leader's log start, or that shares no history
        with it. Durable before returning with fsync enabled; KAFKA_STORAGE_ERROR (and offline) on failure."""
        if self._unavailable is not None:
            raise self._error()
        if offset < 0:
            raise ValueError(f"Cannot start {self.name} at the negative offset {offset}")
        old = self._segments
        self._generation += 1
        self._segments, self._bases = [], []
        self._unsynced = []
        self._size = 0
        self._hw_position = self._durable_position = None
        for fd in self._pending_fds:
            os.close(fd)
        self._pending_fds = []
        self._leo = self._log_start = offset
        failure: OSError | None = None
        for segment in old:
            segment.unsynced = False
            try:
                segment.delete(self._file_delete_delay_ms)
            except OSError as exc:
                failure = failure or exc
        if failure is None:
            try:
                self._segments = [LogSegment.create(self.directory, offset, now_ms=self._now_ms(),
                                                    **self._segment_kwargs())]
                self._bases = [offset]
            except OSError as exc:
                failure = exc
        self._dir_dirty = True
        for segment in old:
            self._call_hook(self.on_segment_deleted, segment.base_offset)
        if failure is not None:
            self.mark_offline(f"truncation to start at {offset} failed: {failure}")
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Truncation of {self.name} failed: {failure}")
        log.info("%s: emptied, starting at %d", self.name, offset)
        self._after_truncation(everything_new=True)

    def _after_truncation(self, everything_new: bool = False) -> None:
        """Bring the offsets down to the new log end and make the cut durable."""
        end = self._leo
        if everything_new:
            self._hw = self._durable = self._recovery_point = end
        else:
            self._hw = min(self._hw, end)
            self._durable = min(self._durable, end)
            self._recovery_point = min(self._recovery_point, end)
        if self._flushing is not None:
            self._flushing = (min(self._flushing[0], end), None, 0)
        if not self.fsync_enabled:
            self._durable = end
            if not self._replicated:
                self._hw = end
            return
        try:
            self._sync_all()
        except OSError as exc:
            self.mark_offline(f"fsync after truncation failed: {exc}")
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"fsync of {self.name} failed: {exc}") from exc
        self._durable = self._recovery_point = end
        if not self._replicated:
            self._hw = end

    def advance_log_start(self, offset: int) -> int:
        """A follower takes the leader's log start offset (Kafka's maybeIncrementLogStartOffset from a fetch
        response): never backwards, and at most up to this replica's durable end, so that log start <= high
        watermark <= durable end <= log end holds and no deletion is claimed for offsets this replica could
        still lose; the next fetch response repeats the leader's value. Segments wholly below it are deleted.
        Returns the log start offset; the caller checkpoints it (`LogManager.advance_log_start`)."""
        if self._unavailable is not None:
            raise self._error()
        new = min(offset, self._durable)
        if new <= self._log_start:
            return self._log_start
        self._log_start = new
        if self._hw < new:
            self._hw = new
            self._hw_position = None
        self._delete_segments_below_start()
        return self._log_start

    def apply_retention(self, now_ms: int) -> int:
        """Delete segments past retention.ms (by their largest timestamp) or beyond retention.bytes, oldest
        first, as Kafka does; returns how many were deleted. Only with cleanup.policy=delete; never deletes data
        at or above the high watermark. When every segment is expired the active one is rolled first, so the
        log start offset moves to the log end."""
        if self._unavailable is not None:
            return 0
        deleted = self._delete_segments_below_start()
        if not self._deletes:
            return deleted
        retention_ms = self._retention_ms
        if retention_ms >= 0:
            deleted += self._delete_oldest(lambda segment: now_ms - segment.largest_timestamp > retention_ms)
        retention_bytes = self._retention_bytes
        if retention_bytes >= 0 and self._size >= retention_bytes:
            excess = self._size - retention_bytes

            def over_size(segment: LogSegment) -> bool:
                nonlocal excess
                if excess - segment.size >= 0:
                    excess -= segment.size
                    return True
                return False

            deleted += self._delete_oldest(over_size)
        return deleted

    def _delete_oldest(self, predicate: Callable[[LogSegment], bool]) -> int:
        segments = self._segments
        count = 0
        for i, segment in enumerate(segments):
            is_last = i == len(segments) - 1
            if is_last and segment.size == 0:
                break
            upper = self._leo if is_last else segments[i + 1].base_offset
            if self._hw < upper or not predicate(segment):
                break
            count += 1
        if count == len(segments):
            try:
                self._roll()
            except KafkaError as exc:
                log.warning("%s: retention could not roll the active segment: %s", self.name, exc)
                count -= 1
        if count:
            self._before_delete()
        for _ in range(count):
            self._delete_segment(self._segments[0])
        if count:
            self._log_start = max(self._log_start, self._segments[0].base_offset)
        return count

    def _before_delete(self) -> None:
        if self.before_delete is not None:
            try:
                self.before_delete()
            except Exception:
                log.exception("%s: before_delete hook failed", self.name)

    def _delete_segments_below_start(self) -> int:
        count = 0
        if len(self._segments) > 1 and self._segments[1].base_offset <= self._log_start:
            self._before_delete()
        while len(self._segments) > 1 and self._segments[1].base_offset <= self._log_start:
            self._delete_segment(self._segments[0])
            count += 1
        return count

    def _delete_segment(self, segment: LogSegment) -> None:
        """Remove the oldest segment."""
        assert segment is self._segments[0]
        self._generation += 1
        del self._segments[0]
        del self._bases[0]
        self._size -= segment.size
        if segment.unsynced:
            self._unsynced.remove(segment)
            segment.unsynced = False
        try:
            segment.delete(self._file_delete_delay_ms)
        except OSError as exc:
            log.warning("%s: could not delete %s: %s", self.name, segment.log_path, exc)
        self._dir_dirty = True
        self._notify_dirty()
        self._call_hook(self.on_segment_deleted, segment.base_offset)

    # -- shutdown -----------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Make everything durable (the clean-shutdown marker will vouch for these files) and release fds."""
        if self._closed:
            return
        failure: OSError | None = None
        try:
            if self.offline_reason is None and self._segments:
                self._sync_all()
                self._durable = self._recovery_point = self._leo
                if not self._replicated:
                    self._hw = self._leo
        except OSError as exc:
            failure = exc
            self.mark_offline(f"fsync at close failed: {exc}")
        finally:
            self._closed = True
            self._unavailable = (ErrorCode.NOT_LEADER_OR_FOLLOWER, f"Log {self.name} is closed")
            self._release_fds()
        if failure is not None:
            raise failure

    def sync_now(self) -> None:
        """fsync everything written so far, on the calling thread. For the rare moments that need the log
        durable up to its end before going on (a producer-state snapshot); the group-commit flusher still
        moves the high watermark."""
        if self._unavailable is not None:
            raise self._error()
        if not self.fsync_enabled:
            return
        try:
            # Bookkeeping stays as it is: the flusher's next round syncs these again (cheaply) and is the one
            # that moves the high watermark and wakes acks=all waiters.
            fault_injection.check_fsync()
            for segment in {id(s): s for s in (*self._unsynced, self._segments[-1])}.values():
                os.fdatasync(segment.fd)
            for fd in self._pending_fds:
                os.fsync(fd)
            if self._dir_fd is not None:
                os.fsync(self._dir_fd)
        except OSError as exc:
            self.mark_offline(f"fsync failed: {exc}")
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"fsync of {self.name} failed: {exc}") from exc

    def _sync_all(self) -> None:
        fault_injection.check_fsync()
        active = self._segments[-1]
        active.seal_time_index()
        to_sync = list(self._unsynced)
        if active not in to_sync:
            to_sync.append(active)
        for segment in to_sync:
            segment.sync()
            segment.unsynced = False
        self._unsynced = []
        for fd in self._pending_fds:
            os.fsync(fd)
        if self._dir_fd is not None:
            os.fsync(self._dir_fd)
        self._dir_dirty = False

    def _release_fds(self) -> None:
        for fd in self._pending_fds:
            os.close(fd)
        self._pending_fds = []
        for segment in self._segments:
            try:
                segment.close()
            except OSError as exc:
                log.warning("%s: closing %s failed: %s", self.name, segment.log_path, exc)
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def delete(self) -> None:
        """Remove the partition directory (topic deletion). Readers holding fds keep their data."""
        self._closed = True
        self._generation += 1
        self._unavailable = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Partition {self.name} was deleted")
        for fd in self._pending_fds:
            os.close(fd)
        self._pending_fds = []
        for segment in self._segments:
            try:
                segment.delete()
            except OSError:
                pass
        self._segments = []
        self._bases = []
        self._unsynced = []
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def __repr__(self) -> str:
        return (f"PartitionLog({self.name}, start={self._log_start}, hw={self._hw}, end={self._leo}, "
                f"segments={len(self._segments)})")
