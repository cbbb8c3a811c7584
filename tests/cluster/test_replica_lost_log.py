"""A replica whose log holds less than its checkpoints say takes its leader's producer state (issue 21, seed 000).

An idempotent producer writes every batch of a partition's first offsets, DeleteRecords removes them all, and one
follower loses part of its copy while its data directory's checkpoints survive:

- its partition directory is removed while it is stopped (the checkpoint still says the log starts at 30, so it
  comes back empty at 30, exactly the offset the leader's log starts at: no fetch is out of range);
- its partition directory is emptied (every file gone, the directory kept);
- a recovery after a SIGKILL cuts its log below every producer-state snapshot it kept (a damaged batch found with
  no recovery point to trust).

Each time the replica's own log cannot rebuild the producer's state (its batches are gone everywhere), so it must
take the leader's state (FetchSnapshot) before it may join the ISR. The test then kills the other two brokers, so
this replica leads, and asks it what the old leader would have answered: the producer's state as it was, an exact
retry of its last batch with the original offsets, a sequence gap with OUT_OF_ORDER_SEQUENCE_NUMBER (a replica
that forgot the producer answers UNKNOWN_PRODUCER_ID), and the next sequence taken.

A data directory replaced whole by an empty one is the fourth path: its log starts at 0, below the leader's log
start, and starts over (test_replication_processes.py, test_a_replica_restarted_with_a_wiped_data_directory_...).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kafka.protocol.admin import DeleteRecordsRequest

from oncelog.embedded import ClusterProcess
from oncelog.records.batch import LOG_OVERHEAD, read_prefix
from oncelog.storage.checkpoints import LOG_START_OFFSET_FILE, RECOVERY_POINT_FILE, read_checkpoint
from tests.cluster.cluster_processes import converge_s, partitions, wait_for
from tests.cluster.test_replica_producer_state import (
    NONE,
    acknowledged_batches,
    batch,
    init_producer,
    produce,
    states_of,
)
from tests.integration.helpers import create_topic
from tests.support.wire import Wire

TOPIC = "replica-state"  # the helpers of test_replica_producer_state write to this topic
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
PRODUCER_BATCHES = 15  # two records each: offsets 0-29, sequences 0-29
DELETED_UP_TO = 2 * PRODUCER_BATCHES


def create(c: ClusterProcess, **config: str) -> int:
    """One partition at RF 3 (min.insync.replicas 1: the last replica standing takes acks=all writes), its ISR
    whole on every broker; its leader."""
    create_topic(c.bootstrap, TOPIC, 1, config={"min.insync.replicas": "1", **config}, replication_factor=3)
    wait_isr(c, [1, 2, 3])
    return partitions(c, TOPIC)[0].leader_id


def wait_isr(c: ClusterProcess, isr: list[int]) -> None:
    for node in c.alive():
        wait_for(lambda n=node: sorted(partitions(c, TOPIC, via=n)[0].isr_nodes) == isr,
                 f"broker {node} to show the ISR {isr}")


def delete_records(c: ClusterProcess, node: int, offset: int) -> None:
    """DeleteRecords up to `offset`; answered once every ISR member persisted the new log start (§4.7)."""
    req = DeleteRecordsRequest[2]
    with Wire(c.brokers[node].bootstrap, timeout=converge_s()) as w:
        resp = w.request(req(topics=[req.DeleteRecordsTopic(name=TOPIC, partitions=[
            req.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=offset)])],
            timeout_ms=int(converge_s() * 1000)), 2)
    (answer,) = resp.topics[0].partitions
    assert (answer.error_code, answer.low_watermark) == (NONE, offset)


def write_then_delete(c: ClusterProcess, leader: int, plain_batches: int = 0) -> tuple[int, int, list]:
    """The producer's 15 batches (offsets 0-29), then `plain_batches` batches of two records without a producer,
    then DeleteRecords up to 30: no replica's log holds a batch of the producer any more."""
    pid, epoch = init_producer(c, leader)
    sent = acknowledged_batches(c, leader, pid, epoch, PRODUCER_BATCHES, "p")
    for i in range(plain_batches):
        assert produce(c, leader, batch([b"plain%d-0" % i, b"plain%d-1" % i])) == (NONE, DELETED_UP_TO + 2 * i, 0)
    delete_records(c, leader, DELETED_UP_TO)
    assert states_of(c, leader) == {pid: (epoch, DELETED_UP_TO - 1)}
    return pid, epoch, sent


