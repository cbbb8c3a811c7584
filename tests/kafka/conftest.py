"""Fixtures for tests of oncelog's client against real Apache Kafka 4.4.0 (KRaft, on loopback).

    kafka            session: one node (a KafkaCluster of 1): .bootstrap, .bootstrap_for(listener),
                     .client_config(listener, ...), .node(1).kill()/restart()/stop()/start()
    kafka_cluster    session, started only when a test asks for it: three nodes, replication factor 3
    kafka_tls        session: the TlsMaterial (trustme CA, broker and client certificates) both use
    kafka_factory    per test: more clusters with settings of their own (e.g. connections.max.reauth.ms),
                     stopped at the end of the test

Markers: every test here is marked `kafka`; tests that use `kafka_cluster` are also marked `kafka_cluster`
(automatically, and explicitly in the test files); `kafka_slow` is for single-node tests of a minute or more.
A short run: `-m "not (kafka_slow or kafka_cluster)"`; every real-Kafka test: `-m kafka`.
Without `java` or `mvn`, or when Maven Central cannot be reached to resolve the jars the first time, the tests
are skipped with the reason.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.kafka import KafkaCluster, KafkaUnavailable, TlsMaterial, java_executable, kafka_classpath

_HERE = Path(__file__).parent


def pytest_configure(config):
    config.addinivalue_line("markers", "kafka: runs against real Apache Kafka (java + Maven-resolved jars)")
    config.addinivalue_line("markers", "kafka_cluster: needs the 3-node real Kafka cluster (slow to start)")
    config.addinivalue_line("markers", "kafka_slow: real-Kafka tests of about a minute or more")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if _HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.kafka)
            if "kafka_cluster" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.kafka_cluster)


@pytest.fixture(scope="session")
def kafka_runtime() -> tuple[str, str]:
    """(java, classpath), or skip with the reason."""
    try:
        java = java_executable()
        t0 = time.monotonic()
        classpath = kafka_classpath()
    except KafkaUnavailable as exc:
        pytest.skip(str(exc))
    if time.monotonic() - t0 > 1:
        print(f"\n[kafka] jars resolved in {time.monotonic() - t0:.1f} s")
    return java, classpath


@pytest.fixture(scope="session")
def kafka_tls(tmp_path_factory) -> TlsMaterial:
    return TlsMaterial(tmp_path_factory.mktemp("kafka-tls"))


def _cluster(kafka_runtime, kafka_tls, directory, nodes=1, settings=None, **kwargs) -> KafkaCluster:
    java, classpath = kafka_runtime
    return KafkaCluster(directory, nodes, settings, java=java, classpath=classpath, tls=kafka_tls, **kwargs)


@pytest.fixture(scope="session")
def kafka(kafka_runtime, kafka_tls, tmp_path_factory):
    """One Kafka node for the session; tests use their own topics."""
    cluster = _cluster(kafka_runtime, kafka_tls, tmp_path_factory.mktemp("kafka"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def kafka_cluster(kafka_runtime, kafka_tls, tmp_path_factory):
    """Three Kafka nodes (ids 1-3) for the session; replication factor 3, min.insync.replicas 2."""
    cluster = _cluster(kafka_runtime, kafka_tls, tmp_path_factory.mktemp("kafka-cluster"), nodes=3)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def kafka_factory(kafka_runtime, kafka_tls, tmp_path):
    """Start clusters with settings of their own: kafka_factory(settings, nodes=1, **KafkaCluster kwargs)."""
    started: list[KafkaCluster] = []

    def make(settings: dict | None = None, nodes: int = 1, **kwargs) -> KafkaCluster:
        cluster = _cluster(kafka_runtime, kafka_tls, tmp_path / f"kafka-{len(started)}", nodes, settings,
                           **kwargs)
        started.append(cluster)
        return cluster.start()

    yield make
    for cluster in started:
        cluster.stop()


@pytest.fixture(autouse=True)
def _kafka_nodes_running(request):
    """A test that killed or stopped a node of a shared cluster and did not bring it back must not break the
    next test: nodes that are down are started again (and the cluster waited for) before it runs."""
    for name in ("kafka", "kafka_cluster"):
        if name in request.fixturenames:
            cluster: KafkaCluster = request.getfixturevalue(name)
            down = [node for node in cluster.nodes if not node.alive()]
            for node in down:
                node.launch()
            if down:
                cluster.wait_ready()
    yield
