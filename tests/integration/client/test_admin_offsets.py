"""Admin: ListOffsets (every spec, both isolation levels), DeleteRecords and DescribeProducers, against data
written by confluent-kafka, with the exact offsets and error codes."""

from __future__ import annotations

import pytest
from tests.integration.helpers import Out, ck_consume, ck_produce, ck_producer

from oncelog.client.admin import Admin
from oncelog.client.errors import KafkaError
from oncelog.client.types import TopicPartition


@pytest.fixture(scope="module")
def admin(module_broker):
    client = Admin({"bootstrap.servers": module_broker.bootstrap}, api_timeout=20)
    yield client
    client.close()


def code_of(call, *args, **kwargs) -> int:
    with pytest.raises(KafkaError) as info:
        call(*args, **kwargs)
    return info.value.code


def test_list_offsets_every_spec(admin, module_broker, topic_name):
    admin.create_topic(topic_name, 2)
    base = 1_700_000_000_000
    stamps = [base + 10, base + 30, base + 20, base + 40]
    ck_produce(module_broker.bootstrap, topic_name, [Out(0, None, b"v%d" % i, (), ts) for i, ts in enumerate(stamps)])
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    got = admin.list_offsets({tp0: "earliest", tp1: "earliest"})
    assert [(o.offset, o.timestamp) for o in got.values()] == [(0, -1), (0, -1)]
    got = admin.list_offsets({tp0: "latest", tp1: "latest"})
    assert [o.offset for o in got.values()] == [4, 0]
    got = admin.list_offsets({tp0: "max_timestamp"})[tp0]
    assert (got.offset, got.timestamp) == (3, base + 40)
    by_time = admin.list_offsets({(topic_name, 0): base + 25})[tp0]
    assert (by_time.offset, by_time.timestamp) == (1, base + 30)  # the first record at or after the time
    assert admin.list_offsets({tp0: base + 41})[tp0].offset == -1  # none that late
    # keys may be TopicPartitions or (topic, partition) tuples; answers are keyed by TopicPartition
    assert admin.list_offsets({(topic_name, 0): "latest"})[tp0].offset == 4
    assert code_of(admin.list_offsets, {(topic_name, 2): "latest"}) == 3
    assert code_of(admin.list_offsets, {(topic_name + "-missing", 0): "latest"}) == 3
    with pytest.raises(ValueError):
        admin.list_offsets({tp0: "yesterday"})


def test_isolation_levels_and_producer_state(admin, module_broker, topic_name):
    admin.create_topic(topic_name, 1)
    tp = TopicPartition(topic_name, 0)
    ck_produce(module_broker.bootstrap, topic_name, [Out(0, None, b"plain")])
    producer = ck_producer(module_broker.bootstrap, **{"transactional.id": topic_name, "enable.idempotence": True})
    producer.init_transactions(20)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic_name, b"t%d" % i, partition=0)
    assert producer.flush(20) == 0
    assert admin.list_offsets({tp: "latest"}, isolation="read_uncommitted")[tp].offset == 4
    assert admin.list_offsets({tp: "latest"}, isolation="read_committed")[tp].offset == 1  # the LSO

    (state,) = admin.describe_producers([tp])[tp]
    txn = admin.describe_transaction(topic_name)
    assert (state.producer_id, state.producer_epoch) == (txn.producer_id, txn.producer_epoch)
    assert (state.last_sequence, state.current_txn_start_offset) == (2, 1)
    assert state.last_timestamp > 0

    producer.commit_transaction(20)
    assert admin.list_offsets({tp: "latest"}, isolation="read_committed")[tp].offset == 5
    (state,) = admin.describe_producers([tp])[tp]
    assert state.current_txn_start_offset is None and state.coordinator_epoch == 0


def test_describe_producers_of_idempotent_producers(admin, module_broker, topic_name):
    admin.create_topic(topic_name, 2)
    ck_produce(module_broker.bootstrap, topic_name, [Out(0, None, b"a"), Out(0, None, b"b"), Out(1, None, b"c")],
               **{"enable.idempotence": True})
    ck_produce(module_broker.bootstrap, topic_name, [Out(1, None, b"d")], **{"enable.idempotence": True})
    found = admin.describe_producers([(topic_name, 0), (topic_name, 1)])
    (p0,) = found[TopicPartition(topic_name, 0)]
    assert (p0.producer_epoch, p0.last_sequence, p0.current_txn_start_offset) == (0, 1, None)
    first, second = found[TopicPartition(topic_name, 1)]
    assert first.producer_id == p0.producer_id and second.producer_id > first.producer_id
    assert (first.last_sequence, second.last_sequence) == (0, 0)
    assert code_of(admin.describe_producers, [(topic_name, 5)]) == 3


def test_delete_records(admin, module_broker, topic_name):
    admin.create_topic(topic_name, 2)
    ck_produce(module_broker.bootstrap, topic_name, [Out(p, None, b"%d-%d" % (p, i)) for p in (0, 1) for i in range(5)])
    lows = admin.delete_records({(topic_name, 0): 3, (topic_name, 1): -1})
    assert lows == {TopicPartition(topic_name, 0): 3, TopicPartition(topic_name, 1): 5}
    earliest = admin.list_offsets({(topic_name, p): "earliest" for p in (0, 1)})
    assert [o.offset for o in earliest.values()] == [3, 5]
    assert [r.value for r in ck_consume(module_broker.bootstrap, topic_name, {0: 3})] == [b"0-3", b"0-4"]
    assert code_of(admin.delete_records, {(topic_name, 0): 6}) == 1  # OFFSET_OUT_OF_RANGE: beyond the end
    assert code_of(admin.delete_records, {(topic_name, 2): 0}) == 3
    assert admin.delete_records({(topic_name, 0): 2}) == {TopicPartition(topic_name, 0): 3}  # never backwards


def test_delete_records_refused_on_compacted_topics(admin, topic_name):
    admin.create_topic(topic_name, 1, configs={"cleanup.policy": "compact"})
    assert code_of(admin.delete_records, {(topic_name, 0): 0}) == 44  # POLICY_VIOLATION
