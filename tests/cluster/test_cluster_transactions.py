"""Transactions across brokers, on three `oncelog serve` processes and ZooKeeper.

A transactional id's coordinator is the leader of its `__transaction_state` partition; the partitions a
transaction writes are led by any broker. The coordinator writes its markers to the partitions led elsewhere
with WriteTxnMarkers, retried until a leader takes them (through a leader's SIGKILL too); a partition leader asks
the producer's coordinator, wherever it is, before it takes the producer's first transactional batch (KIP-890
part 1); a group's coordinator takes TxnOffsetCommit from a producer whose transaction coordinator is another
broker, and the offsets appear exactly when the transaction commits. Clients: confluent-kafka (librdkafka) and a
raw wire client where the exact answer matters.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import OffsetFetchRequest
from kafka.protocol.metadata import FindCoordinatorRequest

from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import SETTINGS, converge_s, partitions, request, wait_for
from tests.integration.test_transactions_rules import Txn

TXN_SETTINGS = {
    **SETTINGS,
    "transaction.state.log.num.partitions": 3,
    "offsets.topic.num.partitions": 3,
    "group.initial.rebalance.delay.ms": 0,
}
INVALID_TXN_STATE = 48
COMMIT_TIMEOUT_S = 120.0       # EndTxn through a leader's death: a session expiry, an election, the retry


@pytest.fixture
def cluster(cluster_factory):
    return lambda n=3, **settings: cluster_factory(n, **{**TXN_SETTINGS, **settings})


def create_spread_topic(c: ClusterProcess, topic: str, count: int = 3) -> dict[int, int]:
    """A topic of `count` partitions, RF 3, once its partitions have leaders: {partition: leader}."""
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=count, replication_factor=3)])[topic].result(60)
    found = wait_for(lambda: (lambda ps: ps if len(ps) == count and all(p.leader_id >= 0 for p in ps.values())
                              else None)(partitions(c, topic)), f"{topic} leaders")
    return {index: p.leader_id for index, p in found.items()}


def coordinator(c: ClusterProcess, key: str, key_type: int) -> int:
    """The broker FindCoordinator names for a group (0) or a transactional id (1), once there is one."""
    def ask() -> int | None:
        resp = request(c, c.alive()[0], FindCoordinatorRequest(key_type=key_type, coordinator_keys=[key]), 4)
        (answer,) = resp.coordinators
        return answer.node_id if answer.error_code == 0 else None
    return wait_for(ask, f"the coordinator of {key!r}")


def read_committed(c: ClusterProcess, topic: str, count: int) -> dict[int, list[bytes]]:
    """Every committed value of each partition, read to its last stable offset."""
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(count)])
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(count)}
        got: dict[int, list[bytes]] = {p: [] for p in range(count)}
        deadline = time.monotonic() + converge_s()
        while time.monotonic() < deadline:
            positions = {tp.partition: tp.offset for tp in consumer.position(
                [TopicPartition(topic, p) for p in range(count)])}
            if all(ends[p] == 0 or positions[p] >= ends[p] for p in range(count)):
                return got
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got[msg.partition()].append(msg.value())
        raise AssertionError(f"read_committed did not reach {ends}: {positions}")
    finally:
        consumer.close()


def test_a_transaction_over_three_leaders_commits_and_aborts_exactly(cluster):
    c = cluster()
    leaders = create_spread_topic(c, "spread")
    assert sorted(leaders.values()) == [1, 2, 3], leaders
    producer = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": "t-spread", "acks": "all"})
    producer.init_transactions(60)
    txn_coordinator = coordinator(c, "t-spread", 1)
    assert [p for p, leader in leaders.items() if leader != txn_coordinator], "every partition is remote-led"

    def transaction(tag: str, n: int, commit: bool) -> None:
        producer.begin_transaction()
        for p in range(3):
            for i in range(n):
                producer.produce("spread", f"{tag}-{p}-{i}".encode(), partition=p)
        if commit:
            producer.commit_transaction(60)
        else:
            producer.abort_transaction(60)

    transaction("a", 10, True)
    transaction("b", 5, False)
    transaction("c", 3, True)
    got = read_committed(c, "spread", 3)
    for p in range(3):
        assert got[p] == [f"a-{p}-{i}".encode() for i in range(10)] + [f"c-{p}-{i}".encode() for i in range(3)]


def test_a_zombie_batch_is_refused_by_a_leader_whose_producer_coordinator_is_elsewhere(cluster):
    """KIP-890 part 1 across brokers: the first transactional batch on a partition is refused until the
    producer's coordinator (another broker) has the partition in the transaction; then it is taken, and the
    coordinator's marker reaches that partition on its broker (the last stable offset moves past it)."""
    c = cluster()
    leaders = create_spread_topic(c, "fenced")
    txn_coordinator = coordinator(c, "t-zombie", 1)
    partition, leader = next((p, ld) for p, ld in leaders.items() if ld != txn_coordinator)
    with Txn(c.brokers[txn_coordinator].bootstrap) as coord:
        error, pid, epoch = coord.init_until_done("t-zombie", deadline_s=converge_s())
        assert error == 0
        with Txn(c.brokers[leader].bootstrap) as lead:
            refused = lead.produce("t-zombie", "fenced", partition, pid, epoch, 0, [b"zombie"])
            assert refused.error_code == INVALID_TXN_STATE, refused
            assert coord.add("t-zombie", pid, epoch, [("fenced", partition)]) == {("fenced", partition): 0}
            taken = lead.produce("t-zombie", "fenced", partition, pid, epoch, 0, [b"one", b"two"])
            assert (taken.error_code, taken.base_offset) == (0, 0)
            assert coord.end("t-zombie", pid, epoch, commit=True) == 0
    assert read_committed(c, "fenced", 3)[partition] == [b"one", b"two"]


