"""Fault runs: a real broker behind a misbehaving proxy, workload processes, a nemesis, then the checker.

`python -m tests.faults.runner --runs N --seed S --seconds T [--workloads ...] [--nemeses ...] [--cluster [--secure]]`
prints a table (runs, faults, operations, every anomaly count) and writes JSON. One run = one workload under one
nemesis mix:
1. start a broker (fresh data dir) that advertises the proxy's address, and the proxy (with `--cluster`: a
   ZooKeeper ensemble and three brokers, each behind its own proxy; tests/faults/cluster.py; with `--secure`
   SASL_SSL listeners, ACLs on and the workers a principal with only their workload's ACLs: tests/faults/secure.py);
2. start the workload's worker processes (they stop by themselves after T seconds);
3. the nemesis injects faults at random (seeded) moments until T, then heals everything;
4. wait for the workers, wait for every last stable offset to reach its high watermark, read every partition
   from the start (read_committed and read_uncommitted), and check.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from oncelog.embedded import BrokerProcess
from tests.faults.checker import ANOMALIES, FinalRead, Report, check
from tests.faults.history import HistoryWriter, read_events
from tests.faults.proxy import FaultProxy
from tests.faults.storage import DiskUnavailable, FsyncTrigger, SmallDisk
from tests.faults.workers import HANG_EXIT
from tests.integration.helpers import ck_consume

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
TXN_TIMEOUT_MS = 6_000
HEAL_MARGIN_S = 20.0


@dataclass
class Worker:
    kind: str
    name: str
    args: list[str]
    proc: subprocess.Popen | None = None
    restarts: int = 0


@dataclass
class RunResult:
    workload: str
    nemeses: list[str]
    seed: int
    client: str
    report: dict[str, Report] = field(default_factory=dict)
    faults: int = 0
    operations: int = 0
    seconds: float = 0.0
    client_restarts: int = 0  # a client call hung (librdkafka 5456/5511) and the watchdog restarted the worker
    client_kills: dict[str, int] = field(default_factory=dict)  # worker -> SIGKILLs that client-kill dealt it
    notes: dict[str, Any] = field(default_factory=dict)  # what the run noted about itself (cluster: its proxies)


# -- workloads: which workers, on which topics -------------------------------------------------------------------

def _workers_idempotent(client: str) -> list[Worker]:
    return [Worker("producer", "idem-a", ["--topic", "idem", "--rate", "300", "--client", client]),
            Worker("producer", "idem-b", ["--topic", "idem", "--rate", "300", "--client", client]),
            Worker("deleter", "deleter", ["--topic", "idem", "--interval", "1.5"]),
            Worker("reader", "idem-reader", ["--topic", "idem", "--isolation", "ru", "--client", client])]


def _workers_transactions(client: str) -> list[Worker]:
    return [Worker("txn-producer", "txn-a", ["--topic", "txn", "--client", client]),
            Worker("txn-producer", "txn-b", ["--topic", "txn", "--client", client]),
            Worker("reader", "txn-rc", ["--topic", "txn", "--isolation", "rc", "--client", client]),
            Worker("reader", "txn-ru", ["--topic", "txn", "--isolation", "ru", "--client", client]),
            Worker("lso-monitor", "lso", ["--topic", "txn", "--interval", "0.5"])]


def _workers_copy(client: str) -> list[Worker]:
    return [Worker("producer", "src", ["--topic", "copy-in", "--rate", "300", "--client", client]),
            Worker("copier", "copier", ["--topic", "copy-out", "--in-topic", "copy-in", "--client", client]),
            Worker("reader", "copy-rc", ["--topic", "copy-out", "--isolation", "rc", "--client", client]),
            Worker("lso-monitor", "copy-lso", ["--topic", "copy-out", "--interval", "0.5"])]


def _workers_consumer(client: str) -> list[Worker]:
    """Two idempotent producers and three members of one consumer group, committing what they read."""
    return [Worker("producer", "grp-a", ["--topic", "grp", "--rate", "200", "--client", client]),
            Worker("producer", "grp-b", ["--topic", "grp", "--rate", "200", "--client", client]),
            *[Worker("group-consumer", f"member-{i}", ["--topic", "grp", "--group", GROUP, "--client", client,
                                                        "--done-file", PRODUCERS_DONE])
              for i in (1, 2, 3)]]


def _workers_spark(client: str) -> list[Worker]:
    """The input producer uses `client`; the pipeline uses oncelog's Spark source and sink whatever it is."""
    return [Worker("producer", "src", ["--topic", "spark-in", "--rate", "200", "--client", client]),
            Worker("spark-copy", "spark", ["--topic", "spark-out", "--in-topic", "spark-in"]),
            Worker("lso-monitor", "spark-lso", ["--topic", "spark-out", "--interval", "0.5"])]


