"""Cluster fault runs on a secured cluster (`make faults CLUSTER=1 SECURE=1`, the runner's `--cluster --secure`).

Every broker has three listeners (docs/security.md §3, §6):
- BROKER  SASL_SSL, SCRAM-SHA-512: inter.broker.listener.name. The brokers' own user `broker` has its credential
          written into ZooKeeper with `oncelog coordination scram-credential` before any broker starts (as
          tests/cluster/test_cluster_acls.py does, and Kafka's ZooKeeper era with kafka-configs --zookeeper).
          Each broker advertises (so registers) BROKER at its FaultProxy: replica fetches, forwarded admin
          requests and transaction markers go through the proxies, as on the unsecured cluster.
- CLIENT  SASL_SSL: the workloads' clients authenticate with SCRAM-SHA-512 as `app`, a principal that is no super
          user and holds only the ACLs of its workload (`workload_acls`); the harness (topic creation, ACLs,
          Metadata for its targets and waits, the final read, the group's offsets) as `admin` with PLAIN. Clients
          connect to CLIENT directly: in cluster mode the proxies never strike clients anyway.
- HARNESS PLAINTEXT (User:ANONYMOUS, no ACL): only ClusterProcess's start-up waits use it (live brokers and the
          controller, which Metadata gives every principal); no topic can be seen or touched there.
The authorizer is on (StandardAuthorizer semantics, allow.everyone.if.no.acl.found=false), super.users are
`broker` and `admin`. The TLS material (a trustme CA, the brokers' certificate for 127.0.0.1) is made per run.

The proxies. BROKER speaks TLS from the first byte, so a proxy cannot read the client id of a connection's first
request to learn which broker it comes from (tests/faults/proxy.py). `LinkProxy` learns it from the kernel
instead: the connection's source port names a socket in /proc/net/tcp, whose inode is among the open files of
exactly one broker process (/proc/<pid>/fd). The bytes are forwarded untouched (TLS end to end), and
refuse/blackhole/delay strike exactly the links they did. Linux only, as the rest of the harness.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.faults.proxy import FaultProxy
from tests.support.kafka import TlsMaterial, client_security

BROKER_USER, BROKER_PASSWORD = "broker", "broker-secret"
ADMIN_USER, ADMIN_PASSWORD = "admin", "admin-secret"
APP_USER, APP_PASSWORD = "app", "app-secret"  # the workloads' principal: ACLs only
INTER_BROKER_MECHANISM = "SCRAM-SHA-512"
APP_MECHANISM = "SCRAM-SHA-512"
ADMIN_MECHANISM = "PLAIN"
AUTHORIZATION_FAILED = {29, 30, 31, 53}  # topic, group, cluster, transactional id
# The prefix of every consumer group (`fault-<reader>`, `fault-copy`, `fault-group`) and transactional id
# (`fault-<producer>`, `fault-copier-<slot>`) the workers use (tests/faults/workers.py, runner.py).
WORKER_PREFIX = "fault-"
# Which workloads need what beyond READ and WRITE on their topics.
TOPIC_DELETE = {"idempotent"}  # the deleter's DeleteRecords
TRANSACTIONAL = {"transactions", "eos-copy"}
SECURE_WORKLOADS = ("idempotent", "consumer", "transactions", "eos-copy")  # not spark: see README


def secure_settings(tls: TlsMaterial) -> dict[str, str]:
    """The broker settings of a secured fault cluster (beside cluster.CLUSTER_SETTINGS)."""
    return {
        "listeners": "HARNESS://127.0.0.1:0,CLIENT://127.0.0.1:0,BROKER://127.0.0.1:0",
        "listener.security.protocol.map": "HARNESS:PLAINTEXT,CLIENT:SASL_SSL,BROKER:SASL_SSL",
        "inter.broker.listener.name": "BROKER",
        "sasl.mechanism.inter.broker.protocol": INTER_BROKER_MECHANISM,
        "listener.name.broker.sasl.enabled.mechanisms": INTER_BROKER_MECHANISM,
        "listener.name.broker.scram-sha-512.sasl.jaas.config":
            f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{BROKER_USER}" '
            f'password="{BROKER_PASSWORD}";',
        "listener.name.client.sasl.enabled.mechanisms": f"{ADMIN_MECHANISM},{APP_MECHANISM}",
        "listener.name.client.plain.sasl.jaas.config":
            f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{ADMIN_USER}="{ADMIN_PASSWORD}";',
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls.broker_keystore_pem),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca_pem),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{BROKER_USER};User:{ADMIN_USER}",
    }


class Security:
    """A secured fault cluster's TLS material, credentials and the client settings of its two principals."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.tls = TlsMaterial(directory / "tls")
        self.app = client_security("SASL_SSL", self.tls, APP_MECHANISM, APP_USER, APP_PASSWORD)
        self.admin = client_security("SASL_SSL", self.tls, ADMIN_MECHANISM, ADMIN_USER, ADMIN_PASSWORD)

    def settings(self) -> dict[str, str]:
        return secure_settings(self.tls)

    def write_credentials(self, connect: str, timeout: float = 60.0) -> None:
        """The SCRAM credentials of `broker` and `app` into ZooKeeper with `oncelog coordination scram-credential`,
        before any broker starts (the brokers cannot replicate without theirs)."""
        procs = []
        for user, password in ((BROKER_USER, BROKER_PASSWORD), (APP_USER, APP_PASSWORD)):
            secret = self.directory / f"{user}-password"
            secret.write_text(password + "\n")
            secret.chmod(0o600)
            procs.append((user, subprocess.Popen(
                [sys.executable, "-m", "oncelog", "coordination", "scram-credential", "--connect", connect,
                 "--user", user, "--mechanism", "SCRAM-SHA-512", "--password-file", str(secret)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})))
        for user, proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"scram-credential for {user} failed: {out}")

    def metadata(self, address: str, topics: list[str] | None, timeout: float = 5.0, as_app: bool = False) -> Any:
        """A Metadata (v12) answer from the CLIENT listener at `address`, authenticated as admin (or app)."""
        return asyncio.run(_metadata(address, topics, timeout, self.app if as_app else self.admin))


