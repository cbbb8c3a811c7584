"""Kafka's `transactions_test` (kafkatest/tests/core/transactions_test.py) on three oncelog brokers.

An input topic is filled first; then two transactional copiers (tests/faults/workers.py `copier`, separate
processes so they can be SIGKILLed: a read_committed consumer in one group, a transactional producer with its
own transactional.id per copier slot, the consumed offsets sent with each transaction, i.e. TxnOffsetCommit)
copy it to an output topic while brokers are bounced in turn (SIGKILL + restart, SIGTERM + restart) and
copiers are SIGKILLed or stopped cleanly (SIGTERM) and started again with the same transactional.id. The copiers stop by themselves once the
group's committed offsets reach the end of the input.

Then, as in Kafka's test, the output read with read_committed must hold every input message exactly once; here
also in order: the copier writes each record to the output partition of the same number as its input partition,
in the order it read them, so output partition p must equal `copy:` + input partition p, value for value (a
loss, a duplicate or a reordering all break that equality; the values are unique). And nothing is left hanging:
no transaction Ongoing/Prepare* on any broker (ListTransactions), no producer with an open transaction on the
output partitions or the group's __consumer_offsets partition (DescribeProducers), last stable offset = high
watermark on input and output.

Cluster: RF 3, min.insync.replicas 2, transaction.state.log.replication.factor 3 with min ISR 2. Every wait is
bounded by converge_s() (the brokers' ZooKeeper session timeout) or by the message count at a floor rate; the
bounce schedule waits for the cluster to be whole again and for the copy to progress before the next bounce.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from kafka.protocol.admin import DescribeProducersRequest, ListTransactionsRequest

from oncelog.coordinator.partitioning import partition_for
from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import (
    SESSION_MS,
    SETTINGS,
    START_S,
    converge_s,
    partitions,
    request,
    wait_for,
)
from tests.faults.workers import HANG_EXIT
from tests.integration.helpers import ck_consume

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
INTERNAL_PARTITIONS = 3
GROUP = "txn-copier"
IN_TOPIC, OUT_TOPIC = "copy-input", "copy-output"
VALUE_BYTES = 100
TXN_TIMEOUT_MS = 10_000
COPIER_SETTINGS = {
    **SETTINGS,
    "default.replication.factor": 3,
    "min.insync.replicas": 2,
    "offsets.topic.replication.factor": 3,
    "offsets.topic.num.partitions": INTERNAL_PARTITIONS,
    "transaction.state.log.replication.factor": 3,
    "transaction.state.log.min.isr": 2,
    "transaction.state.log.num.partitions": INTERNAL_PARTITIONS,
    "group.initial.rebalance.delay.ms": 0,
}
MIN_RATE = 50  # records/s: a floor for the copy's time budget on a loaded two-core machine (measured: see docs)
OPEN_STATES = {"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"}


def restart_s() -> float:
    """A broker's restart: its old session expires (after a SIGKILL) before it registers, then it starts."""
    return SESSION_MS / 1000 + 60


def budget_s(messages: int, bounces: int) -> float:
    """The whole copy, bounded: every bounce may take a restart and a convergence, and the records a floor rate."""
    return bounces * (restart_s() + 2 * converge_s()) + messages / MIN_RATE + START_S


@dataclass
class Copier:
    slot: int
    proc: subprocess.Popen | None = None
    incarnation: int = 0
    exits: list[int] = field(default_factory=list)  # exit codes of ended incarnations other than the last

    @property
    def name(self) -> str:
        return f"copier-{self.slot}" if self.incarnation == 0 else f"copier-{self.slot}-r{self.incarnation}"


