"""Fetch: file regions behind a hand-built header, long-polled until min_bytes or max_wait.

Each partition is served only where the partition access says this broker leads it at the leader epoch the
request names (CurrentLeaderEpoch, v9+); otherwise the partition carries the error Kafka answers. A fetch with a
replica id (a follower, in cluster mode) is recorded with the partition access once and reads up to the log end;
if its LastFetchedEpoch shows its log diverging from this one (KIP-320), it gets DivergingEpoch instead, at once,
with no records, and its fetch offset counts for nothing (it is not an offset of this log).

Records are never parsed here. Each partition's data is a region of one segment file
(or a few bytes read with pread when small), sent with sendfile by the connection.
Fetch sessions (KIP-227) are not created: answering session id 0 makes every client
fall back to full fetch requests, which is correct, only less compact.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from ...errors import ErrorCode, KafkaError
from ...protocol.fetch_codec import (
    FetchPartitionResponse,
    decode_fetch_request,
    encode_fetch_response,
    pieces_size,
)
from ...security.acls import AclOperation, ResourceType
from ...security.quotas import INT_MAX, quota_user
from ..delayed import replica_key
from ..partition_access import LocalPartitionAccess
from ..wire import FileRegion, close_pieces
from .quotas import throttle, until_unmuted

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

READ_COMMITTED = 1


def _as_piece(result: Any) -> Any:
    """Storage read result → what the codec emits: bytes, or a FileRegion for sendfile."""
    if result is None or result.size == 0:
        if result is not None and getattr(result, "fd", None) is not None:
            os.close(result.fd)
        return b""
    if getattr(result, "data", None) is not None:
        return result.data
    return FileRegion(result.fd, result.position, result.length)


Verdict = ErrorCode | tuple[int, int] | None
UNDEFINED_EPOCH = -1


def _read_all(broker: BrokerServices, req: Any, conn: Any,
              replica: dict[tuple[str, int], Verdict] | None = None, denied: frozenset[str] = frozenset(),
              cap: int | None = None) -> tuple[list[tuple[str, list[FetchPartitionResponse]]], int, bool]:
    """One pass over the request's partitions. `replica`: for a follower's fetch, the verdict per partition (NONE:
    read up to the log end and answer the leader's own log start; an error: answer it; (epoch, end offset): its
    log diverges there, answer DivergingEpoch; None: serve it as a consumer fetch). `has_error` (answer now) is
    also set by a DivergingEpoch. `cap`: a consumer_byte_rate quota's bound on the response's bytes."""
    budget = min(req.max_bytes if req.max_bytes > 0 else broker.config["fetch.max.bytes"], broker.config["fetch.max.bytes"])
    if cap is not None:
        budget = min(budget, cap)
    total = 0
    has_error = False
    topics: list[tuple[str, list[FetchPartitionResponse]]] = []
    metrics = broker.metrics
    access = broker.partitions
    consumed = conn.fetch_positions
    for topic in req.topics:
        parts: list[FetchPartitionResponse] = []
        topics.append((topic.name, parts))
        if denied and topic.name in denied:
            # no READ on it: said before anything says whether it exists; as in Kafka the authorized partitions
            # still wait for min_bytes (all denied: no key is watched and the answer goes at once)
            parts.extend(_error_partition(fp.partition, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                         for fp in topic.partitions)
            continue
        for fp in topic.partitions:
            part = access.leader(topic.name, fp.partition, fp.current_leader_epoch)
            if isinstance(part, ErrorCode):
                has_error = True
                parts.append(_error_partition(fp.partition, part))
                continue
            key = (topic.name, fp.partition)
            plog = part.log
            hwm = plog.high_watermark
            lso = part.last_stable_offset
            verdict = None if replica is None else replica.get(key)
            if type(verdict) is tuple:
                has_error = True
                parts.append(FetchPartitionResponse(fp.partition, 0, hwm, lso, plog.log_start_offset, None, -1, b"",
                                                    verdict))
                continue
            if verdict is not None:
                if verdict:
                    has_error = True
                    parts.append(_error_partition(fp.partition, verdict))
                    continue
                upper = plog.log_end_offset  # a follower copies the whole log, not only what is committed
                log_start = plog.log_start_offset
            else:
                previous = consumed.get(key)
                if previous is not None and fp.fetch_offset > previous:
                    # The consumer asks for what follows what it got: those records were delivered.
                    metrics.messages_out.labels(topic.name).inc(fp.fetch_offset - previous)
                consumed[key] = fp.fetch_offset
                upper = lso if req.isolation_level == READ_COMMITTED else hwm
                log_start = access.log_start_offset(part)
            records: Any = b""
            error = ErrorCode.NONE
            if fp.fetch_offset < plog.log_start_offset or fp.fetch_offset > plog.log_end_offset:
                error = ErrorCode.OFFSET_OUT_OF_RANGE
                has_error = True
            elif budget - total > 0 or total == 0:
                limit = min(fp.partition_max_bytes, max(budget - total, 0))
                if limit > 0 or total == 0:
                    try:
                        result = plog.read(fp.fetch_offset, max(limit, 1), upper, min_one_batch=(total == 0))
                    except KafkaError as exc:
                        error = exc.code
                        has_error = True
                    else:
                        records = _as_piece(result)
                        size = records.size if isinstance(records, FileRegion) else len(records)
                        total += size
                        if size and verdict is None:
                            metrics.bytes_out.labels(topic.name).inc(size)
            parts.append(
                FetchPartitionResponse(
                    partition_index=fp.partition,
                    error_code=int(error),
                    high_watermark=hwm,
                    last_stable_offset=lso,
                    log_start_offset=log_start,
                    aborted_transactions=(
                        part.aborted_transactions(fp.fetch_offset, upper) if req.isolation_level else None
                    ),
                    preferred_read_replica=-1,
                    records=records,
                )
            )
    return topics, total, has_error


def _replica_verdicts(broker: BrokerServices, req: Any) -> dict[tuple[str, int], Verdict]:
    """A follower's fetch is recorded once per request (its fetch offset is its durable end: the leader's high
    watermark and ISR follow from it), not again at each wake-up of the long poll; one whose log diverges is
    not recorded at all."""
    access = broker.partitions
    replicated = not isinstance(access, LocalPartitionAccess)  # the single node has no followers
    verdicts: dict[tuple[str, int], Verdict] = {}
    for topic in req.topics:
        for fp in topic.partitions:
            part = access.leader(topic.name, fp.partition, fp.current_leader_epoch)
            if isinstance(part, ErrorCode):
                continue
            key = (topic.name, fp.partition)
            diverging = _diverging(access, part, fp) if replicated and fp.last_fetched_epoch >= 0 else None
            if diverging is not None:
                verdicts[key] = diverging
                continue
            verdicts[key] = access.replica_fetch(part, req.replica_id, fp.fetch_offset, fp.log_start_offset,
                                                 req.replica_epoch)
    return verdicts


def _diverging(access: Any, part: Any, fp: Any) -> tuple[int, int] | None:
    """Where a follower's log stops agreeing with this one, from the epoch of its last batch (KIP-320, Kafka's
    Partition.readRecords): this log's end of the largest epoch not above it, when that is an older epoch or
    ends before the follower's fetch offset (an epoch older than every one kept here ends where this log's
    history begins, KAFKA-7415). When this log can say nothing of it (no epochs here, or the follower's is newer
    than all of them, which no elected leader sees), nothing it holds past this log's start is known to agree:
    (-1, log start), which followers read as an epoch the leader does not know and truncate to that offset.
    A fetch offset below the log start is OFFSET_OUT_OF_RANGE, as before."""
    plog = part.log
    offset, last_epoch = fp.fetch_offset, fp.last_fetched_epoch
    if offset < plog.log_start_offset:
        return None
    epoch, end = access.end_offset_for_epoch(part, last_epoch)
    if epoch == UNDEFINED_EPOCH or end < 0:
        return (UNDEFINED_EPOCH, plog.log_start_offset) if offset > plog.log_start_offset else None
    if epoch < last_epoch or end < offset:
        return epoch, end
    return None


def _error_partition(index: int, error: ErrorCode) -> FetchPartitionResponse:
    return FetchPartitionResponse(
        partition_index=index,
        error_code=int(error),
        high_watermark=-1,
        last_stable_offset=-1,
        log_start_offset=-1,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=b"",
    )


def _release(topics: list[tuple[str, list[FetchPartitionResponse]]]) -> None:
    close_pieces([p.records for _, parts in topics for p in parts])


async def handle(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> Any:
    req = decode_fetch_request(body, ctx.api_version)
    if ctx.api_version >= 7 and (req.session_id != 0 or req.session_epoch > 0):
        return encode_fetch_response(ctx.api_version, 0, int(ErrorCode.FETCH_SESSION_ID_NOT_FOUND), 0, [])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(req.max_wait_ms, 0) / 1000
    denied: frozenset[str] = frozenset()
    if ctx.authorizer is not None:
        if req.replica_id >= 0:
            if not ctx.authorized_cluster(AclOperation.CLUSTER_ACTION):
                # a client posing as a follower: no records, and no follower state (ISR, high watermark) moves
                refused = [(t.name, [_error_partition(p.partition, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                                     for p in t.partitions]) for t in req.topics]
                return encode_fetch_response(ctx.api_version, 0, 0, 0, refused)
        else:
            names = [t.name for t in req.topics for _ in t.partitions]
            denied = frozenset(names) - set(ctx.filter_authorized(ResourceType.TOPIC, names))
    # a follower's fetch (authorized as one above) is not request-throttled: Kafka's sendResponseExemptThrottle
    ctx.quota_exempt = req.replica_id >= 0
    quota = None
    cap = None
    min_bytes = req.min_bytes
    if req.replica_id < 0 and broker.security.quota_manager.fetch.enabled:
        # consumer_byte_rate (followers are not client-throttled): the response may not exceed what the quota
        # window can take at once, or a consumer could be throttled forever (KAFKA-9677)
        quota = broker.security.quota_manager.fetch
        if not await until_unmuted(ctx):
            return None
        most = quota.max_value_in_window(quota_user(ctx.principal), ctx.client_id or "")
        cap = int(min(most, INT_MAX))
        min_bytes = min(min_bytes, cap)
    keys = [(t.name, p.partition) for t in req.topics for p in t.partitions if t.name not in denied]
    replica = _replica_verdicts(broker, req) if req.replica_id >= 0 else None
    watched = keys + [replica_key(req.replica_id)] if replica is not None else keys
    answer_now = False      # a follower's fetch asked to answer early (delayed.py wake_replica)
    while True:
        topics, total, has_error = _read_all(broker, req, ctx.connection, replica, denied, cap)
        remaining = deadline - loop.time()
        if (answer_now or total >= min_bytes or has_error or remaining <= 0 or ctx.connection.closed
                or not keys):
            break
        _release(topics)
        event = asyncio.Event()
        wakes = broker.watchers.replica_wakes(req.replica_id) if replica is not None else 0
        broker.watchers.watch(watched, event)
        try:
            async with asyncio.timeout(remaining):  # not wait_for: on 3.11 it can swallow a cancellation
                await event.wait()
        except TimeoutError:
            pass
        finally:
            broker.watchers.unwatch(watched, event)
        answer_now = replica is not None and broker.watchers.replica_wakes(req.replica_id) != wakes
    response = encode_fetch_response(ctx.api_version, 0, 0, 0, topics)
    if quota is not None:
        # Kafka's handleFetchRequest: the response's size is recorded; over the quota, the answer is an empty
        # fetch response carrying the throttle time instead of the data, which then does not count
        throttle_ms = throttle(broker, ctx, quota, pieces_size(response), unrecord_if_throttled=True)
        if throttle_ms:
            _release(topics)
            return encode_fetch_response(ctx.api_version, throttle_ms, 0, 0, [])
    return response
