"""Cluster figures of issue 15: oncelog (3 brokers on one ZooKeeper) beside Apache Kafka 4.4 (3 KRaft nodes).

Both run on this machine, on loopback, one cluster at a time, interleaved: oncelog round 1, Kafka round 1,
oncelog round 2, ... Each round starts a fresh cluster in a temp directory (oncelog: `oncelog.embedded`'s
ClusterProcess; Kafka: tests/support/kafka.py's KafkaCluster, combined broker+controller nodes, jars from
Maven Central), takes every measurement below on it in this order, and throws it away:

  produce      MB/s of `--mb` MiB of 1 KiB records, idempotent confluent-kafka (librdkafka) producer, acks=all,
               linger 5 ms (bench/client.py's settings), `--topic-partitions` partitions at RF 3,
               min.insync.replicas 2, after `--warmup-mb` MiB not counted. Kafka twice: at its default
               durability (page cache) and with the topic config flush.messages=1 (an fsync per append).
               oncelog's default already fsyncs before acks=all.
  latency      `--latency-seconds` at a fixed `--rate-mb` MB/s, same producer with `--latency-linger-ms`: per
               message, from produce() to librdkafka's acknowledgement (msg.latency()) and to the Python
               delivery callback (bench/paced.py; the first second is warm-up, not counted).
  failover     SIGKILL the leader of a one-partition RF 3 topic while a producer writes every 10 ms: seconds to
               the first acknowledged write produced after the kill. Then SIGKILL the controller (oncelog: the
               broker holding /controller; Kafka: the active KRaft quorum leader, from quorum-state): seconds to
               the first CreateTopics (1 partition, RF 2) that succeeds. Each killed broker is restarted and the
               ISR waited for before the next step.
  partitions   `--partitions` partitions (topics of `--partition-batch` each, RF `--partition-rf`, one
               CreateTopics each): seconds until all are answered and until Metadata shows a leader for all;
               each broker's VmRSS (/proc/PID/status) before and after; then the controller's SIGKILL to a
               created topic again, with all of them in place.

Prints a table (median and min..max of `--runs`) and writes JSON to bench/results/. Benchmarks report; nothing
here asserts a time. The single node's figures are bench/produce_fetch.py's.
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
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
from bench.client import RECORD, SETTINGS  # noqa: E402
from bench.client import run as produce_run  # noqa: E402
from bench.paced import paced_produce  # noqa: E402
from bench.produce_fetch import cpu_seconds  # noqa: E402
from tests.support.kafka import KafkaCluster, KafkaUnavailable, java_executable, kafka_classpath  # noqa: E402

from oncelog.embedded import ClusterProcess  # noqa: E402

MIN_ISR = 2
START_TIMEOUT_S = 180.0
FAILOVER_TIMEOUT_S = 120.0     # a kill that has produced no acknowledged write by then is reported as failed
ISR_TIMEOUT_S = 180.0
ATTEMPT_TIMEOUT_S = 1.0        # one CreateTopics attempt after a controller kill: the resolution of that figure


# -- the two systems behind one interface ------------------------------------------------------------------


class Target:
    """A running 3-broker cluster: what the measurements need to know and do."""

    name: str

    @property
    def bootstrap(self) -> str: ...
    def live_bootstrap(self) -> str: ...
    def broker_pids(self) -> dict[int, int]: ...
    def other_pids(self) -> dict[str, int]:
        return {}
    def controller(self) -> int: ...
    def kill(self, node_id: int) -> None: ...
    def restart(self, node_id: int) -> None: ...
    def stop(self) -> None: ...


class OncelogTarget(Target):
    name = "oncelog"

    def __init__(self, directory: Path, fsync: bool = True) -> None:
        # fsync=False (`oncelog-nofsync`): acks=all from the in-sync replicas' page caches, as Kafka's default, to
        # measure what the durable acknowledgement of docs/cluster.md §4.3 costs.
        self.cluster = ClusterProcess(directory, 3, {"min.insync.replicas": MIN_ISR,
                                                     "default.replication.factor": 3,
                                                     "oncelog.fsync.enable": str(fsync).lower()})
        self.cluster.start(START_TIMEOUT_S)

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def live_bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.cluster.brokers.values() if b.alive())

    def broker_pids(self) -> dict[int, int]:
        return {n: b.proc.pid for n, b in self.cluster.brokers.items() if b.proc is not None and b.alive()}

    def other_pids(self) -> dict[str, int]:
        coordination = self.cluster.coordination
        pid = coordination.members[0].pid if coordination is not None else None
        return {"zookeeper": pid} if pid else {}

    def controller(self) -> int:
        return self.cluster.controller()

    def kill(self, node_id: int) -> None:
        self.cluster.kill(node_id)

    def restart(self, node_id: int) -> None:
        self.cluster.start_broker(node_id, START_TIMEOUT_S + self.cluster.session_timeout_ms / 1000)
        self.cluster.wait_registered(set(self.cluster.brokers), START_TIMEOUT_S)

    def stop(self) -> None:
        self.cluster.kill_all()   # the directory is thrown away: nothing to shut down cleanly for


class KafkaTarget(Target):
    name = "kafka"

    def __init__(self, directory: Path, java: str, classpath: str, heap_mb: int) -> None:
        self.cluster = KafkaCluster(directory, 3, java=java, classpath=classpath, heap_mb=heap_mb,
                                    start_timeout=START_TIMEOUT_S)
        self.cluster.start()

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def live_bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.cluster.nodes if n.alive())

    def broker_pids(self) -> dict[int, int]:
        return {n.node_id: n.pid for n in self.cluster.nodes if n.alive() and n.pid is not None}

    def controller(self) -> int:
        """The active quorum leader: the highest-epoch leader any live node's quorum-state file names (a
        broker's Metadata names a random broker as controller in KRaft, not the quorum leader)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            best = (-1, -1)
            for node in self.cluster.nodes:
                if not node.alive():
                    continue
                path = node.data_dir / "__cluster_metadata-0" / "quorum-state"
                try:
                    state = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                if state.get("leaderId", -1) >= 0 and state.get("leaderEpoch", -1) > best[0]:
                    best = (state["leaderEpoch"], state["leaderId"])
            if best[1] >= 0 and self.cluster.node(best[1]).alive():
                return best[1]
            time.sleep(0.2)
        raise TimeoutError("no live KRaft quorum leader in any quorum-state file")

    def kill(self, node_id: int) -> None:
        self.cluster.node(node_id).kill()

    def restart(self, node_id: int) -> None:
        self.cluster.node(node_id).start()
        self.cluster.wait_ready()

    def stop(self) -> None:
        for node in self.cluster.nodes:
            node.kill()


