"""The real-Kafka fixture works: confluent-kafka produces and consumes over every listener and mechanism, a wrong
password is refused, and the 3-node cluster elects a new leader when the old one is killed."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.kafka import KafkaCluster


def create_topic(cluster: KafkaCluster, topic: str, partitions: int = 1, replication: int = 1,
                 config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, replication, config=config or {})],
                                  operation_timeout=30, request_timeout=60)
    futures[topic].result(timeout=60)


def produce(conf: dict, topic: str, values: list[bytes]) -> None:
    producer = Producer({**conf, "acks": "all", "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(60) == 0, "records left undelivered"


def consume(conf: dict, topic: str, count: int, timeout: float = 60.0) -> list[bytes]:
    consumer = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg.value())
    finally:
        consumer.close()
    return got


def roundtrip(cluster: KafkaCluster, topic: str, listener: str, **security) -> None:
    create_topic(cluster, topic)
    conf = cluster.client_config(listener, **security)
    values = [f"{listener}-{i}".encode() for i in range(5)]
    produce(conf, topic, values)
    assert consume(conf, topic, len(values)) == values


# -- single node --------------------------------------------------------------------------------------------


def test_plaintext(kafka, topic_name):
    assert kafka.bootstrap == kafka.node(1).bootstrap == kafka.node(1).listener("PLAINTEXT")
    roundtrip(kafka, topic_name, "PLAINTEXT")


def test_ssl(kafka, topic_name):
    roundtrip(kafka, topic_name, "SSL")


def test_ssl_with_client_certificate(kafka, topic_name):
    roundtrip(kafka, topic_name, "SSL", client_cert=True)


def test_ssl_with_encrypted_client_key(kafka, topic_name):
    roundtrip(kafka, topic_name, "SSL", encrypted_key=True)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_sasl_ssl(kafka, topic_name, mechanism):
    roundtrip(kafka, topic_name, "SASL_SSL", mechanism=mechanism)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_sasl_plaintext(kafka, topic_name, mechanism):
    roundtrip(kafka, topic_name, "SASL_PLAINTEXT", mechanism=mechanism)


def test_sasl_ssl_oauthbearer_unsecured_jwt(kafka, topic_name):
    """SASL_SSL also enables OAUTHBEARER with Kafka's unsecured validator (unsigned JWTs)."""
    create_topic(kafka, topic_name)
    conf = {"bootstrap.servers": kafka.bootstrap_for("SASL_SSL"), **kafka.client_security("SSL"),
            "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
            "enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": "principal=alice"}
    produce(conf, topic_name, [b"jwt"])
    assert consume(conf, topic_name, 1) == [b"jwt"]


def test_sasl_plaintext_does_not_enable_oauthbearer(kafka):
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": kafka.bootstrap_for("SASL_PLAINTEXT"),
                         "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                         "enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": "principal=alice",
                         "error_cb": errors.append})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not errors:
        producer.poll(0.5)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors


def test_listeners_are_distinct_loopback_ports(kafka):
    node = kafka.node(1)
    addresses = [node.listener(name) for name in ("PLAINTEXT", "SSL", "SASL_SSL", "SASL_PLAINTEXT",
                                                  "BROKER", "CONTROLLER")]
    assert len(set(addresses)) == len(addresses)
    assert all(address.startswith("127.0.0.1:") for address in addresses)


@pytest.mark.parametrize(("listener", "mechanism"), [("SASL_SSL", "SCRAM-SHA-512"), ("SASL_SSL", "PLAIN"),
                                                     ("SASL_PLAINTEXT", "SCRAM-SHA-256")])
def test_wrong_password_is_an_authentication_error(kafka, listener, mechanism):
    errors: list[KafkaError] = []
    conf = kafka.client_config(listener, mechanism=mechanism, password="not-the-password")
    producer = Producer({**conf, "error_cb": errors.append})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
        producer.poll(0.5)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors


