"""Listeners, TLS and SASL on one oncelog broker (docs/security.md §3-4), with librdkafka, kafka-python and the
oncelog client, and raw requests where the exact answer matters.

One broker serves the module (tests/support/secured_broker.py): PLAINTEXT, SSL (client certificates requested),
SASL_SSL and SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), MTLS (client certificates required).
"""

from __future__ import annotations

import socket
import ssl
import struct
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient
from kafka.protocol.admin import DescribeUserScramCredentialsRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest
from tests.integration.helpers import scrape
from tests.support.kafka import TlsMaterial
from tests.support.secured_broker import SecuredBroker
from tests.support.wire import Wire

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsMaterial:
    return TlsMaterial(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory, tls):
    b = SecuredBroker(tmp_path_factory.mktemp("secured"), tls,
                      {"oncelog.authentication.timeout.ms": 3000,
                       "connection.failed.authentication.delay.ms": 300}).start()
    yield b
    b.stop()


def round_trip(conf: dict, topic: str, count: int = 50) -> None:
    producer = Producer({**conf, "enable.idempotence": True})
    errors: list = []
    for i in range(count):
        producer.produce(topic, f"v{i}".encode(), on_delivery=lambda e, m: errors.append(e) if e else None)
    assert producer.flush(30) == 0 and errors == []
    consumer = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        got += [m.value() for m in consumer.consume(100, timeout=0.5) if m.error() is None]
    consumer.close()
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(count))


CASES = [("SSL", None), ("MTLS", None), ("SASL_SSL", "PLAIN"), ("SASL_SSL", "SCRAM-SHA-256"),
         ("SASL_SSL", "SCRAM-SHA-512"), ("SASL_PLAINTEXT", "PLAIN"), ("SASL_PLAINTEXT", "SCRAM-SHA-512")]


@pytest.mark.parametrize(("listener", "mechanism"), CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_librdkafka_round_trip_with_idempotence_and_a_group(broker, listener, mechanism):
    conf = broker.client_config(listener, **({"mechanism": mechanism} if mechanism else {}))
    round_trip(conf, f"rt-{listener}-{mechanism}".lower().replace("_", "-"))


def test_metadata_answers_with_the_address_of_the_listener_asked(broker):
    for name in ("PLAINTEXT", "SASL_PLAINTEXT"):
        conf = broker.client_config(name, **({"mechanism": "PLAIN"} if name.startswith("SASL") else {}))
        md = AdminClient(conf).list_topics(timeout=20)
        (only,) = md.brokers.values()
        assert f"{only.host}:{only.port}" == broker.bootstrap_for(name)
    with Wire(broker.bootstrap_for("PLAINTEXT")) as w:
        answer = w.request(MetadataRequest[9](topics=[], allow_auto_topic_creation=False), 9)
        assert [(b.host, b.port) for b in answer.brokers] == [("127.0.0.1", int(broker.bootstrap.split(":")[1]))]


def test_wrong_passwords_and_unknown_users_fail_fast_with_kafkas_message(broker):
    for mechanism, expected in (("PLAIN", "Invalid username or password"),
                                ("SCRAM-SHA-256", "invalid credentials with SASL mechanism SCRAM-SHA-256")):
        for user, password in (("alice", "wrong"), ("mallory", "alice-secret")):
            errors = refused(broker.client_config("SASL_SSL", mechanism=mechanism, user=user, password=password))
            auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
            assert auth and expected in auth[0].str(), errors
    round_trip(broker.client_config("SASL_SSL", mechanism="PLAIN"), "after-failures", 5)  # broker unaffected


def refused(conf: dict) -> list[KafkaError]:
    """Produce one record that must not arrive: its delivery error, and what error_cb saw meanwhile."""
    errors: list[KafkaError] = []
    delivered: list[KafkaError | None] = []
    producer = Producer({**conf, "error_cb": errors.append, "message.timeout.ms": 1500})
    producer.produce("never", b"x", on_delivery=lambda e, m: delivered.append(e))
    producer.flush(10)
    assert len(delivered) == 1 and delivered[0] is not None and delivered[0].code() == KafkaError._MSG_TIMED_OUT
    return errors


def test_untrusted_or_missing_client_certificate_is_refused_on_mtls(broker, tmp_path):
    assert refused(broker.client_config("MTLS", client_cert=False))
    other = TlsMaterial(tmp_path / "other-ca")  # a certificate from a CA the broker does not trust
    assert refused({**broker.client_config("MTLS"), "ssl.certificate.location": str(other.client_cert_pem),
                    "ssl.key.location": str(other.client_key_pem)})
    round_trip(broker.client_config("MTLS"), "mtls-after-refusals", 5)


def test_a_refused_mtls_handshake_gets_its_alert_and_is_logged(broker, tls):
    """A client without a certificate on the mTLS listener learns why from the TLS alert (as Kafka's listener
    sends it), rather than from a bare EOF; the broker logs the failed authentication as Kafka's selector does."""
    host, port = broker.bootstrap_for("MTLS").rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(tls.ca_pem))
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as conn:
        # TLS 1.3: the client's half of the handshake ends before the server checks for a certificate, so the
        # refusal arrives on the first read
        with pytest.raises(ssl.SSLError) as refused:
            conn.sendall(struct.pack(">i", 12) + b"\x00\x12\x00\x03" + b"\x00" * 8)
            conn.recv(1)
    assert "CERTIFICATE_REQUIRED" in str(refused.value).upper() or "ALERT" in str(refused.value).upper(), refused
    log = broker.process.log_path
    deadline = time.monotonic() + 10
    while "Failed authentication with 127.0.0.1" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, broker.process.log_tail()
        time.sleep(0.1)
    assert "SSL handshake failed" in log.read_text(errors="replace")


