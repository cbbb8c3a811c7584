"""Cluster mode's coordinator wiring: FindCoordinator's node from the metadata image (the key's partition leader,
COORDINATOR_NOT_AVAILABLE without a live one, None before the topic exists), the internal topics' creation
settings, and a group coordinator following the replica manager's roles of `__consumer_offsets` partitions
(loaded at the leader epoch, dropped when led elsewhere; other topics ignored). Real image, replica manager and
storage; the group coordinator writes to the in-memory offsets log of the group unit tests."""

from __future__ import annotations

import asyncio
import uuid

from tests.unit.coordinator.group_helpers import FakeLog, coordinator

from oncelog.broker.context import CoordinatorNode
from oncelog.broker.coordinator_leadership import (
    coordinator_node,
    creatable,
    follow_leadership,
    internal_topic,
)
from oncelog.cluster.metadata_image import (
    BrokerInfo,
    MetadataImage,
    PartitionAssignment,
    PartitionState,
    TopicInfo,
)
from oncelog.cluster.replica_manager import ReplicaManager
from oncelog.config import load_broker_config
from oncelog.errors import ErrorCode
from oncelog.storage.log_manager import LogManager

ME, B2, B3 = 1, 2, 3
OFFSETS = "__consumer_offsets"


def image_with(brokers=(ME, B2, B3)) -> MetadataImage:
    image = MetadataImage()
    for node in brokers:
        image.apply_broker(BrokerInfo(node, f"host{node}", 9000 + node, None, 100 + node))
    return image


def set_state(image: MetadataImage, topic: str, partition: int, leader: int, epoch: int) -> None:
    held = image.partition(topic, partition)
    version = 0 if held is None else held.version + 1
    image.apply_partition_state(topic, partition, PartitionState(leader, epoch, (ME, B2, B3), 1, version), created=1)


def test_coordinator_node_is_the_partition_leader_from_the_image():
    image = image_with()
    assert coordinator_node(image, OFFSETS, 0) is None  # not created yet
    image.apply_topic(TopicInfo(OFFSETS, uuid.uuid4().bytes, {0: PartitionAssignment((B2, ME, B3)),
                                                              1: PartitionAssignment((B3, ME, B2))}, 0, 10))
    assert coordinator_node(image, OFFSETS, 0) == ErrorCode.COORDINATOR_NOT_AVAILABLE  # no state yet
    set_state(image, OFFSETS, 0, B2, 3)
    set_state(image, OFFSETS, 1, -1, 4)
    assert coordinator_node(image, OFFSETS, 0) == CoordinatorNode(B2, "host2", 9002)
    assert coordinator_node(image, OFFSETS, 1) == ErrorCode.COORDINATOR_NOT_AVAILABLE  # offline
    image.remove_broker(B2)
    assert coordinator_node(image, OFFSETS, 0) == ErrorCode.COORDINATOR_NOT_AVAILABLE  # its leader is gone


def test_internal_topics_are_created_with_their_own_settings_and_only_with_enough_brokers():
    config = load_broker_config(overrides=["offsets.topic.num.partitions=7", "offsets.topic.replication.factor=3",
                                           "transaction.state.log.num.partitions=5",
                                           "transaction.state.log.replication.factor=2",
                                           "transaction.state.log.min.isr=2"])
    offsets = internal_topic(config, OFFSETS)
    assert (offsets.num_partitions, offsets.replication_factor, offsets.configs["cleanup.policy"]) == (7, 3, "compact")
    txn = internal_topic(config, "__transaction_state")
    assert (txn.num_partitions, txn.replication_factor) == (5, 2)
    assert txn.configs["min.insync.replicas"] == "2" and txn.configs["cleanup.policy"] == "compact"
    assert not creatable(image_with((ME, B2)), offsets) and creatable(image_with((ME, B2)), txn)
    assert creatable(image_with(), offsets)


class Lease:
    state = "CONNECTED"

    def lease_valid(self) -> bool:
        return True


class Fetchers:
    def follow(self, key, part, leader, leader_epoch) -> None:
        pass

    def unfollow(self, key) -> None:
        pass


def test_the_group_coordinator_follows_the_roles_of_its_partitions(tmp_path):
    async def body() -> None:
        config = load_broker_config(overrides=["oncelog.fsync.enable=false", f"node.id={ME}"])
        logs = LogManager(tmp_path / "data", config)
        logs.startup()
        image = image_with()
        topic_id = uuid.uuid4().bytes
        image.apply_topic(TopicInfo(OFFSETS, topic_id, {0: PartitionAssignment((ME, B2, B3)),
                                                        1: PartitionAssignment((B2, ME, B3))}, 0, 10))
        image.apply_topic(TopicInfo("plain", uuid.uuid4().bytes, {0: PartitionAssignment((ME, B2, B3))}, 0, 10))
        set_state(image, OFFSETS, 0, ME, 5)
        set_state(image, OFFSETS, 1, B2, 2)
        set_state(image, "plain", 0, ME, 1)

        async def write_state(*args):
            raise RuntimeError("no ISR writes here")

        rm = ReplicaManager(ME, image, logs, config, write_state=write_state, lease=Lease())
        groups = coordinator(FakeLog(partitions=2))
        groups.start()
        follow_leadership(rm, lambda: (groups, None))
        rm.start(Fetchers())
        try:
            assert [(p, groups.owned.get(p).leader_epoch) for p in groups.owned.partitions()] == [(0, 5)]
            await groups.owned.get(0).task
            assert not groups.loading
            set_state(image, OFFSETS, 0, B2, 6)  # led elsewhere now
            set_state(image, OFFSETS, 1, ME, 3)  # led here now
            set_state(image, "plain", 0, B2, 2)  # not an internal topic: nothing for the coordinators
            assert [(p, groups.owned.get(p).leader_epoch) for p in groups.owned.partitions()] == [(1, 3)]
        finally:
            await rm.stop()
            await groups.stop()
            logs.shutdown()

    asyncio.run(asyncio.wait_for(body(), 30))
