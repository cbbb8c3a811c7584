"""Replication between real brokers over TCP, with the metadata image fed by hand instead of ZooKeeper.

Three in-process brokers (their own data directories, listeners, flushers) share one metadata image; each runs a
replica manager, a fetcher per leader and the replicated partition access, wired as cluster mode wires them. The
image is moved the way the controller would move it (elections at a new leader epoch), and ISR writes are CAS
writes applied to the image as the metadata store applies them. Requests are raw Kafka requests (tests/support/
wire.py) to the brokers' listeners; tests/cluster runs the same paths with ZooKeeper and the controller.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest
from kafka.protocol.consumer import FetchRequest
from tests.integration.helpers import produce_raw
from tests.support.wire import Wire

from oncelog.broker.partition_access import ReplicatedPartitionAccess
from oncelog.broker.server import Broker
from oncelog.cluster.metadata_image import (
    BrokerInfo,
    MetadataImage,
    PartitionAssignment,
    PartitionState,
    TopicInfo,
)
from oncelog.cluster.replica_fetcher import ReplicaFetcherManager
from oncelog.cluster.replica_manager import ReplicaManager
from oncelog.config import load_broker_config
from oncelog.records.batch import read_header
from oncelog.records.builder import build_batch

NONE, NOT_LEADER, DUPLICATE_SEQUENCE, UNKNOWN_PRODUCER_ID, FENCED, STALE_BROKER_EPOCH = 0, 6, 46, 59, 74, 77
T = "rep"
LAG_MS = 2000
WAIT_S = 30  # generous: the machine is shared


class Store:
    """A leader's ISR CAS, applied to the shared image (what MetadataStore.write_partition_state does)."""

    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self.isrs: list[tuple[int, ...]] = []  # every ISR written, in order

    async def write_state(self, topic, partition, new, expected_version, controller_epoch):
        held = self.image.partition(topic, partition)
        if held.version != expected_version:
            raise RuntimeError("BadVersion")
        self.isrs.append(new.isr)
        stored = dataclasses.replace(new, version=held.version + 1)
        self.image.apply_partition_state(topic, partition, stored, created=1)
        return stored.version


class Lease:
    state = "CONNECTED"

    def lease_valid(self) -> bool:
        return True


class Node:
    def __init__(self, node_id: int, broker: Broker, rm: ReplicaManager, fetchers: ReplicaFetcherManager) -> None:
        self.node_id, self.broker, self.rm, self.fetchers = node_id, broker, rm, fetchers

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.broker.port}"

    def log(self, partition: int = 0):
        return self.broker.logs.get_partition(T, partition).log


