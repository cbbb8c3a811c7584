"""A listener's key store replaced without a restart (issue 23), as Kafka's dynamic listener configs replace it:
`listener.name.<listener>.ssl.keystore.location` (and the other SSL keys Kafka reconfigures on a running listener)
set through IncrementalAlterConfigs on the broker resource, as `kafka-configs --entity-type brokers --entity-name 0
--alter --add-config ...` sends it.

Two certificates from one trustme CA with the same names (Kafka refuses a key store whose certificate changes its
distinguished name or drops a subject alternative name): a raw TLS client reads which one it was served. New
connections get the new one, connections already open keep theirs, a TCP connection opened before the change and
handshaking after it gets the new one; a key store that does not load is refused with INVALID_REQUEST and the reason
and the old one is still served; the change is kept in __oncelog_meta and survives a SIGKILL; DescribeConfigs says
DYNAMIC_BROKER_CONFIG.
"""

from __future__ import annotations

import os
import socket
import ssl
import stat
import struct
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID
from kafka.protocol.admin import DescribeConfigsRequest, IncrementalAlterConfigsRequest
from kafka.protocol.metadata import ApiVersionsRequest
from tests.support.broker import BrokerProcess
from tests.support.kafka import HOST, KafkaUnavailable, TlsMaterial
from tests.support.kafka_tools import kafka_tool
from tests.support.wire import Wire

BROKER, SET, DELETE = 4, 0, 1
INVALID_REQUEST, INVALID_CONFIG = 42, 40
DYNAMIC_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 2, 4, 5
KEYSTORE = "listener.name.ssl.ssl.keystore.location"
CONFIG_COMMAND = "org.apache.kafka.tools.ConfigCommand"  # kafka-configs.sh


class Material:
    """TlsMaterial (certificate one) plus a second broker certificate from the same CA with the same subject and
    names, and a certificate of another name, each as a PEM key store (PKCS#8 key, then the chain)."""

    def __init__(self, directory: Path) -> None:
        self.tls = TlsMaterial(directory)
        first = x509.load_pem_x509_certificate(self.tls.broker_cert_pem.read_bytes())

        def attribute(oid: x509.ObjectIdentifier) -> str:
            return str(first.subject.get_attributes_for_oid(oid)[0].value)

        same = self.tls.ca.issue_cert(HOST, "localhost", common_name="oncelog-test-kafka",
                                      organization_name=attribute(NameOID.ORGANIZATION_NAME),
                                      organization_unit_name=attribute(NameOID.ORGANIZATIONAL_UNIT_NAME))
        other = self.tls.ca.issue_cert(HOST, "localhost", common_name="someone-else")
        self.first = self.tls.broker_keystore_pem
        self.second, self.second_key, self.second_chain = self._keystore(directory, "second", same)
        self.other, _, _ = self._keystore(directory, "other", other)
        self.first_der = _der(self.tls.broker_cert_pem.read_bytes())
        self.second_der = _der(self.second_chain.encode())
        assert self.first_der != self.second_der

    @staticmethod
    def _keystore(directory: Path, name: str, cert) -> tuple[Path, str, str]:
        key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), password=None).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
        chain = b"".join(blob.bytes() for blob in cert.cert_chain_pems).decode()
        path = directory / f"{name}-keystore.pem"
        path.write_text(key + chain)
        return path, key, chain


def _der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificates(pem)[0].public_bytes(serialization.Encoding.DER)


@pytest.fixture
def material(tmp_path) -> Material:
    return Material(tmp_path / "tls")


@pytest.fixture
def broker(tmp_path, material):
    proc = BrokerProcess(tmp_path / "data", {
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
        "ssl.keystore.location": str(material.first),
        "ssl.truststore.location": str(material.tls.ca_pem),
    }).start()
    yield proc
    if proc.alive():
        proc.stop()