WORKLOADS: dict[str, tuple[Callable[[str], list[Worker]], list[str]]] = {
    "idempotent": (_workers_idempotent, ["idem"]),
    "transactions": (_workers_transactions, ["txn"]),
    "eos-copy": (_workers_copy, ["copy-in", "copy-out"]),
    "spark": (_workers_spark, ["spark-in", "spark-out"]),
    "consumer": (_workers_consumer, ["grp"]),
}
# What `make faults` runs by default on the single node (every workload works there; `consumer` is the
# cluster's, where the group coordinator moves with the leadership of __consumer_offsets).
SINGLE_NODE_WORKLOADS = ("idempotent", "transactions", "eos-copy", "spark")
GROUP = "fault-group"  # the consumer workload's group
PRODUCERS_DONE = "producers-done"  # written in the run's directory once every producer process has ended
COPY_OUTPUTS = ("copy-out", "spark-out")  # topics that must hold `copy:` + every value the `src` producer acked
CLIENTS = ("confluent", "oncelog")  # confluent-kafka (librdkafka) and oncelog's own client
# The order decides the first round of single-nemesis runs (see `plan`): client-kill meets the spark workload.
NEMESES = ("broker-kill", "broker-pause", "fsync-fail", "client-kill", "proxy-delay", "proxy-blackhole",
           "proxy-lose-responses", "proxy-cut", "disk-full")
# Cluster mode (--cluster, tests/faults/cluster.py): the default workloads (issue 15's, and issue 16's
# transactional and Spark ones) and the nemeses of a cluster (which broker each one strikes is chosen per fault,
# transaction coordinators among them, see cluster.py).
CLUSTER_WORKLOADS = ("idempotent", "consumer", "transactions", "eos-copy", "spark")
CLUSTER_NEMESES = ("broker-kill", "broker-pause", "inter-broker-cut", "inter-broker-delay", "coordination-kill",
                   "controller-kill", "client-kill")
DISK_MB = 256  # the size-limited data directory of runs with the disk-full nemesis
# A Spark driver needs 10-30 s (2 busy cores) before its first micro-batch. Spark runs give their workers this
# much more time and start the nemesis once the pipeline runs, so its faults strike a running pipeline.
SPARK_WARMUP_S = 30.0
BROKER_SETTINGS = {
    "transaction.max.timeout.ms": 60_000,
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1_000,
    "producer.id.expiration.ms": 4_000,
    "producer.id.expiration.check.interval.ms": 1_000,
    "group.initial.rebalance.delay.ms": 500,  # a new group settles between two broker kills
}


