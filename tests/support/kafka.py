"""Real Apache Kafka (KRaft, combined broker+controller) on loopback, for tests of oncelog's client.

The jars come from Maven Central through `kafka_server/pom.xml`: `mvn dependency:build-classpath` resolves them
into ~/.m2 on first use, and the classpath it prints is cached in a file keyed by the pom's hash (under
$ONCELOG_KAFKA_CACHE, default ~/.cache/oncelog/kafka-4.4.0), so later sessions run no Maven at all.

Each node is one JVM (`java -cp CLASSPATH kafka.Kafka server.properties`), formatted first with Kafka's storage
tool (`kafka.tools.StorageTool format`), listening on 127.0.0.1 only, on ports picked at start:

    PLAINTEXT       clients, no security (the `bootstrap` address)
    SSL             TLS, server certificate from a trustme CA; client certificates requested, not required
    SASL_SSL        TLS + SASL: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER (unsecured JWTs)
    SASL_PLAINTEXT  SASL without TLS: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (no OAUTHBEARER)
    BROKER          inter-broker traffic (PLAINTEXT), not for clients
    CONTROLLER      KRaft controller quorum (PLAINTEXT), not for clients

SCRAM users are written into the metadata log at format time (`--add-scram`), PLAIN users into each SASL
listener's JAAS config; both get the same `users` ({"alice": "alice-secret"} by default).
A single node is a standalone dynamic quorum (`format --standalone`); three nodes are a static quorum
(`controller.quorum.voters`). `settings` are merged last into every node's server.properties (e.g.
`connections.max.reauth.ms`, `transaction.max.timeout.ms`).

Processes are started in their own process group and only those are ever signalled.
"""

from __future__ import annotations

import atexit
import base64
import concurrent.futures
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from xml.etree import ElementTree

KAFKA_VERSION = "4.4.0"
POM = Path(__file__).parent / "kafka_server" / "pom.xml"
CLIENT_LISTENERS = ("PLAINTEXT", "SSL", "SASL_SSL", "SASL_PLAINTEXT")
INTERNAL_LISTENERS = ("BROKER", "CONTROLLER")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")      # users/passwords: client_security()
# What each SASL listener enables. OAUTHBEARER (SASL_SSL only) uses Kafka's default, unsecured validator: it
# takes any unsigned JWT (alg "none") that has a subject and has not expired. Test use only.
LISTENER_MECHANISMS: Mapping[str, tuple[str, ...]] = {
    "SASL_SSL": (*SASL_MECHANISMS, "OAUTHBEARER"),
    "SASL_PLAINTEXT": SASL_MECHANISMS,
}
DEFAULT_USERS: Mapping[str, str] = {"alice": "alice-secret"}
HOST = "127.0.0.1"

RESOLVE_TIMEOUT_S = 280.0      # first resolution (~45 jars, 65 MB); under pytest-timeout's 300 s, so a slow
                               # network skips (downloads so far stay in ~/.m2) rather than fails
START_TIMEOUT_S = 120.0        # per node (JVM start, format, registration), scaled by the node count
STOP_TIMEOUT_S = 60.0
FORMAT_TIMEOUT_S = 120.0
PORT_ATTEMPTS = 3              # fresh ports (and a fresh format) when a port was taken between pick and bind

_OFFLINE = re.compile(
    r"Could not transfer|Unknown ?host|Network is unreachable|Connection refused|Connect(ion)? timed out|"
    r"Read timed out|No route to host|Temporary failure in name resolution|offline mode|"
    r"has not been downloaded from it before|Cannot access central|PKIX path",
    re.IGNORECASE,
)
_BIND_FAILURE = re.compile(r"BindException|Address already in use")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

_LOG4J2 = """\
# Errors only, to a file in the node's directory.
status = error
name = oncelog-kafka-test
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = error
rootLogger.appenderRef.file.ref = file
"""


_RUNNING: set[KafkaNode] = set()     # started and not yet stopped or killed


@atexit.register
def _kill_leftovers() -> None:
    """Nodes still running when the interpreter exits (a test run interrupted before teardown) are killed."""
    for node in list(_RUNNING):
        node.kill()