class Cluster:
    """Brokers on a loop in a background thread; `call` runs a function on that loop and returns its result."""

    def __init__(self, root: Path, nodes: int = 3, partitions: int = 1, fsync: bool = True,
                 settings: dict[str, object] | None = None) -> None:
        self.root = root
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.image = MetadataImage()
        self.store = Store(self.image)
        self.nodes: dict[int, Node] = {}
        self.partitions = partitions
        self.fsync = fsync
        self.settings = dict(settings or {})  # more broker keys, for every broker
        for node_id in range(1, nodes + 1):
            self.nodes[node_id] = self.call_async(self._start(node_id))

    def call_async(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT_S)

    def call(self, fn, *args):
        async def run():
            return fn(*args)

        return self.call_async(run())

    async def _start(self, node_id: int, broker_epoch: int | None = None) -> Node:
        config = load_broker_config(overrides=[
            f"node.id={node_id}", f"oncelog.fsync.enable={'true' if self.fsync else 'false'}",
            f"replica.lag.time.max.ms={LAG_MS}", "replica.fetch.backoff.ms=100", "replica.fetch.wait.max.ms=200",
            *(f"{key}={value}" for key, value in self.settings.items()),
        ])
        broker = Broker(config, self.root / f"b{node_id}", port=0)
        await broker.start()
        logs = broker.logs
        rm = ReplicaManager(node_id, self.image, logs, config, write_state=self.store.write_state, lease=Lease(),
                            on_readable=broker.watchers.notify, flusher=broker.flusher)
        fetchers = ReplicaFetcherManager(node_id, self.image, logs, rm, config,
                                         broker_epoch=lambda: self.image.broker_epoch(node_id) or -1)
        # Cluster mode's wiring: handlers ask the replicated access; every flush round reaches the replica manager.
        broker.partitions = ReplicatedPartitionAccess(rm, self.image)
        single_node_hook = broker.flusher.on_high_watermark

        def flushed(plog):
            single_node_hook(plog)
            rm.on_flushed(plog)

        broker.flusher.on_high_watermark = flushed
        epoch = 100 + node_id if broker_epoch is None else broker_epoch
        self.image.apply_broker(BrokerInfo(node_id, "127.0.0.1", broker.port, None, epoch))
        rm.start(fetchers)
        return Node(node_id, broker, rm, fetchers)

    def create(self, replicas: tuple[int, ...]) -> None:
        def apply():
            self.image.apply_topic(TopicInfo(T, uuid.uuid4().bytes, {
                p: PartitionAssignment(replicas) for p in range(self.partitions)}, 0, 10))
            self.image.apply_topic_configs(T, {"min.insync.replicas": "2"}, 0, 10)
            for p in range(self.partitions):
                self.image.apply_partition_state(T, p, PartitionState(replicas[0], 0, replicas, 1, 0), created=1)

        self.call(apply)

    def elect(self, leader: int, isr: tuple[int, ...], partition: int = 0) -> int:
        """What the controller does: a new leader at leader epoch + 1."""
        def apply():
            held = self.image.partition(T, partition)
            new = PartitionState(leader, held.leader_epoch + 1, isr, 1, held.version + 1)
            self.image.apply_partition_state(T, partition, new, created=1)
            return new.leader_epoch

        return self.call(apply)

    def state(self, partition: int = 0) -> PartitionState:
        return self.call(self.image.partition, T, partition)

    def reassign(self, replicas: tuple[int, ...]) -> None:
        """The controller writes a new assignment (what a reassignment does at its start and its end)."""
        def apply():
            info = self.image.topics[T]
            self.image.apply_topic(dataclasses.replace(info, assignment={
                p: PartitionAssignment(replicas) for p in range(self.partitions)}, version=info.version + 1))

        self.call(apply)

    def restart(self, node_id: int, wipe: bool = False) -> Node:
        """Broker `node_id` stops (losing its data directory if `wipe`) and starts again as a new incarnation (a
        new broker epoch), faster than the controller could take it out of any ISR."""
        node = self.nodes[node_id]

        async def stop():
            await node.fetchers.stop()
            await node.rm.stop()
            await node.broker.stop()

        self.call_async(stop())
        if wipe:
            shutil.rmtree(self.root / f"b{node_id}")
        epoch = self.call(self.image.broker_epoch, node_id) + 1000
        self.nodes[node_id] = self.call_async(self._start(node_id, epoch))
        return self.nodes[node_id]

    def stop(self) -> None:
        async def stop_all():
            for node in self.nodes.values():
                await node.fetchers.stop()
                await node.rm.stop()
            await asyncio.gather(*(node.broker.stop() for node in self.nodes.values()))

        try:
            self.call_async(stop_all())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(WAIT_S)
            self.loop.close()


