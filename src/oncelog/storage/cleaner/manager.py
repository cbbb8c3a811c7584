"""Which partition to clean next, running the rounds in worker processes, and the cleaner's progress on disk
(Kafka's LogCleanerManager and LogCleaner threads; docs/log-cleaner.md §2).

Runs on the event loop. Each pass asks every compacted partition for a `CleanerView` (an immutable description
of its closed segments and what bounds a clean), picks the dirtiest, hands a `RoundRequest` to a worker process
and, when the result comes back, asks the partition to swap it in, which it does only if its segments did not
change meanwhile (the view's generation). Progress is `cleaner-offset-checkpoint` in the data directory: per
partition, the offset below which it is clean; it survives restarts, as Kafka's file of the same name.

Choice (Kafka's): the dirty ratio of a partition is dirty bytes / (clean + dirty) bytes of its cleanable range;
it is a candidate at or above `min.cleanable.dirty.ratio`, or when its oldest dirty record is older than
`max.compaction.lag.ms` (KIP-354) whatever its ratio; the highest ratio goes first. A partition whose segments
cannot be read (a CRC failure, a batch larger than the offset map) is marked uncleanable, logged once and skipped
until the broker restarts; the others go on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol

from ..checkpoints import read_checkpoint, write_checkpoint
from ..txn_index import AbortedTxn
from .segment_cleaner import RoundRequest, RoundResult, SourceSegment, UncleanableError, run_round

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "cleaner-offset-checkpoint"
Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class CleanerView:
    """One compacted partition as the cleaner sees it at one moment (made on the loop, read anywhere)."""

    key: Key
    directory: str
    generation: int  # changes whenever the log's segment list changes (roll, retention, truncation, swap)
    log_start: int
    segments: tuple[SourceSegment, ...]  # closed segments, in offset order
    first_uncleanable: int  # min(active segment base, last stable offset, high watermark, min.compaction.lag)
    aborted: tuple[AbortedTxn, ...]
    last_batch_of_producer: dict[int, int]
    delete_retention_ms: int
    min_cleanable_ratio: float
    max_compaction_lag_ms: int
    segment_bytes: int
    max_index_bytes: int
    index_interval_bytes: int
    first_dirty_timestamp: int = -1  # the largest timestamp of the first dirty segment (-1: unknown)


class CleanableLog(Protocol):
    """A partition the cleaner may work on (storage.partition.Partition)."""

    def cleaner_view(self, now_ms: int) -> CleanerView | None:
        """None when the partition is not compacted or cannot be cleaned now (offline, being deleted)."""

    def replace_cleaned(self, result: RoundResult, generation: int) -> bool:
        """Swap the round's cleaned segments in, if the segment list is still at `generation`."""


@dataclass(frozen=True, slots=True)
class Candidate:
    view: CleanerView
    first_dirty: int
    ratio: float
    due: bool  # past max.compaction.lag.ms


def candidate(view: CleanerView, checkpoint: int | None, now_ms: int) -> Candidate | None:
    """The partition's standing, or None when it has nothing cleanable."""
    first_dirty = view.log_start if checkpoint is None else max(checkpoint, view.log_start)
    if first_dirty >= view.first_uncleanable:
        return None
    clean = dirty = 0
    for seg in view.segments:
        if seg.next_offset > view.first_uncleanable:
            break
        if seg.next_offset <= first_dirty:
            clean += seg.size
        else:
            dirty += seg.size
    if dirty == 0:
        return None
    ratio = dirty / (clean + dirty)
    due = (view.max_compaction_lag_ms < (1 << 62) and view.first_dirty_timestamp >= 0
           and now_ms - view.first_dirty_timestamp > view.max_compaction_lag_ms)
    if ratio < view.min_cleanable_ratio and not due:
        return None
    return Candidate(view, first_dirty, ratio, due)


def choose(candidates: Iterable[Candidate]) -> Candidate | None:
    """The dirtiest; Kafka's order (the ratio), overdue ones included."""
    return max(candidates, key=lambda c: c.ratio, default=None)


@dataclass(slots=True)
class CleanerStats:
    """What the metrics show (Kafka's names in comments)."""

    max_dirty_percent: float = 0.0  # max-dirty-percent, of the last pass
    max_clean_time_secs: float = 0.0  # max-clean-time-secs
    recopy_percent: float = 0.0  # cleaner-recopy-percent, of the last round
    rounds: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    uncleanable: set[Key] = field(default_factory=set)  # uncleanable-partitions-count


