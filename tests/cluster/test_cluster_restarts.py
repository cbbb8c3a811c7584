"""Restarts and pauses of a 3-broker cluster under an idempotent acks=all confluent-kafka producer (issue 15,
"Tests"): every broker SIGKILLed at once and restarted on its data, a rolling restart (SIGTERM = controlled
shutdown) with a consumer group reading, and a partition leader SIGSTOPped past its ZooKeeper session.

Each test checks the records against the producer's own delivery reports (an acknowledged record is at the
offset its report named, once, in order) and then every replica's log: the same size and producer state on all
three brokers (DescribeLogDirs, DescribeProducers), and the same records served by each broker once it leads
(tests/cluster/replica_logs.py). Waits come from the session timeout (converge_s()), never from this machine.

In `make test`: the whole-cluster SIGKILL (the one guarantee no other test covers: acks=all writes are fsynced on
the ISR, docs/cluster.md §4.3) and the leader SIGSTOP (the paused-leader fencing of §3; test_replication_processes
only pauses followers, within their session). The rolling restart is `cluster_slow`: it restarts a broker three
times under a producer and a group (the most process starts, the heaviest on a loaded machine), and
test_cluster_brokers.py already runs a controlled shutdown under an idempotent producer in `make test`. Each takes
10-23 s (plus the cluster start) on a shared 2-core machine.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import (
    SESSION_MS,
    SETTINGS,
    START_S,
    converge_s,
    partitions,
    produce,
    wait_for,
)
from tests.cluster.replica_logs import (
    LOG_END,
    NODES,
    Writer,
    list_offset,
    served_by_each,
    wait_isr_whole,
    wait_replicas_agree,
)

DIVERGENT = b"only-on-the-paused-leader"
FLOWING = 300  # acknowledged records that show writes flow (a few seconds of the writer's pace)


@pytest.fixture
def cluster(coordination_connect, tmp_path):
    c = ClusterProcess(tmp_path / "cluster", 3, SETTINGS, connect=coordination_connect).start(START_S)
    yield c
    c.kill_all()  # the chroot is this test's alone: the sessions left behind expire unseen


def create(c: ClusterProcess, topic: str, count: int) -> list[int]:
    """RF 3 and min.insync.replicas 2: an acks=all write is on at least two disks when it is acknowledged."""
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(topic, count, 3, config={"min.insync.replicas": "2"})],
                        operation_timeout=30)[topic].result(60)
    wait_isr_whole(c, topic)
    return list(range(count))


def check_logs(c: ClusterProcess, writer: Writer, topic: str, parts: list[int]) -> dict[int, list[tuple[int, bytes]]]:
    """Every replica holds one log per partition, and that log keeps every acknowledged record exactly once at its
    acknowledged offset, with no hole and no record twice, in the order it was produced; the log."""
    wait_isr_whole(c, topic)
    sizes = wait_replicas_agree(c, topic, parts)
    ends: dict[int, dict[int, tuple[int, int]]] = {}
    served = served_by_each(c, topic, parts, ends)
    log = served[NODES[0]]
    for node in NODES:
        assert served[node] == log, f"broker {node} serves another log than broker {NODES[0]}"
        # Leading, each answers the same high watermark and log end: the whole log, committed.
        assert ends[node] == {p: (len(log[p]), len(log[p])) for p in parts}, (node, ends)
    acked = writer.acked_by_partition()
    for p in parts:
        offsets = [o for o, _ in log[p]]
        values = [v for _, v in log[p]]
        assert offsets == list(range(len(offsets))), f"holes in partition {p}"
        assert len(set(values)) == len(values), f"a record twice in partition {p}"
        assert values == sorted(values), f"partition {p} out of the order produced"
        held = dict(log[p])
        lost = {o: v for o, v in acked[p].items() if held.get(o) != v}
        assert lost == {}, f"acknowledged records of partition {p} not at their offsets"
    print(f"\n{topic}: {sum(len(v) for v in log.values())} records in {sizes} bytes per partition on each broker; "
          f"{len(writer.acked)} acknowledged, {len(writer.failed)} failed, {writer.produced} produced")
    return log


def test_whole_cluster_sigkill_and_restart_loses_no_acknowledged_write(cluster):
    c = cluster
    parts = create(c, "durable", 3)
    # The producer keeps its records across the outage (a message timeout well past a restart) and goes on after.
    # Written as fast as it goes, so that many records are in flight (appended somewhere, not yet acknowledged)
    # when the brokers die.
    writer = Writer(c.bootstrap, "durable", parts, message_timeout_ms=int(3 * converge_s() * 1000),
                    pace_s=0).start()
    try:
        wait_for(lambda: len(writer.acked) > 10 * FLOWING, "writes to flow", 60)
        pids = [b.proc.pid for b in c.brokers.values() if b.proc is not None]
        for pid in pids:  # all three before any is reaped: none outlives another
            os.kill(pid, signal.SIGKILL)
        acked_at_kill, produced_at_kill = len(writer.acked), writer.produced
        c.kill_all()
        c.start(START_S + SESSION_MS / 1000)  # each waits out its previous session, then registers
        restarted = time.monotonic()
        wait_for(lambda: writer.acked_since(restarted) > FLOWING, "writes to flow after the restart")
    finally:
        writer.stop()
    assert writer.remaining == 0
    log = check_logs(c, writer, "durable", parts)
    # Nothing the log holds was made up: each record is one the writer produced.
    assert {v for recs in log.values() for _, v in recs} <= {b"%08d" % i for i in range(writer.produced)}
    print(f"at the kill: {acked_at_kill} acknowledged of {produced_at_kill} produced")


class GroupReader:
    """A consumer group member (confluent-kafka) reading `topic` on a thread of its own until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rolling-{uuid.uuid4().hex[:6]}",
                                  "auto.offset.reset": "earliest", "error_cb": self._client_error})
        self.topic = topic
        self.records: list[tuple[int, int, bytes]] = []   # (partition, offset, value), as delivered
        self.errors: list[KafkaError] = []                # message errors and client errors alike
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _client_error(self, err: KafkaError) -> None:
        self.errors.append(err)

    def start(self) -> GroupReader:
        self.consumer.subscribe([self.topic])
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self.consumer.consume(500, 0.2):
                if m.error() is not None:
                    self.errors.append(m.error())
                else:
                    self.records.append((m.partition(), m.offset(), m.value()))
        self.consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(converge_s())