@pytest.fixture
def cluster(tmp_path):
    made: list[Cluster] = []

    def make(**kwargs) -> Cluster:
        c = Cluster(tmp_path, **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def wait_for(predicate, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.02)


def batch(values, pid=-1, seq=-1):
    return build_batch([(None, v, (), 1_700_000_000_000) for v in values], producer_id=pid, producer_epoch=0,
                       base_sequence=seq)


def produce(node: Node, records, *, acks=-1, timeout_ms=20_000):
    with Wire(node.bootstrap) as w:
        part = produce_raw(w, T, 0, records, acks=acks, timeout_ms=timeout_ms)
    return part.error_code, part.base_offset


def log_bytes(c: Cluster, node: Node) -> bytes:
    def read():
        plog = node.log()
        result = plog.read(plog.log_start_offset, 1 << 24, plog.log_end_offset)
        if result.data is not None:
            return bytes(result.data)
        try:
            return os.pread(result.fd, result.length, result.position)
        finally:
            result.close()

    return c.call(read)


def fetch(node: Node, offset: int, epoch: int = -1):
    req = FetchRequest[12]
    ft = req.FetchTopic
    fp = ft.FetchPartition
    with Wire(node.bootstrap) as w:
        resp = w.request(req(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                             session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                             topics=[ft(topic=T, partitions=[fp(partition=0, fetch_offset=offset,
                                                                log_start_offset=-1, partition_max_bytes=1 << 20,
                                                                current_leader_epoch=epoch,
                                                                last_fetched_epoch=-1)])]), 12)
    (p,) = resp.responses[0].partitions
    return p


def test_acks_all_is_answered_once_every_isr_member_has_the_write(cluster):
    c = cluster()
    c.create((1, 2, 3))
    leader = c.nodes[1]
    wait_for(lambda: all(T in n.broker.logs.topics for n in c.nodes.values()), "replicas to open")
    for i in range(5):
        assert produce(leader, batch([b"r%d-%d" % (i, j) for j in range(3)])) == (NONE, 3 * i)
        # Acknowledged means: on every ISR member's disk (§4.3), at the moment the answer comes.
        durable = c.call(lambda: [c.nodes[n].log().durable_end for n in (1, 2, 3)])
        assert durable == [3 * i + 3] * 3, durable
    # The leader's high watermark covers it and the followers hold the same bytes, the leader's epoch stamped in
    # every batch.
    assert c.call(lambda: leader.log().high_watermark) == 15
    want = log_bytes(c, leader)
    for node_id in (2, 3):
        wait_for(lambda n=c.nodes[node_id]: log_bytes(c, n) == want, f"broker {node_id} to hold the leader's log")
        assert c.call(lambda n=c.nodes[node_id]: n.log().durable_end) == 15
    assert read_header(want).leader_epoch == 0
    # Consumers read from the leader only.
    assert fetch(c.nodes[2], 0).error_code == NOT_LEADER
    p = fetch(leader, 0, epoch=0)
    assert (p.error_code, p.high_watermark) == (NONE, 15) and p.records


def test_a_lagging_follower_leaves_the_isr_and_acks_all_goes_on(cluster):
    c = cluster()
    c.create((1, 2, 3))
    leader = c.nodes[1]
    wait_for(lambda: all(T in n.broker.logs.topics for n in c.nodes.values()), "replicas to open")
    assert produce(leader, batch([b"a"])) == (NONE, 0)
    c.call(c.nodes[3].fetchers.unfollow, (T, 0))  # broker 3 stops fetching
    started = time.monotonic()
    assert produce(leader, batch([b"b"]), timeout_ms=LAG_MS * 10) == (NONE, 1)
    # Answered only once broker 3 was out of the ISR (replica.lag.time.max.ms without catching up).
    assert time.monotonic() - started >= LAG_MS / 1000 * 0.5
    assert c.state().isr == (1, 2)
    # It comes back once it fetches again and reaches the high watermark.
    c.call(c.nodes[3].fetchers.follow, (T, 0), c.nodes[3].broker.logs.get_partition(T, 0), 1, 0)
    wait_for(lambda: c.state().isr == (1, 2, 3), "broker 3 back in the ISR")


def test_a_stale_incarnations_fetches_count_for_nothing(cluster):
    c = cluster()
    c.create((1, 2, 3))
    leader = c.nodes[1]
    wait_for(lambda: all(T in n.broker.logs.topics for n in c.nodes.values()), "replicas to open")
    assert produce(leader, batch([b"a"])) == (NONE, 0)
    # Broker 3 registers again (a restart elsewhere): this process still fetches as the old incarnation.
    stale = c.call(lambda: c.nodes[3].fetchers.broker_epoch())
    c.call(setattr, c.nodes[3].fetchers, "broker_epoch", lambda: stale)
    c.call(c.image.apply_broker, BrokerInfo(3, "127.0.0.1", 1, None, 10_000))
    source = c.nodes[3].fetchers.sources[1]
    wait_for(lambda: c.call(lambda: source.errors[STALE_BROKER_EPOCH]), "the leader to refuse broker 3's fetch")
    started = time.monotonic()
    assert produce(leader, batch([b"b"]), timeout_ms=LAG_MS * 10) == (NONE, 1)
    assert time.monotonic() - started >= LAG_MS / 1000 * 0.5  # answered only once broker 3 left the ISR
    assert c.state().isr == (1, 2)
    assert c.call(lambda: c.nodes[3].log().log_end_offset) == 1  # refused: it got nothing more


def test_failover_cuts_the_old_leaders_unacknowledged_tail_and_keeps_producer_state(cluster):
    c = cluster()
    c.create((1, 2, 3))
    old, new = c.nodes[1], c.nodes[2]
    wait_for(lambda: all(T in n.broker.logs.topics for n in c.nodes.values()), "replicas to open")
    pid = 4242
    sent = []
    seq = 0
    for i in range(6):
        records = [b"p%d-%d" % (i, j) for j in range(2)]
        error, base = produce(old, batch(records, pid, seq))
        assert error == NONE
        sent.append((records, seq, base))
        seq += 2
    wait_for(lambda: c.call(lambda: new.log().durable_end) == 12, "broker 2 to have every batch")
    # Both followers stop; the old leader appends what nobody else will ever have (acks=1).
    for node_id in (2, 3):
        c.call(c.nodes[node_id].fetchers.unfollow, (T, 0))
    assert produce(old, batch([b"lost-1", b"lost-2"]), acks=1) == (NONE, 12)
    assert c.call(lambda: old.log().log_end_offset) == 14
    # The controller elects broker 2 (it was in the ISR) at epoch 1.
    epoch = c.elect(2, (2, 3))
    assert epoch == 1
    wait_for(lambda: c.call(lambda: old.rm.replicas[(T, 0)].role.value) == "follower", "old leader to follow")
    # The old leader cut its divergent tail at the new leader's first answer (DivergingEpoch, KIP-320: no
    # OffsetsForLeaderEpoch round trip), and follows the new leader.
    wait_for(lambda: c.call(lambda: old.log().log_end_offset) == 12, "the divergent tail to be cut")
    asked = c.call(lambda: new.broker.metrics.requests.labels("OFFSET_FOR_LEADER_EPOCH")._value.get())
    assert asked == 0
    assert produce(old, batch([b"x"])) == (NOT_LEADER, -1)
    assert fetch(old, 0, epoch=0).error_code == FENCED
    # On the new leader, the producer's retries are answered as the old leader would have: the last five
    # batches with their original offsets, an older one as a duplicate inside the window.
    for records, s, base in sent[-5:]:
        assert produce(new, batch(records, pid, s)) == (NONE, base)
    records, s, _ = sent[0]
    assert produce(new, batch(records, pid, s))[0] == DUPLICATE_SEQUENCE
    assert produce(new, batch([b"after"], pid, seq)) == (NONE, 12)
    want = log_bytes(c, new)
    for node_id in (1, 3):
        wait_for(lambda n=c.nodes[node_id]: log_bytes(c, n) == want, f"broker {node_id} to match the new leader")
    assert read_header(want[-(len(bytes(batch([b"after"], pid, seq)))):]).leader_epoch == 1
    assert c.call(lambda: old.broker.logs.get_partition(T, 0).leader_epochs.entries()) == [(0, 0), (1, 12)]


def delete_records(node: Node, offset: int, timeout_ms: int = 20_000) -> tuple[int, int]:
    from kafka.protocol.admin import DeleteRecordsRequest

    req = DeleteRecordsRequest[2]
    with Wire(node.bootstrap) as w:
        resp = w.request(req(topics=[req.DeleteRecordsTopic(name=T, partitions=[
            req.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=offset)])],
            timeout_ms=timeout_ms), 2)
    (p,) = resp.topics[0].partitions
    return p.error_code, p.low_watermark


