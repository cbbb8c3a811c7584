"""Replication across broker processes on ZooKeeper, with real clients: the leader is SIGKILLed while an idempotent
producer writes with acks=all, and nothing acknowledged is lost or duplicated (docs/cluster.md §4).

Three `oncelog serve` processes join one cluster (a fresh chroot of the module's ZooKeeper). Deaths are noticed
when the ZooKeeper session expires, so the session timeout is short and every wait is derived from it.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition

from oncelog.embedded import BrokerProcess
from tests.integration.helpers import metric, scrape

SESSION_MS = 6000
WAIT_S = 60 + 6 * SESSION_MS / 1000  # a death to notice, an election, clients to find the new leader
TOPIC = "replicated"
RECORDS = 400


@pytest.fixture
def brokers(coordination_connect, tmp_path):
    started: dict[int, BrokerProcess] = {}
    for node in (1, 2, 3):
        started[node] = BrokerProcess(tmp_path / f"broker-{node}", {
            "oncelog.coordination.connect": coordination_connect, "node.id": node,
            "oncelog.coordination.session.timeout.ms": SESSION_MS,
        }, metrics=True).start(timeout=WAIT_S)
    # Ready is not registered everywhere: until the controller's image lists all three, a topic at RF 3 is
    # refused (INVALID_REPLICATION_FACTOR, seen once in CI). Each broker must list every broker first.
    for proc in started.values():
        wait_for(lambda p=proc: _lists_all(p, set(started)), f"{proc.bootstrap} to list brokers 1, 2 and 3")
    yield started
    for proc in started.values():
        if proc.alive():
            proc.kill()  # a clean stop of the last broker waits for a controlled shutdown nobody can grant


def _lists_all(proc: BrokerProcess, node_ids: set[int]) -> bool:
    md = AdminClient({"bootstrap.servers": proc.bootstrap}).list_topics(timeout=5)
    return set(md.brokers) == node_ids and md.controller_id in node_ids


def bootstrap(brokers: dict[int, BrokerProcess]) -> str:
    return ",".join(p.bootstrap for p in brokers.values() if p.alive())


def partition_info(brokers, timeout: float = 10.0):
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    md = admin.list_topics(TOPIC, timeout=timeout)
    return md.topics[TOPIC].partitions[0]


def wait_for(predicate, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # a broker that just died may refuse a metadata call
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


def consume_all(brokers, expected: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap(brokers), "group.id": "check", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "enable.partition.eof": True})
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191 and len(values) >= expected:  # _PARTITION_EOF
                    return values
                continue
            values.append(msg.value())
        raise AssertionError(f"read {len(values)} of {expected} records in {WAIT_S:.0f}s")
    finally:
        consumer.close()


def test_leader_sigkill_under_an_idempotent_acks_all_producer_loses_and_duplicates_nothing(brokers):
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    admin.create_topics([NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})])[TOPIC].result(WAIT_S)
    first = wait_for(lambda: (p := partition_info(brokers)).leader > 0 and len(p.isrs) == 3 and p,
                     "the topic with three in-sync replicas")
    leader = first.leader

    producer = Producer({"bootstrap.servers": bootstrap(brokers), "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": int(WAIT_S * 1000), "retry.backoff.ms": 100})
    acked: list[tuple[int, bytes]] = []
    failed: list = []
    lock = threading.Lock()

    def report(err, msg):
        with lock:
            (failed if err else acked).append(err if err else (msg.offset(), msg.value()))

    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"r%04d" % i, partition=0, on_delivery=report)
        producer.poll(0)
        if i == RECORDS // 4:
            producer.flush(WAIT_S)
            brokers[leader].kill()  # mid-stream: the rest goes out while the cluster elects
        elif i % 50 == 0:
            time.sleep(0.05)
    remaining = producer.flush(WAIT_S)
    assert remaining == 0 and not failed, (remaining, failed[:3])
    assert len(acked) == RECORDS

    after = wait_for(lambda: (p := partition_info(brokers)).leader not in (-1, leader) and p, "a new leader")
    assert leader not in after.isrs
    # Every acknowledged record once, in the order written, at the offsets acknowledged.
    values = consume_all(brokers, RECORDS)
    assert values == [b"r%04d" % i for i in range(RECORDS)]
    assert sorted(acked) == [(o, b"r%04d" % o) for o in range(RECORDS)]

    # The killed broker comes back as a follower, catches up and rejoins the ISR; then it can lead: the second
    # leader is killed too, and the log read through whoever leads next is still exactly the same.
    brokers[leader].start(timeout=WAIT_S)
    wait_for(lambda: len(partition_info(brokers).isrs) == 3, "the restarted broker back in the ISR")
    second = partition_info(brokers).leader
    brokers[second].kill()
    wait_for(lambda: (p := partition_info(brokers)).leader not in (-1, second) and p, "a third leader")
    assert consume_all(brokers, RECORDS) == [b"r%04d" % i for i in range(RECORDS)]


def test_acks_all_waits_for_every_isr_member_and_survives_the_leader(brokers):
    """Both followers paused (SIGSTOP, shorter than the session): acks=all writes stay unanswered, since they are
    on the leader only. The leader is SIGKILLed and the followers resume: one of them is elected, the producer's
    retries land there once, and every record is read exactly once."""
    import os
    import signal

    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    admin.create_topics([NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})])[TOPIC].result(WAIT_S)
    leader = wait_for(lambda: (p := partition_info(brokers)).leader > 0 and len(p.isrs) == 3 and p,
                      "the topic with three in-sync replicas").leader
    followers = [n for n in brokers if n != leader]
    producer = Producer({"bootstrap.servers": bootstrap(brokers), "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "message.timeout.ms": int(WAIT_S * 1000), "retry.backoff.ms": 100})
    acked: list[int] = []
    failed: list = []
    report = lambda err, msg: (failed if err else acked).append(err if err else msg.offset())  # noqa: E731
    for i in range(10):
        producer.produce(TOPIC, value=b"a%02d" % i, partition=0, on_delivery=report)
    assert producer.flush(WAIT_S) == 0 and len(acked) == 10
    paused = time.monotonic()
    for n in followers:
        os.kill(brokers[n].proc.pid, signal.SIGSTOP)
    try:
        for i in range(10, 30):
            producer.produce(TOPIC, value=b"a%02d" % i, partition=0, on_delivery=report)
        end = time.monotonic() + min(2.0, SESSION_MS / 3000)
        while time.monotonic() < end:
            producer.poll(0.1)
        assert len(acked) == 10 and not failed, "acknowledged while only the leader had the records"
        brokers[leader].kill()
    finally:
        for n in followers:
            os.kill(brokers[n].proc.pid, signal.SIGCONT)
    assert time.monotonic() - paused < SESSION_MS / 1000  # the followers kept their sessions
    assert producer.flush(WAIT_S) == 0 and not failed, failed[:3]
    assert sorted(acked) == list(range(30))
    assert consume_all(brokers, 30) == [b"a%02d" % i for i in range(30)]


def test_consumers_validate_their_position_with_the_new_leader(brokers):
    """After a failover the leader epoch in the metadata moves; kafka-python and librdkafka then check the position
    they hold (an offset and the epoch of the record before it) with OffsetsForLeaderEpoch at the new leader, and
    read on from there. Records carry the epoch of the leader that wrote them."""
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    admin.create_topics([NewTopic(TOPIC, 1, 3)])[TOPIC].result(WAIT_S)
    leader = wait_for(lambda: (p := partition_info(brokers)).leader > 0 and len(p.isrs) == 3 and p,
                      "the topic with three in-sync replicas").leader
    producer = Producer({"bootstrap.servers": bootstrap(brokers), "enable.idempotence": True, "acks": "all"})
    for i in range(20):
        producer.produce(TOPIC, value=b"v%02d" % i, partition=0)
    assert producer.flush(WAIT_S) == 0

    kp = KafkaConsumer(bootstrap_servers=bootstrap(brokers), enable_auto_commit=False,
                       auto_offset_reset="earliest", metadata_max_age_ms=1000)
    ck = Consumer({"bootstrap.servers": bootstrap(brokers), "group.id": "validate", "enable.auto.commit": False,
                   "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 1000})
    read: dict[str, list[tuple[int, int, bytes]]] = {"kafka-python": [], "librdkafka": []}

    def poll_until(count: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while min(len(v) for v in read.values()) < count:
            assert time.monotonic() < deadline, {k: len(v) for k, v in read.items()}
            for records in kp.poll(200).values():
                read["kafka-python"] += [(r.offset, r.leader_epoch, r.value) for r in records]
            msg = ck.poll(0.1)
            if msg is not None and not msg.error():
                read["librdkafka"].append((msg.offset(), msg.leader_epoch(), msg.value()))

    try:
        tp = KpTopicPartition(TOPIC, 0)
        kp.assign([tp])
        kp.seek(tp, 0)
        ck.assign([TopicPartition(TOPIC, 0, 0)])
        poll_until(20)
        brokers[leader].kill()
        new = wait_for(lambda: (p := partition_info(brokers)).leader not in (-1, leader) and p, "a new leader")
        for i in range(20, 40):
            producer.produce(TOPIC, value=b"v%02d" % i, partition=0)
        assert producer.flush(WAIT_S) == 0
        poll_until(40)
    finally:
        kp.close()
        ck.close()
    want = [(i, 0 if i < 20 else 1, b"v%02d" % i) for i in range(40)]
    assert read["kafka-python"] == want
    assert read["librdkafka"] == want
    asked = metric(scrape(brokers[new.leader].metrics_port), "oncelog_requests_total", api="OFFSET_FOR_LEADER_EPOCH")
    # Consumers validated with the new leader. (Followers no longer ask it: DivergingEpoch answers to their fetches
    # replace their OffsetsForLeaderEpoch, so only the clients' requests are counted here: at least one.)
    assert asked >= 1


# -- a replica whose log starts over takes the leader's producer state (docs/cluster.md §4.7, seed 000) ----------
def init_producer(bootstrap: str) -> tuple[int, int]:
    from kafka.protocol.producer import InitProducerIdRequest

    from tests.support.wire import Wire

    with Wire(bootstrap, timeout=WAIT_S) as w:
        resp = w.request(InitProducerIdRequest[4](transactional_id=None, transaction_timeout_ms=60000,
                                                  producer_id=-1, producer_epoch=-1), 4)
    assert resp.error_code == 0, resp
    return resp.producer_id, resp.producer_epoch


def produce_to(bootstrap: str, values: list[bytes], pid: int = -1, epoch: int = -1, seq: int = -1,
               acks: int = -1) -> tuple[int, int]:
    from oncelog.records.builder import build_batch
    from tests.integration.helpers import produce_raw
    from tests.support.wire import Wire

    batch = build_batch([(None, v, (), int(time.time() * 1000)) for v in values], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq)
    with Wire(bootstrap, timeout=WAIT_S) as w:
        part = produce_raw(w, TOPIC, 0, batch, acks=acks, timeout_ms=int(WAIT_S * 1000))
    return part.error_code, part.base_offset


def write_then_delete(bootstrap: str) -> tuple[int, int, list[tuple[list[bytes], int, int]]]:
    """An idempotent producer writes four batches (offsets 0-7), a plain producer one more (8-9), and
    DeleteRecords removes everything before 8: the producer's batches are gone from every replica's log."""
    from kafka.protocol.admin import DeleteRecordsRequest

    from tests.support.wire import Wire

    pid, epoch = init_producer(bootstrap)
    sent = []
    for i in range(4):
        records = [b"p%d-%d" % (i, j) for j in range(2)]
        assert produce_to(bootstrap, records, pid, epoch, 2 * i) == (0, 2 * i)
        sent.append((records, 2 * i, 2 * i))
    assert produce_to(bootstrap, [b"plain-1", b"plain-2"]) == (0, 8)
    req = DeleteRecordsRequest[2]
    with Wire(bootstrap, timeout=WAIT_S) as w:
        resp = w.request(req(topics=[req.DeleteRecordsTopic(name=TOPIC, partitions=[
            req.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=8)])],
            timeout_ms=int(WAIT_S * 1000)), 2)
    (p,) = resp.topics[0].partitions
    assert (p.error_code, p.low_watermark) == (0, 8)
    return pid, epoch, sent


def answers_as_the_old_leader(bootstrap: str, pid: int, epoch: int, sent) -> None:
    """Kafka's new replica rebuilds producer state from its log alone: it would answer UNKNOWN_PRODUCER_ID to the
    producer's next batch, and append a retry of sequence 0 again."""
    for records, seq, base in sent:
        assert produce_to(bootstrap, records, pid, epoch, seq) == (0, base)  # retries: their original offsets
    assert produce_to(bootstrap, [b"next"], pid, epoch, 8) == (0, 10)  # same epoch, next sequence: accepted


