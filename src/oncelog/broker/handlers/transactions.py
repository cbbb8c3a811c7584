"""Transaction APIs: AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit, WriteTxnMarkers,
DescribeTransactions, ListTransactions. The rules live in coordinator/txn/; this is the wire.

Authorization (security/api_acls.RULES) as Kafka's KafkaApis makes it, before any transaction, offset or marker is
touched: WRITE on the transactional id for the whole request of a client's AddPartitionsToTxn (< v4),
AddOffsetsToTxn, EndTxn and TxnOffsetCommit, then READ on the group (AddOffsetsToTxn, TxnOffsetCommit) and the
topic checks (WRITE per partition to add, READ per offset to commit); Cluster CLUSTER_ACTION for what only brokers
send (AddPartitionsToTxn v4+, WriteTxnMarkers); DESCRIBE per id for DescribeTransactions and ListTransactions,
whose answers leave out the topics and ids the caller may not DESCRIBE."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...coordinator.group.store import OFFSETS_TOPIC
from ...coordinator.txn.coordinator import TXN_TOPIC
from ...errors import ErrorCode, KafkaError
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import AclOperation, ResourceType
from .common import now_ms

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

# Markers are written with acks=all, waited for as long as Kafka waits for them (its request.timeout.ms default).
MARKER_ACK_TIMEOUT_MS = 30000
# Kafka's Topic.isInternal: AddPartitionsToTxn leaves them out of the topics it authorizes, so a client adding one
# of their partitions always answers TOPIC_AUTHORIZATION_FAILED.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TXN_TOPIC, "__share_group_state"})


async def handle_add_partitions(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.ADD_PARTITIONS_TO_TXN, ctx.api_version, body)
    if ctx.api_version >= 4:
        return await _add_partitions_batched(broker, ctx, req)
    wanted = [(t.name, p) for t in req.v3_and_below_topics for p in t.partitions]
    txn_id = req.v3_and_below_transactional_id
    if not ctx.authorized(ResourceType.TRANSACTIONAL_ID, txn_id):
        results = dict.fromkeys(wanted, ctx.denial(ResourceType.TRANSACTIONAL_ID))
    else:
        allowed = set(ctx.filter_authorized(ResourceType.TOPIC, [t for t, _ in wanted if t not in INTERNAL_TOPICS]))
        if any(t not in allowed for t, _ in wanted):
            # one refused partition fails the whole transaction's request: the refused ones answer why, the rest
            # are not added (their existence only shows once the caller may write them, as in Kafka)
            denied = ctx.denial(ResourceType.TOPIC)
            results = {(t, p): denied if t not in allowed else
                       ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if broker.partitions.leader_epoch(t, p) < 0 else
                       ErrorCode.OPERATION_NOT_ATTEMPTED for t, p in wanted}
        else:
            results = await broker.txn_coordinator.add_partitions(
                txn_id, req.v3_and_below_producer_id, req.v3_and_below_producer_epoch, wanted, ctx.api_version,
            )
    data = {"throttle_time_ms": 0, "results_by_topic_v3_and_below": _by_topic(results)}
    return encode_response(ApiKey.ADD_PARTITIONS_TO_TXN, ctx.api_version, data)


async def _add_partitions_batched(broker: BrokerServices, ctx: RequestContext, req: Any) -> bytes:
    """v4+, the inter-broker form: several transactions per request; `verify_only` asks whether the partitions
    are in the producer's ongoing transaction (a partition leader's KIP-890 check) without adding anything."""
    if not ctx.authorized_cluster():
        # only brokers send v4+ (Kafka refuses the whole request before looking at any transaction)
        return encode_response(ApiKey.ADD_PARTITIONS_TO_TXN, ctx.api_version,
                               {"throttle_time_ms": 0, "error_code": ctx.denial(ResourceType.CLUSTER),
                                "results_by_transaction": []})
    coordinator = broker.txn_coordinator
    results = []
    for txn in req.transactions:
        wanted = [(t.name, p) for t in txn.topics for p in t.partitions]
        if txn.verify_only:
            owner = coordinator.owner_error(txn.transactional_id)
            answers = {tp: owner or coordinator.verify_partition(
                txn.transactional_id, txn.producer_id, txn.producer_epoch, *tp)[0] for tp in wanted}
        else:
            answers = await coordinator.add_partitions(txn.transactional_id, txn.producer_id, txn.producer_epoch,
                                                       wanted, ctx.api_version)
        results.append({"transactional_id": txn.transactional_id, "topic_results": _by_topic(answers)})
    data = {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "results_by_transaction": results}
    return encode_response(ApiKey.ADD_PARTITIONS_TO_TXN, ctx.api_version, data)


def _by_topic(results: dict[tuple[str, int], ErrorCode]) -> list[dict[str, Any]]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), error in results.items():
        by_topic.setdefault(topic, []).append({"partition_index": partition, "partition_error_code": error})
    return [{"name": topic, "results_by_partition": parts} for topic, parts in by_topic.items()]


async def handle_add_offsets(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.ADD_OFFSETS_TO_TXN, ctx.api_version, body)
    for resource, name in ((ResourceType.TRANSACTIONAL_ID, req.transactional_id), (ResourceType.GROUP, req.group_id)):
        if not ctx.authorized(resource, name):
            return encode_response(ApiKey.ADD_OFFSETS_TO_TXN, ctx.api_version,
                                   {"throttle_time_ms": 0, "error_code": ctx.denial(resource)})
    groups = broker.group_coordinator
    if groups is not None:
        # In a cluster `__consumer_offsets` is created on first need, as FindCoordinator does; the Java client
        # sends AddOffsetsToTxn before it looks for the group's coordinator, so this may be the first need
        # (meanwhile the answer is COORDINATOR_NOT_AVAILABLE, which it retries).
        broker.coordinator_node(OFFSETS_TOPIC, groups.partition_for(req.group_id))
    error = await broker.txn_coordinator.add_offsets(
        req.transactional_id, req.producer_id, req.producer_epoch, req.group_id, ctx.api_version
    )
    return encode_response(ApiKey.ADD_OFFSETS_TO_TXN, ctx.api_version, {"throttle_time_ms": 0, "error_code": error})


async def handle_end_txn(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.END_TXN, ctx.api_version, body)
    if not ctx.authorized(ResourceType.TRANSACTIONAL_ID, req.transactional_id):
        error = ctx.denial(ResourceType.TRANSACTIONAL_ID)
    else:
        error = await broker.txn_coordinator.end_txn(
            req.transactional_id, req.producer_id, req.producer_epoch, req.committed, ctx.api_version
        )
    return encode_response(ApiKey.END_TXN, ctx.api_version, {"throttle_time_ms": 0, "error_code": error})


async def handle_txn_offset_commit(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.TXN_OFFSET_COMMIT, ctx.api_version, body)
    offsets = [
        (t.name, p.partition_index, p.committed_offset, p.committed_metadata,
         getattr(p, "committed_leader_epoch", -1))
        for t in req.topics for p in t.partitions
    ]
    refusal = ErrorCode.NONE
    for resource, name in ((ResourceType.TRANSACTIONAL_ID, req.transactional_id), (ResourceType.GROUP, req.group_id)):
        if not ctx.authorized(resource, name):
            refusal = ctx.denial(resource)  # every partition answers it; nothing is checked or staged
            break
    allowed: set[str] = set()
    if not refusal:
        allowed = set(ctx.filter_authorized(ResourceType.TOPIC, [t.name for t in req.topics]))
    staged = [o for o in offsets if o[0] in allowed]
    error = ErrorCode.NONE
    if staged:  # Kafka asks the coordinator only when some offset is left to commit
        error = await _stage_txn_offsets(broker, req, staged, ctx.api_version)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, partition, *_ in offsets:
        answer = refusal or (error if topic in allowed else ctx.denial(ResourceType.TOPIC))
        by_topic.setdefault(topic, []).append({"partition_index": partition, "error_code": answer})
    data = {"throttle_time_ms": 0, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}
    return encode_response(ApiKey.TXN_OFFSET_COMMIT, ctx.api_version, data)


async def _stage_txn_offsets(broker: BrokerServices, req: Any, offsets: list[Any], version: int) -> ErrorCode:
    """The offsets the caller may commit, staged in the group's pending transactional offsets, all or none."""
    error = broker.txn_coordinator.check_txn_offset_commit(
        req.transactional_id, req.producer_id, req.producer_epoch, req.group_id, version
    )
    if not error:
        error = await _verify_offsets_write(broker, req)
    if not error:
        groups = getattr(broker, "group_coordinator", None)
        if groups is None:
            error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        else:
            error = await groups.stage_txn_offsets(
                req.group_id, req.producer_id, req.producer_epoch, offsets,
                generation_id=getattr(req, "generation_id", -1), member_id=getattr(req, "member_id", ""),
                group_instance_id=getattr(req, "group_instance_id", None),
                transactional_id=req.transactional_id,
            )
    return error


