"""The transaction coordinator's failover rules (issue 16), each on three `oncelog serve` processes and ZooKeeper.

A transactional id's coordinator is the leader of its `__transaction_state` partition; the coordinator epoch its
markers carry is that partition's leader epoch. These tests kill the coordinator's broker at the moments the issue
names and check what the next coordinator (the partition's next leader, which loads the replicated log) does:

- a commit whose PrepareCommit is in the log but whose marker could not be written yet (the data partition's
  leader SIGSTOPped) is completed by the next coordinator: exactly once for read_committed, the LSO moves,
  DescribeTransactions says CompleteCommit; a late marker at the deposed coordinator's epoch is refused;
- an InitProducerId epoch bump retried at the next coordinator gets the same bumped epoch (KIP-360's "provided
  epoch matches the last epoch" row, the last epoch read from the replicated log); an older epoch is fenced;
- a transaction the dead coordinator timed out is recovered through the next one (KAFKA-9803: abort, go on);
- a transaction the dead coordinator left open is timed out by the next one, from the start time in the log;
- a marker below a coordinator epoch already applied for the producer on the partition gets
  TRANSACTION_COORDINATOR_FENCED (52) and appends nothing;
- Kafka's `kafka-transactions` finds a hanging transaction through a broker that does not lead its partition
  and aborts it; the LSO moves.

Clients: confluent-kafka (librdkafka) and oncelog's own where a client reacts; raw wire requests (`Txn`) where a
client hides the answer. Every wait is bounded by the brokers' ZooKeeper session (`converge_s`).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka import Producer as CkProducer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DescribeProducersRequest

from oncelog.client import Producer as OncelogProducer
from oncelog.coordinator.partitioning import partition_for
from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import converge_s, partitions, request, wait_for
from tests.cluster.test_cluster_transactions import (
    COMMIT_TIMEOUT_S,
    TXN_SETTINGS,
    coordinator,
    create_spread_topic,
    read_committed,
)
from tests.integration.test_transactions_rules import NONE, PRODUCER_FENCED, UNKNOWN_PRODUCER_ID, Txn
from tests.support.kafka_tools import TRANSACTIONS, KafkaUnavailable, kafka_tool, tools_runtime

TXN_LOG = "__transaction_state"
TXN_LOG_PARTITIONS = TXN_SETTINGS["transaction.state.log.num.partitions"]
TRANSACTION_COORDINATOR_FENCED = 52
# Answers of a coordinator that is not ready yet (not loaded, not elected, moving): asked again.
NOT_READY = frozenset({14, 15, 16})   # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR
REPLICATED_LOG = {"transaction.state.log.replication.factor": 3, "transaction.state.log.min.isr": 2}


@pytest.fixture
def cluster(cluster_factory):
    return lambda **settings: cluster_factory(3, **{**TXN_SETTINGS, **settings})


def log_partition(c: ClusterProcess, txn_id: str, via: int | None = None) -> Any:
    """The Metadata entry of `txn_id`'s `__transaction_state` partition (leader, replicas, leader epoch)."""
    return partitions(c, TXN_LOG, via)[partition_for(txn_id, TXN_LOG_PARTITIONS)]


def next_coordinator(c: ClusterProcess, txn_id: str, dead: int) -> int:
    """The coordinator FindCoordinator names once `dead` no longer is (a session expiry and an election later)."""
    return wait_for(lambda: (n := coordinator(c, txn_id, 1)) != dead and n, f"a coordinator of {txn_id} but {dead}")


def ask_until_ready(c: ClusterProcess, node: int, call: Any, what: str) -> Any:
    """`call(Txn)` on broker `node` until its answer (whose first item is an error code) is not NOT_READY."""
    def ask() -> Any:
        with Txn(c.brokers[node].bootstrap) as w:
            answer = call(w)
        return None if answer[0] in NOT_READY else answer
    return wait_for(ask, what)


