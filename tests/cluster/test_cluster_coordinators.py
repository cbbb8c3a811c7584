"""The group coordinator through the loss of its broker, on three `oncelog serve` processes and ZooKeeper.

A group's coordinator is the leader of the group's `__consumer_offsets` partition (replicated, RF 3). When that
broker is SIGKILLed, the partition's new leader loads the group from its replica of the log: a confluent-kafka
group keeps the offsets it committed (acks=all, so on every in-sync replica) and rebalances on the new coordinator
when a second consumer joins; no record before a committed offset is read again.

Each test runs its own cluster under a fresh chroot of the module's ZooKeeper (tests/cluster/conftest.py); waits
are derived from the session timeout (a death is noticed when the broker's session expires).
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DescribeGroupsRequest
from kafka.protocol.consumer import OffsetFetchRequest
from kafka.protocol.metadata import FindCoordinatorRequest

from oncelog.coordinator.partitioning import partition_for
from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import converge_s, partitions, request, wait_for

TOPIC = "coordinated"
GROUP = "survivors"
RECORDS_PER_PARTITION = 20
OFFSETS_PARTITIONS = 6  # few partitions: the offsets topic is created (and its leaders elected) quickly


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory


def find_coordinator(c: ClusterProcess, via: int) -> int:
    resp = request(c, via, FindCoordinatorRequest(key_type=0, coordinator_keys=[GROUP]), 4)
    (answer,) = resp.coordinators
    return answer.node_id if answer.error_code == 0 else -1


def committed_on(c: ClusterProcess, node: int) -> tuple[int, dict[int, int]]:
    T = OffsetFetchRequest.OffsetFetchRequestTopic
    resp = request(c, node, OffsetFetchRequest(group_id=GROUP, topics=[T(name=TOPIC, partition_indexes=[0, 1])],
                                               require_stable=False), 7)
    return resp.error_code, {p.partition_index: p.committed_offset for t in resp.topics for p in t.partitions}


def described(c: ClusterProcess, node: int):
    resp = request(c, node, DescribeGroupsRequest(groups=[GROUP], include_authorized_operations=False), 5)
    return resp.groups[0]


def poll_into(consumer: Consumer, into: list[tuple[int, int]]) -> None:
    msg = consumer.poll(0.1)
    if msg is not None and not msg.error():
        into.append((msg.partition(), msg.offset()))


# cluster_slow: failed once in 39 runs on a loaded machine (a consumer read nothing for 44 s after connection
# refusals at start, before the kill; not reproduced with logs kept): in `make cluster-test` until understood.
@pytest.mark.cluster_slow
def test_a_group_keeps_its_offsets_and_rebalances_after_its_coordinators_broker_is_killed(cluster):
    c = cluster(**{"offsets.topic.num.partitions": OFFSETS_PARTITIONS, "group.initial.rebalance.delay.ms": 0})
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=2, replication_factor=3)])[TOPIC].result(60)
    producer = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(2 * RECORDS_PER_PARTITION):
        producer.produce(TOPIC, value=b"%d" % i, partition=i % 2)
    assert producer.flush(60) == 0
    conf = {"bootstrap.servers": c.bootstrap, "group.id": GROUP, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 10000, "heartbeat.interval.ms": 500,
            "partition.assignment.strategy": "range", "topic.metadata.refresh.interval.ms": 1000}
    first = Consumer(conf)
    second: Consumer | None = None
    try:
        first.subscribe([TOPIC])
        seen: list = []
        deadline = time.monotonic() + converge_s()
        while len(seen) < 12:
            assert time.monotonic() < deadline, f"the first consumer read {len(seen)} records"
            msg = first.poll(0.2)
            if msg is not None and not msg.error():
                seen.append(msg)
        committed: dict[int, int] = {}
        for msg in seen:
            committed[msg.partition()] = max(committed.get(msg.partition(), 0), msg.offset() + 1)
        first.commit(offsets=[TopicPartition(TOPIC, q, o) for q, o in committed.items()], asynchronous=False)
        want = {q: committed.get(q, -1) for q in (0, 1)}

        # The coordinator is the leader of the group's offsets partition, replicated on all three brokers.
        victim = find_coordinator(c, 1)
        offsets_partition = partitions(c, "__consumer_offsets")[partition_for(GROUP, OFFSETS_PARTITIONS)]
        assert victim == offsets_partition.leader_id and sorted(offsets_partition.replica_nodes) == [1, 2, 3]
        assert committed_on(c, victim) == (0, want)

        c.kill(victim)
        survivor = next(n for n in (1, 2, 3) if n != victim)
        after: list[tuple[int, int]] = []

        def moved() -> int:
            poll_into(first, after)
            node = find_coordinator(c, survivor)
            return node if node not in (-1, victim) and committed_on(c, node)[0] == 0 else 0

        coordinator = wait_for(moved, "a new coordinator that has loaded the group")
        # The committed offsets were on the new leader's replica of the log.
        assert committed_on(c, coordinator) == (0, want)

        second = Consumer(conf)
        second.subscribe([TOPIC])

        def rebalanced() -> bool:
            poll_into(first, after)
            poll_into(second, after)
            group = described(c, coordinator)
            return group.error_code == 0 and group.group_state == "Stable" and len(group.members) == 2 and \
                len(first.assignment()) == 1 and len(second.assignment()) == 1

        wait_for(rebalanced, "both consumers assigned by the new coordinator")
        remaining = {(q, o) for q in (0, 1) for o in range(committed.get(q, 0), RECORDS_PER_PARTITION)}

        def drained() -> bool:
            poll_into(first, after)
            poll_into(second, after)
            return remaining <= set(after)

        wait_for(drained, "every record after the committed offsets")
        assert all(o >= committed.get(q, 0) for q, o in after), sorted(after)[:5]
    finally:
        first.close()
        if second is not None:
            second.close()