def test_the_log_start_offset_is_replicated_before_it_is_answered(cluster):
    c = cluster(nodes=4)
    c.create((1, 2, 3))
    leader = c.nodes[1]
    wait_for(lambda: all(T in c.nodes[n].broker.logs.topics for n in (1, 2, 3)), "replicas to open")
    for i in range(3):
        assert produce(leader, batch([b"d%d-%d" % (i, j) for j in range(2)])) == (NONE, 2 * i)
    assert delete_records(leader, 4) == (NONE, 4)
    # Answered once every ISR member persisted it: a new leader can never answer a lower one (seed 000).
    starts = c.call(lambda: [c.nodes[n].log().log_start_offset for n in (1, 2, 3)])
    assert starts == [4, 4, 4]
    # A new replica (a reassignment adds broker 4) starts empty: its fetch from 0 is out of the leader's range,
    # so it starts over at the leader's log start and copies from there.
    def reassign():
        info = c.image.topics[T]
        c.image.apply_topic(dataclasses.replace(info, assignment={0: PartitionAssignment((1, 2, 3, 4))},
                                                version=info.version + 1))

    c.call(reassign)
    want = log_bytes(c, leader)
    new = c.nodes[4]
    wait_for(lambda: c.call(lambda: T in new.broker.logs.topics and new.log().log_end_offset == 6),
             "broker 4 to copy the log")
    assert log_bytes(c, new) == want
    assert c.call(lambda: new.log().log_start_offset) == 4


