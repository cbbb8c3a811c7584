"""Error classification and config parsing: the contracts the producer, consumer and admin rely on."""

from __future__ import annotations

import pytest

from oncelog.client.config import ClientConfig, keys_for_role, parse_bootstrap_servers
from oncelog.client.errors import (
    AbortableError,
    FatalError,
    KafkaError,
    NetworkError,
    ProducerFenced,
    RecordError,
    RequestTimedOut,
    RetriableError,
    UnsupportedVersion,
    error_for,
)
from oncelog.errors import ErrorCode as E

# -- errors -----------------------------------------------------------------------------------------


def test_none_is_no_error():
    assert error_for(0) is None


def test_retriable_codes_stay_retriable_even_in_transactions():
    for code in (E.NOT_LEADER_OR_FOLLOWER, E.NOT_COORDINATOR, E.CONCURRENT_TRANSACTIONS, E.UNKNOWN_TOPIC_OR_PARTITION):
        err = error_for(code, transactional=True, coordinator=True)
        assert type(err) is RetriableError and err.retriable and not err.abortable and not err.fatal
        assert err.code == code and err.name == code.name
    assert type(error_for(E.NETWORK_EXCEPTION)) is NetworkError
    assert type(error_for(E.REQUEST_TIMED_OUT)) is RequestTimedOut
    assert isinstance(RequestTimedOut("x"), NetworkError)
    assert RequestTimedOut("x").code == E.REQUEST_TIMED_OUT


@pytest.mark.parametrize("code", [E.PRODUCER_FENCED, E.INVALID_PRODUCER_ID_MAPPING, E.UNSUPPORTED_VERSION,
                                  E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, E.CLUSTER_AUTHORIZATION_FAILED,
                                  E.INVALID_TRANSACTION_TIMEOUT])
def test_always_fatal(code):
    for transactional in (False, True):
        err = error_for(code, transactional=transactional)
        assert isinstance(err, FatalError) and err.fatal and not err.retriable and not err.abortable
    assert isinstance(error_for(E.PRODUCER_FENCED), ProducerFenced)
    assert isinstance(error_for(E.UNSUPPORTED_VERSION), UnsupportedVersion)


def test_stale_epoch_is_abortable_on_produce_and_fenced_on_coordinator_apis():
    on_produce = error_for(E.INVALID_PRODUCER_EPOCH, "transaction timed out", transactional=True)
    assert type(on_produce) is AbortableError and on_produce.message == "transaction timed out"
    on_coordinator = error_for(E.INVALID_PRODUCER_EPOCH, transactional=True, coordinator=True)
    assert isinstance(on_coordinator, ProducerFenced) and on_coordinator.code == E.INVALID_PRODUCER_EPOCH
    assert isinstance(error_for(E.INVALID_TXN_STATE, coordinator=True, transactional=True), FatalError)
    assert isinstance(error_for(E.INVALID_TXN_STATE, transactional=True), AbortableError)


@pytest.mark.parametrize("code", [E.TRANSACTION_ABORTABLE, E.INVALID_RECORD, E.INVALID_TIMESTAMP,
                                  E.OUT_OF_ORDER_SEQUENCE_NUMBER, E.TOPIC_AUTHORIZATION_FAILED,
                                  E.OPERATION_NOT_ATTEMPTED, E.UNKNOWN_MEMBER_ID])
def test_other_codes_abort_a_transaction_and_are_plain_otherwise(code):
    assert type(error_for(code, transactional=True)) is AbortableError
    plain = error_for(code)
    assert type(plain) is KafkaError and not (plain.retriable or plain.abortable or plain.fatal)


def test_messages_and_unknown_codes():
    err = error_for(E.INVALID_RECORD)
    assert err.message == E.INVALID_RECORD.message and "INVALID_RECORD (87)" in str(err)
    unknown = error_for(999, "odd")
    assert unknown.name == "UNKNOWN_CODE_999" and unknown.message == "odd"
    rec = RecordError("Compacted topic cannot accept message without key", E.INVALID_RECORD, batch_index=3)
    assert rec.batch_index == 3 and rec.code == E.INVALID_RECORD
    assert NetworkError("connection reset").code == E.NETWORK_EXCEPTION
    assert KafkaError("client side").code is None and KafkaError("client side").name == "KafkaError"


# -- config -----------------------------------------------------------------------------------------


