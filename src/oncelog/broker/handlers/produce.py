"""Produce: validate, append, and (acks=all) wait until the partition access says the write is acknowledged
(the single node: the group-commit fsync; a replicated leader: the ISR has it on disk).

Everything before the first await runs synchronously, in the order requests arrived
on the connection, so a client's pipelined batches are appended in its order. The
batch bytes are never copied: the request frame is the buffer the socket wrote into,
the log patches the base offset in place and writes that memory to the segment. The one
exception is a batch whose codec is not the topic's compression.type: it is stored rebuilt.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, NamedTuple

from ...errors import ErrorCode, KafkaError
from ...protocol.produce_codec import (
    ProducePartitionResponse,
    decode_produce_request,
    encode_produce_response,
)
from ...records.batch import read_header, set_log_append_time
from ...records.validate import convert_codec, stored_codec, validate_produce
from ...security.acls import ResourceType
from .common import now_ms
from .quotas import throttle, until_unmuted

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

log = logging.getLogger("oncelog.produce")


class _Slot:
    """One partition's answer, filled in as the append (and its fsync wait) completes."""

    __slots__ = ("index", "error", "base_offset", "log_append_time", "log_start_offset", "record_errors", "message")

    def __init__(self, index: int) -> None:
        self.index = index
        self.error = ErrorCode.NONE
        self.base_offset = -1
        self.log_append_time = -1
        self.log_start_offset = -1
        self.record_errors: list[tuple[int, str | None]] = []
        self.message: str | None = None

    def response(self) -> ProducePartitionResponse:
        return ProducePartitionResponse(
            self.index, int(self.error), self.base_offset, self.log_append_time, self.log_start_offset,
            self.record_errors, self.message,
        )


def _client_facing(broker: BrokerServices, ctx: RequestContext, header: Any, error: ErrorCode,
                   message: str | None) -> tuple[ErrorCode, str | None]:
    """Translate a refusal into the code this client version understands and recovers from; which code a
    timed-out transaction's owner gets is the transaction coordinator's rule."""
    if error == ErrorCode.INVALID_PRODUCER_EPOCH and header.is_transactional and broker.txn_coordinator:
        answer = broker.txn_coordinator.stale_epoch_answer(
            header.producer_id, header.producer_epoch, ctx.connection.client_software
        )
        if answer is not None:
            return answer
    if error == ErrorCode.TRANSACTION_ABORTABLE and ctx.api_version <= 10:
        return ErrorCode.INVALID_TXN_STATE, message  # Produce v10 and older do not know code 120
    return error, message


