"""Our transactional producer against a real broker: commit and abort as read_committed consumers see them,
KAFKA-9803's timeout recovery (abortable error → abort → InitProducerId(pid, epoch) → the next transaction
commits), fencing by a second instance (fatal), offsets sent to the transaction."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition
from tests.integration.client.producer_support import Reports, log_batches
from tests.integration.helpers import ck_consume, create_topic
from tests.support.broker import BrokerProcess

from oncelog.client.errors import AbortableError, FatalError, KafkaError, ProducerFenced
from oncelog.client.producer import Producer
from oncelog.client.types import TopicPartition

REAPER_MS = 200
COMMITTED = {"isolation.level": "read_committed"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = BrokerProcess(tmp_path_factory.mktemp("producer-txn") / "data",
                         {"transaction.abort.timed.out.transaction.cleanup.interval.ms": REAPER_MS}).start()
    yield proc
    if proc.alive():
        proc.stop()


def txn_producer(bootstrap: str, txn_id: str, **conf) -> Producer:
    base = {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 2}
    base.update(conf)
    p = Producer(base)
    p.init_transactions(15)
    return p


def committed_values(bootstrap: str, topic: str, partitions: int = 1) -> list[bytes]:
    return [r.value for r in ck_consume(bootstrap, topic, dict.fromkeys(range(partitions), 0), **COMMITTED)]


def send(p: Producer, topic: str, values: list[str], partition: int = 0) -> Reports:
    reports = Reports()
    for v in values:
        p.produce(topic, v, partition=partition, on_delivery=reports)
    p.flush(15)
    return reports


def test_commit_is_visible_and_abort_is_not(broker, topic_name):
    bs = broker.bootstrap
    create_topic(bs, topic_name, 2)
    p = txn_producer(bs, f"tx-{topic_name}")
    p.begin_transaction()
    for i in range(10):
        p.produce(topic_name, f"c{i}", partition=i % 2)
    p.commit_transaction(15)
    p.begin_transaction()
    for i in range(6):
        p.produce(topic_name, f"a{i}", partition=i % 2)
    p.flush(15)
    p.abort_transaction(15)
    p.begin_transaction()
    for i in range(4):
        p.produce(topic_name, f"d{i}", partition=i % 2)
    p.commit_transaction(15)
    p.close()
    got = committed_values(bs, topic_name, 2)
    assert sorted(got) == sorted([f"c{i}".encode() for i in range(10)] + [f"d{i}".encode() for i in range(4)])
    # the abort moved the producer to a new epoch (KIP-360); the last transaction used it from sequence 0
    last = [b for b in log_batches(bs, topic_name, 0) if not b.is_control][-1]
    assert (last.producer_epoch, last.base_sequence) == (1, 0)


def test_produce_outside_a_transaction_is_refused(broker, topic_name):
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    p = txn_producer(bs, f"tx-{topic_name}")
    with pytest.raises(KafkaError, match="open transaction"):
        p.produce(topic_name, b"x")
    p.close()


@pytest.mark.parametrize("next_step", ["produce", "commit"])
def test_timed_out_transaction_recovers(broker, topic_name, next_step):
    """KAFKA-9803: the coordinator's reaper aborts the transaction; the producer's next Produce is answered with
    an abortable error, commit refuses, abort bumps the epoch through InitProducerId(pid, epoch), and the next
    transaction commits. A producer treating the answer as fatal, or aborting without the bump, fails here."""
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    p = txn_producer(bs, f"tx-{topic_name}-{next_step}", **{"transaction.timeout.ms": 1000})
    p.begin_transaction()
    assert send(p, topic_name, ["lost0", "lost1"]).errors() == []
    time.sleep(1.0 + 3 * REAPER_MS / 1000 + 0.5)  # the reaper aborts the transaction and bumps the epoch
    if next_step == "produce":  # Produce at the old epoch: UNKNOWN_PRODUCER_ID, abortable
        late = send(p, topic_name, ["late"])
        (err,) = late.errors()
        assert isinstance(err, AbortableError) and not err.fatal, err
    with pytest.raises(AbortableError):  # EndTxn(COMMIT) at the old epoch: abortable too
        p.commit_transaction(15)
    p.abort_transaction(15)
    p.begin_transaction()
    assert send(p, topic_name, ["ok0", "ok1", "ok2"]).errors() == []
    p.commit_transaction(15)
    p.begin_transaction()
    assert send(p, topic_name, ["again"]).errors() == []
    p.commit_transaction(15)
    p.close()
    assert committed_values(bs, topic_name) == [b"ok0", b"ok1", b"ok2", b"again"]
    epochs = {b.records[0].value: b.producer_epoch for b in log_batches(bs, topic_name) if not b.is_control}
    # the reaper bumped 0 -> 1 and remembered 0 as the owner's epoch: InitProducerId(pid, 0) claims epoch 1
    assert (epochs[b"lost0"], epochs[b"ok0"], epochs[b"again"]) == (0, 1, 1), epochs


def test_a_second_instance_fences_the_first(broker, topic_name):
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    txn_id = f"tx-{topic_name}"
    zombie = txn_producer(bs, txn_id)
    zombie.begin_transaction()
    assert send(zombie, topic_name, ["z0"]).errors() == []
    fresh = txn_producer(bs, txn_id)
    with pytest.raises(FatalError) as info:
        zombie.commit_transaction(15)
    assert isinstance(info.value, ProducerFenced) or info.value.fatal
    with pytest.raises(FatalError):
        zombie.begin_transaction()
    fresh.begin_transaction()
    assert send(fresh, topic_name, ["f0"]).errors() == []
    fresh.commit_transaction(15)
    fresh.close()
    zombie.close()
    assert committed_values(bs, topic_name) == [b"f0"]


def test_offsets_committed_with_the_transaction(broker, topic_name):
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    group = f"g-{topic_name}"
    p = txn_producer(bs, f"tx-{topic_name}")
    p.begin_transaction()
    send(p, topic_name, ["x"])
    p.send_offsets_to_transaction([TopicPartition(topic_name, 0, 42)], group, 15)
    p.commit_transaction(15)
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(topic_name, 0, 99)], group, 15)
    p.abort_transaction(15)
    p.close()
    consumer = CKConsumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False,
                           "isolation.level": "read_committed"})
    try:
        (tp,) = consumer.committed([CKTopicPartition(topic_name, 0)], timeout=15)
    finally:
        consumer.close()
    assert tp.offset == 42, "the aborted transaction's offsets must not count"


def test_exactly_once_copy_with_our_consumer(broker, topic_name):
    """Consume, produce and commit the consumer's positions in one transaction (with its group metadata); an
    aborted round is re-read from the committed offsets. The output holds every input record exactly once."""
    from oncelog.client.consumer.consumer import Consumer

    bs = broker.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(bs, source, 1)
    create_topic(bs, sink, 1)
    feeder = Producer({"bootstrap.servers": bs})
    for i in range(30):
        feeder.produce(source, f"m{i}", partition=0)
    assert feeder.flush(15) == 0
    feeder.close()
    group = f"g-{topic_name}"
    consumer = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    p = txn_producer(bs, f"tx-{topic_name}")
    try:
        consumer.subscribe([source])
        copied = 0
        rounds = 0
        while copied < 30:
            rounds += 1
            assert rounds < 50, "the copy does not make progress"
            msgs = [m for m in consumer.consume(10, timeout=5) if m.error() is None]
            if not msgs:
                continue
            p.begin_transaction()
            for m in msgs:
                p.produce(sink, m.value(), partition=0)
            p.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                          consumer.consumer_group_metadata(), 15)
            if rounds == 2:  # one failed round: abort, go back to the committed offsets
                p.abort_transaction(15)
                for tp in consumer.committed(consumer.assignment(), timeout=15):
                    consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
                continue
            p.commit_transaction(15)
            copied += len(msgs)
    finally:
        consumer.close()
        p.close()
    assert committed_values(bs, sink) == [f"m{i}".encode() for i in range(30)]
    checker = CKConsumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False})
    try:
        (tp,) = checker.committed([CKTopicPartition(source, 0)], timeout=15)
    finally:
        checker.close()
    assert tp.offset == 30
