"""Fixtures for cluster-mode tests: ZooKeeper (oncelog.cluster.coordination_service) on loopback.

    zookeeper_runtime      session: (java, classpath), or skip with the reason (no java/mvn, Maven Central
                           unreachable the first time)
    coordination           module: one ZooKeeper member (CoordinationService), started; .servers is its connect
                           string. Shared by the module's tests: use paths of your own (or coordination_connect)
    coordination_connect   per test: "127.0.0.1:PORT/t-<hex>", the module's service with a fresh chroot that exists
    coordination_factory   per test: more services, CoordinationService keyword arguments (settings, port,
                           data_dir...), started and stopped at the end of the test
    ensemble               per test, over one 3-member Ensemble per module: every member is running when the
                           test starts (members a previous test killed are restarted), so tests may kill,
                           stop and restart members freely
    kazoo_client           per test: kazoo_client(hosts, **kwargs) -> a started KazooClient, closed at the end

Long runs are marked `cluster_slow` (left out of `make test`; `make cluster-test` runs them).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from oncelog.cluster.coordination_service import CoordinationService, Ensemble
from oncelog.cluster.zookeeper_jars import CoordinationUnavailable, java_executable, zookeeper_classpath

CLIENT_START_TIMEOUT_S = 30.0


@pytest.fixture(scope="session")
def zookeeper_runtime() -> tuple[str, str]:
    try:
        return java_executable(), zookeeper_classpath()
    except CoordinationUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def coordination(zookeeper_runtime, tmp_path_factory) -> Iterator[CoordinationService]:
    java, classpath = zookeeper_runtime
    service = CoordinationService(tmp_path_factory.mktemp("coordination"), java=java, classpath=classpath)
    service.start()
    yield service
    service.stop()


@pytest.fixture
def coordination_factory(zookeeper_runtime, tmp_path) -> Iterator[Callable[..., CoordinationService]]:
    java, classpath = zookeeper_runtime
    started: list[CoordinationService] = []

    def make(**kwargs) -> CoordinationService:
        kwargs.setdefault("data_dir", tmp_path / f"coordination-{len(started) + 1}")
        service = CoordinationService(java=java, classpath=classpath, **kwargs)
        started.append(service)
        return service.start()

    yield make
    for service in started:
        service.stop()


@pytest.fixture
def kazoo_client() -> Iterator[Callable[..., object]]:
    from kazoo.client import KazooClient

    clients: list[KazooClient] = []

    def make(hosts: str, **kwargs) -> KazooClient:
        client = KazooClient(hosts=hosts, **kwargs)
        clients.append(client)
        client.start(timeout=CLIENT_START_TIMEOUT_S)
        return client

    yield make
    for client in clients:
        client.stop()
        client.close()


@pytest.fixture
def coordination_connect(coordination, kazoo_client) -> str:
    chroot = f"/t-{uuid.uuid4().hex[:12]}"
    kazoo_client(coordination.servers).ensure_path(chroot)
    return coordination.connect_string(chroot)


@pytest.fixture(scope="module")
def _module_ensemble(zookeeper_runtime, tmp_path_factory) -> Iterator[Ensemble]:
    java, classpath = zookeeper_runtime
    ensemble = Ensemble(tmp_path_factory.mktemp("ensemble"), 3, java=java, classpath=classpath)
    ensemble.start()
    yield ensemble
    ensemble.stop()


@pytest.fixture
def ensemble(_module_ensemble) -> Ensemble:
    _module_ensemble.revive()
    return _module_ensemble


@pytest.fixture
def cluster_factory(coordination_connect, tmp_path):
    """make(n=3, **settings): a started ClusterProcess of `n` brokers under this test's chroot, with
    cluster_processes.SETTINGS under `settings`; every one made is SIGKILLed at teardown (the chroot is this
    test's alone: the sessions left behind expire unseen)."""
    from oncelog.embedded import ClusterProcess
    from tests.cluster.cluster_processes import SETTINGS, START_S

    made: list[ClusterProcess] = []

    def make(n: int = 3, **settings) -> ClusterProcess:
        c = ClusterProcess(tmp_path / f"cluster-{len(made)}", n, {**SETTINGS, **settings},
                           connect=coordination_connect)
        made.append(c)
        return c.start(START_S)

    yield make
    for c in made:
        c.kill_all()
