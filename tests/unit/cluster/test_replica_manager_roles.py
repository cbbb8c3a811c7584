"""The replica manager's role listeners (what the group and transaction coordinators load and unload from): one call
per role change of a local replica, with the leader epoch, in the order the image moved; none for a state change
that keeps the role; a failing listener does not stop the change. Real storage and a real metadata image."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from oncelog.cluster.metadata_image import (
    BrokerInfo,
    MetadataImage,
    PartitionAssignment,
    PartitionState,
    TopicInfo,
)
from oncelog.cluster.replica_manager import ReplicaManager, Role
from oncelog.config import load_broker_config
from oncelog.storage.log_manager import LogManager

ME, B2, B3 = 1, 2, 3
T = "__consumer_offsets"


class Lease:
    state = "CONNECTED"

    def lease_valid(self) -> bool:
        return True


class Fetchers:
    def __init__(self) -> None:
        self.following: dict = {}

    def follow(self, key, part, leader, leader_epoch) -> None:
        self.following[key] = (leader, leader_epoch)

    def unfollow(self, key) -> None:
        self.following.pop(key, None)


@pytest.fixture
def node(tmp_path):
    loop = asyncio.new_event_loop()
    config = load_broker_config(overrides=["oncelog.fsync.enable=false", f"node.id={ME}"])
    logs = LogManager(tmp_path / "data", config)
    logs.startup()
    image = MetadataImage()
    for broker in (ME, B2, B3):
        image.apply_broker(BrokerInfo(broker, "127.0.0.1", 9000 + broker, None, 100 + broker))
    topic_id = uuid.uuid4().bytes
    image.apply_topic(TopicInfo(T, topic_id, {0: PartitionAssignment((ME, B2, B3)),
                                              1: PartitionAssignment((B2, ME, B3))}, 0, 10))

    async def write_state(*args):
        raise RuntimeError("no ISR writes in these tests")

    rm = ReplicaManager(ME, image, logs, config, write_state=write_state, lease=Lease())
    heard: list[tuple[str, int, Role, int]] = []
    rm.add_role_listener(lambda topic, partition, role, epoch: heard.append((topic, partition, role, epoch)))

    def set_state(partition, leader, epoch, isr=(ME, B2, B3)):
        held = image.partition(T, partition)
        version = 0 if held is None else held.version + 1
        image.apply_partition_state(T, partition, PartitionState(leader, epoch, tuple(isr), 1, version), created=1)

    async def start():
        rm.start(Fetchers())

    class Node:
        pass

    n = Node()
    n.loop, n.rm, n.image, n.heard, n.set_state, n.topic_id = loop, rm, image, heard, set_state, topic_id
    set_state(0, ME, 5)
    set_state(1, B2, 3)
    loop.run_until_complete(start())
    yield n
    loop.run_until_complete(rm.stop())
    logs.shutdown()
    loop.close()


def test_listeners_hear_the_roles_taken_at_start_and_every_change_after(node):
    assert sorted(node.heard) == [(T, 0, Role.LEADER, 5), (T, 1, Role.FOLLOWER, 3)]
    node.heard.clear()
    node.set_state(0, ME, 5, isr=(ME, B2))  # an ISR change keeps the role: nothing to tell
    node.set_state(0, B2, 6)
    node.set_state(0, ME, 7)
    node.set_state(1, ME, 4)
    node.set_state(1, -1, 5)  # offline
    node.set_state(1, -1, 5, isr=(ME,))  # still offline: no second call
    assert node.heard == [(T, 0, Role.FOLLOWER, 6), (T, 0, Role.LEADER, 7), (T, 1, Role.LEADER, 4),
                          (T, 1, Role.STOPPED, 5)]


def test_a_replica_moved_away_is_told_stopped(node):
    node.heard.clear()
    node.image.apply_topic(TopicInfo(T, node.topic_id, {0: PartitionAssignment((B2, B3)),
                                                        1: PartitionAssignment((B2, ME, B3))}, 0, 11))
    assert (T, 0, Role.STOPPED, 5) in node.heard
    assert all(p != 1 for _, p, _, _ in node.heard)


def test_a_failing_listener_does_not_stop_the_change(node):
    def broken(*args):
        raise ValueError("listener bug")

    node.rm.add_role_listener(broken)
    node.heard.clear()
    node.set_state(0, B2, 6)
    assert node.rm.replicas[(T, 0)].role is Role.FOLLOWER
    assert node.heard == [(T, 0, Role.FOLLOWER, 6)]
