"""broker/loop_monitor.py on a real event loop: the lag it measures, the stalled stack it names, the GC it sees."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from oncelog.broker.loop_monitor import LoopMonitor
from oncelog.broker.metrics import BrokerMetrics


def _sample(metrics: BrokerMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels or None)
    return value or 0.0


def a_job_that_holds_the_loop() -> None:
    time.sleep(0.12)


def a_job_that_collects() -> None:
    garbage = [[i] for i in range(200_000)]
    for item in garbage:
        item.append(item)  # cycles: only the collector frees them
    del garbage
    gc.collect()


async def _run(monitor: LoopMonitor, job) -> None:
    monitor.start()
    try:
        await asyncio.sleep(0.05)
        asyncio.get_running_loop().call_soon(job)
        await asyncio.sleep(0.2)
    finally:
        monitor.stop()


def test_a_stall_is_logged_with_the_stack_that_held_the_loop(caplog):
    metrics = BrokerMetrics()
    monitor = LoopMonitor(metrics, threshold_ms=40)
    with caplog.at_level(logging.WARNING, logger="oncelog.loop"):
        asyncio.run(_run(monitor, a_job_that_holds_the_loop))
    stalls = [r.getMessage() for r in caplog.records if "event loop stalled" in r.getMessage()]
    assert len(stalls) == 1, stalls
    assert "a_job_that_holds_the_loop" in stalls[0] and "time.sleep(0.12)" in stalls[0]
    assert _sample(metrics, "oncelog_event_loop_stalls_total") == 1
    assert _sample(metrics, "oncelog_event_loop_lag_seconds_count") >= 10
    # the one stall is in the 0.1-0.2 s bucket, every other heartbeat far below it
    assert _sample(metrics, "oncelog_event_loop_lag_seconds_bucket", le="0.2") - \
        _sample(metrics, "oncelog_event_loop_lag_seconds_bucket", le="0.1") == 1


def test_a_stall_names_the_garbage_collection_in_it(caplog):
    metrics = BrokerMetrics()
    monitor = LoopMonitor(metrics, threshold_ms=20)
    with caplog.at_level(logging.WARNING, logger="oncelog.loop"):
        asyncio.run(_run(monitor, a_job_that_collects))
    stalls = [r.getMessage() for r in caplog.records if "event loop stalled" in r.getMessage()]
    assert stalls and "garbage collection during it: generation 2" in stalls[0], stalls
    assert _sample(metrics, "oncelog_gc_pause_seconds_count", generation="2") >= 1
    assert gc.callbacks.count(monitor._on_gc) == 0  # stop() took its callback out


def test_no_stall_no_line(caplog):
    metrics = BrokerMetrics()
    monitor = LoopMonitor(metrics, threshold_ms=200)
    with caplog.at_level(logging.WARNING, logger="oncelog.loop"):
        asyncio.run(_run(monitor, lambda: time.sleep(0.01)))
    assert not [r for r in caplog.records if "event loop stalled" in r.getMessage()]
    assert _sample(metrics, "oncelog_event_loop_stalls_total") == 0