def test_a_replica_added_by_reassignment_knows_a_producer_whose_records_were_deleted(brokers):
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition as KpTopicPartition

    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replica_assignment=[[1, 2]])])[TOPIC].result(WAIT_S)
    wait_for(lambda: (p := partition_info(brokers)).leader == 1 and sorted(p.isrs) == [1, 2], "leader 1, ISR 1 2")
    pid, epoch, sent = write_then_delete(brokers[1].bootstrap)
    # The partition moves to broker 3 alone, through the admin API: broker 3 is added, copies the log from the
    # log start (8) with the producer state, joins the ISR, takes the leadership; brokers 1 and 2 are removed.
    kp_admin = KafkaAdminClient(bootstrap_servers=bootstrap(brokers))
    try:
        kp_admin.alter_partition_reassignments({KpTopicPartition(TOPIC, 0): [3]})
    finally:
        kp_admin.close()
    wait_for(lambda: (p := partition_info(brokers)).leader == 3 and p.replicas == [3] and p.isrs == [3],
             "broker 3 to hold the partition alone")
    answers_as_the_old_leader(brokers[3].bootstrap, pid, epoch, sent)


def test_a_replica_restarted_with_a_wiped_data_directory_knows_the_producer_again(brokers):
    import shutil

    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition as KpTopicPartition

    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replica_assignment=[[1, 2, 3]])])[TOPIC].result(WAIT_S)
    wait_for(lambda: (p := partition_info(brokers)).leader == 1 and len(p.isrs) == 3, "leader 1, full ISR")
    pid, epoch, sent = write_then_delete(brokers[1].bootstrap)
    # Broker 3 loses its disk: SIGKILL, its data directory gone, started again empty. It returns to the ISR
    # (with the producer state), then becomes the leader by a reordered assignment and a preferred election.
    brokers[3].kill()
    shutil.rmtree(brokers[3].data_dir)
    wait_for(lambda: 3 not in partition_info(brokers).isrs, "broker 3 out of the ISR")
    brokers[3].start(timeout=WAIT_S)
    wait_for(lambda: len(partition_info(brokers).isrs) == 3, "broker 3 back in the ISR")
    kp_admin = KafkaAdminClient(bootstrap_servers=bootstrap(brokers))
    try:
        kp_admin.alter_partition_reassignments({KpTopicPartition(TOPIC, 0): [3, 1, 2]})
        wait_for(lambda: partition_info(brokers).replicas == [3, 1, 2], "the new replica order")
        kp_admin.elect_leaders(0, {TOPIC: [0]})
    finally:
        kp_admin.close()
    wait_for(lambda: partition_info(brokers).leader == 3, "broker 3 to lead")
    answers_as_the_old_leader(brokers[3].bootstrap, pid, epoch, sent)