def test_offsets_sent_to_a_transaction_appear_on_another_brokers_group_coordinator_at_commit(cluster):
    c = cluster()
    create_spread_topic(c, "source", 1)
    create_spread_topic(c, "sink", 1)
    txn_coordinator = coordinator(c, "t-offsets", 1)
    group = next(g for g in (f"g{i}" for i in range(100)) if coordinator(c, g, 0) != txn_coordinator)
    group_coordinator = coordinator(c, group, 0)
    member = Consumer({"bootstrap.servers": c.bootstrap, "group.id": group, "enable.auto.commit": False})
    producer = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": "t-offsets", "acks": "all"})
    producer.init_transactions(60)

    def committed() -> int:
        T = OffsetFetchRequest.OffsetFetchRequestTopic
        resp = request(c, group_coordinator, OffsetFetchRequest(
            group_id=group, topics=[T(name="source", partition_indexes=[0])], require_stable=True), 7)
        assert resp.error_code == 0, resp
        return resp.topics[0].partitions[0].committed_offset

    try:
        for offset, commit in ((7, True), (9, False), (12, True)):
            producer.begin_transaction()
            producer.produce("sink", f"upto-{offset}".encode(), partition=0)
            producer.send_offsets_to_transaction([TopicPartition("source", 0, offset)],
                                                 member.consumer_group_metadata(), 60)
            if commit:
                producer.commit_transaction(60)
            else:
                producer.abort_transaction(60)
            assert committed() == (offset if commit else 7)
    finally:
        member.close()
    assert read_committed(c, "sink", 1)[0] == [b"upto-7", b"upto-12"]


def test_commit_markers_reach_a_partition_whose_leader_was_killed_before_the_commit(cluster):
    c = cluster()
    leaders = create_spread_topic(c, "moving")
    producer = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": "t-moving", "acks": "all"})
    producer.init_transactions(60)
    txn_coordinator = coordinator(c, "t-moving", 1)
    victim_partition, victim = next((p, ld) for p, ld in leaders.items() if ld != txn_coordinator)
    producer.begin_transaction()
    for p in range(3):
        for i in range(5):
            producer.produce("moving", f"{p}-{i}".encode(), partition=p)
    assert producer.flush(60) == 0
    c.kill(victim)
    started = time.monotonic()
    try:
        producer.commit_transaction(COMMIT_TIMEOUT_S)
    except KafkaException as exc:
        pytest.fail(f"commit through the loss of broker {victim}: {exc}")
    took = time.monotonic() - started
    wait_for(lambda: partitions(c, "moving", txn_coordinator)[victim_partition].leader_id not in (-1, victim),
             "a new leader of the killed broker's partition")
    got = read_committed(c, "moving", 3)
    assert {p: len(v) for p, v in got.items()} == {0: 5, 1: 5, 2: 5}, (got, took)
    assert got[victim_partition] == [f"{victim_partition}-{i}".encode() for i in range(5)]


