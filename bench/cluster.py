"""Cluster figures of issues 15 and 16: oncelog (3 brokers on one ZooKeeper) beside Apache Kafka 4.4 (3 KRaft nodes).

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
               delivery callback (bench/paced.py; a quarter of the run before it is warm-up, not counted).
  failover     SIGKILL the leader of a one-partition RF 3 topic while a producer writes every 10 ms: seconds to
               the first acknowledged write produced after the kill. Then SIGKILL the controller (oncelog: the
               broker holding /controller; Kafka: the active KRaft quorum leader, from quorum-state): seconds to
               the first CreateTopics (1 partition, RF 2) that succeeds. Each killed broker is restarted and the
               ISR waited for before the next step.
  transactions `--txn-seconds` of 1 KiB records round-robin over `--topic-partitions` partitions (RF 3,
               min.insync.replicas 2; __transaction_state RF 3, min ISR 2 on both systems) by an idempotent
               transactional librdkafka producer committing every 100 ms, after `--txn-warmup-seconds` not counted
               (bench/transactions.py's loop): MB/s, records/s and the p50/p99 of commit_transaction(), which
               waits until every record queued in the 100 ms before it is acknowledged (produce() only queues,
               faster than either cluster takes the records, so a commit carries all the backlog). Kafka
               twice, as for produce (flush.messages=1 on the data topic only). Then SIGKILL the transaction
               coordinator's broker (the leader of the __transaction_state partition the transactional id hashes
               to, from Metadata and the hash both systems use) while a producer commits transactions of 10
               records back to back on a one-partition topic led by another broker: seconds to the commit of the
               first transaction begun after the kill (the loop: _txn_after_coordinator_kill), and the commit
               p50/p99 of the 10-record transactions in the 2 s before it. The killed broker is restarted and the
               ISRs waited for.
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
import signal
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
from bench.paced import paced_produce, percentile  # noqa: E402
from bench.produce_fetch import cpu_seconds  # noqa: E402
from bench.transactions import PRODUCER as TXN_PRODUCER  # noqa: E402
from bench.transactions import transactional_produce  # noqa: E402
from tests.support.kafka import KafkaCluster, KafkaUnavailable, java_executable, kafka_classpath  # noqa: E402

from oncelog.coordinator.partitioning import partition_for  # noqa: E402
from oncelog.embedded import ClusterProcess  # noqa: E402

MIN_ISR = 2
START_TIMEOUT_S = 180.0
FAILOVER_TIMEOUT_S = 120.0     # a kill that has produced no acknowledged write by then is reported as failed
ISR_TIMEOUT_S = 180.0
ATTEMPT_TIMEOUT_S = 1.0        # one CreateTopics attempt after a controller kill: the resolution of that figure
TXN_STATE = "__transaction_state"
TXN_STATE_PARTITIONS = 5       # tests/support/kafka.py's transaction.state.log.num.partitions: the same on both
TXN_INTERVAL_S = 0.1           # a commit every 100 ms in the throughput run
TXN_RECORDS = 10               # records per transaction in the coordinator-kill loop
TXN_CALL_TIMEOUT_S = 5.0       # init/commit/abort_transaction() timeout in that loop; a timed-out call is repeated


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

    def __init__(self, directory: Path, fsync: bool = True, settings: dict[str, str] | None = None) -> None:
        # fsync=False (`oncelog-nofsync`): acks=all from the in-sync replicas' page caches, as Kafka's default, to
        # measure what the durable acknowledgement of docs/cluster.md §4.3 costs.
        # __transaction_state as tests/support/kafka.py configures Kafka's 3 nodes (RF 3, min ISR 2, 5 partitions),
        # written out rather than left to oncelog's defaults (RF 3, min ISR 2, 50 partitions).
        self.cluster = ClusterProcess(directory, 3, {"min.insync.replicas": MIN_ISR,
                                                     "default.replication.factor": 3,
                                                     "transaction.state.log.replication.factor": 3,
                                                     "transaction.state.log.min.isr": MIN_ISR,
                                                     "transaction.state.log.num.partitions": TXN_STATE_PARTITIONS,
                                                     "oncelog.fsync.enable": str(fsync).lower(),
                                                     **(settings or {})})
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
                 timeout: float = 120.0, assignment: list[list[int]] | None = None) -> None:
    """`assignment` (replicas per partition, preferred leader first) replaces `partitions` and `rf`."""
    admin = _admin(target.live_bootstrap())   # kept referenced: a destroyed client fails its futures
    new = (NewTopic(name, len(assignment), replica_assignment=assignment, config=config or {})
           if assignment is not None
           else NewTopic(name, partitions, rf, config=config or {}))
    fut = admin.create_topics([new], request_timeout=timeout, operation_timeout=timeout)[name]
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
    # A quarter of the run as warm-up, at least 1 s (fresh JVMs compile for the first seconds; bench/produce_fetch.py
    # does the same).
    result = paced_produce({"bootstrap.servers": target.bootstrap, **SETTINGS, "linger.ms": args.latency_linger_ms},
                           topic, args.topic_partitions, args.rate_mb, args.latency_seconds,
                           max(1.0, args.latency_seconds / 4))
    print(f"  latency at {args.rate_mb} MB/s: p50 {result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms  "
          f"p99.9 {result['p999_ms']:.2f} ms  max {result['max_ms']:.1f} ms  >30 ms {result['over_30ms']}  "
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


def txn_coordinator(target: Target, transactional_id: str, timeout: float = 60.0) -> int:
    """The broker coordinating `transactional_id`: the leader of its __transaction_state partition, found as the
    brokers find it (coordinator/partitioning.py, Kafka's hash of the id modulo the topic's partition count)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            meta = _admin(target.live_bootstrap()).list_topics(TXN_STATE, timeout=10).topics.get(TXN_STATE)
            if meta is not None and meta.error is None and meta.partitions:
                leader = meta.partitions[partition_for(transactional_id, len(meta.partitions))].leader
                if leader >= 0:
                    return leader
        except KafkaException:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{target.name}: no leader for {transactional_id}'s {TXN_STATE} partition")
        time.sleep(0.25)


