"""Group commit: one fsync round covers every partition and connection that wrote since the previous round.

An fsync costs about the same for one batch as for a thousand, so waiters never trigger an fsync of their own:
they mark their log dirty and wait for the high watermark to pass their offset. The flusher takes the
flush targets of all dirty logs (on the loop thread, so the snapshot is consistent), runs every fdatasync in
ONE worker-thread call (fsync releases the GIL; the loop keeps serving and its writes go into the next round),
then moves the high watermarks, wakes the waiters and tells the broker (long-poll fetches).

With `oncelog.fsync.threads` = N > 1, up to N rounds run at once, each on a thread of its own, and a log is in
at most one of them: a log that turns dirty while other logs' round is in flight starts its own round at once
instead of waiting for that round to end (at 10 MB/s that wait was half a round, about 0.6 ms, on every
request). A log dirty again during its own round waits for that round, as it must: `flush_targets` and
`mark_flushed` pair up one round at a time per log.

An fsync error takes the log offline: after a failed fsync Linux may have dropped the dirty pages, so a retry
that "succeeds" would acknowledge data that is gone. Waiters get KAFKA_STORAGE_ERROR.

Waiters wait for the high watermark. On a single node a round moves it (it is the durable end). A replicated
log's round moves only its durable end: `on_high_watermark` still fires after every round, so the replica
manager can recompute the high watermark from the replicas' durable ends, and after `set_high_watermark` it
calls `high_watermark_moved` to wake the waiters (acks=all then means: durable on the in-sync replicas).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

from ..errors import ErrorCode, KafkaError
from . import fault_injection
from .syncfs import sync_filesystems
from .writeback import start_writeback

if TYPE_CHECKING:
    from .partition_log import FlushTargets, PartitionLog

log = logging.getLogger(__name__)


def _sync_group(fds: list[int], dir_fds: list[int]) -> OSError | None:
    """fdatasync a log's files, fsync its directories, close every fd; the error, if any."""
    error: OSError | None = None
    try:
        fault_injection.check_fsync()
        for fd in fds:
            os.fdatasync(fd)
        for fd in dir_fds:
            os.fsync(fd)
    except OSError as exc:
        error = exc
    finally:
        for fd in (*fds, *dir_fds):
            try:
                os.close(fd)
            except OSError:
                pass
    return error


def _sync_all(groups: list[tuple[list[int], list[int]]], seconds: list[float] | None = None,
              use_syncfs: bool = False) -> list[OSError | None]:
    """Flush thread: every group (log) of one round synced one after the other, one result per group. With more
    than one file to sync, all their writebacks are started first (storage/writeback.py): one journal commit
    for the round instead of one per file. With `use_syncfs` (oncelog.fsync.method=syncfs) and more than one
    file, one syncfs per filesystem does it all (storage/syncfs.py); on its error every file is fdatasynced
    after all, so each log learns its own. `seconds`, if given, gets the disk's time: the round-wide calls
    (writeback start or syncfs), then each group's syncs (the evidence a slow round's log line gives, per round
    and never per record)."""
    clock = time.perf_counter
    started = clock()
    all_fds = [fd for fds, dir_fds in groups for fd in (*fds, *dir_fds)]
    if use_syncfs and len(all_fds) > 1 and _syncfs_round(all_fds):
        for fd in all_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        if seconds is not None:
            seconds.append(clock() - started)
            seconds.extend(0.0 for _ in groups)
        return [None] * len(groups)
    data_fds = [fd for fds, _ in groups for fd in fds]
    if len(data_fds) > 1:
        start_writeback(data_fds)
    results: list[OSError | None] = []
    if seconds is not None:
        seconds.append(clock() - started)
    for fds, dir_fds in groups:
        began = clock()
        results.append(_sync_group(fds, dir_fds))
        if seconds is not None:
            seconds.append(clock() - began)
    return results


