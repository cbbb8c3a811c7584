"""DeleteRecords: move a partition's log start offset forward.

DELETE on the topic is needed (Kafka's handleDeleteRecordsRequest): each partition of a topic the caller may not
delete answers TOPIC_AUTHORIZATION_FAILED, whether or not the topic exists, and nothing of it moves."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ...errors import ErrorCode, KafkaError
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import ResourceType

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

log = logging.getLogger("oncelog.records")


async def handle_delete_records(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DELETE_RECORDS, ctx.api_version, body)
    access = broker.partitions
    topics = []
    moved = False
    done: list[tuple[dict, Any, int]] = []  # (answer, partition, offset deleted before)
    deletable = set(ctx.filter_authorized(ResourceType.TOPIC, [t.name for t in req.topics]))
    for t in req.topics:
        parts = []
        meta = broker.logs.topics.get(t.name)
        for p in t.partitions:
            out = {"partition_index": p.partition_index, "low_watermark": -1, "error_code": 0}
            if t.name not in deletable:
                out["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                parts.append(out)
                continue
            part = access.leader(t.name, p.partition_index) if meta is not None else \
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            try:
                if isinstance(part, ErrorCode):
                    raise KafkaError(part)
                if not meta.config.deletes:
                    raise KafkaError(ErrorCode.POLICY_VIOLATION, "Records of a compacted topic cannot be deleted")
                plog = part.log
                target = plog.high_watermark if p.offset == -1 else p.offset
                if target < 0 or target > plog.high_watermark:
                    raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE)
                out["low_watermark"] = plog.delete_records_before(target)
                done.append((out, part, target))
                moved = True
            except KafkaError as exc:
                out["error_code"] = exc.code
            parts.append(out)
        topics.append({"name": t.name, "partitions": parts})
    if moved:
        try:
            broker.logs.checkpoint()  # a log start offset must survive a crash once acknowledged
        except OSError as exc:
            # Not durable, so not acknowledged (a full disk, a failing device): the deletion stands in memory
            # and the next checkpoint persists it, but this answer promises nothing.
            for t in topics:
                for out in t["partitions"]:
                    if out["error_code"] == 0:
                        out.update(error_code=ErrorCode.KAFKA_STORAGE_ERROR, low_watermark=-1)
            log.error("DeleteRecords: writing the log start offset checkpoint failed: %s", exc)
            done = []
    # A replicated leader answers once its replicas have moved their log start too (the single node: at once).
    if done:
        results = await asyncio.gather(*(access.wait_log_start(part, target, req.timeout_ms)
                                         for _, part, target in done), return_exceptions=True)
        for (out, _, _), result in zip(done, results, strict=True):
            if isinstance(result, KafkaError):
                out.update(error_code=result.code, low_watermark=-1)
            elif isinstance(result, BaseException):
                log.error("DeleteRecords: waiting for the replicas failed: %r", result)
                out.update(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, low_watermark=-1)
            else:
                out["low_watermark"] = result
    return encode_response(ApiKey.DELETE_RECORDS, ctx.api_version, {"throttle_time_ms": 0, "topics": topics})