def _txn_after_coordinator_kill(target: Target, round_no: int) -> dict[str, Any]:
    """What an application that keeps committing does, and when its first transaction after the kill commits.

    The loop: begin_transaction(), produce TXN_RECORDS records, commit_transaction(TXN_CALL_TIMEOUT_S), again.
    A commit that fails retriably (a timeout included) is called again; an error that requires an abort is
    followed by abort_transaction() and a fresh transaction; a fatal error (or a failed abort) drops the producer
    and a new one is made with init_transactions() (called again while it fails retriably). 2 s of commits
    first, then the SIGKILL; the figure is from the kill to the return of the first commit_transaction() of a
    transaction whose begin_transaction() came after the kill."""
    txn_id = f"bench-txn-failover-{round_no}"
    conf = {"bootstrap.servers": target.bootstrap, **TXN_PRODUCER, "linger.ms": 0, "transactional.id": txn_id}
    producer: Producer | None = Producer(conf)
    producer.init_transactions(60)   # creates __transaction_state where it does not exist yet
    coordinator = txn_coordinator(target, txn_id)
    others = sorted(n for n in target.broker_pids() if n != coordinator)
    topic = f"bench-txn-failover-{round_no}"
    # The data partition's leader is another broker, so the figure is the coordinator's failover (and the ISR
    # shrink every acks=all write waits for), not also a data partition's leader election.
    create_topic(target, topic, 1, 3, {"min.insync.replicas": str(MIN_ISR)},
                 assignment=[[others[0], coordinator, others[1]]])
    wait_isr(target, topic, 3)
    value = b"x" * RECORD
    counts = {"commits_before": 0, "commit_retries": 0, "aborts": 0, "new_producers": 0}
    small_commits: list[float] = []   # commit_transaction() of the 10-record transactions before the kill
    errors: list[str] = []
    ready = True
    kill_at: float | None = None
    seconds: float | None = None
    started = time.perf_counter()
    while True:
        now = time.perf_counter()
        if kill_at is None and now - started >= 2.0:
            kill_at = time.perf_counter()
            target.kill(coordinator)
        elif kill_at is not None and now - kill_at > FAILOVER_TIMEOUT_S:
            break
        try:
            if producer is None:
                producer = Producer(conf)
                counts["new_producers"] += 1
                ready = False
            if not ready:
                producer.init_transactions(TXN_CALL_TIMEOUT_S)
                ready = True
            began = time.perf_counter()
            producer.begin_transaction()
            for _ in range(TXN_RECORDS):
                producer.produce(topic, value, partition=0)
            committing = time.perf_counter()
            while True:
                try:
                    producer.commit_transaction(TXN_CALL_TIMEOUT_S)
                    break
                except KafkaException as exc:
                    err = exc.args[0]
                    if not err.retriable() or err.fatal() or err.txn_requires_abort() or (
                            kill_at is not None and time.perf_counter() - kill_at > FAILOVER_TIMEOUT_S):
                        raise
                    counts["commit_retries"] += 1
                    errors.append(f"commit: {err.name()}")
            if kill_at is not None and began >= kill_at:
                seconds = time.perf_counter() - kill_at
                break
            counts["commits_before"] += 1
            if kill_at is None:
                small_commits.append(time.perf_counter() - committing)
        except KafkaException as exc:
            err = exc.args[0]
            errors.append(err.name())
            if producer is not None and ready and err.txn_requires_abort() and not err.fatal():
                try:
                    producer.abort_transaction(TXN_CALL_TIMEOUT_S)
                    counts["aborts"] += 1
                    continue
                except KafkaException as abort_exc:
                    errors.append(f"abort: {abort_exc.args[0].name()}")
            if not ready and producer is not None and err.retriable() and not err.fatal():
                continue   # init_transactions() again on the same producer
            producer = None
    p50, p99 = percentile(small_commits, 0.5), percentile(small_commits, 0.99)
    slowest = sorted(range(len(small_commits)), key=lambda i: -small_commits[i])[:3]
    print(f"  10-record transactions before the kill: {len(small_commits)}, commit p50 "
          f"{(p50 or 0) * 1000:.1f} ms p99 {(p99 or 0) * 1000:.1f} ms; slowest (transaction: ms) "
          + ", ".join(f"#{i}: {small_commits[i] * 1000:.0f}" for i in slowest), flush=True)
    print(f"  coordinator {coordinator} SIGKILL -> next committed transaction: {_secs(seconds)} "
          f"({counts['commit_retries']} commit retries, {counts['aborts']} aborts, "
          f"{counts['new_producers']} new producers; errors {sorted(set(errors))})", flush=True)
    target.restart(coordinator)
    wait_isr(target, topic, 3)
    wait_isr(target, TXN_STATE, 3)
    return {"killed": coordinator, "seconds": seconds, **counts, "errors": errors[:50],
            "small_commit_p50_ms": None if p50 is None else p50 * 1000,
            "small_commit_p99_ms": None if p99 is None else p99 * 1000,
            "small_commits_ms": [round(t * 1000, 1) for t in small_commits]}