def _syncfs_round(fds: list[int]) -> bool:
    """True when one syncfs per filesystem made every fd durable; False sends the round to per-file syncs."""
    try:
        fault_injection.check_fsync()
    except OSError:
        return False  # the per-file syncs fail too, each for its own log
    return sync_filesystems(fds) is None


class FlushRound(NamedTuple):
    """How long one round took, for the metrics and the slow-round log line. `round_s` runs from the hand-off to
    the flush thread until the results are back on the loop; `disk_s` is the flush thread's own time in the
    kernel's writeback and syncs, so `round_s - disk_s` is what the hand-offs and a busy loop added."""

    round_s: float
    disk_s: float
    files: int
    slowest: str  # the log whose syncs took longest
    slowest_s: float


class GroupCommitFlusher:
    """One per broker. `start()` inside the running loop, `await stop()` before closing the logs."""

    def __init__(
        self,
        fsync_enabled: bool = True,
        on_high_watermark: Callable[[PartitionLog], None] | None = None,
        executor: Executor | None = None,
        sync_threads: int = 1,
        on_round: Callable[[FlushRound], None] | None = None,
        slow_round_ms: int = 0,
        use_syncfs: bool = False,
    ) -> None:
        self.fsync_enabled = fsync_enabled
        # oncelog.fsync.method=syncfs (the caller checked storage/syncfs.py `supported()`)
        self.use_syncfs = use_syncfs
        # Every round's timing (the broker's oncelog_fsync_round_seconds), and the rounds logged as slow: with
        # fsync before the ack, a round is the floor of every acks=all answer it covers, so a latency tail the
        # event loop's monitor does not explain shows up here, split into the disk's time and the rest.
        self.on_round = on_round
        self.slow_round_s = slow_round_ms / 1000
        self.on_high_watermark = on_high_watermark
        self._executor = executor
        self._own_executor: ThreadPoolExecutor | None = None
        # oncelog.fsync.threads: how many rounds may be in flight at once (each on its own thread)
        self.sync_threads = max(1, sync_threads)
        self._dirty: dict[PartitionLog, None] = {}  # insertion-ordered set
        self._in_flight: set[PartitionLog] = set()  # logs whose round runs now
        self._running = 0  # rounds handed to a flush thread and not yet finished on the loop
        self._waiters: dict[PartitionLog, list[tuple[int, int, asyncio.Future]]] = {}
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False  # a `_start_rounds` call is due on the loop
        self._stopping = False
        self._drained: asyncio.Event | None = None  # set by the last round's end once stop() asked
        # Counters for metrics and tests: fsync rounds run (each one worker-thread call) and fds synced.
        self.rounds = 0
        self.synced_fds = 0

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._scheduled = False  # a call left on a loop that stopped (a flusher started again) runs nowhere
        if self._executor is None:
            # Threads of their own: fsyncs never queue behind other run_in_executor work.
            self._own_executor = ThreadPoolExecutor(max_workers=self.sync_threads, thread_name_prefix="oncelog-fsync")
            self._executor = self._own_executor
        if self._dirty:
            self._schedule()

    async def stop(self) -> None:
        """Finish the rounds that are due, then stop. Waiters still pending afterwards get an error."""
        if self._loop is None:
            return
        self._stopping = True
        self._drained = asyncio.Event()
        self._schedule()
        try:
            await self._drained.wait()
        finally:
            self._loop = None
            self._drained = None
            if self._own_executor is not None:
                self._own_executor.shutdown(wait=False)
                self._own_executor = self._executor = None
        for plog in list(self._waiters):
            self._fail(plog, KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "The broker is shutting down"))

    # -- API for the produce path ------------------------------------------------------------------------------
    def mark_dirty(self, plog: PartitionLog) -> None:
        """`plog` has appended bytes (or new/deleted segment files) that the next round must make durable."""
        self._dirty[plog] = None
        self._schedule()

    async def wait_durable(self, plog: PartitionLog, offset: int) -> None:
        """Return once `plog`'s high watermark is >= `offset` (pass the batch's last offset + 1): durable here,
        and for a replicated log durable on the in-sync replicas."""
        if plog.high_watermark >= offset:
            return
        if plog.offline_reason is not None:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"Log {plog.name} is offline: {plog.offline_reason}")
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters.setdefault(plog, []), (offset, next(self._seq), future))
        if plog.dirty:  # otherwise the round in flight already covers everything appended
            self.mark_dirty(plog)
        await future

    def high_watermark_moved(self, plog: PartitionLog) -> None:
        """The owner of a replicated log moved its high watermark: wake the waiters it now covers. (A single
        node's rounds do this themselves.)"""
        self._wake(plog)
        if plog in self._dirty:
            self._schedule()

    def forget(self, plog: PartitionLog, error: KafkaError | None = None) -> None:
        """`plog` is gone (topic deleted): drop it and fail its waiters."""
        self._dirty.pop(plog, None)
        self._fail(plog, error or KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{plog.name} was deleted"))

    # -- rounds ----------------------------------------------------------------------------------------------
    # Callbacks on the loop, not a task: a task would cost a loop iteration to wake the flusher, one to start
    # the round's task and one to resume it after the thread, each behind every other callback that is ready
    # under load. Here an append's `_schedule` starts the round in the next iteration (so the appends of one
    # iteration share it), and the thread's result is handled, the waiters woken and the next round handed to
    # the thread in one callback.
    def _schedule(self) -> None:
        if self._loop is None or self._scheduled:
            return
        self._scheduled = True
        self._loop.call_soon(self._start_rounds_guarded)

    def _start_rounds_guarded(self) -> None:
        self._scheduled = False
        if self._loop is None:  # stopped: a round finishing late starts no other
            return
        try:
            self._start_rounds()
        except Exception:  # a bug must not stop durability for everyone else
            log.exception("starting a flush round failed")
        if self._stopping and self._drained is not None and not self._running and not self._dirty:
            self._drained.set()

    def _start_rounds(self) -> None:
        """Start a round for the dirty logs that are not in flight, while a thread is free."""
        while self._running < self.sync_threads:
            logs = [plog for plog in self._dirty if plog not in self._in_flight]
            if not logs:
                return
            for plog in logs:
                del self._dirty[plog]
            # The flush targets now, as the logs leave the dirty set: a waiter that comes before the round's
            # thread runs then finds its log clean, not dirty again for an empty second round.
            work = self._prepare(logs)
            if not work:
                continue
            self._in_flight.update(plog for plog, _ in work)
            self._running += 1
            self._hand_off(work)

    def _prepare(self, logs: list[PartitionLog]) -> list[tuple[PartitionLog, FlushTargets]]:
        work: list[tuple[PartitionLog, FlushTargets]] = []
        for plog in logs:
            if plog.offline_reason is not None:
                self._fail_offline(plog)
                continue
            try:
                work.append((plog, plog.flush_targets()))
            except OSError as exc:
                plog.mark_offline(f"could not prepare fsync: {exc}")
                self._fail_offline(plog)
        return work

    def _hand_off(self, work: list[tuple[PartitionLog, FlushTargets]]) -> None:
        """Give the round to a flush thread; its end comes back as one `_finish` callback on the loop."""
        loop = self._loop
        assert loop is not None
        groups = [(targets.fds, targets.dir_fds) for _, targets in work]
        if not any(fds or dir_fds for fds, dir_fds in groups):
            loop.call_soon(self._finish, work, [None] * len(work), None)
            return
        self.rounds += 1
        self.synced_fds += sum(len(fds) + len(dir_fds) for fds, dir_fds in groups)
        seconds: list[float] = []
        began = time.perf_counter()

        def back_on_the_loop(done: Future) -> None:
            try:
                loop.call_soon_threadsafe(self._finish, work, done, (began, seconds))
            except RuntimeError:  # the loop is closed (the broker ended without stop()): nothing to tell
                pass

        try:
            future = self._executor.submit(_sync_all, groups, seconds, self.use_syncfs)  # type: ignore[union-attr]
        except Exception as exc:  # the call never ran (executor gone): nothing is known to be durable
            for _, targets in work:
                targets.close()
            loop.call_soon(self._finish, work, [OSError(f"fsync could not run: {exc!r}")] * len(work), None)
            return
        future.add_done_callback(back_on_the_loop)

    def _finish(self, work: list[tuple[PartitionLog, FlushTargets]], outcome: Future | list[OSError | None],
                timing: tuple[float, list[float]] | None) -> None:
        """On the loop: a round is over. Move the logs' durable ends, wake their waiters, start the next round."""
        try:
            if isinstance(outcome, Future):
                try:
                    errors: list[OSError | None] = outcome.result()
                except Exception as exc:  # the sync call itself failed: nothing is known to be durable
                    errors = [OSError(f"fsync failed: {exc!r}")] * len(work)
            else:
                errors = outcome
            if timing is not None:
                self._timed(work, time.perf_counter() - timing[0], timing[1])
            for (plog, targets), error in zip(work, errors, strict=True):
                if error is not None:
                    plog.mark_offline(f"fsync failed: {error}")
                    self._fail_offline(plog)
                    continue
                plog.mark_flushed(targets.end_offset)
                self._wake(plog)
                if self.on_high_watermark is not None:
                    try:
                        self.on_high_watermark(plog)
                    except Exception:
                        log.exception("high watermark callback failed for %s", plog.name)
        except Exception:  # a bug must not stop durability for everyone else
            log.exception("flush round failed")
        finally:
            self._in_flight.difference_update(plog for plog, _ in work)
            self._running -= 1
        # Its logs may be dirty again, and a thread is free: the next round now, in this same callback.
        self._start_rounds_guarded()

    def _timed(self, work: list[tuple[PartitionLog, FlushTargets]], round_s: float, seconds: list[float]) -> None:
        """Report a finished round (`seconds`: the writeback start, then each log's syncs, from `_sync_all`)."""
        if len(seconds) != len(work) + 1:
            return
        per_log = seconds[1:]
        slowest = max(range(len(work)), key=per_log.__getitem__)
        by_syncfs = not any(per_log)  # one syncfs did the round: no log's syncs of its own
        timing = FlushRound(round_s, sum(seconds), sum(len(t.fds) + len(t.dir_fds) for _, t in work),
                            "" if by_syncfs else work[slowest][0].name, per_log[slowest])
        if self.on_round is not None:
            try:
                self.on_round(timing)
            except Exception:
                log.exception("flush round callback failed")
        if self.slow_round_s and round_s >= self.slow_round_s:
            detail = (f"one syncfs for the round {seconds[0] * 1000:.1f} ms" if by_syncfs else
                      f"writeback start {seconds[0] * 1000:.1f} ms, slowest log {timing.slowest} "
                      f"{timing.slowest_s * 1000:.1f} ms")
            log.warning("fsync round took %.1f ms: the disk %.1f ms (%s), %d files of %d logs; every acks=all "
                        "answer it covers waited for it", round_s * 1000, timing.disk_s * 1000, detail,
                        timing.files, len(work))

    def _wake(self, plog: PartitionLog) -> None:
        heap = self._waiters.get(plog)
        if not heap:
            return
        hw = plog.high_watermark
        while heap and heap[0][0] <= hw:
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_result(None)
        if not heap:
            del self._waiters[plog]
        elif plog.dirty:
            # Waiters beyond what this round covered: their bytes arrived during the fsync.
            self._dirty.setdefault(plog, None)

    def _fail_offline(self, plog: PartitionLog) -> None:
        self._fail(plog, KafkaError(ErrorCode.KAFKA_STORAGE_ERROR,
                                    f"Log {plog.name} is offline: {plog.offline_reason}"))

    def _fail(self, plog: PartitionLog, error: KafkaError) -> None:
        for _, _, future in self._waiters.pop(plog, []):
            if not future.done():
                future.set_exception(KafkaError(error.code, error.message))
