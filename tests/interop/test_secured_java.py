"""The Java client (kafka-clients 4.4.0) against oncelog's secured listeners (issue 23, docs/security.md).

The client's security settings are what a Java application would write in its properties, PEM files as Kafka
takes them: mutual TLS on the MTLS listener (`ssl.keystore.type=PEM` with `ssl.keystore.location` a file holding
the PKCS#8 key and the certificate chain; `ssl.truststore.type=PEM` with the CA), and SASL_SSL with PLAIN,
SCRAM-SHA-256 and SCRAM-SHA-512 (`sasl.jaas.config` of Kafka's login modules). Over each,
`oncelog.interop.SecuredInterop roundtrip` (tests/interop/java) creates a topic, writes a few hundred records with
the idempotent producer (acks=all), reads them back in a consumer group and commits; a wrong password fails every
client with Kafka's SaslAuthenticationException, and a client without a certificate on the MTLS listener fails at
once with SslAuthenticationException, from the TLS alert the broker sends (broker/tls_accept.py). The jar is the
one tests/interop/test_java_client.py builds (its `java_jar` fixture), so without java or Maven this module skips
with the same reasons.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.interop.test_java_client import (
    JVM_FLAGS,
    KAFKA_CLIENTS_VERSION,
    JavaRun,
    LogWatch,
    java_jar,  # noqa: F401 - the fixture that builds the jar
)
from tests.support.kafka import TlsMaterial
from tests.support.secured_broker import MECHANISMS, SecuredBroker

# Out of make test's time budget (make interop-test runs it); its short sibling stays in make test.
pytestmark = pytest.mark.interop_slow

MAIN = "oncelog.interop.SecuredInterop"
SASL_AUTH_FAILED = "org.apache.kafka.common.errors.SaslAuthenticationException"
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
COUNT, PARTITIONS = 300, 3


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsMaterial:
    return TlsMaterial(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def jar(request) -> Path:
    """tests/interop/test_java_client.py's jar (built once per session; a skip with the reason without Java)."""
    return request.getfixturevalue("java_jar")


@pytest.fixture(scope="module")
def broker(tmp_path_factory, tls, jar):  # the jar first: no broker started for a module that skips
    b = SecuredBroker(tmp_path_factory.mktemp("secured"), tls).start()
    yield b
    b.stop()


@pytest.fixture
def clean_log(broker):
    """The broker log written during the test holds no ERROR, CRITICAL or traceback."""
    watch = LogWatch(broker.process)
    yield
    watch.check()


def java_properties(path: Path, settings: dict[str, str]) -> Path:
    path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    return path


def truststore(tls: TlsMaterial) -> dict[str, str]:
    return {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(tls.ca_pem)}


