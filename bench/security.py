"""What security costs, oncelog beside Apache Kafka 4.4 on the same machine (issue 23, docs/security.md §8 step 7).

Three parts, each run for each system (`--systems`), on loopback, with a fresh broker per run; every figure is
the median of `--runs`, and systems (and listeners) alternate with their order flipped every round, so page
cache and CPU frequency drift hit both alike.

throughput   One broker with PLAINTEXT, SSL and SASL_SSL listeners (oncelog: tests/support/secured_broker.py,
             Kafka: tests/support/kafka.py, one KRaft node; the same trustme CA). Per listener a fresh topic of 4
             partitions; confluent-kafka (librdkafka) produces `--mb` MiB of 1 KiB records (idempotent, acks=all,
             linger 5 ms, 1 MB batches), then one assigned consumer reads them all back; SASL_SSL logs in
             with SCRAM-SHA-512. Before each measured produce, 4 MiB go unmeasured to another topic over the
             same listener (JIT, coordinators warm). MB/s = record bytes / time; "broker CPU s/GiB" is the
             broker process's user+system CPU (/proc/<pid>/stat, 10 ms ticks: coarse for a small --mb) while
             producing, per GiB produced.
             READ THIS AS: the ratio in parentheses, each listener / the same system's PLAINTEXT. The goal is
             oncelog's ratio for SSL and SASL_SSL no lower than Kafka's (its TLS cost, as a share, no higher).
             Absolute MB/s of the two systems are not the point (oncelog fsyncs by default, Kafka does not:
             `--no-fsync` turns oncelog's off). The consumer is a per-message Python loop and can be client-bound.

connections  New authenticated connections per second, with a client of this file (ssl + socket + scramp's
             ScramClient + kafka-python's request classes), `--connections` in all from 4 threads, after a
             warm-up of a tenth as many. Each connection: TCP connect, [TLS handshake], SaslHandshake v1,
             SaslAuthenticate v2 (PLAIN: one round; SCRAM-SHA-512: two), one ApiVersions v3, close. Kinds:
             SASL_SSL SCRAM-SHA-512, SASL_PLAINTEXT PLAIN, and PLAINTEXT (ApiVersions only) as the baseline.
             The client's own work (the TLS handshake, SCRAM's PBKDF2 of 4096 iterations) shares the 2 cores
             with the broker; "broker CPU ms/conn" is the broker's part alone, the figure to compare.

authorizer   One broker with a SASL_PLAINTEXT listener, users admin (super user), alice, bob (PLAIN,
             "<name>-secret"; oncelog: tests/support/acl_broker.py's settings). alice produces `--mb` MiB as
             above (a) with no authorizer, (b) with StandardAuthorizer on and `--acls` ACLs, loaded by admin
             through CreateAcls in batches of 500: alice's WRITE and DESCRIBE on the topic; 1% other principals'
             ACLs on the topic itself or on prefixes of its name (the authorizer has to look at them on every
             check); the rest other principals' LITERAL (60%) and PREFIXED (40%) ACLs on other topics. Then
             bob (no ACLs) must be refused the topic's metadata, and alice produces 4 MiB unmeasured first.
             READ THIS AS: (b)/(a) of MB/s and of broker CPU s/GiB: what authorization costs per byte.
             Kafka's controller listener is PLAINTEXT, so User:ANONYMOUS is a super user there as well.

Run:    .venv/bin/python bench/security.py [--mb 256] [--runs 3] [--systems oncelog,kafka]
                                           [--parts throughput,connections,authorizer] [--quick]
Prints tables and writes bench/results/security-<date>.json (every run's figures, and the medians). A part that
fails for a system is reported with the error and the broker's log tail, the others go on; the exit code is 1.
Kafka needs java 17+ and its jars (resolved by Maven once, see tests/support/kafka.py); without them it is
skipped with the reason.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import socket
import ssl
import statistics
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from scramp import ScramClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
from bench.produce_fetch import cpu_seconds  # noqa: E402
from tests.support.acl_broker import acl_settings  # noqa: E402
from tests.support.kafka import (  # noqa: E402
    KafkaCluster,
    KafkaUnavailable,
    TlsMaterial,
    java_executable,
    kafka_classpath,
)
from tests.support.secured_broker import SecuredBroker, add_scram_users  # noqa: E402

from oncelog.embedded import BrokerProcess  # noqa: E402

SYSTEMS = ("oncelog", "kafka")
PARTS = ("throughput", "connections", "authorizer")
LISTENERS = ("PLAINTEXT", "SSL", "SASL_SSL")
CONNECTION_KINDS = ("PLAINTEXT", "SASL_PLAINTEXT/PLAIN", "SASL_SSL/SCRAM-SHA-512")
RECORD = 1024
PARTITIONS = 4
THREADS = 4
ACL_BATCH = 500
USER, PASSWORD = "alice", "alice-secret"      # tests/support/kafka.py's DEFAULT_USERS, both systems
ACL_USERS = {name: f"{name}-secret" for name in ("admin", "alice", "bob")}
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
PRODUCER_SETTINGS = {"acks": "all", "enable.idempotence": True, "linger.ms": 5, "batch.size": 1_000_000,
                     "queue.buffering.max.kbytes": 1_048_576, "queue.buffering.max.messages": 1_000_000}
WARMUP_RECORDS = 4096         # 4 MiB produced (not measured) before each measured produce: JIT, coordinators
PRODUCE_DEADLINE_S = 600
CONSUME_DEADLINE_S = 600


# -- the brokers ----------------------------------------------------------------------------------------------


@dataclass
class Setup:
    """What every broker of this invocation shares."""

    tls: TlsMaterial
    fsync: bool
    java: str | None = None
    classpath: str | None = None


class Broker:
    """A started broker of either system: its process id, its listeners, its log, stop()."""

    def __init__(self, system: str, handle: Any) -> None:
        self.system = system
        self.handle = handle      # SecuredBroker, BrokerProcess or KafkaCluster

    @property
    def pid(self) -> int:
        if isinstance(self.handle, KafkaCluster):
            return self.handle.nodes[0].pid
        process = self.handle.process if isinstance(self.handle, SecuredBroker) else self.handle
        return process.proc.pid

    def address(self, listener: str) -> str:
        if isinstance(self.handle, BrokerProcess):
            return self.handle.listener(listener)
        return self.handle.bootstrap_for(listener)

    def log_tail(self, lines: int = 40) -> str:
        if isinstance(self.handle, KafkaCluster):
            return self.handle.nodes[0].log_tail(lines)
        process = self.handle.process if isinstance(self.handle, SecuredBroker) else self.handle
        return process.log_tail(lines)

    def stop(self) -> None:
        self.handle.stop()


def start_secured(system: str, directory: Path, setup: Setup) -> Broker:
    """PLAINTEXT, SSL, SASL_SSL and SASL_PLAINTEXT listeners; alice with PLAIN and SCRAM-SHA-256/512."""
    if system == "kafka":
        cluster = KafkaCluster(directory, java=setup.java, classpath=setup.classpath, tls=setup.tls)
        return Broker(system, cluster.start())
    # As Kafka does for a SASL_SSL listener without a listener-prefixed ssl.client.auth: no certificate request.
    settings = {"listener.name.sasl_ssl.ssl.client.auth": "none"}
    if not setup.fsync:
        settings["oncelog.fsync.enable"] = "false"
    broker = SecuredBroker(directory, setup.tls, settings)
    broker.process.start(timeout=60)
    add_scram_users(broker.bootstrap, broker.users)
    return Broker(system, broker)


def start_sasl(system: str, directory: Path, setup: Setup, authorizer: bool) -> Broker:
    """A SASL_PLAINTEXT listener with PLAIN users admin, alice, bob; StandardAuthorizer with `authorizer`."""
    if system == "kafka":
        settings = {"authorizer.class.name": AUTHORIZER, "super.users": "User:admin;User:ANONYMOUS"} if authorizer else {}
        cluster = KafkaCluster(directory, settings=settings, java=setup.java, classpath=setup.classpath,
                               tls=setup.tls, users=ACL_USERS)
        return Broker(system, cluster.start())
    settings = acl_settings(tuple(ACL_USERS))
    if not authorizer:
        del settings["authorizer.class.name"], settings["super.users"]
    if not setup.fsync:
        settings["oncelog.fsync.enable"] = "false"
    return Broker(system, BrokerProcess(directory / "data", settings).start(timeout=60))


def plain_client(address: str, user: str) -> dict[str, str]:
    return {"bootstrap.servers": address, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": ACL_USERS[user]}


def create_topic(conf: dict[str, str], topic: str) -> None:
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)


# -- produce and consume --------------------------------------------------------------------------------------


def produce(conf: dict[str, str], topic: str, count: int, pid: int) -> dict:
    """`count` 1 KiB records round-robin over the partitions; MB/s and the broker's CPU seconds per GiB."""
    producer = Producer({**conf, **PRODUCER_SETTINGS})
    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))

    value = b"x" * RECORD
    cpu_before = cpu_seconds(pid)
    started = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.005)
        if i % 1000 == 0:
            producer.poll(0)
    undelivered = producer.flush(PRODUCE_DEADLINE_S)
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(pid) - cpu_before
    if errors or undelivered:
        raise RuntimeError(f"produce to {topic}: {len(errors)} delivery errors (first: {errors[:1]}), "
                           f"{undelivered} undelivered after {PRODUCE_DEADLINE_S} s")
    return {"records": count, "seconds": elapsed, "mb_per_s": count * RECORD / elapsed / 1e6,
            "broker_cpu_s": cpu, "broker_cpu_s_per_gib": cpu / (count * RECORD / (1 << 30))}