async def handle(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> Any:
    throttle_ms = 0
    quota = broker.security.quota_manager.produce
    if quota.enabled:
        # producer_byte_rate: the request's size counts (Kafka's request.sizeInBytes, the frame after its length, of
        # which `body` is the tail), acks=0 too; over the quota the answer carries the throttle time and the
        # connection is muted for it (KIP-219). Recorded as the request starts, not when it is answered as in Kafka:
        # requests read behind it then wait for the throttle, as behind Kafka's muted channel.
        if not await until_unmuted(ctx):
            return None
        owner = getattr(body, "obj", None)
        throttle_ms = throttle(broker, ctx, quota, len(owner) if owner is not None else len(body))
    req = decode_produce_request(body, ctx.api_version)
    conn = ctx.connection
    denied: frozenset[str] = frozenset()
    if ctx.authorizer is not None:
        refusal, denied = _authorization(ctx, req)
        if refusal:
            return await _answer(ctx, req, _refused(req, refusal), [], throttle_ms)
    earlier = conn.produce_gate
    verify = _remote_verifications(broker, req)
    if not verify and (earlier is None or earlier.done()):
        topics, waits, stale = _append_all(broker, ctx, req, {}, denied)
        if stale:
            await _remote_stale_owners(broker, ctx, req, stale)
        return await _answer(ctx, req, topics, waits, throttle_ms)
    # A transactional producer's first batch on a partition whose coordinator is another broker: ask it first
    # (txn_verification). The connection's later produce requests wait behind this one's appends, so a client's
    # pipelined batches still reach each partition in the order it sent them.
    gate = asyncio.get_running_loop().create_future()
    conn.produce_gate = gate
    try:
        if earlier is not None and not earlier.done():
            await earlier
        refused: dict[tuple[str, int], tuple[ErrorCode, str | None]] = {}
        if verify:
            pid, epoch, tps = verify
            verifier = broker.txn_verifier
            assert verifier is not None and req.transactional_id is not None
            answers = await verifier.verify(req.transactional_id, pid, epoch, tps, req.timeout_ms / 1000)
            refused = {tp: answer for tp, answer in answers.items() if answer[0]}
        topics, waits, stale = _append_all(broker, ctx, req, refused, denied)
    finally:
        gate.set_result(None)
        if conn.produce_gate is gate:
            conn.produce_gate = None
    if stale:
        await _remote_stale_owners(broker, ctx, req, stale)
    return await _answer(ctx, req, topics, waits, throttle_ms)


def _authorization(ctx: RequestContext, req: Any) -> tuple[ErrorCode, frozenset[str]]:
    """Kafka's checks (security/api_acls.RULES): WRITE on the transactional id when the request carries
    transactional batches (else the whole request is refused), then WRITE on each topic. (request-wide refusal or
    NONE, the topics the caller may not write)."""
    transactional = False
    for _, partitions in req.topics:
        for _, records in partitions:
            try:
                transactional = transactional or read_header(records).is_transactional
            except Exception:
                continue  # malformed: the append path answers it
    if transactional and not (req.transactional_id
                              and ctx.authorized(ResourceType.TRANSACTIONAL_ID, req.transactional_id)):
        return ctx.denial(ResourceType.TRANSACTIONAL_ID), frozenset()
    names = [name for name, partitions in req.topics for _ in partitions]
    return ErrorCode.NONE, frozenset(names) - set(ctx.filter_authorized(ResourceType.TOPIC, names))


def _refused(req: Any, refusal: ErrorCode) -> list[tuple[str, list[_Slot]]]:
    """Every partition answered with a request-wide refusal: nothing is appended."""
    topics = []
    for name, partitions in req.topics:
        slots = []
        for index, _ in partitions:
            slot = _Slot(index)
            slot.error = refusal
            slots.append(slot)
        topics.append((name, slots))
    return topics


def _remote_verifications(broker: BrokerServices, req: Any) -> tuple[int, int, list[tuple[str, int]]] | None:
    """(producer id, epoch, partitions) whose first transactional batch needs a remote coordinator's word; None
    for every request that is not transactional, and always on the single node."""
    verifier = broker.txn_verifier
    if verifier is None or not req.transactional_id:
        return None
    found: list[tuple[str, int]] = []
    pid = epoch = -1
    for topic_name, partitions in req.topics:
        for index, records in partitions:
            part = broker.partitions.leader(topic_name, index)
            if isinstance(part, ErrorCode):
                continue
            try:
                header = read_header(records)
            except Exception:
                continue          # malformed: the append path answers it
            if verifier.needed(part, req.transactional_id, header.producer_id, header.producer_epoch,
                               header.is_transactional):
                found.append((topic_name, index))
                pid, epoch = header.producer_id, header.producer_epoch
    return (pid, epoch, found) if found else None


def _append_all(broker: BrokerServices, ctx: RequestContext, req: Any,
                refused: dict[tuple[str, int], tuple[ErrorCode, str | None]], denied: frozenset[str] = frozenset(),
                ) -> tuple[list[tuple[str, list[_Slot]]], list[tuple[_Slot, Any]], list[_Stale]]:
    """Validate and append every batch, synchronously (no await: the order of appends is the order of requests
    on the connection); the slots, the acks=all waits, and the refusals for an old epoch that only a remote
    transaction coordinator can tell apart (see _remote_stale_owners). `refused`: partitions a remote
    transaction coordinator did not confirm, answered with its verdict; `denied`: topics the caller may not
    write (TOPIC_AUTHORIZATION_FAILED)."""
    acks = req.acks
    metrics = broker.metrics
    access = broker.partitions
    topics: list[tuple[str, list[_Slot]]] = []
    waits: list[tuple[_Slot, Any]] = []
    stale: list[_Stale] = []
    now = now_ms()
    for topic_name, partitions in req.topics:
        slots: list[_Slot] = []
        topics.append((topic_name, slots))
        meta = broker.logs.topics.get(topic_name)
        for index, records in partitions:
            slot = _Slot(index)
            slots.append(slot)
            if denied and topic_name in denied:
                # no WRITE on the topic: answered before anything says whether it exists
                slot.error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            if acks not in (0, 1, -1):
                slot.error = ErrorCode.INVALID_REQUIRED_ACKS
                continue
            if meta is None:
                # No local copy: in a cluster the topic may live on other brokers (NOT_LEADER_OR_FOLLOWER sends the
                # client to look again), else it does not exist.
                found = access.leader(topic_name, index)
                slot.error = found if isinstance(found, ErrorCode) else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            if meta.internal:
                slot.error = ErrorCode.INVALID_TOPIC_EXCEPTION
                continue
            part = access.leader(topic_name, index)
            if isinstance(part, ErrorCode):
                slot.error = part
                continue
            refused_append = access.check_append(part, acks)
            if refused_append:
                slot.error = refused_append
                continue
            slot.log_start_offset = access.log_start_offset(part)
            result = validate_produce(
                records, meta.config, now, partition=f"{topic_name}-{index}", api_version=ctx.api_version
            )
            if not result.ok:
                for kind, count in result.kind_counts.items():
                    metrics.produce_failures.labels(kind).inc(count)
                slot.error = result.error
                slot.record_errors = list(result.record_errors)
                slot.message = result.message
                continue
            header = result.header
            verdict = refused.get((topic_name, index))
            if verdict is not None:
                slot.error, slot.message = _client_facing(broker, ctx, header, *verdict)
                continue
            target = stored_codec(meta.config, header.compression)
            if target is not None:
                # The topic's compression.type differs from the batch's codec: store it rebuilt (per-byte work,
                # never reached under 'producer', the default, nor when the codecs already match).
                rebuilt = convert_codec(records, header, meta.config, target, partition=f"{topic_name}-{index}")
                if not isinstance(rebuilt, bytearray):
                    metrics.produce_failures.labels(rebuilt.failure_kind).inc()
                    slot.error, slot.message = rebuilt.error, rebuilt.message
                    continue
                records = memoryview(rebuilt)
                header = read_header(records)
            log_append_time = meta.config.log_append_time
            if log_append_time:
                set_log_append_time(records, 0, header.size, now)
                header = read_header(records)
            appended = part.append_records(records, header, now, log_append_time, req.transactional_id)
            slot.error, slot.message = appended.error, appended.message
            if appended.error:
                slot.error, slot.message = _client_facing(broker, ctx, header, appended.error, appended.message)
                if slot.error == ErrorCode.INVALID_PRODUCER_EPOCH and header.is_transactional \
                        and broker.txn_verifier is not None and req.transactional_id:
                    stale.append(_Stale(slot, topic_name, index, header.producer_id, header.producer_epoch))
                if appended.error == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and acks == -1:
                    # Clients take 46 as success, and the batch with that sequence lies somewhere below the log end,
                    # maybe not yet on the ISR: answer only once the high watermark reaches the log end, or a
                    # failover could drop a write the client counts as acknowledged.
                    waits.append((slot, access.wait_acks_all(part, part.log.log_end_offset, req.timeout_ms)))
                continue
            slot.base_offset = appended.base_offset
            slot.log_append_time = appended.log_append_time
            if not appended.duplicate:
                access.appended(part)
                metrics.bytes_in.labels(topic_name).inc(header.size)
                metrics.messages_in.labels(topic_name).inc(header.record_count)
            if acks == -1:
                # A duplicate's original may still be on its way to disk: wait for it just the same.
                waits.append((slot, access.wait_acks_all(part, appended.last_offset + 1, req.timeout_ms)))
    return topics, waits, stale


class _Stale(NamedTuple):
    slot: _Slot
    topic: str
    partition: int
    producer_id: int
    epoch: int


async def _remote_stale_owners(broker: BrokerServices, ctx: RequestContext, req: Any, stale: list[_Stale]) -> None:
    """A transactional batch refused for an old epoch, whose coordinator is another broker: ask it whether the
    sender is the rightful owner whose transaction it timed out (KAFKA-9803) or a fenced zombie, as the local
    coordinator tells it on one broker (`_client_facing`). The owner gets the answer its client recovers from
    (abort, bump the epoch, go on); a zombie keeps INVALID_PRODUCER_EPOCH."""
    verifier, coordinator = broker.txn_verifier, broker.txn_coordinator
    assert verifier is not None and coordinator is not None
    for item in stale:
        if coordinator.owner_error(req.transactional_id) != ErrorCode.NOT_COORDINATOR:
            continue           # the local coordinator already answered in _client_facing
        tp = (item.topic, item.partition)
        answers = await verifier.verify(req.transactional_id, item.producer_id, item.epoch, [tp],
                                        req.timeout_ms / 1000)
        code, message = answers[tp]
        if code == ErrorCode.TRANSACTION_ABORTABLE:
            item.slot.error = coordinator.stale_owner_code(ctx.connection.client_software)
            item.slot.message = (f"The epoch {item.epoch} of producer {item.producer_id} was bumped by its "
                                 "transaction coordinator (a timed-out transaction); abort it and continue")


async def _answer(ctx: RequestContext, req: Any, topics: list[tuple[str, list[_Slot]]],
                  waits: list[tuple[_Slot, Any]], throttle_ms: int = 0) -> Any:
    if req.acks == 0:
        if any(s.error for _, slots in topics for s in slots):
            # No response goes back for acks=0, so a closed connection is the only signal.
            ctx.connection.close_after_pending(ctx.seq)
        return None
    if waits:
        results = await asyncio.gather(*(w for _, w in waits), return_exceptions=True)
        for (slot, _), outcome in zip(waits, results, strict=True):
            if isinstance(outcome, KafkaError):
                slot.error, slot.message, slot.base_offset = outcome.code, outcome.message, -1
            elif isinstance(outcome, BaseException):
                log.error("acks=all wait failed: %r", outcome)
                slot.error, slot.base_offset = ErrorCode.KAFKA_STORAGE_ERROR, -1
    responses = [(name, [s.response() for s in slots]) for name, slots in topics]
    return encode_produce_response(ctx.api_version, responses, throttle_ms)
