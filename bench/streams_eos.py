"""Kafka Streams exactly_once_v2 throughput end to end: oncelog (single node) beside Apache Kafka 4.4 (single node).

The program is the tests' (tests/interop/streams, oncelog.streams.EosAggregation, driven through
tests/support/streams_app.py): it re-keys each input record by group (a repartition topic), keeps a count and a
sum per group in a store with a compacted changelog, and writes every update to the output topic, with
processing.guarantee=exactly_once_v2, the record cache off (one output record per input record) and a commit
every `--commit-interval-ms`.

Each round starts a fresh broker in a temp directory, one system at a time, interleaved (oncelog round 1, Kafka
round 1, oncelog round 2, ...): oncelog through `oncelog.embedded.BrokerProcess`, Kafka through
tests/support/kafka.py's KafkaCluster (one KRaft combined node, jars from Maven Central). Both get the same
internal-topic layout (5 partitions of __consumer_offsets and __transaction_state) and no initial rebalance
delay; everything else is each system's default (fsync: oncelog fsyncs before acks=all and before data is
visible; Kafka leaves flushing to the page cache). `--instances` Kafka Streams instances (JVMs with the JVM's
default flags and `--heap-mb`) start and reach RUNNING; then an idempotent librdkafka producer writes `--records`
input records as fast as it can over `--partitions` partitions, while a read_committed librdkafka consumer reads
the output. The figure is records/s from the first input record produced to the moment the consumer has read
the update that accounts for the last one (so every output record is committed), and the output is checked
for exactly-once (tests/support/streams_app.check_exactly_once). Also reported: the broker's CPU seconds over
the run (oncelog: the broker process and its cleaner workers; Kafka: its JVM).

Prints a table (median and min..max of `--runs`) and writes JSON to bench/results/. Benchmarks report; nothing
here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from tests.support.kafka import KafkaCluster, KafkaUnavailable, java_executable, kafka_classpath  # noqa: E402
from tests.support.streams_app import (  # noqa: E402
    StreamsInstance,
    StreamsUnavailable,
    build_jar,
    check_exactly_once,
    expected_totals,
    input_value,
)

from oncelog.embedded import BrokerProcess  # noqa: E402

SHARED = {"offsets.topic.num.partitions": 5, "transaction.state.log.num.partitions": 5,
          "group.initial.rebalance.delay.ms": 0}
START_TIMEOUT_S = 240.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its reaped children so far (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def process_tree_cpu(pid: int) -> float:
    """cpu_seconds of `pid` and of its live children (oncelog's cleaner workers)."""
    total = cpu_seconds(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                total += cpu_seconds(int(child))
            except OSError:
                continue
    return total


class Broker:
    """A running single-node broker of one system: its bootstrap, its pid, stop()."""

    def __init__(self, system: str, directory: Path, java: str, classpath: str, heap_mb: int) -> None:
        self.system = system
        if system == "oncelog":
            self.proc = BrokerProcess(directory / "data", dict(SHARED)).start()
            self.bootstrap = self.proc.bootstrap
            self.pid = self.proc.pid
        else:
            self.cluster = KafkaCluster(directory, 1, dict(SHARED), java=java, classpath=classpath, heap_mb=heap_mb,
                                        start_timeout=START_TIMEOUT_S).start()
            self.bootstrap = self.cluster.bootstrap
            self.pid = self.cluster.nodes[0].pid

    def stop(self) -> None:
        if self.system == "oncelog":
            self.proc.kill()
        else:
            for node in self.cluster.nodes:
                node.kill()


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, partitions, 1) for n in names], operation_timeout=30)
    for future in futures.values():
        future.result(60)


class OutputReader(threading.Thread):
    """Reads the output topic with read_committed from offset 0 until the updates account for `total` input
    records; `done_at` is the perf_counter time it read the last of them."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, total: int, timeout: float) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-output",
                                  "enable.auto.commit": False, "isolation.level": "read_committed",
                                  "fetch.wait.max.ms": 50})
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.total = total
        self.timeout = timeout
        self.updates: dict[str, list[tuple[int, int]]] = {}
        self.done_at: float | None = None
        self.error: str | None = None

    def run(self) -> None:
        last: dict[str, int] = {}
        accounted = 0
        deadline = time.monotonic() + self.timeout
        try:
            while accounted < self.total:
                if time.monotonic() > deadline:
                    self.error = f"output accounts for {accounted} of {self.total} after {self.timeout:.0f} s"
                    return
                for msg in self.consumer.consume(10_000, 0.2):
                    if msg.error() is not None:
                        if msg.error().code() != KafkaError._PARTITION_EOF:
                            self.error = str(msg.error())
                            return
                        continue
                    group = msg.key().decode()
                    count, total = msg.value().decode().split(",")
                    self.updates.setdefault(group, []).append((int(count), int(total)))
                    accounted += int(count) - last.get(group, 0)
                    last[group] = int(count)
                    if accounted >= self.total:
                        self.done_at = time.perf_counter()
        finally:
            self.consumer.close()


def produce_input(bootstrap: str, topic: str, records: int, partitions: int, groups: int) -> tuple[float, float]:
    """`records` input records, idempotent acks=all; (perf_counter at the first produce(), at the last ack)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "batch.size": 1_000_000, "queue.buffering.max.kbytes": 262_144})
    failed: list[str] = []
    first = time.perf_counter()
    for record_id in range(1, records + 1):
        while True:
            try:
                producer.produce(topic, key=b"id-%d" % record_id, value=input_value(record_id, groups),
                                 partition=record_id % partitions,
                                 on_delivery=lambda err, _m: err is not None and failed.append(str(err)))
                break
            except BufferError:
                producer.poll(0.05)
        if record_id % 1000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    if left or failed:
        raise RuntimeError(f"input not delivered: {left} left, errors {failed[:3]}")
    return first, time.perf_counter()