def test_truncation_asks_again_for_an_epoch_the_follower_never_had(cluster):
    """KIP-279: broker 1 led epochs 0 and 2 with tails nobody else has; broker 2 led epochs 1 and 3. Asked where
    epoch 2 ends, the new leader answers with epoch 1, which broker 1 never had: it cuts to the end of its own
    older epoch and asks again, ending at the first offset the two histories differ (3), not at 5."""
    c = cluster()
    c.create((1, 2, 3))
    b1, b2 = c.nodes[1], c.nodes[2]
    wait_for(lambda: all(T in n.broker.logs.topics for n in c.nodes.values()), "replicas to open")

    def isolate(*nodes):  # the node stops learning from the image, as if its watches were slow
        for n in nodes:
            c.call(c.image.unsubscribe, c.nodes[n].rm.on_image_delta)

    def rejoin(*nodes):
        for n in nodes:
            c.call(c.image.subscribe, c.nodes[n].rm.on_image_delta)
            c.call(c.nodes[n].rm.reconcile_all)

    for i in range(3):
        assert produce(b1, batch([b"a%d" % i])) == (NONE, i)
    for n in (2, 3):
        c.call(c.nodes[n].fetchers.unfollow, (T, 0))
    for i in (3, 4):
        assert produce(b1, batch([b"b1-epoch0-%d" % i]), acks=1) == (NONE, i)
    isolate(1)
    c.elect(2, (2, 3))  # epoch 1
    for i in range(3, 7):
        assert produce(b2, batch([b"b2-epoch1-%d" % i]), acks=1) == (NONE, i)
    isolate(2, 3)
    c.elect(1, (1,))  # epoch 2, seen by broker 1 only (it never saw epoch 1)
    rejoin(1)
    wait_for(lambda: c.call(lambda: b1.rm.replicas[(T, 0)].leader_epoch) == 2, "broker 1 to lead epoch 2")
    assert produce(b1, batch([b"b1-epoch2"]), acks=1) == (NONE, 5)
    isolate(1)
    c.elect(2, (2, 3))  # epoch 3: brokers 2 and 3 learn of it without ever seeing epoch 2
    rejoin(2, 3)
    wait_for(lambda: c.call(lambda: b2.rm.replicas[(T, 0)].leader_epoch) == 3, "broker 2 to lead epoch 3")
    assert produce(b2, batch([b"b2-epoch3"]), acks=1) == (NONE, 7)
    assert c.call(lambda: b1.broker.logs.get_partition(T, 0).leader_epochs.entries()) == [(0, 0), (2, 5)]
    rejoin(1)
    want = log_bytes(c, b2)
    wait_for(lambda: log_bytes(c, b1) == want, "broker 1 to hold broker 2's log")
    assert c.call(lambda: b1.broker.logs.get_partition(T, 0).leader_epochs.entries()) == [(0, 0), (1, 3), (3, 7)]


# -- a replica whose log starts over takes the leader's producer state (docs/cluster.md §4.7, seed 000) ----------
PID = 9090


def write_then_delete(c: Cluster, leader: Node) -> list[tuple[list[bytes], int, int]]:
    """An idempotent producer writes four batches (offsets 0-7), a plain producer one more (8-9), and
    DeleteRecords removes everything before 8: the idempotent producer's batches are all gone from the log,
    only the replicas' producer state still knows it (KIP-360)."""
    sent = []
    for i in range(4):
        records = [b"p%d-%d" % (i, j) for j in range(2)]
        error, base = produce(leader, batch(records, PID, 2 * i))
        assert (error, base) == (NONE, 2 * i)
        sent.append((records, 2 * i, base))
    assert produce(leader, batch([b"plain-1", b"plain-2"])) == (NONE, 8)
    assert delete_records(leader, 8) == (NONE, 8)
    return sent