def _orphan_guard() -> list[str]:
    """A prefix that makes the JVM die with this process (Linux setpriv --pdeathsig), so an interpreter that is
    killed outright leaves no Kafka behind. Only from the main thread: the signal follows the death of the
    *thread* that started the child, and the main thread lives as long as the interpreter."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return []
    return [setpriv, "--pdeathsig", "KILL", "--"]


class KafkaUnavailable(Exception):
    """Kafka cannot run here (no java/mvn, Java too old, Maven Central unreachable): a reason to skip."""


# -- jars ---------------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    base = os.environ.get("ONCELOG_KAFKA_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "oncelog" / f"kafka-{KAFKA_VERSION}"


def java_executable() -> str:
    """`java` (17+, what Kafka 4 needs) or KafkaUnavailable."""
    java = shutil.which("java")
    if java is None:
        raise KafkaUnavailable("real Kafka: no `java` on PATH (Kafka 4 needs Java 17+)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match:
        major = int(match.group(1))
        if major == 1 and match.group(2):   # 1.8 style
            major = int(match.group(2))
        if major < 17:
            raise KafkaUnavailable(f"real Kafka: `java` is version {major}; Kafka {KAFKA_VERSION} needs 17+")
    return java


def _dependency_plugin(pom: Path = POM) -> str:
    """groupId:artifactId:version of the pom's pinned maven-dependency-plugin.

    The goal is named in full rather than as `dependency:build-classpath`: offline and with an empty ~/.m2 the
    prefix form fails with "No plugin found for prefix" and hides the network error that says why."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    for plugin in ElementTree.parse(pom).getroot().iterfind("m:build/m:plugins/m:plugin", ns):
        if plugin.findtext("m:artifactId", namespaces=ns) == "maven-dependency-plugin":
            group = plugin.findtext("m:groupId", "org.apache.maven.plugins", ns)
            return f"{group}:maven-dependency-plugin:{plugin.findtext('m:version', namespaces=ns)}"
    raise RuntimeError(f"{pom} pins no maven-dependency-plugin")


