"""DeleteRecords: move a partition's log start offset forward."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ...errors import ErrorCode, KafkaError
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

log = logging.getLogger("oncelog.records")


async def handle_delete_records(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DELETE_RECORDS, ctx.api_version, body)
    topics = []
    moved = False
    for t in req.topics:
        parts = []
        meta = broker.logs.topics.get(t.name)
        for p in t.partitions:
            out = {"partition_index": p.partition_index, "low_watermark": -1, "error_code": 0}
            plog = broker.logs.get_log(t.name, p.partition_index)
            try:
                if plog is None or meta is None:
                    raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                if not meta.config.deletes:
                    raise KafkaError(ErrorCode.POLICY_VIOLATION, "Records of a compacted topic cannot be deleted")
                target = plog.high_watermark if p.offset == -1 else p.offset
                if target < 0 or target > plog.high_watermark:
                    raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE)
                out["low_watermark"] = plog.delete_records_before(target)
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
    return encode_response(ApiKey.DELETE_RECORDS, ctx.api_version, {"throttle_time_ms": 0, "topics": topics})