def measure_transactions(target: Target, args: argparse.Namespace, round_no: int) -> dict[str, Any]:
    rows = {"default": {}}
    if target.name == "kafka":
        rows["flush.messages=1"] = {"flush.messages": "1"}
    out: dict[str, Any] = {}
    for row, config in [("warmup", {}), *rows.items()]:
        if row == "warmup" and not args.txn_warmup_seconds:
            continue
        topic = f"bench-txn-{row.split('=')[0].replace('.', '-')}-{round_no}"
        create_topic(target, topic, args.topic_partitions, 3, {"min.insync.replicas": str(MIN_ISR), **config})
        wait_isr(target, topic, 3)
        seconds = args.txn_warmup_seconds if row == "warmup" else args.txn_seconds
        result = transactional_produce({"bootstrap.servers": target.bootstrap}, topic, args.topic_partitions,
                                       seconds, TXN_INTERVAL_S, f"bench-txn-{topic}")
        result["krecords_per_s"] = result["records_per_s"] / 1000
        if row == "warmup":
            out["warmup_mb_per_s"] = result["mb_per_s"]
            continue
        out[row] = result
        print(f"  transactions {row:18} {result['mb_per_s']:7.1f} MB/s {result['records_per_s']:8.0f} records/s  "
              f"commit p50 {result['commit_p50_ms']:.1f} ms p99 {result['commit_p99_ms']:.1f} ms "
              f"({result['commits']} commits)", flush=True)
    wait_isr(target, TXN_STATE, 3)
    out["coordinator_kill"] = _txn_after_coordinator_kill(target, round_no)
    return out