def described(c: ClusterProcess, node: int, txn_id: str) -> Any:
    """DescribeTransactions of `txn_id` at broker `node`, once it coordinates it."""
    return ask_until_ready(c, node, lambda w: (lambda d: (d.error_code, d))(w.describe(txn_id)),
                           f"broker {node} to describe {txn_id}")[1]


def produce_in_txn(c: ClusterProcess, txn_id: str, topic: str, partition: int, pid: int, epoch: int,
                   values: list[bytes]) -> int:
    """A raw transactional batch (sequence 0) to the partition's leader, retried while its leader asks a coordinator
    that is not ready (NOT_ENOUGH_REPLICAS, 19); the base offset."""
    def send() -> tuple[int] | None:
        leader = partitions(c, topic)[partition].leader_id
        with Txn(c.brokers[leader].bootstrap) as w:
            answer = w.produce(txn_id, topic, partition, pid, epoch, 0, values)
        assert answer.error_code in (NONE, 19), answer
        return (answer.base_offset,) if answer.error_code == NONE else None
    return wait_for(send, f"a transactional batch on {topic}-{partition}")[0]


def offsets(c: ClusterProcess, node: int, topic: str) -> tuple[int, int]:
    """(high watermark, last stable offset) of `topic`-0 at its leader `node`."""
    with Txn(c.brokers[node].bootstrap) as w:
        return w.hwm(topic), w.lso(topic)


def open_transactions(c: ClusterProcess, node: int, topic: str) -> dict[int, tuple[int, int, int]]:
    """{producer id: (epoch, coordinator epoch, start offset of its open transaction or -1)} of `topic`-0, as
    broker `node`'s replica holds them (DescribeProducers, which any replica answers)."""
    req = DescribeProducersRequest[0]
    resp = request(c, node, req(topics=[req.TopicRequest(name=topic, partition_indexes=[0])]), 0)
    (p,) = resp.topics[0].partitions
    assert p.error_code == NONE, p
    return {s.producer_id: (s.producer_epoch, s.coordinator_epoch, s.current_txn_start_offset)
            for s in p.active_producers}


def create_on(c: ClusterProcess, topic: str, replicas: list[int]) -> None:
    """A one-partition topic on exactly `replicas` (the first leads), once its leader is known everywhere."""
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[replicas])])[topic].result(60)
    wait_for(lambda: all(partitions(c, topic, n).get(0) is not None and partitions(c, topic, n)[0].leader_id
                         == replicas[0] for n in c.alive()), f"{topic} led by {replicas[0]}")


# -- 1. PrepareCommit in the log, markers not written, coordinator SIGKILL -------------------------------------


