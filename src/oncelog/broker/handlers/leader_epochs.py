"""OffsetsForLeaderEpoch (API 23, v2-v4, Kafka 4.x's range): where a leader epoch ended, for truncation.

Followers ask it before fetching from a new leader (KIP-101/KIP-279) and consumers ask it to check that the
position they hold (an offset and the epoch that wrote the record before it) is still in the leader's log
after a leader change (KIP-320). Only the leader answers, at the leader epoch the request names; the answer
comes from the partition's leader-epoch history through the partition access.

Authorization is Kafka's handleOffsetForLeaderEpochRequest: CLUSTER_ACTION on the cluster covers every topic,
whoever asks (Kafka does not look at replica_id); without it each topic needs DESCRIBE, and each partition of a
topic the caller may not describe answers TOPIC_AUTHORIZATION_FAILED, whether or not the topic exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import ErrorCode
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import ResourceType

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext


async def handle_offsets_for_leader_epoch(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.OFFSET_FOR_LEADER_EPOCH, ctx.api_version, body)
    access = broker.partitions
    names = [t.topic for t in req.topics]
    if ctx.authorized_cluster(log_denied=False):
        described = set(names)
    else:
        described = set(ctx.filter_authorized(ResourceType.TOPIC, names))
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            out = {"error_code": 0, "partition": p.partition, "leader_epoch": -1, "end_offset": -1}
            if t.topic not in described:
                out["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                parts.append(out)
                continue
            part = access.leader(t.topic, p.partition, p.current_leader_epoch)
            if isinstance(part, ErrorCode):
                out["error_code"] = part
            else:
                out["leader_epoch"], out["end_offset"] = access.end_offset_for_epoch(part, p.leader_epoch)
            parts.append(out)
        topics.append({"topic": t.topic, "partitions": parts})
    return encode_response(ApiKey.OFFSET_FOR_LEADER_EPOCH, ctx.api_version, {"throttle_time_ms": 0, "topics": topics})
