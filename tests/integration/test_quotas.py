"""Client quotas (KIP-13/124/546) and connection limits on a real broker: DescribeClientQuotas and
AlterClientQuotas over the wire and through Kafka's kafka-configs, producer_byte_rate and consumer_byte_rate
enforced on librdkafka clients (throttle_time_ms in the answers, the connection muted), a default user quota,
quotas after a SIGKILL, max.connections.per.ip and max.connection.creation.rate.

Rates are measured over a few seconds with quota.window.num=2: with Kafka's default of 11 one-second samples a
fresh client may move ten seconds' worth of its quota at once (Kafka's Rate counts at least samples - 1 whole
windows) and then nothing, which a five-second measurement cannot tell from a broken quota. The upper bound is the
claim (a broker that did not throttle moves many times the quota); the lower bound only says the client was not
starved, and is generous so that a loaded machine does not fail it.
"""

from __future__ import annotations

import bisect
import socket
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.admin import AlterClientQuotasRequest, DescribeClientQuotasRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from tests.integration.helpers import create_topic, metric, scrape
from tests.support.broker import BrokerProcess
from tests.support.kafka_tools import KafkaUnavailable, kafka_tool
from tests.support.wire import Wire, sasl_plain_wire

NONE, INVALID_REQUEST, UNSUPPORTED_VERSION = 0, 42, 35
QUOTA = 200_000  # bytes a second
CONFIG_COMMAND = "org.apache.kafka.tools.ConfigCommand"  # kafka-configs.sh


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = BrokerProcess(tmp_path_factory.mktemp("quotas") / "data", {"quota.window.num": 2}, metrics=True).start()
    yield proc
    if proc.alive():
        proc.stop()


# -- the two APIs, raw ----------------------------------------------------------------------------------------------------
def alter(wire: Wire, *entries: tuple[dict[str, str | None], dict[str, float | None]], validate_only: bool = False,
          version: int = 1) -> dict[tuple, tuple[int, str | None]]:
    """AlterClientQuotas of (entity, {key: value, or None to remove}) entries: {entity pairs: (error, message)}."""
    cls = AlterClientQuotasRequest[version]
    entry = cls.EntryData
    request = cls(entries=[entry(entity=[entry.EntityData(entity_type=t, entity_name=n) for t, n in entity.items()],
                                 ops=[entry.OpData(key=k, value=0.0 if v is None else float(v), remove=v is None)
                                      for k, v in ops.items()])
                           for entity, ops in entries], validate_only=validate_only)
    answer = wire.request(request, version)
    return {tuple((e.entity_type, e.entity_name) for e in r.entity): (r.error_code, r.error_message)
            for r in answer.entries}


def describe(wire: Wire, *components: tuple[str, int, str | None], strict: bool = False,
             version: int = 1) -> Any:
    """DescribeClientQuotas: {entity pairs (sorted): {key: value}}, or (error, message)."""
    cls = DescribeClientQuotasRequest[version]
    answer = wire.request(cls(components=[cls.ComponentData(entity_type=t, match_type=m, match=n)
                                          for t, m, n in components], strict=strict), version)
    if answer.error_code:
        assert answer.entries is None
        return answer.error_code, answer.error_message
    return {tuple(sorted((e.entity_type, e.entity_name) for e in entry.entity)): {v.key: v.value for v in entry.values}
            for entry in answer.entries}