def mtls_config(tls: TlsMaterial, directory: Path) -> dict[str, str]:
    """Kafka's PEM key store: one file with the PKCS#8 private key followed by the certificate chain. (Not the
    encrypted key: cryptography encrypts PKCS#8 with PBES2, which Java 17's SecretKeyFactory cannot open,
    "PBES2 SecretKeyFactory not available", a limit of the JDK, not of the broker.)"""
    keystore = directory / "client-keystore.pem"
    keystore.write_bytes(tls.client_key_pem.read_bytes() + tls.client_cert_pem.read_bytes())
    return {"security.protocol": "SSL", **truststore(tls), "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore)}


def sasl_ssl_config(tls: TlsMaterial, mechanism: str, user: str = "alice",
                    password: str = "alice-secret") -> dict[str, str]:
    jaas = f'{LOGIN_MODULES[mechanism]} required username="{user}" password="{password}";'
    return {"security.protocol": "SASL_SSL", **truststore(tls), "sasl.mechanism": mechanism,
            "sasl.jaas.config": jaas}


def run_secured(jar: Path, command: str, bootstrap: str, config: Path, *, deadline_s: int = 90,
                **opts: Any) -> JavaRun:
    argv = [shutil.which("java") or "java", *JVM_FLAGS, "-cp", str(jar), MAIN, command, "--bootstrap", bootstrap,
            "--config", str(config), "--deadline-s", str(deadline_s)]
    for key, val in opts.items():
        argv += [f"--{key.replace('_', '-')}", str(val)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s + 30)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"java {MAIN} {command} did not exit in {deadline_s + 30} s (its watchdog failed too):\n"
                    f"{(exc.stderr or b'')[-3000:]!r}", pytrace=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        data = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(f"java {MAIN} {command} exited {proc.returncode} without a JSON result:\n"
                    f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}", pytrace=False)
    run = JavaRun(data, proc.stderr, argv)
    assert proc.returncode == 0 and "watchdog" not in data and "fatal" not in data, (
        f"java {MAIN} {command} exit {proc.returncode}: "
        f"{json.dumps({k: data.get(k) for k in ('watchdog', 'fatal')})}\nsteps: {run.reactions()}\n{run.context()}")
    assert data["client_version"] == KAFKA_CLIENTS_VERSION
    return run


def check_roundtrip(run: JavaRun, topic: str, bootstrap: str) -> None:
    """Every step ran; the cluster is described with the address of the listener the client came in on; offsets
    are dense per partition; one idempotent producer per partition at epoch 0 with every sequence accepted; the
    group read exactly what was acknowledged and committed the ends."""
    run.all_ok()
    host, port = bootstrap.rsplit(":", 1)
    cluster = run.value("describe_cluster")
    assert [(n["host"], n["port"]) for n in cluster["nodes"]] == [(host, int(port))], cluster
    assert (cluster["controller"]["host"], cluster["controller"]["port"]) == (host, int(port)), cluster

    produced = run["produced"]
    assert len(produced) == COUNT
    per_partition = COUNT // PARTITIONS
    for p in range(PARTITIONS):
        assert [off for i, part, off in produced if part == p] == list(range(per_partition)), p
    metrics = run.value("produce")
    assert metrics["record-error-total"] == 0 and metrics["record-retry-total"] == 0, metrics

    producers = run.value("describe_producers")
    assert sorted(producers) == [f"{topic}-{p}" for p in range(PARTITIONS)]
    ids = set()
    for p in range(PARTITIONS):
        (state,) = producers[f"{topic}-{p}"]
        assert state["producer_id"] >= 0 and state["producer_epoch"] == 0, state
        assert state["last_sequence"] == per_partition - 1 and state["current_txn_start_offset"] is None, state
        ids.add(state["producer_id"])
    assert len(ids) == 1, producers

    consumed = run.value("consume")
    assert consumed["assignment"] == sorted(f"{topic}-{p}" for p in range(PARTITIONS))
    expected = sorted((part, off, f"k-{i}", f"v-{i}-" + "x" * (i % 50)) for i, part, off in produced)
    assert sorted(map(tuple, consumed["records"])) == expected
    assert run.value("committed") == {f"{topic}-{p}": per_partition for p in range(PARTITIONS)}


def test_java_client_over_mutual_tls(jar, broker, tls, tmp_path, topic_name, clean_log):
    config = java_properties(tmp_path / "mtls.properties", mtls_config(tls, tmp_path))
    bootstrap = broker.bootstrap_for("MTLS")
    run = run_secured(jar, "roundtrip", bootstrap, config, topic=topic_name, count=COUNT,
                      partitions=PARTITIONS, group=f"{topic_name}-g")
    check_roundtrip(run, topic_name, bootstrap)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_java_client_over_sasl_ssl(jar, broker, tls, tmp_path, topic_name, clean_log, mechanism):
    config = java_properties(tmp_path / "sasl.properties", sasl_ssl_config(tls, mechanism))
    bootstrap = broker.bootstrap_for("SASL_SSL")
    run = run_secured(jar, "roundtrip", bootstrap, config, topic=topic_name, count=COUNT,
                      partitions=PARTITIONS, group=f"{topic_name}-g")
    check_roundtrip(run, topic_name, bootstrap)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_java_client_wrong_password_is_sasl_authentication_exception(jar, broker, tls, tmp_path, topic_name,
                                                                     clean_log, mechanism):
    config = java_properties(tmp_path / "wrong.properties",
                             sasl_ssl_config(tls, mechanism, password="not-alice-secret"))
    run = run_secured(jar, "auth-fail", broker.bootstrap_for("SASL_SSL"), config, topic=topic_name)
    for step in ("admin_describe_cluster", "producer_send", "consumer_poll"):
        error = run.error(step)
        assert SASL_AUTH_FAILED in error["chain"], run.explain(step)
        sasl = next(c for c in [error, *error["causes"]] if c["class"] == SASL_AUTH_FAILED)
        assert "Authentication failed" in (sasl["message"] or ""), run.explain(step)
    # the topic was never created: nothing got past authentication
    with_admin = broker.client_config("PLAINTEXT")
    from confluent_kafka.admin import AdminClient

    assert topic_name not in AdminClient(with_admin).list_topics(timeout=10).topics


SSL_AUTH_FAILED = "org.apache.kafka.common.errors.SslAuthenticationException"


def test_java_client_without_a_certificate_on_mtls_is_ssl_authentication_exception(jar, broker, tls, tmp_path,
                                                                                  topic_name, clean_log):
    config = java_properties(tmp_path / "no-cert.properties", {"security.protocol": "SSL", **truststore(tls)})
    run = run_secured(jar, "auth-fail", broker.bootstrap_for("MTLS"), config, topic=topic_name,
                      timeout_ms=5000)
    for step in ("admin_describe_cluster", "producer_send", "consumer_poll"):
        assert SSL_AUTH_FAILED in run.error(step)["chain"], run.explain(step)
