"""Three brokers on a three-member ZooKeeper ensemble: the ensemble's leader is SIGKILLed while an idempotent
producer writes with acks=all. ZooKeeper elects another leader within the brokers' session timeout, so the
brokers keep their sessions (or register again), nothing acknowledged is lost or duplicated, and the controller
still creates topics afterwards."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.embedded import ClusterProcess
from tests.cluster.cluster_processes import SETTINGS, START_S, converge_s, partitions, wait_for

TOPIC = "under-election"
BEFORE, AFTER = 2000, 2000


def test_a_zookeeper_leader_sigkill_under_an_acks_all_producer_loses_nothing(ensemble, kazoo_client, tmp_path):
    chroot = f"/oncelog-{uuid.uuid4().hex[:8]}"
    kazoo_client(ensemble.servers).ensure_path(chroot)
    c = ClusterProcess(tmp_path / "cluster", 3, SETTINGS, connect=ensemble.connect_string(chroot)).start(START_S)
    try:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic(TOPIC, num_partitions=2, replication_factor=3)])[TOPIC].result(60)
        wait_for(lambda: len(partitions(c, TOPIC)) == 2 and all(p.leader_id >= 0
                                                                 for p in partitions(c, TOPIC).values()),
                 "leaders")
        acked: dict[int, list[bytes]] = {0: [], 1: []}
        failed: list[str] = []

        def report(err, msg) -> None:
            if err is not None:
                failed.append(str(err))
            else:
                acked[msg.partition()].append(msg.value())

        producer = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 5})
        for i in range(BEFORE):
            producer.produce(TOPIC, b"%d" % i, partition=i % 2, on_delivery=report)
            producer.poll(0)
        producer.flush(60)
        leader = ensemble.leader()
        ensemble.kill(leader)
        for i in range(BEFORE, BEFORE + AFTER):
            producer.produce(TOPIC, b"%d" % i, partition=i % 2, on_delivery=report)
            producer.poll(0)
            if i % 200 == 0:
                time.sleep(0.05)       # spread the writes over the election
        assert producer.flush(converge_s() * 3) == 0
        assert failed == []
        for p in (0, 1):
            assert acked[p] == [b"%d" % i for i in range(p, BEFORE + AFTER, 2)]

        consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "check", "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(TOPIC, p, 0) for p in (0, 1)])
            read: dict[int, list[bytes]] = {0: [], 1: []}
            deadline = time.monotonic() + converge_s()
            while sum(map(len, read.values())) < BEFORE + AFTER and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is not None and not msg.error():
                    read[msg.partition()].append(msg.value())
        finally:
            consumer.close()
        assert read == acked

        admin.create_topics([NewTopic("after-election", num_partitions=3, replication_factor=3)])[
            "after-election"].result(converge_s())
        assert sorted(c.metadata().brokers, key=lambda b: b.node_id)[-1].node_id == 3
        assert len(c.metadata().brokers) == 3
    finally:
        c.kill_all()
