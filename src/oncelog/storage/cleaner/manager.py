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
import math
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Protocol

from ..checkpoints import read_checkpoint, write_checkpoint
from ..txn_index import AbortedTxn
from .segment_cleaner import (
    CleanedGroup,
    RoundRequest,
    RoundResult,
    SourceSegment,
    UncleanableError,
    run_round,
)

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "cleaner-offset-checkpoint"
SWAP_CHUNK = 8  # cleaned segments swapped in per turn of the event loop
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
    marker_epoch_of_producer: dict[int, int] = field(default_factory=dict)


class CleanableLog(Protocol):
    """A partition the cleaner may work on (storage.partition.Partition)."""

    def cleaner_view(self, now_ms: int) -> CleanerView | None:
        """None when the partition is not compacted or cannot be cleaned now (offline, being deleted)."""

    def replace_cleaned(self, groups: list[CleanedGroup], generation: int, last: bool) -> int | None:
        """Swap cleaned groups in if the segment list is still at `generation`: the new generation, or None
        (the round's scratch files are dropped then, and after the `last` call)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    view: CleanerView
    first_dirty: int
    ratio: float
    due: bool  # past max.compaction.lag.ms
    compaction_delay_ms: int = 0  # how far past max.compaction.lag.ms (max-compaction-delay-secs)


def candidate(view: CleanerView, checkpoint: int | None, now_ms: int) -> Candidate | None:
    """The partition's standing, or None when it has nothing cleanable."""
    first_dirty = view.log_start if checkpoint is None else max(checkpoint, view.log_start)
    if first_dirty >= view.first_uncleanable:
        return None
    clean = dirty = 0
    first_dirty_timestamp = -1
    for seg in view.segments:
        if seg.next_offset > view.first_uncleanable:
            break
        if seg.next_offset <= first_dirty:
            clean += seg.size
        else:
            if not dirty:
                first_dirty_timestamp = seg.largest_timestamp
            dirty += seg.size
    if dirty == 0:
        return None
    ratio = dirty / (clean + dirty)
    # KIP-354 measures from the dirty section's earliest record; the first dirty segment's largest timestamp
    # bounds it from above, so a partition is due at the latest one segment's time span late.
    due = (view.max_compaction_lag_ms < (1 << 62) and first_dirty_timestamp >= 0
           and now_ms - first_dirty_timestamp > view.max_compaction_lag_ms)
    if ratio < view.min_cleanable_ratio and not due:
        return None
    delay = now_ms - first_dirty_timestamp - view.max_compaction_lag_ms if due else 0
    return Candidate(view, first_dirty, ratio, due, delay)


def choose(candidates: Iterable[Candidate]) -> Candidate | None:
    """The dirtiest; Kafka's order (the ratio), overdue ones included."""
    return max(candidates, key=lambda c: c.ratio, default=None)


@dataclass(slots=True)
class CleanerStats:
    """What the metrics show (broker/metrics.py), with Kafka's meaning: the per-round figures are those of the
    last round of each of the log.cleaner.threads workers, as Kafka's are those of each thread's last clean."""

    max_dirty_percent: float = 0.0  # max-dirty-percent: of the last pass over the logs
    max_compaction_delay_ms: int = 0  # max-compaction-delay-secs: of the rounds the last pass started
    last_pass_monotonic: float = 0.0  # time-since-last-run-ms
    last_rounds: deque[RoundResult] = field(default_factory=lambda: deque(maxlen=1))
    rounds: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    seconds: float = 0.0  # spent in rounds (worker time, throttling included)
    uncleanable: dict[Key, int] = field(default_factory=dict)  # uncleanable-partitions-count / -bytes

    @property
    def max_clean_time_secs(self) -> float:  # max-clean-time-secs
        return max((r.seconds for r in self.last_rounds), default=0.0)

    @property
    def recopy_percent(self) -> float:  # cleaner-recopy-percent: the mean over the workers' last rounds
        ratios = [r.bytes_written / r.bytes_read for r in self.last_rounds if r.bytes_read]
        return 100 * sum(ratios) / len(ratios) if ratios else 0.0

    @property
    def max_buffer_utilization_percent(self) -> float:  # max-buffer-utilization-percent
        return max((100 * r.map_keys / r.map_capacity for r in self.last_rounds if r.map_capacity), default=0.0)