def test_kafka_python_over_ssl_and_scram(broker, tls):
    from kafka import KafkaConsumer, KafkaProducer

    common = {"bootstrap_servers": broker.bootstrap_for("SASL_SSL"), "security_protocol": "SASL_SSL",
              "ssl_cafile": str(tls.ca_pem), "sasl_mechanism": "SCRAM-SHA-512",
              "sasl_plain_username": "alice", "sasl_plain_password": "alice-secret"}
    producer = KafkaProducer(**common)
    for i in range(10):
        producer.send("kp-scram", f"m{i}".encode())
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer("kp-scram", **{**common, "bootstrap_servers": broker.bootstrap_for("SSL"),
                                            "security_protocol": "SSL"},
                             auto_offset_reset="earliest", consumer_timeout_ms=30000)
    got = []
    for message in consumer:  # stops at the tenth record (or after 30 s without one)
        got.append(message.value)
        if len(got) == 10:
            break
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(10))
    consumer.close()


def test_oncelog_client_over_sasl_ssl(broker):
    from oncelog.client import Consumer as OConsumer
    from oncelog.client import Producer as OProducer

    conf = broker.client_config("SASL_SSL", mechanism="SCRAM-SHA-256")
    producer = OProducer({**conf, "transactional.id": "tx-oncelog-sasl"})
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(5):
        producer.produce("oc-sasl", f"t{i}".encode())
    producer.commit_transaction()
    producer.close()
    consumer = OConsumer({**conf, "group.id": "oc-sasl", "auto.offset.reset": "earliest",
                          "isolation.level": "read_committed"})
    consumer.subscribe(["oc-sasl"])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        got += [m.value() for m in consumer.consume(10, timeout=0.5) if m.error() is None]
    consumer.close()
    assert got == [f"t{i}".encode() for i in range(5)]


def test_scram_credentials_are_described_never_shown_and_survive_a_sigkill(broker):
    def described() -> dict:
        with Wire(broker.bootstrap) as w:
            answer = w.request(DescribeUserScramCredentialsRequest[0](users=None), 0)
        return {r.user: sorted((c.mechanism, c.iterations) for c in r.credential_infos) for r in answer.results}

    assert described() == {"alice": [(1, 4096), (2, 4096)]}
    stored = (broker.process.data_dir / "__oncelog_meta" / "scram-credentials.json").read_text()
    assert "alice-secret" not in stored
    broker.process.kill()
    broker.process.start()
    assert described() == {"alice": [(1, 4096), (2, 4096)]}
    round_trip(broker.client_config("SASL_PLAINTEXT", mechanism="SCRAM-SHA-256"), "after-kill", 5)


