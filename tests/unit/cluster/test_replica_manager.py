"""The replica manager's decisions, on real storage and a real metadata image: roles from the image, the leader's
follower tracking, the replicated high watermark, acks=all completion and its refusals, ISR shrink and expand as
CAS writes, the replicated log start offset, the lease.

The metadata store is the one thing replaced: `Store` applies a CAS write to the image the way
MetadataStore.write_partition_state does (tests/cluster run the real one on ZooKeeper)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid

import pytest

from oncelog.cluster.metadata_image import (
    BrokerInfo,
    MetadataImage,
    PartitionAssignment,
    PartitionState,
    TopicDeletion,
    TopicInfo,
)
from oncelog.cluster.replica_manager import ReplicaManager, Role
from oncelog.config import load_broker_config
from oncelog.errors import ErrorCode, KafkaError
from oncelog.records.batch import read_header
from oncelog.records.builder import build_batch
from oncelog.storage.log_manager import LogManager

ME, B2, B3 = 1, 2, 3
T = "t"
KEY = (T, 0)
LAG_MS = 10_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class Store:
    """CAS writes of partition state, applied to the image as the metadata store applies them."""

    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self.writes: list[PartitionState] = []
        self.fail = False

    async def write_state(self, topic, partition, new, expected_version, controller_epoch):
        held = self.image.partition(topic, partition)
        if self.fail or held.version != expected_version:
            raise RuntimeError(f"BadVersion: {held.version} != {expected_version}")
        self.writes.append(new)
        stored = dataclasses.replace(new, version=held.version + 1)
        self.image.apply_partition_state(topic, partition, stored, created=1)
        return stored.version


class Lease:
    def __init__(self) -> None:
        self.state = "CONNECTED"
        self.valid = True

    def lease_valid(self) -> bool:
        return self.valid


class Fetchers:
    def __init__(self) -> None:
        self.following: dict = {}

    def follow(self, key, part, leader, leader_epoch) -> None:
        self.following[key] = (leader, leader_epoch)

    def unfollow(self, key) -> None:
        self.following.pop(key, None)


@pytest.fixture
def cluster(tmp_path):
    """A started replica manager for broker 1 over a fresh log directory; `set_state` moves the image."""
    loop = asyncio.new_event_loop()
    config = load_broker_config(overrides=["oncelog.fsync.enable=false", f"node.id={ME}",
                                           f"replica.lag.time.max.ms={LAG_MS}"])
    logs = LogManager(tmp_path / "data", config)
    logs.startup()
    image = MetadataImage()
    for node in (ME, B2, B3):
        image.apply_broker(BrokerInfo(node, "127.0.0.1", 9000 + node, None, 100 + node))
    image.apply_topic(TopicInfo(T, uuid.uuid4().bytes, {0: PartitionAssignment((ME, B2, B3))}, 0, 10))
    image.apply_topic_configs(T, {"min.insync.replicas": "2"}, 0, 10)
    store, lease, fetchers, clock = Store(image), Lease(), Fetchers(), Clock()
    readable: list = []

    rm = ReplicaManager(ME, image, logs, config, write_state=store.write_state, lease=lease,
                        on_readable=readable.append, now_ms=clock)

    class Cluster:
        pass

    c = Cluster()
    c.loop, c.logs, c.image, c.store, c.lease, c.fetchers, c.clock, c.rm = loop, logs, image, store, lease, \
        fetchers, clock, rm
    c.readable = readable

    def set_state(leader, epoch, isr, version=None):
        held = image.partition(T, 0)
        v = (held.version + 1) if held is not None and version is None else (version or 0)
        image.apply_partition_state(T, 0, PartitionState(leader, epoch, tuple(isr), 1, v), created=1)

    def run(coro):
        return loop.run_until_complete(coro)

    c.set_state, c.run = set_state, run

    async def start():
        rm.start(fetchers)

    set_state(ME, 5, (ME, B2, B3), version=0)
    run(start())
    yield c
    run(rm.stop())
    logs.shutdown()
    loop.close()


def append(c, count=1, acks_wait=None):
    part = c.logs.get_partition(T, 0)
    buf = build_batch([(None, b"v", (), 1)] * count)
    result = part.append_records(buf, read_header(buf), c.clock(), False)
    assert result.error == ErrorCode.NONE
    return result


def rep(c):
    return c.rm.replicas[KEY]


def test_becoming_leader_starts_the_epoch_and_stamps_batches(cluster):
    c = cluster
    r = rep(c)
    part = r.part
    assert (r.role, r.leader_epoch, r.isr) == (Role.LEADER, 5, (ME, B2, B3))
    assert part.leader_epoch == 5 and part.leader_epochs.entries() == [(5, 0)]
    append(c, 3)
    data = part.log.read(0, 1 << 20, part.log.log_end_offset).data
    assert read_header(data).leader_epoch == 5
    # Nobody else has it yet: not visible to consumers.
    assert part.log.high_watermark == 0
    assert c.rm.leader_replica(T, 0, 5) is r and c.rm.leader_replica(T, 0) is r
    assert c.rm.leader_replica(T, 0, 4) == ErrorCode.FENCED_LEADER_EPOCH
    assert c.rm.leader_replica(T, 0, 6) == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert c.rm.leader_replica(T, 1) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_high_watermark_is_the_minimum_durable_offset_of_the_isr(cluster):
    c = cluster
    r = rep(c)
    plog = r.part.log
    append(c, 4)
    assert c.rm.follower_fetch(r, B2, 4, 0) == ErrorCode.NONE
    assert plog.high_watermark == 0  # broker 3 not heard from since the election
    c.rm.follower_fetch(r, B3, 2, 0)
    assert plog.high_watermark == 2
    assert KEY in c.readable
    c.rm.follower_fetch(r, B3, 4, 0)
    assert plog.high_watermark == 4
    c.rm.follower_fetch(r, B3, 3, 0)  # never backwards
    assert plog.high_watermark == 4
    assert c.rm.follower_fetch(r, 7, 4, 0) == ErrorCode.NOT_LEADER_OR_FOLLOWER  # not a replica of it


def test_acks_all_completes_when_the_isr_has_the_write(cluster):
    c = cluster
    r = rep(c)

    async def scenario():
        result = append(c, 2)
        waiter = asyncio.ensure_future(c.rm.wait_acks_all(r, result.last_offset + 1, 10_000))
        await asyncio.sleep(0)
        c.rm.follower_fetch(r, B2, 2, 0)
        await asyncio.sleep(0)
        assert not waiter.done()
        c.rm.follower_fetch(r, B3, 2, 0)
        await asyncio.wait_for(waiter, 5)

    c.run(scenario())


def test_acks_all_times_out(cluster):
    c = cluster
    r = rep(c)
    result = append(c)
    with pytest.raises(KafkaError) as info:
        c.run(c.rm.wait_acks_all(r, result.last_offset + 1, 50))
    assert info.value.code == ErrorCode.REQUEST_TIMED_OUT


def test_min_insync_replicas_before_and_after_append(cluster):
    c = cluster
    r = rep(c)

    async def scenario():
        result = append(c)
        waiter = asyncio.ensure_future(c.rm.wait_acks_all(r, result.last_offset + 1, 10_000))
        await asyncio.sleep(0)
        # The ISR shrinks to the leader alone (the controller's write): min.insync.replicas=2 is not met.
        c.set_state(ME, 5, (ME,))
        with pytest.raises(KafkaError) as info:
            await asyncio.wait_for(waiter, 5)
        assert info.value.code == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        assert c.rm.check_append(r, -1) == ErrorCode.NOT_ENOUGH_REPLICAS
        assert c.rm.check_append(r, 1) == ErrorCode.NONE

    c.run(scenario())


def test_lagging_follower_leaves_the_isr_and_comes_back(cluster):
    c = cluster
    r = rep(c)
    plog = r.part.log

    async def scenario():
        append(c, 3)
        c.rm.follower_fetch(r, B2, 3, 0)
        c.rm.follower_fetch(r, B3, 1, 0)
        c.rm.tick()
        await asyncio.sleep(0.01)
        assert c.store.writes == []  # within replica.lag.time.max.ms
        c.clock.now += LAG_MS + 1
        c.rm.follower_fetch(r, B2, 3, 0)  # caught up: stays
        c.rm.tick()
        await asyncio.sleep(0.01)
        assert [w.isr for w in c.store.writes] == [(ME, B2)]
        assert r.isr == (ME, B2) and c.image.partition(T, 0).isr == (ME, B2)
        assert plog.high_watermark == 3  # no longer held back by broker 3
        # Broker 3 catches up to the high watermark: back in.
        c.rm.follower_fetch(r, B3, 3, 0)
        await asyncio.sleep(0.01)
        assert r.isr == (ME, B2, B3)
        assert [w.isr for w in c.store.writes] == [(ME, B2), (ME, B2, B3)]

    c.run(scenario())


def test_a_failed_isr_write_changes_nothing_and_is_decided_again(cluster):
    c = cluster
    r = rep(c)

    async def scenario():
        c.clock.now += LAG_MS + 1
        c.store.fail = True
        c.rm.tick()
        await asyncio.sleep(0.01)
        assert r.isr == (ME, B2, B3) and r.isr_write is None
        c.store.fail = False
        c.rm.tick()
        await asyncio.sleep(0.01)
        assert r.isr == (ME,)

    c.run(scenario())


def test_no_acknowledgement_without_a_lease(cluster):
    c = cluster
    r = rep(c)

    async def scenario():
        result = append(c)
        c.lease.valid = False
        waiter = asyncio.ensure_future(c.rm.wait_acks_all(r, result.last_offset + 1, 10_000))
        await asyncio.sleep(0)  # the waiter is registered before the followers fetch
        c.rm.follower_fetch(r, B2, 1, 0)
        c.rm.follower_fetch(r, B3, 1, 0)
        await asyncio.sleep(0.01)
        assert r.part.log.high_watermark == 1 and not waiter.done()
        c.lease.valid = True
        c.rm.lease_restored()
        await asyncio.wait_for(waiter, 5)
        c.lease.state = "LOST"
        assert c.rm.check_append(r, 1) == ErrorCode.NOT_LEADER_OR_FOLLOWER

    c.run(scenario())


def test_losing_leadership_fails_waiters_and_follows_the_new_leader(cluster):
    c = cluster
    r = rep(c)

    async def scenario():
        result = append(c)
        waiter = asyncio.ensure_future(c.rm.wait_acks_all(r, result.last_offset + 1, 10_000))
        await asyncio.sleep(0)
        c.set_state(B2, 6, (B2, B3))
        with pytest.raises(KafkaError) as info:
            await asyncio.wait_for(waiter, 5)
        assert info.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert (r.role, r.leader, r.leader_epoch, r.part.leader_epoch) == (Role.FOLLOWER, B2, 6, -1)
        assert c.fetchers.following == {KEY: (B2, 6)}
        assert c.rm.leader_replica(T, 0) == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert c.rm.leader_replica(T, 0, 5) == ErrorCode.FENCED_LEADER_EPOCH
        # Back to leader at a newer epoch: the fetcher stops, the epoch starts at the log end.
        c.set_state(ME, 7, (ME, B2, B3))
        assert r.role is Role.LEADER and c.fetchers.following == {}
        assert r.part.leader_epochs.entries() == [(5, 0), (7, 1)]
        assert not c.rm.offsets_available(r)  # high watermark below the epoch start until followers fetch
        c.rm.follower_fetch(r, B2, 1, 0)
        c.rm.follower_fetch(r, B3, 1, 0)
        assert c.rm.offsets_available(r)

    c.run(scenario())


def test_follower_follows_the_leaders_high_watermark_up_to_what_is_durable(cluster):
    c = cluster
    r = rep(c)
    c.set_state(B2, 6, (B2, B3, ME))
    plog = r.part.log
    batch = build_batch([(None, b"x", (), 1)] * 3, partition_leader_epoch=6)
    r.part.append_replicated(batch, read_header(batch), c.clock())
    c.rm.follower_progress(KEY, 10)
    assert plog.high_watermark == 3  # clamped to the durable end (fsync off: the log end)
    assert r.part.leader_epochs.entries() == [(6, 0)]


def test_log_start_answered_is_the_isrs_minimum(cluster):
    c = cluster
    r = rep(c)
    plog = r.part.log

    async def scenario():
        append(c, 5)
        c.rm.follower_fetch(r, B2, 5, 0)
        c.rm.follower_fetch(r, B3, 5, 0)
        assert plog.delete_records_before(3) == 3
        assert c.rm.client_log_start(r) == 0
        waiter = asyncio.ensure_future(c.rm.wait_log_start(r, 3, 10_000))
        c.rm.follower_fetch(r, B2, 5, 3)
        await asyncio.sleep(0)
        assert not waiter.done() and c.rm.client_log_start(r) == 0
        c.rm.follower_fetch(r, B3, 5, 3)
        assert await asyncio.wait_for(waiter, 5) == 3

    c.run(scenario())


def test_a_follower_that_started_over_joins_the_isr_only_after_the_producer_state(cluster):
    """§4.7: a follower fetching below the log start starts over there and lacks the producers whose batches were
    deleted; it joins the ISR only once its fetch offset passed the offset of the producer state it was served
    (the follower installs it there before fetching further)."""
    c = cluster
    r = rep(c)
    plog = r.part.log

    async def scenario():
        c.set_state(ME, 5, (ME, B2))  # broker 3 is a new replica, not in the ISR
        append(c, 4)
        c.rm.follower_fetch(r, B2, 4, 0)
        assert plog.high_watermark == 4 and plog.delete_records_before(4) == 4
        assert c.rm.follower_fetch(r, B3, 0, 0) == ErrorCode.NONE  # below the log start: it starts over
        c.rm.follower_fetch(r, B3, 4, 4)  # at the high watermark, but without the producer state
        await asyncio.sleep(0.01)
        assert r.isr == (ME, B2) and c.store.writes == []
        # It asks for the state: taken at the log end (4), committed, served at once.
        data, offset, epoch = await c.rm.producer_snapshot(r, B3)
        assert (offset, epoch) == (4, 5) and data == r.part.producers.export_state()
        append(c, 1)
        c.rm.follower_fetch(r, B2, 5, 4)
        # Served at 4, it installs there before fetching again: its next fetch at or past 4 means installed.
        assert c.rm.replicas[KEY].followers[B3].snapshot_pending
        c.rm.follower_fetch(r, B3, 4, 4)
        assert not r.followers[B3].snapshot_pending
        await asyncio.sleep(0.01)
        assert r.isr == (ME, B2)  # below the high watermark (5) still
        c.rm.follower_fetch(r, B3, 5, 4)
        await asyncio.sleep(0.01)
        assert r.isr == (ME, B2, B3)

    c.run(scenario())


def test_the_producer_state_is_served_once_its_offset_is_committed(cluster):
    c = cluster
    r = rep(c)
    plog = r.part.log

    async def scenario():
        c.set_state(ME, 5, (ME, B2))  # broker 3 is a new replica
        append(c, 3)
        waiter = asyncio.ensure_future(c.rm.producer_snapshot(r, B3))
        await asyncio.sleep(0.01)
        assert not waiter.done()  # broker 2 has not fetched: 3 is not committed
        c.rm.follower_fetch(r, B2, 3, 0)
        assert plog.high_watermark == 3
        assert (await asyncio.wait_for(waiter, 5))[1:] == (3, 5)
        # Not a replica; not in time; the leadership moves while it waits.
        with pytest.raises(KafkaError) as info:
            await c.rm.producer_snapshot(r, 7)
        assert info.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        append(c, 1)
        c.rm.snapshot_wait_ms = 50
        with pytest.raises(KafkaError) as info:
            await c.rm.producer_snapshot(r, B3)
        assert info.value.code == ErrorCode.REQUEST_TIMED_OUT
        c.rm.snapshot_wait_ms = 10_000
        waiter = asyncio.ensure_future(c.rm.producer_snapshot(r, B3))
        await asyncio.sleep(0.01)
        c.set_state(B2, 6, (B2, B3))
        with pytest.raises(KafkaError) as info:
            await asyncio.wait_for(waiter, 5)
        assert info.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER

    c.run(scenario())


def test_an_isr_member_asking_for_the_producer_state_leaves_the_isr(cluster):
    """One that restarted from a log that started over (faster than the controller noticed) says so by asking:
    it is out of the ISR, so the commit its answer waits for does not wait for its own fetches."""
    c = cluster
    r = rep(c)

    async def scenario():
        append(c, 3)
        c.rm.follower_fetch(r, B2, 3, 0)
        c.rm.follower_fetch(r, B3, 1, 0)
        answer = await asyncio.wait_for(c.rm.producer_snapshot(r, B3), 5)
        assert answer[1] == 3 and r.isr == (ME, B2) and [w.isr for w in c.store.writes] == [(ME, B2)]
        c.rm.follower_fetch(r, B3, 3, 0)  # installed at 3, caught up: back
        await asyncio.sleep(0.01)
        assert r.isr == (ME, B2, B3)

    c.run(scenario())


def test_an_isr_member_fetching_below_the_log_start_leaves_the_isr_at_once(cluster):
    """A follower asking for an offset below the log start has lost its log (a wiped disk, restarted faster than
    the controller noticed): it is not what the ISR stands for any more."""
    c = cluster
    r = rep(c)
    plog = r.part.log

    async def scenario():
        append(c, 4)
        c.rm.follower_fetch(r, B2, 4, 0)
        c.rm.follower_fetch(r, B3, 4, 0)
        assert plog.delete_records_before(2) == 2
        c.rm.follower_fetch(r, B3, 0, 0)
        await asyncio.sleep(0.01)
        assert [w.isr for w in c.store.writes] == [(ME, B2)] and r.isr == (ME, B2)

    c.run(scenario())


def test_not_a_replica_any_more(cluster):
    c = cluster
    part = c.logs.get_partition(T, 0)
    assert c.logs.topics[T].topic_id == c.image.topics[T].topic_id  # opened as the cluster's replica
    info = c.image.topics[T]
    c.image.apply_topic(dataclasses.replace(info, assignment={0: PartitionAssignment((B2, B3))}, version=1))
    assert KEY not in c.rm.replicas
    assert c.logs.get_partition(T, 0) is None and T not in c.logs.topics  # the reassignment moved it away
    assert not os.path.exists(part.log.directory)


def test_a_stale_incarnation_is_refused(cluster):
    c = cluster
    r = rep(c)
    plog = r.part.log
    append(c, 2)
    # Registered epochs are 100 + node id; a fetch naming an older one is from a process that was replaced.
    assert c.rm.follower_fetch(r, B2, 2, 0, broker_epoch=50) == ErrorCode.STALE_BROKER_EPOCH
    assert c.rm.follower_fetch(r, B3, 2, 0, broker_epoch=103) == ErrorCode.NONE
    assert plog.high_watermark == 0  # the refused fetch counted for nothing
    assert c.rm.follower_fetch(r, B2, 2, 0, broker_epoch=102) == ErrorCode.NONE
    assert plog.high_watermark == 2
    c.image.remove_broker(B3)
    assert c.rm.follower_fetch(r, B3, 2, 0, broker_epoch=103) == ErrorCode.STALE_BROKER_EPOCH
    assert c.rm.follower_fetch(r, B2, 2, 0) == ErrorCode.NONE  # no epoch named: not checked


def test_topic_configs_from_the_image_apply_to_the_local_copy(cluster):
    c = cluster
    r = rep(c)
    assert c.rm.check_append(r, -1) == ErrorCode.NONE  # ISR of 3, min.insync.replicas 2
    c.image.apply_topic_configs(T, {"min.insync.replicas": "4"}, 1, 10)
    assert c.rm.check_append(r, -1) == ErrorCode.NOT_ENOUGH_REPLICAS
    assert r.part.log.config["min.insync.replicas"] == 4


def test_a_deleted_topic_is_deleted_here_and_reported(cluster):
    c = cluster
    reported: list = []

    async def report(name, topic_id):
        reported.append((name, topic_id))

    c.rm._on_topic_deleted = report
    topic_id = c.image.topics[T].topic_id

    async def scenario():
        # What the controller writes: the deletion record naming every replica, then the topic goes.
        c.image.apply_deletion(TopicDeletion(T, {topic_id: (ME, B2, B3)}, 0, 20))
        assert T in c.logs.topics  # still in the image: nothing deleted yet
        c.image.remove_topic(T)
        await asyncio.sleep(0.01)
        assert T not in c.logs.topics and KEY not in c.rm.replicas
        assert reported == [(T, topic_id)]

    c.run(scenario())