def kafka_classpath(cache: Path | None = None, timeout: float = RESOLVE_TIMEOUT_S, *, pom: Path = POM,
                    artifact: str = "kafka_2.13", version: str = KAFKA_VERSION) -> str:
    """Kafka's server classpath: from the cache when its jars are all present, else from Maven.

    `pom` names another project of Kafka's jars (tests/support/kafka_tools.py: the command-line tools), cached
    beside this one under its own hash; `artifact` at `version` is the jar the resolved classpath must contain
    (tests/interop/test_kafka_connect.py: Kafka Connect, pinned at another release in its pom)."""
    cache = cache or cache_dir()
    key = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    cached = cache / f"classpath-{key}.txt"
    if cached.is_file():
        classpath = cached.read_text().strip()
        if classpath and all(Path(jar).is_file() for jar in classpath.split(os.pathsep)):
            return classpath
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaUnavailable(f"real Kafka: no `mvn` on PATH to resolve {artifact} {version}")
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"classpath-{key}.{os.getpid()}.tmp"
    try:
        proc = subprocess.run([mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(pom),
                               f"{_dependency_plugin(pom)}:build-classpath", f"-Dmdep.outputFile={out}"],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise KafkaUnavailable(f"real Kafka: `mvn dependency:build-classpath` did not finish in {timeout:.0f} s "
                               "(Maven Central unreachable or very slow?)") from exc
    log = _ANSI.sub("", proc.stdout + proc.stderr)
    if proc.returncode != 0:
        out.unlink(missing_ok=True)
        if _OFFLINE.search(log):
            first = next((ln for ln in log.splitlines() if _OFFLINE.search(ln)), "")
            raise KafkaUnavailable(f"real Kafka: Maven Central not reachable to resolve {artifact} "
                                   f"{version} (and nothing in ~/.m2): {first.strip()[:300]}")
        raise RuntimeError(f"mvn could not resolve Kafka's classpath from {pom}:\n{log[-3000:]}")
    classpath = out.read_text().strip()
    if f"{os.sep}{artifact}-{version}.jar" not in classpath:
        raise RuntimeError(f"mvn resolved a classpath without {artifact}:\n{classpath[:2000]}")
    os.replace(out, cached)
    return classpath


# -- TLS ----------------------------------------------------------------------------------------------------


class TlsMaterial:
    """A trustme CA, the brokers' certificate (127.0.0.1 and localhost) and a client certificate, as PEM files.

    ca_pem                      the CA certificate (clients' ssl.ca.location, brokers' truststore)
    broker_cert_pem             broker certificate chain;  broker_key_pem: its key, unencrypted PKCS#8
    broker_keystore_pem         key + chain in one file (Kafka's ssl.keystore.type=PEM, ssl.keystore.location)
    client_cert_pem             client certificate (CN=client_cn) for mutual TLS; client_key_pem: its key
    client_key_encrypted_pem    the same key, encrypted PKCS#8, with client_key_password (ssl.key.password)
    """

    def __init__(self, directory: str | Path, client_cn: str = "alice",
                 client_key_password: str = "client-key-secret") -> None:
        import trustme
        from cryptography.hazmat.primitives import serialization

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA(organization_name="oncelog tests")
        broker = self.ca.issue_cert(HOST, "localhost", common_name="oncelog-test-kafka")
        client = self.ca.issue_cert("client.oncelog.test", common_name=client_cn)

        def pkcs8(cert, encryption=None) -> bytes:
            key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), password=None)
            return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     encryption or serialization.NoEncryption())

        def chain(cert) -> bytes:
            return b"".join(blob.bytes() for blob in cert.cert_chain_pems)

        self.client_cn = client_cn
        self.client_key_password = client_key_password
        self.ca_pem = self._write("ca.pem", self.ca.cert_pem.bytes())
        self.broker_cert_pem = self._write("broker-cert.pem", chain(broker))
        self.broker_key_pem = self._write("broker-key.pem", pkcs8(broker))
        self.broker_keystore_pem = self._write("broker-keystore.pem", pkcs8(broker) + chain(broker))
        self.client_cert_pem = self._write("client-cert.pem", chain(client))
        self.client_key_pem = self._write("client-key.pem", pkcs8(client))
        self.client_key_encrypted_pem = self._write(
            "client-key-encrypted.pem",
            pkcs8(client, serialization.BestAvailableEncryption(client_key_password.encode())))

    def _write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        path.write_bytes(data)
        return path


