"""Consumer throughput: oncelog's Python consumer against confluent-kafka (librdkafka) on the same broker.

One fresh broker on loopback (temp data dir), one topic of `--partitions` partitions filled once
with `--mb` MiB of 1 KiB records by confluent-kafka; then each client reads the whole topic from
offset 0 in assign mode, `--runs` times, the clients alternating and their order flipping every
round (page cache and CPU frequency drift hit both alike). Two loops are measured per client:
`consume` (batches of 8192, the loop a throughput-minded application writes) and `poll` (one
message per call). Every message's value is touched (len) so neither client can skip work. Both
clients use the same fetch sizes and read_committed (both default to it).

Prints records/s per client, the ratio ours / confluent-kafka (the bar of issue 6: >= 60%), and
each client process's CPU time per record (less sensitive than records/s to other load on the
machine), and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from oncelog.client.consumer.consumer import Consumer  # noqa: E402
from oncelog.client.types import TopicPartition  # noqa: E402
from oncelog.embedded import BrokerProcess  # noqa: E402

RECORD = 1024
BATCH = 8192  # divides every topic size (--mb is a multiple of 8), so no consume() call waits out its timeout
TOPIC = "bench-consume"
FETCH = {"fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 1_048_576, "fetch.wait.max.ms": 100,
         "isolation.level": "read_committed"}


def fill(bootstrap: str, partitions: int, count: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1_000_000,
                         "queue.buffering.max.kbytes": 1_048_576, "queue.buffering.max.messages": 1_000_000})
    value = b"x" * RECORD
    for i in range(count):
        while True:
            try:
                producer.produce(TOPIC, value, key=b"%d" % i, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.005)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0


def read_confluent(bootstrap: str, partitions: int, expected: int, mode: str) -> dict:
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": "bench-ck", "enable.auto.commit": False, **FETCH})
    c.assign([CKTopicPartition(TOPIC, p, 0) for p in range(partitions)])
    try:
        return _timed(expected, mode, c.consume, c.poll)
    finally:
        c.close()


def read_ours(bootstrap: str, partitions: int, expected: int, mode: str) -> dict:
    # max.poll.records (Java's cap per call, 500 by default) raised to the batch confluent-kafka gets
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ours", "enable.auto.commit": False,
                  "max.poll.records": BATCH, **FETCH})
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
    try:
        return _timed(expected, mode, c.consume, c.poll)
    finally:
        c.close()


def _timed(expected: int, mode: str, consume: Callable, poll: Callable) -> dict:
    seen = 0
    nbytes = 0
    cpu_started = time.process_time()  # all threads of this process: librdkafka's, or our loop thread
    started = time.perf_counter()
    deadline = started + 600
    if mode == "consume":
        while seen < expected and time.perf_counter() < deadline:
            for msg in consume(BATCH, 1.0):
                if msg.error() is None:
                    seen += 1
                    nbytes += len(msg.value())
    else:
        while seen < expected and time.perf_counter() < deadline:
            msg = poll(1.0)
            if msg is not None and msg.error() is None:
                seen += 1
                nbytes += len(msg.value())
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    assert seen == expected, f"read {seen} of {expected} records"
    return {"records": seen, "seconds": elapsed, "records_per_s": seen / elapsed, "mb_per_s": nbytes / elapsed / 1e6,
            "cpu_us_per_record": cpu / seen * 1e6}


CLIENTS = {"confluent-kafka": read_confluent, "oncelog": read_ours}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="MiB of 1 KiB records in the topic")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="consume,poll", help="comma list of consume,poll")
    args = parser.parse_args()
    if args.mb % 8:
        parser.error("--mb must be a multiple of 8")
    count = args.mb * 1024 * 1024 // RECORD
    modes = args.modes.split(",")
    runs: dict[str, dict[str, list[dict]]] = {m: {c: [] for c in CLIENTS} for m in modes}
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as tmp, \
            BrokerProcess(Path(tmp) / "data", {"num.partitions": args.partitions}) as broker:
        fill(broker.bootstrap, args.partitions, count)
        for round_no in range(args.runs):
            for mode in modes:
                order = list(CLIENTS) if round_no % 2 == 0 else list(CLIENTS)[::-1]
                for client in order:
                    result = CLIENTS[client](broker.bootstrap, args.partitions, count, mode)
                    runs[mode][client].append(result)
                    print(f"round {round_no + 1} {mode:<8} {client:<16} {result['records_per_s']:>10.0f} records/s "
                          f"{result['cpu_us_per_record']:>6.2f} CPU us/record", flush=True)
    summary: dict[str, dict] = {}
    for mode in modes:
        med = {c: statistics.median(r["records_per_s"] for r in runs[mode][c]) for c in CLIENTS}
        cpu = {c: statistics.median(r["cpu_us_per_record"] for r in runs[mode][c]) for c in CLIENTS}
        summary[mode] = {"records_per_s": med, "ratio": med["oncelog"] / med["confluent-kafka"],
                         "cpu_us_per_record": cpu}
    print(f"\nconsumer throughput: {args.mb} MiB of {RECORD} B records, {args.partitions} partitions, assign mode, "
          f"read_committed, median of {args.runs}")
    print(f"{'loop':<10}{'confluent-kafka rec/s':>24}{'oncelog rec/s':>16}{'ratio':>9}"
          f"{'CPU us/rec ck':>16}{'CPU us/rec ours':>17}")
    for mode, s in summary.items():
        r, c = s["records_per_s"], s["cpu_us_per_record"]
        print(f"{mode:<10}{r['confluent-kafka']:>24.0f}{r['oncelog']:>16.0f}{s['ratio'] * 100:>8.0f}%"
              f"{c['confluent-kafka']:>16.2f}{c['oncelog']:>17.2f}")
    print("CPU us/rec: the client process's CPU time (every thread) per record read; the broker is not counted")
    out = Path(__file__).parent / "results" / f"client_consume-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"mb": args.mb, "partitions": args.partitions, "runs": args.runs,
                               "summary": summary, "all": runs}, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