def test_a_producer_whose_transaction_a_remote_coordinator_timed_out_recovers(cluster):
    """KAFKA-9803 across brokers: the coordinator (one broker) aborts a transaction that outlived
    transaction.timeout.ms with a marker at a bumped epoch on a partition another broker leads. The owner's next
    batch at its old epoch is refused there; the leader asks the coordinator, which knows the owner, so the
    answer is UNKNOWN_PRODUCER_ID (abortable for librdkafka), not the fatal INVALID_PRODUCER_EPOCH a zombie gets.
    The producer aborts, takes the bumped epoch and commits its next transaction."""
    c = cluster(**{"transaction.abort.timed.out.transaction.cleanup.interval.ms": 500})
    leaders = create_spread_topic(c, "timed")
    producer = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": "t-timed", "acks": "all",
                         "transaction.timeout.ms": 3000})
    producer.init_transactions(60)
    txn_coordinator = coordinator(c, "t-timed", 1)
    partition = next(p for p, leader in leaders.items() if leader != txn_coordinator)
    reports: list = []

    def send(value: bytes) -> None:
        reports.clear()
        producer.produce("timed", value, partition=partition, on_delivery=lambda err, msg: reports.append(err))
        assert producer.flush(60) == 0

    producer.begin_transaction()
    send(b"lost")
    assert reports == [None]
    with Txn(c.brokers[txn_coordinator].bootstrap) as w:
        wait_for(lambda: w.state("t-timed") == "CompleteAbort", "the coordinator's timeout abort")
    send(b"late")
    assert [e.code() if e else None for e in reports] == [KafkaError.UNKNOWN_PRODUCER_ID], reports
    with pytest.raises(KafkaException) as info:
        producer.commit_transaction(30)
    err = info.value.args[0]
    assert err.txn_requires_abort() and not err.fatal(), err
    producer.abort_transaction(30)
    producer.begin_transaction()
    send(b"recovered")
    assert reports == [None]
    producer.commit_transaction(60)
    assert read_committed(c, "timed", 3)[partition] == [b"recovered"]


def test_an_open_transaction_commits_through_its_coordinators_sigkill(cluster):
    """The transaction's state is on the replicated `__transaction_state` (acks=all): the coordinator's broker is
    SIGKILLed while the transaction is open; the partition's next leader loads it, librdkafka finds the new
    coordinator, and the commit writes markers to every partition, wherever it is led now."""
    c = cluster(**{"transaction.state.log.replication.factor": 3, "transaction.state.log.min.isr": 2})
    create_spread_topic(c, "survives")
    producer = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": "t-survives", "acks": "all"})
    producer.init_transactions(60)
    producer.begin_transaction()
    for p in range(3):
        for i in range(4):
            producer.produce("survives", f"{p}-{i}".encode(), partition=p)
    assert producer.flush(60) == 0
    victim = coordinator(c, "t-survives", 1)
    c.kill(victim)
    try:
        producer.commit_transaction(COMMIT_TIMEOUT_S)
    except KafkaException as exc:
        pytest.fail(f"commit through the coordinator's loss (broker {victim}): {exc}")
    successor = coordinator(c, "t-survives", 1)
    assert successor != victim
    got = read_committed(c, "survives", 3)
    assert got == {p: [f"{p}-{i}".encode() for i in range(4)] for p in range(3)}
    # The producer goes on with the new coordinator.
    producer.begin_transaction()
    producer.produce("survives", b"next", partition=0)
    producer.commit_transaction(60)
    assert read_committed(c, "survives", 3)[0][-1] == b"next"
