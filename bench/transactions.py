"""Transactional produce throughput and the cost of a commit, with confluent-kafka (librdkafka).

For each mode a fresh broker (fsync on) and a 4-partition topic: 1 KiB records for
`--seconds` seconds with acks=all, either idempotent only, or transactional with a
commit every 100 ms / 1 s. Reports MB/s and records/s (median of `--runs`), and the
p50/p99 latency of `commit_transaction()` (EndTxn plus the flush it waits for).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.paced import RECORD, percentile  # noqa: E402

from oncelog.embedded import BrokerProcess  # noqa: E402

PARTITIONS = 4
# acks=all, idempotent; a batch of up to 1 MB and a 256 MiB queue so produce() rarely waits for space.
PRODUCER = {"acks": "all", "linger.ms": 5, "enable.idempotence": True, "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 262_144}


def transactional_produce(settings: Mapping[str, Any], topic: str, partitions: int, seconds: float,
                          txn_interval: float | None, transactional_id: str = "bench") -> dict[str, Any]:
    """Produce 1 KiB records round-robin over `partitions` for `seconds` with a confluent-kafka producer built
    from `settings` (bootstrap.servers and anything to add or override) plus PRODUCER; with `txn_interval`,
    inside transactions committed every `txn_interval` s. bench/cluster.py's `transactions` runs this loop too."""
    conf: dict[str, Any] = {**PRODUCER, **settings}
    if txn_interval is not None:
        conf["transactional.id"] = transactional_id
    producer = Producer(conf)
    value = b"x" * RECORD
    commits: list[float] = []
    sent = 0
    if txn_interval is not None:
        producer.init_transactions(30)
        producer.begin_transaction()
    started = time.perf_counter()
    last_commit = started
    while time.perf_counter() - started < seconds:
        for _ in range(1000):
            try:
                producer.produce(topic, value, partition=sent % partitions)
                sent += 1
            except BufferError:
                producer.poll(0.005)
        producer.poll(0)
        now = time.perf_counter()
        if txn_interval is not None and now - last_commit >= txn_interval:
            t0 = time.perf_counter()
            producer.commit_transaction(60)
            commits.append(time.perf_counter() - t0)
            producer.begin_transaction()
            last_commit = time.perf_counter()
    if txn_interval is not None:
        t0 = time.perf_counter()
        producer.commit_transaction(60)
        commits.append(time.perf_counter() - t0)
    else:
        producer.flush(60)
    elapsed = time.perf_counter() - started
    p50, p99 = percentile(commits, 0.5), percentile(commits, 0.99)
    return {
        "records": sent, "seconds": elapsed, "mb_per_s": sent * RECORD / elapsed / 1e6,
        "records_per_s": sent / elapsed, "commits": len(commits),
        "commit_p50_ms": p50 * 1000 if p50 is not None else None,
        "commit_p99_ms": p99 * 1000 if p99 is not None else None,
    }


def one_run(seconds: float, txn_interval: float | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            admin.create_topics([NewTopic("bench", PARTITIONS, 1)])["bench"].result(30)
            return transactional_produce({"bootstrap.servers": broker.bootstrap}, "bench", PARTITIONS, seconds,
                                         txn_interval, f"bench-{txn_interval}")
        finally:
            broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    modes = {"idempotent": None, "txn 100 ms": 0.1, "txn 1 s": 1.0}
    summary = {}
    for name, interval in modes.items():
        runs = [one_run(args.seconds, interval) for _ in range(args.runs)]
        summary[name] = {
            key: statistics.median(r[key] for r in runs if r[key] is not None)
            if any(r[key] is not None for r in runs) else None
            for key in ("mb_per_s", "records_per_s", "commit_p50_ms", "commit_p99_ms", "commits")
        }
        summary[name]["runs"] = runs
    print(f"\ntransactional produce, {RECORD} B records, {PARTITIONS} partitions, acks=all, median of {args.runs}")
    print(f"{'mode':<14}{'MB/s':>10}{'records/s':>12}{'commit p50 ms':>15}{'commit p99 ms':>15}")
    for name, s in summary.items():
        p50 = f"{s['commit_p50_ms']:.1f}" if s["commit_p50_ms"] is not None else "-"
        p99 = f"{s['commit_p99_ms']:.1f}" if s["commit_p99_ms"] is not None else "-"
        print(f"{name:<14}{s['mb_per_s']:>10.1f}{s['records_per_s']:>12.0f}{p50:>15}{p99:>15}")
    out = Path(__file__).parent / "results" / f"transactions-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(summary, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