class LogCleaner:
    """The cleaner of one data directory; `start` on the loop, `stop` before the logs close."""

    def __init__(self, data_dir: str | os.PathLike, logs: Callable[[], Iterable[CleanableLog]], *,
                 executor: Executor, backoff_ms: int, dedupe_buffer_bytes: int,
                 now_ms: Callable[[], int] | None = None) -> None:
        self.checkpoint_path = os.path.join(os.fspath(data_dir), CHECKPOINT_FILE)
        self._logs = logs
        self._executor = executor
        self.backoff_ms = backoff_ms
        self.dedupe_buffer_bytes = dedupe_buffer_bytes
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self.checkpoints: dict[Key, int] = read_checkpoint(self.checkpoint_path)
        self.stats = CleanerStats()
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="oncelog-log-cleaner")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping: its errors were logged
                pass
            self._task = None

    def wake(self) -> None:
        """Look again now (a config change, a test)."""
        self._wake.set()

    def forget(self, key: Key) -> None:
        """A partition deleted or started over: its progress means nothing any more."""
        if self.checkpoints.pop(key, None) is not None:
            self._write_checkpoint()
        self.stats.uncleanable.discard(key)

    async def _run(self) -> None:
        while True:
            try:
                cleaned = await self.clean_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one bad pass must not end the cleaner
                log.exception("log cleaner pass failed")
                cleaned = False
            if not cleaned:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.backoff_ms / 1000)
                except TimeoutError:
                    pass

    async def clean_once(self) -> bool:
        """One pass: clean the dirtiest partition, if any; True if a round ran."""
        now = self._now_ms()
        candidates = []
        for plog in self._logs():
            view = plog.cleaner_view(now)
            if view is None or view.key in self.stats.uncleanable:
                continue
            c = candidate(view, self.checkpoints.get(view.key), now)
            if c is not None:
                candidates.append((c, plog))
        self.stats.max_dirty_percent = 100 * max((c.ratio for c, _ in candidates), default=0.0)
        best = choose(c for c, _ in candidates)
        if best is None:
            return False
        plog = next(p for c, p in candidates if c is best)
        return await self._clean(best, plog, now)

    async def _clean(self, c: Candidate, plog: CleanableLog, now: int) -> bool:
        view = c.view
        topic, index = view.key
        req = RoundRequest(
            directory=view.directory, segments=view.segments, first_dirty=c.first_dirty,
            first_uncleanable=view.first_uncleanable, dedupe_buffer_bytes=self.dedupe_buffer_bytes, now_ms=now,
            delete_retention_ms=view.delete_retention_ms, last_batch_of_producer=view.last_batch_of_producer,
            aborted=view.aborted, segment_bytes=view.segment_bytes, max_index_bytes=view.max_index_bytes,
            index_interval_bytes=view.index_interval_bytes)
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._executor, run_round, req)
        except UncleanableError as exc:
            self.stats.uncleanable.add(view.key)
            log.error("%s-%d: marked uncleanable, not cleaned again until the broker restarts: %s", topic, index, exc)
            return False
        except FileNotFoundError as exc:  # a segment went (retention, truncation) before the worker read it
            log.info("%s-%d: clean given up, the log changed under it (%s); tried again later", topic, index, exc)
            return False
        if not result.groups:
            return False
        if not plog.replace_cleaned(result, view.generation):
            log.info("%s-%d: cleaned segments dropped, the log changed meanwhile; tried again later", topic, index)
            return False
        self.checkpoints[view.key] = result.end_offset
        self._write_checkpoint()
        self._account(result)
        log.info("%s-%d: cleaned offsets %d-%d in %.2f s: %d of %d records kept, %.1f MB read, %.1f MB written "
                 "(dirty ratio %.2f)", topic, index, c.first_dirty, result.end_offset, result.seconds,
                 result.records_kept, result.records_kept + result.records_removed, result.bytes_read / 1e6,
                 result.bytes_written / 1e6, c.ratio)
        return True

    def _account(self, result: RoundResult) -> None:
        stats = self.stats
        stats.rounds += 1
        stats.bytes_read += result.bytes_read
        stats.bytes_written += result.bytes_written
        stats.max_clean_time_secs = max(stats.max_clean_time_secs, result.seconds)
        stats.recopy_percent = 100 * result.bytes_written / result.bytes_read if result.bytes_read else 0.0

    def _write_checkpoint(self) -> None:
        try:
            write_checkpoint(self.checkpoint_path, self.checkpoints)
        except OSError as exc:
            log.error("cleaner checkpoint not written (%s): the next start cleans some segments again", exc)
