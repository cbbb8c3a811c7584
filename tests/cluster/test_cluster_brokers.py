"""Three `oncelog serve` processes in cluster mode on a real ZooKeeper, with real clients (confluent-kafka,
kafka-python's admin, raw requests): registration, Metadata and DescribeCluster from every broker, topic creation
(leaders spread, replication factors checked), admin requests through any broker (forwarded to the controller,
answered once the receiving broker's metadata shows them), a second broker with a live node.id refused,
min.insync.replicas refusing and recovering, and a controlled shutdown that moves leaderships before it stops.

Each test runs its own cluster under a fresh chroot of the module's ZooKeeper (tests/cluster/conftest.py).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribeLogDirsRequest,
    IncrementalAlterConfigsRequest,
)
from kafka.structs import TopicPartition

from oncelog.embedded import BrokerProcess, ClusterProcess, broker_metadata
from tests.cluster.cluster_processes import (
    SESSION_MS,
    SETTINGS,
    converge_s,
    partitions,
    produce,
    request,
    wait_for,
)

NONE, NOT_ENOUGH_REPLICAS, INVALID_REPLICATION_FACTOR, UNKNOWN_TOPIC, LEADER_NOT_AVAILABLE = 0, 19, 38, 3, 5
ELECTION_NOT_NEEDED, NOT_LEADER = 84, 6


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory


def confluent_admin(c: ClusterProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": c.bootstrap})


def create(c: ClusterProcess, topic: NewTopic) -> None:
    admin = confluent_admin(c)  # kept referenced until the answer: a destroyed handle fails its futures
    admin.create_topics([topic], operation_timeout=30)[topic.topic].result(60)


def not_controller(c: ClusterProcess) -> int:
    controller = c.controller()
    return next(n for n in sorted(c.brokers) if n != controller)


def test_three_brokers_register_and_each_describes_the_whole_cluster(cluster):
    c = cluster()
    expected = sorted((n, b.port) for n, b in c.brokers.items())
    answers = [c.metadata(via=n, topics=None) for n in (1, 2, 3)]
    for md in answers:
        assert sorted((b.node_id, b.port) for b in md.brokers) == expected
    assert len({(md.controller_id, md.cluster_id) for md in answers}) == 1
    controller = answers[0].controller_id
    assert controller in (1, 2, 3)
    described = KafkaAdminClient(bootstrap_servers=c.bootstrap).describe_cluster()
    assert described["controller_id"] == controller and described["cluster_id"] == answers[0].cluster_id
    assert sorted((b["broker_id"], b["port"]) for b in described["brokers"]) == expected
    md = confluent_admin(c).list_topics(timeout=30)
    assert sorted(md.brokers) == [1, 2, 3] and md.controller_id == controller


def test_create_topics_spreads_leaders_and_checks_the_replication_factor(cluster):
    c = cluster()
    create(c, NewTopic("spread", num_partitions=6, replication_factor=3))
    # Answered once the broker that took the request shows it; the others within a watch round trip.
    for node in (1, 2, 3):
        parts = wait_for(lambda n=node: len(partitions(c, "spread", via=n)) == 6 and partitions(c, "spread", via=n),
                         f"broker {node} to show the topic", timeout=30)
        for p in parts.values():
            assert p.error_code == NONE and sorted(p.replica_nodes) == [1, 2, 3]
            assert p.leader_id == p.replica_nodes[0] and sorted(p.isr_nodes) == [1, 2, 3]
            assert p.leader_epoch == 0 and p.offline_replicas == []
        assert Counter(p.leader_id for p in parts.values()) == {1: 2, 2: 2, 3: 2}
    with pytest.raises(KafkaException) as refused:
        create(c, NewTopic("too-wide", num_partitions=1, replication_factor=4))
    assert refused.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
    assert "3 broker(s) are registered" in refused.value.args[0].str()
    # validate_only creates nothing; an explicit assignment is taken as given.
    admin = confluent_admin(c)
    admin.create_topics([NewTopic("dry", 2, 3)], validate_only=True)["dry"].result(30)
    admin.create_topics([NewTopic("placed", num_partitions=2, replica_assignment=[[2, 3], [3, 1]])])["placed"].result(30)
    assert partitions(c, "dry") == {}
    placed = partitions(c, "placed")
    assert [(p.leader_id, p.replica_nodes) for _, p in sorted(placed.items())] == [(2, [2, 3]), (3, [3, 1])]
    # DescribeLogDirs lists every replica a broker holds, followers included, and nothing else.
    d = DescribeLogDirsRequest[4]

    def replicas_on(node: int) -> list[int]:
        wait_for(lambda: all((c.brokers[node].data_dir / f"placed-{p}").exists()
                             for p, s in placed.items() if node in s.replica_nodes), "the replicas to open", 30)
        result = request(c, node, d(topics=None), 4).results[0]
        return sorted(p.partition_index for t in result.topics if t.name == "placed" for p in t.partitions)

    assert [replicas_on(n) for n in (1, 2, 3)] == [[1], [0], [0, 1]]
    # A broker with no replica of a topic sends producers to the leader (NOT_LEADER_OR_FOLLOWER), as one that
    # only follows it does.
    assert produce(c, 1, "placed", 0, [b"x"])[0] == NOT_LEADER
    create(c, NewTopic("elsewhere", num_partitions=1, replica_assignment=[[2]]))
    # Broker 1 learns of the topic within a watch round trip; before that it answers UNKNOWN_TOPIC_OR_PARTITION,
    # as a Kafka broker whose metadata cache lags does.
    wait_for(lambda: partitions(c, "elsewhere", via=1), "broker 1 to show the topic", timeout=30)
    assert produce(c, 1, "elsewhere", 0, [b"x"])[0] == NOT_LEADER
    wait_for(lambda: produce(c, 2, "elsewhere", 0, [b"x"]) == (NONE, 0), "broker 2 to lead its partition", 30)


def test_a_broker_with_a_live_node_id_refuses_to_start(cluster, tmp_path):
    c = cluster()
    taken = c.brokers[2]
    intruder = BrokerProcess(tmp_path / "intruder", {**SETTINGS, "node.id": 2,
                                                      "oncelog.coordination.connect": c.connect})
    with pytest.raises(RuntimeError, match=r"exited during startup \(code 1\)"):
        intruder.start(timeout=converge_s())
    assert f"node.id 2 is registered by a live broker at 127.0.0.1:{taken.port}" in intruder.log_tail()
    md = c.metadata(via=1, topics=[])
    assert sorted((b.node_id, b.port) for b in md.brokers) == sorted((n, b.port) for n, b in c.brokers.items())


def test_admin_requests_through_a_broker_that_is_not_the_controller(cluster):
    c = cluster()
    via = not_controller(c)
    other = next(n for n in (1, 2, 3) if n not in (via, c.controller()))
    topic = f"fwd-{uuid.uuid4().hex[:6]}"
    req = CreateTopicsRequest[7]
    resp = request(c, via, req(topics=[req.CreatableTopic(name=topic, num_partitions=2, replication_factor=3,
                                                          assignments=[], configs=[])],
                               timeout_ms=30000, validate_only=False), 7)
    assert resp.topics[0].error_code == NONE and resp.topics[0].replication_factor == 3
    assert len(partitions(c, topic, via=via)) == 2  # the receiving broker shows it when it answers

    alter = IncrementalAlterConfigsRequest[1]
    resp = request(c, via, alter(resources=[alter.AlterConfigsResource(
        resource_type=2, resource_name=topic, configs=[
            alter.AlterConfigsResource.AlterableConfig(name="retention.ms", config_operation=0, value="123456")])],
        validate_only=False), 1)
    assert resp.responses[0].error_code == NONE

    def described(node: int) -> dict[str, tuple[str, int]]:
        d = DescribeConfigsRequest[4]
        out = request(c, node, d(resources=[d.DescribeConfigsResource(resource_type=2, resource_name=topic,
                                                                      configuration_keys=["retention.ms"])],
                                 include_synonyms=False, include_documentation=False), 4)
        return {e.name: (e.value, e.config_source) for e in out.results[0].configs}

    assert described(via) == {"retention.ms": ("123456", 1)}
    wait_for(lambda: described(other) == {"retention.ms": ("123456", 1)}, "the config on every broker", 30)
    # Every replica's local log takes the topic's config.
    wait_for(lambda: all((b.data_dir / "__oncelog_meta" / "topics" / f"{topic}.json").read_text().count("123456")
                         for b in c.brokers.values()), "the config on every replica", 30)

    grow = CreatePartitionsRequest[3]
    resp = request(c, via, grow(topics=[grow.CreatePartitionsTopic(name=topic, count=3, assignments=None)],
                                timeout_ms=30000, validate_only=False), 3)
    assert resp.results[0].error_code == NONE
    assert sorted(partitions(c, topic, via=via)) == [0, 1, 2]

    drop = DeleteTopicsRequest[6]
    resp = request(c, via, drop(topics=[drop.DeleteTopicState(name=topic, topic_id=None)], timeout_ms=30000), 6)
    assert resp.responses[0].error_code == NONE
    assert c.metadata(via, [topic]).topics[0].error_code == UNKNOWN_TOPIC
    wait_for(lambda: not any((b.data_dir / f"{topic}-0").exists() for b in c.brokers.values()),
             "every replica deleted", 30)


def test_reassignment_and_preferred_election(cluster):
    c = cluster()
    create(c, NewTopic("moved", num_partitions=1, replication_factor=3))
    first = partitions(c, "moved")[0]
    admin = KafkaAdminClient(bootstrap_servers=c.bootstrap)
    target = [first.replica_nodes[2], first.replica_nodes[0], first.replica_nodes[1]]
    admin.alter_partition_reassignments({TopicPartition("moved", 0): target})
    wait_for(lambda: partitions(c, "moved")[0].replica_nodes == target, "the new replica order", 30)
    assert admin.list_partition_reassignments() == {} or not admin.list_partition_reassignments().get("moved")
    admin.elect_leaders(0, {"moved": [0]})
    moved = wait_for(lambda: partitions(c, "moved")[0].leader_id == target[0] and partitions(c, "moved")[0],
                     "the preferred replica to lead", 30)
    assert moved.leader_epoch == first.leader_epoch + 1
    result = admin.elect_leaders(0, {"moved": [0]}, raise_errors=False)
    codes = [p.error_code for t in result.replica_election_results for p in t.partition_result]
    assert codes == [ELECTION_NOT_NEEDED]


def test_min_insync_replicas_refuses_acks_all_and_recovers(cluster):
    c = cluster()
    create(c, NewTopic("strict", num_partitions=1, replication_factor=3, config={"min.insync.replicas": "3"}))
    state = partitions(c, "strict")[0]
    leader = state.leader_id
    follower = next(r for r in state.replica_nodes if r != leader)
    create(c, NewTopic("lonely", num_partitions=1, replica_assignment=[[follower]]))
    assert produce(c, leader, "strict", 0, [b"all three"]) == (NONE, 0)
    c.kill(follower)
    wait_for(lambda: follower not in partitions(c, "strict", via=leader)[0].isr_nodes,
             "the dead follower to leave the ISR")
    # Metadata names the dead replica offline; a partition whose only replica died has no leader.
    assert partitions(c, "strict", via=leader)[0].offline_replicas == [follower]
    lonely = wait_for(lambda: (p := partitions(c, "lonely", via=leader)[0]).leader_id == -1 and p,
                      "the lonely partition to go offline")
    assert (lonely.error_code, lonely.offline_replicas, lonely.isr_nodes) == (LEADER_NOT_AVAILABLE, [follower],
                                                                             [follower])
    assert produce(c, leader, "strict", 0, [b"refused"])[0] == NOT_ENOUGH_REPLICAS
    assert produce(c, leader, "strict", 0, [b"acks=1 still goes"], acks=1) == (NONE, 1)
    c.start_broker(follower, timeout=converge_s())
    wait_for(lambda: sorted(partitions(c, "strict", via=leader)[0].isr_nodes) == [1, 2, 3],
             "the follower back in the ISR")
    assert partitions(c, "lonely", via=leader)[0].leader_id == follower  # back online with its last ISR member
    assert produce(c, leader, "strict", 0, [b"all three again"]) == (NONE, 2)


def test_controlled_shutdown_moves_leaderships_before_the_broker_stops(cluster):
    c = cluster()
    create(c, NewTopic("steady", num_partitions=6, replication_factor=3))
    victim = not_controller(c)
    led = [p for p, s in partitions(c, "steady").items() if s.leader_id == victim]
    assert led
    errors: list[str] = []
    acked: list[bytes] = []
    stop = threading.Event()

    def write() -> None:
        producer = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 5})
        i = 0

        def report(err, msg):
            (errors.append(str(err)) if err is not None else acked.append(msg.value()))

        while not stop.is_set():
            producer.produce("steady", value=b"%d" % i, partition=i % 6, on_delivery=report)
            producer.poll(0.002)
            i += 1
        assert producer.flush(converge_s()) == 0

    writer = threading.Thread(target=write)
    writer.start()
    try:
        wait_for(lambda: len(acked) > 200, "writes to flow", 30)
        started = time.monotonic()
        assert c.stop_broker(victim) == 0
        took = time.monotonic() - started
        count = len(acked)
        wait_for(lambda: len(acked) > count + 200, "writes to go on", 30)
    finally:
        stop.set()
        writer.join(converge_s() + 10)
    # It did not wait for its session to expire: the controller moved its leaderships while it still served.
    assert took < SESSION_MS / 1000
    assert "controlled shutdown done" in c.brokers[victim].log_tail(200)
    now = partitions(c, "steady")
    assert all(s.leader_id != victim and victim not in s.isr_nodes for s in now.values())
    assert all(now[p].leader_epoch >= 1 for p in led)
    assert errors == []  # clients saw leader changes, not errors


def test_consumer_group_offsets_live_on_the_replicated_offsets_topic(cluster):
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as ConfluentPartition

    c = cluster()
    create(c, NewTopic("grouped", num_partitions=2, replication_factor=3))
    producer = Producer({"bootstrap.servers": c.bootstrap, "acks": "all"})
    for i in range(20):
        producer.produce("grouped", value=b"%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "readers", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe(["grouped"])
    seen: list[bytes] = []
    deadline = time.monotonic() + converge_s()
    while len(seen) < 20 and time.monotonic() < deadline:
        seen += [m.value() for m in consumer.consume(20, 0.5) if m.error() is None]
    assert sorted(seen, key=int) == [b"%d" % i for i in range(20)]
    consumer.commit(asynchronous=False)
    consumer.close()
    # The coordinator is the leader of the group's __consumer_offsets partition, created on first need with
    # offsets.topic.replication.factor (3) replicas.
    offsets = partitions(c, "__consumer_offsets")
    assert len(offsets) == 50 and all(sorted(p.replica_nodes) == [1, 2, 3] for p in offsets.values())
    reader = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "readers"})
    committed = reader.committed([ConfluentPartition("grouped", 0), ConfluentPartition("grouped", 1)], timeout=30)
    assert [tp.offset for tp in committed] == [10, 10]
    reader.close()


def test_auto_created_topics_take_the_default_replication_factor(cluster):
    c = cluster(**{"default.replication.factor": 2, "num.partitions": 3})
    producer = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "enable.idempotence": True})
    delivered: list[int] = []
    for i in range(6):
        producer.produce("auto-made", value=b"%d" % i,
                         on_delivery=lambda err, msg: delivered.append(err is None and msg.offset()))
    assert producer.flush(converge_s()) == 0
    assert len(delivered) == 6 and all(d is not False for d in delivered)
    parts = partitions(c, "auto-made")
    assert sorted(parts) == [0, 1, 2] and all(len(p.replica_nodes) == 2 for p in parts.values())


def test_a_broker_waits_for_an_unreachable_coordination_service_then_gives_up_or_joins(coordination_factory,
                                                                                      tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    connect = f"127.0.0.1:{port}/late"
    # Given up after oncelog.coordination.connection.timeout.ms: exit 1 with the reason.
    quitter = BrokerProcess(tmp_path / "quitter", {**SETTINGS, "node.id": 1, "oncelog.coordination.connect": connect,
                                                    "oncelog.coordination.connection.timeout.ms": 2000})
    with pytest.raises(RuntimeError, match=r"exited during startup \(code 1\)"):
        quitter.start(timeout=converge_s())
    assert "cannot start: coordination service unreachable" in quitter.log_tail()
    # Retried (and logged) while unreachable; it joins once the service is there.
    waiter = BrokerProcess(tmp_path / "waiter", {**SETTINGS, "node.id": 1, "oncelog.coordination.connect": connect})
    waiter.launch()
    try:
        wait_for(lambda: "unreachable" in waiter.log_tail(), "the broker to report the service unreachable")
        coordination_factory(port=port)
        waiter.wait_ready(converge_s())
        assert [b.node_id for b in broker_metadata(waiter.port, []).brokers] == [1]
    finally:
        waiter.kill()