class TlsClient:
    """One TLS connection to the SSL listener: which certificate it was served, and Kafka requests over it."""

    def __init__(self, broker: BrokerProcess, material: Material, raw: socket.socket | None = None) -> None:
        context = ssl.create_default_context(cafile=str(material.tls.ca_pem))
        host, port = broker.listener("SSL").rsplit(":", 1)
        raw = raw if raw is not None else socket.create_connection((host, int(port)), timeout=15)
        self.sock = context.wrap_socket(raw, server_hostname=HOST)

    @property
    def certificate(self) -> bytes:
        return self.sock.getpeercert(binary_form=True)

    def api_versions_ok(self) -> bool:
        request = ApiVersionsRequest[0]()
        request.with_header(correlation_id=5, client_id="reload")
        self.sock.sendall(bytes(request.encode(version=0, header=True, framed=True)))
        size = struct.unpack(">i", self._exact(4))[0]
        frame = self._exact(size)
        return struct.unpack_from(">ih", frame) == (5, 0)

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def close(self) -> None:
        self.sock.close()


def served(broker: BrokerProcess, material: Material) -> bytes:
    """The certificate a new TLS connection is served (after a working Kafka request over it)."""
    client = TlsClient(broker, material)
    try:
        assert client.api_versions_ok()
        return client.certificate
    finally:
        client.close()


def alter(broker: BrokerProcess, *changes: tuple[str, int, str | None], name: str = "0",
          validate_only: bool = False) -> tuple[int, str | None]:
    req = IncrementalAlterConfigsRequest[1]
    res = req.AlterConfigsResource
    with Wire(broker.bootstrap) as w:
        answer = w.request(req(resources=[res(resource_type=BROKER, resource_name=name, configs=[
            res.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in changes])],
            validate_only=validate_only), 1)
    (only,) = answer.responses
    return only.error_code, only.error_message


def describe(broker: BrokerProcess, *keys: str) -> dict[str, tuple]:
    """name -> (value, source, read_only, sensitive, [(synonym name, value, source)])."""
    req = DescribeConfigsRequest[4]
    with Wire(broker.bootstrap) as w:
        answer = w.request(req(resources=[req.DescribeConfigsResource(
            resource_type=BROKER, resource_name="0", configuration_keys=list(keys) or None)],
            include_synonyms=True, include_documentation=False), 4)
    (result,) = answer.results
    assert result.error_code == 0, result
    return {c.name: (c.value, c.config_source, c.read_only, c.is_sensitive,
                     [(s.name, s.value, s.source) for s in c.synonyms]) for c in result.configs}


def dynamic_file(broker: BrokerProcess) -> Path:
    return broker.data_dir / "__oncelog_meta" / "dynamic-broker-configs.json"


def no_tracebacks(broker: BrokerProcess) -> None:
    text = broker.log_path.read_text(errors="replace")
    assert "Traceback" not in text, text[text.index("Traceback") - 400:][:3000]


# -- the tests ------------------------------------------------------------------------------------------------------


def test_new_connections_get_the_new_key_store_and_open_ones_keep_theirs(broker, material):
    assert served(broker, material) == material.first_der
    before = TlsClient(broker, material)
    assert before.api_versions_ok() and before.certificate == material.first_der
    host, port = broker.listener("SSL").rsplit(":", 1)
    connected_early = socket.create_connection((host, int(port)), timeout=15)  # TCP only: no ClientHello yet

    assert alter(broker, (KEYSTORE, SET, str(material.second))) == (0, None)

    assert served(broker, material) == material.second_der
    late_handshake = TlsClient(broker, material, connected_early)
    assert late_handshake.certificate == material.second_der  # its ClientHello came after the change
    assert late_handshake.api_versions_ok()
    for _ in range(3):  # the connection opened before keeps its session and keeps being served
        assert before.api_versions_ok()
    assert before.certificate == material.first_der
    before.close()
    late_handshake.close()

    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": broker.listener("SSL"), "security.protocol": "SSL",
                      "ssl.ca.location": str(material.tls.ca_pem)}).list_topics(timeout=20)
    assert md.brokers  # librdkafka verifies the new certificate against the CA and the address

    entries = describe(broker)
    value, source, read_only, sensitive, synonyms = entries[KEYSTORE]
    assert (value, source, read_only, sensitive) == (str(material.second), DYNAMIC_BROKER_CONFIG, False, False)
    assert synonyms == [(KEYSTORE, str(material.second), DYNAMIC_BROKER_CONFIG),
                        ("ssl.keystore.location", str(material.first), STATIC_BROKER_CONFIG),
                        ("ssl.keystore.location", "", DEFAULT_CONFIG)]
    assert entries["ssl.keystore.location"][1:3] == (STATIC_BROKER_CONFIG, True)  # the base key stays static
    no_tracebacks(broker)