def consume(conf: dict[str, str], topic: str, count: int) -> dict:
    """One consumer, the partitions assigned from offset 0, until `count` records have been read."""
    consumer = Consumer({**conf, "group.id": f"bench-security-{time.monotonic_ns()}", "enable.auto.commit": False,
                         "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
                         "queued.max.messages.kbytes": 1_048_576})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen, nbytes, errors = 0, 0, []
    started = time.perf_counter()
    deadline = started + CONSUME_DEADLINE_S
    try:
        while seen < count and time.perf_counter() < deadline:
            # never more than what is left: the last call returns with it instead of waiting out the timeout
            for msg in consumer.consume(min(10000, count - seen), 1.0):
                if msg.error() is None:
                    seen += 1
                    nbytes += len(msg.value())
                elif len(errors) < 3:
                    errors.append(str(msg.error()))
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    if seen < count:
        raise RuntimeError(f"consume {topic}: read {seen} of {count} records in {CONSUME_DEADLINE_S} s "
                           f"(errors: {errors})")
    return {"records": seen, "seconds": elapsed, "mb_per_s": nbytes / elapsed / 1e6}


# -- part 1: throughput per listener ---------------------------------------------------------------------------


def throughput(broker: Broker, count: int, listeners: tuple[str, ...]) -> dict[str, dict]:
    out = {}
    for listener in listeners:
        topic = f"bench-{listener.lower()}"
        conf = broker.handle.client_config(listener, mechanism="SCRAM-SHA-512")
        admin = {"bootstrap.servers": broker.address("PLAINTEXT")}
        create_topic(admin, topic)
        create_topic(admin, f"warmup-{listener.lower()}")
        produce(conf, f"warmup-{listener.lower()}", min(count, WARMUP_RECORDS), broker.pid)
        p = produce(conf, topic, count, broker.pid)
        c = consume(conf, topic, count)
        out[listener] = {"produce": p, "consume": c}
        print(f"    {listener:<16} produce {p['mb_per_s']:7.1f} MB/s ({p['broker_cpu_s_per_gib']:6.1f} broker CPU "
              f"s/GiB)   consume {c['mb_per_s']:7.1f} MB/s", flush=True)
    return out