def answers_as_the_old_leader(new: Node, sent) -> None:
    """Retries of the producer's batches get their original offsets; its next batch (same epoch, next sequence)
    is accepted. A replica that rebuilt producer state from its log alone answers UNKNOWN_PRODUCER_ID to both."""
    for records, seq, base in sent:
        assert produce(new, batch(records, PID, seq), acks=1) == (NONE, base)
    assert produce(new, batch([b"next"], PID, 8), acks=1) == (NONE, 10)
    assert produce(new, batch([b"next"], PID, 8), acks=1) == (NONE, 10)  # and that one's retry too


def holds_state_when_in_isr(c: Cluster, node_id: int) -> bool:
    """Broker `node_id` is in the ISR; when it is, it must already hold the producer's state (the leader adds it
    only after it installed the snapshot)."""
    if node_id not in c.state().isr:
        return False
    part = c.call(lambda: c.nodes[node_id].broker.logs.get_partition(T, 0))
    assert c.call(lambda: (part.producer_state_incomplete, PID in part.producers.entries)) == (False, True)
    return True


def test_a_replica_added_after_deleted_records_knows_their_producer(cluster):
    c = cluster()
    c.create((1, 2))
    leader = c.nodes[1]
    wait_for(lambda: all(T in c.nodes[n].broker.logs.topics for n in (1, 2)), "replicas to open")
    sent = write_then_delete(c, leader)
    # A reassignment adds broker 3. Its log starts over at the leader's log start (8), so it replicates no batch
    # of the producer: it takes the leader's producer state, installs it at the log end it was taken at (10),
    # and only then joins the ISR.
    c.reassign((1, 2, 3))
    wait_for(lambda: holds_state_when_in_isr(c, 3), "broker 3 in the ISR")
    new = c.nodes[3]
    assert c.call(lambda: (new.log().log_start_offset, new.log().log_end_offset)) == (8, 10)
    assert log_bytes(c, new) == log_bytes(c, leader)
    # The reassignment ends: brokers 1 and 2 go, broker 3 leads alone.
    c.elect(3, (3,))
    c.reassign((3,))
    wait_for(lambda: c.call(lambda: new.rm.replicas[(T, 0)].role.value) == "leader", "broker 3 to lead")
    wait_for(lambda: c.call(lambda: (T, 0) not in c.nodes[1].rm.replicas), "broker 1's copy to go")
    answers_as_the_old_leader(new, sent)


def test_a_replica_restarted_with_an_empty_disk_takes_the_producer_state_again(cluster):
    c = cluster()
    c.create((1, 2, 3))
    leader = c.nodes[1]
    wait_for(lambda: all(T in n.broker.logs.topics for n in c.nodes.values()), "replicas to open")
    sent = write_then_delete(c, leader)
    wait_for(lambda: c.call(lambda: c.nodes[2].log().log_end_offset) == 10, "broker 2 to have every batch")
    # Broker 2 comes back with nothing, still in the ISR as far as the image says: its first fetch, below the
    # leader's log start, takes it out at once (it lost what the ISR stands for), and it returns only with the
    # producer state.
    written = len(c.store.isrs)
    restarted = c.restart(2, wipe=True)
    wait_for(lambda: c.call(lambda: (1, 3) in c.store.isrs[written:]), "broker 2 out of the ISR")
    wait_for(lambda: holds_state_when_in_isr(c, 2), "broker 2 back in the ISR")
    assert c.call(lambda: (restarted.log().log_start_offset, restarted.log().log_end_offset)) == (8, 10)
    # The leader goes; broker 2 is elected and answers the producer as broker 1 would have.
    c.elect(2, (2,))
    wait_for(lambda: c.call(lambda: restarted.rm.replicas[(T, 0)].role.value) == "leader", "broker 2 to lead")
    answers_as_the_old_leader(restarted, sent)


def snapshot_request(c: Cluster, node: Node, replica_id: int, *, epoch: int = 0, end_offset: int = -1,
                     position: int = 0):
    """FetchSnapshot (inter-broker) from `replica_id` to `node`, over an oncelog client connection: (the
    partition's answer, the API keys the broker advertises)."""
    from oncelog.client.connection import BrokerConnection
    from oncelog.protocol.apis import ApiKey

    async def ask():
        conn = BrokerConnection("127.0.0.1", node.broker.port, node.node_id, client_id="test-replica")
        await conn.connect()
        try:
            resp = await conn.call(ApiKey.FETCH_SNAPSHOT, {"replica_id": replica_id, "max_bytes": 1 << 20, "topics": [
                {"name": T, "partitions": [{"partition": 0, "current_leader_epoch": epoch, "position": position,
                                            "snapshot_id": {"end_offset": end_offset, "epoch": -1}}]}]},
                version=0, timeout=WAIT_S)
            return resp.topics[0].partitions[0], set(conn.api_versions)
        finally:
            await conn.close()

    return c.call_async(ask())


