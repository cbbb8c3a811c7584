"""`file.delete.delay.ms`: files renamed `.deleted` are unlinked that much later, by one thread of the process.

A timer thread per deleted segment (what this replaced) cost a thread start on the caller's path, the event loop,
for every segment a retention pass or a cleaner swap removes: about half a millisecond each, 4-6 ms for a chunk of
eight swapped segments. One long-lived thread with a heap of due times costs a heap push.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time

_lock = threading.Condition()
_due: list[tuple[float, int, list[str]]] = []
_order = itertools.count()
_thread: threading.Thread | None = None


def schedule(paths: list[str], delay_s: float) -> None:
    """Unlink `paths` after `delay_s` seconds (quietly: a file already gone is fine)."""
    global _thread
    with _lock:
        heapq.heappush(_due, (time.monotonic() + delay_s, next(_order), list(paths)))
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="oncelog-delayed-unlink", daemon=True)
            _thread.start()
        _lock.notify()


def _run() -> None:
    while True:
        with _lock:
            while not _due or _due[0][0] > time.monotonic():
                _lock.wait(None if not _due else _due[0][0] - time.monotonic())
            _at, _n, paths = heapq.heappop(_due)
        for path in paths:
            try:
                os.unlink(path)
            except OSError:
                pass