MEASUREMENTS: dict[str, Callable[[Target, argparse.Namespace, int], dict[str, Any]]] = {
    "produce": measure_produce, "latency": measure_latency, "failover": measure_failover,
    "transactions": measure_transactions, "partitions": measure_partitions,
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
    ("latency p99.9 at fixed rate", "ms", ("latency", "p999_ms")),
    ("latency max at fixed rate", "ms", ("latency", "max_ms")),
    ("  samples over 30 ms", "", ("latency", "over_30ms")),
    ("  at the Python callback p50", "ms", ("latency", "callback_p50_ms")),
    ("  at the Python callback p99", "ms", ("latency", "callback_p99_ms")),
    ("leader SIGKILL -> next ack", "s", ("failover", "leader_kill", "seconds")),
    ("controller SIGKILL -> topic created", "s", ("failover", "controller_kill", "seconds")),
    ("txn produce, commit every 100 ms", "MB/s", ("transactions", "default", "mb_per_s")),
    ("  thousands of records/s", "k/s", ("transactions", "default", "krecords_per_s")),
    ("  commit_transaction() p50", "ms", ("transactions", "default", "commit_p50_ms")),
    ("  commit_transaction() p99", "ms", ("transactions", "default", "commit_p99_ms")),
    ("txn produce, Kafka flush.messages=1", "MB/s", ("transactions", "flush.messages=1", "mb_per_s")),
    ("  thousands of records/s, flush.messages=1", "k/s", ("transactions", "flush.messages=1", "krecords_per_s")),
    ("  commit p50, flush.messages=1", "ms", ("transactions", "flush.messages=1", "commit_p50_ms")),
    ("  commit p99, flush.messages=1", "ms", ("transactions", "flush.messages=1", "commit_p99_ms")),
    ("10-record txn before the kill: commit p50", "ms", ("transactions", "coordinator_kill", "small_commit_p50_ms")),
    ("10-record txn before the kill: commit p99", "ms", ("transactions", "coordinator_kill", "small_commit_p99_ms")),
    ("coordinator SIGKILL -> next commit", "s", ("transactions", "coordinator_kill", "seconds")),
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
    parser.add_argument("--txn-seconds", type=float, default=10.0, help="seconds of each transactional run")
    parser.add_argument("--txn-warmup-seconds", type=float, default=3.0,
                        help="seconds of transactional produce (not counted) before the transactional runs")
    parser.add_argument("--partitions", type=int, default=10_000, help="partitions of the many-partition run")
    parser.add_argument("--partition-batch", type=int, default=1_000, help="partitions per CreateTopics")
    parser.add_argument("--partition-rf", type=int, default=1, help="replication factor of the many partitions")
    parser.add_argument("--broker-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a key for every oncelog broker (repeatable), e.g. oncelog.fsync.threads=2")
    parser.add_argument("--kafka-heap-mb", type=int, default=1024,
                        help="Kafka's -Xmx per node: 1024 is what Kafka's own kafka-server-start.sh gives it (the "
                             "test fixtures' 384 MB heap cost Kafka about 40%% of its produce throughput here)")
    args = parser.parse_args()
    # SIGTERM (a kill, a timeout) unwinds like Ctrl-C, so each run's `finally` stops its brokers: they run in
    # process groups of their own and would otherwise outlive the benchmark.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
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
                target: Target = (OncelogTarget(Path(tmp), fsync=system == "oncelog",
                                                settings=dict(item.split("=", 1) for item in args.broker_setting))
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
          f"heap {args.kafka_heap_mb} MB; transactions: {args.txn_seconds:g} s, a commit every "
          f"{TXN_INTERVAL_S * 1000:g} ms, after {args.txn_warmup_seconds:g} s of warm-up")
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