def lead_alone(c: ClusterProcess, survivor: int) -> None:
    """SIGKILL the two other brokers: `survivor`, in the ISR, is elected (no unclean election needed)."""
    for node in c.brokers:
        if node != survivor:
            c.kill(node)
    wait_for(lambda: partitions(c, TOPIC, via=survivor)[0].leader_id == survivor,
             f"broker {survivor} to lead", converge_s(c.session_timeout_ms))


def answers_as_the_old_leader(c: ClusterProcess, node: int, pid: int, epoch: int, sent: list,
                              log_start: int, log_end: int) -> None:
    assert states_of(c, node) == {pid: (epoch, DELETED_UP_TO - 1)}
    last, base = sent[-1]
    assert produce(c, node, last) == (NONE, base, log_start)  # an exact retry: its original offsets
    gap = produce(c, node, batch([b"gap"], pid, epoch, DELETED_UP_TO + 5))
    assert gap[0] == OUT_OF_ORDER_SEQUENCE_NUMBER, gap  # a replica that forgot the producer: UNKNOWN_PRODUCER_ID
    assert produce(c, node, batch([b"next"], pid, epoch, DELETED_UP_TO)) == (NONE, log_end, log_start)


def partition_dir(c: ClusterProcess, node: int) -> Path:
    return Path(c.brokers[node].data_dir) / f"{TOPIC}-0"


@pytest.mark.parametrize("loss", ["removed", "emptied"])
@pytest.mark.timeout(300)
def test_a_follower_whose_partition_directory_is_lost_takes_the_producer_state(cluster_factory, loss):
    c = cluster_factory()
    leader = create(c)
    pid, epoch, sent = write_then_delete(c, leader)
    follower = next(n for n in c.brokers if n != leader)
    assert c.stop_broker(follower) == 0
    # The checkpoints outlive the directory: the log comes back empty at 30, the offset the leader starts at.
    data_dir = Path(c.brokers[follower].data_dir)
    assert read_checkpoint(data_dir / LOG_START_OFFSET_FILE)[(TOPIC, 0)] == DELETED_UP_TO
    if loss == "removed":
        shutil.rmtree(partition_dir(c, follower))
    else:
        for f in partition_dir(c, follower).iterdir():
            f.unlink()
    c.start_broker(follower, converge_s())
    wait_isr(c, [1, 2, 3])
    lead_alone(c, follower)
    answers_as_the_old_leader(c, follower, pid, epoch, sent, DELETED_UP_TO, DELETED_UP_TO)


def damage_batch(directory: Path, offset: int) -> None:
    """Flip the last byte of the batch at `offset` (its CRC no longer matches)."""
    for path in sorted(directory.glob("*.log")):
        data = path.read_bytes()
        pos = 0
        while pos + LOG_OVERHEAD <= len(data):
            base, length = read_prefix(memoryview(data), pos)
            end = pos + LOG_OVERHEAD + length
            if base == offset:
                with open(path, "r+b") as f:
                    f.seek(end - 1)
                    f.write(bytes([data[end - 1] ^ 0xFF]))
                return
            pos = end
    raise AssertionError(f"no batch at offset {offset} in {directory}")


@pytest.mark.timeout(300)
def test_a_recovery_that_cuts_below_every_snapshot_takes_the_producer_state(cluster_factory):
    # One batch a segment: each roll snapshots the producer state, three snapshots are kept, all of them far
    # above the offset the damaged batch cuts the log at.
    c = cluster_factory()
    leader = create(c, **{"segment.bytes": "100"})  # one 2-record batch fits, two do not
    plain = 10
    pid, epoch, sent = write_then_delete(c, leader, plain_batches=plain)
    log_end = DELETED_UP_TO + 2 * plain
    follower = next(n for n in c.brokers if n != leader)
    c.kill(follower)  # it had every batch: the acks=all writes waited for the whole ISR
    data_dir = Path(c.brokers[follower].data_dir)
    snapshots = sorted(int(p.name.split(".")[0]) for p in partition_dir(c, follower).glob("*.snapshot"))
    cut = DELETED_UP_TO + 2
    assert snapshots and min(snapshots) > cut, snapshots
    # No recovery point to trust (as after a lost checkpoint): every segment is checked, and the damaged batch
    # at 32 ends the log there; the snapshots above 32 describe data it no longer has and are dropped.
    (data_dir / RECOVERY_POINT_FILE).unlink()
    damage_batch(partition_dir(c, follower), cut)
    c.start_broker(follower, converge_s(c.session_timeout_ms))
    wait_isr(c, [1, 2, 3])
    lead_alone(c, follower)
    answers_as_the_old_leader(c, follower, pid, epoch, sent, DELETED_UP_TO, log_end)