def one_round(system: str, args: argparse.Namespace, java: str, classpath: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-streams-{system}-") as tmp:
        directory = Path(tmp)
        broker = Broker(system, directory, java, classpath, args.kafka_heap_mb)
        instances: list[StreamsInstance] = []
        try:
            app = f"bench-{os.urandom(4).hex()}"
            source, sink = f"{app}-input", f"{app}-output"
            create_topics(broker.bootstrap, [source, sink], args.partitions)
            flags = [f"-Xmx{args.heap_mb}m"]
            instances = [StreamsInstance(f"i{n}", broker.bootstrap, app, directory / f"state-{n}",
                                         directory / "streams-logs", input_topic=source, output_topic=sink,
                                         commit_interval_ms=args.commit_interval_ms,
                                         config={"num.stream.threads": args.threads}, jvm_flags=flags)
                         for n in range(args.instances)]
            for inst in instances:
                inst.start()
            for inst in instances:
                inst.wait_state("RUNNING", START_TIMEOUT_S)
            reader = OutputReader(broker.bootstrap, sink, args.partitions, args.records, args.timeout)
            reader.start()
            cpu0 = process_tree_cpu(broker.pid)
            first, acked = produce_input(broker.bootstrap, source, args.records, args.partitions, args.groups)
            reader.join(args.timeout + 30)
            cpu = process_tree_cpu(broker.pid) - cpu0
            if reader.error or reader.done_at is None:
                raise RuntimeError(reader.error or "output reader did not finish")
            fatal = [e for inst in instances for e in inst.fatal()]
            problems = check_exactly_once(expected_totals(range(1, args.records + 1), args.groups), reader.updates,
                                          args.partitions)
            seconds = reader.done_at - first
            return {"records_per_s": args.records / seconds, "seconds": seconds, "input_s": acked - first,
                    "broker_cpu_s": cpu, "exact": not problems and not fatal, "problems": problems[:5],
                    "fatal": fatal[:3]}
        finally:
            for inst in instances:
                inst.kill()
            broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--systems", default="oncelog,kafka", help="comma list of oncelog,kafka")
    parser.add_argument("--records", type=int, default=200_000, help="input records per run")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of input and output (and so of "
                        "the repartition topic and the changelog)")
    parser.add_argument("--groups", type=int, default=100, help="keys of the aggregation")
    parser.add_argument("--instances", type=int, default=1, help="Kafka Streams instances (JVMs)")
    parser.add_argument("--threads", type=int, default=1, help="stream threads per instance")
    parser.add_argument("--commit-interval-ms", type=int, default=100, help="Kafka Streams' EOS default is 100")
    parser.add_argument("--heap-mb", type=int, default=512, help="-Xmx of each Kafka Streams JVM")
    parser.add_argument("--kafka-heap-mb", type=int, default=1024, help="Kafka's -Xmx (kafka-server-start.sh's)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take to drain")
    args = parser.parse_args()
    systems = args.systems.split(",")
    if set(systems) - {"oncelog", "kafka"}:
        parser.error(f"unknown systems: {sorted(set(systems) - {'oncelog', 'kafka'})}")
    try:
        build_jar()
    except StreamsUnavailable as exc:
        print(f"cannot run Kafka Streams: {exc}", file=sys.stderr)
        return 2
    java = classpath = ""
    if "kafka" in systems:
        try:
            java, classpath = java_executable(), kafka_classpath()
        except KafkaUnavailable as exc:
            print(f"cannot run Kafka: {exc}", file=sys.stderr)
            return 2

    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for round_no in range(1, args.runs + 1):
        for system in systems:
            try:
                result = one_round(system, args, java, classpath)
            except Exception as exc:  # noqa: BLE001 - a failed round is reported, the others still run
                result = {"error": f"{type(exc).__name__}: {exc}"}
            runs[system].append(result)
            shown = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in result.items()
                     if k not in ("problems", "fatal") or v}
            print(f"round {round_no} {system}: {shown}", flush=True)

    rows = [("end to end", "rec/s", "records_per_s"), ("first input to last output", "s", "seconds"),
            ("input produced and acked", "s", "input_s"), ("broker CPU over the run", "s", "broker_cpu_s")]
    print(f"\nKafka Streams exactly_once_v2, {args.records} input records, {args.partitions} partitions, "
          f"{args.groups} groups, {args.instances} instance(s) x {args.threads} thread(s), commit every "
          f"{args.commit_interval_ms} ms, record cache off; single node each, loopback; median [min..max] of "
          f"{args.runs}")
    print(f"{'measurement':<30}{'unit':>6}" + "".join(f"{s:>30}" for s in systems))
    for label, unit, key in rows:
        cells = []
        for s in systems:
            values = [r[key] for r in runs[s] if key in r]
            cells.append(f"{statistics.median(values):>12.1f} [{min(values):.1f}..{max(values):.1f}]"
                         if values else "-")
        print(f"{label:<30}{unit:>6}" + "".join(f"{c:>30}" for c in cells))
    exact = {s: sum(1 for r in runs[s] if r.get("exact")) for s in systems}
    print(f"{'exactly once (runs)':<36}" + "".join(f"{f'{exact[s]}/{args.runs}':>30}" for s in systems))
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"streams_eos-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2))
    print(f"results: {out}")
    failed = any("error" in r or not r.get("exact") for rs in runs.values() for r in rs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
