"""Failovers of a 3-broker cluster (broker processes on ZooKeeper, real clients), measured: a partition leader
SIGKILLed under an idempotent acks=all producer, then every replica serving the whole log in turn; the controller
SIGKILLed while topics are being created through another broker. Long runs: `make cluster-test`.

The numbers (time from the kill to the next acknowledged write, to the next created topic) are printed; the
assertions bound them by the session timeout, which is what a death costs by design (docs/cluster.md §5.3).
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as ConfluentPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import CreateTopicsRequest
from kafka.structs import TopicPartition

from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import (
    SESSION_MS,
    SETTINGS,
    START_S,
    converge_s,
    partitions,
    request,
    wait_for,
)

pytestmark = pytest.mark.cluster_slow

NONE, TOPIC_ALREADY_EXISTS = 0, 36


@pytest.fixture
def cluster(coordination_connect, tmp_path):
    c = ClusterProcess(tmp_path / "cluster", 3, SETTINGS, connect=coordination_connect).start(START_S)
    yield c
    c.kill_all()


def read_all(c: ClusterProcess, topic: str, expected: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    consumer.assign([ConfluentPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + converge_s()
    try:
        while len(got) < expected and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                if m.error() is None:
                    got.append(m.value())
    finally:
        consumer.close()
    return got


def test_leader_sigkill_under_an_idempotent_producer_then_every_replica_serves_the_same_log(cluster):
    c = cluster
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic("kept", 1, 3)], operation_timeout=30)["kept"].result(60)
    victim = partitions(c, "kept")[0].leader_id
    acked: list[tuple[float, bytes]] = []
    errors: list[str] = []
    stop = threading.Event()

    def write() -> None:
        producer = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 2, "message.timeout.ms": int(converge_s() * 1000)})

        def report(err, msg):
            (errors.append(str(err)) if err is not None else acked.append((time.monotonic(), msg.value())))

        i = 0
        while not stop.is_set():
            producer.produce("kept", value=b"%08d" % i, partition=0, on_delivery=report)
            producer.poll(0.003)
            i += 1
        assert producer.flush(converge_s()) == 0

    writer = threading.Thread(target=write)
    writer.start()
    try:
        wait_for(lambda: len(acked) > 300, "writes to flow", 30)
        c.kill(victim)
        killed = time.monotonic()
        wait_for(lambda: acked[-1][0] > killed + 0.5 and len([a for a in acked if a[0] > killed]) > 300,
                 "writes to go on through the new leader")
    finally:
        stop.set()
        writer.join(converge_s() + 10)
    times = [t for t, _ in acked]
    gap = max(b - a for a, b in zip(times, times[1:], strict=False) if b > killed)
    print(f"\nleader SIGKILL -> next acknowledged write: {gap:.2f} s (session timeout {SESSION_MS} ms)")
    assert errors == []
    assert gap < converge_s()
    values = [v for _, v in acked]
    assert len(set(values)) == len(values) and values == sorted(values)

    # The killed broker comes back, catches up and joins the ISR; then each replica in turn leads and serves the
    # whole log: nothing acknowledged lost, nothing twice, the order kept, on every broker.
    c.start_broker(victim, timeout=converge_s())
    wait_for(lambda: sorted(partitions(c, "kept")[0].isr_nodes) == [1, 2, 3], "the killed broker back in the ISR")
    kadmin = KafkaAdminClient(bootstrap_servers=c.bootstrap)
    for leader in (1, 2, 3):
        order = [leader] + [r for r in (1, 2, 3) if r != leader]
        kadmin.alter_partition_reassignments({TopicPartition("kept", 0): order})
        wait_for(lambda o=order: partitions(c, "kept")[0].replica_nodes == o, "the replica order", 30)
        if partitions(c, "kept")[0].leader_id != leader:
            kadmin.elect_leaders(0, {"kept": [0]})
        wait_for(lambda lead=leader: partitions(c, "kept")[0].leader_id == lead, f"broker {leader} to lead", 30)
        got = read_all(c, "kept", len(values))
        assert len(got) == len(set(got)), f"duplicates read from broker {leader}"
        assert got == sorted(got), f"order broken on broker {leader}"
        assert set(values) <= set(got), f"acknowledged records missing on broker {leader}"


def test_controller_sigkill_while_topics_are_created_through_another_broker(cluster):
    c = cluster
    controller = c.controller()
    via = next(n for n in (1, 2, 3) if n != controller)
    req = CreateTopicsRequest[7]
    created: list[tuple[float, float, str, int]] = []  # (sent, answered, name, error code)
    stop = threading.Event()
    failures: list[BaseException] = []

    def create_many() -> None:
        try:
            i = 0
            while not stop.is_set():
                name = f"during-{i}"
                sent = time.monotonic()
                resp = request(c, via, req(topics=[req.CreatableTopic(
                    name=name, num_partitions=2, replication_factor=2, assignments=[], configs=[])],
                    timeout_ms=int(converge_s() * 1000), validate_only=False), 7, timeout=converge_s() + 10)
                created.append((sent, time.monotonic(), name, resp.topics[0].error_code))
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    creator = threading.Thread(target=create_many)
    creator.start()
    try:
        wait_for(lambda: len(created) >= 5, "topics to be created", 30)
        c.kill(controller)
        killed = time.monotonic()
        wait_for(lambda: any(sent > killed and code == NONE for sent, _, _, code in created),
                 "a topic created after the kill")
    finally:
        stop.set()
        creator.join(converge_s() + 20)
    assert failures == []
    after = next(answered for sent, answered, _, code in created if sent > killed and code == NONE)
    print(f"\ncontroller SIGKILL -> next created topic: {after - killed:.2f} s (session timeout {SESSION_MS} ms)")
    assert after - killed < converge_s()
    # A request the dead controller wrote but could not answer is retried with the next one: TOPIC_ALREADY_EXISTS.
    assert all(code in (NONE, TOPIC_ALREADY_EXISTS) for _, _, _, code in created)
    new_controller = wait_for(lambda: c.controller(via) not in (controller, -1) and c.controller(via),
                              "a new controller")
    assert new_controller != controller
    # Every topic exists with a live leader and no dead replica left in an ISR once the death is handled.
    wait_for(lambda: all(p.leader_id not in (-1, controller) and controller not in p.isr_nodes
                         for _, _, name, _ in created for p in partitions(c, name, via=via).values()),
             "every partition led by a live broker")
    for _, _, name, _ in created:
        assert len(partitions(c, name, via=via)) == 2
