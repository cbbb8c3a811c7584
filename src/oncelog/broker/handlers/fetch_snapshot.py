"""FetchSnapshot (inter-broker, never advertised): a follower whose log started over takes its leader's producer
state (docs/cluster.md §4.7).

In Kafka, FetchSnapshot (API key 59) copies a KRaft voter's metadata snapshot in chunks. oncelog reuses its layout
for one thing Kafka does not transfer at all: a partition's producer state, so that a replica added by
reassignment or rebuilt from an empty disk knows the producers whose batches were deleted before it copied the
log (seed 000). Differences from Kafka's use, all on a request only oncelog brokers send to each other:

- SnapshotId -1/-1 asks for the leader's current state, taken when the request arrives; the answer names it
  (EndOffset = the log end offset L it describes, Epoch = the leader epoch it was taken at). A named SnapshotId
  is SNAPSHOT_NOT_FOUND: a leader keeps no earlier states to serve again.
- The state is sent whole (Position 0, Size = the bytes sent; a few hundred bytes per producer), whatever
  MaxBytes says; a Position other than 0 is POSITION_OUT_OF_RANGE.
- Each partition is answered once L is committed (the replica manager's rule); partitions wait concurrently.

CLUSTER_ACTION on the cluster is needed, as for Kafka's FetchSnapshot: without it the answer is the top-level
CLUSTER_AUTHORIZATION_FAILED and no partition (FetchSnapshotRequest.getErrorResponse), and no state is taken.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ...errors import ErrorCode, KafkaError
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import ResourceType

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

CURRENT = -1  # SnapshotId.EndOffset meaning "the state the leader has now"


def _answer(index: int, error: ErrorCode, leader: int = -1, leader_epoch: int = -1, end_offset: int = -1,
            data: bytes = b"") -> dict[str, Any]:
    return {"index": index, "error_code": int(error),
            "snapshot_id": {"end_offset": end_offset, "epoch": leader_epoch if end_offset >= 0 else -1},
            "current_leader": {"leader_id": leader, "leader_epoch": leader_epoch},
            "size": len(data), "position": 0, "unaligned_records": data}


async def _partition(broker: BrokerServices, replica_id: int, topic: str, p: Any) -> dict[str, Any]:
    access = broker.partitions
    part = access.leader(topic, p.partition, p.current_leader_epoch)
    if isinstance(part, ErrorCode):
        return _answer(p.partition, part, leader_epoch=access.leader_epoch(topic, p.partition))
    if p.snapshot_id.end_offset != CURRENT:
        return _answer(p.partition, ErrorCode.SNAPSHOT_NOT_FOUND)
    if p.position != 0:
        return _answer(p.partition, ErrorCode.POSITION_OUT_OF_RANGE)
    try:
        data, offset, epoch = await access.producer_snapshot(part, replica_id)
    except KafkaError as exc:
        return _answer(p.partition, exc.code, leader_epoch=access.leader_epoch(topic, p.partition))
    return _answer(p.partition, ErrorCode.NONE, broker.node_id, epoch, offset, data)


async def handle(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.FETCH_SNAPSHOT, ctx.api_version, body)
    if not ctx.authorized_cluster():
        return encode_response(ApiKey.FETCH_SNAPSHOT, ctx.api_version, {
            "throttle_time_ms": 0, "error_code": ctx.denial(ResourceType.CLUSTER), "topics": []})
    names = [t.name for t in req.topics for _ in t.partitions]
    answers = await asyncio.gather(*(_partition(broker, req.replica_id, t.name, p)
                                     for t in req.topics for p in t.partitions))
    topics: dict[str, list[dict[str, Any]]] = {}
    for name, answer in zip(names, answers, strict=True):
        topics.setdefault(name, []).append(answer)
    data = {"throttle_time_ms": 0, "error_code": 0,
            "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()]}
    return encode_response(ApiKey.FETCH_SNAPSHOT, ctx.api_version, data)
