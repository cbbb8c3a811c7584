"""Produce and fetch throughput of one oncelog broker, measured with confluent-kafka (librdkafka).

Each run starts a fresh broker on loopback (temp data dir, fsync on), creates a topic,
produces `--mb` MiB of 1 KiB records with acks=all and linger 5 ms (idempotence on and
off), then reads everything back with one consumer. Prints a table of the median of
`--runs` runs and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from oncelog.embedded import BrokerProcess  # noqa: E402

RECORD = 1024
PARTITIONS = 4


def produce(bootstrap: str, topic: str, total_bytes: int, idempotent: bool) -> dict:
    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": idempotent,
        "batch.size": 1_000_000, "queue.buffering.max.kbytes": 1_048_576, "queue.buffering.max.messages": 1_000_000,
    })
    latencies: list[float] = []
    errors = [0]

    def delivered(err, msg):
        if err is not None:
            errors[0] += 1
        else:
            latencies.append(msg.latency())

    value = b"x" * RECORD
    count = total_bytes // RECORD
    started = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.005)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(120)
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "records": count, "seconds": elapsed, "mb_per_s": count * RECORD / elapsed / 1e6,
        "records_per_s": count / elapsed, "errors": errors[0],
        "p50_ms": latencies[len(latencies) // 2] * 1000 if latencies else None,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000 if latencies else None,
    }


def consume(bootstrap: str, topic: str, expected: int) -> dict:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
        "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
        "queued.max.messages.kbytes": 1_048_576,
    })
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen = 0
    nbytes = 0
    started = time.perf_counter()
    deadline = started + 300
    while seen < expected and time.perf_counter() < deadline:
        for msg in consumer.consume(10000, 1.0):
            if msg.error() is None:
                seen += 1
                nbytes += len(msg.value())
    elapsed = time.perf_counter() - started
    consumer.close()
    return {"records": seen, "seconds": elapsed, "mb_per_s": nbytes / elapsed / 1e6, "records_per_s": seen / elapsed}


def one_run(total_bytes: int, idempotent: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            admin.create_topics([NewTopic("bench", PARTITIONS, 1)])["bench"].result(30)
            p = produce(broker.bootstrap, "bench", total_bytes, idempotent)
            c = consume(broker.bootstrap, "bench", p["records"])
        finally:
            broker.stop()
    return {"produce": p, "fetch": c}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=1024, help="MiB produced and read back per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="idempotent,plain", help="comma list of idempotent,plain")
    args = parser.parse_args()
    total = args.mb * 1024 * 1024
    summary = {}
    for mode in args.modes.split(","):
        runs = [one_run(total, mode == "idempotent") for _ in range(args.runs)]

        def med(path: tuple[str, str], runs: list[dict] = runs) -> float:
            return statistics.median(r[path[0]][path[1]] for r in runs)

        summary[mode] = {
            "produce_mb_per_s": med(("produce", "mb_per_s")),
            "produce_records_per_s": med(("produce", "records_per_s")),
            "produce_p50_ms": med(("produce", "p50_ms")),
            "produce_p99_ms": med(("produce", "p99_ms")),
            "fetch_mb_per_s": med(("fetch", "mb_per_s")),
            "delivery_errors": sum(r["produce"]["errors"] for r in runs),
            "runs": runs,
        }
    print(f"\nproduce/fetch, {args.mb} MiB of {RECORD} B records, {PARTITIONS} partitions, acks=all, linger 5 ms, "
          f"median of {args.runs}")
    print(f"{'mode':<12}{'produce MB/s':>14}{'records/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'fetch MB/s':>12}{'errors':>8}")
    for mode, s in summary.items():
        print(f"{mode:<12}{s['produce_mb_per_s']:>14.1f}{s['produce_records_per_s']:>12.0f}{s['produce_p50_ms']:>9.1f}"
              f"{s['produce_p99_ms']:>9.1f}{s['fetch_mb_per_s']:>12.1f}{s['delivery_errors']:>8}")
    if "idempotent" in summary and "plain" in summary:
        cost = 1 - summary["idempotent"]["produce_mb_per_s"] / summary["plain"]["produce_mb_per_s"]
        print(f"cost of idempotence: {cost * 100:.1f}% of produce throughput")
    out = Path(__file__).parent / "results" / f"produce_fetch-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"mb": args.mb, "runs": args.runs, "summary": summary}, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