async def _verify_offsets_write(broker: BrokerServices, req: Any) -> ErrorCode:
    """In a cluster, the group's offsets partition asks the producer's transaction coordinator (another broker)
    before the producer's first transactional offsets go into it, as a produce would (txn_verification). The
    retriable verdicts become COORDINATOR_LOAD_IN_PROGRESS, which TxnOffsetCommit clients retry."""
    verifier, groups = broker.txn_verifier, broker.group_coordinator
    if verifier is None or groups is None:
        return ErrorCode.NONE
    tp = (OFFSETS_TOPIC, groups.partition_for(req.group_id))
    part = broker.partitions.leader(*tp)
    if isinstance(part, ErrorCode) or not verifier.needed(part, req.transactional_id, req.producer_id,
                                                                  req.producer_epoch, True):
        return ErrorCode.NONE          # not led here (the write answers NOT_COORDINATOR), or nothing to ask
    error, _ = (await verifier.verify(req.transactional_id, req.producer_id, req.producer_epoch, [tp]))[tp]
    return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if error == ErrorCode.NOT_ENOUGH_REPLICAS else error


def _may_write_markers(ctx: RequestContext) -> bool:
    """Kafka asks Cluster ALTER first (an operator's KIP-664 abort of a hanging transaction, its denial unlogged),
    then CLUSTER_ACTION (a transaction coordinator's markers), as the API's row in security/api_acls.RULES says."""
    return ctx.authorized_cluster(AclOperation.ALTER, log_denied=False) or \
        ctx.authorized_cluster(AclOperation.CLUSTER_ACTION)