def test_a_commit_prepared_before_its_coordinators_sigkill_is_completed_by_the_next(cluster):
    """The data partition's only replica is SIGSTOPped, so the commit marker cannot be written; EndTxn is sent, the
    coordinator persists PrepareCommit (DescribeTransactions shows it) and is SIGKILLed; the partition's leader is
    resumed. The transaction log's other replica becomes the coordinator, loads PrepareCommit and writes the
    marker: librdkafka's commit_transaction succeeds, the records are read once, the LSO reaches the high
    watermark, the state is CompleteCommit. Then a marker at the dead coordinator's epoch is refused (52).

    The transaction log has two replicas here (min ISR 1) so that the paused broker holds none of the id's
    partition: PrepareCommit is acknowledged by the live replica while the marker's partition is unwritable."""
    c = cluster(**{"transaction.state.log.replication.factor": 2, "transaction.state.log.min.isr": 1})
    txn_id, topic = "t-prepared", "prepared"
    old = coordinator(c, txn_id, 1)                     # creates the transaction log
    entry = wait_for(lambda: (e := log_partition(c, txn_id)).leader_id == old and len(e.isr_nodes) == 2 and e,
                     "both replicas of the id's transaction log partition in sync")
    old_epoch = entry.leader_epoch
    (paused,) = set(c.brokers) - set(entry.replica_nodes)
    (successor,) = set(entry.replica_nodes) - {old}
    create_on(c, topic, [paused])
    producer = CkProducer({"bootstrap.servers": c.bootstrap, "transactional.id": txn_id, "acks": "all"})
    producer.init_transactions(60)
    values = [f"v{i}".encode() for i in range(5)]
    producer.begin_transaction()
    for v in values:
        producer.produce(topic, v, partition=0)
    assert producer.flush(60) == 0
    before = described(c, old, txn_id)
    assert before.transaction_state == "Ongoing"
    pid, epoch = before.producer_id, before.producer_epoch

    outcome: dict[str, Any] = {}

    def commit() -> None:
        try:
            producer.commit_transaction(COMMIT_TIMEOUT_S)
            outcome["error"] = None
        except KafkaException as exc:
            outcome["error"] = exc.args[0]

    proc = c.brokers[paused].proc
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        committer = threading.Thread(target=commit, daemon=True)
        committer.start()
        with Txn(c.brokers[old].bootstrap) as w:
            wait_for(lambda: w.state(txn_id) == "PrepareCommit", "PrepareCommit in the old coordinator's log")
        assert "error" not in outcome, "the commit returned while its marker's only replica was paused"
        c.kill(old)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert next_coordinator(c, txn_id, old) == successor
    committer.join(COMMIT_TIMEOUT_S + converge_s())
    assert outcome == {"error": None}, str(outcome.get("error"))
    after = described(c, successor, txn_id)
    assert (after.transaction_state, after.producer_id, after.producer_epoch) == ("CompleteCommit", pid, epoch)
    new_epoch = log_partition(c, txn_id).leader_epoch
    assert new_epoch > old_epoch
    # The records and a commit marker (two, if the dead coordinator's WriteTxnMarkers, sent before its death to the
    # paused broker, was read by it before the new one's): the LSO is the high watermark.
    hwm, lso = offsets(c, paused, topic)
    assert hwm == lso and hwm in (len(values) + 1, len(values) + 2), (hwm, lso)
    assert read_committed(c, topic, 1) == {0: values}
    assert open_transactions(c, paused, topic)[pid] == (epoch, new_epoch, -1)
    # A marker at the deposed coordinator's epoch comes late: refused, nothing appended.
    with Txn(c.brokers[paused].bootstrap) as w:
        assert w.write_marker(pid, epoch, False, topic, [0], coordinator_epoch=old_epoch) == {
            0: TRANSACTION_COORDINATOR_FENCED}
    assert offsets(c, paused, topic) == (hwm, hwm)
    assert read_committed(c, topic, 1) == {0: values}


# -- 2. InitProducerId retried across a coordinator kill (KIP-360) ---------------------------------------------


def test_an_epoch_bump_retried_after_its_coordinators_sigkill_gets_the_same_epoch(cluster):
    """InitProducerId(pid, 1) bumps to epoch 2 (last epoch 1, acknowledged by the log's in-sync replicas); its
    answer is lost with the coordinator's broker. The same request to the next coordinator is KIP-360's
    "provided epoch matches the last epoch" row: (NONE, pid, 2), again and again, not a fencing error; an epoch
    older than that (0) is PRODUCER_FENCED. The producer goes on at epoch 2."""
    c = cluster(**REPLICATED_LOG)
    txn_id, topic = "t-bumped", "bumped"
    create_spread_topic(c, topic, 1)
    old = coordinator(c, txn_id, 1)
    with Txn(c.brokers[old].bootstrap) as w:
        error, pid, epoch = w.init_until_done(txn_id, deadline_s=converge_s())
        assert (error, epoch) == (NONE, 0)
        assert w.init(txn_id, pid=pid, epoch=0) == (NONE, pid, 1)
        assert w.init(txn_id, pid=pid, epoch=1) == (NONE, pid, 2)      # the answer the producer never gets
    c.kill(old)
    new = next_coordinator(c, txn_id, old)
    retried = ask_until_ready(c, new, lambda w: w.init(txn_id, pid=pid, epoch=1), "the retried bump's answer")
    assert retried == (NONE, pid, 2)
    with Txn(c.brokers[new].bootstrap) as w:
        assert w.init(txn_id, pid=pid, epoch=1) == (NONE, pid, 2)
        assert w.init(txn_id, pid=pid, epoch=0) == (PRODUCER_FENCED, -1, -1)
        assert w.describe(txn_id).producer_epoch == 2
        assert w.add_codes(txn_id, pid, 2, [(topic, 0)]) == {NONE}
        assert produce_in_txn(c, txn_id, topic, 0, pid, 2, [b"after"]) == 0
        assert w.end(txn_id, pid, 2, True) == NONE
    assert read_committed(c, topic, 1) == {0: [b"after"]}