async def _metadata(address: str, topics: list[str] | None, timeout: float, conf: dict[str, str]) -> Any:
    from oncelog.client.config import ClientConfig
    from oncelog.client.connection import BrokerConnection
    from oncelog.client.security import security_from_config
    from oncelog.protocol.apis import ApiKey

    host, _, port = address.rpartition(":")
    security = security_from_config(ClientConfig({"bootstrap.servers": address, **conf}, "admin"))
    conn = BrokerConnection(host, int(port), request_timeout_ms=int(timeout * 1000),
                            connect_timeout_ms=int(timeout * 1000), security=security, client_id="fault-harness")
    await asyncio.wait_for(conn.connect(), timeout)
    try:
        wanted = None if topics is None else [{"name": t} for t in topics]
        return await conn.call(ApiKey.METADATA, {"topics": wanted, "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False}, version=12)
    finally:
        await conn.close()


def workload_acls(workload: str, topics: Iterable[str]) -> list[Any]:
    """The ACLs User:app needs for `workload`, and no more: READ and WRITE (each implying DESCRIBE) on the
    workload's topics, DELETE where the deleter runs, READ on the worker groups, WRITE (implying DESCRIBE) on the
    transactional ids of transactional workloads. No Cluster IDEMPOTENT_WRITE: WRITE on a topic lets an idempotent
    producer get its producer id (KIP-679). Group and transactional-id ACLs come first, topic ACLs last (see
    `wait_for_acls`)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    principal = f"User:{APP_USER}"

    def allow(rtype: Any, name: str, pattern: Any, op: Any) -> AclBinding:
        return AclBinding(rtype, name, pattern, principal, "*", op, AclPermissionType.ALLOW)

    prefixed, literal = ResourcePatternType.PREFIXED, ResourcePatternType.LITERAL
    acls = [allow(ResourceType.GROUP, WORKER_PREFIX, prefixed, AclOperation.READ)]
    if workload in TRANSACTIONAL:
        acls.append(allow(ResourceType.TRANSACTIONAL_ID, WORKER_PREFIX, prefixed, AclOperation.WRITE))
    for topic in topics:
        acls += [allow(ResourceType.TOPIC, topic, literal, AclOperation.READ),
                 allow(ResourceType.TOPIC, topic, literal, AclOperation.WRITE)]
        if workload in TOPIC_DELETE:
            acls.append(allow(ResourceType.TOPIC, topic, literal, AclOperation.DELETE))
    return acls


def grant(admin_conf: dict[str, str], acls: list[Any], timeout: float = 60.0) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(admin_conf)
    for future in admin.create_acls(acls, request_timeout=timeout).values():
        future.result(timeout)


def wait_for_acls(security: Security, addresses: dict[int, str], topics: list[str], timeout: float) -> float:
    """Until every broker lets app describe the workload's topics (the last ACLs created, so a broker that has
    them has the earlier ones: it applies change notifications in order) and still refuses it a topic it holds no
    ACL on (`__consumer_offsets`): the authorizer is on and allow.everyone.if.no.acl.found is false. Seconds taken."""
    started = time.monotonic()
    deadline = started + timeout
    pending = dict(addresses)
    last: Any = None
    while pending:
        for node, address in list(pending.items()):
            try:
                md = security.metadata(address, topics, as_app=True)
                codes = {t.name: t.error_code for t in md.topics}
                last = (node, codes)
                if all(codes.get(t) == 0 for t in topics):
                    denied = security.metadata(address, ["__consumer_offsets"], as_app=True)
                    code = denied.topics[0].error_code
                    if code not in AUTHORIZATION_FAILED:
                        raise RuntimeError(f"broker {node} let app describe __consumer_offsets (error {code}): "
                                           "the authorizer is not enforcing ACLs")
                    del pending[node]
            except RuntimeError:
                raise
            except Exception as exc:  # noqa: BLE001 - a broker still catching up: ask again
                last = (node, repr(exc))
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"brokers {sorted(pending)} did not apply app's ACLs within {timeout:.0f} s: {last}")
        if pending:
            time.sleep(0.3)
    return time.monotonic() - started


# -- the proxies in front of BROKER --------------------------------------------------------------------------------

def _hex_port(address: str) -> int:
    return int(address.rsplit(":", 1)[1], 16)


def socket_inode(local_port: int, remote_port: int) -> int | None:
    """The inode of the IPv4 TCP socket bound to `local_port` and connected to `remote_port` (loopback)."""
    try:
        with open("/proc/net/tcp", encoding="ascii") as handle:
            next(handle)
            for line in handle:
                fields = line.split()
                if _hex_port(fields[1]) == local_port and _hex_port(fields[2]) == remote_port:
                    inode = int(fields[9])
                    return inode or None
    except OSError:
        return None
    return None


def owner(inode: int, pids: dict[int, int]) -> int | None:
    """Which of `pids` ({pid: node}) holds socket `inode` open: its node."""
    target = f"socket:[{inode}]"
    for pid, node in pids.items():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return node
            except OSError:
                continue
    return None


GONE = -1  # what `identify` answers for a connection whose peer socket no longer exists


class LinkProxy(FaultProxy):
    """A FaultProxy in front of a TLS listener: which broker a connection comes from is read from the kernel
    (`identify(peer port, proxy port)`: a node, None when no broker holds it, GONE when the peer has closed it
    already), not from the first request, which is encrypted; bytes pass untouched."""

    def __init__(self, identify: Callable[[int, int], int | None]) -> None:
        super().__init__(upstream_port=0)
        self._identify = identify
        self._peers: dict[int, int | None] = {}  # id(reader) -> peer broker, until its _first_request
        self.unidentified = 0  # connections no broker process held (a peer gone before it was looked up)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        loop = asyncio.get_running_loop()
        peer = await loop.run_in_executor(None, self._identify, peername[1], self.port)
        if peer == GONE:  # closed already (the controller's crash probe connects and closes): nothing to forward
            writer.transport.abort()
            return
        if peer is None:
            self.unidentified += 1
        self._peers[id(reader)] = peer
        try:
            await self._serve(reader, writer)
        finally:
            self._peers.pop(id(reader), None)

    async def _first_request(self, reader: asyncio.StreamReader) -> tuple[bytes, int | None]:  # type: ignore[override]
        """Nothing is read before forwarding: the peer is already known."""
        return b"", self._peers.get(id(reader))