# -- helpers -----------------------------------------------------------------------------------------------


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 5000,
                        "reconnect.backoff.ms": 100, "reconnect.backoff.max.ms": 1000})


def create_topic(target: Target, name: str, partitions: int, rf: int, config: dict[str, str] | None = None,
                 timeout: float = 120.0) -> None:
    admin = _admin(target.live_bootstrap())   # kept referenced: a destroyed client fails its futures
    fut = admin.create_topics([NewTopic(name, partitions, rf, config=config or {})], request_timeout=timeout,
                              operation_timeout=timeout)[name]
    fut.result(timeout + 5)


def wait_isr(target: Target, topic: str, rf: int, timeout: float = ISR_TIMEOUT_S) -> float:
    """Until Metadata shows every partition of `topic` with a leader and `rf` in-sync replicas; seconds waited."""
    started = time.monotonic()
    admin = _admin(target.live_bootstrap())
    while True:
        try:
            meta = admin.list_topics(topic, timeout=10).topics.get(topic)
            if meta is not None and meta.error is None and meta.partitions and all(
                    p.leader >= 0 and len(p.isrs) == rf for p in meta.partitions.values()):
                return time.monotonic() - started
        except KafkaException:
            pass
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{target.name}: {topic} not fully in sync (RF {rf}) after {timeout} s")
        time.sleep(0.25)


