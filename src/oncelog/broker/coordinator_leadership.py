"""Cluster mode's side of the coordinators: who coordinates a key, and when a coordinator loads or drops a partition.

Kafka's rule, kept here: the coordinator of a group (a transactional id) is the leader of the `__consumer_offsets`
(`__transaction_state`) partition the key hashes to. So FindCoordinator answers that partition's leader from this
broker's metadata image, and each broker's coordinators follow the replica manager's roles: a partition of their
topic led here is loaded (`on_leadership`), one that stops being led here is dropped (`on_resignation`). The
internal topics are created on first need, with their own partition counts, replication factors and configs, and
not at all while fewer brokers are alive than the replication factor asks (Kafka's answer then:
COORDINATOR_NOT_AVAILABLE, until enough brokers are up).

The single node needs none of this: its coordinators own every partition from `startup()` and FindCoordinator
names the broker itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..cluster.replica_manager import Role
from ..cluster.topic_plans import NewTopic
from ..coordinator.group.store import OFFSETS_TOPIC, offsets_topic_config
from ..coordinator.txn.coordinator import TXN_TOPIC
from ..errors import ErrorCode
from .context import CoordinatorNode

if TYPE_CHECKING:
    from ..cluster.metadata_image import MetadataImage
    from ..cluster.replica_manager import ReplicaManager
    from ..config import BrokerConfig
    from ..coordinator.host import PartitionLeadership

INTERNAL_TOPICS = (OFFSETS_TOPIC, TXN_TOPIC)
# Kafka's transaction.state.log.segment.bytes default: small segments keep the log's replay cheap.


def internal_topic(config: BrokerConfig, name: str) -> NewTopic:
    """The CreateTopics entry of an internal topic, from the broker's settings (Kafka's keys)."""
    if name == OFFSETS_TOPIC:
        return NewTopic(OFFSETS_TOPIC, config["offsets.topic.num.partitions"],
                        config["offsets.topic.replication.factor"],
                        configs={k: str(v) for k, v in offsets_topic_config(config).items()})
    if name == TXN_TOPIC:
        return NewTopic(TXN_TOPIC, config["transaction.state.log.num.partitions"],
                        config["transaction.state.log.replication.factor"],
                        configs={"cleanup.policy": "compact",
                                 "segment.bytes": str(config["transaction.state.log.segment.bytes"]),
                                 "min.insync.replicas": str(config["transaction.state.log.min.isr"])})
    raise ValueError(f"{name} is not an internal topic")


def creatable(image: MetadataImage, spec: NewTopic) -> bool:
    """Whether enough brokers are alive for the topic's replication factor (Kafka creates no internal topic with
    fewer replicas than configured; it answers COORDINATOR_NOT_AVAILABLE until the brokers are there)."""
    return len(image.brokers) >= spec.replication_factor


def coordinator_node(image: MetadataImage, topic: str, partition: int,
                     listener: str | None = None) -> CoordinatorNode | ErrorCode | None:
    """The leader of `topic`-`partition` as the image has it, at its address on `listener` (the client's);
    COORDINATOR_NOT_AVAILABLE while it has no live leader (or none reachable on that listener); None when the
    topic does not exist yet (the caller has it created, and answers COORDINATOR_NOT_AVAILABLE meanwhile)."""
    if topic not in image.topics:
        return None
    state = image.partition(topic, partition)
    if state is None or state.leader < 0:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    leader = image.brokers.get(state.leader)
    address = leader.endpoint(listener) if leader is not None else None
    if leader is None or address is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    return CoordinatorNode(leader.node_id, *address)


def follow_leadership(replicas: ReplicaManager,
                      coordinators: Callable[[], Iterable[PartitionLeadership | None]]) -> None:
    """Have the coordinators load and drop their partitions as the replica manager's roles change. `coordinators`
    is asked at each change (the broker creates them after wiring the replica manager). Call before
    `replicas.start()`, so the leaderships taken at start are loaded too."""

    def on_role(topic: str, partition: int, role: Role, leader_epoch: int) -> None:
        if topic not in INTERNAL_TOPICS:
            return
        for coordinator in coordinators():
            if coordinator is None:
                continue
            if role is Role.LEADER:
                coordinator.on_leadership(topic, partition, leader_epoch)
            else:
                coordinator.on_resignation(topic, partition)

    replicas.add_role_listener(on_role)