# -- part 2: new authenticated connections per second -----------------------------------------------------------


class KafkaConnection:
    """One socket (plain or TLS) speaking just enough of the protocol to log in and ask ApiVersions."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.correlation = 0

    def request(self, message: Any, version: int, response_cls: type) -> Any:
        self.correlation += 1
        message.with_header(correlation_id=self.correlation, client_id="bench-security")
        self.sock.sendall(bytes(message.encode(version=version, header=True, framed=True)))
        frame = self._recv(struct.unpack(">i", self._recv(4))[0])
        if struct.unpack_from(">i", frame)[0] != self.correlation:
            raise ConnectionError(f"correlation id {struct.unpack_from('>i', frame)[0]}, sent {self.correlation}")
        # Response header v1 (a tag buffer after the correlation id) for flexible versions, except ApiVersions,
        # whose response header is always v0. The brokers send no tags: the buffer is one zero byte.
        flexible = response_cls.flexible_version_q(version) and response_cls is not ApiVersionsResponse
        return response_cls.decode(frame[5 if flexible else 4:], version=version)

    def _recv(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def authenticate(self, mechanism: str, user: str, password: str) -> None:
        handshake = self.request(SaslHandshakeRequest[1](mechanism=mechanism), 1, SaslHandshakeResponse)
        if handshake.error_code:
            raise ConnectionError(f"SaslHandshake {mechanism}: error {handshake.error_code} "
                                  f"(enabled: {handshake.mechanisms})")
        if mechanism == "PLAIN":
            self._sasl(f"\0{user}\0{password}".encode())
            return
        scram = ScramClient([mechanism], user, password)
        scram.set_server_first(self._sasl(scram.get_client_first().encode()).decode())
        scram.set_server_final(self._sasl(scram.get_client_final().encode()).decode())

    def _sasl(self, auth_bytes: bytes) -> bytes:
        answer = self.request(SaslAuthenticateRequest[2](auth_bytes=auth_bytes), 2, SaslAuthenticateResponse)
        if answer.error_code:
            raise ConnectionError(f"SaslAuthenticate: error {answer.error_code}: {answer.error_message}")
        return answer.auth_bytes

    def api_versions(self) -> None:
        answer = self.request(ApiVersionsRequest[3](client_software_name="bench-security",
                                                    client_software_version="1"), 3, ApiVersionsResponse)
        if answer.error_code:
            raise ConnectionError(f"ApiVersions: error {answer.error_code}")


def connect_once(address: str, kind: str, tls: ssl.SSLContext | None) -> None:
    """One connection of `kind` (CONNECTION_KINDS): connect, [TLS], [log in], ApiVersions, close."""
    listener, _, mechanism = kind.partition("/")
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    try:
        if listener == "SASL_SSL":
            sock = tls.wrap_socket(sock, server_hostname=host)
        conn = KafkaConnection(sock)
        if mechanism:
            conn.authenticate(mechanism, USER, PASSWORD)
        conn.api_versions()
    finally:
        sock.close()


def connection_rate(broker: Broker, kind: str, total: int, ca: Path) -> dict:
    """`total` connections of `kind` from THREADS threads (after a warm-up): connections/s, broker CPU each."""
    address = broker.address(kind.partition("/")[0])
    tls = ssl.create_default_context(cafile=str(ca))
    failures: list[str] = []
    latencies: list[float] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for _ in range(n):
            if len(failures) > 10:
                return
            started = time.perf_counter()
            try:
                connect_once(address, kind, tls)
            except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                latencies.append(time.perf_counter() - started)

    def burst(n: int) -> float:
        share = [n // THREADS + (1 if i < n % THREADS else 0) for i in range(THREADS)]
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(worker, share))
        return time.perf_counter() - started

    burst(max(total // 10, THREADS))
    if failures:
        raise RuntimeError(f"{kind}: {len(failures)} failed connections in the warm-up, first: {failures[0]}")
    latencies.clear()
    cpu_before = cpu_seconds(broker.pid)
    elapsed = burst(total)
    cpu = cpu_seconds(broker.pid) - cpu_before
    if failures:
        raise RuntimeError(f"{kind}: {len(failures)} failed connections, first: {failures[0]}")
    latencies.sort()
    return {"connections": total, "seconds": elapsed, "per_s": total / elapsed,
            "p50_ms": latencies[len(latencies) // 2] * 1000, "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
            "broker_cpu_ms_per_conn": cpu * 1000 / total}


def connections(broker: Broker, total: int, ca: Path) -> dict[str, dict]:
    out = {}
    for kind in CONNECTION_KINDS:
        r = connection_rate(broker, kind, total, ca)
        out[kind] = r
        print(f"    {kind:<24} {r['per_s']:7.1f} connections/s   p50 {r['p50_ms']:6.1f} ms   broker CPU "
              f"{r['broker_cpu_ms_per_conn']:5.2f} ms/conn", flush=True)
    return out


# -- part 3: the authorizer -----------------------------------------------------------------------------------


AUTHZ_TOPIC = "bench-acl"


def acl_bindings(total: int, topic: str = AUTHZ_TOPIC, producer: str = "alice") -> list[AclBinding]:
    """`total` distinct ALLOW bindings: the producer's two, 1% on `topic` (or prefixes of it) for other
    principals, the rest other principals' LITERAL (60%) and PREFIXED (40%) ACLs on other topics."""
    topic_acl, allow = ResourceType.TOPIC, AclPermissionType.ALLOW
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    ops = (AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE)
    bindings = [AclBinding(topic_acl, topic, literal, f"User:{producer}", "*", op, allow)
                for op in (AclOperation.WRITE, AclOperation.DESCRIBE)]
    nearby = max(total // 100, 1)
    for i in range(nearby):
        # the topic itself (LITERAL) and its prefixes "b", "be", ..., "bench-ac" (PREFIXED), users of their own
        cut = i % len(topic)
        name, pattern = (topic, literal) if cut == 0 else (topic[:cut], prefixed)
        bindings.append(AclBinding(topic_acl, name, pattern, f"User:near-{i}", "*", ops[i % 3], allow))
    for i in range(total - len(bindings)):
        principal = f"User:user-{i % 250}"
        if i % 10 < 6:
            bindings.append(AclBinding(topic_acl, f"orders-{i}", literal, principal, "*", ops[i % 3], allow))
        else:
            bindings.append(AclBinding(topic_acl, f"team-{i}-", prefixed, principal, "*", ops[i % 3], allow))
    return bindings[:total]


def load_acls(admin_conf: dict[str, str], bindings: list[AclBinding]) -> float:
    """CreateAcls in batches of ACL_BATCH as the super user; waits until DescribeAcls lists them all."""
    admin = AdminClient(admin_conf)   # referenced until every future is answered
    started = time.perf_counter()
    for first in range(0, len(bindings), ACL_BATCH):
        for future in admin.create_acls(bindings[first:first + ACL_BATCH]).values():
            future.result(120)
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                  AclPermissionType.ANY)
    deadline = time.monotonic() + 120
    while True:
        listed = len(admin.describe_acls(everything).result(60))
        if listed >= len(bindings):
            return time.perf_counter() - started
        if time.monotonic() > deadline:
            raise RuntimeError(f"DescribeAcls lists {listed} ACLs of the {len(bindings)} created")
        time.sleep(0.5)


