"""The seeds' replica cases on three `oncelog serve` processes and ZooKeeper (issue 16, docs/cluster.md §4.7).

Seed 000 (KIP-360) says of a replicated Kafka: a new leader may be elected without the latest log start offset of
the previous one, a new replica only sees the producers that have state in the log, and producer state may be
forgotten by a failover. Here each of those is a rule, checked over TCP against real brokers:

- a failover between a produce and its retry: the new leader answers an exact retry with its original offsets and
  a retry inside the 5-batch window with DUPLICATE_SEQUENCE_NUMBER, as the old leader would have (followers feed
  every replicated batch to their own producer state, the cache included);
- DeleteRecords, then the leader SIGKILLed at once, then producers whose batches were all deleted: the new leader
  knows them (no UNKNOWN_PRODUCER_ID, no OUT_OF_ORDER_SEQUENCE_NUMBER, no epoch bump, no duplicate) and never
  answers a log start offset below the one the old leader returned;
- producer-state expiry: a failover does not forget a producer the old leader still knew, and (the issue's
  wording) every replica decides the same.

The reassignment case (a replica added by reassignment knows a producer whose records were deleted) and the
wiped-disk case are in test_replication_processes.py. Exact answers come from a raw wire client
(tests/support/wire.py); librdkafka (confluent-kafka) is the client whose reaction is checked where it matters.
Every wait is derived from the session timeout and the expiry settings the brokers run with.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from kafka.protocol.admin import DeleteRecordsRequest
from kafka.protocol.producer import InitProducerIdRequest

from oncelog.embedded import ClusterProcess
from oncelog.records.builder import build_batch
from tests.cluster.cluster_processes import SESSION_MS, converge_s, partitions, wait_for
from tests.cluster.replica_logs import producer_states
from tests.integration.helpers import create_topic, list_offset_raw, produce_raw
from tests.support.wire import Wire

NONE, NOT_LEADER_OR_FOLLOWER, DUPLICATE_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID = 0, 6, 46, 59
EARLIEST = -2
TOPIC = "replica-state"


# -- helpers ------------------------------------------------------------------------------------------------------
def create(c: ClusterProcess, topic: str = TOPIC) -> int:
    """One partition at RF 3, min.insync.replicas 2, its ISR whole on every broker; its leader."""
    create_topic(c.bootstrap, topic, 1, config={"min.insync.replicas": "2"}, replication_factor=3)
    for node in c.brokers:
        wait_for(lambda n=node: sorted(partitions(c, topic, via=n)[0].isr_nodes) == [1, 2, 3],
                 f"broker {node} to show the ISR whole")
    return partitions(c, topic)[0].leader_id


def init_producer(c: ClusterProcess, node: int) -> tuple[int, int]:
    with Wire(c.brokers[node].bootstrap, timeout=converge_s()) as w:
        resp = w.request(InitProducerIdRequest[4](transactional_id=None, transaction_timeout_ms=60000,
                                                  producer_id=-1, producer_epoch=-1), 4)
    assert resp.error_code == NONE, resp
    return resp.producer_id, resp.producer_epoch


def batch(values: list[bytes], pid: int = -1, epoch: int = -1, seq: int = -1) -> bytearray:
    return build_batch([(None, v, (), int(time.time() * 1000)) for v in values], producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq)


def produce(c: ClusterProcess, node: int, buf: bytearray, topic: str = TOPIC) -> tuple[int, int, int]:
    """One Produce (acks=all) of `buf` to broker `node`: (error, base offset, log start offset). A broker that has
    just been elected may still answer NOT_LEADER_OR_FOLLOWER for a moment: asked again until it leads."""
    def once() -> tuple[int, int, int] | None:
        with Wire(c.brokers[node].bootstrap, timeout=converge_s()) as w:
            p = produce_raw(w, topic, 0, buf, acks=-1, timeout_ms=int(converge_s() * 1000))
        return None if p.error_code == NOT_LEADER_OR_FOLLOWER else (p.error_code, p.base_offset, p.log_start_offset)

    return wait_for(once, f"broker {node} to take a produce")


def log_start(c: ClusterProcess, node: int, topic: str = TOPIC) -> int:
    """ListOffsets EARLIEST as broker `node` answers a client (it must lead)."""
    def once() -> tuple[int] | None:  # a tuple: an answer of 0 is an answer
        with Wire(c.brokers[node].bootstrap, timeout=converge_s()) as w:
            error, offset, _ = list_offset_raw(w, topic, 0, EARLIEST)
        return (offset,) if error == NONE else None

    return wait_for(once, f"broker {node} to answer ListOffsets")[0]


def new_leader(c: ClusterProcess, old: int, topic: str = TOPIC) -> int:
    """After `old` was killed: the broker a survivor names as leader, once that broker says so itself."""
    survivor = next(n for n in c.brokers if n != old)
    wait_s = converge_s(c.session_timeout_ms)
    leader = wait_for(lambda: (ld := partitions(c, topic, via=survivor)[0].leader_id) not in (-1, old) and ld,
                      f"a leader other than broker {old}", wait_s)
    wait_for(lambda: partitions(c, topic, via=leader)[0].leader_id == leader, f"broker {leader} to know it leads",
             wait_s)
    return leader


def read_from_start(c: ClusterProcess, topic: str, expected: int) -> list[tuple[int, bytes]]:
    """Every record from the log start with librdkafka: [(offset, value)], `expected` of them at least."""
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + converge_s()
        while len(got) < expected and time.monotonic() < deadline:
            for m in consumer.consume(100, 0.5):
                if m.error() is None:
                    got.append((m.offset(), m.value()))
        # Anything past the expected records would be a duplicate: one more poll round to see it.
        for m in consumer.consume(100, 1.0):
            if m.error() is None:
                got.append((m.offset(), m.value()))
    finally:
        consumer.close()
    return got


def acknowledged_batches(c: ClusterProcess, node: int, pid: int, epoch: int, count: int,
                         tag: str) -> list[tuple[bytearray, int]]:
    """`count` batches of two records each (`<tag><i>-0`, `<tag><i>-1`) from one idempotent producer, each
    acknowledged by `node` at the next offsets: [(batch as sent, its base offset)]."""
    sent: list[tuple[bytearray, int]] = []
    for i in range(count):
        buf = batch([f"{tag}{i}-0".encode(), f"{tag}{i}-1".encode()], pid, epoch, 2 * i)
        assert produce(c, node, buf) == (NONE, 2 * i, 0)
        sent.append((buf, 2 * i))
    return sent


def states_of(c: ClusterProcess, node: int, topic: str = TOPIC) -> dict[int, tuple[int, int]]:
    """{producer id: (epoch, last sequence)} as broker `node`'s replica holds them (DescribeProducers, which any
    replica answers)."""
    return {pid: (epoch, seq) for pid, epoch, seq in producer_states(c, node, topic, [0])[0]}


# -- a failover between a produce and its retry --------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_after_a_leader_sigkill_the_new_leader_answers_retries_as_the_old_one(cluster_factory):
    """Seven acknowledged batches of one idempotent producer; the leader is SIGKILLed before the producer learns
    (as if the answer to its last requests was lost). On the elected follower: each of the last five batches,
    sent again as it was, gets its original offset and nothing is appended; the first two, older than the 5-batch
    window, get DUPLICATE_SEQUENCE_NUMBER; the next sequence goes on at the next offset. Without the followers'
    cache the new leader would append the retries again (or refuse them as out of order)."""
    c = cluster_factory()
    leader = create(c)
    pid, epoch = init_producer(c, leader)
    sent = acknowledged_batches(c, leader, pid, epoch, 7, "b")
    followers = [n for n in c.brokers if n != leader]
    for n in followers:  # acks=all: the followers hold the batches; their producer state names the last one
        assert states_of(c, n)[pid] == (epoch, 13)
    c.kill(leader)
    new = new_leader(c, leader)
    for buf, base in sent[-5:]:
        assert produce(c, new, buf) == (NONE, base, 0)
    for buf, _ in sent[:2]:
        assert produce(c, new, buf)[0] == DUPLICATE_SEQUENCE_NUMBER
    nxt = batch([b"next"], pid, epoch, 14)
    assert produce(c, new, nxt) == (NONE, 14, 0)
    assert produce(c, new, nxt) == (NONE, 14, 0)  # and its own retry
    assert states_of(c, new)[pid] == (epoch, 14)
    want = [(2 * i + j, b"b%d-%d" % (i, j)) for i in range(7) for j in range(2)] + [(14, b"next")]
    assert read_from_start(c, TOPIC, len(want)) == want


# -- DeleteRecords, a leader kill, then producers whose records were all deleted ----------------------------------
@pytest.mark.timeout(300)
def test_deleted_records_then_a_leader_kill_keep_the_producers_and_the_log_start(cluster_factory):
    """A raw idempotent producer (4 batches) and a librdkafka idempotent producer (5 records) write; a plain batch
    follows; DeleteRecords removes everything before it, and the leader is SIGKILLed the moment it answers. The new
    leader answers the log start the old one returned (never lower: seed 000, problem 2) in ListOffsets and every
    Produce, UNKNOWN_PRODUCER_ID to a stranger included (seed 004); the raw producer's retries of deleted batches get their original offsets and its next sequence is
    taken; the librdkafka producer goes on without an error and without bumping its epoch (it would on
    UNKNOWN_PRODUCER_ID); the log holds every record once."""
    c = cluster_factory()
    leader = create(c)
    pid, epoch = init_producer(c, leader)
    sent = acknowledged_batches(c, leader, pid, epoch, 4, "p")
    errors: list[str] = []
    delivered: list[tuple[int, bytes]] = []

    def report(err, msg) -> None:
        (errors.append(str(err)) if err is not None else delivered.append((msg.offset(), msg.value())))

    lib = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 50,
                    "message.timeout.ms": int(converge_s() * 1000)})
    for i in range(5):
        lib.produce(TOPIC, value=b"q%d" % i, partition=0, on_delivery=report)
    assert lib.flush(converge_s()) == 0
    assert (errors, sorted(delivered)) == ([], [(8 + i, b"q%d" % i) for i in range(5)])
    assert produce(c, leader, batch([b"plain-0", b"plain-1"])) == (NONE, 13, 0)
    before = states_of(c, leader)
    (lib_pid,) = set(before) - {pid}
    lib_epoch = before[lib_pid][0]
    assert before == {pid: (epoch, 7), lib_pid: (lib_epoch, 4)}

    req = DeleteRecordsRequest[2]
    with Wire(c.brokers[leader].bootstrap, timeout=converge_s()) as w:
        resp = w.request(req(topics=[req.DeleteRecordsTopic(name=TOPIC, partitions=[
            req.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=13)])],
            timeout_ms=int(converge_s() * 1000)), 2)
        c.kill(leader)  # at once: a follower that had not persisted the new log start would be elected with 0
    (answer,) = resp.topics[0].partitions
    assert (answer.error_code, answer.low_watermark) == (NONE, 13)

    new = new_leader(c, leader)
    assert log_start(c, new) == 13
    assert states_of(c, new) == before  # no record of either producer is in any log now
    # Seed 004 stays exact on the new leader: a producer it never knew, at a sequence past 0, is told
    # UNKNOWN_PRODUCER_ID with the log start the old leader returned.
    stranger = max(before) + 1000
    assert produce(c, new, batch([b"stranger"], stranger, 0, 5)) == (UNKNOWN_PRODUCER_ID, -1, 13)
    for buf, base in sent:
        assert produce(c, new, buf) == (NONE, base, 13)
    assert produce(c, new, batch([b"p-next"], pid, epoch, 8)) == (NONE, 15, 13)
    for i in range(5, 10):
        lib.produce(TOPIC, value=b"q%d" % i, partition=0, on_delivery=report)
    assert lib.flush(converge_s()) == 0
    assert errors == []
    assert sorted(delivered) == [(8 + i, b"q%d" % i) for i in range(5)] + [(11 + i, b"q%d" % i) for i in range(5, 10)]
    assert states_of(c, new) == {pid: (epoch, 8), lib_pid: (lib_epoch, 9)}  # the same epoch: no bump
    assert log_start(c, new) == 13
    want = [(13, b"plain-0"), (14, b"plain-1"), (15, b"p-next")] + [(11 + i, b"q%d" % i) for i in range(5, 10)]
    assert read_from_start(c, TOPIC, len(want)) == want


# -- producer-state expiry across replicas ---------------------------------------------------------------------------
EXPIRY_SESSION_MS = 10_000
FAILOVER_EXPIRY_MS = 25_000  # longer than the session: the election comes while the old leader still knew it
EXPIRY_CHECK_MS = 500


def expiry_settings(expiry_ms: int) -> dict[str, int]:
    return {"producer.id.expiration.ms": expiry_ms, "transactional.id.expiration.ms": expiry_ms,
            "producer.id.expiration.check.interval.ms": EXPIRY_CHECK_MS}


@pytest.mark.cluster_slow
@pytest.mark.timeout(400)
def test_a_failover_does_not_forget_a_producer_the_old_leader_still_knew(cluster_factory):
    """A producer writes, and its leader is SIGKILLed right after. The new leader, elected a session timeout
    later, knows the producer for as long as the old leader would have: still at 80% of producer.id.expiration.ms
    after the write (its idle clock started when it replicated the write, not earlier), and forgotten once the
    producer has been idle that long (expiry is on, not merely late)."""
    c = cluster_factory(**{"oncelog.coordination.session.timeout.ms": EXPIRY_SESSION_MS,
                           **expiry_settings(FAILOVER_EXPIRY_MS)})
    wait_s = converge_s(EXPIRY_SESSION_MS)
    leader = create(c)
    pid, epoch = init_producer(c, leader)
    assert produce(c, leader, batch([b"x0", b"x1"], pid, epoch, 0)) == (NONE, 0, 0)
    written = time.monotonic()
    c.kill(leader)
    new = new_leader(c, leader)
    assert states_of(c, new) == {pid: (epoch, 1)}
    late = written + FAILOVER_EXPIRY_MS / 1000 * 0.8
    assert time.monotonic() < late, "the election came too late to show the rule"
    time.sleep(late - time.monotonic())
    assert states_of(c, new) == {pid: (epoch, 1)}
    wait_for(lambda: pid not in states_of(c, new), "the new leader to expire the idle producer",
             timeout=FAILOVER_EXPIRY_MS / 1000 + wait_s)
    assert time.monotonic() - written >= FAILOVER_EXPIRY_MS / 1000 * 0.9


@pytest.mark.timeout(300)
def test_every_replica_decides_the_same_about_an_idle_producer(cluster_factory):
    """Issue 16: expiry "decides the same on every replica". An idle producer forgotten by its leader is forgotten
    by the followers too, within the expiry check interval (not kept by some replicas and dropped by others, so
    DescribeProducers, which any replica answers, and whichever replica leads next agree)."""
    expiry_ms = SESSION_MS // 2
    c = cluster_factory(**expiry_settings(expiry_ms))
    leader = create(c)
    pid, epoch = init_producer(c, leader)
    assert produce(c, leader, batch([b"idle"], pid, epoch, 0)) == (NONE, 0, 0)
    for n in c.brokers:
        assert states_of(c, n) == {pid: (epoch, 0)}
    wait_for(lambda: pid not in states_of(c, leader), "the leader to expire the idle producer",
             timeout=expiry_ms / 1000 + converge_s())
    forgot = time.monotonic()
    followers = [n for n in c.brokers if n != leader]
    grace_s = expiry_ms / 1000 + 4 * EXPIRY_CHECK_MS / 1000
    while time.monotonic() - forgot < grace_s:
        if all(pid not in states_of(c, n) for n in followers):
            break
        time.sleep(EXPIRY_CHECK_MS / 1000)
    kept = {n: states_of(c, n).get(pid) for n in followers}
    assert kept == {n: None for n in followers}, (
        f"{time.monotonic() - forgot:.1f} s after the leader (broker {leader}) forgot producer {pid}, "
        f"followers still hold it: {kept}")
