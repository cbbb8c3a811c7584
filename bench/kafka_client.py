"""oncelog's client against Apache Kafka, beside confluent-kafka (librdkafka), and the cost of TLS and SASL_SSL.

One Apache Kafka 4.4.0 node (KRaft, loopback, started by tests/support/kafka.py with PLAINTEXT, SSL and
SASL_SSL listeners). For each listener and client: produce `--mb` MiB of 1 KiB records to a fresh topic of
`--partitions` partitions (idempotent, acks=all, linger 5 ms, 1 MB batches, a delivery callback per record,
flush at the end), then consume the topic from the beginning with an assigned consumer until every record is
read. MB/s = record bytes / time. The clients alternate and their order flips every round, so drift hits both.

Prints the median of `--runs` per (listener, client, direction), the ratio to PLAINTEXT for each secured
listener, and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from tests.support.kafka import KafkaCluster  # noqa: E402

import client as client_bench  # noqa: E402  (bench/client.py: the produce loop both benchmarks share)
from oncelog.client import Consumer, Producer, TopicPartition  # noqa: E402

RECORD = client_bench.RECORD
LISTENERS = ("PLAINTEXT", "SSL", "SASL_SSL")
CLIENTS = ("confluent-kafka", "oncelog")


def produce(client: str, conf: dict, topic: str, partitions: int, count: int) -> float:
    """bench/client.py's produce loop (the same settings, a callback per record, flush at the end)."""
    make = CKProducer if client == "confluent-kafka" else Producer
    result = client_bench.run(make, conf, topic, partitions, count)
    if result["errors"] or result["undelivered"]:
        raise RuntimeError(f"{client}: {result['errors']} delivery errors, {result['undelivered']} undelivered")
    return result["mb_per_s"]


def consume(client: str, conf: dict, topic: str, partitions: int, count: int) -> float:
    settings = {**conf, "group.id": f"bench-{client}-{time.monotonic_ns()}", "enable.auto.commit": False,
                "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 1048576}
    if client == "confluent-kafka":
        consumer = CKConsumer(settings)
        consumer.assign([CKTopicPartition(topic, p, 0) for p in range(partitions)])
    else:
        consumer = Consumer(settings)
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = 0
    started = time.perf_counter()
    deadline = time.monotonic() + 300
    while got < count and time.monotonic() < deadline:
        for message in consumer.consume(10000, 1.0):
            if message.error() is None:
                got += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    if got != count:
        raise RuntimeError(f"{client}: read {got} of {count} records")
    return count * RECORD / elapsed / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=64, help="MiB of 1 KiB records per run")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    count = args.mb * 1024 * 1024 // RECORD
    results: dict[str, dict[str, dict[str, list[float]]]] = {
        listener: {client: {"produce": [], "consume": []} for client in CLIENTS} for listener in LISTENERS}
    with tempfile.TemporaryDirectory(prefix="bench-kafka-client-") as tmp, KafkaCluster(Path(tmp)) as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        order = list(CLIENTS)
        for round_no in range(args.runs):
            for listener in LISTENERS:
                conf = kafka.client_config(listener, mechanism="SCRAM-SHA-512")
                for client in order:
                    topic = f"bench-{listener.lower()}-{client}-{round_no}"
                    admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
                    p = produce(client, conf, topic, args.partitions, count)
                    c = consume(client, conf, topic, args.partitions, count)
                    results[listener][client]["produce"].append(p)
                    results[listener][client]["consume"].append(c)
                    print(f"round {round_no + 1} {listener:10} {client:16} produce {p:7.1f} MB/s   "
                          f"consume {c:7.1f} MB/s", flush=True)
                order.reverse()
    median = {listener: {client: {d: statistics.median(v) for d, v in dirs.items()}
                         for client, dirs in clients.items()} for listener, clients in results.items()}
    print(f"\n{args.mb} MiB of 1 KiB records, {args.partitions} partitions, Apache Kafka 4.4.0 on loopback, "
          f"median of {args.runs} runs (MB/s; in parentheses: relative to PLAINTEXT)")
    print(f"{'listener':12}{'client':18}{'produce':>16}{'consume':>16}")
    for listener in LISTENERS:
        for client in CLIENTS:
            cells = []
            for direction in ("produce", "consume"):
                value = median[listener][client][direction]
                base = median["PLAINTEXT"][client][direction]
                cells.append(f"{value:8.1f} ({value / base:4.2f})")
            print(f"{listener:12}{client:18}{cells[0]:>16}{cells[1]:>16}")
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"kafka_client-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "record_bytes": RECORD, "settings": client_bench.SETTINGS, "runs": results, "median": median},
                              indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
