"""A 3-broker cluster whose brokers talk to each other over a SASL_SSL listener (docs/security.md §6).

Each broker has three listeners: HARNESS (PLAINTEXT, for the test harness's own Metadata calls), CLIENT
(SASL_SSL PLAIN, for applications) and BROKER (SASL_SSL PLAIN, inter.broker.listener.name: replica fetchers,
transaction markers and forwarded requests authenticate there with the broker's own credential). Checked: every
broker registers all three endpoints and Metadata answers each client with the addresses of the listener it
came in on; an RF 3 topic replicates with its whole ISR; a transactional, idempotent pipeline over CLIENT runs
exactly once through a SIGKILL of a partition leader; the BROKER listener refuses a wrong password.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.cluster_processes import partitions, wait_for
from tests.support.kafka import TlsMaterial

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" '
        'password="broker-secret" user_broker="broker-secret" user_alice="alice-secret";')


def secured(tls: TlsMaterial) -> dict[str, str]:
    return {
        "listeners": "HARNESS://127.0.0.1:0,CLIENT://127.0.0.1:0,BROKER://127.0.0.1:0",
        "listener.security.protocol.map": "HARNESS:PLAINTEXT,CLIENT:SASL_SSL,BROKER:SASL_SSL",
        "inter.broker.listener.name": "BROKER",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.client.plain.sasl.jaas.config": JAAS,
        "listener.name.broker.plain.sasl.jaas.config": JAAS,
        "ssl.keystore.location": str(tls.broker_keystore_pem),
        "ssl.truststore.location": str(tls.ca_pem),
    }


@pytest.fixture
def tls(tmp_path) -> TlsMaterial:
    return TlsMaterial(tmp_path / "tls")


def client(c, tls: TlsMaterial, listener: str = "CLIENT", user: str = "alice", password: str = "alice-secret",
           **extra) -> dict:
    return {"bootstrap.servers": ",".join(b.listener(listener) for b in c.brokers.values()),
            "security.protocol": "SASL_SSL", "ssl.ca.location": str(tls.ca_pem), "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": password, **extra}


def test_replication_and_a_transactional_pipeline_over_sasl_ssl(cluster_factory, tls):
    c = cluster_factory(3, **secured(tls))
    # Metadata over CLIENT names every broker at its CLIENT address; over HARNESS at its HARNESS address.
    md = AdminClient(client(c, tls)).list_topics(timeout=30)
    assert sorted((b.id, f"{b.host}:{b.port}") for b in md.brokers.values()) == sorted(
        (n, b.listener("CLIENT")) for n, b in c.brokers.items())
    assert sorted(b.port for b in c.metadata(via=1, topics=None).brokers) == sorted(
        b.port for b in c.brokers.values())

    admin = AdminClient(client(c, tls))
    admin.create_topics([NewTopic("secure", 2, 3, config={"min.insync.replicas": "2"})],
                        operation_timeout=30)["secure"].result(60)
    # replicas fetch from their leaders over BROKER (SASL_SSL): the whole ISR joins
    wait_for(lambda: all(sorted(p.isr_nodes) == [1, 2, 3] for p in partitions(c, "secure").values())
             and len(partitions(c, "secure")) == 2, "the ISR of every partition to be whole", 60)

    # The group joins first: __consumer_offsets (RF 3) is created while three brokers live, as in Kafka
    consumer = Consumer(client(c, tls, **{"group.id": "secure-readers", "auto.offset.reset": "earliest",
                                          "isolation.level": "read_committed", "enable.auto.commit": False}))
    consumer.subscribe(["secure"])
    wait_for(lambda: consumer.consume(1, timeout=0.5) is not None and consumer.assignment(), "an assignment", 60)
    producer = Producer(client(c, tls, **{"transactional.id": "secure-tx", "enable.idempotence": True,
                                          "delivery.timeout.ms": 60000}))
    producer.init_transactions(60)
    sent = 0
    for round_ in range(2):
        producer.begin_transaction()
        for i in range(50):
            producer.produce("secure", f"{round_}-{i}".encode(), partition=i % 2)
        producer.commit_transaction(60)
        sent += 50
        if round_ == 0:  # a partition leader dies between the transactions
            dead = partitions(c, "secure")[0].leader_id
            c.kill(dead)
            other = next(n for n in c.brokers if n != dead)
            wait_for(lambda dead=dead, other=other: partitions(c, "secure", via=other)[0].leader_id not in (dead, -1),
                     "a new leader", 60)
    producer.flush(30)

    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < sent and time.monotonic() < deadline:
        got += [m.value() for m in consumer.consume(100, timeout=1.0) if m.error() is None]
    consumer.commit(asynchronous=False)
    committed = consumer.committed([TopicPartition("secure", 0), TopicPartition("secure", 1)], timeout=30)
    consumer.close()
    assert sorted(got) == sorted(f"{r}-{i}".encode() for r in range(2) for i in range(50))
    assert all(tp.offset > 0 for tp in committed)


def test_the_broker_listener_refuses_a_wrong_password(cluster_factory, tls):
    c = cluster_factory(3, **secured(tls))
    errors: list = []
    producer = Producer({**client(c, tls, "BROKER", user="broker", password="guess"), "error_cb": errors.append,
                         "message.timeout.ms": 3000})
    producer.produce("anything", b"x")
    producer.flush(10)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