def check_denied(address: str, user: str, topic: str) -> None:
    """The authorizer is really on: `user`, who has no ACL, is not shown `topic`."""
    admin = AdminClient(plain_client(address, user))
    error = admin.list_topics(topic, timeout=30).topics[topic].error
    if error is None or error.code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:
        raise RuntimeError(f"authorizer on, yet {user} without ACLs is answered {error!r} for {topic}")


def authorizer_run(system: str, tmp: Path, setup: Setup, count: int, acls: int, on: bool) -> dict:
    broker = start_sasl(system, tmp / f"{system}-authz-{'on' if on else 'off'}", setup, on)
    try:
        address = broker.address("SASL_PLAINTEXT")
        create_topic(plain_client(address, "admin"), AUTHZ_TOPIC)
        load_s = load_acls(plain_client(address, "admin"), acl_bindings(acls)) if on else None
        if on:
            check_denied(address, "bob", AUTHZ_TOPIC)
        produce(plain_client(address, "alice"), AUTHZ_TOPIC, min(count, WARMUP_RECORDS), broker.pid)
        result = produce(plain_client(address, "alice"), AUTHZ_TOPIC, count, broker.pid)
        result.update({"acls": acls if on else 0, "acl_load_seconds": load_s})
        label = f"on, {acls} ACLs (loaded in {load_s:.1f} s)" if on else "off"
        print(f"    authorizer {label:<32} produce {result['mb_per_s']:7.1f} MB/s "
              f"({result['broker_cpu_s_per_gib']:6.1f} broker CPU s/GiB)", flush=True)
        return result
    except BaseException:
        print(f"--- {system} broker log (authorizer {'on' if on else 'off'}) ---\n{broker.log_tail()}", flush=True)
        raise
    finally:
        broker.stop()