def real_errors(errors: list[KafkaError]) -> list[KafkaError]:
    """Client errors that are failures: librdkafka reports a closed or refused connection (a broker that shut
    down, or not yet back) as _TRANSPORT, which it retries elsewhere; anything else counts."""
    return [e for e in errors if e.code() != KafkaError._TRANSPORT]


@pytest.mark.cluster_slow
def test_rolling_restart_under_load_with_zero_client_errors(cluster):
    c = cluster
    parts = create(c, "rolling", 3)
    writer = Writer(c.bootstrap, "rolling", parts, message_timeout_ms=int(converge_s() * 1000)).start()
    reader = GroupReader(c.bootstrap, "rolling").start()
    controller = c.controller()
    took: dict[int, float] = {}
    try:
        wait_for(lambda: len(writer.acked) > FLOWING and len(reader.records) > FLOWING // 3, "writes and reads to flow",
                 60)
        # The controller last, as operators do: one controller move instead of one per step.
        for node in [n for n in NODES if n != controller] + [controller]:
            started = time.monotonic()
            assert c.stop_broker(node, timeout=converge_s()) == 0
            assert "controlled shutdown done" in c.brokers[node].log_tail(200)
            c.start_broker(node, timeout=converge_s())
            wait_isr_whole(c, "rolling", "__consumer_offsets")
            took[node] = time.monotonic() - started
            back = time.monotonic()
            wait_for(lambda b=back: writer.acked_since(b) > FLOWING, f"writes to flow after broker {node}'s restart")
    finally:
        writer.stop()
    try:
        acked = {(d.partition, d.offset): d.value for d in writer.acked}
        wait_for(lambda: acked.keys() <= {(p, o) for p, o, _ in reader.records}, "the group to read every record")
    finally:
        reader.stop()
    print(f"\nrolling restart, seconds per broker (stop, start, ISR whole): {took}")
    assert writer.failed == []
    assert writer.remaining == 0
    assert real_errors(writer.client_errors) == []
    assert real_errors(reader.errors) == []
    # What the group read is what was acknowledged, each at its offset; a record read again after a rebalance is
    # the same record at the same offset, never a second copy.
    read = {}
    for p, o, v in reader.records:
        assert read.setdefault((p, o), v) == v
    assert {k: read[k] for k in acked} == acked
    check_logs(c, writer, "rolling", parts)
    print(f"records delivered to the group: {len(reader.records)} for {len(read)} offsets; connection errors "
          f"(_TRANSPORT) reported: producer {len(writer.client_errors)}, consumer {len(reader.errors)}")