# -- 3. A transaction timed out by a coordinator that then dies (KAFKA-9803) -----------------------------------


def _error_code(err: Any) -> int | None:
    """A delivery report's error as a wire code, for confluent-kafka's KafkaError and oncelog's alike."""
    if err is None:
        return None
    return err.code() if callable(err.code) else err.code


def _requires_abort(exc: Exception) -> tuple[bool, bool]:
    """(abortable, fatal) of a failed commit, for either client."""
    if isinstance(exc, KafkaException):
        err = exc.args[0]
        return err.txn_requires_abort(), err.fatal()
    return getattr(exc, "abortable", False), getattr(exc, "fatal", False)


@pytest.mark.parametrize("client", ["librdkafka", "oncelog"])
def test_a_transaction_timed_out_by_a_coordinator_that_then_died_is_recovered_through_the_next(cluster, client):
    """The coordinator aborts the open transaction after transaction.timeout.ms (epoch bumped, the owner's epoch
    kept as the last epoch in the log) and its broker is SIGKILLed. The owner's next batch, at its old epoch, is
    refused by the partition's leader, which asks the next coordinator: it knows the owner from the replicated
    log, so the answer is the abortable UNKNOWN_PRODUCER_ID, not the fatal fencing a zombie gets. The producer
    aborts, bumps its epoch through the next coordinator and commits; nothing is left open on the partition."""
    c = cluster(**REPLICATED_LOG, **{"transaction.abort.timed.out.transaction.cleanup.interval.ms": 500})
    txn_id, topic = f"t-timed-{client}", f"timed-{client}"
    old = coordinator(c, txn_id, 1)
    leaders = create_spread_topic(c, topic)
    partition, leader = next((p, ld) for p, ld in leaders.items() if ld != old)
    config = {"bootstrap.servers": c.bootstrap, "transactional.id": txn_id, "acks": "all",
              "transaction.timeout.ms": 3000}
    producer = CkProducer(config) if client == "librdkafka" else OncelogProducer(config)
    producer.init_transactions(60)
    first = described(c, old, txn_id)
    reports: list = []

    def send(value: bytes) -> list[int | None]:
        reports.clear()
        producer.produce(topic, value, partition=partition, on_delivery=lambda err, msg: reports.append(err))
        assert producer.flush(60) == 0
        return [_error_code(e) for e in reports]

    producer.begin_transaction()
    assert send(b"lost") == [None]
    with Txn(c.brokers[old].bootstrap) as w:
        wait_for(lambda: w.state(txn_id) == "CompleteAbort", "the coordinator's timeout abort")
    c.kill(old)
    new = next_coordinator(c, txn_id, old)
    assert described(c, new, txn_id).transaction_state == "CompleteAbort"
    assert send(b"late") == [UNKNOWN_PRODUCER_ID]
    with pytest.raises(Exception) as info:
        producer.commit_transaction(30)
    assert _requires_abort(info.value) == (True, False), info.value
    producer.abort_transaction(60)
    producer.begin_transaction()
    assert send(b"recovered") == [None]
    producer.commit_transaction(60)
    assert read_committed(c, topic, 3)[partition] == [b"recovered"]
    leader = partitions(c, topic)[partition].leader_id
    with Txn(c.brokers[leader].bootstrap) as w:
        assert w.lso(topic, partition) == w.hwm(topic, partition)
    # The timeout bumped the epoch once; the owner's bump request named the epoch the timeout replaced, so it got
    # that epoch back (not another bump), through the next coordinator.
    final = described(c, new, txn_id)
    assert (final.transaction_state, final.producer_id, final.producer_epoch) == (
        "CompleteCommit", first.producer_id, first.producer_epoch + 1)


