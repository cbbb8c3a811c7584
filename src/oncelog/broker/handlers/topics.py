"""CreateTopics, DeleteTopics, CreatePartitions."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ...config import ConfigError, parse_topic_overrides, topic_name_problem
from ...errors import ErrorCode, KafkaError
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from .common import find_topic_by_id, topic_uuid
from .configs import describe_topic_entries

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

log = logging.getLogger("oncelog.topics")

# Kafka's controller refuses requests that would add more partitions than this, whatever the topics: one
# request must not be able to make the broker create millions of partition directories.
MAX_PARTITIONS_PER_REQUEST = 10000
_TOO_MANY = "Excessively large number of partitions per request."


def _validate_new_topic(broker: BrokerServices, name: str, partitions: int) -> None:
    problem = topic_name_problem(name)
    if problem:
        raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
    if name in broker.logs.topics:
        raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
    if partitions < 1:
        raise KafkaError(ErrorCode.INVALID_PARTITIONS, "Number of partitions must be at least 1")


def _create_one(broker: BrokerServices, item: Any, validate_only: bool, version: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": item.name, "topic_id": topic_uuid(None), "error_code": 0, "error_message": None,
        "num_partitions": -1, "replication_factor": -1, "configs": [],
    }
    partitions = item.num_partitions if item.num_partitions != -1 else broker.config["num.partitions"]
    try:
        if item.assignments:
            raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "Manual replica assignment is not supported")
        if item.replication_factor not in (-1, 1):
            raise KafkaError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"Replication factor {item.replication_factor} is larger than the 1 available broker",
            )
        if item.name.startswith("__"):
            raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, "Names starting with '__' are reserved for internal topics")
        try:
            overrides = parse_topic_overrides({c.name: c.value for c in item.configs})
        except ConfigError as exc:
            raise KafkaError(ErrorCode.INVALID_CONFIG, str(exc)) from None
        if validate_only:
            _validate_new_topic(broker, item.name, partitions)
            config = broker.config.topic_config(overrides)
        else:
            meta = broker.logs.create_topic(item.name, partitions, overrides)
            config = meta.config
            out["topic_id"] = topic_uuid(meta.topic_id)
            log.info("created topic %s with %d partitions %s", item.name, partitions, overrides or "")
        out["num_partitions"] = partitions
        out["replication_factor"] = 1
        if version >= 5:
            out["configs"] = [
                {k: e[k] for k in ("name", "value", "read_only", "config_source", "is_sensitive")}
                for e in describe_topic_entries(broker, config, None, False, False)
            ]
    except KafkaError as exc:
        out["error_code"], out["error_message"] = exc.code, exc.message
    return out


async def handle_create_topics(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.CREATE_TOPICS, ctx.api_version, body)
    seen: dict[str, int] = {}
    for item in req.topics:
        seen[item.name] = seen.get(item.name, 0) + 1
    requested = sum(max(item.num_partitions if item.num_partitions != -1 else broker.config["num.partitions"], 0)
                    for item in req.topics)
    results = []
    for item in req.topics:
        if requested > MAX_PARTITIONS_PER_REQUEST:
            results.append({
                "name": item.name, "topic_id": topic_uuid(None), "error_code": ErrorCode.POLICY_VIOLATION,
                "error_message": _TOO_MANY, "num_partitions": -1, "replication_factor": -1, "configs": [],
            })
            continue
        if seen[item.name] > 1:
            results.append({
                "name": item.name, "topic_id": topic_uuid(None), "error_code": ErrorCode.INVALID_REQUEST,
                "error_message": "Topic appears more than once in the request", "num_partitions": -1,
                "replication_factor": -1, "configs": [],
            })
            continue
        results.append(_create_one(broker, item, req.validate_only, ctx.api_version))
    return encode_response(ApiKey.CREATE_TOPICS, ctx.api_version, {"throttle_time_ms": 0, "topics": results})


async def handle_delete_topics(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DELETE_TOPICS, ctx.api_version, body)
    if ctx.api_version >= 6:
        targets = [(t.name, t.topic_id) for t in req.topics]
    else:
        targets = [(name, None) for name in req.topic_names]
    responses = []
    for name, topic_id in targets:
        out = {"name": name, "topic_id": topic_id or topic_uuid(None), "error_code": 0, "error_message": None}
        try:
            if name is None:
                name = find_topic_by_id(broker, topic_id)
                if name is None:
                    raise KafkaError(ErrorCode.UNKNOWN_TOPIC_ID)
                out["name"] = name
            if not broker.config["delete.topic.enable"]:
                raise KafkaError(ErrorCode.TOPIC_DELETION_DISABLED)
            meta = broker.logs.topics.get(name)
            if meta is not None and meta.internal:
                raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, "Internal topics cannot be deleted")
            if meta is not None:
                out["topic_id"] = topic_uuid(meta.topic_id)
            broker.logs.delete_topic(name)
            log.info("deleted topic %s", name)
        except KafkaError as exc:
            out["error_code"], out["error_message"] = exc.code, exc.message
        responses.append(out)
    broker.watchers.notify_all()  # long-polls on deleted partitions answer now
    return encode_response(ApiKey.DELETE_TOPICS, ctx.api_version, {"throttle_time_ms": 0, "responses": responses})


async def handle_create_partitions(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.CREATE_PARTITIONS, ctx.api_version, body)
    added = 0
    for item in req.topics:
        meta = broker.logs.topics.get(item.name)
        added += max(item.count - (meta.partitions if meta is not None else 0), 0)
    results = []
    for item in req.topics:
        out = {"name": item.name, "error_code": 0, "error_message": None}
        try:
            if added > MAX_PARTITIONS_PER_REQUEST:
                raise KafkaError(ErrorCode.POLICY_VIOLATION, _TOO_MANY)
            if item.assignments:
                raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "Manual replica assignment is not supported")
            meta = broker.logs.topics.get(item.name)
            if meta is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            if meta.internal:
                raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, "Internal topics cannot be resized")
            if item.count <= meta.partitions:
                raise KafkaError(
                    ErrorCode.INVALID_PARTITIONS,
                    f"Topic currently has {meta.partitions} partitions, which is higher than or equal to "
                    f"the requested {item.count}",
                )
            if not req.validate_only:
                broker.logs.create_partitions(item.name, item.count)
                log.info("topic %s now has %d partitions", item.name, item.count)
        except KafkaError as exc:
            out["error_code"], out["error_message"] = exc.code, exc.message
        results.append(out)
    return encode_response(ApiKey.CREATE_PARTITIONS, ctx.api_version, {"throttle_time_ms": 0, "results": results})
