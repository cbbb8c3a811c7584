"""Admin: ListTransactions, DescribeTransactions, find-hanging (kafka-transactions.sh's rule) and the abort of a
hanging transaction with WriteTxnMarkers, after which the last stable offset moves on."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from tests.integration.client.admin_support import lose_transaction_state, open_transaction_then_kill
from tests.integration.helpers import Out, ck_consume, ck_produce, ck_producer

from oncelog.client.admin import Admin, find_hanging
from oncelog.client.admin_types import HangingTransaction, ProducerState, TransactionDescription
from oncelog.client.errors import KafkaError
from oncelog.client.types import TopicPartition

NO_WAIT = 0  # max transaction timeout for find-hanging: any open transaction is old enough


@pytest.fixture(scope="module")
def admin(module_broker):
    client = Admin({"bootstrap.servers": module_broker.bootstrap}, api_timeout=20)
    yield client
    client.close()


def test_list_and_describe_transactions(admin, module_broker, topic_name):
    admin.create_topic(topic_name, 2)
    producer = ck_producer(module_broker.bootstrap, **{"transactional.id": topic_name, "enable.idempotence": True,
                                                       "transaction.timeout.ms": 45000})
    producer.init_transactions(20)
    producer.begin_transaction()
    producer.produce(topic_name, b"x", partition=1)
    assert producer.flush(20) == 0
    before = int(time.time() * 1000)

    d = admin.describe_transaction(topic_name)
    assert (d.transactional_id, d.coordinator_id, d.state, d.timeout_ms) == (topic_name, 0, "Ongoing", 45000)
    assert d.partitions == ((topic_name, 1),) and d.producer_epoch == 0
    assert 0 < d.start_time_ms <= before
    listed = {t.transactional_id: t for t in admin.list_transactions()}
    assert (listed[topic_name].producer_id, listed[topic_name].state) == (d.producer_id, "Ongoing")
    assert [t.transactional_id for t in admin.list_transactions(producer_ids=[d.producer_id])] == [topic_name]
    assert topic_name in {t.transactional_id for t in admin.list_transactions(["Ongoing"])}
    assert topic_name not in {t.transactional_id for t in admin.list_transactions(["CompleteCommit"])}
    assert topic_name in {t.transactional_id for t in admin.list_transactions(min_duration_ms=0)}
    assert topic_name not in {t.transactional_id for t in admin.list_transactions(min_duration_ms=3_600_000)}
    with pytest.raises(KafkaError, match="unknown transaction states: Bogus"):
        admin.list_transactions(["Bogus"])

    producer.commit_transaction(20)
    d = admin.describe_transaction(topic_name)
    assert (d.state, d.partitions, d.start_time_ms is None or d.start_time_ms > 0) == ("CompleteCommit", (), True)
    with pytest.raises(KafkaError) as info:
        admin.describe_transaction(topic_name + "-missing")
    assert info.value.code == 105  # TRANSACTIONAL_ID_NOT_FOUND


def test_a_live_transaction_is_not_hanging(admin, module_broker, topic_name):
    """The coordinator lists the partition in the ongoing transaction: it will write the marker itself."""
    admin.create_topic(topic_name, 1)
    open_transaction_then_kill(module_broker.bootstrap, topic_name, 0, topic_name, ["a", "b"])
    tp = TopicPartition(topic_name, 0)
    (state,) = admin.describe_producers([tp])[tp]
    assert state.current_txn_start_offset == 0
    time.sleep(0.01)
    assert admin.find_hanging_transactions(topic_name, max_transaction_timeout_ms=NO_WAIT) == []
    assert admin.find_hanging_transactions(max_transaction_timeout_ms=NO_WAIT) == []
    assert admin.describe_transaction(topic_name).partitions == ((topic_name, 0),)


def test_find_and_abort_a_hanging_transaction(admin_factory, broker_factory, topic_name):
    broker = broker_factory()
    bootstrap = broker.bootstrap
    with admin_factory(bootstrap) as admin:
        admin.create_topic(topic_name, 2)
        ck_produce(bootstrap, topic_name, [Out(0, None, b"before")])
    open_transaction_then_kill(bootstrap, topic_name, 0, "doomed", ["t0", "t1", "t2"])
    lose_transaction_state(broker)
    ck_produce(bootstrap, topic_name, [Out(0, None, b"after")])
    tp = TopicPartition(topic_name, 0)
    with admin_factory(bootstrap) as admin:
        assert admin.list_transactions() == []  # the coordinator forgot "doomed"
        (state,) = admin.describe_producers([tp])[tp]
        assert state.current_txn_start_offset == 1
        assert admin.list_offsets({tp: "latest"}, isolation="read_committed")[tp].offset == 1  # stuck
        assert admin.list_offsets({tp: "latest"})[tp].offset == 5
        # the producer was last heard of (its records' timestamps) just now: not yet a candidate
        assert admin.find_hanging_transactions(topic_name) == []
        time.sleep(0.01)
        (hanging,) = admin.find_hanging_transactions(topic_name, max_transaction_timeout_ms=NO_WAIT)
        assert (hanging.topic, hanging.partition, hanging.producer_id, hanging.producer_epoch) == (
            topic_name, 0, state.producer_id, state.producer_epoch)
        assert (hanging.start_offset, hanging.reason, hanging.coordinator_epoch) == (1, "unknown producer id", -1)
        (everywhere,) = admin.find_hanging_transactions(max_transaction_timeout_ms=NO_WAIT)
        assert everywhere.duration_ms >= hanging.duration_ms
        assert replace(everywhere, duration_ms=0) == replace(hanging, duration_ms=0)
        assert admin.find_hanging_transactions(topic_name, 1, max_transaction_timeout_ms=NO_WAIT) == []

        with pytest.raises(KafkaError) as info:  # an older epoch than the partition's is refused
            admin.abort_transaction(topic_name, 0, state.producer_id, state.producer_epoch - 1, 0)
        assert info.value.code == 47
        with pytest.raises(KafkaError, match="no open transaction starts at offset 2"):
            admin.abort_transaction_at(topic_name, 0, 2)
        assert admin.abort_transaction_at(topic_name, 0, 1) == state

        assert admin.list_offsets({tp: "latest"}, isolation="read_committed")[tp].offset == 6  # past the marker
        assert admin.find_hanging_transactions(max_transaction_timeout_ms=NO_WAIT) == []
        (after,) = admin.describe_producers([tp])[tp]
        assert after.current_txn_start_offset is None
    committed = ck_consume(bootstrap, topic_name, {0: 0}, **{"isolation.level": "read_committed"})
    assert [r.value for r in committed] == [b"before", b"after"]


@pytest.fixture
def admin_factory():
    made: list[Admin] = []

    def make(bootstrap: str) -> Admin:
        client = Admin({"bootstrap.servers": bootstrap}, api_timeout=20)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


# -- the rule itself, on hand-made inputs -----------------------------------------------------------------------

def _state(pid: int, start: int | None, last_ts: int = 1000) -> ProducerState:
    return ProducerState(pid, 3, 7, last_ts, 5, start)


def _txn(txn_id: str, pid: int, partitions: tuple) -> TransactionDescription:
    return TransactionDescription(txn_id, 0, "Ongoing", pid, 3, 60000, 900, partitions)


def test_find_hanging_rule():
    now, limit = 100_000, 60_000
    open_txns = [
        (("t", 0), _state(1, 10)),  # producer id unknown to every coordinator
        (("t", 1), _state(2, 20)),  # transactional id not found
        (("t", 2), _state(3, 30)),  # the coordinator's transaction is elsewhere
        (("t", 3), _state(4, 40)),  # the coordinator will finish it
        (("t", 4), _state(5, 50, last_ts=now - limit)),  # not silent long enough
        (("t", 5), _state(6, None)),  # no open transaction
    ]
    txn_ids = {2: "b", 3: "c", 4: "d"}
    descriptions = {"b": None, "c": _txn("c", 3, (("t", 9),)), "d": _txn("d", 4, (("t", 3),))}
    found = find_hanging(open_txns, txn_ids, descriptions, now, limit)
    assert found == [
        HangingTransaction("t", 0, 1, 3, 5, 10, 1000, now - 1000, "unknown producer id"),
        HangingTransaction("t", 1, 2, 3, 5, 20, 1000, now - 1000, "unknown transactional id"),
        HangingTransaction("t", 2, 3, 3, 5, 30, 1000, now - 1000, "partition not in transaction"),
    ]
