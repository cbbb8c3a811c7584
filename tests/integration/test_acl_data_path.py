"""ACLs on the data path: Metadata, Produce, Fetch (docs/security.md §5), on a broker with the StandardAuthorizer's
semantics. Kafka's answers: a topic the principal may not DESCRIBE is TOPIC_AUTHORIZATION_FAILED whether or not it
exists and is left out of an all-topics answer; no WRITE or READ is TOPIC_AUTHORIZATION_FAILED and nothing is
appended or read; a client posing as a follower without CLUSTER_ACTION gets no records.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, Producer
from kafka.protocol.metadata import MetadataRequest
from tests.integration.helpers import fetch_raw, produce_raw
from tests.support.acl_broker import AclBroker
from tests.support.wire import sasl_plain_wire

from oncelog.records.builder import build_batch

TOPIC_AUTHORIZATION_FAILED = 29


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    broker = AclBroker(tmp_path_factory.mktemp("acl-data")).start()
    admin = broker.admin()
    from confluent_kafka.admin import NewTopic

    for future in admin.create_topics([NewTopic("orders", 2, 1), NewTopic("ords", 1, 1),
                                       NewTopic("secret", 1, 1)]).values():
        future.result(30)
    yield broker
    broker.stop()


@pytest.fixture
def broker(acl_broker):
    acl_broker.revoke_all()
    yield acl_broker
    acl_broker.revoke_all()


def wire(broker: AclBroker, user: str):
    return sasl_plain_wire(broker.bootstrap, user, f"{user}-secret")


def metadata(broker: AclBroker, user: str, topics: list[str] | None, auto_create: bool = False) -> dict:
    with wire(broker, user) as w:
        answer = w.request(MetadataRequest[9](topics=None if topics is None else [(t, []) for t in topics],
                                              allow_auto_topic_creation=auto_create,
                                              include_topic_authorized_operations=True), 9)
    return {t.name: (t.error_code, t.authorized_operations) for t in answer.topics}


def log_end(broker: AclBroker, topic: str, partition: int = 0) -> int:
    with wire(broker, "admin") as w:
        return fetch_raw(w, topic, partition, 0).high_watermark


def test_metadata_hides_what_the_principal_may_not_describe(broker):
    assert "secret" in metadata(broker, "admin", None)
    assert metadata(broker, "alice", None) == {}
    # named: the same answer for a topic that exists and one that does not
    assert metadata(broker, "alice", ["secret", "no-such-topic"]) == {
        "secret": (TOPIC_AUTHORIZATION_FAILED, None), "no-such-topic": (TOPIC_AUTHORIZATION_FAILED, None)}
    broker.grant("alice", "TOPIC", "ord", "READ", pattern="PREFIXED")  # READ implies DESCRIBE
    seen = metadata(broker, "alice", None)
    assert sorted(seen) == ["orders", "ords"]
    read, describe = 3, 8
    assert seen["orders"] == (0, {read, describe})  # the authorized operations Kafka reports for READ
    # describable but missing, auto-creation asked: without CREATE it is refused and nothing is created
    broker.grant("alice", "TOPIC", "fresh", "DESCRIBE")
    assert metadata(broker, "alice", ["fresh"], auto_create=True)["fresh"][0] == TOPIC_AUTHORIZATION_FAILED
    assert metadata(broker, "admin", ["fresh"])["fresh"][0] == 3  # UNKNOWN_TOPIC_OR_PARTITION
    broker.grant("alice", "TOPIC", "fresh", "CREATE")
    assert metadata(broker, "alice", ["fresh"], auto_create=True)["fresh"][0] == 0
    assert metadata(broker, "admin", ["fresh"])["fresh"][0] == 0


def test_produce_needs_write_and_appends_nothing_without_it(broker):
    before = log_end(broker, "orders")
    with wire(broker, "alice") as w:
        part = produce_raw(w, "orders", 0, build_batch([(None, b"x", (), int(time.time() * 1000))]))
        assert part.error_code == TOPIC_AUTHORIZATION_FAILED
        part = produce_raw(w, "no-such-topic", 0, build_batch([(None, b"x", (), int(time.time() * 1000))]))
        assert part.error_code == TOPIC_AUTHORIZATION_FAILED  # not UNKNOWN_TOPIC_OR_PARTITION: no leak
    assert log_end(broker, "orders") == before
    broker.grant("alice", "TOPIC", "orders", "WRITE")
    errors: list = []
    producer = Producer(broker.client("alice", **{"enable.idempotence": False}))
    producer.produce("orders", b"allowed", partition=0, on_delivery=lambda e, m: errors.append(e))
    assert producer.flush(30) == 0 and errors == [None]
    assert log_end(broker, "orders") == before + 1


def test_deny_wins_over_a_prefixed_allow(broker):
    broker.grant("alice", "TOPIC", "ord", "WRITE", pattern="PREFIXED")
    broker.grant("alice", "TOPIC", "orders", "WRITE", permission="DENY")
    with wire(broker, "alice") as w:
        batch = build_batch([(None, b"y", (), int(time.time() * 1000))])
        assert produce_raw(w, "orders", 1, batch).error_code == TOPIC_AUTHORIZATION_FAILED
        assert produce_raw(w, "ords", 0, batch).error_code == 0


def test_librdkafka_producer_sees_topic_authorization_failed(broker):
    broker.grant("alice", "TOPIC", "orders", "DESCRIBE")
    errors: list = []
    producer = Producer(broker.client("alice", **{"enable.idempotence": False, "message.timeout.ms": 10000}))
    producer.produce("orders", b"z", partition=0, on_delivery=lambda e, m: errors.append(e))
    producer.flush(20)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_fetch_needs_read(broker):
    with wire(broker, "admin") as w:
        produce_raw(w, "secret", 0, build_batch([(None, b"s", (), int(time.time() * 1000))]))
    with wire(broker, "bob") as w:
        part = fetch_raw(w, "secret", 0, 0)
        assert part.error_code == TOPIC_AUTHORIZATION_FAILED and not part.records
        assert fetch_raw(w, "no-such-topic", 0, 0).error_code == TOPIC_AUTHORIZATION_FAILED
    broker.grant("bob", "TOPIC", "secret", "READ")
    with wire(broker, "bob") as w:
        part = fetch_raw(w, "secret", 0, 0)
        assert part.error_code == 0 and part.records


def test_a_client_posing_as_a_follower_gets_nothing_without_cluster_action(broker):
    broker.grant("alice", "TOPIC", "secret", "READ")
    with wire(broker, "alice") as w:
        part = fetch_raw(w, "secret", 0, 0, replica_id=1)
        assert part.error_code == TOPIC_AUTHORIZATION_FAILED and not part.records


def test_acls_survive_a_sigkill(broker):
    broker.grant("bob", "TOPIC", "ords", "WRITE")
    broker.process.kill()
    broker.process.start()
    with wire(broker, "bob") as w:
        batch = build_batch([(None, b"k", (), int(time.time() * 1000))])
        assert produce_raw(w, "ords", 0, batch).error_code == 0
        assert produce_raw(w, "orders", 0, batch).error_code == TOPIC_AUTHORIZATION_FAILED
