"""DescribeCluster and DescribeLogDirs.

DescribeCluster names every live broker and the controller (the single node: itself; cluster mode: from the
metadata image). DescribeLogDirs lists the partitions with a replica in this broker's data directory (cluster mode:
the replicas the image assigns here, followers included)."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from ...errors import ErrorCode
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from .common import UNKNOWN_AUTHORIZED_OPERATIONS

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext


async def handle_describe_cluster(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DESCRIBE_CLUSTER, ctx.api_version, body)
    cluster = getattr(broker, "cluster", None)
    if cluster is None:
        host, port = broker.advertised
        brokers = [{"broker_id": broker.node_id, "host": host, "port": port, "rack": None}]
        controller_id = broker.node_id
    else:
        brokers = [{"broker_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
                   for _, b in sorted(cluster.image.brokers.items())]
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
    return encode_response(ApiKey.DESCRIBE_CLUSTER, ctx.api_version, data)


async def handle_describe_log_dirs(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DESCRIBE_LOG_DIRS, ctx.api_version, body)
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
        "error_code": 0, "log_dir": str(broker.data_dir.resolve()),
        "topics": [{"name": name, "partitions": parts} for name, parts in sorted(by_topic.items())],
        "total_bytes": usage.total, "usable_bytes": usage.free,
    }
    data = {"throttle_time_ms": 0, "error_code": 0, "results": [result]}
    return encode_response(ApiKey.DESCRIBE_LOG_DIRS, ctx.api_version, data)
