"""Produce latency at a fixed offered rate, the measurement bench/cluster.py and bench/produce_fetch.py share.

Throughput runs saturate the broker, so their per-message latency is mostly queueing behind the run itself. A
paced run offers a fixed rate well under capacity (the issue's figure: 10 MB/s of 1 KiB records) and reports
what a producer at that rate waits, per message, two ways: librdkafka's own figure (msg.latency(): from
produce() until the client library has the broker's acknowledgement, as rdkafka_performance reports it), and
the application's (until the Python delivery callback runs, which adds this script's own poll loop: on a
loaded two-core machine that loop is a few milliseconds of the figure). The first second is warm-up
(connections, metadata, the first fsync of fresh segments) and is not counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Producer

RECORD = 1024


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def paced_produce(settings: Mapping[str, Any], topic: str, partitions: int, rate_mb: float, seconds: float,
                  warmup_s: float = 1.0, samples: list[tuple[float, float]] | None = None) -> dict[str, Any]:
    """Produce 1 KiB records round-robin over `partitions` at `rate_mb` MB/s for `seconds` (+ warm-up) with a
    confluent-kafka producer built from `settings`; latency percentiles in ms. `samples`, when given, gets
    (perf_counter at produce(), librdkafka's latency in s) of every measured record, for a figure over a part
    of the run."""
    producer = Producer(dict(settings))
    latencies: list[float] = []
    acked: list[float] = []
    errors = [0]
    start = time.perf_counter()
    measure_from = start + warmup_s

    def make_cb(sent: float) -> Callable[[Any, Any], None]:
        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                errors[0] += 1
            elif sent >= measure_from:
                latencies.append(time.perf_counter() - sent)
                acked.append(msg.latency())
                if samples is not None:
                    samples.append((sent, msg.latency()))
        return delivered

    value = b"x" * RECORD
    per_s = rate_mb * 1e6 / RECORD
    total = int(per_s * (seconds + warmup_s))
    sent = 0
    while sent < total:
        now = time.perf_counter()
        due = min(total, int((now - start) * per_s) + 1)
        while sent < due:
            producer.produce(topic, value, partition=sent % partitions, on_delivery=make_cb(now))
            sent += 1
        producer.poll(0.001)
    left = producer.flush(120)
    elapsed = time.perf_counter() - start

    def ms(values: list[float], q: float) -> float | None:
        value = percentile(values, q)
        return None if value is None else value * 1000

    return {"records": sent, "offered_mb_per_s": sent * RECORD / elapsed / 1e6,
            "p50_ms": ms(acked, 0.5), "p99_ms": ms(acked, 0.99), "p999_ms": ms(acked, 0.999), "max_ms": ms(acked, 1.0),
            "over_30ms": sum(1 for value in acked if value > 0.030),
            "callback_p50_ms": ms(latencies, 0.5), "callback_p99_ms": ms(latencies, 0.99),
            "errors": errors[0], "undelivered": left}