def test_a_transaction_left_open_by_a_dead_coordinator_is_timed_out_by_the_next(cluster):
    """A transaction is open (Ongoing, one batch on a partition led elsewhere) when its coordinator's broker is
    SIGKILLed, well before its transaction.timeout.ms. The next coordinator loads Ongoing with the transaction's
    start time from the replicated log and its reaper aborts it once the timeout has passed: CompleteAbort at the
    epoch + 1, the abort marker on the partition (LSO = high watermark, nothing read_committed), and the owner's
    retried InitProducerId naming the epoch the timeout replaced gets that epoch back (KIP-360), not a fencing."""
    timeout_ms = 6000
    c = cluster(**REPLICATED_LOG, **{"transaction.abort.timed.out.transaction.cleanup.interval.ms": 500})
    txn_id, topic = "t-orphaned", "orphaned"
    old = coordinator(c, txn_id, 1)
    leaders = create_spread_topic(c, topic)
    partition = next(p for p, ld in leaders.items() if ld != old)
    with Txn(c.brokers[old].bootstrap) as w:
        error, pid, epoch = w.init_until_done(txn_id, timeout_ms=timeout_ms, deadline_s=converge_s())
        assert error == NONE
        assert w.add_codes(txn_id, pid, epoch, [(topic, partition)]) == {NONE}
    assert produce_in_txn(c, txn_id, topic, partition, pid, epoch, [b"orphan"]) == 0
    with Txn(c.brokers[old].bootstrap) as w:
        assert w.state(txn_id) == "Ongoing"
    c.kill(old)
    new = next_coordinator(c, txn_id, old)
    wait_for(lambda: described(c, new, txn_id).transaction_state == "CompleteAbort",
             "the next coordinator's timeout abort", converge_s() + timeout_ms / 1000)
    final = described(c, new, txn_id)
    assert (final.producer_id, final.producer_epoch) == (pid, epoch + 1)
    leader = partitions(c, topic)[partition].leader_id
    with Txn(c.brokers[leader].bootstrap) as w:
        wait_for(lambda: w.lso(topic, partition) == w.hwm(topic, partition) == 2, "the abort marker written")
    assert read_committed(c, topic, 3)[partition] == []
    with Txn(c.brokers[new].bootstrap) as w:
        assert w.init(txn_id, timeout_ms=timeout_ms, pid=pid, epoch=epoch) == (NONE, pid, epoch + 1)


# -- 4. TRANSACTION_COORDINATOR_FENCED ------------------------------------------------------------------------


def test_a_marker_below_an_applied_coordinator_epoch_is_fenced_and_appends_nothing(cluster):
    """Raw WriteTxnMarkers to the partition's leader. A newer coordinator (one epoch above the id's coordinator)
    aborts the producer's open transaction there; the deposed coordinator's commit of the same transaction (its
    own epoch) is TRANSACTION_COORDINATOR_FENCED, the log does not grow and the records stay aborted."""
    c = cluster()
    txn_id, topic = "t-fenced-markers", "fenced-markers"
    leader = create_spread_topic(c, topic, 1)[0]
    coord = coordinator(c, txn_id, 1)
    deposed_epoch = log_partition(c, txn_id).leader_epoch
    with Txn(c.brokers[coord].bootstrap) as w:
        error, pid, epoch = w.init_until_done(txn_id, deadline_s=converge_s())
        assert error == NONE
        assert w.add_codes(txn_id, pid, epoch, [(topic, 0)]) == {NONE}
    assert produce_in_txn(c, txn_id, topic, 0, pid, epoch, [b"a", b"b"]) == 0
    with Txn(c.brokers[leader].bootstrap) as w:
        assert w.write_marker(pid, epoch, False, topic, [0], coordinator_epoch=deposed_epoch + 1) == {0: NONE}
        assert (w.hwm(topic), w.lso(topic)) == (3, 3)
        assert w.write_marker(pid, epoch, True, topic, [0], coordinator_epoch=deposed_epoch) == {
            0: TRANSACTION_COORDINATOR_FENCED}
        assert (w.hwm(topic), w.lso(topic)) == (3, 3)
    assert open_transactions(c, leader, topic)[pid] == (epoch, deposed_epoch + 1, -1)
    assert read_committed(c, topic, 1) == {0: []}


