"""oncelog's client on Apache Kafka's secured listeners: TLS, mutual TLS, SASL PLAIN / SCRAM / OAUTHBEARER,
KIP-368 re-authentication, and the failures a user meets first (wrong password, untrusted certificate, a
mechanism the broker does not enable, the wrong protocol for a port), each an immediate error naming its cause.
"""

from __future__ import annotations

import base64
import json
import time

import pytest

from oncelog.client import Admin, Consumer, Producer, TopicPartition
from oncelog.client.errors import AuthenticationError, SslAuthenticationError

ROUND_TRIPS = [
    ("SSL", None),
    ("SASL_SSL", "PLAIN"),
    ("SASL_SSL", "SCRAM-SHA-256"),
    ("SASL_SSL", "SCRAM-SHA-512"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
]


def _conf(cluster, listener: str, mechanism: str | None = None, **kwargs) -> dict:
    if mechanism is None:
        return cluster.client_config(listener, **kwargs)
    return cluster.client_config(listener, mechanism=mechanism, **kwargs)


def _round_trip(conf: dict, topic: str, count: int = 200) -> None:
    """Create a topic, write `count` records idempotently, read them back in a consumer group."""
    with Admin(conf, api_timeout=60) as admin:
        admin.create_topic(topic, 2, 1)
    producer = Producer(conf, **{"linger.ms": 5})
    errors: list = []
    for i in range(count):
        producer.produce(topic, f"v{i}".encode(), key=f"k{i % 7}".encode(),
                         on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert producer.flush(60) == 0
    producer.close()
    assert errors == []
    consumer = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < count and time.monotonic() < deadline:
        got += [m.value() for m in consumer.consume(500, timeout=1.0) if m.error() is None]
    consumer.commit(asynchronous=False)
    committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)
    consumer.close()
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(count))
    assert sum(tp.offset for tp in committed) == count


@pytest.mark.parametrize(("listener", "mechanism"), ROUND_TRIPS, ids=[f"{a}-{b}" for a, b in ROUND_TRIPS])
def test_round_trip_on_secured_listener(kafka, topic_name, listener, mechanism):
    _round_trip(_conf(kafka, listener, mechanism), topic_name)


def test_mutual_tls_with_an_encrypted_client_key(kafka, topic_name):
    conf = kafka.client_config("SSL", encrypted_key=True)
    assert "ssl.key.password" in conf
    _round_trip(conf, topic_name, count=20)


def test_java_spellings_pem_truststore_and_jaas_config(kafka, kafka_tls, topic_name):
    """Spark users bring the Java client's keys: a PEM trust store and sasl.jaas.config."""
    conf = {
        "bootstrap.servers": kafka.bootstrap_for("SASL_SSL"),
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            'username="alice" password="alice-secret";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(kafka_tls.ca_pem),
    }
    _round_trip(conf, topic_name, count=20)