def _die_with_parent(parent: int) -> None:
    """In a worker: exit once the broker is gone. A worker blocked on the executor's queue does not notice a
    SIGKILLed broker by itself, and would otherwise stay behind for good."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="oncelog-cleaner-parent-watch", daemon=True).start()


class LogCleaner:
    """The cleaner of one data directory; `start` on the loop, `stop` before the logs close."""

    def __init__(self, data_dir: str | os.PathLike, logs: Callable[[], Iterable[CleanableLog]], *,
                 workers: int, backoff_ms: int, dedupe_buffer_bytes: int,
                 io_max_bytes_per_second: float = math.inf, now_ms: Callable[[], int] | None = None) -> None:
        self.checkpoint_path = os.path.join(os.fspath(data_dir), CHECKPOINT_FILE)
        self._logs = logs
        self._workers = workers
        self._executor: Executor | None = None  # worker processes, started with the first round
        self.backoff_ms = backoff_ms
        self.dedupe_buffer_bytes = dedupe_buffer_bytes
        self.io_max_bytes_per_second = io_max_bytes_per_second
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self.checkpoints: dict[Key, int] = read_checkpoint(self.checkpoint_path)
        self.stats = CleanerStats(last_rounds=deque(maxlen=workers))
        self._task: asyncio.Task | None = None
        self._running: dict[Key, asyncio.Task] = {}  # rounds in progress, one per partition at most
        self._wake = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="oncelog-log-cleaner")

    async def stop(self) -> None:
        """Stop between rounds or abandon the one in progress (its scratch files go at the next load)."""
        tasks = [t for t in (self._task, *self._running.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # stopping: their errors were logged
        self._task = None
        self._running.clear()
        if self._executor is not None:
            # A round in a worker is abandoned, not waited for (its scratch files go at the next load): the
            # executor keeps no public way to stop a running call, so its processes are terminated.
            for process in list(getattr(self._executor, "_processes", {}).values()):
                process.terminate()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _pool(self) -> Executor:
        if self._executor is None:
            # spawn, not fork: a forked child would inherit the event loop's sockets and the broker's fds.
            self._executor = ProcessPoolExecutor(self._workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_die_with_parent, initargs=(os.getpid(),))
        return self._executor

    def wake(self) -> None:
        """Look again now (a config change, a test)."""
        self._wake.set()

    def forget(self, key: Key) -> None:
        """A partition deleted or started over: its progress means nothing any more."""
        if self.checkpoints.pop(key, None) is not None:
            self._write_checkpoint()
        self.stats.uncleanable.pop(key, None)

    async def _run(self) -> None:
        """Keep up to log.cleaner.threads rounds running, each on another partition (Kafka's cleaner threads);
        look again when one ends, when woken, or after log.cleaner.backoff.ms."""
        while True:
            try:
                self._start_rounds()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one bad pass must not end the cleaner
                log.exception("log cleaner pass failed")
            self._wake.clear()
            waits: list[asyncio.Future] = [asyncio.ensure_future(self._wake.wait()), *self._running.values()]
            try:
                await asyncio.wait(waits, timeout=self.backoff_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waits[0].cancel()

    def _start_rounds(self) -> int:
        """One pass: start a round on each of the dirtiest partitions not being cleaned, while workers are
        free; the number started."""
        for key in [k for k, t in self._running.items() if t.done()]:
            del self._running[key]
        now = self._now_ms()
        candidates = []
        seen: set[Key] = set()
        for plog in self._logs():
            view = plog.cleaner_view(now)
            if view is None:
                continue
            seen.add(view.key)
            if view.key in self.stats.uncleanable or view.key in self._running:
                continue
            c = candidate(view, self.checkpoints.get(view.key), now)
            if c is not None:
                candidates.append((c, plog))
        self.stats.max_dirty_percent = 100 * max((c.ratio for c, _ in candidates), default=0.0)
        self.stats.last_pass_monotonic = time.monotonic()
        self._prune(seen | set(self._running))
        started = 0
        delay = 0
        while candidates and len(self._running) < self._workers:
            best = choose(c for c, _ in candidates)
            assert best is not None
            plog = next(p for c, p in candidates if c is best)
            candidates = [(c, p) for c, p in candidates if c is not best]
            self._running[best.view.key] = asyncio.get_running_loop().create_task(
                self._clean(best, plog, now), name=f"oncelog-clean-{best.view.key[0]}-{best.view.key[1]}")
            started += 1
            delay = max(delay, best.compaction_delay_ms)
        if started:
            self.stats.max_compaction_delay_ms = delay
        return started

    async def _clean(self, c: Candidate, plog: CleanableLog, now: int) -> bool:
        view = c.view
        topic, index = view.key
        req = RoundRequest(
            directory=view.directory, segments=view.segments, first_dirty=c.first_dirty,
            first_uncleanable=view.first_uncleanable, dedupe_buffer_bytes=self.dedupe_buffer_bytes, now_ms=now,
            delete_retention_ms=view.delete_retention_ms, last_batch_of_producer=view.last_batch_of_producer,
            aborted=view.aborted, segment_bytes=view.segment_bytes, max_index_bytes=view.max_index_bytes,
            index_interval_bytes=view.index_interval_bytes,
            io_max_bytes_per_second=self.io_max_bytes_per_second / self._workers,
            marker_epoch_of_producer=view.marker_epoch_of_producer)
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._pool(), run_round, req)
        except UncleanableError as exc:
            self.stats.uncleanable[view.key] = sum(s.size for s in view.segments)
            log.error("%s-%d: marked uncleanable, not cleaned again until the broker restarts: %s", topic, index, exc)
            return False
        except FileNotFoundError as exc:  # a segment went (retention, truncation) before the worker read it
            log.info("%s-%d: clean given up, the log changed under it (%s); tried again later", topic, index, exc)
            return False
        except BrokenProcessPool as exc:  # a worker died (killed, out of memory): new workers next round
            log.error("%s-%d: the cleaner's worker process died (%s); tried again later", topic, index, exc)
            self._executor = None
            return False
        except Exception:  # noqa: BLE001 - a bug or an I/O error of one round must not stop the others
            self.stats.uncleanable[view.key] = sum(s.size for s in view.segments)
            log.exception("%s-%d: cleaning failed; marked uncleanable until the broker restarts", topic, index)
            return False
        if not result.groups:
            return False
        # SWAP_CHUNK groups at a time, the loop free in between: a chunk costs its renames and five fsyncs
        # (2-4 ms for eight here), and a first round over a dirty log has a group per source segment, hundreds
        # for a big log.
        generation: int | None = view.generation
        swapped_to = None
        longest_swap_ms = 0.0
        groups = list(result.groups)
        for i in range(0, len(groups), SWAP_CHUNK):
            chunk = groups[i:i + SWAP_CHUNK]
            swap_started = time.perf_counter()
            try:
                generation = plog.replace_cleaned(chunk, generation, last=i + SWAP_CHUNK >= len(groups))
            except Exception:  # noqa: BLE001 - the log went offline (its own error says why); others go on
                log.exception("%s-%d: swapping in the cleaned segments failed", topic, index)
                generation = None
            held = time.perf_counter() - swap_started
            longest_swap_ms = max(longest_swap_ms, held * 1000)
            if generation is None:
                break
            swapped_to = chunk[-1].next_offset
            # As long again with the loop free: back to back, the chunks of a big round held the loop nine
            # tenths of the time, and a produce request needs several turns of it (measured: p99 178 ms,
            # max 214 ms while a 271 MB round swapped in, against 9 ms without a clean).
            await asyncio.sleep(min(held, 0.05))
        if swapped_to is None:
            log.info("%s-%d: cleaned segments dropped, the log changed meanwhile; tried again later", topic, index)
            return False
        if generation is None:  # the log changed after some groups: those are clean, the rest is again later
            log.info("%s-%d: the log changed during the swap; clean up to offset %d, the rest again later",
                     topic, index, swapped_to)
        end = result.end_offset if generation is not None else swapped_to
        self.checkpoints[view.key] = max(end, self.checkpoints.get(view.key, 0))
        self._write_checkpoint()
        self._account(result)
        log.info("%s-%d: cleaned offsets %d-%d in %.2f s: %d of %d records kept, %.1f MB read, %.1f MB written "
                 "(dirty ratio %.2f; %d segments swapped in, at most %.1f ms a chunk on the event loop%s)", topic,
                 index, c.first_dirty, end, result.seconds, result.records_kept,
                 result.records_kept + result.records_removed, result.bytes_read / 1e6, result.bytes_written / 1e6,
                 c.ratio, len(result.groups), longest_swap_ms,
                 f", {result.throttled_seconds:.2f} s throttled" if result.throttled_seconds >= 0.01 else "")
        return True

    def _prune(self, seen: set[Key]) -> None:
        """Progress of partitions gone or no longer compacted means nothing: a topic of the same name made
        later starts from its log start."""
        gone = [key for key in self.checkpoints if key not in seen]
        for key in gone:
            del self.checkpoints[key]
        if gone:
            self._write_checkpoint()

    def _account(self, result: RoundResult) -> None:
        stats = self.stats
        stats.rounds += 1
        stats.bytes_read += result.bytes_read
        stats.bytes_written += result.bytes_written
        stats.seconds += result.seconds
        stats.last_rounds.append(result)

    def _write_checkpoint(self) -> None:
        try:
            write_checkpoint(self.checkpoint_path, self.checkpoints)
        except OSError as exc:
            log.error("cleaner checkpoint not written (%s): the next start cleans some segments again", exc)