def test_alter_and_describe_client_quotas(broker):
    with Wire(broker.bootstrap) as w:
        versions = {k: (lo, hi) for k, lo, hi in
                    ((a.api_key, a.min_version, a.max_version) for a in w.request(ApiVersionsRequest[3](
                        client_software_name="t", client_software_version="1"), 3).api_keys)}
        assert versions[48] == (0, 1) and versions[49] == (0, 1)
        assert alter(w, ({"user": "wire-alice"}, {"producer_byte_rate": 1e6, "consumer_byte_rate": 2e6}),
                     ({"user": "wire-alice", "client-id": None}, {"consumer_byte_rate": 3e6}),
                     ({"client-id": "wire-app"}, {"producer_byte_rate": 4e6}), version=0) == {
            (("user", "wire-alice"),): (NONE, None), (("user", "wire-alice"), ("client-id", None)): (NONE, None),
            (("client-id", "wire-app"),): (NONE, None)}
        # validate_only stores nothing
        assert alter(w, ({"user": "wire-bob"}, {"producer_byte_rate": 5.0}), validate_only=True) == {
            (("user", "wire-bob"),): (NONE, None)}
        assert describe(w, ("user", 0, "wire-bob")) == {}
        assert describe(w, ("user", 0, "wire-alice"), strict=True) == {
            (("user", "wire-alice"),): {"producer_byte_rate": 1e6, "consumer_byte_rate": 2e6}}
        assert describe(w, ("user", 0, "wire-alice"), ("client-id", 1, None), version=0) == {
            (("client-id", None), ("user", "wire-alice")): {"consumer_byte_rate": 3e6}}
        assert (("client-id", "wire-app"),) in describe(w, ("client-id", 2, None), strict=True)
        # removal, and a key oncelog does not enforce: refused, not stored
        results = alter(w, ({"user": "wire-alice"}, {"consumer_byte_rate": None}),
                        ({"client-id": "wire-app"}, {"controller_mutation_rate": 50.0}),
                        ({"user": "wire-bob", "ip": "127.0.0.1"}, {"producer_byte_rate": 1.0}))
        assert results[(("user", "wire-alice"),)] == (NONE, None)
        code, message = results[(("client-id", "wire-app"),)]
        assert code == INVALID_REQUEST and message.startswith("oncelog does not enforce controller_mutation_rate yet")
        assert results[(("user", "wire-bob"), ("ip", "127.0.0.1"))][0] == INVALID_REQUEST
        assert describe(w, ("user", 0, "wire-alice"), strict=True) == {
            (("user", "wire-alice"),): {"producer_byte_rate": 1e6}}
        assert describe(w, ("client-id", 0, "wire-app"))[(("client-id", "wire-app"),)] == {"producer_byte_rate": 4e6}
        # filter errors are the answer's, not the connection's
        assert describe(w, ("group", 0, "g")) == (UNSUPPORTED_VERSION, "Unsupported entity type group")
        assert describe(w, ("user", 0, None)) == (
            INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT, but set match string to null.")
        # clean up: the module's other tests share the broker
        alter(w, ({"user": "wire-alice"}, {"producer_byte_rate": None}),
              ({"user": "wire-alice", "client-id": None}, {"consumer_byte_rate": None}),
              ({"client-id": "wire-app"}, {"producer_byte_rate": None}))
        assert not [e for e in describe(w) if any(name and name.startswith("wire-") for _, name in e)]


# -- enforcement --------------------------------------------------------------------------------------------------------------
def bytes_per_second(marks: list[tuple[float, int]], start: float, end: float) -> float:
    """The rate between two moments of a (seconds since start, bytes so far) series."""
    times = [t for t, _ in marks]

    def at(t: float) -> int:
        return marks[min(bisect.bisect_left(times, t), len(marks) - 1)][1]

    return (at(end) - at(start)) / (end - start)


def test_producer_byte_rate_holds_a_producer_to_its_quota(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    with Wire(broker.bootstrap) as w:
        assert alter(w, ({"client-id": "quota-producer"}, {"producer_byte_rate": QUOTA}))[
            (("client-id", "quota-producer"),)] == (NONE, None)
    throttles: list[float] = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "client.id": "quota-producer", "linger.ms": 5,
                         "batch.size": 16384, "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    acked = [0]

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            acked[0] += len(msg.value())

    payload = b"p" * 10_000
    marks: list[tuple[float, int]] = []
    started = time.monotonic()
    while time.monotonic() - started < 7:
        try:
            producer.produce(topic_name, payload, on_delivery=delivered)
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)
        marks.append((time.monotonic() - started, acked[0]))
    producer.purge()
    producer.flush(30)
    rate = bytes_per_second(marks, 1.5, 6.5)  # after the first second's allowance
    assert 0.4 * QUOTA < rate <= 1.2 * QUOTA, rate
    assert any(t > 0 for t in throttles)  # librdkafka saw throttle_time_ms in the answers
    samples = scrape(broker.metrics_port)
    assert metric(samples, "oncelog_throttle_time_ms_count", quota_type="Produce", user="",
                  client_id="quota-producer") > 0


def test_consumer_byte_rate_holds_a_consumer_to_its_quota(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    filler = Producer({"bootstrap.servers": broker.bootstrap, "client.id": "filler", "batch.size": 16384,
                       "linger.ms": 5})
    for _ in range(250):
        filler.produce(topic_name, b"c" * 10_000)
        filler.poll(0)
    assert filler.flush(60) == 0
    with Wire(broker.bootstrap) as w:
        alter(w, ({"client-id": "quota-consumer"}, {"consumer_byte_rate": QUOTA}))
    throttles: list[float] = []
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "client.id": "quota-consumer", "group.id": "q",
                         "enable.auto.commit": False, "fetch.max.bytes": 65536, "message.max.bytes": 65536,
                         "max.partition.fetch.bytes": 65536,
                         "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    try:
        consumer.assign([TopicPartition(topic_name, 0, 0)])
        got, marks, started = 0, [], time.monotonic()
        while time.monotonic() - started < 7:
            for message in consumer.consume(100, 0.05):
                if not message.error():
                    got += len(message.value())
            marks.append((time.monotonic() - started, got))
    finally:
        consumer.close()
    rate = bytes_per_second(marks, 1.5, 6.5)
    assert 0.4 * QUOTA < rate <= 1.2 * QUOTA, rate
    assert any(t > 0 for t in throttles)
    samples = scrape(broker.metrics_port)
    assert metric(samples, "oncelog_throttle_time_ms_count", quota_type="Fetch", user="",
                  client_id="quota-consumer") > 0


def _metadata_rate(bootstrap: str, client_id: str, seconds: float) -> tuple[float, list[int]]:
    """Metadata requests one after the other for `seconds`: (requests a second, the throttle times answered)."""
    throttles: list[int] = []
    with Wire(bootstrap, client_id=client_id) as w:
        count, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            throttles.append(w.request(MetadataRequest[9](topics=None, allow_auto_topic_creation=False,
                                                          include_cluster_authorized_operations=False,
                                                          include_topic_authorized_operations=False),
                                        9).throttle_time_ms)
            count += 1
        return count / (time.monotonic() - started), throttles


def test_request_percentage_bounds_a_clients_time_on_the_loop(broker, topic_name):
    """KIP-124: request_percentage=2 lets client id "busy" hold the event loop 20 ms a second. Its answers carry
    throttle_time_ms and its connection is muted for it, so its request rate drops far below an unlimited
    client's; librdkafka reports the throttle too; the quota's removal lifts it."""
    create_topic(broker.bootstrap, topic_name)
    free_rate, free_throttles = _metadata_rate(broker.bootstrap, "free", 2)
    assert set(free_throttles) == {0}
    with Wire(broker.bootstrap) as w:
        assert alter(w, ({"client-id": "busy"}, {"request_percentage": 2.0}),
                     ({"client-id": "busy-producer"}, {"request_percentage": 1.0})) == {
            (("client-id", "busy"),): (NONE, None), (("client-id", "busy-producer"),): (NONE, None)}
    try:
        busy_rate, busy_throttles = _metadata_rate(broker.bootstrap, "busy", 4)
        assert any(t > 0 for t in busy_throttles) and max(busy_throttles) <= 1000  # at most one window
        assert busy_rate < free_rate / 4, (busy_rate, free_rate)
        # meanwhile others are not held back
        again_rate, _ = _metadata_rate(broker.bootstrap, "free", 1)
        assert again_rate > 2 * busy_rate, (again_rate, busy_rate)
        throttled: list[float] = []
        producer = Producer({"bootstrap.servers": broker.bootstrap, "client.id": "busy-producer", "linger.ms": 0,
                             "throttle_cb": lambda event: throttled.append(event.throttle_time)})
        started = time.monotonic()
        while time.monotonic() - started < 3:
            producer.produce(topic_name, b"r" * 100)
            producer.poll(0.001)
        assert producer.flush(30) == 0
        assert any(t > 0 for t in throttled)
        samples = scrape(broker.metrics_port)
        assert metric(samples, "oncelog_throttle_time_ms_count", quota_type="Request", user="",
                      client_id="busy") > 0
    finally:
        with Wire(broker.bootstrap) as w:
            alter(w, ({"client-id": "busy"}, {"request_percentage": None}),
                  ({"client-id": "busy-producer"}, {"request_percentage": None}))
    lifted_rate, lifted_throttles = _metadata_rate(broker.bootstrap, "busy", 1.5)
    assert set(lifted_throttles[len(lifted_throttles) // 2:]) == {0} and lifted_rate > 2 * busy_rate


USERS = ("admin", "alice", "bob")


def test_a_default_user_quota_applies_to_a_user_without_its_own(tmp_path):
    plain = " ".join(f'user_{u}="{u}-secret"' for u in USERS)
    settings = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain};",
                "quota.window.num": 2}
    with BrokerProcess(tmp_path / "data", settings, metrics=True) as proc:
        bootstrap = proc.listener("SASL_PLAINTEXT")
        with sasl_plain_wire(bootstrap, "admin", "admin-secret") as w:
            assert set(alter(w, ({"user": "alice"}, {"producer_byte_rate": 1e9}),
                             ({"user": None}, {"producer_byte_rate": 20_000}), version=0).values()) == {(NONE, None)}

        def produce_as(user: str) -> list[float]:
            throttles: list[float] = []
            producer = Producer({"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                                 "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": f"{user}-secret",
                                 "batch.size": 16384, "linger.ms": 5,
                                 "throttle_cb": lambda event: throttles.append(event.throttle_time)})
            for _ in range(8):
                producer.produce("default-quota", b"d" * 10_000)
            deadline = time.monotonic() + 60
            while producer.flush(0.2) and not any(t > 0 for t in throttles) and time.monotonic() < deadline:
                pass
            producer.purge()
            producer.flush(30)
            return throttles

        assert any(t > 0 for t in produce_as("bob"))  # 80 KB against the default's 20 KB/s
        assert not any(t > 0 for t in produce_as("alice"))  # her own quota wins over the default
        samples = scrape(proc.metrics_port)
        assert metric(samples, "oncelog_throttle_time_ms_count", quota_type="Produce", user="bob", client_id="") > 0
        assert metric(samples, "oncelog_throttle_time_ms_count", quota_type="Produce", user="alice",
                      client_id="") == 0


def test_quotas_survive_a_sigkill(tmp_path):
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        with Wire(proc.bootstrap) as w:
            alter(w, ({"user": None, "client-id": None}, {"consumer_byte_rate": 1234}),
                  ({"client-id": "survivor"}, {"producer_byte_rate": 1000}))
        proc.kill()
        proc.start()
        with Wire(proc.bootstrap) as w:
            assert describe(w) == {(("client-id", None), ("user", None)): {"consumer_byte_rate": 1234.0},
                                   (("client-id", "survivor"),): {"producer_byte_rate": 1000.0}}
        # and enforced again: 50 KB against 1000 B/s
        throttles: list[float] = []
        producer = Producer({"bootstrap.servers": proc.bootstrap, "client.id": "survivor", "batch.size": 16384,
                             "throttle_cb": lambda event: throttles.append(event.throttle_time)})
        for _ in range(5):
            producer.produce("survivor", b"s" * 10_000)
        deadline = time.monotonic() + 60
        while producer.flush(0.2) and not any(t > 0 for t in throttles) and time.monotonic() < deadline:
            pass
        producer.purge()
        producer.flush(30)
        assert any(t > 0 for t in throttles)
    finally:
        if proc.alive():
            proc.stop()


# -- connection limits --------------------------------------------------------------------------------------------------------
def answers(wire: Wire) -> bool:
    try:
        return wire.request(ApiVersionsRequest[0](), 0).error_code == NONE
    except (ConnectionError, OSError):
        return False


def closed(sock: socket.socket, timeout: float = 10) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return False


def test_max_connections_per_ip_refuses_the_extra_connection(tmp_path):
    with BrokerProcess(tmp_path / "data", {"max.connections.per.ip": 2}) as proc:
        first, second = Wire(proc.bootstrap), Wire(proc.bootstrap)
        try:
            assert answers(first) and answers(second)
            third = socket.create_connection(("127.0.0.1", proc.port))
            assert closed(third)
            third.close()
            assert answers(first) and answers(second)  # the others work on
            first.close()
            deadline = time.monotonic() + 15
            while True:  # the broker counts the closed one out once it sees it closed
                with Wire(proc.bootstrap, timeout=5) as again:
                    if answers(again):
                        break
                assert time.monotonic() < deadline, "no connection admitted after one closed"
                time.sleep(0.1)
        finally:
            first.close()
            second.close()
        assert "Rejected connection from 127.0.0.1, address already has the configured maximum of 2 connections." \
            in proc.log_tail(200)


def test_max_connections_per_ip_overrides(tmp_path):
    settings = {"max.connections.per.ip": 0, "max.connections.per.ip.overrides": "127.0.0.1:1"}
    with BrokerProcess(tmp_path / "data", settings) as proc, Wire(proc.bootstrap) as first:
        assert answers(first)
        second = socket.create_connection(("127.0.0.1", proc.port))
        assert closed(second)
        second.close()
        assert answers(first)


def test_max_connection_creation_rate_delays_connections(tmp_path):
    """12 connections at once against 4 a second: the first second's allowance goes at once, the others are read
    one after another, 250 ms apart, as behind Kafka's blocked acceptor; none is refused."""
    with BrokerProcess(tmp_path / "data", {"max.connection.creation.rate": 4, "quota.window.num": 2},
                       metrics=True) as proc:
        started = time.monotonic()
        wires = [Wire(proc.bootstrap) for _ in range(12)]
        try:
            assert all(answers(w) for w in wires)
            elapsed = time.monotonic() - started
        finally:
            for w in wires:
                w.close()
        assert elapsed >= 1.0, elapsed  # eight waited 250 ms each behind the one before
        samples = scrape(proc.metrics_port)
        assert metric(samples, "oncelog_connection_accept_throttle_time_ms_count", listener="PLAINTEXT") >= 7


# -- Kafka's kafka-configs ----------------------------------------------------------------------------------------------------
def configs(bootstrap: str, *args: str, check: bool = True) -> Any:
    try:
        return kafka_tool(CONFIG_COMMAND, "--bootstrap-server", bootstrap, *args, check=check)
    except KafkaUnavailable as exc:
        pytest.skip(str(exc))


def test_kafka_configs_alters_and_describes_quotas(broker):
    bs = broker.bootstrap
    alice = ("--entity-type", "users", "--entity-name", "tool-alice")
    default_client = ("--entity-type", "clients", "--entity-default")
    try:
        assert configs(bs, *alice, "--alter", "--add-config",
                       "producer_byte_rate=1024,consumer_byte_rate=2048").lines() == [
            "Completed updating config for user tool-alice."]
        configs(bs, *alice, "--entity-type", "clients", "--entity-name", "tool-app", "--alter", "--add-config",
                "consumer_byte_rate=512")
        # (the default applies to every client of the module's broker without a quota of its own: 1 GiB/s holds
        # nobody back)
        assert configs(bs, *default_client, "--alter", "--add-config", "producer_byte_rate=1073741824").lines() == [
            "Completed updating default config for clients in the cluster."]
        configs(bs, *alice, "--alter", "--delete-config", "consumer_byte_rate")
        assert configs(bs, *alice, "--describe").lines() == [
            "Quota configs for user-principal 'tool-alice' are producer_byte_rate=1024.0"]
        assert configs(bs, *default_client, "--describe").lines() == [
            "Quota configs for the default client-id are producer_byte_rate=1.073741824E9"]
        with Wire(bs) as w:
            assert describe(w, ("user", 0, "tool-alice"), ("client-id", 0, "tool-app")) == {
                (("client-id", "tool-app"), ("user", "tool-alice")): {"consumer_byte_rate": 512.0}}
        refused = configs(bs, *alice, "--alter", "--add-config", "controller_mutation_rate=50", check=False)
        assert refused.returncode != 0
        assert "oncelog does not enforce controller_mutation_rate yet" in refused.stdout + refused.stderr
    finally:
        with Wire(bs) as w:  # the module's other tests share the broker
            alter(w, ({"user": "tool-alice"}, {"producer_byte_rate": None, "consumer_byte_rate": None}),
                  ({"user": "tool-alice", "client-id": "tool-app"}, {"consumer_byte_rate": None}),
                  ({"client-id": None}, {"producer_byte_rate": None}))