def leader_of(target: Target, topic: str, partition: int = 0) -> int:
    admin = _admin(target.live_bootstrap())
    meta = admin.list_topics(topic, timeout=10)
    return meta.topics[topic].partitions[partition].leader


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _secs(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f} s"


# -- measurements ------------------------------------------------------------------------------------------


def measure_produce(target: Target, args: argparse.Namespace, round_no: int) -> dict[str, Any]:
    rows = {"default": {}}
    if target.name == "kafka":
        rows["flush.messages=1"] = {"flush.messages": "1"}
    out: dict[str, Any] = {}
    if args.warmup_mb:
        # Not counted: every round starts fresh JVMs (Kafka's JIT, ZooKeeper's) and fresh Python brokers, and a
        # short run would otherwise measure compilation as much as the broker.
        topic = f"bench-warmup-{round_no}"
        create_topic(target, topic, args.topic_partitions, 3, {"min.insync.replicas": str(MIN_ISR)})
        wait_isr(target, topic, 3)
        warm = produce_run(Producer, target.bootstrap, topic, args.topic_partitions,
                           args.warmup_mb * 1024 * 1024 // RECORD)
        out["warmup_mb_per_s"] = warm["mb_per_s"]
    count = args.mb * 1024 * 1024 // RECORD
    for row, config in rows.items():
        topic = f"bench-produce-{row.split('=')[0].replace('.', '-')}-{round_no}"
        create_topic(target, topic, args.topic_partitions, 3, {"min.insync.replicas": str(MIN_ISR), **config})
        wait_isr(target, topic, 3)
        pids = target.broker_pids()
        cpu_before = sum(cpu_seconds(pid) for pid in pids.values())
        result = produce_run(Producer, target.bootstrap, topic, args.topic_partitions, count)
        result["broker_cpu_s_per_gib"] = ((sum(cpu_seconds(pid) for pid in pids.values()) - cpu_before)
                                          / (count * RECORD / (1 << 30)))
        out[row] = result
        print(f"  produce {row:18} {result['mb_per_s']:7.1f} MB/s  errors {result['errors']} "
              f"undelivered {result['undelivered']}", flush=True)
    return out


def measure_latency(target: Target, args: argparse.Namespace, round_no: int) -> dict[str, Any]:
    """Paced produce at `--rate-mb` MB/s; latency = delivery callback time - produce() time, per message."""
    topic = f"bench-latency-{round_no}"
    create_topic(target, topic, args.topic_partitions, 3, {"min.insync.replicas": str(MIN_ISR)})
    wait_isr(target, topic, 3)
    result = paced_produce({"bootstrap.servers": target.bootstrap, **SETTINGS, "linger.ms": args.latency_linger_ms},
                           topic, args.topic_partitions, args.rate_mb, args.latency_seconds)
    print(f"  latency at {args.rate_mb} MB/s: p50 {result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms  "
          f"(achieved {result['offered_mb_per_s']:.1f} MB/s, errors {result['errors']})", flush=True)
    return result


def _leader_kill(target: Target, round_no: int) -> dict[str, Any]:
    topic = f"bench-failover-{round_no}"
    create_topic(target, topic, 1, 3, {"min.insync.replicas": str(MIN_ISR)})
    wait_isr(target, topic, 3)
    producer = Producer({"bootstrap.servers": target.bootstrap, **SETTINGS, "linger.ms": 0})
    kill_at = [float("inf")]
    acked_after: list[float] = []
    errors = [0]

    def make_cb(sent: float) -> Callable[[Any, Any], None]:
        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors[0] += 1
            elif sent >= kill_at[0] and not acked_after:
                acked_after.append(time.perf_counter())
        return delivered

    def write_for(seconds: float, until: Callable[[], bool] = lambda: False) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end and not until():
            producer.produce(topic, b"x" * RECORD, partition=0, on_delivery=make_cb(time.perf_counter()))
            producer.poll(0.01)

    write_for(2.0)
    if producer.flush(30):
        raise RuntimeError(f"{target.name}: writes before the kill not acknowledged")
    leader = leader_of(target, topic)
    kill_at[0] = time.perf_counter()
    target.kill(leader)
    write_for(FAILOVER_TIMEOUT_S, lambda: bool(acked_after))
    seconds = acked_after[0] - kill_at[0] if acked_after else None
    left = producer.flush(60)
    print(f"  leader {leader} SIGKILL -> next acknowledged write: "
          f"{_secs(seconds)} (errors {errors[0]})", flush=True)
    target.restart(leader)
    wait_isr(target, topic, 3)
    return {"killed": leader, "seconds": seconds, "errors": errors[0], "undelivered": left}


def _controller_kill(target: Target, tag: str, restart: bool = True) -> dict[str, Any]:
    controller = target.controller()
    name = f"bench-after-controller-kill-{tag}"
    started = time.perf_counter()
    target.kill(controller)
    seconds, attempts, last_error = None, 0, None
    while time.perf_counter() - started < FAILOVER_TIMEOUT_S:
        # A fresh client each attempt, on the live brokers only: librdkafka sends CreateTopics to the controller
        # its cached Metadata names and, while that broker refuses connections, neither refreshes the cache nor
        # backs off (one long-lived client retried the dead controller for 120 s, reconnecting in a busy loop).
        attempts += 1
        admin = _admin(target.live_bootstrap())
        fut = admin.create_topics([NewTopic(name, 1, 2)], request_timeout=ATTEMPT_TIMEOUT_S,
                                  operation_timeout=ATTEMPT_TIMEOUT_S)[name]
        try:
            fut.result(ATTEMPT_TIMEOUT_S + 5)
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                seconds = time.perf_counter() - started   # an earlier attempt that timed out did create it
                break
            last_error = str(err)
            time.sleep(0.1)
            continue
        seconds = time.perf_counter() - started
        break
    print(f"  controller {controller} SIGKILL -> topic created: "
          f"{_secs(seconds)} ({attempts} attempts)", flush=True)
    if restart:
        target.restart(controller)
    return {"killed": controller, "seconds": seconds, "attempts": attempts, "last_error": last_error}


def measure_failover(target: Target, args: argparse.Namespace, round_no: int) -> dict[str, Any]:
    return {"leader_kill": _leader_kill(target, round_no), "controller_kill": _controller_kill(target, str(round_no))}


def measure_partitions(target: Target, args: argparse.Namespace, round_no: int) -> dict[str, Any]:
    """Last in a round: the cluster is thrown away afterwards, so the killed controller is not restarted."""
    def rss() -> dict[str, float | None]:
        pids = {f"broker-{n}": pid for n, pid in target.broker_pids().items()} | target.other_pids()
        return {name: rss_mb(pid) for name, pid in pids.items()}

    before = rss()
    topics = [f"bench-many-{round_no}-{i}" for i in range(-(-args.partitions // args.partition_batch))]
    started = time.perf_counter()
    left = args.partitions
    for topic in topics:
        create_topic(target, topic, min(left, args.partition_batch), args.partition_rf, timeout=600)
        left -= args.partition_batch
    created_s = time.perf_counter() - started
    admin = _admin(target.live_bootstrap())
    while True:
        meta = admin.list_topics(timeout=60).topics
        led = sum(1 for t in topics if t in meta for p in meta[t].partitions.values() if p.leader >= 0)
        if led >= args.partitions:
            break
        if time.perf_counter() - started > 900:
            raise TimeoutError(f"{target.name}: {led} of {args.partitions} partitions have a leader after 900 s")
        time.sleep(0.5)
    led_s = time.perf_counter() - started
    time.sleep(2)   # let the brokers settle (first segment files, caches) before reading memory
    after = rss()
    print(f"  {args.partitions} partitions (RF {args.partition_rf}): created {created_s:.1f} s, all led "
          f"{led_s:.1f} s; RSS MB " + ", ".join(f"{k} {before[k] or 0:.0f}->{v or 0:.0f}" for k, v in after.items()),
          flush=True)
    controller = _controller_kill(target, f"{round_no}-many", restart=False)
    brokers_after = [v for k, v in after.items() if k.startswith("broker-") and v is not None]
    return {"create_s": created_s, "all_led_s": led_s, "rss_mb_before": before, "rss_mb_after": after,
            "broker_rss_mb_max": max(brokers_after), "broker_rss_mb_sum": sum(brokers_after),
            "controller_kill": controller}


MEASUREMENTS: dict[str, Callable[[Target, argparse.Namespace, int], dict[str, Any]]] = {
    "produce": measure_produce, "latency": measure_latency, "failover": measure_failover,
    "partitions": measure_partitions,
}


# -- summary -----------------------------------------------------------------------------------------------


ROWS: list[tuple[str, str, tuple[str, ...]]] = [
    # (label, unit, path in a round's results)
    ("produce, default durability", "MB/s", ("produce", "default", "mb_per_s")),
    ("produce, Kafka flush.messages=1", "MB/s", ("produce", "flush.messages=1", "mb_per_s")),
    ("broker CPU, default durability", "s/GiB", ("produce", "default", "broker_cpu_s_per_gib")),
    ("broker CPU, Kafka flush.messages=1", "s/GiB", ("produce", "flush.messages=1", "broker_cpu_s_per_gib")),
    ("latency p50 at fixed rate", "ms", ("latency", "p50_ms")),
    ("latency p99 at fixed rate", "ms", ("latency", "p99_ms")),
    ("  at the Python callback p50", "ms", ("latency", "callback_p50_ms")),
    ("  at the Python callback p99", "ms", ("latency", "callback_p99_ms")),
    ("leader SIGKILL -> next ack", "s", ("failover", "leader_kill", "seconds")),
    ("controller SIGKILL -> topic created", "s", ("failover", "controller_kill", "seconds")),
    ("N partitions: CreateTopics answered", "s", ("partitions", "create_s")),
    ("N partitions: all have a leader", "s", ("partitions", "all_led_s")),
    ("N partitions: controller SIGKILL -> topic", "s", ("partitions", "controller_kill", "seconds")),
    ("N partitions: broker RSS, largest", "MB", ("partitions", "broker_rss_mb_max")),
    ("N partitions: broker RSS, sum of 3", "MB", ("partitions", "broker_rss_mb_sum")),
    ("N partitions: ZooKeeper RSS", "MB", ("partitions", "rss_mb_after", "zookeeper")),
]


def _get(result: dict[str, Any], path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(result, dict) or key not in result:
            return None
        result = result[key]
    return result if isinstance(result, (int, float)) else None


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, dict[str, float | None]]]:
    summary: dict[str, dict[str, dict[str, float | None]]] = {}
    for label, _unit, path in ROWS:
        summary[label] = {}
        for system, rounds in runs.items():
            values = [v for v in (_get(r, path) for r in rounds) if v is not None]
            summary[label][system] = ({"median": statistics.median(values), "min": min(values),
                                       "max": max(values), "n": len(values)} if values else {})
    return summary


def _cell(stats: dict[str, float | None]) -> str:
    if not stats:
        return f"{'-':>26}"
    return f"{stats['median']:>9.2f} [{stats['min']:.2f}..{stats['max']:.2f}]".rjust(26)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--systems", default="oncelog,kafka", help="comma list of oncelog,kafka and oncelog-nofsync (oncelog.fsync.enable=false: "
                             "what the durable acks=all costs)")
    parser.add_argument("--measurements", default=",".join(MEASUREMENTS), help="comma list of " + ",".join(MEASUREMENTS))
    parser.add_argument("--mb", type=int, default=128, help="MiB of 1 KiB records per produce run")
    parser.add_argument("--warmup-mb", type=int, default=32,
                        help="MiB produced (not counted) before the produce and latency runs of each round")
    parser.add_argument("--topic-partitions", type=int, default=6, help="partitions of the produce/latency topics")
    parser.add_argument("--rate-mb", type=float, default=10.0, help="MB/s offered in the latency run")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--latency-linger-ms", type=float, default=1.0)
    parser.add_argument("--partitions", type=int, default=10_000, help="partitions of the many-partition run")
    parser.add_argument("--partition-batch", type=int, default=1_000, help="partitions per CreateTopics")
    parser.add_argument("--partition-rf", type=int, default=1, help="replication factor of the many partitions")
    parser.add_argument("--kafka-heap-mb", type=int, default=1024,
                        help="Kafka's -Xmx per node: 1024 is what Kafka's own kafka-server-start.sh gives it (the "
                             "test fixtures' 384 MB heap cost Kafka about 40%% of its produce throughput here)")
    args = parser.parse_args()
    systems = args.systems.split(",")
    measurements = args.measurements.split(",")
    unknown = set(measurements) - set(MEASUREMENTS) | set(systems) - {"oncelog", "oncelog-nofsync", "kafka"}
    if unknown:
        parser.error(f"unknown: {sorted(unknown)}")
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
            print(f"round {round_no} {system}", flush=True)
            with tempfile.TemporaryDirectory(prefix=f"bench-cluster-{system}-") as tmp:
                t0 = time.perf_counter()
                target: Target = (OncelogTarget(Path(tmp), fsync=system == "oncelog")
                                  if system.startswith("oncelog")
                                  else KafkaTarget(Path(tmp), java, classpath, args.kafka_heap_mb))
                result: dict[str, Any] = {"start_s": time.perf_counter() - t0}
                try:
                    for name in measurements:
                        try:
                            result[name] = MEASUREMENTS[name](target, args, round_no)
                        except Exception as exc:  # noqa: BLE001 - one failed measurement is reported, not fatal
                            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
                            print(f"  {name} FAILED: {type(exc).__name__}: {exc}", flush=True)
                            break   # the cluster may be in any state now: next round starts afresh
                finally:
                    target.stop()
            runs[system].append(result)

    summary = summarize(runs)
    print(f"\ncluster benchmark: 3 brokers each, loopback, median [min..max] of {args.runs}; {args.mb} MiB produce "
          f"runs of {RECORD} B records after {args.warmup_mb} MiB of warm-up, {args.topic_partitions} partitions, RF 3, min.insync.replicas {MIN_ISR}, "
          f"acks=all, idempotent librdkafka; latency at {args.rate_mb:g} MB/s for {args.latency_seconds:g} s "
          f"(linger {args.latency_linger_ms:g} ms); N = {args.partitions} partitions at RF {args.partition_rf}; Kafka "
          f"heap {args.kafka_heap_mb} MB")
    print(f"{'measurement':<44}{'unit':>6}" + "".join(f"{s:>26}" for s in systems))
    for label, unit, _path in ROWS:
        if any(summary[label][s] for s in systems):
            print(f"{label:<44}{unit:>6}" + "".join(_cell(summary[label][s]) for s in systems))
    failed = [f"{s} round {i + 1} {k}: {v['error']}" for s, rounds in runs.items() for i, r in enumerate(rounds)
              for k, v in r.items() if isinstance(v, dict) and "error" in v]
    for line in failed:
        print(f"FAILED {line}")
    out_dir = Path(__file__).resolve().parent / "results"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"cluster-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "record_bytes": RECORD, "producer_settings": SETTINGS,
                               "summary": summary, "runs": runs}, indent=2))
    print(f"results: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