def test_transactions_over_sasl_ssl(kafka, topic_name):
    conf = kafka.client_config("SASL_SSL", mechanism="SCRAM-SHA-512")
    with Admin(conf) as admin:
        admin.create_topic(topic_name, 1, 1)
    producer = Producer({**conf, "transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic_name, b"aborted")
    producer.abort_transaction(60)
    producer.begin_transaction()
    producer.produce(topic_name, b"committed")
    producer.commit_transaction(60)
    producer.close()
    consumer = Consumer({**conf, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        got += [m.value() for m in consumer.consume(10, timeout=1.0) if m.error() is None]
    consumer.close()
    assert got == [b"committed"]


# -- failures: immediate, named, not retried ------------------------------------------------------------


def _fails_fast(conf: dict, error: type, *phrases: str) -> str:
    start = time.monotonic()
    with pytest.raises(error) as info:
        Producer({**conf, "request.timeout.ms": 30000})
    elapsed = time.monotonic() - start
    assert elapsed < 15, f"took {elapsed:.1f} s: the failure must not wait out timeouts or retry"
    text = str(info.value)
    for phrase in phrases:
        assert phrase in text, text
    return text


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_wrong_password_is_an_immediate_authentication_error(kafka, mechanism):
    conf = kafka.client_config("SASL_SSL", mechanism=mechanism, password="not-the-password")
    text = _fails_fast(conf, AuthenticationError, "SASL_AUTHENTICATION_FAILED", mechanism, "'alice'")
    assert "not-the-password" not in text


def test_unknown_user_is_an_authentication_error(kafka):
    conf = kafka.client_config("SASL_PLAINTEXT", mechanism="SCRAM-SHA-256", user="mallory")
    _fails_fast(conf, AuthenticationError, "SASL_AUTHENTICATION_FAILED", "'mallory'")


def test_a_failed_authentication_is_not_retried(kafka, topic_name):
    """The admin client and the consumer fail at once too, and no operation reconnects after the failure."""
    conf = kafka.client_config("SASL_SSL", password="wrong")
    with pytest.raises(AuthenticationError):
        Admin(conf, api_timeout=60)
    consumer_conf = {**conf, "group.id": "g-auth"}
    with pytest.raises(AuthenticationError):
        Consumer(consumer_conf)


def test_untrusted_broker_certificate(kafka, tmp_path):
    import trustme

    other = tmp_path / "other-ca.pem"
    other.write_bytes(trustme.CA().cert_pem.bytes())
    conf = {**kafka.client_config("SSL"), "ssl.ca.location": str(other)}
    _fails_fast(conf, SslAuthenticationError, "certificate is not trusted", "ssl.ca.location")


def test_certificate_verification_can_be_turned_off_explicitly(kafka, tmp_path, topic_name):
    import trustme

    other = tmp_path / "other-ca.pem"
    other.write_bytes(trustme.CA().cert_pem.bytes())
    conf = {**kafka.client_config("SSL"), "ssl.ca.location": str(other),
            "enable.ssl.certificate.verification": "false"}
    _round_trip(conf, topic_name, count=5)


def test_mechanism_the_broker_does_not_enable(kafka):
    conf = {"bootstrap.servers": kafka.bootstrap_for("SASL_PLAINTEXT"), "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token": _unsecured_jwt("alice")}
    _fails_fast(conf, AuthenticationError, "OAUTHBEARER is not enabled", "SCRAM-SHA-512")


def test_plaintext_client_on_a_tls_port(kafka):
    conf = {"bootstrap.servers": kafka.bootstrap_for("SSL")}
    _fails_fast(conf, SslAuthenticationError, "answers with TLS", "security.protocol")


def test_tls_client_on_a_plaintext_port(kafka, kafka_tls):
    conf = {"bootstrap.servers": kafka.bootstrap, "security.protocol": "SSL",
            "ssl.ca.location": str(kafka_tls.ca_pem)}
    start = time.monotonic()
    with pytest.raises(Exception) as info:
        Producer({**conf, "request.timeout.ms": 10000, "socket.connection.setup.timeout.ms": 5000})
    assert time.monotonic() - start < 30
    assert "TLS" in str(info.value), str(info.value)


def test_sasl_client_on_a_listener_without_sasl(kafka):
    conf = {**kafka.client_config("SSL"), "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
            "sasl.username": "alice", "sasl.password": "alice-secret"}
    _fails_fast(conf, AuthenticationError, "SASL")


def test_configuration_mistakes_are_named_at_construction(kafka, kafka_tls, tmp_path):
    base = kafka.client_config("SSL")
    cases = [
        ({**base, "ssl.ca.location": str(tmp_path / "missing.pem")}, "ssl.ca.location: no such file"),
        ({**kafka.client_config("SSL", encrypted_key=True), "ssl.key.password": "wrong"}, "ssl.key.password"),
        ({**base, "security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "GSSAPI is not supported"),
        ({**base, "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "needs sasl.username"),
        ({**base, "ssl.truststore.type": "JKS", "ssl.truststore.location": str(kafka_tls.ca_pem)},
         "PEM trust stores only"),
        ({"bootstrap.servers": kafka.bootstrap, "sasl.username": "alice"}, "security.protocol is PLAINTEXT"),
        ({**base, "security.protocol": "TLS"}, "security.protocol"),
    ]
    for conf, phrase in cases:
        with pytest.raises(ValueError) as info:
            Producer(conf)
        assert phrase in str(info.value), (phrase, str(info.value))


# -- OAUTHBEARER and re-authentication -------------------------------------------------------------------


def _unsecured_jwt(subject: str, lifetime_s: float = 3600) -> str:
    """An unsigned JWT (alg none), which Kafka's default OAUTHBEARER validator accepts: fine for tests."""
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    now = time.time()
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'iat': int(now), 'exp': int(now + lifetime_s)})}."


def test_oauthbearer_static_token(kafka, topic_name):
    conf = {"bootstrap.servers": kafka.bootstrap_for("SASL_SSL"), "security.protocol": "SASL_SSL",
            "ssl.ca.location": kafka.client_security("SSL")["ssl.ca.location"],
            "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token": _unsecured_jwt("alice")}
    _round_trip(conf, topic_name, count=20)


def test_oauthbearer_rejected_token(kafka):
    conf = {"bootstrap.servers": kafka.bootstrap_for("SASL_SSL"), "security.protocol": "SASL_SSL",
            "ssl.ca.location": kafka.client_security("SSL")["ssl.ca.location"],
            "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token": _unsecured_jwt("alice", lifetime_s=-60)}
    _fails_fast(conf, AuthenticationError, "OAUTHBEARER")


@pytest.fixture(scope="module")
def reauth_kafka(kafka_runtime, kafka_tls, tmp_path_factory):
    """A node whose SASL sessions last 4 s (connections.max.reauth.ms): clients must re-authenticate."""
    from tests.kafka.conftest import _cluster

    cluster = _cluster(kafka_runtime, kafka_tls, tmp_path_factory.mktemp("kafka-reauth"),
                       settings={"connections.max.reauth.ms": 4000})
    cluster.start()
    yield cluster
    cluster.stop()


def _produce_for(producer: Producer, topic: str, seconds: float) -> int:
    errors: list = []
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        producer.produce(topic, f"r{sent}".encode(), on_delivery=lambda e, m: errors.append(e) if e else None)
        sent += 1
        producer.poll(0.02)
    assert producer.flush(60) == 0
    assert errors == []
    return sent


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_reauthentication_keeps_the_connection(reauth_kafka, topic_name, mechanism):
    """KIP-368: the broker grants 4 s sessions; a producer working for 14 s re-authenticates on its open
    connection (the broker would close it otherwise) and never reconnects."""
    conf = reauth_kafka.client_config("SASL_SSL", mechanism=mechanism)
    with Admin(conf) as admin:
        admin.create_topic(topic_name, 1, 1)
    producer = Producer(conf)
    cluster = producer._core.cluster
    sent = _produce_for(producer, topic_name, 14.0)
    conns = [c for c in cluster._connections.values() if not c.closed]
    assert conns, "no open connection left"
    assert all(0 < c.session_lifetime_ms <= 4000 for c in conns)
    assert max(c.authentications for c in conns) >= 3, [c.authentications for c in conns]
    assert cluster.stats["connect_failures"] == 0
    connects = cluster.stats["connects"]
    assert _produce_for(producer, topic_name, 5.0) > 0
    assert cluster.stats["connects"] == connects, "a connection was lost and made again"
    producer.close()
    consumer = Consumer({**conf, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    low, high = consumer.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=30)
    consumer.close()
    assert high - low >= sent


def test_reauthentication_asks_the_token_callback_again(reauth_kafka, topic_name):
    calls: list[str | None] = []

    def token(config: str | None) -> tuple[str, float]:
        calls.append(config)
        return _unsecured_jwt("alice", lifetime_s=60), time.time() + 60

    conf = {"bootstrap.servers": reauth_kafka.bootstrap_for("SASL_SSL"), "security.protocol": "SASL_SSL",
            "ssl.ca.location": reauth_kafka.client_security("SSL")["ssl.ca.location"],
            "sasl.mechanism": "OAUTHBEARER", "oauth_cb": token, "sasl.oauthbearer.config": "scope=test"}
    producer = Producer(conf)
    connects = producer._core.cluster.stats["connects"]
    _produce_for(producer, topic_name, 10.0)
    assert producer._core.cluster.stats["connects"] == connects
    producer.close()
    assert len(calls) >= connects + 2, calls  # one per connection, then one per re-authentication
    assert set(calls) == {"scope=test"}