def client_security(listener: str, tls: TlsMaterial | None = None, mechanism: str = "SCRAM-SHA-512",
                    user: str = "alice", password: str = "alice-secret", client_cert: bool = False,
                    encrypted_key: bool = False) -> dict[str, str]:
    """Client settings (librdkafka / Kafka names, as confluent-kafka and oncelog take them) for a listener.

    `client_cert` adds the client certificate for mutual TLS; `encrypted_key` uses the encrypted key and
    ssl.key.password. Both only on SSL / SASL_SSL.
    """
    listener = listener.upper()
    if listener not in CLIENT_LISTENERS:
        raise ValueError(f"unknown listener {listener!r}; one of {CLIENT_LISTENERS}")
    conf = {"security.protocol": listener}
    if listener in ("SSL", "SASL_SSL"):
        if tls is None:
            raise ValueError(f"{listener} needs the TlsMaterial (its CA)")
        conf["ssl.ca.location"] = str(tls.ca_pem)
        if client_cert or encrypted_key:
            conf["ssl.certificate.location"] = str(tls.client_cert_pem)
            if encrypted_key:
                conf["ssl.key.location"] = str(tls.client_key_encrypted_pem)
                conf["ssl.key.password"] = tls.client_key_password
            else:
                conf["ssl.key.location"] = str(tls.client_key_pem)
    if listener.startswith("SASL_"):
        if mechanism not in SASL_MECHANISMS:
            raise ValueError(f"client_security: SASL mechanism {mechanism!r} not one of {SASL_MECHANISMS} "
                             "(OAUTHBEARER needs a token: set sasl.oauthbearer.* yourself)")
        conf.update({"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password})
    return conf


# -- helpers ------------------------------------------------------------------------------------------------


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports the kernel had free a moment ago (bound together, so never the same twice)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((HOST, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _kafka_uuid() -> str:
    """A Kafka Uuid string (16 random bytes, URL-safe base64 without padding): cluster and directory ids.

    Never one starting with "-" (as Kafka's Uuid.randomUuid): the storage tool's argument parser would take
    `--cluster-id -abc...` for an option and fail."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _jaas_value(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _prop_escape(value: str) -> str:
    """A value for a Java .properties file (backslashes and line breaks escaped)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _quiet_logger() -> logging.Logger:
    logger = logging.getLogger("oncelog.tests.kafka.readiness")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


def _registered_brokers(bootstrap: str, timeout: float) -> set[int]:
    """Broker ids a Metadata response from `bootstrap` lists (registered and unfenced); empty on failure."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 5000,
                         "reconnect.backoff.max.ms": 500, "logger": _quiet_logger()})
    try:
        return set(admin.list_topics(timeout=timeout).brokers)
    except KafkaException:
        return set()


# -- one node -----------------------------------------------------------------------------------------------


class KafkaNode:
    """One Kafka JVM in KRaft combined mode (process.roles=broker,controller).

    Built by KafkaCluster, which picks ports, writes server.properties and formats the storage; start/stop/
    kill/restart/alive/bootstrap/log_tail mean what they mean on oncelog's BrokerProcess.
    """

    def __init__(self, cluster: KafkaCluster, node_id: int, directory: Path, heap_mb: int) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.directory = directory
        self.heap_mb = heap_mb
        self.ports: dict[str, int] = {}
        self.directory_id = _kafka_uuid()
        self.proc: subprocess.Popen | None = None
        self.config_path = directory / "server.properties"
        self.log4j_path = directory / "log4j2.properties"
        self.log_path = directory / "kafka-errors.log"     # log4j2, errors only
        self.out_path = directory / "kafka.out"            # the JVM's stdout/stderr
        self.data_dir = directory / "data"

    # addresses

    @property
    def bootstrap(self) -> str:
        return self.listener("PLAINTEXT")

    def listener(self, name: str) -> str:
        """host:port of one listener: PLAINTEXT, SSL, SASL_SSL, SASL_PLAINTEXT (or BROKER, CONTROLLER)."""
        return f"{HOST}:{self.ports[name.upper()]}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    # configuration

    def _java(self, main: str, *args: str) -> list[str]:
        return [self.cluster.java, f"-Xmx{self.heap_mb}m", f"-Xms{min(self.heap_mb, 128)}m",
                "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.log4j_path}", f"-Djava.io.tmpdir={self.directory}",
                "-cp", self.cluster.classpath, main, *args]

    def _properties(self) -> dict[str, str]:
        cluster, tls = self.cluster, self.cluster.tls
        listeners = (*CLIENT_LISTENERS, *INTERNAL_LISTENERS)
        props: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": self.node_id,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "BROKER",
            "listeners": ",".join(f"{name}://{self.listener(name)}" for name in listeners),
            "advertised.listeners": ",".join(f"{name}://{self.listener(name)}" for name in listeners),
            "listener.security.protocol.map": ",".join(
                f"{name}:{'PLAINTEXT' if name in INTERNAL_LISTENERS else name}" for name in listeners),
            "log.dirs": self.data_dir,
            "num.network.threads": 2,
            "num.io.threads": 4,
            "num.recovery.threads.per.data.dir": 1,
            "num.partitions": 1,
            "offsets.topic.num.partitions": 5,
            "transaction.state.log.num.partitions": 5,
            "share.coordinator.state.topic.num.partitions": 5,
            "group.initial.rebalance.delay.ms": 0,
            "log.retention.check.interval.ms": 60000,
            # TLS: one server certificate for SSL and SASL_SSL; client certificates requested on SSL only.
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": tls.broker_keystore_pem,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": tls.ca_pem,
            "listener.name.ssl.ssl.client.auth": "requested",
            "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
        }
        plain_users = " ".join(f"user_{name}={_jaas_value(pw)}" for name, pw in cluster.users.items())
        for listener, mechanisms in LISTENER_MECHANISMS.items():
            name = listener.lower()
            props[f"listener.name.{name}.sasl.enabled.mechanisms"] = ",".join(mechanisms)
            if "OAUTHBEARER" in mechanisms:
                props[f"listener.name.{name}.oauthbearer.sasl.jaas.config"] = (
                    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                    'unsecuredLoginStringClaim_sub="broker";')
            props[f"listener.name.{name}.plain.sasl.jaas.config"] = (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};")
            for mech in ("scram-sha-256", "scram-sha-512"):
                props[f"listener.name.{name}.{mech}.sasl.jaas.config"] = (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;")
        if len(cluster.nodes) == 1:
            props["controller.quorum.bootstrap.servers"] = self.listener("CONTROLLER")
            props.update({"offsets.topic.replication.factor": 1, "transaction.state.log.replication.factor": 1,
                          "transaction.state.log.min.isr": 1, "share.coordinator.state.topic.replication.factor": 1,
                          "share.coordinator.state.topic.min.isr": 1})
        else:
            props["controller.quorum.voters"] = ",".join(
                f"{n.node_id}@{n.listener('CONTROLLER')}" for n in cluster.nodes)
            rf = min(3, len(cluster.nodes))
            props.update({"offsets.topic.replication.factor": rf, "transaction.state.log.replication.factor": rf,
                          "transaction.state.log.min.isr": 2, "min.insync.replicas": 2,
                          "default.replication.factor": rf,
                          "share.coordinator.state.topic.replication.factor": rf,
                          "share.coordinator.state.topic.min.isr": 2})
        props.update(cluster.settings)
        return {key: str(value) for key, value in props.items()}

    def configure(self, ports: Mapping[str, int]) -> None:
        """Fresh directory, ports and config files (before format)."""
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        self.ports = dict(ports)
        self.log4j_path.write_text(_LOG4J2.format(path=self.log_path))
        lines = [f"{key}={_prop_escape(value)}" for key, value in self._properties().items()]
        self.config_path.write_text("\n".join(lines) + "\n")

    def format(self, cluster_id: str, timeout: float = FORMAT_TIMEOUT_S) -> None:
        """kafka-storage format: meta.properties, bootstrap checkpoint with the features and SCRAM users."""
        args = ["format", "--config", str(self.config_path), "--cluster-id", cluster_id]
        if len(self.cluster.nodes) == 1:
            args.append("--standalone")
        if self.cluster.release_version:
            args += ["--release-version", self.cluster.release_version]
        for feature, level in self.cluster.features.items():
            args += ["--feature", f"{feature}={level}"]
        for user, password in self.cluster.users.items():
            for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                args += ["--add-scram", f"{mech}=[name={user},password={password}]"]
        proc = subprocess.run(self._java("kafka.tools.StorageTool", *args), capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
        if proc.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed for node {self.node_id} (exit {proc.returncode}):\n"
                               f"{(proc.stdout + proc.stderr)[-3000:]}\n{self.log_tail()}")

    # lifecycle

    def launch(self) -> None:
        """Start the JVM without waiting for it (start() waits)."""
        if self.alive():
            raise RuntimeError(f"Kafka node {self.node_id} is already running (pid {self.pid})")
        args = [*_orphan_guard(), *self._java("kafka.Kafka", str(self.config_path))]
        with open(self.out_path, "ab") as out:
            self.proc = subprocess.Popen(args, cwd=self.directory, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        _RUNNING.add(self)

    def start(self, timeout: float | None = None) -> KafkaNode:
        """Start and wait until this node answers Metadata on PLAINTEXT with itself registered.

        The default deadline is the cluster's start_timeout plus broker.session.timeout.ms: after a kill(),
        the controller refuses the new registration (DUPLICATE_BROKER_REGISTRATION) until the old one's
        session has expired."""
        self.launch()
        try:
            self.wait_registered(timeout or self.cluster.start_timeout + self.cluster.session_timeout_s)
        except BaseException:
            self.kill()
            raise
        return self

    def wait_registered(self, timeout: float, ids: Iterable[int] | None = None) -> None:
        """Until Metadata from this node lists `ids` (default: itself); raises with the log tail."""
        want = set(ids) if ids is not None else {self.node_id}
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        while True:
            if not self.alive():
                code = self.proc.returncode if self.proc is not None else None
                raise KafkaNodeDied(self, f"Kafka node {self.node_id} exited during startup (code {code})")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"Kafka node {self.node_id} did not list brokers {sorted(want)} within "
                                   f"{timeout:.0f} s (last saw {sorted(seen)}):\n{self.log_tail()}")
            seen = _registered_brokers(self.bootstrap, min(5.0, max(remaining, 0.5)))
            if want <= seen:
                return
            time.sleep(0.2)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (Kafka's clean, controlled shutdown) and wait; SIGKILL after `timeout`."""
        if self.proc is None:
            return 0
        self._signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            code = self.proc.wait()
        self.proc = None
        _RUNNING.discard(self)
        return code

    def kill(self) -> None:
        """SIGKILL: nothing is flushed, nothing is closed."""
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None
        _RUNNING.discard(self)

    def restart(self, clean: bool = False, timeout: float | None = None) -> KafkaNode:
        """Stop (SIGTERM when `clean`, else SIGKILL) and start again on the same ports and data."""
        self.stop() if clean else self.kill()
        return self.start(timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal(self, sig: signal.Signals) -> None:
        """Signal the process group this node's JVM leads (only ever a process we started)."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 40) -> str:
        parts = []
        for path in (self.out_path, self.log_path):
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            if text:
                parts.append(f"--- {path} ---\n" + "\n".join(text))
        return "\n".join(parts) or f"(node {self.node_id}: no output in {self.directory})"

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.alive() else "stopped"
        return f"<KafkaNode {self.node_id} {self.bootstrap if self.ports else ''} {state}>"


class KafkaNodeDied(RuntimeError):
    def __init__(self, node: KafkaNode, message: str) -> None:
        self.node = node
        self.bind_failure = bool(_BIND_FAILURE.search(node.log_tail(400)))
        super().__init__(f"{message}:\n{node.log_tail()}")


# -- a cluster ----------------------------------------------------------------------------------------------


class KafkaCluster:
    """`nodes` Kafka nodes (1, or 3 for replication) on loopback; node ids 1..n.

    `settings` are merged last into every server.properties. `classpath` defaults to kafka_classpath(),
    `tls` to a fresh TlsMaterial in `directory`/tls. `features` ({"transaction.version": 1}) and
    `release_version` ("3.9-IV0") go to the storage tool's --feature / --release-version; without them
    Kafka 4.4 formats metadata.version 4.4-IV2 with transaction.version=2, group.version=1, share.version=2.
    Start with start() (or `with KafkaCluster(...)`).
    """

    def __init__(self, directory: str | Path, nodes: int = 1, settings: Mapping[str, object] | None = None, *,
                 classpath: str | None = None, tls: TlsMaterial | None = None,
                 users: Mapping[str, str] | None = None, heap_mb: int | None = None,
                 start_timeout: float | None = None, java: str | None = None,
                 features: Mapping[str, int] | None = None, release_version: str | None = None) -> None:
        if nodes < 1:
            raise ValueError("a cluster has at least one node")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.settings = dict(settings or {})
        self.users = dict(users if users is not None else DEFAULT_USERS)
        for user, password in self.users.items():
            if re.search(r'[,\[\]"=\s]', user + password):
                raise ValueError(f"user {user!r}: names and passwords go into --add-scram '[name=..,password=..]'"
                                 " and JAAS; keep them to characters other than , [ ] \" = and spaces")
        self.features = dict(features or {})
        self.release_version = release_version
        self.java = java or java_executable()
        self.classpath = classpath or kafka_classpath()
        self.tls = tls or TlsMaterial(self.directory / "tls")
        self.start_timeout = start_timeout or START_TIMEOUT_S * (1 + 0.5 * (nodes - 1))
        self.session_timeout_s = float(self.settings.get("broker.session.timeout.ms", 9000)) / 1000
        heap = heap_mb or (512 if nodes == 1 else 384)
        self.nodes = [KafkaNode(self, i, self.directory / f"node-{i}", heap) for i in range(1, nodes + 1)]
        self.cluster_id = _kafka_uuid()

    # addresses

    @property
    def bootstrap(self) -> str:
        return self.bootstrap_for("PLAINTEXT")

    def bootstrap_for(self, listener: str) -> str:
        return ",".join(node.listener(listener) for node in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no Kafka node {node_id} (nodes {[n.node_id for n in self.nodes]})")

    def client_security(self, listener: str, mechanism: str = "SCRAM-SHA-512", user: str = "alice",
                        password: str = "alice-secret", **kwargs: bool) -> dict[str, str]:
        return client_security(listener, self.tls, mechanism, user, password, **kwargs)

    def client_config(self, listener: str = "PLAINTEXT", **kwargs) -> dict[str, str]:
        """bootstrap.servers for `listener` plus client_security(listener, ...)."""
        return {"bootstrap.servers": self.bootstrap_for(listener), **self.client_security(listener, **kwargs)}

    # lifecycle

    def start(self, timeout: float | None = None) -> KafkaCluster:
        """Pick ports, format, start every node and wait until each lists all of them."""
        timeout = timeout or self.start_timeout
        for attempt in range(1, PORT_ATTEMPTS + 1):
            ports = _free_ports(len(self.nodes) * (len(CLIENT_LISTENERS) + len(INTERNAL_LISTENERS)))
            names = (*CLIENT_LISTENERS, *INTERNAL_LISTENERS)
            for node in self.nodes:
                node.ports = {name: ports.pop() for name in names}
            for node in self.nodes:
                node.configure(node.ports)
            with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(lambda n: n.format(self.cluster_id), self.nodes))
            for node in self.nodes:
                node.launch()
            try:
                self.wait_ready(timeout)
                return self
            except KafkaNodeDied as exc:
                self.stop(timeout=10)
                if exc.bind_failure and attempt < PORT_ATTEMPTS:
                    self.cluster_id = _kafka_uuid()
                    continue
                raise
            except BaseException:
                self.stop(timeout=10)
                raise
        raise AssertionError("unreachable")

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until every running node answers Metadata listing every running node."""
        timeout = timeout or self.start_timeout
        deadline = time.monotonic() + timeout
        running = [n for n in self.nodes if n.alive()]
        ids = {n.node_id for n in running}
        for node in running:
            node.wait_registered(max(deadline - time.monotonic(), 1.0), ids)

    def partition_leader(self, topic: str, partition: int = 0, timeout: float = 30.0,
                         exclude: Iterable[int] = ()) -> int:
        """The leader of a partition as Metadata from a running node reports it (not one of `exclude`)."""
        from confluent_kafka.admin import AdminClient

        excluded = set(exclude)
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            for node in self.nodes:
                if not node.alive():
                    continue
                admin = AdminClient({"bootstrap.servers": node.bootstrap, "logger": _quiet_logger()})
                try:
                    meta = admin.list_topics(topic, timeout=5)
                except Exception as exc:  # noqa: BLE001 - any failure means: ask again
                    last = exc
                    continue
                part = meta.topics.get(topic) and meta.topics[topic].partitions.get(partition)
                if part is not None and part.leader >= 0 and part.leader not in excluded:
                    return part.leader
                last = part
            time.sleep(0.3)
        raise TimeoutError(f"no leader for {topic}[{partition}] outside {sorted(excluded)} in {timeout} s "
                           f"(last: {last!r})")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every running node at once, wait; SIGKILL whatever is left after `timeout`."""
        running = [n for n in self.nodes if n.alive()]
        for node in running:
            node._signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in running:
            node.stop(max(deadline - time.monotonic(), 0.1))
        for node in self.nodes:
            if node.proc is not None:   # exited on its own: reap
                node.kill()

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
