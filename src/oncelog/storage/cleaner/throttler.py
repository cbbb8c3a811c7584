"""`log.cleaner.io.max.bytes.per.second` inside a worker process.

Kafka's cleaner threads share one throttler over the bytes they read and write. Here each round runs in a
worker process of its own, so the rate is split evenly between the `log.cleaner.threads` workers (the manager
passes each round its share): the cleaner as a whole never goes faster than the key says, and one busy worker
alone goes at its share, which is the cost of not sharing state between processes.

The check is coarse on purpose (every `CHECK_INTERVAL_S` of work at most): sleeping per batch would cost more
than the copy it slows down.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

CHECK_INTERVAL_S = 0.1


class Throttler:
    """Sleeps when the bytes counted since the last check went faster than `rate` bytes a second."""

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._period_start = clock()
        self._period_bytes = 0
        self.slept = 0.0  # seconds, for the round's result

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.rate) or self.rate >= 1e300

    def account(self, nbytes: int) -> None:
        if self.unlimited:
            return
        self._period_bytes += nbytes
        elapsed = self._clock() - self._period_start
        if elapsed < CHECK_INTERVAL_S and self._period_bytes < self.rate * CHECK_INTERVAL_S:
            return
        due = self._period_bytes / self.rate
        if due > elapsed:
            self._sleep(due - elapsed)
            self.slept += due - elapsed
        self._period_start = self._clock()
        self._period_bytes = 0