def test_defaults_per_role():
    p = ClientConfig({"bootstrap.servers": "127.0.0.1:9092"}, "producer")
    assert p["acks"] == -1 and p["enable.idempotence"] is True and p.linger_ms == 5
    assert p["batch.size"] == 1000000 and p["max.in.flight.requests.per.connection"] == 5
    assert p["allow.auto.create.topics"] is True and p["transactional.id"] is None
    assert p.bootstrap_servers == [("127.0.0.1", 9092)] and p.client_id == "oncelog-python"
    c = ClientConfig({"bootstrap.servers": "h1:1,h2"}, "consumer")
    assert c.bootstrap_servers == [("h1", 1), ("h2", 9092)]
    assert c["isolation.level"] == "read_committed" and c["enable.auto.commit"] is True
    assert c["partition.assignment.strategy"] == ["range", "roundrobin"]
    assert c["allow.auto.create.topics"] is False and c["group.id"] is None
    a = ClientConfig({"bootstrap.servers": "h"}, "admin")
    assert set(keys_for_role("admin")) == set(a.as_dict())
    assert "acks" not in a.as_dict()


def test_strings_are_parsed_and_aliases_stored_under_kafka_names():
    p = ClientConfig({"bootstrap.servers": "h:1", "acks": "all", "enable.idempotence": "true",
                      "queue.buffering.max.ms": "20", "compression.codec": "LZ4",
                      "max.in.flight.requests.per.connection": "20"}, "producer")
    assert p["acks"] == -1 and p["linger.ms"] == 20 and p["compression.type"] == "lz4"
    assert p.max_in_flight_requests_per_connection == 20
    assert "linger.ms" in p and "queue.buffering.max.ms" in p and "batch.size" not in p
    c = ClientConfig({"bootstrap.servers": "h", "auto.offset.reset": "smallest",
                      "partition.assignment.strategy": "roundrobin", "enable.auto.commit": "false"}, "consumer")
    assert c["auto.offset.reset"] == "earliest" and c["enable.auto.commit"] is False
    assert c["partition.assignment.strategy"] == ["roundrobin"]


@pytest.mark.parametrize("conf, role, needle", [
    ({"bootstrap.servers": "h", "lnger.ms": 5}, "producer", "lnger.ms"),
    ({"bootstrap.servers": "h", "group.id": "g"}, "producer", "group.id"),
    ({"bootstrap.servers": "h", "acks": "2"}, "producer", "acks"),
    ({"bootstrap.servers": "h", "linger.ms": "soon"}, "producer", "linger.ms"),
    ({"bootstrap.servers": "h", "linger.ms": -1}, "producer", "linger.ms"),
    ({"bootstrap.servers": "h", "compression.type": "brotli"}, "producer", "compression.type"),
    ({"bootstrap.servers": "h", "acks": 1, "enable.idempotence": True}, "producer", "enable.idempotence"),
    ({"bootstrap.servers": "h", "transactional.id": "t", "enable.idempotence": False}, "producer",
     "transactional.id"),
    ({"bootstrap.servers": "h", "heartbeat.interval.ms": 50000}, "consumer", "heartbeat.interval.ms"),
    ({"bootstrap.servers": "h", "isolation.level": "dirty"}, "consumer", "isolation.level"),
    ({"bootstrap.servers": "h", "partition.assignment.strategy": "sticky"}, "consumer", "sticky"),
    ({"bootstrap.servers": "h", "enable.partition.eof": "maybe"}, "consumer", "enable.partition.eof"),
    ({}, "admin", "bootstrap.servers"),
    ({"bootstrap.servers": "h:x"}, "admin", "bootstrap.servers"),
    ({"bootstrap.servers": "h"}, "spark", "role"),
])
def test_mistakes_name_the_key(conf, role, needle):
    with pytest.raises(ValueError, match=needle.replace(".", r"\.")):
        ClientConfig(conf, role)


def test_weaker_acks_turns_default_idempotence_off():
    p = ClientConfig({"bootstrap.servers": "h", "acks": "1"}, "producer")
    assert p["enable.idempotence"] is False


def test_bootstrap_forms():
    assert parse_bootstrap_servers("PLAINTEXT://a:1, [::1]:2,b") == [("a", 1), ("::1", 2), ("b", 9092)]
    assert parse_bootstrap_servers(["a:1"]) == [("a", 1)]


def test_derive_keeps_common_keys_only():
    p = ClientConfig({"bootstrap.servers": "h:1", "client.id": "me", "acks": 1}, "producer")
    a = p.derive("admin")
    assert a.role == "admin" and a.client_id == "me" and a.bootstrap_servers == [("h", 1)]
    with pytest.raises(AttributeError):
        _ = a.acks