def test_settings_reach_the_broker_reauthentication(kafka_factory, topic_name):
    """A node of its own with KIP-368 re-authentication every 2 s: the broker announces the session lifetime,
    the SCRAM client re-authenticates on the same connection and keeps working."""
    cluster = kafka_factory({"connections.max.reauth.ms": 2000, "transaction.max.timeout.ms": 60000})
    assert "connections.max.reauth.ms=2000" in cluster.node(1).config_path.read_text().splitlines()
    create_topic(cluster, topic_name)
    conf = cluster.client_config("SASL_SSL", mechanism="SCRAM-SHA-256")
    log = _Lines()
    errors: list[KafkaError] = []
    producer = Producer({**conf, "acks": "all", "error_cb": errors.append, "debug": "security",
                         "logger": log.logger})
    for i in range(4):
        producer.produce(topic_name, value=b"%d" % i)
        assert producer.flush(30) == 0
        time.sleep(1.5)     # the session expires between sends: the client must re-authenticate
    assert not errors, errors
    assert any("Received session lifetime 2000 ms" in line for line in log.lines), log.lines[-20:]
    assert any("Auth in state REAUTH" in line for line in log.lines), log.lines[-20:]
    assert consume(conf, topic_name, 4) == [b"0", b"1", b"2", b"3"]


class _Lines(logging.Handler):
    """librdkafka's log lines, kept (a `logger` for confluent-kafka)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.logger = logging.getLogger(f"oncelog.tests.kafka.rdkafka.{id(self)}")
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_restart_keeps_data_and_addresses(kafka, topic_name):
    """restart(clean=True) is SIGTERM (a controlled shutdown), restart() SIGKILL; both come back on the same
    ports with the same data (a killed JVM loses nothing the kernel already has)."""
    create_topic(kafka, topic_name)
    conf = {"bootstrap.servers": kafka.bootstrap}
    node = kafka.node(1)
    addresses = {name: node.listener(name) for name in ("PLAINTEXT", "SSL", "SASL_SSL", "SASL_PLAINTEXT")}
    produce(conf, topic_name, [b"first"])
    pid = node.pid
    assert node.stop() in (0, 143)
    assert not node.alive()
    node.start()
    assert node.alive() and node.pid != pid
    produce(conf, topic_name, [b"second"])
    node.restart()
    assert {name: node.listener(name) for name in addresses} == addresses
    produce(conf, topic_name, [b"third"])
    assert consume(conf, topic_name, 3) == [b"first", b"second", b"third"]


# -- three nodes --------------------------------------------------------------------------------------------


@pytest.mark.kafka_cluster
def test_cluster_elects_a_new_leader_when_the_leader_is_killed(kafka_cluster, topic_name):
    cluster = kafka_cluster
    assert len(cluster.nodes) == 3 and len(cluster.bootstrap.split(",")) == 3
    create_topic(cluster, topic_name, replication=3)
    conf = {"bootstrap.servers": cluster.bootstrap}
    produce(conf, topic_name, [b"a", b"b"])

    leader = cluster.partition_leader(topic_name, 0)
    cluster.node(leader).kill()
    assert not cluster.node(leader).alive()
    new_leader = cluster.partition_leader(topic_name, 0, timeout=60, exclude={leader})
    assert new_leader != leader and cluster.node(new_leader).alive()

    produce(conf, topic_name, [b"c"])   # acks=all with 2 of 3 replicas: min.insync.replicas=2 holds
    cluster.node(leader).start()
    cluster.wait_ready()
    assert consume(conf, topic_name, 3) == [b"a", b"b", b"c"]

    # the restarted node catches up and rejoins the ISR
    admin = AdminClient(conf)
    deadline = time.monotonic() + 60
    isr: list[int] = []
    while time.monotonic() < deadline:
        isr = admin.list_topics(topic_name, timeout=10).topics[topic_name].partitions[0].isrs
        if leader in isr:
            break
        time.sleep(0.5)
    assert sorted(isr) == [1, 2, 3]
