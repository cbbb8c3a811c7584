"""Log compaction in a cluster (issue 22, docs/log-cleaner.md §6): every replica cleans its own copy, below its
high watermark, and the replicas then serve the same records at the same offsets; a replica rebuilt from an
empty disk copies the leader's cleaned log (batches with gaps between them) with the producer state, and the
idempotent producer that wrote everything goes on without an error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from confluent_kafka import Producer

from oncelog.storage.checkpoints import read_checkpoint
from tests.cluster.cluster_processes import converge_s, partitions, wait_for
from tests.cluster.replica_logs import served_by_each, wait_isr_whole
from tests.integration.helpers import create_topic

TOPIC = "compacted"
KEYS = 40
PAD = b"." * 60
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "8192", "min.cleanable.dirty.ratio": "0.01",
             "min.insync.replicas": "2"}


def write(producer: Producer, rounds: range, latest: dict[bytes, bytes], errors: list[str]) -> None:
    for r in rounds:
        for k in range(KEYS):
            key, value = b"key-%03d" % k, b"%d-%03d%s" % (r, k, PAD)
            producer.produce(TOPIC, key=key, value=value, partition=0,
                             on_delivery=lambda err, msg: err and errors.append(str(err)))
            latest[key] = value
        assert producer.flush(converge_s()) == 0


def cleaned_on(c, node: int) -> bool:
    return (TOPIC, 0) in read_checkpoint(Path(c.brokers[node].data_dir) / "cleaner-offset-checkpoint")


@pytest.mark.timeout(400)
def test_replicas_clean_alike_and_a_rebuilt_replica_copies_the_cleaned_log(cluster_factory):
    c = cluster_factory(**{"log.cleaner.backoff.ms": 200})
    create_topic(c.bootstrap, TOPIC, 1, config=COMPACTED, replication_factor=3)
    wait_isr_whole(c, TOPIC)
    errors: list[str] = []
    latest: dict[bytes, bytes] = {}
    producer = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 2, "batch.size": 2048, "error_cb": lambda e: errors.append(str(e))})
    write(producer, range(12), latest, errors)
    for node in c.brokers:
        wait_for(lambda n=node: cleaned_on(c, n), f"broker {node} to clean its replica", converge_s())
    served = served_by_each(c, TOPIC, [0])
    first = served[1][0]
    assert len(first) < KEYS * 12 // 2  # cleaned
    assert {node: log[0] for node, log in served.items()} == {node: first for node in served}  # alike
    assert newest_values(dict(first)) == set(latest.values())

    # Broker 3 loses its disk: it copies the cleaned log from the leader, gaps included, and rejoins the ISR.
    leader = partitions(c, TOPIC)[0].leader_id
    lost = next(n for n in (3, 2, 1) if n != leader)
    c.kill(lost)
    shutil.rmtree(c.brokers[lost].data_dir)
    wait_for(lambda: lost not in partitions(c, TOPIC)[0].isr_nodes, f"broker {lost} out of the ISR")
    c.start_broker(lost, converge_s(c.session_timeout_ms))
    wait_isr_whole(c, TOPIC)
    write(producer, range(12, 14), latest, errors)  # the producer goes on: its last batch stayed everywhere
    assert errors == []
    again = served_by_each(c, TOPIC, [0])
    # Each replica cleans on its own schedule, so they may differ in how much they cleaned, never in what a
    # record at an offset is, nor in the newest record of a key.
    logs = {node: dict(log[0]) for node, log in again.items()}
    for node, log in logs.items():
        assert newest_values(log) == set(latest.values()), f"broker {node}"
        for other, other_log in logs.items():
            shared = log.keys() & other_log.keys()
            assert {o: log[o] for o in shared} == {o: other_log[o] for o in shared}, (node, other)


def newest_values(log: dict[int, bytes]) -> set[bytes]:
    """The newest value of each key (the key is in the value: `<round>-<key>...`)."""
    newest: dict[bytes, bytes] = {}
    for offset in sorted(log):
        value = log[offset]
        newest[value.split(b"-", 1)[1][:3]] = value
    return set(newest.values())


def scratch_files(c, node: int) -> list[Path]:
    return list((Path(c.brokers[node].data_dir) / f"{TOPIC}-0" / "cleaner-scratch").glob("*.log"))


@pytest.mark.timeout(500)
def test_a_leader_killed_in_the_middle_of_a_clean_loses_nothing(cluster_factory):
    """The leader is SIGKILLed while its cleaner writes a round (throttled by log.cleaner.io.max.bytes.per.second
    so the round lasts seconds; its scratch segment is on disk): a new leader takes over, the producer goes on
    without a delivery error, the old leader comes back and rejoins the ISR, every replica cleans, and every replica holds the newest value of every acknowledged key with the
    same record at every offset they share."""
    c = cluster_factory(**{"log.cleaner.backoff.ms": 200, "log.cleaner.io.max.bytes.per.second": 20000})
    create_topic(c.bootstrap, TOPIC, 1, config=COMPACTED, replication_factor=3)
    wait_isr_whole(c, TOPIC)
    delivery_errors: list[str] = []
    latest: dict[bytes, bytes] = {}
    producer = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 2, "batch.size": 2048, "message.timeout.ms": int(converge_s() * 1000)})
    write(producer, range(12), latest, delivery_errors)
    leader = partitions(c, TOPIC)[0].leader_id
    wait_for(lambda: scratch_files(c, leader), f"broker {leader} to be writing a cleaned segment", converge_s())
    assert not cleaned_on(c, leader)  # in the middle of its first round
    c.kill(leader)
    wait_for(lambda: partitions(c, TOPIC)[0].leader_id not in (leader, -1), "a new leader", converge_s())
    write(producer, range(12, 16), latest, delivery_errors)
    c.start_broker(leader, converge_s(c.session_timeout_ms))
    wait_isr_whole(c, TOPIC)
    write(producer, range(16, 18), latest, delivery_errors)
    assert delivery_errors == []
    for node in c.brokers:
        wait_for(lambda n=node: cleaned_on(c, n), f"broker {node} to clean its replica", 3 * converge_s())
    served = served_by_each(c, TOPIC, [0])
    logs = {node: dict(log[0]) for node, log in served.items()}
    for node, log in logs.items():
        assert newest_values(log) == set(latest.values()), f"broker {node}"
        for other, other_log in logs.items():
            shared = log.keys() & other_log.keys()
            assert {o: log[o] for o in shared} == {o: other_log[o] for o in shared}, (node, other)
