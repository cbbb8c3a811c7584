"""DescribeCluster, DescribeLogDirs and AlterReplicaLogDirs.

DescribeCluster names every live broker and the controller (the single node: itself; cluster mode: from the
metadata image). DescribeLogDirs lists the partitions with a replica in this broker's data directory (cluster mode:
the replicas the image assigns here, followers included). A broker has that one log directory, so
AlterReplicaLogDirs has nothing to move: a replica asked into the directory it is already in is answered NONE (as
Kafka answers a move to the current directory), which is what kafka-reassign-partitions sends for a plan whose
"log_dirs" name real directories.

Authorization as Kafka's: DescribeCluster needs nothing (DESCRIBE on the cluster only decides whether
cluster_authorized_operations, when asked for, lists the allowed cluster operations or none); DescribeLogDirs needs
DESCRIBE on the cluster (else no directories, and CLUSTER_AUTHORIZATION_FAILED from v3, which has the field);
AlterReplicaLogDirs needs ALTER on the cluster (else every partition CLUSTER_AUTHORIZATION_FAILED)."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from ...errors import ErrorCode
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import ResourceType
from ...security.api_acls import CLUSTER_NAME
from .common import UNKNOWN_AUTHORIZED_OPERATIONS

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext


async def handle_describe_cluster(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DESCRIBE_CLUSTER, ctx.api_version, body)
    cluster = getattr(broker, "cluster", None)
    if cluster is None:
        host, port = broker.advertised_for(ctx.connection.listener)
        brokers = [{"broker_id": broker.node_id, "host": host, "port": port, "rack": None}]
        controller_id = broker.node_id
    else:
        brokers = [{"broker_id": node, "host": host, "port": port, "rack": rack}
                   for node, host, port, rack in cluster.brokers_on(ctx.connection.listener)]
        controller_id = cluster.image.controller_id
    data = {
        "throttle_time_ms": 0, "error_code": 0, "error_message": None, "endpoint_type": 1,
        "cluster_id": broker.cluster_id, "controller_id": controller_id,
        "brokers": brokers,
        "authorized_operations": UNKNOWN_AUTHORIZED_OPERATIONS,
    }
    if ctx.api_version >= 1 and req.endpoint_type not in (1,):
        data["error_code"] = ErrorCode.UNSUPPORTED_ENDPOINT_TYPE
        data["error_message"] = "Only broker endpoints are served"
        data["brokers"] = []
    elif req.include_cluster_authorized_operations:
        # AuthHelper.computeDescribeClusterResponse: the allowed cluster operations with DESCRIBE on it, else none
        data["authorized_operations"] = (ctx.authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME)
                                         if ctx.authorized_cluster() else set())
    return encode_response(ApiKey.DESCRIBE_CLUSTER, ctx.api_version, data)


def log_dir_name(broker: BrokerServices) -> str:
    """This broker's one log directory as clients see it: DescribeLogDirs names it and AlterReplicaLogDirs accepts
    exactly it (kafka-reassign-partitions --verify compares the two as strings)."""
    return str(broker.data_dir.resolve())


async def handle_describe_log_dirs(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DESCRIBE_LOG_DIRS, ctx.api_version, body)
    if not ctx.authorized_cluster():
        data = {"throttle_time_ms": 0, "error_code": ctx.denial(ResourceType.CLUSTER), "results": []}
        return encode_response(ApiKey.DESCRIBE_LOG_DIRS, ctx.api_version, data)
    wanted = None
    if req.topics is not None:
        wanted = {(t.topic, p) for t in req.topics for p in t.partitions}
    by_topic: dict[str, list[dict]] = {}
    for plog in broker.logs.all_logs():
        if wanted is not None and (plog.topic, plog.partition) not in wanted:
            continue
        by_topic.setdefault(plog.topic, []).append({
            "partition_index": plog.partition, "partition_size": plog.size_bytes,
            # Kafka's lag of a current replica: how far its high watermark is ahead of its log end (0 mostly).
            "offset_lag": max(plog.high_watermark - plog.log_end_offset, 0), "is_future_key": False,
        })
    usage = shutil.disk_usage(broker.data_dir)
    result = {
        "error_code": 0, "log_dir": log_dir_name(broker),
        "topics": [{"name": name, "partitions": parts} for name, parts in sorted(by_topic.items())],
        "total_bytes": usage.total, "usable_bytes": usage.free,
    }
    data = {"throttle_time_ms": 0, "error_code": 0, "results": [result]}
    return encode_response(ApiKey.DESCRIBE_LOG_DIRS, ctx.api_version, data)


async def handle_alter_replica_log_dirs(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    """Kafka's answers, in Kafka's order of checks: LOG_DIR_NOT_FOUND for a path that is not this broker's log
    directory; for this directory, NONE when the replica is here (already where it is asked to be),
    REPLICA_NOT_AVAILABLE when the partition exists but has no replica on this broker (yet: the tool retries
    that one while a reassignment brings the replica here), UNKNOWN_TOPIC_OR_PARTITION when there is no such
    partition. A partition named under two paths is answered for the last, as Kafka keys the request by
    partition."""
    req = decode_request(ApiKey.ALTER_REPLICA_LOG_DIRS, ctx.api_version, body)
    if not ctx.authorized_cluster():
        # AlterReplicaLogDirsRequest.getErrorResponse: each partition as the request lists it, path by path
        denied = ctx.denial(ResourceType.CLUSTER)
        data = {"throttle_time_ms": 0, "results": [
            {"topic_name": topic.name, "partitions": [{"partition_index": index, "error_code": denied}
                                                      for index in topic.partitions]}
            for entry in req.dirs for topic in entry.topics]}
        return encode_response(ApiKey.ALTER_REPLICA_LOG_DIRS, ctx.api_version, data)
    here = log_dir_name(broker)
    wanted: dict[tuple[str, int], str] = {}
    for entry in req.dirs:
        for topic in entry.topics:
            for index in topic.partitions:
                wanted[(topic.name, index)] = entry.path
    by_topic: dict[str, list[dict]] = {}
    for (name, index), path in wanted.items():
        if path != here:
            error = ErrorCode.LOG_DIR_NOT_FOUND
        else:
            found = broker.partitions.replica(name, index)
            if found == ErrorCode.NOT_LEADER_OR_FOLLOWER:
                error = ErrorCode.REPLICA_NOT_AVAILABLE  # Kafka keeps this code for AlterReplicaLogDirs
            elif isinstance(found, ErrorCode):
                error = found
            else:
                error = ErrorCode.NONE
        by_topic.setdefault(name, []).append({"partition_index": index, "error_code": error})
    data = {"throttle_time_ms": 0,
            "results": [{"topic_name": name, "partitions": parts} for name, parts in by_topic.items()]}
    return encode_response(ApiKey.ALTER_REPLICA_LOG_DIRS, ctx.api_version, data)