# -- the exact answers on the wire ---------------------------------------------------------------------------


def _closed(w: Wire, timeout: float = 10.0) -> bool:
    w.sock.settimeout(timeout)
    try:
        return w.sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_only_api_versions_and_sasl_before_authentication(broker):
    with Wire(broker.bootstrap_for("SASL_PLAINTEXT")) as w:
        versions = w.request(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3)
        keys = {k.api_key for k in versions.api_keys}
        assert {SASL_HANDSHAKE, SASL_AUTHENTICATE} <= keys
        w.request(MetadataRequest[9](topics=[], allow_auto_topic_creation=False), 9, expect_response=False)
        assert _closed(w)  # no answer: the connection ends (Kafka's IllegalSaslStateException)
    with Wire(broker.bootstrap) as w:  # PLAINTEXT does not advertise them
        versions = w.request(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3)
        assert not {SASL_HANDSHAKE, SASL_AUTHENTICATE} & {k.api_key for k in versions.api_keys}


def test_unsupported_mechanism_gets_33_with_the_list_then_close(broker):
    with Wire(broker.bootstrap_for("SASL_PLAINTEXT")) as w:
        answer = w.request(SaslHandshakeRequest[1](mechanism="GSSAPI"), 1)
        assert answer.error_code == 33
        assert sorted(answer.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        assert _closed(w)


def test_authenticate_before_handshake_and_plain_round_trip_on_the_wire(broker):
    with Wire(broker.bootstrap_for("SASL_PLAINTEXT")) as w:
        answer = w.request(SaslAuthenticateRequest[1](auth_bytes=b"\0alice\0alice-secret"), 1)
        assert answer.error_code == 34  # ILLEGAL_SASL_STATE
        assert _closed(w)
    with Wire(broker.bootstrap_for("SASL_PLAINTEXT")) as w:
        assert w.request(SaslHandshakeRequest[1](mechanism="PLAIN"), 1).error_code == 0
        answer = w.request(SaslAuthenticateRequest[2](auth_bytes=b"\0alice\0alice-secret"), 2)
        assert (answer.error_code, answer.session_lifetime_ms) == (0, 0)
        md = w.request(MetadataRequest[9](topics=[], allow_auto_topic_creation=False), 9)
        assert md.brokers
    with Wire(broker.bootstrap_for("SASL_PLAINTEXT")) as w:
        assert w.request(SaslHandshakeRequest[1](mechanism="PLAIN"), 1).error_code == 0
        started = time.monotonic()
        answer = w.request(SaslAuthenticateRequest[1](auth_bytes=b"\0alice\0nope"), 1)
        assert time.monotonic() - started >= 0.25  # connection.failed.authentication.delay.ms
        assert (answer.error_code, answer.error_message) == (
            58, "Authentication failed: Invalid username or password")
        assert _closed(w)


def test_oversized_and_malformed_tokens_close_cleanly(broker):
    with Wire(broker.bootstrap_for("SASL_PLAINTEXT")) as w:
        assert w.request(SaslHandshakeRequest[1](mechanism="SCRAM-SHA-256"), 1).error_code == 0
        answer = w.request(SaslAuthenticateRequest[1](auth_bytes=b"\xff\xfe garbage"), 1)
        assert answer.error_code == 58
        assert _closed(w)
    with Wire(broker.bootstrap_for("SASL_PLAINTEXT")) as w:
        # Before authentication a frame larger than sasl.server.max.receive.size (512 KiB) is not read at all:
        # the connection ends without an answer, as Kafka's SaslServerAuthenticator ends it
        assert w.request(SaslHandshakeRequest[1](mechanism="PLAIN"), 1).error_code == 0
        w.request(SaslAuthenticateRequest[1](auth_bytes=b"x" * 600_000), 1, expect_response=False)
        assert _closed(w)


def test_a_handshake_that_never_finishes_is_dropped(broker):
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", int(broker.bootstrap_for("SASL_PLAINTEXT").split(":")[1]))) as s:
        s.settimeout(20)
        assert s.recv(1) == b""  # nothing sent: closed after oncelog.authentication.timeout.ms
    assert 2.5 < time.monotonic() - started < 15
    with socket.create_connection(("127.0.0.1", int(broker.bootstrap_for("SSL").split(":")[1]))) as s:
        s.settimeout(20)
        s.sendall(b"\x16\x03\x01")  # the start of a TLS record, never finished
        assert s.recv(1) == b""


def test_plaintext_on_a_tls_port_and_tls_on_a_plaintext_port(broker, tls):
    with Wire(broker.bootstrap_for("SSL")) as w:
        w.send_raw(struct.pack(">i", 12) + b"\x00\x12\x00\x03" + b"\x00" * 8)
        assert _closed(w)
    context = ssl.create_default_context(cafile=str(tls.ca_pem))
    with socket.create_connection(("127.0.0.1", int(broker.bootstrap.split(":")[1]))) as raw:
        raw.settimeout(10)
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            context.wrap_socket(raw, server_hostname="127.0.0.1")
    round_trip(broker.client_config("SSL"), "after-garbage", 5)


def test_reauthentication_keeps_a_long_lived_connection_and_an_expired_one_is_closed(tmp_path, tls):
    """KIP-368: with connections.max.reauth.ms the session lifetime is announced; librdkafka re-authenticates
    on the same connection and keeps producing; a client that does not is closed at its next request."""
    b = SecuredBroker(tmp_path, tls, {"connections.max.reauth.ms": 1500}, metrics=True).start()
    try:
        conf = b.client_config("SASL_SSL", mechanism="SCRAM-SHA-256")
        errors: list = []
        producer = Producer({**conf, "error_cb": errors.append, "linger.ms": 5})
        delivered: list = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            producer.produce("reauth", b"r", on_delivery=lambda e, m: delivered.append(e))
            producer.poll(0.05)
        assert producer.flush(20) == 0
        assert delivered and all(e is None for e in delivered) and errors == []
        log = b.process.log_path.read_text()
        assert "SASL session expired" not in log
        counts = scrape(b.process.metrics_port)
        reauth = counts[("oncelog_successful_reauthentication_total",
                         (("listener", "SASL_SSL"), ("mechanism", "SCRAM-SHA-256")))]
        assert reauth >= 2  # about every 1.5 s for 5 s, on the connections librdkafka keeps open
        with Wire(b.bootstrap_for("SASL_PLAINTEXT")) as w:
            assert w.request(SaslHandshakeRequest[1](mechanism="PLAIN"), 1).error_code == 0
            answer = w.request(SaslAuthenticateRequest[1](auth_bytes=b"\0alice\0alice-secret"), 1)
            assert (answer.error_code, answer.session_lifetime_ms) == (0, 1500)
            w.request(MetadataRequest[9](topics=[], allow_auto_topic_creation=False), 9)
            time.sleep(2.0)
            w.request(MetadataRequest[9](topics=[], allow_auto_topic_creation=False), 9, expect_response=False)
            assert _closed(w)
    finally:
        b.stop()


def test_large_fetches_over_tls_arrive_whole(broker):
    """Fetch answers above 64 KiB over TLS are read from the segment files in chunks (not through asyncio's
    sendfile fallback): every record arrives, in order, byte for byte."""
    conf = broker.client_config("SSL")
    producer = Producer({**conf, "linger.ms": 20, "batch.size": 262144})
    values = [(b"%06d" % i) * 170 for i in range(3000)]  # about 1 KiB each, 3 MB in all
    for value in values:
        producer.produce("tls-large", value, partition=0)
    assert producer.flush(60) == 0
    consumer = Consumer({**conf, "group.id": "tls-large", "auto.offset.reset": "earliest",
                         "fetch.max.bytes": 4194304, "max.partition.fetch.bytes": 4194304})
    consumer.subscribe(["tls-large"])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < len(values) and time.monotonic() < deadline:
        got += [m.value() for m in consumer.consume(1000, timeout=0.5) if m.error() is None]
    consumer.close()
    assert got == values
