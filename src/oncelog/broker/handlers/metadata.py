"""Metadata: topics with each partition's leader, epoch, replicas and ISR as the partition access describes
them (the single node: itself, epoch 0); auto-creation on first request.

In cluster mode everything comes from this broker's metadata image: every live broker, the controller, each
topic's id and partitions with their leader, leader epoch, replicas, ISR and offline replicas
(LEADER_NOT_AVAILABLE for a partition without a leader). An auto-created topic is created by the controller
with default.replication.factor; meanwhile the topic is answered LEADER_NOT_AVAILABLE, as Kafka does."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ...config import topic_name_problem
from ...errors import ErrorCode, KafkaError
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import AclOperation, ResourceType
from ...security.api_acls import CLUSTER_NAME
from .common import UNKNOWN_AUTHORIZED_OPERATIONS, find_topic_by_id, topic_uuid

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext
    from ..partition_access import PartitionView

log = logging.getLogger("oncelog.metadata")


def _error_entry(name: str, error: int) -> dict[str, Any]:
    return {
        "error_code": error,
        "name": name,
        "topic_id": topic_uuid(None),
        "is_internal": False,
        "partitions": [],
        "authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS,
    }


def _cluster_topic_entry(broker: BrokerServices, name: str, error: int = 0) -> dict[str, Any]:
    info = broker.cluster.image.topics.get(name)
    if info is None or error:
        return _error_entry(name, error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    describe = broker.partitions.describe
    return {
        "error_code": 0,
        "name": name,
        "topic_id": topic_uuid(info.topic_id),
        "is_internal": name.startswith("__"),
        "partitions": [_partition_entry(p, describe(name, p)) for p in sorted(info.assignment)],
        "authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS,
    }


def topic_entry(broker: BrokerServices, name: str, error: int = 0) -> dict[str, Any]:
    if getattr(broker, "cluster", None) is not None:
        return _cluster_topic_entry(broker, name, error)
    meta = broker.logs.topics.get(name)
    if meta is None or error:
        return {
            "error_code": error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            "name": name,
            "topic_id": topic_uuid(None),
            "is_internal": False,
            "partitions": [],
            "authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS,
        }
    describe = broker.partitions.describe
    return {
        "error_code": 0,
        "name": name,
        "topic_id": topic_uuid(meta.topic_id),
        "is_internal": meta.internal,
        "partitions": [_partition_entry(p, describe(name, p)) for p in range(meta.partitions)],
        "authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS,
    }


def _partition_entry(index: int, view: PartitionView) -> dict[str, Any]:
    return {
        # Kafka answers LEADER_NOT_AVAILABLE for a partition without a leader, with the rest filled in.
        "error_code": 0 if view.leader >= 0 else ErrorCode.LEADER_NOT_AVAILABLE,
        "partition_index": index,
        "leader_id": view.leader,
        "leader_epoch": view.leader_epoch,
        "replica_nodes": view.replicas,
        "isr_nodes": view.isr,
        "offline_replicas": view.offline,
    }


async def handle(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.METADATA, ctx.api_version, body)
    version = ctx.api_version
    auto_create = broker.config["auto.create.topics.enable"] and (version < 4 or req.allow_auto_topic_creation)
    requested = req.topics
    cluster = getattr(broker, "cluster", None)
    if requested is None or (version == 0 and not requested):
        names = sorted(broker.logs.topics if cluster is None else cluster.image.topics)
        # all topics: those the caller may not DESCRIBE are left out, as if they did not exist, and without a
        # logged denial each (Kafka: logIfDenied = !isAllTopics)
        entries = [topic_entry(broker, n)
                   for n in ctx.filter_authorized(ResourceType.TOPIC, names, AclOperation.DESCRIBE, log_denied=False)]
    else:
        entries = []
        for item in requested:
            name = item.name
            topic_id = getattr(item, "topic_id", None)
            # By topic id (v10+) when one is given, whatever name comes with it: Kafka's Java admin sends an
            # empty name beside the id (`kafka-topics --describe --topic-id`); a null name means by id as well.
            if name is None or (topic_id is not None and topic_id.int != 0):
                name = _find_by_id(broker, topic_id)
                if name is None or not ctx.authorized(ResourceType.TOPIC, name, AclOperation.DESCRIBE):
                    entry = topic_entry(broker, "", ErrorCode.UNKNOWN_TOPIC_ID if name is None
                                        else ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                    entry["name"] = None
                    entry["topic_id"] = item.topic_id
                    entries.append(entry)
                    continue
            elif not ctx.authorized(ResourceType.TOPIC, name, AclOperation.DESCRIBE):
                # named but not describable: the same answer whether or not it exists
                entries.append(_error_entry(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                continue
            if auto_create and not _may_create(ctx, broker, name):
                # describable, missing, and the caller may not create it: Kafka's unauthorizedForCreateTopics
                entries.append(_error_entry(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                continue
            entries.append(_lookup_or_create(broker, name, auto_create))
    if version >= 8 and getattr(req, "include_topic_authorized_operations", False):
        for entry in entries:
            if entry["error_code"] == 0:
                entry["authorized_operations"] = ctx.authorized_operations(ResourceType.TOPIC, entry["name"])
    if cluster is None:
        host, port = broker.advertised_for(ctx.connection.listener)
        brokers = [{"node_id": broker.node_id, "host": host, "port": port, "rack": None}]
        controller_id = broker.node_id
    else:
        image = cluster.image
        brokers = [{"node_id": node, "host": host, "port": port, "rack": rack}
                   for node, host, port, rack in cluster.brokers_on(ctx.connection.listener)]
        controller_id = image.controller_id
    cluster_operations = UNKNOWN_AUTHORIZED_OPERATIONS
    if 8 <= version <= 10 and getattr(req, "include_cluster_authorized_operations", False):
        cluster_operations = ctx.authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME)
    data = {
        "throttle_time_ms": 0,
        "brokers": brokers,
        "cluster_id": broker.cluster_id,
        "controller_id": controller_id,
        "topics": entries,
        "authorized_operations": cluster_operations,
    }
    return encode_response(ApiKey.METADATA, version, data)


def _may_create(ctx: RequestContext, broker: BrokerServices, name: str) -> bool:
    """Auto-creation needs CREATE on the cluster or on the topic (Kafka asks the cluster first, without logging
    its denial). Only asked for a topic that does not exist yet."""
    cluster = getattr(broker, "cluster", None)
    if ctx.authorizer is None or name in (broker.logs.topics if cluster is None else cluster.image.topics):
        return True
    return (ctx.authorized_cluster(AclOperation.CREATE, log_denied=False)
            or ctx.authorized(ResourceType.TOPIC, name, AclOperation.CREATE))


def _find_by_id(broker: BrokerServices, topic_id: Any) -> str | None:
    if getattr(broker, "cluster", None) is None:
        return find_topic_by_id(broker, topic_id)
    if topic_id is None or topic_id.int == 0:
        return None
    return next((n for n, info in broker.cluster.image.topics.items() if info.topic_id == topic_id.bytes), None)


def _lookup_or_create(broker: BrokerServices, name: str, auto_create: bool) -> dict[str, Any]:
    cluster = getattr(broker, "cluster", None)
    if name in (broker.logs.topics if cluster is None else cluster.image.topics):
        return topic_entry(broker, name)
    if topic_name_problem(name):
        return topic_entry(broker, name, ErrorCode.INVALID_TOPIC_EXCEPTION)
    if not auto_create or name.startswith("__"):
        return topic_entry(broker, name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    if cluster is not None:
        cluster.auto_create(name)
        return _error_entry(name, ErrorCode.LEADER_NOT_AVAILABLE)
    try:
        broker.logs.create_topic(name, broker.config["num.partitions"], {})
        log.info("auto-created topic %s with %d partitions", name, broker.config["num.partitions"])
    except KafkaError as exc:
        if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
            return topic_entry(broker, name, exc.code)
    return topic_entry(broker, name)