# -- 5. kafka-transactions find-hanging / abort through a broker that does not lead ----------------------------


@pytest.fixture
def tools() -> None:
    try:
        tools_runtime()
    except KafkaUnavailable as exc:
        pytest.skip(str(exc))


def test_kafka_transactions_finds_and_aborts_a_hanging_transaction_through_a_follower(cluster, tools):
    """The hang, made on purpose: a marker from a newer coordinator epoch reaches the partition for the producer
    before its transaction writes there, so the coordinator's own commit marker is refused (52) and the
    coordinator completes the transaction while the partition keeps it open: the LSO is stuck. Kafka's tool,
    bootstrapped on a broker that does not lead the partition, finds it (`find-hanging --broker-id` of that
    follower, and `--topic`) and aborts it (`abort --start-offset`, with the coordinator epoch DescribeProducers
    reports); then the LSO moves and a read_committed consumer gets the record written after it."""
    c = cluster()
    txn_id, topic = "t-hanging", "hanging"
    leader = create_spread_topic(c, topic, 1)[0]
    follower = next(n for n in sorted(c.brokers) if n != leader)
    coord = coordinator(c, txn_id, 1)
    newer_epoch = log_partition(c, txn_id).leader_epoch + 1
    with Txn(c.brokers[coord].bootstrap) as w:
        error, pid, epoch = w.init_until_done(txn_id, deadline_s=converge_s())
        assert error == NONE
        with Txn(c.brokers[leader].bootstrap) as lw:
            assert lw.write_marker(pid, epoch, False, topic, [0], coordinator_epoch=newer_epoch) == {0: NONE}
            start = lw.hwm(topic)
        assert w.add_codes(txn_id, pid, epoch, [(topic, 0)]) == {NONE}
        assert produce_in_txn(c, txn_id, topic, 0, pid, epoch, [b"h0", b"h1"]) == start
        assert w.end(txn_id, pid, epoch, True) == NONE
        assert w.state(txn_id) == "CompleteCommit"
    with Txn(c.brokers[leader].bootstrap) as lw:
        after = lw.plain(topic, 0, [b"after"])
        assert (lw.hwm(topic), lw.lso(topic)) == (after + 1, start)
    wait_for(lambda: open_transactions(c, follower, topic).get(pid) == (epoch, newer_epoch, start),
             "the follower's producer state")

    via = c.brokers[follower].bootstrap

    def tool(*args: str) -> list[list[str]]:
        """The tool's output lines, each split into its tab-separated, space-padded cells."""
        lines = kafka_tool(TRANSACTIONS, "--bootstrap-server", via, *args, check=True).lines()
        return [[cell.strip() for cell in ln.split("\t")] for ln in lines]

    row = [topic, "0", str(pid), str(epoch), str(newer_epoch), str(start)]
    for scope in (("--broker-id", str(follower)), ("--topic", topic)):
        found = tool("find-hanging", *scope, "--max-transaction-timeout", "0")
        assert found[0][:6] == ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch",
                                "StartOffset"], found
        assert [cells[:6] for cells in found[1:]] == [row], found
    tool("abort", "--topic", topic, "--partition", "0", "--start-offset", str(start))
    with Txn(c.brokers[leader].bootstrap) as lw:
        assert (lw.hwm(topic), lw.lso(topic)) == (after + 2, after + 2)
    assert read_committed(c, topic, 1) == {0: [b"after"]}
    assert tool("find-hanging", "--broker-id", str(follower), "--max-transaction-timeout", "0")[1:] == []
