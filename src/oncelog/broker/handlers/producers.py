"""InitProducerId (idempotent producers) and DescribeProducers (KIP-664).

Authorization (security/api_acls.RULES) as Kafka's KafkaApis makes it: InitProducerId with a transactional id
needs WRITE on it, without one Cluster IDEMPOTENT_WRITE or WRITE on any topic (KIP-679), both checked before the
request's own validation and before a producer id is taken; DescribeProducers READ on each topic."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import ErrorCode, KafkaError
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import ResourceType

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext


def _init_refusal(ctx: RequestContext, transactional_id: str | None) -> ErrorCode:
    """Kafka's checks, in its order: WRITE on the transactional id; without one, Cluster IDEMPOTENT_WRITE, else
    WRITE on any topic (KIP-679), else CLUSTER_AUTHORIZATION_FAILED."""
    if transactional_id is not None:
        if ctx.authorized(ResourceType.TRANSACTIONAL_ID, transactional_id):
            return ErrorCode.NONE
        return ctx.denial(ResourceType.TRANSACTIONAL_ID)
    if ctx.authorized_cluster() or ctx.authorized_any(ResourceType.TOPIC):
        return ErrorCode.NONE
    return ctx.denial(ResourceType.CLUSTER)


async def handle_init_producer_id(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.INIT_PRODUCER_ID, ctx.api_version, body)
    data = {"throttle_time_ms": 0, "error_code": 0, "producer_id": -1, "producer_epoch": -1}
    refusal = _init_refusal(ctx, req.transactional_id)
    if refusal:
        data["error_code"] = refusal  # no producer id is taken, no transaction touched
    elif ctx.api_version >= 3 and (req.producer_id == -1) != (req.producer_epoch == -1):
        data["error_code"] = ErrorCode.INVALID_REQUEST
    elif req.transactional_id is not None:
        result = await broker.init_transactional_producer(req, ctx.api_version)
        data.update(result)
    else:
        # Idempotent producers: a fresh id with epoch 0. The broker keeps no per-id state here;
        # an idempotent client bumps its own epoch afterwards, and partitions accept that.
        try:
            data["producer_id"] = broker.producer_ids.next_id()
            data["producer_epoch"] = 0
        except KafkaError as exc:
            data["error_code"] = exc.code
    return encode_response(ApiKey.INIT_PRODUCER_ID, ctx.api_version, data)


async def handle_describe_producers(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DESCRIBE_PRODUCERS, ctx.api_version, body)
    topics = []
    for t in req.topics:
        parts = []
        refused = not ctx.authorized(ResourceType.TOPIC, t.name)
        for index in t.partition_indexes:
            out = {"partition_index": index, "error_code": 0, "error_message": None, "active_producers": []}
            if refused:
                # whether or not the topic exists (Kafka's answer, with the error's message)
                denied = ctx.denial(ResourceType.TOPIC)
                out.update(error_code=denied, error_message=denied.message)
                parts.append(out)
                continue
            # Any replica answers, as in Kafka: clients send to the leader, but `kafka-transactions find-hanging
            # --broker-id N` asks broker N about every partition it holds, followers included; a follower's
            # producer state is built from the same batches as the leader's (docs/cluster.md §4.2).
            part = broker.partitions.replica(t.name, index)
            if isinstance(part, ErrorCode):
                out["error_code"] = part
            else:
                out["active_producers"] = [
                    {
                        "producer_id": e.producer_id, "producer_epoch": e.epoch, "last_sequence": e.last_seq,
                        "last_timestamp": e.last_timestamp, "coordinator_epoch": e.coordinator_epoch,
                        "current_txn_start_offset": e.current_txn_first_offset,
                    }
                    for e in part.producers.entries.values()
                ]
            parts.append(out)
        topics.append({"name": t.name, "partitions": parts})
    return encode_response(ApiKey.DESCRIBE_PRODUCERS, ctx.api_version, {"throttle_time_ms": 0, "topics": topics})
