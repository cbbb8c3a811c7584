"""CoordinationService: one ZooKeeper member as a child JVM; its data, port, stop and kill."""

from __future__ import annotations

import os
import socket

import pytest

from oncelog.cluster.coordination_service import CoordinationService, PortInUse


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_fixture_serves_a_chroot(coordination, coordination_connect, kazoo_client):
    assert coordination.alive() and coordination.member.mode() == "standalone"
    assert coordination_connect.startswith(coordination.servers + "/t-")
    chrooted = kazoo_client(coordination_connect)
    chrooted.create("/brokers/ids/1", b"broker-1", makepath=True)
    root = kazoo_client(coordination.servers)
    chroot = coordination_connect[len(coordination.servers):]
    assert root.get(f"{chroot}/brokers/ids/1")[0] == b"broker-1"


def test_znodes_survive_a_clean_stop_and_a_kill(coordination_factory, kazoo_client, tmp_path):
    service = coordination_factory(data_dir=tmp_path / "zk")
    port, first_pid = service.port, service.pid
    client = kazoo_client(service.servers)
    client.create("/before-stop", b"1")
    client.stop()

    service.stop()
    assert not service.alive() and _gone(first_pid)
    service.start()
    assert service.port == port, "a restart keeps the port, so connect strings stay valid"
    client = kazoo_client(service.servers)
    assert client.get("/before-stop")[0] == b"1"
    client.create("/before-kill", b"2")          # acknowledged: fsynced to the transaction log
    client.stop()

    service.kill()
    service.restart()
    client = kazoo_client(service.servers)
    assert client.get("/before-stop")[0] == b"1"
    assert client.get("/before-kill")[0] == b"2"
    client.stop()

    # a new service on the same data dir (another port) has them too
    service.stop()
    again = coordination_factory(data_dir=tmp_path / "zk")
    assert kazoo_client(again.servers).get("/before-kill")[0] == b"2"


def test_context_manager_stops_the_jvm(zookeeper_runtime, tmp_path, kazoo_client):
    java, classpath = zookeeper_runtime
    with CoordinationService(tmp_path / "zk", java=java, classpath=classpath) as service:
        pid = service.pid
        assert kazoo_client(service.servers).exists("/zookeeper") is not None
    assert service.pid is None and _gone(pid)


def test_a_port_in_use_is_refused(zookeeper_runtime, tmp_path):
    java, classpath = zookeeper_runtime
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        service = CoordinationService(tmp_path / "zk", port=port, java=java, classpath=classpath)
        with pytest.raises(PortInUse, match=f"127.0.0.1:{port}"):
            service.start()
    assert service.pid is None


def test_zoo_cfg_settings(coordination_factory, tmp_path):
    """Loopback only, admin server off, reconfig off; `settings` win over the defaults."""
    service = coordination_factory(data_dir=tmp_path / "zk", settings={"maxSessionTimeout": 90000})
    cfg = dict(line.split("=", 1) for line in (tmp_path / "zk" / "zoo.cfg").read_text().splitlines()
               if line and not line.startswith("#"))
    assert cfg["clientPortAddress"] == "127.0.0.1" and cfg["clientPort"] == str(service.port)
    assert cfg["admin.enableServer"] == "false" and cfg["reconfigEnabled"] == "false"
    assert cfg["4lw.commands.whitelist"] == "" and cfg["maxSessionTimeout"] == "90000"
    assert "maxSessionTimeout set to 90000 ms" in (tmp_path / "zk" / "zookeeper.log").read_text()
    bound = _listening_addresses(service.port)
    assert bound and all(address.endswith("0100007F") for address in bound), bound    # 127.0.0.1 (or v4-mapped)


def _listening_addresses(port: int) -> list[str]:
    """Local addresses (kernel hex) of sockets listening on `port`, from /proc/net/tcp and tcp6."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:      # 0A: LISTEN
                found.append(address)
    return found
