"""ZooKeeper credentials and znode ACLs (docs/security.md §9): brokers log in to a SASL ZooKeeper with the JAAS
file's Client section and, with zookeeper.set.acl=true, create every znode writable only by their identity.

The ZooKeeper here takes SASL DIGEST-MD5 logins (`CoordinationService(sasl_users=...)`) but still serves clients that
do not log in, so an unauthenticated kazoo client plays whoever else can reach it. Checked:

- a 2-broker cluster with zookeeper.set.acl=true (inter-broker SCRAM-SHA-512, the broker's credential written first
  by `oncelog coordination scram-credential --config server.properties`, which logs in as the brokers do): a topic
  is created, a SCRAM user and its ACLs are created through a broker and that user produces and consumes; the
  unauthenticated client reads the topic znodes but cannot change, delete or add any, cannot read a SCRAM
  credential (or list the users), cannot add an ACL znode; the znodes' ACLs are the brokers' identity ALL plus
  world READ, without the READ under /config/users;
- a broker with the wrong ZooKeeper password, and one with zookeeper.set.acl=true and no JAAS file, stop at start
  with a message that says why and a non-zero exit;
- a login refused after the start (ZooKeeper restarted with another password for the broker's user) is one ERROR;
  the broker keeps running and logs in again until ZooKeeper takes the password again, then registers again and
  serves a new topic;
- SASL without zookeeper.set.acl leaves the znodes open (Kafka's behaviour);
- without ZooKeeper: the ACL choice and the reading of the credentials.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, CREATOR_ALL_ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, Id, Permissions

from oncelog.cluster.coordination_service import CoordinationService
from oncelog.cluster.store.errors import ZkAuthError
from oncelog.cluster.store.znode_acls import ZkCredentials, ZkSecurity, acls_for, sensitive, zk_security
from oncelog.embedded import BrokerProcess, ClusterProcess
from oncelog.security.jaas import JaasError, parse_jaas_file
from tests.cluster.cluster_processes import SETTINGS, START_S, wait_for

ZK_USER, ZK_PASSWORD = "kafka", "zk-secret"
BROKER_ZK = [ACL(Permissions.ALL, Id("sasl", ZK_USER))]
WORLD_READ = [ACL(Permissions.READ, Id("world", "anyone"))]
DIGEST = "org.apache.zookeeper.server.auth.DigestLoginModule"


def client_jaas(path: Path, password: str = ZK_PASSWORD, section: str = "Client") -> Path:
    path.write_text(f'{section} {{\n  {DIGEST} required\n  username="{ZK_USER}"\n  password="{password}";\n}};\n')
    return path


@pytest.fixture(scope="module")
def sasl_zookeeper(zookeeper_runtime, tmp_path_factory):
    java, classpath = zookeeper_runtime
    service = CoordinationService(tmp_path_factory.mktemp("sasl-zookeeper"), java=java, classpath=classpath,
                                  sasl_users={ZK_USER: ZK_PASSWORD})
    service.start()
    yield service
    service.stop()


def chroot_connect(zk: CoordinationService) -> str:
    return zk.connect_string(f"/acl-{uuid.uuid4().hex[:10]}")


# ---- a cluster with zookeeper.set.acl=true ---------------------------------------------------------------------

PLAIN_ADMIN = ('org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="admin-secret";')
CLUSTER = {
    "listeners": "HARNESS://127.0.0.1:0,CLIENT://127.0.0.1:0,BROKER://127.0.0.1:0",
    "listener.security.protocol.map": "HARNESS:PLAINTEXT,CLIENT:SASL_PLAINTEXT,BROKER:SASL_PLAINTEXT",
    "inter.broker.listener.name": "BROKER",
    "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
    "listener.name.client.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
    "listener.name.client.plain.sasl.jaas.config": PLAIN_ADMIN,
    "listener.name.broker.sasl.enabled.mechanisms": "SCRAM-SHA-512",
    "listener.name.broker.scram-sha-512.sasl.jaas.config":
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" '
        'password="broker-secret";',
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:admin;User:broker",
    "offsets.topic.replication.factor": 2,
    "zookeeper.set.acl": "true",
}


def client(c: ClusterProcess, user: str, password: str, mechanism: str, **extra) -> dict:
    return {"bootstrap.servers": ",".join(b.listener("CLIENT") for b in c.brokers.values()),
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": password, **extra}


def test_brokers_with_set_acl_own_the_znodes_and_the_cluster_works(sasl_zookeeper, kazoo_client, tmp_path):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        NewTopic,
        ResourcePatternType,
        ResourceType,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    connect = chroot_connect(sasl_zookeeper)
    root = connect[connect.index("/"):]
    jaas = client_jaas(tmp_path / "zk-client.jaas")
    settings = {**SETTINGS, **CLUSTER, "java.security.auth.login.config": str(jaas)}

    # The broker's own SCRAM credential first, written as the brokers would write it (their login, their ACLs)
    properties = tmp_path / "server.properties"
    properties.write_text(f"oncelog.coordination.connect={connect}\nzookeeper.set.acl=true\n"
                          f"java.security.auth.login.config={jaas}\n")
    tool = subprocess.run([sys.executable, "-m", "oncelog", "coordination", "scram-credential", "--config",
                           str(properties), "--user", "broker", "--password", "broker-secret"],
                          capture_output=True, text=True, timeout=60)
    assert tool.returncode == 0, tool.stderr

    c = ClusterProcess(tmp_path / "cluster", 2, settings, connect=connect)
    try:
        c.start(START_S)
        admin = AdminClient(client(c, "admin", "admin-secret", "PLAIN"))
        admin.create_topics([NewTopic("zk-acl", 2, 2)], operation_timeout=30)["zk-acl"].result(60)
        upsert = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                              b"carol-secret")
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(30)
        grants = [AclBinding(ResourceType.TOPIC, "zk-acl", ResourcePatternType.LITERAL, "User:carol", "*",
                             AclOperation.ALL, AclPermissionType.ALLOW),
                  AclBinding(ResourceType.GROUP, "carol-readers", ResourcePatternType.LITERAL, "User:carol", "*",
                             AclOperation.READ, AclPermissionType.ALLOW)]
        for future in admin.create_acls(grants, request_timeout=30).values():
            future.result(30)

        # carol, a SCRAM user made through a broker, produces and consumes under the ACLs made through one
        carol = client(c, "carol", "carol-secret", "SCRAM-SHA-256")
        producer = Producer({**carol, "acks": "all"})
        for i in range(20):
            producer.produce("zk-acl", f"m{i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0
        consumer = Consumer({**carol, "group.id": "carol-readers", "auto.offset.reset": "earliest"})
        consumer.subscribe(["zk-acl"])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < 20 and time.monotonic() < deadline:
            got += [m.value() for m in consumer.consume(20, timeout=1.0) if m.error() is None]
        consumer.close()
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(20))

        # Someone who reaches ZooKeeper without the brokers' login
        anyone = kazoo_client(sasl_zookeeper.servers)
        topic = f"{root}/topics/zk-acl"
        assert b"replicas" in anyone.get(topic)[0]
        wait_for(lambda: sorted(anyone.get_children(f"{root}/brokers/ids")) == ["1", "2"], "both registrations")
        for attempt in (lambda: anyone.set(topic, b"{}"),
                        lambda: anyone.delete(f"{topic}/partitions/0/state"),
                        lambda: anyone.create(f"{root}/topics/forged", b"{}"),
                        lambda: anyone.set(f"{root}/controller_epoch", b"99"),
                        lambda: anyone.get(f"{root}/config/users/carol"),
                        lambda: anyone.get(f"{root}/config/users/broker"),
                        lambda: anyone.get_children(f"{root}/config/users"),
                        lambda: anyone.create(f"{root}/kafka-acl/Topic/forged", b"{}"),
                        lambda: anyone.set(f"{root}/kafka-acl/Topic/zk-acl", b"{}"),
                        lambda: anyone.create(f"{root}/config/changes/config_change_", b"{}", sequence=True)):
            with pytest.raises(NoAuthError):
                attempt()

        # The ACLs themselves, read with the brokers' login
        brokers_login = kazoo_client(sasl_zookeeper.servers, sasl_options={
            "mechanism": "DIGEST-MD5", "username": ZK_USER, "password": ZK_PASSWORD})
        for path in (root, topic, f"{topic}/partitions/1/state", f"{root}/brokers/ids/1", f"{root}/controller",
                     f"{root}/kafka-acl/Topic/zk-acl", f"{root}/config/changes"):
            assert brokers_login.get_acls(path)[0] == BROKER_ZK + WORLD_READ, path
        for path in (f"{root}/config/users", f"{root}/config/users/carol", f"{root}/config/users/broker"):
            assert brokers_login.get_acls(path)[0] == BROKER_ZK, path
        assert b"SCRAM-SHA-256" in brokers_login.get(f"{root}/config/users/carol")[0]
    finally:
        c.kill_all()


# ---- refusals at start -----------------------------------------------------------------------------------------


def start_fails(directory: Path, settings: dict) -> tuple[int, str]:
    broker = BrokerProcess(directory, {**SETTINGS, **settings})
    broker.launch()
    assert broker.proc is not None
    try:
        code = broker.proc.wait(60)
    finally:
        if broker.alive():
            broker.kill()
    return code, broker.log_tail()


def test_a_wrong_zookeeper_password_stops_the_start(sasl_zookeeper, tmp_path):
    started = time.monotonic()
    code, log = start_fails(tmp_path / "wrong", {
        "oncelog.coordination.connect": chroot_connect(sasl_zookeeper), "zookeeper.set.acl": "true",
        "java.security.auth.login.config": str(client_jaas(tmp_path / "wrong.jaas", "guessed"))})
    assert code != 0, log
    assert "refused the login of SASL user 'kafka'" in log and "authentication failed" in log, log
    assert "guessed" not in log
    assert "registration is gone" not in log     # no session was lost: none had opened
    assert time.monotonic() - started < 30     # not the 60 s a broker waits for an unreachable service


def test_set_acl_without_credentials_stops_the_start(tmp_path):
    code, log = start_fails(tmp_path / "none", {"oncelog.coordination.connect": "127.0.0.1:1/x",
                                                "zookeeper.set.acl": "true"})
    assert code != 0, log
    assert "zookeeper.set.acl is true, but no ZooKeeper credentials were found" in log, log


def test_sasl_without_set_acl_leaves_the_znodes_open(sasl_zookeeper, kazoo_client, tmp_path):
    from oncelog.cluster.metadata_image import MetadataImage
    from oncelog.cluster.metadata_store import MetadataStore

    connect = chroot_connect(sasl_zookeeper)
    root = connect[connect.index("/"):]
    security = zk_security({"java.security.auth.login.config": str(client_jaas(tmp_path / "c.jaas"))})
    assert security.credentials is not None and not security.set_acl

    async def start_and_stop() -> None:
        store = MetadataStore(connect, 6000, asyncio.get_running_loop(), MetadataImage(), security=security)
        await store.start(30)
        await store.start_security(acls=True)
        await store.close()

    asyncio.run(start_and_stop())
    anyone = kazoo_client(sasl_zookeeper.servers)
    for path in (root, f"{root}/topics", f"{root}/config/users", f"{root}/kafka-acl/Topic"):
        assert anyone.get_acls(path)[0] == OPEN_ACL_UNSAFE, path
    anyone.create(f"{root}/config/users/mallory", b"{}")   # open: anyone may


# ---- a login refused after the start ----------------------------------------------------------------------------


def test_a_login_refused_after_the_start_is_retried_until_accepted(zookeeper_runtime, kazoo_client, tmp_path):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    java, classpath = zookeeper_runtime
    zk = CoordinationService(tmp_path / "zookeeper", java=java, classpath=classpath,
                             sasl_users={ZK_USER: ZK_PASSWORD})
    zk.start()
    connect = chroot_connect(zk)
    registration = f"{connect[connect.index('/'):]}/brokers/ids/1"
    session_ms = 4000
    c = ClusterProcess(tmp_path / "cluster", 1, {
        **SETTINGS, "oncelog.coordination.session.timeout.ms": session_ms, "zookeeper.set.acl": "true",
        "java.security.auth.login.config": str(client_jaas(tmp_path / "zk-client.jaas")),
        "offsets.topic.replication.factor": 1, "offsets.topic.num.partitions": 1}, connect=connect)
    broker = c.brokers[1]
    refused = "authentication failed, and this broker's session is gone"
    try:
        c.start(START_S)
        with_login = {"sasl_options": {"mechanism": "DIGEST-MD5", "username": ZK_USER, "password": ZK_PASSWORD}}
        first_epoch = kazoo_client(zk.servers, **with_login).exists(registration).czxid

        # ZooKeeper comes back with another password for the broker's user: one ERROR, the broker keeps running
        zk.sasl_users = {ZK_USER: "rotated-elsewhere"}
        zk.restart()
        wait_for(lambda: refused in broker.log_path.read_text(), "the broker's ERROR line", 30)
        # ...and keeps trying (each attempt a refusal in ZooKeeper's log; the seat session's too)
        wait_for(lambda: zk.log_tail(10_000).count("SASL authentication failure") >= 4, "login retries", 30)
        assert broker.alive(), broker.log_tail()
        text = broker.log_path.read_text()
        assert [line for line in text.splitlines() if refused in line][0].split()[2] == "ERROR"
        assert text.count(refused) == 1 and "rotated-elsewhere" not in text

        # ZooKeeper takes the broker's password again: it logs in, registers again and serves
        zk.sasl_users = {ZK_USER: ZK_PASSWORD}
        zk.restart()
        checker = kazoo_client(zk.servers, **with_login)
        wait_for(lambda: (stat := checker.exists(registration)) is not None and stat.czxid > first_epoch,
                 "a new registration", 30)
        assert broker.alive(), broker.log_tail()
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic("after-relogin", 1, 1)], operation_timeout=30)["after-relogin"].result(60)
        producer = Producer({"bootstrap.servers": c.bootstrap, "acks": "all"})
        for i in range(10):
            producer.produce("after-relogin", b"v%d" % i)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "relogin", "enable.auto.commit": False})
        consumer.assign([TopicPartition("after-relogin", 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            got += [m.value() for m in consumer.consume(10, timeout=1.0) if m.error() is None]
        consumer.close()
        assert got == [b"v%d" % i for i in range(10)]
        assert "ZooKeeper accepted the login of SASL user 'kafka'" in broker.log_path.read_text()
    finally:
        c.kill_all()
        zk.stop()


# ---- without ZooKeeper -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path, secure, expected", [
    ("/topics/t", False, OPEN_ACL_UNSAFE),
    ("/config/users/alice", False, OPEN_ACL_UNSAFE),
    ("", True, CREATOR_ALL_ACL + READ_ACL_UNSAFE),
    ("/topics/t/partitions/0/state", True, CREATOR_ALL_ACL + READ_ACL_UNSAFE),
    ("/kafka-acl/Topic/t", True, CREATOR_ALL_ACL + READ_ACL_UNSAFE),
    ("/config", True, CREATOR_ALL_ACL + READ_ACL_UNSAFE),
    ("/config/clients/app", True, CREATOR_ALL_ACL + READ_ACL_UNSAFE),
    ("/config/changes/config_change_", True, CREATOR_ALL_ACL + READ_ACL_UNSAFE),
    ("/config/users", True, CREATOR_ALL_ACL),
    ("/config/users/alice/clients/app", True, CREATOR_ALL_ACL),
    ("/config/brokers/1", True, CREATOR_ALL_ACL),
    ("/delegation_token/tokens/x", True, CREATOR_ALL_ACL),
])
def test_the_acl_of_a_path(path, secure, expected):
    assert acls_for(path, secure) == expected
    assert ZkSecurity(None, secure).acls(path) == expected


def test_sensitive_roots_are_kafkas_string_prefixes():
    # ZkData.sensitivePath is `startsWith`: a sibling whose name extends a root's counts too
    assert sensitive("/config/users") and sensitive("/config/usersX") and not sensitive("/config/user")
    assert not sensitive("/oncelog/config/users")   # paths are chroot-relative


def test_the_session_judges_paths_under_its_chroot():
    from oncelog.cluster.store.session import SessionHooks, StoreSession

    hooks = SessionHooks(lambda: None, lambda: None, lambda: asyncio.sleep(0), lambda: None, lambda: None)
    session = StoreSession("127.0.0.1:1", "/oncelog", 6000, asyncio.new_event_loop(), hooks,
                           security=ZkSecurity(ZkCredentials("kafka", "pw"), True))
    try:
        assert session.acls("/oncelog/config/users/a") == CREATOR_ALL_ACL
        assert session.acls("/oncelog") == session.acls("/oncelog/topics") == CREATOR_ALL_ACL + READ_ACL_UNSAFE
        assert session.acls("/oncelog-other/config/users") == CREATOR_ALL_ACL + READ_ACL_UNSAFE
    finally:
        session.loop.close()


def files(**texts: str):
    return lambda path: texts[path]


def test_credentials_come_from_the_client_section():
    jaas = (f'KafkaServer {{ a.B required; }};\n// the ZooKeeper login\n'
            f'Client {{\n {DIGEST} required username="kafka" password="p;w}}";\n}};')
    security = zk_security({"zookeeper.set.acl": True, "java.security.auth.login.config": "f"}, {}, files(f=jaas))
    assert security.set_acl and security.credentials == ZkCredentials("kafka", "p;w}", "f, section Client")
    assert security.client_kwargs() == {"sasl_options": {"mechanism": "DIGEST-MD5", "username": "kafka",
                                                         "password": "p;w}"}}
    assert "p;w}" not in repr(security) and "p;w}" not in security.describe()
    # another section, by zookeeper.sasl.clientconfig
    other = jaas.replace("Client {", "ZkLogin {")
    assert zk_security({"java.security.auth.login.config": "f"}, {}, files(f=other)).credentials is None
    named = zk_security({"java.security.auth.login.config": "f", "zookeeper.sasl.clientconfig": "ZkLogin"}, {},
                        files(f=other))
    assert named.credentials is not None and named.credentials.username == "kafka"


def test_kafka_opts_fill_the_jvm_properties_left_unset():
    jaas = f'Zk {{ {DIGEST} required username="u" password="p"; }};'
    environ = {"KAFKA_OPTS": "-Xmx1g -Djava.security.auth.login.config=/etc/k.jaas -Dzookeeper.sasl.clientconfig=Zk"}
    security = zk_security({"zookeeper.set.acl": True}, environ, files(**{"/etc/k.jaas": jaas}))
    assert security.credentials is not None and security.credentials.source == "/etc/k.jaas, section Zk"
    # a key set in server.properties wins over KAFKA_OPTS
    with pytest.raises(ZkAuthError, match="no ZooKeeper credentials"):
        zk_security({"zookeeper.set.acl": True, "zookeeper.sasl.clientconfig": "Client"}, environ,
                    files(**{"/etc/k.jaas": jaas}))


@pytest.mark.parametrize("settings, jaas, message", [
    ({"zookeeper.set.acl": True}, None, "zookeeper.set.acl is true, but no ZooKeeper credentials were found"),
    ({"zookeeper.set.acl": True, "java.security.auth.login.config": "f"}, "Other { a.B required; };",
     "a JAAS file with a Client section"),
    ({"java.security.auth.login.config": "f", "zookeeper.sasl.client": False},
     f'Client {{ {DIGEST} required username="u" password="p"; }};', "zookeeper.sasl.client is false"),
    ({"java.security.auth.login.config": "f"},
     'Client { com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true; };', "no Kerberos"),
    ({"java.security.auth.login.config": "f"}, f'Client {{ {DIGEST} required username="u"; }};',
     'needs username="..." and password="..."'),
    ({"java.security.auth.login.config": "f"}, f'Client {{ {DIGEST} required username="u" password="p" }};',
     "must end with ';'"),
    ({"java.security.auth.login.config": "missing"}, None, "cannot read the JAAS file missing"),
])
def test_what_is_refused(settings, jaas, message):
    def read(path: str) -> str:
        if jaas is None or path != "f":
            raise FileNotFoundError(2, "No such file or directory")
        return jaas

    with pytest.raises(ZkAuthError, match=message.replace("(", r"\(").replace(".", r"\.")):
        zk_security(settings, {}, read)


def test_sasl_off_without_a_section_is_simply_unauthenticated():
    security = zk_security({"zookeeper.sasl.client": False}, {})
    assert security == ZkSecurity() and security.client_kwargs() == {}


def test_jaas_files_with_comments_and_several_sections():
    sections = parse_jaas_file('/* a */ A { x.Y required k="v # not a comment"; z.W optional; };\n'
                               '# b\nB { q.R sufficient; };')
    assert [e.module for e in sections["A"]] == ["x.Y", "z.W"] and sections["A"][0].options == {
        "k": "v # not a comment"}
    assert sections["B"][0].flag == "sufficient"
    for bad in ("A { x.Y required; }", "A { x.Y required; ", "A x.Y required; };", "A { x.Y; };",
                "A { x.Y required; }; A { z.W required; };"):
        with pytest.raises(JaasError):
            parse_jaas_file(bad)
