"""The cleaner's throttle (log.cleaner.io.max.bytes.per.second) on a fake clock."""

from __future__ import annotations

import math

from oncelog.storage.cleaner.throttler import CHECK_INTERVAL_S, Throttler


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_bytes_faster_than_the_rate_are_slowed_to_it():
    clock = FakeClock()
    t = Throttler(1000.0, clock=clock, sleep=clock.sleep)
    for _ in range(50):  # 5,000 bytes with no time passing: 5 s at 1,000 bytes/s
        t.account(100)
    assert math.isclose(clock.now, 5.0, rel_tol=0.05)
    assert math.isclose(t.slept, clock.now)


def test_bytes_slower_than_the_rate_never_sleep():
    clock = FakeClock()
    t = Throttler(1000.0, clock=clock, sleep=clock.sleep)
    for _ in range(20):
        clock.now += CHECK_INTERVAL_S
        t.account(50)  # 500 bytes/s
    assert clock.sleeps == [] and t.slept == 0.0


def test_the_default_rate_is_no_limit():
    clock = FakeClock()
    t = Throttler(1.7976931348623157e308, clock=clock, sleep=clock.sleep)
    t.account(1 << 40)
    assert t.unlimited and clock.sleeps == []