def test_pem_texts_and_a_reload_in_place(broker, material):
    # ssl.keystore.key and ssl.keystore.certificate.chain instead of a file (the location set empty over the
    # static one): reported as set, their values never shown
    assert alter(broker, (KEYSTORE, SET, ""), ("listener.name.ssl.ssl.keystore.key", SET, material.second_key),
                 ("listener.name.ssl.ssl.keystore.certificate.chain", SET, material.second_chain)) == (0, None)
    assert served(broker, material) == material.second_der
    entries = describe(broker, "listener.name.ssl.ssl.keystore.key")
    assert entries["listener.name.ssl.ssl.keystore.key"][:4] == (None, DYNAMIC_BROKER_CONFIG, False, True)
    assert material.second_key not in str(entries)
    assert stat.S_IMODE(os.stat(dynamic_file(broker)).st_mode) == 0o600  # it holds the private key

    # back to a file; then the same file rewritten in place and named again: read again, as Kafka reloads it
    path = material.first.parent / "in-place.pem"
    path.write_bytes(material.first.read_bytes())
    assert alter(broker, (KEYSTORE, SET, str(path)), ("listener.name.ssl.ssl.keystore.key", DELETE, None),
                 ("listener.name.ssl.ssl.keystore.certificate.chain", DELETE, None)) == (0, None)
    assert served(broker, material) == material.first_der
    path.write_bytes(material.second.read_bytes())
    assert served(broker, material) == material.first_der  # nothing reads the file until told to
    assert alter(broker, (KEYSTORE, SET, str(path))) == (0, None)
    assert served(broker, material) == material.second_der
    no_tracebacks(broker)


