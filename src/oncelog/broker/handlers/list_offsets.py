"""ListOffsets: earliest, latest (high watermark or last stable offset), by timestamp, max timestamp.

DESCRIBE on the topic is needed (Kafka's handleListOffsetRequest, whoever asks, followers included): each partition
of a topic the caller may not describe answers TOPIC_AUTHORIZATION_FAILED, whether or not the topic exists."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import ErrorCode
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import ResourceType

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


def lookup(broker: BrokerServices, topic: str, partition: int, timestamp: int, isolation: int,
           from_client: bool = True, current_leader_epoch: int = -1) -> dict[str, Any]:
    """One partition's answer, from its leader only, at the leader epoch the request names (v4+). For a client
    (replica id -1) an offset found from record data (by timestamp, max timestamp) counts only below the end
    that client may read, Kafka's lastFetchableOffset: the last stable offset under read_committed, else the
    high watermark; at or past it the answer is "none" (-1), so no client learns an offset it cannot fetch,
    e.g. inside a transaction that is still open. The leader epoch answered is the one that wrote the offset
    (for the latest offset, the current one), which clients keep to validate their position later."""
    access = broker.partitions
    part = access.leader(topic, partition, current_leader_epoch)
    out = {"partition_index": partition, "error_code": 0, "timestamp": -1, "offset": -1, "leader_epoch": -1}
    if isinstance(part, ErrorCode):
        out["error_code"] = part
        return out
    plog = part.log
    if timestamp == EARLIEST:
        out["offset"] = access.log_start_offset(part) if from_client else plog.log_start_offset
    elif timestamp == LATEST:
        if not from_client:
            out["offset"] = plog.log_end_offset  # Kafka: a follower or debug tool is told the log end
        elif not access.offsets_available(part):
            out["error_code"] = ErrorCode.OFFSET_NOT_AVAILABLE  # a new leader's high watermark still lags
        else:
            out["offset"] = part.last_stable_offset if isolation == 1 else plog.high_watermark
    elif timestamp == MAX_TIMESTAMP or timestamp >= 0:
        found = part.max_timestamp() if timestamp == MAX_TIMESTAMP else part.offset_for_timestamp(timestamp)
        if from_client:
            bound = part.last_stable_offset if isolation == 1 else plog.high_watermark
            if found is not None and found[0] >= bound:
                found = None
        if found is not None:
            out["offset"], out["timestamp"] = found
    else:
        out["error_code"] = ErrorCode.INVALID_REQUEST
    if out["offset"] >= 0 and out["error_code"] == 0:
        out["leader_epoch"] = (access.leader_epoch(topic, partition) if timestamp == LATEST
                               else access.epoch_for_offset(part, out["offset"]))
    return out


def _denied(partition: int) -> dict[str, Any]:
    return {"partition_index": partition, "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "timestamp": -1,
            "offset": -1, "leader_epoch": -1}


async def handle(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.LIST_OFFSETS, ctx.api_version, body)
    isolation = req.isolation_level if ctx.api_version >= 2 else 0
    from_client = req.replica_id == -1  # Kafka's consumer replica id; a follower or debug tool sees the log end
    describable = set(ctx.filter_authorized(ResourceType.TOPIC, [t.name for t in req.topics]))
    topics = [
        {
            "name": t.name,
            "partitions": [lookup(broker, t.name, p.partition_index, p.timestamp, isolation, from_client,
                                  p.current_leader_epoch if ctx.api_version >= 4 else -1)
                           if t.name in describable else _denied(p.partition_index)
                           for p in t.partitions],
        }
        for t in req.topics
    ]
    return encode_response(ApiKey.LIST_OFFSETS, ctx.api_version, {"throttle_time_ms": 0, "topics": topics})