class CopyRun:
    """The input, the copier processes, the bounces, and what the test reads at the end."""

    def __init__(self, c: ClusterProcess, workdir: Path, messages: int, batch: int, budget: float) -> None:
        self.c, self.dir, self.messages, self.batch = c, workdir, messages, batch
        self.deadline = time.monotonic() + budget
        self.history = workdir / "history"
        self.history.mkdir(parents=True, exist_ok=True)
        self.copiers = [Copier(0), Copier(1)]
        self.bounces: list[dict[str, Any]] = []
        # read_uncommitted: its OffsetFetch does not ask for stable offsets, so it answers at once with what the
        # group committed instead of retrying while a copier's transaction holds offsets pending (nearly always).
        self.watcher = Consumer({"bootstrap.servers": c.bootstrap, "group.id": GROUP, "enable.auto.commit": False,
                                 "isolation.level": "read_uncommitted"})

    # -- input ------------------------------------------------------------------------------------------------
    def create_topics(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.c.bootstrap})
        futures = admin.create_topics([NewTopic(t, PARTITIONS, 3, config={"min.insync.replicas": "2"})
                                       for t in (IN_TOPIC, OUT_TOPIC)])
        for future in futures.values():
            future.result(60)
        wait_for(lambda: not self.lagging(), "the topics' replicas in sync")

    def fill_input(self) -> dict[int, list[str]]:
        """`messages` unique values of VALUE_BYTES round-robin over the input partitions (idempotent, acks=all);
        returns the input as it is in the log, partition by partition."""
        p = Producer({"bootstrap.servers": self.c.bootstrap, "enable.idempotence": True, "linger.ms": 20})
        failed: list[str] = []
        for n in range(self.messages):
            value = f"m{n:08d}-".ljust(VALUE_BYTES, "x")
            while True:
                try:
                    p.produce(IN_TOPIC, value.encode(), partition=n % PARTITIONS,
                              on_delivery=lambda err, msg: failed.append(str(err)) if err else None)
                    break
                except BufferError:
                    p.poll(0.1)
            p.poll(0)
        assert p.flush(converge_s()) == 0, "input not all acknowledged"
        assert not failed, failed[:3]
        got = self.read(IN_TOPIC, "read_uncommitted")
        assert sum(len(v) for v in got.values()) == self.messages
        return got

    # -- copiers ----------------------------------------------------------------------------------------------
    def spawn(self, copier: Copier) -> None:
        drain = max(1.0, self.deadline - time.monotonic())
        cmd = [sys.executable, "-m", "tests.faults.workers", "copier", "--bootstrap", self.c.bootstrap,
               "--topic", OUT_TOPIC, "--in-topic", IN_TOPIC, "--partitions", str(PARTITIONS),
               "--history", str(self.history), "--name", copier.name, "--seconds", "1", "--drain-max-s", str(drain),
               "--group", GROUP, "--slot", str(copier.slot), "--batch", str(self.batch),
               "--txn-timeout-ms", str(TXN_TIMEOUT_MS)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        with open(self.dir / f"{copier.name}.log", "ab") as log:
            copier.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)

    def revive(self) -> None:
        """A copier that exited with an error (its watchdog saw a client call hang: HANG_EXIT) is started again,
        as an application would; every such exit is kept for the report."""
        for copier in self.copiers:
            code = copier.proc.poll() if copier.proc is not None else None
            if code not in (None, 0):
                copier.exits.append(code)
                copier.incarnation += 1
                self.spawn(copier)

    def bounce_copier(self, copier: Copier, clean: bool) -> None:
        """SIGKILL, or SIGTERM (the copier commits the transaction under way, leaves the group and exits 0),
        then the same slot again: the same transactional.id."""
        assert copier.proc is not None
        if clean:
            copier.proc.terminate()
            # Its transaction's calls are bounded (30 s each) and it polls at most 0.5 s between them.
            code = copier.proc.wait(timeout=3 * 30 + converge_s())
            if code == HANG_EXIT and not self.stopped_on_sigterm(copier):
                # Its watchdog ended it inside the transaction loop, before the loop saw the SIGTERM: a client
                # call that hung (the librdkafka hang revive() restarts; see tests/faults/workers.py Watchdog),
                # not the clean stop, which begins after the loop. Counted like revive()'s restarts.
                copier.exits.append(code)
            else:
                assert code == 0, f"{copier.name} did not stop cleanly (exit {code}): {self.last_words(copier)}"
        else:
            copier.proc.kill()
            copier.proc.wait()
        copier.incarnation += 1
        self.spawn(copier)

    def history_events(self, copier: Copier) -> list[dict[str, Any]]:
        path = self.history / f"{copier.name}.jsonl"
        if not path.exists():
            return []
        events = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:  # a line torn by a SIGKILL
                continue
        return events

    def stopped_on_sigterm(self, copier: Copier) -> bool:
        """The copier's loop saw the SIGTERM (it logs that before leaving its group and closing)."""
        return any(e.get("stopped") == "SIGTERM" for e in self.history_events(copier))

    def last_words(self, copier: Copier) -> str:
        """For a failed clean stop: the copier's last history events and the end of its log (the watchdog's
        traceback, if it fired)."""
        events = self.history_events(copier)[-4:]
        log_text = (self.dir / f"{copier.name}.log").read_text(errors="replace")
        lines = [line for line in log_text.splitlines() if not line.startswith("%")][-40:]
        return f"last events {events}; log tail:\n" + "\n".join(lines)

    def running(self) -> bool:
        return any(cp.proc is not None and cp.proc.poll() is None for cp in self.copiers)

    # -- brokers ----------------------------------------------------------------------------------------------
    def bounce_broker(self, node: int, clean: bool) -> None:
        if clean:
            self.c.stop_broker(node, timeout=converge_s())
        else:
            self.c.kill(node)
        self.c.start_broker(node, timeout=restart_s())

    def lagging(self) -> list[str]:
        """Partitions of the topics the copy uses without a leader or their whole ISR; the internal topics too
        once they exist (the first FindCoordinator creates them)."""
        out = []
        for topic in (IN_TOPIC, OUT_TOPIC, "__consumer_offsets", "__transaction_state"):
            found = partitions(self.c, topic)
            if not found and not topic.startswith("__"):
                out.append(f"{topic}: no metadata")
            for index, p in found.items():
                if p.leader_id < 0 or sorted(p.isr_nodes) != sorted(p.replica_nodes):
                    out.append(f"{topic}-{index} leader {p.leader_id} isr {sorted(p.isr_nodes)}")
        return out

    # -- progress ---------------------------------------------------------------------------------------------
    def copied(self) -> int:
        """Records the group has committed (the copiers' transactions that committed), all partitions."""
        found = self.watcher.committed([TopicPartition(IN_TOPIC, p) for p in range(PARTITIONS)], 10)
        return sum(max(tp.offset, 0) for tp in found)

    def wait_copied(self, since: int, target: int, what: str) -> int:
        """Until the copy committed at least `target` records (or is complete): how many it has then. Bounded by
        converge_s() twice (a rebalance after a copier's SIGKILL waits out its session, an election a broker's)
        plus the records from `since` to `target` at the floor rate."""
        def reached() -> int | None:
            self.revive()
            now = self.copied()
            return now if now >= min(target, self.messages) else None
        timeout = 2 * converge_s() + max(target - since, 0) / MIN_RATE
        return wait_for(reached, f"{target} records copied ({what}; {since} before)", timeout=timeout)

    # -- the end ------------------------------------------------------------------------------------------------
    def wait_copiers(self) -> None:
        while self.running() or any(cp.proc is not None and cp.proc.poll() not in (None, 0) for cp in self.copiers):
            assert time.monotonic() < self.deadline, (
                f"copiers still running at the deadline; copied {self.copied()} of {self.messages}")
            self.revive()
            time.sleep(0.5)

    def read(self, topic: str, isolation: str) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
        timeout = converge_s() + self.messages / 1000
        for rec in ck_consume(self.c.bootstrap, topic, dict.fromkeys(range(PARTITIONS), 0), timeout=timeout,
                              **{"isolation.level": isolation}):
            out[rec.partition].append(rec.value.decode())
        return out

    def stable_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """{partition: (last stable offset, high watermark)}."""
        admin = AdminClient({"bootstrap.servers": self.c.bootstrap})
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        lso = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, isolation_level=IsolationLevel.READ_COMMITTED)
        hwm = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                 isolation_level=IsolationLevel.READ_UNCOMMITTED)
        return {tp.partition: (lso[tp].result(30).offset, hwm[tp].result(30).offset) for tp in tps}

    def open_transactions(self) -> dict[int, dict[str, str]]:
        """{broker: {transactional id: state}} of every transaction ListTransactions shows in an open state."""
        out = {}
        for node in self.c.alive():
            resp = request(self.c, node, ListTransactionsRequest[0](state_filters=[], producer_id_filters=[]), 0)
            assert resp.error_code == 0, (node, resp)
            out[node] = {s.transactional_id: s.transaction_state for s in resp.transaction_states
                         if s.transaction_state in OPEN_STATES}
        return out

    def open_producers(self, topic: str, indexes: list[int]) -> list[str]:
        """Producers with a transaction still open (current_txn_start_offset >= 0) on each partition's leader."""
        out = []
        found = partitions(self.c, topic)
        for index in indexes:
            req = DescribeProducersRequest[0]
            resp = request(self.c, found[index].leader_id,
                           req(topics=[req.TopicRequest(name=topic, partition_indexes=[index])]), 0)
            (answer,) = resp.topics[0].partitions
            assert answer.error_code == 0, (topic, index, answer)
            out += [f"{topic}-{index} producer {s.producer_id} epoch {s.producer_epoch} open since "
                    f"{s.current_txn_start_offset}" for s in answer.active_producers if s.current_txn_start_offset >= 0]
        return out

    def stop(self) -> None:
        for copier in self.copiers:
            if copier.proc is not None and copier.proc.poll() is None:
                copier.proc.kill()
                copier.proc.wait()
        self.watcher.close()