def test_a_key_store_that_does_not_load_is_refused_and_the_old_one_stays(broker, material, tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    mismatched = tmp_path / "mismatched.pem"  # the second key with the first certificate
    mismatched.write_text(material.second_key + material.tls.broker_cert_pem.read_text())
    cases = [
        ((KEYSTORE, SET, str(tmp_path / "missing.pem")), "no such file"),
        ((KEYSTORE, SET, str(garbage)), "cannot load the key and certificate chain"),
        ((KEYSTORE, SET, str(mismatched)), "cannot load the key and certificate chain"),
        ((KEYSTORE, SET, str(material.other)), "Keystore DistinguishedName does not match"),
        (("listener.name.ssl.ssl.keystore.type", SET, "JKS"), "ssl.keystore.type"),
        (("listener.name.ssl.ssl.truststore.location", SET, str(garbage)), "ssl.truststore"),
        (("listener.name.plaintext.ssl.keystore.location", SET, str(material.second)), "without TLS"),
        (("listener.name.nosuch.ssl.keystore.location", SET, str(material.second)), "no listener named NOSUCH"),
    ]
    for change, reason in cases:
        code, message = alter(broker, change)
        assert code == INVALID_REQUEST and reason in message, (change, code, message)
        assert served(broker, material) == material.first_der, change
    # Kafka's refusals before anything is loaded
    code, message = alter(broker, ("ssl.keystore.location", SET, str(material.second)))
    assert code == INVALID_REQUEST and "only per-listener using the listener prefix" in message
    code, message = alter(broker, (KEYSTORE, SET, str(material.second)), name="")
    assert code == INVALID_REQUEST and "default cluster level" in message
    code, message = alter(broker, (KEYSTORE, 2, str(material.second)))  # APPEND
    assert code == INVALID_CONFIG
    code, message = alter(broker, (KEYSTORE, SET, None))
    assert code == INVALID_REQUEST and "Null value" in message
    # validate_only loads and checks it, and changes nothing
    assert alter(broker, (KEYSTORE, SET, str(material.second)), validate_only=True) == (0, None)
    assert served(broker, material) == material.first_der
    assert not dynamic_file(broker).exists()
    assert KEYSTORE not in describe(broker)
    # the other names allowed, as Kafka's ssl.allow.dn.changes: restart with it
    broker.stop()
    broker.settings["listener.name.ssl.ssl.allow.dn.changes"] = "true"
    broker.start()
    assert alter(broker, (KEYSTORE, SET, str(material.other))) == (0, None)
    assert served(broker, material) != material.first_der
    no_tracebacks(broker)


def test_the_change_survives_a_sigkill_and_deleting_it_restores_the_static_key_store(broker, material):
    assert alter(broker, (KEYSTORE, SET, str(material.second))) == (0, None)
    broker.kill()
    broker.start()
    assert served(broker, material) == material.second_der
    assert describe(broker, KEYSTORE)[KEYSTORE][:2] == (str(material.second), DYNAMIC_BROKER_CONFIG)
    assert alter(broker, (KEYSTORE, DELETE, None)) == (0, None)
    assert served(broker, material) == material.first_der
    broker.kill()
    broker.start()
    assert served(broker, material) == material.first_der
    assert KEYSTORE not in describe(broker)


def test_a_dynamic_key_store_that_no_longer_loads_stops_the_start_naming_the_file(broker, material, tmp_path):
    moved = tmp_path / "moved.pem"
    moved.write_bytes(material.second.read_bytes())
    assert alter(broker, (KEYSTORE, SET, str(moved))) == (0, None)
    broker.stop()
    moved.unlink()
    with pytest.raises(RuntimeError, match="exited during startup"):
        broker.start(timeout=15)
    text = broker.log_path.read_text(errors="replace")
    assert "no such file" in text and "dynamic-broker-configs.json" in text


def test_kafka_configs_replaces_and_describes_the_key_store(broker, material):
    entity = ("--bootstrap-server", broker.bootstrap, "--entity-type", "brokers", "--entity-name", "0")
    try:
        done = kafka_tool(CONFIG_COMMAND, *entity, "--alter", "--add-config", f"{KEYSTORE}={material.second}",
                          check=True)
    except KafkaUnavailable as exc:
        pytest.skip(str(exc))
    assert done.lines() == ["Completed updating config for broker 0."]
    assert served(broker, material) == material.second_der
    described = kafka_tool(CONFIG_COMMAND, *entity, "--describe", check=True).lines()
    assert described[0] == "Dynamic configs for broker 0 are:"
    assert described[1].startswith(f"{KEYSTORE}={material.second} sensitive=false "
                                   f"synonyms={{DYNAMIC_BROKER_CONFIG:{KEYSTORE}={material.second}")
    refused = kafka_tool(CONFIG_COMMAND, *entity, "--alter", "--add-config", f"{KEYSTORE}={material.other}")
    assert refused.returncode != 0
    assert "InvalidRequestException" in refused.stdout + refused.stderr
    assert "DistinguishedName" in refused.stdout + refused.stderr
    assert served(broker, material) == material.second_der
    kafka_tool(CONFIG_COMMAND, *entity, "--alter", "--delete-config", KEYSTORE, check=True)
    assert served(broker, material) == material.first_der