def test_leader_sigstop_past_the_session_timeout_rejoins_with_the_new_leaders_log(cluster):
    c = cluster
    parts = create(c, "paused", 1)
    old = partitions(c, "paused")[0].leader_id
    others = [n for n in NODES if n != old]
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic("barrier", num_partitions=1, replica_assignment=[[old, *others]])])["barrier"].result(60)
    wait_isr_whole(c, "barrier")
    proc: Any = c.brokers[old].proc
    # A paused broker keeps its connections open and answers nothing: the producer gives up on a request after a
    # session timeout (librdkafka's socket.timeout.ms, 60 s by default; its produce requests wait on the old
    # leader until then), the time the cluster takes to notice the pause, then asks for metadata and retries
    # with the new leader.
    writer = Writer(c.bootstrap, "paused", parts, message_timeout_ms=int(3 * converge_s() * 1000),
                    conf={"socket.timeout.ms": SESSION_MS}).start()
    try:
        wait_for(lambda: len(writer.acked) > FLOWING, "writes to flow", 60)
        # First give the leader a tail no follower has: both followers paused (for a fraction of a session, so
        # nothing is elected), then an acks=1 record appended past every offset they can hold, then the leader
        # paused. A follower's fetch parked on the leader before the pause is answered on the next append, to a
        # stopped process that reads it later: a write to the barrier partition (same leader, same fetches) wakes
        # those first, so the log end read after it bounds what the followers got. The new leader lacks the
        # record (and whatever the producer's in-flight batches added after it, never acknowledged).
        followers = [c.brokers[n].proc for n in others]
        for f in followers:
            os.kill(f.pid, signal.SIGSTOP)
        try:
            assert produce(c, old, "barrier", 0, [b"wake"], acks=1, timeout_ms=SESSION_MS // 3)[0] == 0
            fetchable = list_offset(c, old, "paused", 0, LOG_END)[1]
            code, at = produce(c, old, "paused", 0, [DIVERGENT], acks=1, timeout_ms=SESSION_MS // 3)
            divergent_end = list_offset(c, old, "paused", 0, LOG_END)[1]
            os.kill(proc.pid, signal.SIGSTOP)
        finally:
            for f in followers:
                os.kill(f.pid, signal.SIGCONT)
        assert code == 0 and fetchable <= at < divergent_end
        stopped = time.monotonic()
        try:
            new = wait_for(lambda: (lead := partitions(c, "paused", via=others[0])[0].leader_id) in others and lead,
                           "another broker to lead")
            elected = time.monotonic()
            wait_for(lambda: writer.acked_since(elected) > FLOWING, "writes to flow through the new leader")
            wait_for(lambda: time.monotonic() - stopped > 1.5 * SESSION_MS / 1000, "the pause to outlast the session")
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        paused = time.monotonic() - stopped
        resumed = time.monotonic()
        # It rejoins as a follower: its own metadata names the new leader, and it is back in the ISR.
        wait_for(lambda: partitions(c, "paused", via=old)[0].leader_id == new, "the old leader to follow")
        wait_isr_whole(c, "paused")
        wait_for(lambda: writer.acked_since(resumed) > FLOWING, "writes to flow after the resume")
    finally:
        writer.stop()
    assert writer.remaining == 0 and writer.failed == []
    assert partitions(c, "paused")[0].leader_id == new
    # Before any other move: the new leader's high watermark is its log end, and the old leader's log is as long.
    wait_replicas_agree(c, "paused", parts)
    leader_end = list_offset(c, new, "paused", 0, LOG_END)
    assert list_offset(c, new, "paused", 0) == leader_end == (0, len(writer.acked))
    assert list_offset(c, old, "paused", 0)[0] == 6  # NOT_LEADER_OR_FOLLOWER: it does not lead any more
    # It cut its own tail when it came back: from at least the end it had reached, to no further than what its
    # followers could have had (the new leader's log parts from its own there).
    cuts = [(int(a), int(b)) for a, b in re.findall(rf"paused-0: truncated from (\d+) to (\d+) following broker {new} ",
                                                  c.brokers[old].log_path.read_text())]
    assert len(cuts) == 1 and cuts[0][0] >= divergent_end and cuts[0][1] <= fetchable, (cuts, fetchable, divergent_end)
    log = check_logs(c, writer, "paused", parts)
    assert DIVERGENT not in {v for _, v in log[0]}  # on no replica: check_logs compared them all
    # Every record in the log acknowledged once, the old leader's included (check_logs made it lead in turn and
    # read it): no divergent record left from its pause.
    assert len(log[0]) == len(writer.acked) == writer.produced
    print(f"leader {old} paused {paused:.1f} s (session {SESSION_MS} ms) with offsets {fetchable}-{divergent_end} "
          f"on no follower; broker {new} took over")