def first_difference(want: list[str], got: list[str]) -> str:
    """Where two value lists part, with what is missing and duplicated, for the failure message."""
    index = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
    missing = sorted(set(want) - set(got))
    seen: set[str] = set()
    dupes = sorted({v for v in got if v in seen or seen.add(v)})
    return (f"{len(got)} values for {len(want)}; first difference at index {index}: want "
            f"{want[index][:16] if index < len(want) else None} got {got[index][:16] if index < len(got) else None}; "
            f"missing {len(missing)} {[v[:16] for v in missing[:5]]}; duplicated {len(dupes)} "
            f"{[v[:16] for v in dupes[:5]]}")


def run_copy(c: ClusterProcess, workdir: Path, messages: int, batch: int,
             schedule: list[tuple[str, int, bool]]) -> dict[str, Any]:
    """Fill the input, start the copiers, bounce along `schedule` ((broker|copier, which, clean)) while the copy
    runs, wait for the copiers to finish, check. Returns what it measured.

    Bounce i of n strikes once i/(n+1) of the records are copied (as Kafka's test bounces a copier once it made
    progress), so the bounces are spread over the whole copy and each one strikes a copy that is running: the
    one before it is over (broker back, every replica in sync) and the copy went on since."""
    run = CopyRun(c, workdir, messages, batch, budget_s(messages, len(schedule)))
    started = time.monotonic()
    try:
        run.create_topics()
        want = run.fill_input()
        # The group's coordinator is found (and __consumer_offsets created) before the copy starts, so the first
        # progress samples are not late by that much.
        wait_for(lambda: run.copied() == 0 or None, "the group's committed offsets (none yet)")
        filled = time.monotonic()
        for copier in run.copiers:
            run.spawn(copier)
        copied = run.wait_copied(0, 1, "the first commit")
        for i, (kind, which, clean) in enumerate(schedule, start=1):
            copied = run.wait_copied(copied, messages * i // (len(schedule) + 1), f"before the {kind} {which} bounce")
            if copied >= messages:
                break
            entry = {"kind": kind, "which": which, "clean": clean, "copied_before": copied}
            if kind == "broker":
                run.bounce_broker(which, clean)
                wait_for(lambda: not run.lagging(), f"every replica in sync after broker {which}'s bounce")
            else:
                run.bounce_copier(run.copiers[which], clean)
            run.bounces.append(entry)
        run.wait_copiers()
        copy_done = time.monotonic()

        wait_for(lambda: all(lso == hw for lso, hw in run.stable_offsets(OUT_TOPIC).values()),
                 "the output's last stable offsets to reach the high watermarks")
        got = run.read(OUT_TOPIC, "read_committed")
        for p in range(PARTITIONS):
            expected = ["copy:" + v for v in want[p]]
            assert got[p] == expected, f"output partition {p}: {first_difference(expected, got[p])}"
        for topic in (IN_TOPIC, OUT_TOPIC):
            offsets = run.stable_offsets(topic)
            assert all(lso == hw for lso, hw in offsets.values()), (topic, offsets)
        assert run.open_transactions() == {node: {} for node in c.alive()}
        group_partition = partition_for(GROUP, INTERNAL_PARTITIONS)
        assert run.open_producers(OUT_TOPIC, list(range(PARTITIONS))) == []
        assert run.open_producers("__consumer_offsets", [group_partition]) == []
        # Asked again on an error: a watcher whose group coordinator died in a bounce may time out once.
        assert wait_for(lambda: (run.copied(),), "the group's committed offsets") == (messages,)
        return {"bounces": run.bounces, "copier_exits": {cp.slot: cp.exits for cp in run.copiers},
                "fill_s": round(filled - started, 1), "copy_s": round(copy_done - filled, 1),
                "total_s": round(time.monotonic() - started, 1)}
    finally:
        run.stop()


def _report(result: dict[str, Any]) -> None:
    print(f"transactions copier: {result}")  # shown with -s / in a failure's captured output


@pytest.fixture
def copier_cluster(cluster_factory):
    return cluster_factory(3, **COPIER_SETTINGS)


@pytest.mark.timeout(int(budget_s(5_000, 2) + 2 * START_S))
def test_a_transactional_copy_through_a_broker_and_a_copier_sigkill_is_exactly_once(copier_cluster, tmp_path):
    """Short: 5,000 records in small transactions (20 records, so a few hundred of them); one copier SIGKILLed
    and restarted a quarter of the way, one broker SIGKILLed and restarted half way, the other copier stopped
    cleanly (SIGTERM) and restarted three quarters of the way."""
    result = run_copy(copier_cluster, tmp_path, 5_000, 20, [("copier", 0, False), ("broker", 1, False),
                                                             ("copier", 1, True)])
    _report(result)
    assert [b["kind"] for b in result["bounces"]] == ["copier", "broker", "copier"], result
    assert all(b["copied_before"] < 5_000 for b in result["bounces"]), result


LONG_SCHEDULE = [("broker", 1, False), ("copier", 0, False), ("broker", 2, True), ("copier", 1, True),
                 ("broker", 3, False), ("copier", 0, True), ("broker", 1, True), ("copier", 1, False),
                 ("broker", 2, False), ("copier", 0, False), ("broker", 3, True), ("copier", 1, True)]


@pytest.mark.cluster_slow
@pytest.mark.timeout(int(budget_s(100_000, len(LONG_SCHEDULE)) + 2 * START_S))
def test_kafka_transactions_test_100k_records_through_broker_and_copier_bounces(copier_cluster, tmp_path):
    """Long (Kafka's transactions_test): 100,000 records, brokers hard- and clean-bounced in turn, copiers
    hard- and clean-bounced in turn between them. Every bounce of the schedule that starts before the copy is
    complete is made (bounce i of n once i/(n+1) of the records are copied); at least one hard and one clean
    bounce of a broker and of a copier, and a bounce of each copier, must strike a running copy for the run to
    count."""
    result = run_copy(copier_cluster, tmp_path, 100_000, 200, LONG_SCHEDULE)
    _report(result)
    made = {(b["kind"], b["clean"]) for b in result["bounces"]}
    assert {("broker", False), ("broker", True), ("copier", False), ("copier", True)} <= made, result
    assert {b["which"] for b in result["bounces"] if b["kind"] == "copier"} == {0, 1}, result
