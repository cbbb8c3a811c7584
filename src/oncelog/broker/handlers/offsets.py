"""Committed-offset APIs: OffsetCommit, OffsetFetch, OffsetDelete (wire shapes per version).

Authorization (security/api_acls.RULES) as Kafka's KafkaApis makes it: the group first, for the whole request (for
each group of a v8+ OffsetFetch), then each topic. A topic the caller may not use answers
TOPIC_AUTHORIZATION_FAILED whether or not it exists, and none of its partitions reaches the coordinator; an
OffsetFetch of all partitions simply leaves such topics out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...coordinator.group.api import FetchedOffset, OffsetCommitItem
from ...errors import ErrorCode
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import ResourceType
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
    if not ctx.authorized(ResourceType.GROUP, req.group_id):
        errors = [ctx.denial(ResourceType.GROUP)] * len(items)
    else:
        allowed = set(ctx.filter_authorized(ResourceType.TOPIC, [t.name for t in req.topics]))
        errors = [ErrorCode.NONE if i.topic in allowed else ctx.denial(ResourceType.TOPIC) for i in items]
        committed = [n for n, i in enumerate(items) if i.topic in allowed]
        if committed:  # Kafka asks the coordinator only when some partition is left to commit
            if groups is None:
                answers = [ErrorCode.COORDINATOR_NOT_AVAILABLE] * len(committed)
            else:
                answers = await groups.commit_offsets(
                    req.group_id, req.generation_id_or_member_epoch, req.member_id,
                    req.group_instance_id if version >= 7 else None, [items[n] for n in committed],
                    req.retention_time_ms if version <= 4 else -1,
                )
            for n, error in zip(committed, answers, strict=True):
                errors[n] = error
    topics = _by_topic([(i.topic, {"partition_index": i.partition, "error_code": e})
                        for i, e in zip(items, errors, strict=True)])
    data = {"throttle_time_ms": 0, "topics": [{"name": t, "partitions": ps} for t, ps in topics]}
    return encode_response(ApiKey.OFFSET_COMMIT, version, data)


def _partition_entry(f: FetchedOffset) -> dict[str, Any]:
    return {"partition_index": f.partition, "committed_offset": f.offset, "committed_leader_epoch": f.leader_epoch,
            "metadata": f.metadata, "error_code": f.error}


def _fetch_group(broker: BrokerServices, ctx: RequestContext, group_id: str, topics: Any,
                 require_stable: bool) -> tuple[ErrorCode, list[tuple[str, list[dict[str, Any]]]]]:
    if not ctx.authorized(ResourceType.GROUP, group_id):
        denied = ctx.denial(ResourceType.GROUP)
        # before v2 an answer has no group-level error: each partition asked for carries it (Kafka's error answer)
        named = [] if topics is None or ctx.api_version >= 2 else topics
        return denied, _by_topic([(t.name, _partition_entry(FetchedOffset(t.name, p, error=denied)))
                                  for t in named for p in t.partition_indexes])
    refused: list[Any] = []
    if topics is None:
        partitions = None
    else:
        allowed = set(ctx.filter_authorized(ResourceType.TOPIC, [t.name for t in topics]))
        refused = [t for t in topics if t.name not in allowed]
        partitions = [(t.name, p) for t in topics if t.name in allowed for p in t.partition_indexes]
    groups = coordinator_of(broker)
    if groups is None:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        fetched = [FetchedOffset(t, p, error=error) for t, p in partitions or []]
    else:
        error, fetched = groups.fetch_offsets(group_id, partitions, require_stable)
    if not error:
        if topics is None:
            # all partitions: offsets of topics the caller may not DESCRIBE are left out
            visible = set(ctx.filter_authorized(ResourceType.TOPIC, dict.fromkeys(f.topic for f in fetched)))
            fetched = [f for f in fetched if f.topic in visible]
        elif refused:
            denied = ctx.denial(ResourceType.TOPIC)
            fetched = fetched + [FetchedOffset(t.name, p, error=denied) for t in refused for p in t.partition_indexes]
    return error, _by_topic([(f.topic, _partition_entry(f)) for f in fetched])


async def handle_offset_fetch(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.OFFSET_FETCH, ctx.api_version, body)
    version = ctx.api_version
    require_stable = bool(req.require_stable) if version >= 7 else False
    if version >= 8:
        answers = []
        for g in req.groups:
            error, topics = _fetch_group(broker, ctx, g.group_id, g.topics, require_stable)
            answers.append({"group_id": g.group_id, "error_code": error,
                            "topics": [{"name": t, "partitions": ps} for t, ps in topics]})
        data: dict[str, Any] = {"throttle_time_ms": 0, "groups": answers}
    else:
        error, topics = _fetch_group(broker, ctx, req.group_id, req.topics, require_stable)
        data = {"throttle_time_ms": 0, "error_code": error,
                "topics": [{"name": t, "partitions": ps} for t, ps in topics]}
    return encode_response(ApiKey.OFFSET_FETCH, version, data)


async def handle_offset_delete(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.OFFSET_DELETE, ctx.api_version, body)
    partitions = [(t.name, p.partition_index) for t in req.topics for p in t.partitions]
    groups = coordinator_of(broker)
    answers: dict[tuple[str, int], ErrorCode] = {}
    if not ctx.authorized(ResourceType.GROUP, req.group_id):
        error = ctx.denial(ResourceType.GROUP)  # Kafka's error answer: the error alone, no partitions
    else:
        allowed = set(ctx.filter_authorized(ResourceType.TOPIC, [t.name for t in req.topics]))
        deleted = [tp for tp in partitions if tp[0] in allowed]
        # the coordinator is asked even when no partition is left: its group-level errors still answer
        if groups is None:
            error, errors = ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        else:
            error, errors = await groups.delete_offsets(req.group_id, deleted)
        if not error:  # a group-level error answers alone, as Kafka's merge of the two answers
            answers = dict(zip(deleted, errors, strict=True))
            answers.update((tp, ctx.denial(ResourceType.TOPIC)) for tp in partitions if tp[0] not in allowed)
    topics = _by_topic([(t, {"partition_index": p, "error_code": answers[t, p]})
                        for t, p in partitions if (t, p) in answers])
    data = {"throttle_time_ms": 0, "error_code": error,
            "topics": [{"name": t, "partitions": ps} for t, ps in topics]}
    return encode_response(ApiKey.OFFSET_DELETE, ctx.api_version, data)
