"""The event loop's own health: how late it runs what is due, and what it was doing when it stalled (issue 24).

Everything the broker serves runs on one event loop, so anything that holds it (a garbage collection, a checkpoint
written on the loop, a long synchronous step of a handler or a periodic job) delays every request at once: a
produce acknowledged 100 ms late, at the p99.9 a user with a latency SLO sees. This room makes such stalls visible
and attributable, as a user would want to see them and as the latency work needs them:

- a heartbeat on the loop every `interval` measures how late the loop runs a callback that was due (the lag), into
  the `oncelog_event_loop_lag_seconds` histogram;
- a watchdog thread wakes when a heartbeat is overdue by `threshold` and records the loop thread's stack at that
  moment (`sys._current_frames`: the frame the loop is stuck in, not the frame that notices), so the stall's
  WARNING line, written by the loop once it runs again, names the code that held it;
- garbage collections are timed through `gc.callbacks` into `oncelog_gc_pause_seconds` by generation, and a stall
  that a collection overlapped says so, since a collection's stack shows only where it happened to start.

Costs: one callback on the loop per interval (10 ms), one watchdog wake-up per threshold without a stall, and two
clock readings per garbage collection.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback
from typing import Any

log = logging.getLogger("oncelog.loop")

LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_STACK_FRAMES = 12  # innermost frames of the stalled loop's stack put in the log line


def _loop_frames(frame: Any) -> list[str]:
    """The stack of the stalled loop from the callback the loop ran (asyncio's own frames above it left out), its
    innermost `_STACK_FRAMES` frames, formatted."""
    summary = traceback.extract_stack(frame)
    start = 0
    for i, entry in enumerate(summary):
        if entry.filename.endswith(("asyncio/events.py", "asyncio\\events.py")) and entry.name == "_run":
            start = i + 1
    kept = summary[start:][-_STACK_FRAMES:] or summary[-_STACK_FRAMES:]
    return traceback.StackSummary.from_list(kept).format()


class LoopMonitor:
    """Lag histogram, stall log lines with the stalled stack, and GC pauses, for the loop it is started on."""

    def __init__(self, metrics: Any, threshold_ms: int, interval_ms: int = 10) -> None:
        self.metrics = metrics
        self.threshold = threshold_ms / 1000
        self.interval = interval_ms / 1000
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._handle: asyncio.TimerHandle | None = None
        self._last_beat = 0.0  # time.monotonic() of the last heartbeat run
        self._beats = 0
        self._stack: tuple[int, float, list[str]] | None = None  # (beat it belongs to, stalled s, frames)
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._gc_started = 0.0
        self._gc_children: dict[int, Any] = {}
        self._gc_recent: list[tuple[float, float, int]] = []  # (end monotonic, seconds, generation), newest last
        self.stalls = 0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._last_beat = time.monotonic()
        self._handle = loop.call_later(self.interval, self._beat, loop.time() + self.interval)
        gc.callbacks.append(self._on_gc)
        if self.threshold > 0:
            self._watchdog = threading.Thread(target=self._watch, name="oncelog-loop-watchdog", daemon=True)
            self._watchdog.start()

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._watchdog is not None:
            self._watchdog.join(timeout=5)
            self._watchdog = None

    # -- on the loop ------------------------------------------------------------------------------------------------
    def _beat(self, due: float) -> None:
        loop = self._loop
        if loop is None or self._stop.is_set():
            return
        lag = max(0.0, loop.time() - due)
        self.metrics.loop_lag.observe(lag)
        now = time.monotonic()
        stack, self._stack = self._stack, None
        if self.threshold > 0 and lag >= self.threshold:
            self.stalls += 1
            self.metrics.loop_stalls.inc()
            self._report(lag, now, stack if stack is not None and stack[0] == self._beats else None)
        self._beats += 1
        self._last_beat = now
        self._handle = loop.call_later(self.interval, self._beat, loop.time() + self.interval)

    def _report(self, lag: float, now: float, stack: tuple[int, float, list[str]] | None) -> None:
        gcs = [(seconds, generation) for end, seconds, generation in self._gc_recent if end >= now - lag]
        gc_text = ("; garbage collection during it: " + ", ".join(f"generation {g} {s * 1000:.1f} ms"
                                                                    for s, g in gcs)) if gcs else ""
        where = ("; the loop was in (innermost last):\n" + "".join(stack[2])) if stack is not None else ""
        log.warning("event loop stalled %.1f ms (oncelog.loop.stall.threshold.ms=%d)%s%s", lag * 1000,
                    int(self.threshold * 1000), gc_text, where.rstrip("\n"))

    # -- the watchdog thread ----------------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.is_set():
            overdue_at = self._last_beat + self.interval + self.threshold
            wait = overdue_at - time.monotonic()
            if wait > 0:
                self._stop.wait(wait)
                continue
            beat = self._beats
            if self._stack is None or self._stack[0] != beat:
                frame = sys._current_frames().get(self._loop_thread)
                if frame is not None:
                    self._stack = (beat, time.monotonic() - self._last_beat, _loop_frames(frame))
            # the same stall is captured once; look again after the next heartbeat (or a threshold later)
            while not self._stop.is_set() and self._beats == beat:
                self._stop.wait(self.threshold / 2)

    # -- garbage collections (on whichever thread collects) ---------------------------------------------------------
    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        seconds = time.perf_counter() - self._gc_started
        generation = info.get("generation", 0)
        child = self._gc_children.get(generation)
        if child is None:
            child = self._gc_children[generation] = self.metrics.gc_pause.labels(str(generation))
        child.observe(seconds)
        if seconds >= 0.001:
            recent = self._gc_recent
            recent.append((time.monotonic(), seconds, generation))
            if len(recent) > 32:
                del recent[:16]
