"""Committed-offset APIs: OffsetCommit, OffsetFetch, OffsetDelete (wire shapes per version)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...coordinator.group.api import FetchedOffset, OffsetCommitItem
from ...errors import ErrorCode
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from .groups import coordinator_of

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext


def _by_topic(entries: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Group per-partition answers under their topic, keeping the request's order."""
    topics: dict[str, list[dict[str, Any]]] = {}
    for topic, entry in entries:
        topics.setdefault(topic, []).append(entry)
    return list(topics.items())


async def handle_offset_commit(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.OFFSET_COMMIT, ctx.api_version, body)
    version = ctx.api_version
    items = [
        OffsetCommitItem(t.name, p.partition_index, p.committed_offset,
                         p.committed_leader_epoch if version >= 6 else -1, p.committed_metadata)
        for t in req.topics for p in t.partitions
    ]
    groups = coordinator_of(broker)
    if groups is None:
        errors = [ErrorCode.COORDINATOR_NOT_AVAILABLE] * len(items)
    else:
        errors = await groups.commit_offsets(
            req.group_id, req.generation_id_or_member_epoch, req.member_id,
            req.group_instance_id if version >= 7 else None, items,
            req.retention_time_ms if version <= 4 else -1,
        )
    topics = _by_topic([(i.topic, {"partition_index": i.partition, "error_code": e})
                        for i, e in zip(items, errors, strict=True)])
    data = {"throttle_time_ms": 0, "topics": [{"name": t, "partitions": ps} for t, ps in topics]}
    return encode_response(ApiKey.OFFSET_COMMIT, version, data)


def _partition_entry(f: FetchedOffset) -> dict[str, Any]:
    return {"partition_index": f.partition, "committed_offset": f.offset, "committed_leader_epoch": f.leader_epoch,
            "metadata": f.metadata, "error_code": f.error}


def _fetch_group(broker: BrokerServices, group_id: str, topics: Any,
                 require_stable: bool) -> tuple[ErrorCode, list[tuple[str, list[dict[str, Any]]]]]:
    partitions = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    groups = coordinator_of(broker)
    if groups is None:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        fetched = [FetchedOffset(t, p, error=error) for t, p in partitions or []]
    else:
        error, fetched = groups.fetch_offsets(group_id, partitions, require_stable)
    return error, _by_topic([(f.topic, _partition_entry(f)) for f in fetched])


async def handle_offset_fetch(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.OFFSET_FETCH, ctx.api_version, body)
    version = ctx.api_version
    require_stable = bool(req.require_stable) if version >= 7 else False
    if version >= 8:
        answers = []
        for g in req.groups:
            error, topics = _fetch_group(broker, g.group_id, g.topics, require_stable)
            answers.append({"group_id": g.group_id, "error_code": error,
                            "topics": [{"name": t, "partitions": ps} for t, ps in topics]})
        data: dict[str, Any] = {"throttle_time_ms": 0, "groups": answers}
    else:
        error, topics = _fetch_group(broker, req.group_id, req.topics, require_stable)
        data = {"throttle_time_ms": 0, "error_code": error,
                "topics": [{"name": t, "partitions": ps} for t, ps in topics]}
    return encode_response(ApiKey.OFFSET_FETCH, version, data)


async def handle_offset_delete(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.OFFSET_DELETE, ctx.api_version, body)
    partitions = [(t.name, p.partition_index) for t in req.topics for p in t.partitions]
    groups = coordinator_of(broker)
    if groups is None:
        error, errors = ErrorCode.COORDINATOR_NOT_AVAILABLE, []
    else:
        error, errors = await groups.delete_offsets(req.group_id, partitions)
    topics = _by_topic([(t, {"partition_index": p, "error_code": e})
                        for (t, p), e in zip(partitions, errors, strict=False)])
    data = {"throttle_time_ms": 0, "error_code": error,
            "topics": [{"name": t, "partitions": ps} for t, ps in topics]}
    return encode_response(ApiKey.OFFSET_DELETE, ctx.api_version, data)
