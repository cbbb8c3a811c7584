"""The broker's own compacted topics are cleaned (issue 22): `__consumer_offsets` after thousands of commits of
one group and `__transaction_state` after hundreds of transactions of one transactional id stay a few segments
long (offsets.topic.segment.bytes, transaction.state.log.segment.bytes), and the coordinators load the cleaned
logs after a SIGKILL with the right state: the last committed offset, and a producer that fences and goes on."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from tests.integration.helpers import ck_consume, create_topic, wait_until

SEGMENT = 16384
COMMITS = 2000
TRANSACTIONS = 300


def log_bytes(broker, name: str) -> int:
    return sum(f.stat().st_size for f in (Path(broker.data_dir) / name).glob("*.log"))


def test_consumer_offsets_stay_bounded_and_load_after_a_sigkill(broker_factory, topic_name):
    broker = broker_factory({"offsets.topic.segment.bytes": SEGMENT, "offsets.topic.num.partitions": 1,
                             "log.cleaner.backoff.ms": 100})
    create_topic(broker.bootstrap, topic_name)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic_name}",
                         "enable.auto.commit": False})
    try:
        for i in range(1, COMMITS + 1):
            consumer.commit(offsets=[TopicPartition(topic_name, 0, i)], asynchronous=False)
    finally:
        consumer.close()
    # Every commit is the same key: what stays is the newest commit plus the active segment.
    wait_until(lambda: log_bytes(broker, "__consumer_offsets-0") < 3 * SEGMENT, timeout=60, interval=0.2,
               what="__consumer_offsets cleaned")
    broker.kill()
    broker.start()
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic_name}",
                         "enable.auto.commit": False})
    try:
        (tp,) = consumer.committed([TopicPartition(topic_name, 0)], timeout=30)
    finally:
        consumer.close()
    assert tp.offset == COMMITS


def test_transaction_state_stays_bounded_and_loads_after_a_sigkill(broker_factory, topic_name):
    broker = broker_factory({"transaction.state.log.segment.bytes": SEGMENT,
                             "transaction.state.log.num.partitions": 1, "log.cleaner.backoff.ms": 100})
    create_topic(broker.bootstrap, topic_name)
    conf = {"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic_name}", "linger.ms": 0}
    producer = Producer(conf)
    producer.init_transactions(30)
    for i in range(TRANSACTIONS):
        producer.begin_transaction()
        producer.produce(topic_name, key=b"k", value=b"%d" % i, partition=0)
        producer.commit_transaction(30)
    wait_until(lambda: log_bytes(broker, "__transaction_state-0") < 3 * SEGMENT, timeout=60, interval=0.2,
               what="__transaction_state cleaned")
    broker.kill()
    broker.start()
    # The id's state came back from the cleaned log: a new instance fences the old one and goes on.
    again = Producer(conf)
    again.init_transactions(30)
    again.begin_transaction()
    again.produce(topic_name, key=b"k", value=b"after", partition=0)
    again.commit_transaction(30)
    values = [r.value for r in ck_consume(broker.bootstrap, topic_name, {0: 0},
                                          **{"isolation.level": "read_committed"})]
    assert values == [b"%d" % i for i in range(TRANSACTIONS)] + [b"after"]


def test_deleted_groups_and_expired_ids_leave_the_internal_topics(broker_factory, topic_name):
    """Groups deleted (DeleteGroups) and transactional ids expired (transactional.id.expiration.ms) are
    tombstoned; the cleaner removes what came before, and the tombstones themselves once delete.retention.ms has
    passed, so nothing of them is read back from the internal topics, and what a coordinator loads after a
    SIGKILL is the live group and the live id only."""
    from confluent_kafka.admin import AdminClient

    broker = broker_factory({
        "offsets.topic.segment.bytes": 4096, "offsets.topic.num.partitions": 1,
        "transaction.state.log.segment.bytes": 4096, "transaction.state.log.num.partitions": 1,
        "log.cleaner.backoff.ms": 100, "log.cleaner.delete.retention.ms": 0,
        "transactional.id.expiration.ms": 3000, "transaction.remove.expired.transaction.cleanup.interval.ms": 500})
    create_topic(broker.bootstrap, topic_name)
    gone_groups = [f"gone-group-{i}" for i in range(10)]
    for group in gone_groups:
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition(topic_name, 0, 7)], asynchronous=False)
        c.close()
    for i in range(10):
        p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"gone-tx-{i}"})
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(topic_name, key=b"k", value=b"gone", partition=0)
        p.commit_transaction(30)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.delete_consumer_groups(gone_groups, request_timeout=30).values():
        future.result(30)

    def internal_keys(topic: str) -> bytes:
        return b"|".join(r.key or b"" for r in ck_consume(broker.bootstrap, topic, {0: 0}))
    assert b"gone-group-0" in internal_keys("__consumer_offsets")
    assert b"gone-tx-0" in internal_keys("__transaction_state")

    # One live group and one live id keep writing: their records roll the segments the others sit in.
    live = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "live-group", "enable.auto.commit": False})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "live-tx", "linger.ms": 0})
    producer.init_transactions(30)
    n = [0]

    def gone() -> bool:
        for _ in range(20):
            n[0] += 1
            live.commit(offsets=[TopicPartition(topic_name, 0, n[0])], asynchronous=False)
            producer.begin_transaction()
            producer.produce(topic_name, key=b"k", value=b"live-%d" % n[0], partition=0)
            producer.commit_transaction(30)
        return (b"gone-group" not in internal_keys("__consumer_offsets")
                and b"gone-tx" not in internal_keys("__transaction_state"))
    wait_until(gone, timeout=90, interval=0.2, what="deleted groups and expired ids cleaned out")
    live.close()

    broker.kill()
    broker.start()
    check = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "live-group", "enable.auto.commit": False})
    try:
        (tp,) = check.committed([TopicPartition(topic_name, 0)], timeout=30)
    finally:
        check.close()
    assert tp.offset == n[0]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listed = {g.group_id for g in admin.list_consumer_groups(request_timeout=30).result(30).valid}
    assert "live-group" in listed and not listed & set(gone_groups)
    again = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "live-tx"})
    again.init_transactions(30)  # the live id loaded: a new instance fences the old one and goes on
    again.begin_transaction()
    again.produce(topic_name, key=b"k", value=b"after", partition=0)
    again.commit_transaction(30)
