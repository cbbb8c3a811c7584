"""Producer throughput: oncelog's Python producer against confluent-kafka (librdkafka) on the same broker.

One fresh broker on loopback (temp data dir, fsync on). Each run produces `--mb` MiB of 1 KiB records to a
fresh topic of `--partitions` partitions, idempotent with acks=all, the same linger (5 ms), batch size (1 MB)
and queue limits for both clients, a delivery callback per record (counting errors, as an application
would), and `flush()` at the end: records/s = records / (first produce .. flush returned). The clients
alternate and their order flips every round, so page cache and CPU frequency drift hit both alike.

Prints records/s per client (median of `--runs`) and the ratio ours / confluent-kafka (issue 6's bar: >= 60%),
and writes JSON to bench/results/. The consumer's half of the comparison is bench/client_consume.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer as CKProducer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from oncelog.client.producer import Producer  # noqa: E402
from oncelog.embedded import BrokerProcess  # noqa: E402

RECORD = 1024
SETTINGS = {"acks": "all", "enable.idempotence": True, "linger.ms": 5, "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576, "queue.buffering.max.messages": 1_000_000}


def create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)


def run(make, bootstrap: str | dict, topic: str, partitions: int, count: int) -> dict:
    """Produce `count` records with the producer `make(conf)` returns; both clients share this loop.

    `bootstrap` is the broker list, or a whole client config (bench/kafka_client.py passes security settings)."""
    conf = {"bootstrap.servers": bootstrap} if isinstance(bootstrap, str) else dict(bootstrap)
    producer = make({**conf, **SETTINGS})
    errors = [0]

    def delivered(err, msg) -> None:
        if err is not None:
            errors[0] += 1

    value = b"x" * RECORD
    started = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.005)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    elapsed = time.perf_counter() - started
    if hasattr(producer, "close"):
        producer.close()
    return {"records": count, "seconds": elapsed, "records_per_s": count / elapsed,
            "mb_per_s": count * RECORD / elapsed / 1e6, "errors": errors[0], "undelivered": left}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=128, help="MiB of 1 KiB records per run")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-in-flight", type=int, default=5,
                        help="ours: max.in.flight.requests.per.connection (librdkafka caps idempotence at 5)")
    args = parser.parse_args()
    count = args.mb * 1024 * 1024 // RECORD
    clients = {
        "confluent-kafka": CKProducer,
        "oncelog": lambda conf: Producer({**conf, "max.in.flight.requests.per.connection": args.max_in_flight}),
    }
    results: dict[str, list[dict]] = {name: [] for name in clients}
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp, \
            BrokerProcess(Path(tmp) / "data", {"num.partitions": args.partitions}) as broker:
        order = list(clients)
        for round_no in range(args.runs):
            for name in order:
                topic = f"bench-produce-{name}-{round_no}"
                create(broker.bootstrap, topic, args.partitions)
                result = run(clients[name], broker.bootstrap, topic, args.partitions, count)
                results[name].append(result)
                print(f"round {round_no + 1} {name:16} {result['records_per_s']:>10,.0f} records/s "
                      f"({result['mb_per_s']:.1f} MB/s, errors {result['errors']}, undelivered {result['undelivered']})",
                      flush=True)
            order.reverse()
    median = {name: statistics.median(r["records_per_s"] for r in runs) for name, runs in results.items()}
    ratio = median["oncelog"] / median["confluent-kafka"]
    print()
    print(f"{'client':16} {'records/s (median)':>20}")
    for name, value in median.items():
        print(f"{name:16} {value:>20,.0f}")
    print(f"ratio oncelog / confluent-kafka: {ratio:.2f} (bar: >= 0.60) -> {'PASS' if ratio >= 0.6 else 'FAIL'}")
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"client_produce-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "record_bytes": RECORD, "settings": SETTINGS,
                               "runs": results, "median_records_per_s": median, "ratio": ratio}, indent=2))
    print(f"results: {out}")
    failed = any(r["errors"] or r["undelivered"] for runs in results.values() for r in runs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
