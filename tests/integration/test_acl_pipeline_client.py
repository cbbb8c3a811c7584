"""The README's "ACLs a transactional pipeline needs" (Broker security), with oncelog's own client.

tests/integration/test_acl_groups_txns.py runs the same consume-transform-produce pipeline with librdkafka; here
oncelog's Consumer (a group member, read_committed) and transactional Producer run as `User:app`, which holds
exactly what the README's three kafka-acls lines grant (READ on topic `in` and group `etl`, WRITE and DESCRIBE on
topic `out` and transactional id `etl-tx`) on a broker with ACLs on and allow.everyone.if.no.acl.found=false.
Without the transactional id's WRITE the producer is refused at init_transactions and nothing is written.
"""

from __future__ import annotations

import time

import pytest
from tests.integration.helpers import Out, ck_consume, ck_produce
from tests.support.acl_broker import AclBroker, acl_settings

from oncelog.client import Consumer, KafkaError, Producer
from oncelog.errors import ErrorCode

SETTINGS = {**acl_settings(("admin", "app")), "allow.everyone.if.no.acl.found": "false",
            "group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 2,
            "transaction.state.log.num.partitions": 2}
IN, OUT, GROUP, TXN_ID = "in", "out", "etl", "etl-tx"
COUNT = 30


@pytest.fixture
def broker(tmp_path):
    b = AclBroker(tmp_path, SETTINGS).start()
    admin = b.admin()
    from confluent_kafka.admin import NewTopic

    for future in admin.create_topics([NewTopic(IN, 2, 1), NewTopic(OUT, 2, 1)], operation_timeout=10).values():
        future.result(15)
    outs = [Out(i % 2, f"k{i}".encode(), f"in-{i}".encode()) for i in range(COUNT)]
    ck_produce(b.bootstrap, IN, outs, **as_admin(b))
    yield b
    b.stop()


def as_admin(broker: AclBroker) -> dict[str, str]:
    conf = broker.client("admin")
    conf.pop("bootstrap.servers")
    return conf


def grant_readme_acls(broker: AclBroker, *, transactional_id_write: bool = True) -> None:
    """The README's three kafka-acls lines, for User:app."""
    broker.grant("app", "TOPIC", IN, "READ")
    broker.grant("app", "GROUP", GROUP, "READ")
    broker.grant("app", "TOPIC", OUT, "WRITE", "DESCRIBE")
    broker.grant("app", "TRANSACTIONAL_ID", TXN_ID, *(("WRITE", "DESCRIBE") if transactional_id_write
                                                      else ("DESCRIBE",)))


def committed_out(broker: AclBroker) -> list[bytes]:
    recs = ck_consume(broker.bootstrap, OUT, {0: 0, 1: 0}, **as_admin(broker), **{"isolation.level": "read_committed"})
    return sorted(r.value for r in recs)


def test_pipeline_with_the_readme_acls(broker):
    grant_readme_acls(broker)
    consumer = Consumer(broker.client("app", **{"group.id": GROUP, "auto.offset.reset": "earliest",
                                                "enable.auto.commit": False, "isolation.level": "read_committed"}))
    producer = Producer(broker.client("app", **{"transactional.id": TXN_ID}))
    try:
        producer.init_transactions(20)
        consumer.subscribe([IN])
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(seen) < COUNT:
            assert time.monotonic() < deadline, f"read {len(seen)} of {COUNT}"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            seen.append(msg.value())
        producer.begin_transaction()
        for value in seen:
            producer.produce(OUT, value=value.replace(b"in-", b"out-"))
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 20)
        producer.commit_transaction(20)
        positions = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(consumer.assignment(), 10)}
    finally:
        consumer.close()
        producer.close(5)
    assert positions == {(IN, 0): COUNT // 2, (IN, 1): COUNT // 2}
    assert committed_out(broker) == sorted(f"out-{i}".encode() for i in range(COUNT))


def test_without_write_on_the_transactional_id_nothing_is_written(broker):
    grant_readme_acls(broker, transactional_id_write=False)
    producer = Producer(broker.client("app", **{"transactional.id": TXN_ID}))
    try:
        with pytest.raises(KafkaError) as refused:
            producer.init_transactions(20)
    finally:
        producer.close(5)
    assert refused.value.code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refused.value
    assert committed_out(broker) == []