class Run:
    def __init__(self, workload: str, nemeses: list[str], seed: int, seconds: float, client: str,
                 workdir: Path) -> None:
        self.workload, self.nemeses, self.seed, self.seconds, self.client = workload, nemeses, seed, seconds, client
        self.rng = random.Random(seed)
        self.dir = workdir
        self.history = workdir / "history"
        self.history.mkdir(parents=True)
        self.nemesis_log = HistoryWriter(self.history / "nemesis.jsonl", "nemesis")
        self.broker: BrokerProcess | None = None
        self.proxy: FaultProxy | None = None
        self.workers: list[Worker] = []
        self.faults = 0
        self.deadline: float | None = None
        self.warmup = SPARK_WARMUP_S if workload == "spark" else 0.0
        self.spawned_at = 0.0
        self.disk: SmallDisk | None = None
        self.trigger = FsyncTrigger(workdir / "fail-fsync")
        self.stuck: list[str] = []  # workers that did not stop by themselves
        self.hung: list[str] = []  # workers restarted after their watchdog saw a client call hang
        self.kills: list[str] = []  # workers SIGKILLed by client-kill
        self.notes: dict[str, Any] = {}

    # -- setup ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        # The broker must advertise the proxy, so the proxy's port is fixed first and the broker's upstream port
        # found after the broker starts; the proxy learns it before any client connects.
        self.proxy = FaultProxy(upstream_port=0).start()
        settings = dict(BROKER_SETTINGS, **{"advertised.listeners": self.proxy.address}, **self.trigger.setting)
        if "disk-full" in self.nemeses:
            self.disk = SmallDisk(self.dir / "data", DISK_MB).mount()
        self.broker = BrokerProcess(self.dir / "data", settings).start()
        self.proxy.upstream_port = self.broker.port
        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        topics = WORKLOADS[self.workload][1]
        for name, future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics]).items():
            future.result(30)
            del name
        self.spawn_workers()

    def spawn_workers(self) -> None:
        factory = WORKLOADS[self.workload][0]
        self.workers = factory(self.client)
        self.spawned_at = time.monotonic()
        for w in self.workers:
            self._spawn(w)

    @staticmethod
    def _incarnation(w: Worker) -> str:
        """The name of the worker's current process: its history file and log are named after it."""
        return w.name if w.restarts == 0 else f"{w.name}-r{w.restarts}"

    def _past_start_up(self, w: Worker) -> bool:
        """A Spark driver is worth killing once it runs micro-batches: its JVM takes seconds to start, and a kill
        before the first batch would only test start-up. Other workers are killable at once."""
        if w.kind != "spark-copy":
            return True
        path = self.history / f"{self._incarnation(w)}.jsonl"
        return path.exists() and '"op":"batch"' in path.read_text()

    def _spawn(self, w: Worker) -> None:
        name = self._incarnation(w)
        args = [str(self.dir / a) if a == PRODUCERS_DONE else a for a in w.args]
        cmd = [sys.executable, "-m", "tests.faults.workers", w.kind, "--bootstrap", self.client_bootstrap,
               "--history", str(self.history), "--name", name, "--partitions", str(PARTITIONS),
               "--seconds", str(self.remaining()), "--seed", str(self.rng.randrange(1 << 30)),
               "--txn-timeout-ms", str(TXN_TIMEOUT_MS), *args]
        if self.worker_config:  # secured: the workers' credentials, in a file of the run's (not on the command line)
            config = self.dir / "worker-client.json"
            if not config.exists():
                config.touch(mode=0o600)
                config.write_text(json.dumps(self.worker_config))
            cmd += ["--client-config", str(config)]
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        w.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    @property
    def client_bootstrap(self) -> str:
        """What the workers bootstrap from: the proxy."""
        assert self.proxy is not None
        return self.proxy.address

    @property
    def read_bootstrap(self) -> str:
        """What the final read uses: straight to the broker."""
        assert self.broker is not None
        return self.broker.bootstrap

    @property
    def harness_config(self) -> dict[str, str]:
        """Client settings of the harness's own clients (final read, group offsets): none on a plain broker."""
        return {}

    @property
    def worker_config(self) -> dict[str, str]:
        """Client settings every worker adds to its clients' (`--client-config`): none on a plain broker."""
        return {}

    def remaining(self) -> float:
        if self.deadline is None:
            return self.seconds + self.warmup
        return max(1.0, self.deadline - time.monotonic())

    # -- the nemesis --------------------------------------------------------------------------------------------
    def run_nemesis(self) -> None:
        if self.warmup:  # wait for the pipeline's first micro-batch, within the workers' extra time
            drivers = [w for w in self.workers if w.kind == "spark-copy"]
            while (time.monotonic() < self.spawned_at + self.warmup
                   and not all(self._past_start_up(w) for w in drivers)):
                time.sleep(0.5)
        workers_end = self.spawned_at + self.seconds + self.warmup
        self.deadline = min(time.monotonic() + self.seconds, workers_end)
        time.sleep(min(3.0, self.seconds / 4))
        while time.monotonic() < self.deadline - 3:
            fault = self.rng.choice(self.nemeses)
            duration = self.rng.uniform(0.5, 3.0)
            if fault == "broker-pause" and self.rng.random() < 0.3:
                duration = self.rng.uniform(5.5, 8.0)  # past request.timeout.ms: answers come after retries
            self.nemesis_log.log("fault", kind=fault, phase="start", duration=duration)
            self.faults += 1
            self._inject(fault, duration)
            self.nemesis_log.log("fault", kind=fault, phase="stop")
            self.revive_hung()
            time.sleep(self.rng.uniform(1.0, 3.0))
        self.heal()

    def heal(self) -> None:
        """After the last fault (each fault heals itself on the single node)."""

    def revive_hung(self) -> None:
        """Restart workers whose watchdog ended them (a client call that never returned)."""
        for w in self.workers:
            if w.proc is not None and w.proc.poll() == HANG_EXIT and w.restarts < 5:
                self.hung.append(w.name)
                w.restarts += 1
                self._spawn(w)

    def _inject(self, fault: str, duration: float) -> None:
        assert self.broker is not None and self.proxy is not None
        if fault == "broker-kill":
            self.broker.kill()
            time.sleep(min(duration, 1.0))
            self.broker.start()
            self.proxy.upstream_port = self.broker.port
        elif fault == "broker-pause":  # SIGSTOP/SIGCONT: the broker freezes mid-request, clients time out
            os.kill(self.broker.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(duration)
            finally:
                os.kill(self.broker.proc.pid, signal.SIGCONT)
        elif fault == "disk-full":  # ENOSPC on every write until the ballast goes; no restart
            assert self.disk is not None
            self.disk.fill()
            try:
                time.sleep(duration)
            finally:
                self.disk.free()
        elif fault == "fsync-fail":
            # Every fsync fails with EIO: the written logs go offline (56) until a restart recovers them.
            self.trigger.arm()
            try:
                time.sleep(duration)
            finally:
                self.trigger.disarm()
            if self.rng.random() < 0.5:
                self.broker.stop()
                self.broker.start()
            else:
                self.broker.kill()
                self.broker.start()
            self.proxy.upstream_port = self.broker.port
        elif fault == "client-kill":
            self.kill_client()
        elif fault.startswith("proxy-"):
            mode = fault[len("proxy-"):].replace("-", "_")
            if mode == "cut":
                self.proxy.cut()
                return
            self.proxy.set_mode(mode, delay_s=0.2)
            try:
                time.sleep(duration)
            finally:
                self.proxy.set_mode("pass")
                if mode == "blackhole":
                    self.proxy.cut()  # stalled connections would otherwise wait for their client timeouts

    def kill_client(self) -> None:
        """SIGKILL one client process that writes (or a group member) and start it again."""
        victims = [w for w in self.workers
                   if w.kind in ("producer", "txn-producer", "copier", "spark-copy", "group-consumer")
                   and w.proc is not None and w.proc.poll() is None and self._past_start_up(w)]
        if victims:
            w = self.rng.choice(victims)
            self.nemesis_log.log("fault", kind="client-kill", phase="victim", victim=self._incarnation(w))
            self.kills.append(w.name)
            w.proc.kill()
            w.proc.wait()
            w.restarts += 1
            self._spawn(w)

    # -- the end ----------------------------------------------------------------------------------------------
    def finish(self) -> dict[str, Report]:
        end = time.monotonic() + self.seconds + 300
        while any(w.proc is not None and w.proc.poll() is None for w in self.workers) and time.monotonic() < end:
            time.sleep(0.5)
            self.revive_hung()  # a copier must finish draining its input for the copy check to mean anything
            if all(w.proc is None or w.proc.poll() is not None for w in self.workers if w.kind == "producer"):
                (self.dir / PRODUCERS_DONE).touch()  # group members may stop once they read everything
        for w in self.workers:
            if w.proc is not None:
                try:
                    w.proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    self.stuck.append(w.name)
                    w.proc.send_signal(signal.SIGUSR1)  # its stacks go to its log
                    time.sleep(1)
                    w.proc.kill()
                    w.proc.wait()
        self.nemesis_log.close()
        reports: dict[str, Report] = {}
        events = list(read_events(self.history))
        inputs = [e for e in events if e["op"] == "send" and e["w"].startswith("src")]
        input_acked = {e["v"] for e in inputs if e["phase"] == "ok"}
        input_tried = {e["v"] for e in inputs}
        for topic in WORKLOADS[self.workload][1]:
            final = self.final_read(topic)
            mine = [e for e in events if _topic_of(e, self.workers) in (topic, None)]
            copy = topic in COPY_OUTPUTS
            groups = {w.args[w.args.index("--group") + 1] for w in self.workers
                      if w.kind == "group-consumer" and _topic_of({"w": w.name}, self.workers) == topic}
            reports[topic] = check(mine, final, txn_timeout_s=TXN_TIMEOUT_MS / 1000, margin_s=10,
                                   expected={"copy:" + v for v in input_acked} if copy else set(),
                                   possible={"copy:" + v for v in input_tried} if copy else set(),
                                   group_committed={g: self.group_offsets(g, topic) for g in sorted(groups)})
        return reports

    def group_offsets(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed offset of each partition of `topic` after the run (-1: none)."""
        consumer = CKConsumer({"bootstrap.servers": self.read_bootstrap, "group.id": group,
                               "enable.auto.commit": False, **self.harness_config})
        try:
            found = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], 30)
        finally:
            consumer.close()
        return {tp.partition: tp.offset for tp in found}

    def final_read(self, topic: str) -> FinalRead:
        bootstrap = self.read_bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap, **self.harness_config})
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        deadline = time.monotonic() + TXN_TIMEOUT_MS / 1000 + HEAL_MARGIN_S
        caught_up: dict[int, bool] = {}
        while True:
            lso = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                     isolation_level=IsolationLevel.READ_COMMITTED)
            hwm = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                     isolation_level=IsolationLevel.READ_UNCOMMITTED)
            caught_up = {tp.partition: lso[tp].result(10).offset == hwm[tp].result(10).offset for tp in tps}
            if all(caught_up.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        low = admin.list_offsets({tp: OffsetSpec.earliest() for tp in tps})
        log_start = {tp.partition: low[tp].result(10).offset for tp in tps}
        starts = dict(log_start)

        def scan(iso: str) -> dict[int, list[tuple[int, str]]]:
            out: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
            for rec in ck_consume(bootstrap, topic, starts, timeout=120,
                                  **{**self.harness_config, "isolation.level": iso}):
                out[rec.partition].append((rec.offset, rec.value.decode()))
            return out

        return FinalRead(committed=scan("read_committed"), uncommitted=scan("read_uncommitted"),
                         log_start=log_start, lso_caught_up=caught_up)

    def stop(self) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
        if self.broker is not None and self.broker.alive():
            self.broker.stop()
        if self.proxy is not None:
            self.proxy.stop()
        if self.disk is not None:
            self.disk.free()
            self.disk.unmount()


def _topic_of(event: dict[str, Any], workers: list[Worker]) -> str | None:
    """The topic an event is about: from the worker that wrote it (the nemesis writes about every topic)."""
    writer = event["w"]
    for w in workers:
        if writer == w.name or writer.startswith(w.name + "-r"):
            return w.args[w.args.index("--topic") + 1]
    return None


def one_run(workload: str, nemeses: list[str], seed: int, seconds: float, client: str, keep: Path | None,
            cluster: bool = False, secure: bool = False) -> RunResult:
    if secure and not cluster:
        raise ValueError("secure runs are cluster runs (--secure needs --cluster)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="oncelog-faults-") as tmp:
        if cluster:
            from tests.faults.cluster import ClusterRun

            run: Run = ClusterRun(workload, nemeses, seed, seconds, client, Path(tmp), secure=secure)
        else:
            run = Run(workload, nemeses, seed, seconds, client, Path(tmp))
        try:
            run.start()
            run.run_nemesis()
            reports = run.finish()
        finally:
            run.stop()
            if keep is not None:
                dest = keep / f"{'cluster-' if cluster else ''}{'secure-' if secure else ''}{workload}-{client}-{seed}"
                subprocess.run(["cp", "-r", tmp, str(dest)], check=False)
        operations = sum(1 for e in read_events(run.history) if e.get("phase") in ("invoke", None)
                         and e["op"] in ("send", "read", "delete", "commit"))
    return RunResult(workload, nemeses, seed, client, reports, run.faults, operations, time.monotonic() - started,
                     len(run.hung) + len(run.stuck), dict(Counter(run.kills)), run.notes)


def summarize(results: list[RunResult], all_nemeses: list[str] | None = None) -> dict[str, Any]:
    rows = []
    for r in results:
        counts = {name: sum(len(rep.anomalies[name]) for rep in r.report.values()) for name in ANOMALIES}
        label = _nemesis_label(r.nemeses, all_nemeses or r.nemeses)
        rows.append({"workload": r.workload, "client": r.client, "seed": r.seed, "nemesis": label, "nemeses": r.nemeses,
                     "faults": r.faults,
                     "operations": r.operations, "seconds": round(r.seconds, 1),
                     "client_restarts": r.client_restarts, "client_kills": r.client_kills, "notes": r.notes,
                     **counts,
                     "examples": {name: rep.anomalies[name][:3] for rep in r.report.values()
                                  for name in ANOMALIES if rep.anomalies[name]}})
    return {"runs": rows, "total": {
        "runs": len(rows), "faults": sum(r["faults"] for r in rows), "operations": sum(r["operations"] for r in rows),
        "client_restarts": sum(r["client_restarts"] for r in rows),
        "client_kills": sum(sum(r["client_kills"].values()) for r in rows),
        **{name: sum(r[name] for r in rows) for name in ANOMALIES}}}


def print_table(summary: dict[str, Any]) -> None:
    short = {"lost_writes": "lost", "duplicates": "dup", "aborted_reads": "G1a", "uncommitted_reads": "uncommit",
             "reordering": "reorder", "nonmonotonic_polls": "nonmono", "inconsistent_offsets": "inconsist",
             "phantoms": "phantom", "hanging_transactions": "hanging", "lost_commits": "lostcmt",
             "group_skips": "grpskip", "replica_divergence": "diverge",
             "under_replicated": "underrep"}
    head = (f"{'workload':<14}{'client':<10}{'nemesis':<22}{'seed':>6}{'faults':>8}{'ops':>8}{'kills':>7}{'restarts':>10}"
            + "".join(f"{short[n]:>10}" for n in ANOMALIES))
    print(head)
    for r in summary["runs"]:
        print(f"{r['workload']:<14}{r['client']:<10}{r['nemesis'][:21]:<22}{r['seed']:>6}{r['faults']:>8}"
              f"{r['operations']:>8}{sum(r['client_kills'].values()):>7}{r['client_restarts']:>10}"
              + "".join(f"{r[n]:>10}" for n in ANOMALIES))
    t = summary["total"]
    print(f"{'TOTAL':<14}{'':<10}{str(t['runs']) + ' runs':<22}{'':>6}{t['faults']:>8}{t['operations']:>8}"
          f"{t['client_kills']:>7}{t['client_restarts']:>10}" + "".join(f"{t[n]:>10}" for n in ANOMALIES))


def plan(runs: int, workloads: list[str], nemeses: list[str],
         clients: Sequence[str] = ("confluent",)) -> list[tuple[str, list[str], str]]:
    """Which workload under which nemeses with which client, run by run.

    First every workload under all nemeses mixed, each once per client in a row (consecutive runs alternate
    clients). Then every nemesis alone, in rounds: each round gives every nemesis one run, each on the next
    (workload, client) pair, workloads turning fastest, so the first round already puts every nemesis alone
    against most workloads and both clients, and after as many rounds as there are pairs every nemesis has met
    every pair exactly once. Around again when `runs` is larger than the whole matrix.
    """
    matrix = [(w, list(nemeses), c) for w in workloads for c in clients]
    if len(nemeses) > 1:
        pairs = [(w, c) for c in clients for w in workloads]
        for rnd in range(len(pairs)):
            for i, n in enumerate(nemeses):
                w, c = pairs[(i + rnd) % len(pairs)]
                matrix.append((w, [n], c))
    return [matrix[i % len(matrix)] for i in range(runs)]


def _nemesis_label(run_nemeses: list[str], all_nemeses: list[str]) -> str:
    return "mix" if len(run_nemeses) > 1 and run_nemeses == list(all_nemeses) else "+".join(run_nemeses)


def usable_nemeses(nemeses: list[str], known: Sequence[str] = NEMESES) -> list[str]:
    """The nemeses this machine can run: disk-full needs a size-limited tmpfs (root and mount)."""
    unknown = sorted(set(nemeses) - set(known))
    if unknown:
        raise SystemExit(f"unknown nemeses {unknown}; known: {', '.join(known)}")
    if "disk-full" in nemeses:
        with tempfile.TemporaryDirectory(prefix="oncelog-disk-") as tmp:
            try:
                SmallDisk(Path(tmp) / "probe", 1).mount().unmount()
            except DiskUnavailable as exc:
                print(f"skipping the disk-full nemesis: {exc}", flush=True)
                nemeses = [n for n in nemeses if n != "disk-full"]
    return nemeses


def cluster_runtime() -> None:
    """Cluster runs need java and ZooKeeper's jars (`make coordination-setup`); exit with the reason if not."""
    from oncelog.cluster.zookeeper_jars import CoordinationUnavailable, java_executable, zookeeper_classpath

    try:
        java_executable()
        zookeeper_classpath()
    except CoordinationUnavailable as exc:
        raise SystemExit(f"cluster runs need ZooKeeper: {exc}") from None


def usable_workloads(workloads: list[str]) -> list[str]:
    """The workloads this machine can run: spark needs a JDK on PATH and pyspark (the `spark` extra)."""
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    if "spark" in workloads:
        missing = [] if shutil.which("java") else ["a JDK (`java` on PATH)"]
        if importlib.util.find_spec("pyspark") is None:
            missing.append("pyspark (the `spark` extra)")
        if missing:
            print(f"skipping the spark workload: it needs {' and '.join(missing)}", flush=True)
            workloads = [w for w in workloads if w != "spark"]
    return workloads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--workloads", help=f"default: {','.join(SINGLE_NODE_WORKLOADS)}; with --cluster "
                                            f"{','.join(CLUSTER_WORKLOADS)}")
    parser.add_argument("--nemeses", help=f"default: {','.join(NEMESES)}; with --cluster {','.join(CLUSTER_NEMESES)}")
    parser.add_argument("--cluster", action="store_true",
                        help="three brokers (RF 3, min.insync.replicas 2) on a 3-member ZooKeeper ensemble")
    parser.add_argument("--secure", action="store_true",
                        help="with --cluster: SASL_SSL listeners (SCRAM-SHA-512 between brokers), ACLs on, the "
                             "workers a principal holding only their workload's ACLs (tests/faults/secure.py)")
    parser.add_argument("--clients", default=",".join(CLIENTS),
                        help="comma-separated clients the workers use (confluent, oncelog); runs alternate them")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"),
                        help="directory for faults-<time>.json, or a path ending in .json")
    parser.add_argument("--keep", help="copy each run's histories and logs into this directory")
    args = parser.parse_args(argv)
    if args.secure and not args.cluster:
        raise SystemExit("--secure runs the cluster fault runs on a secured cluster: it needs --cluster")
    if args.cluster:
        cluster_runtime()
    default_workloads = CLUSTER_WORKLOADS if args.cluster else SINGLE_NODE_WORKLOADS
    if args.secure:
        from tests.faults.secure import SECURE_WORKLOADS

        default_workloads = SECURE_WORKLOADS
        if args.workloads and "spark" in args.workloads.split(","):
            raise SystemExit("--secure: the spark workload does not run on the secured cluster (its worker passes no "
                             "security options to the pipeline; the sink under ACLs: docs/security.md §9)")
    workloads = usable_workloads((args.workloads or ",".join(default_workloads)).split(","))
    clients = args.clients.split(",")
    if unknown := sorted(set(clients) - set(CLIENTS)):
        raise SystemExit(f"unknown clients {unknown}; known: {', '.join(CLIENTS)}")
    known = CLUSTER_NEMESES if args.cluster else NEMESES
    nemeses = usable_nemeses((args.nemeses or ",".join(known)).split(","), known)
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    results = []
    for i, (workload, run_nemeses, client) in enumerate(plan(args.runs, workloads, nemeses, clients)):
        result = one_run(workload, run_nemeses, args.seed + i, args.seconds, client, keep, cluster=args.cluster,
                         secure=args.secure)
        results.append(result)
        print(f"run {i + 1}/{args.runs}: {workload} ({client}) under {_nemesis_label(run_nemeses, nemeses)} seed "
              f"{args.seed + i}: {result.faults} faults, {result.operations} ops, {result.seconds:.0f} s", flush=True)
    summary = summarize(results, nemeses)
    print_table(summary)
    out = Path(args.out)
    if out.suffix != ".json":
        out = out / f"faults-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, default=str))
    print(f"results: {out}")
    return 0 if all(summary["total"][n] == 0 for n in ANOMALIES) else 1


if __name__ == "__main__":
    sys.exit(main())