async def handle_write_txn_markers(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    """Markers from another broker's transaction coordinator, and admin-driven ones (KIP-664 abort of a hanging
    transaction): written to the partitions this broker leads, with acks=all. A marker also voids what a remote
    coordinator confirmed for that producer and partition before (`txn_verification`)."""
    req = decode_request(ApiKey.WRITE_TXN_MARKERS, ctx.api_version, body)
    if not _may_write_markers(ctx):
        # Kafka's error answer: every partition CLUSTER_AUTHORIZATION_FAILED; nothing is written or forgotten
        denied = ctx.denial(ResourceType.CLUSTER, AclOperation.CLUSTER_ACTION)
        return encode_response(ApiKey.WRITE_TXN_MARKERS, ctx.api_version, {"markers": [
            {"producer_id": m.producer_id, "topics": [
                {"name": t.name, "partitions": [{"partition_index": i, "error_code": denied}
                                                for i in t.partition_indexes]} for t in m.topics]}
            for m in req.markers]})
    markers = []
    waits = []
    now = now_ms()
    for marker in req.markers:
        topics = []
        for t in marker.topics:
            parts = []
            for index in t.partition_indexes:
                part = broker.partitions.leader(t.name, index)
                if isinstance(part, ErrorCode):
                    parts.append({"partition_index": index, "error_code": part})
                    continue
                refused = broker.partitions.check_append(part, -1)
                if refused:
                    parts.append({"partition_index": index, "error_code": refused})
                    continue
                if broker.txn_verifier is not None:
                    broker.txn_verifier.on_marker(t.name, index, marker.producer_id)
                result = part.append_marker(marker.producer_id, marker.producer_epoch, marker.transaction_result,
                                            marker.coordinator_epoch, now)
                entry = {"partition_index": index, "error_code": result.error}
                parts.append(entry)
                if not result.error and t.name == OFFSETS_TOPIC and broker.group_coordinator is not None:
                    # Offsets staged by this producer become visible (or are dropped) with the marker, as when
                    # the transaction coordinator writes it itself.
                    broker.group_coordinator.complete_txn(marker.producer_id, marker.transaction_result, index)
                if not result.error:
                    waits.append((entry, broker.partitions.wait_acks_all(part, result.last_offset + 1,
                                                                         MARKER_ACK_TIMEOUT_MS)))
            topics.append({"name": t.name, "partitions": parts})
        markers.append({"producer_id": marker.producer_id, "topics": topics})
    for entry, wait in waits:
        try:
            await wait
        except KafkaError as exc:
            entry["error_code"] = exc.code
        except Exception:
            entry["error_code"] = ErrorCode.KAFKA_STORAGE_ERROR
    return encode_response(ApiKey.WRITE_TXN_MARKERS, ctx.api_version, {"markers": markers})


async def handle_describe_transactions(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DESCRIBE_TRANSACTIONS, ctx.api_version, body)
    allowed = set(ctx.filter_authorized(ResourceType.TRANSACTIONAL_ID, req.transactional_ids))
    states = []
    for txn_id in req.transactional_ids:
        if txn_id in allowed:
            state = broker.txn_coordinator.describe(txn_id)
        else:
            # Kafka's answer: the error, the id, and every other field left at its default
            state = {"error_code": ctx.denial(ResourceType.TRANSACTIONAL_ID), "transactional_id": txn_id,
                     "transaction_state": "", "transaction_timeout_ms": 0, "transaction_start_time_ms": 0,
                     "producer_id": 0, "producer_epoch": 0, "topics": []}
        if state["topics"]:
            # only the partitions of topics the caller may DESCRIBE
            visible = set(ctx.filter_authorized(ResourceType.TOPIC, [t["topic"] for t in state["topics"]]))
            state["topics"] = [t for t in state["topics"] if t["topic"] in visible]
        states.append(state)
    return encode_response(
        ApiKey.DESCRIBE_TRANSACTIONS, ctx.api_version, {"throttle_time_ms": 0, "transaction_states": states}
    )


async def handle_list_transactions(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.LIST_TRANSACTIONS, ctx.api_version, body)
    unknown, states = broker.txn_coordinator.list_transactions(
        list(req.state_filters), list(req.producer_id_filters),
        getattr(req, "duration_filter", -1) if ctx.api_version >= 1 else -1,
    )
    error = ErrorCode.NONE
    if broker.txn_coordinator.loading:
        error, states = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, []  # Kafka's answer while a partition loads
    elif states:
        # only the ids the caller may DESCRIBE, the others as if absent
        visible = set(ctx.filter_authorized(ResourceType.TRANSACTIONAL_ID, [s["transactional_id"] for s in states]))
        states = [s for s in states if s["transactional_id"] in visible]
    data = {"throttle_time_ms": 0, "error_code": error, "unknown_state_filters": unknown,
            "transaction_states": states}
    return encode_response(ApiKey.LIST_TRANSACTIONS, ctx.api_version, data)