def test_fetch_snapshot_serves_replicas_only_once_its_offset_is_committed(cluster):
    from oncelog.storage.producer_state import decode_snapshot

    c = cluster()
    c.create((1, 2))
    leader = c.nodes[1]
    wait_for(lambda: all(T in c.nodes[n].broker.logs.topics for n in (1, 2)), "replicas to open")
    assert produce(leader, batch([b"a", b"b"], PID, 0)) == (NONE, 0)
    answer, advertised = snapshot_request(c, leader, 2)
    assert 59 not in advertised  # inter-broker only: never in ApiVersions
    assert (answer.error_code, answer.snapshot_id.end_offset, answer.snapshot_id.epoch) == (NONE, 2, 0)
    assert (answer.current_leader.leader_id, answer.position, answer.size) == (1, 0, len(answer.unaligned_records))
    (entry,) = decode_snapshot(answer.unaligned_records)
    assert (entry.producer_id, [(b.first_seq, b.last_seq, b.first_offset) for b in entry.batches]) == \
        (PID, [(0, 1, 0)])
    # Refused: not a replica, not the leader, an epoch it does not have, a named snapshot, a position inside one.
    assert snapshot_request(c, leader, 3)[0].error_code == NOT_LEADER
    assert snapshot_request(c, c.nodes[2], 1)[0].error_code == NOT_LEADER
    assert snapshot_request(c, leader, 2, epoch=1)[0].error_code == 75  # UNKNOWN_LEADER_EPOCH
    assert snapshot_request(c, leader, 2, end_offset=2)[0].error_code == 98  # SNAPSHOT_NOT_FOUND
    assert snapshot_request(c, leader, 2, position=5)[0].error_code == 99  # POSITION_OUT_OF_RANGE
    # A state that counts batches only the leader has is not handed out: broker 2 stops fetching, a batch goes to
    # the leader alone, and the answer comes once that batch is committed (here: broker 2 left the ISR).
    c.call(c.nodes[2].fetchers.unfollow, (T, 0))
    assert produce(leader, batch([b"c"], PID, 2), acks=1) == (NONE, 2)
    answer, _ = snapshot_request(c, leader, 2)
    assert (answer.error_code, answer.snapshot_id.end_offset) == (NONE, 3)
    assert c.state().isr == (1,) and c.call(lambda: leader.log().high_watermark) == 3


def test_a_replica_stopped_before_it_installed_the_producer_state_asks_again_after_its_restart(cluster):
    """The mark of a log that started over outlives the process: a replica stopped between starting over and
    installing the leader's state asks for it again when it comes back, and only then rejoins the ISR."""
    c = cluster()
    c.create((1, 2, 3))
    leader = c.nodes[1]
    wait_for(lambda: all(T in n.broker.logs.topics for n in c.nodes.values()), "replicas to open")
    sent = write_then_delete(c, leader)
    wait_for(lambda: c.call(lambda: c.nodes[2].log().log_end_offset) == 10, "broker 2 to have every batch")

    def start_over():  # what a follower left behind the leader's log start does, then it stops at once
        c.nodes[2].fetchers.unfollow((T, 0))
        c.nodes[2].broker.logs.truncate_fully_and_start_at(T, 0, 8)

    c.call(start_over)
    written = len(c.store.isrs)
    restarted = c.restart(2)
    part = c.call(lambda: restarted.broker.logs.get_partition(T, 0))
    # Still in the ISR for the image: asking for the state takes it out at once, and it returns with it.
    wait_for(lambda: c.call(lambda: (1, 3) in c.store.isrs[written:]), "broker 2 out of the ISR")
    wait_for(lambda: holds_state_when_in_isr(c, 2), "broker 2 back in the ISR")
    assert c.call(lambda: (part.log.log_start_offset, part.log.log_end_offset)) == (8, 10)
    c.elect(2, (2,))
    wait_for(lambda: c.call(lambda: restarted.rm.replicas[(T, 0)].role.value) == "leader", "broker 2 to lead")
    answers_as_the_old_leader(restarted, sent)