# -- the runs -------------------------------------------------------------------------------------------------


def guarded(failures: list[dict], system: str, part: str, round_no: int, step: Callable[[], Any]) -> Any:
    """Run one part; on failure print and keep the error (the other parts and systems go on)."""
    try:
        return step()
    except Exception as exc:  # noqa: BLE001 - reported at the end, exit code 1
        print(f"  FAILED {system} {part} (round {round_no + 1}): {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()
        failures.append({"system": system, "part": part, "round": round_no + 1,
                         "error": f"{type(exc).__name__}: {exc}"})
        return None


def one_round(system: str, round_no: int, args: argparse.Namespace, setup: Setup, tmp: Path,
              failures: list[dict]) -> dict:
    count = args.mb * 1024 * 1024 // RECORD
    flip = round_no % 2 == 1
    result: dict[str, Any] = {}
    if {"throughput", "connections"} & set(args.parts):
        print(f"  {system}: broker with PLAINTEXT, SSL, SASL_SSL, SASL_PLAINTEXT", flush=True)
        broker = guarded(failures, system, "start", round_no,
                         lambda: start_secured(system, tmp / f"{system}-secured-{round_no}", setup))
        if broker is not None:
            try:
                listeners = LISTENERS[::-1] if flip else LISTENERS
                if "throughput" in args.parts:
                    result["throughput"] = guarded(failures, system, "throughput", round_no,
                                                   lambda: throughput(broker, count, listeners))
                if "connections" in args.parts:
                    result["connections"] = guarded(failures, system, "connections", round_no,
                                                    lambda: connections(broker, args.connections, setup.tls.ca_pem))
                if any(f["system"] == system and f["round"] == round_no + 1 for f in failures):
                    print(f"--- {system} broker log ---\n{broker.log_tail(60)}", flush=True)
            finally:
                broker.stop()
    if "authorizer" in args.parts:
        result["authorizer"] = {}
        for on in ((True, False) if flip else (False, True)):
            name = "on" if on else "off"
            result["authorizer"][name] = guarded(
                failures, system, f"authorizer {name}", round_no,
                lambda on=on: authorizer_run(system, tmp / f"r{round_no}", setup, count, args.acls, on))
    return result


def median(runs: list[dict], *path: str) -> float | None:
    """The median of runs[i][path[0]][path[1]]... over the runs that have it (a failed part has None)."""
    values = []
    for run in runs:
        value: Any = run
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            values.append(value)
    return statistics.median(values) if values else None


def summarize(runs: dict[str, list[dict]]) -> dict:
    summary: dict[str, dict] = {}
    for system, system_runs in runs.items():
        s: dict[str, Any] = {"throughput": {}, "connections": {}, "authorizer": {}}
        for listener in LISTENERS:
            s["throughput"][listener] = {
                f"{direction}_mb_per_s": median(system_runs, "throughput", listener, direction, "mb_per_s")
                for direction in ("produce", "consume")}
            s["throughput"][listener]["broker_cpu_s_per_gib"] = median(
                system_runs, "throughput", listener, "produce", "broker_cpu_s_per_gib")
        base = s["throughput"]["PLAINTEXT"]
        ratios = {"produce_mb_per_s": "produce_ratio", "consume_mb_per_s": "consume_ratio",
                  "broker_cpu_s_per_gib": "broker_cpu_ratio"}
        for listener in LISTENERS:
            row = s["throughput"][listener]
            for key, ratio in ratios.items():
                row[ratio] = row[key] / base[key] if row[key] and base[key] else None
        for kind in CONNECTION_KINDS:
            s["connections"][kind] = {key: median(system_runs, "connections", kind, key)
                                      for key in ("per_s", "p50_ms", "p99_ms", "broker_cpu_ms_per_conn")}
        for name in ("off", "on"):
            s["authorizer"][name] = {key: median(system_runs, "authorizer", name, key)
                                     for key in ("mb_per_s", "broker_cpu_s_per_gib", "acl_load_seconds")}
        summary[system] = s
    return summary


def _cell(value: float | None, fmt: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{fmt}}"


def _ratio(value: float | None) -> str:
    return "(  -  )" if value is None else f"({value:4.2f}x)"


def print_tables(summary: dict, args: argparse.Namespace) -> None:
    if "throughput" in args.parts:
        print(f"\nthroughput: {args.mb} MiB of {RECORD} B records, {PARTITIONS} partitions, idempotent, acks=all, "
              f"linger 5 ms, median of {args.runs}; (x) = / the system's own PLAINTEXT")
        print(f"{'system':<9}{'listener':<12}{'produce MB/s':>20}{'consume MB/s':>20}{'broker CPU s/GiB':>24}")
        for system, s in summary.items():
            for listener in LISTENERS:
                row = s["throughput"][listener]
                print(f"{system:<9}{listener:<12}"
                      f"{_cell(row['produce_mb_per_s'], '.1f', 11)} {_ratio(row['produce_ratio'])}"
                      f"{_cell(row['consume_mb_per_s'], '.1f', 11)} {_ratio(row['consume_ratio'])}"
                      f"{_cell(row['broker_cpu_s_per_gib'], '.1f', 15)} {_ratio(row['broker_cpu_ratio'])}")
        if {"oncelog", "kafka"} <= summary.keys():
            for listener in LISTENERS[1:]:
                for direction in ("produce", "consume"):
                    ours = summary["oncelog"]["throughput"][listener][f"{direction}_ratio"]
                    theirs = summary["kafka"]["throughput"][listener][f"{direction}_ratio"]
                    if ours is not None and theirs is not None:
                        verdict = "goal met" if ours >= theirs else "goal NOT met"
                        print(f"  {listener} {direction}: oncelog keeps {ours:.2f} of its PLAINTEXT, Kafka "
                              f"{theirs:.2f}: {verdict}")
    if "connections" in args.parts:
        print(f"\nnew connections: {args.connections} from {THREADS} threads (client: this file), median of "
              f"{args.runs}")
        print(f"{'system':<9}{'kind':<25}{'conn/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'broker CPU ms/conn':>20}")
        for system, s in summary.items():
            for kind in CONNECTION_KINDS:
                row = s["connections"][kind]
                print(f"{system:<9}{kind:<25}{_cell(row['per_s'], '.1f', 9)}{_cell(row['p50_ms'], '.1f', 9)}"
                      f"{_cell(row['p99_ms'], '.1f', 9)}{_cell(row['broker_cpu_ms_per_conn'], '.2f', 20)}")
    if "authorizer" in args.parts:
        print(f"\nauthorizer: alice produces {args.mb} MiB over SASL_PLAINTEXT PLAIN, median of {args.runs}; "
              f"(x) = / authorizer off")
        print(f"{'system':<9}{'authorizer':<22}{'produce MB/s':>20}{'broker CPU s/GiB':>24}")
        for system, s in summary.items():
            off, on = s["authorizer"]["off"], s["authorizer"]["on"]
            for name, row in (("off", off), (f"on, {args.acls} ACLs", on)):
                mb_ratio = row["mb_per_s"] / off["mb_per_s"] if row["mb_per_s"] and off["mb_per_s"] else None
                cpu = row["broker_cpu_s_per_gib"]
                cpu_ratio = cpu / off["broker_cpu_s_per_gib"] if cpu and off["broker_cpu_s_per_gib"] else None
                print(f"{system:<9}{name:<22}{_cell(row['mb_per_s'], '.1f', 11)} {_ratio(mb_ratio)}"
                      f"{_cell(cpu, '.1f', 15)} {_ratio(cpu_ratio)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="MiB of 1 KiB records per produce")
    parser.add_argument("--runs", type=int, default=3, help="runs per system (a fresh broker each)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of oncelog,kafka")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma list of " + ",".join(PARTS))
    parser.add_argument("--connections", type=int, default=300, help="new connections per kind and run")
    parser.add_argument("--acls", type=int, default=10_000, help="ACLs loaded for the authorizer part")
    parser.add_argument("--no-fsync", action="store_true", help="oncelog.fsync.enable=false (Kafka never fsyncs "
                                                                "per batch by default)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: --mb 4, --runs 1, --connections 40, --acls 1000")
    args = parser.parse_args()
    if args.quick:
        args.mb, args.runs, args.connections, args.acls = 4, 1, 40, 1000
    args.systems = [s for s in args.systems.split(",") if s]
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = (set(args.systems) - set(SYSTEMS)) | (set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown system or part: {sorted(unknown)}")

    failures: list[dict] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp_name:
        tmp = Path(tmp_name)
        setup = Setup(TlsMaterial(tmp / "tls"), fsync=not args.no_fsync)
        if "kafka" in args.systems:
            try:
                setup.java, setup.classpath = java_executable(), kafka_classpath()
            except KafkaUnavailable as exc:
                print(f"kafka skipped: {exc}")
                skipped["kafka"] = str(exc)
                args.systems.remove("kafka")
        runs: dict[str, list[dict]] = {system: [] for system in args.systems}
        for round_no in range(args.runs):
            order = args.systems[::-1] if round_no % 2 else args.systems
            for system in order:
                print(f"round {round_no + 1}/{args.runs}: {system}", flush=True)
                runs[system].append(one_round(system, round_no, args, setup, tmp, failures))

    summary = summarize(runs)
    print_tables(summary, args)
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"security-{time.strftime('%Y%m%d-%H%M%S')}.json"
    settings = {"record_bytes": RECORD, "partitions": PARTITIONS, "producer": PRODUCER_SETTINGS,
                "connection_threads": THREADS, "acl_batch": ACL_BATCH, "oncelog_fsync": setup.fsync}
    out.write_text(json.dumps({"args": vars(args), "settings": settings, "skipped": skipped, "failures": failures,
                               "summary": summary, "runs": runs}, indent=2))
    print(f"\nresults: {out}")
    if failures:
        print(f"{len(failures)} parts FAILED: " + "; ".join(f"{f['system']} {f['part']} round {f['round']}: "
                                                           f"{f['error']}" for f in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
