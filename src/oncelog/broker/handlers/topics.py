"""CreateTopics, DeleteTopics, CreatePartitions.

On the single node the broker's LogManager carries them out. In cluster mode the controller does
(controller_requests.py): replicas placed over the live brokers or as assigned, replication factors checked against
them, and the answer given once this broker's metadata image shows the change.

Authorization is Kafka 4's (ControllerApis.createTopics / deleteTopics / createPartitions), decided before anything
is validated against the topics or changed: CreateTopics needs CREATE on the cluster or on each topic, and shows a
created topic's configs (and partition count and replication factor) only with DESCRIBE_CONFIGS on it
(topic_config_error_code TOPIC_AUTHORIZATION_FAILED otherwise); DeleteTopics needs DESCRIBE and DELETE on each
topic, a topic named by id whose name the caller may not DESCRIBE is answered without its name; CreatePartitions
needs ALTER on each topic. A refused topic is TOPIC_AUTHORIZATION_FAILED whether or not it exists.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ...config import ConfigError, parse_topic_overrides, topic_name_problem
from ...errors import ErrorCode, KafkaError
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import AclOperation, ResourceType
from . import controller_requests
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
    if name in broker.logs.topics or broker.logs.is_being_created(name):
        raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
    if partitions < 1:
        raise KafkaError(ErrorCode.INVALID_PARTITIONS, "Number of partitions must be at least 1")


async def _create_one(broker: BrokerServices, item: Any, validate_only: bool, version: int,
                      show_configs: bool = True) -> dict[str, Any]:
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
            # the files on a worker thread: a wide topic must not stop the loop (docs/latency.md)
            meta = await broker.logs.create_topic_off_loop(item.name, partitions, overrides)
            config = meta.config
            out["topic_id"] = topic_uuid(meta.topic_id)
            log.info("created topic %s with %d partitions %s", item.name, partitions, overrides or "")
        if not show_configs:
            out["topic_config_error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            return out
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


def _requested_partitions(broker: BrokerServices, item: Any) -> int:
    if item.assignments:
        return len(item.assignments)
    return item.num_partitions if item.num_partitions != -1 else broker.config["num.partitions"]


def _created_entry(name: str, code: int, message: str | None) -> dict[str, Any]:
    return {"name": name, "topic_id": topic_uuid(None), "error_code": code, "error_message": message,
            "num_partitions": -1, "replication_factor": -1, "configs": []}


def _creation_rights(ctx: RequestContext, req: Any) -> tuple[set[str], set[str]]:
    """(the topics the caller may not create, those whose configs it may see), as ControllerApis.createTopics
    decides them: over the names the request has once (a repeated name is INVALID_REQUEST, unchecked); CREATE on
    the cluster covers every topic, else CREATE on each; DESCRIBE_CONFIGS on each for the configs."""
    counts: dict[str, int] = {}
    for item in req.topics:
        counts[item.name] = counts.get(item.name, 0) + 1
    names = [name for name, count in counts.items() if count == 1]
    if ctx.authorized_cluster(AclOperation.CREATE, log_denied=False):
        creatable = set(names)
    else:
        creatable = set(ctx.filter_authorized(ResourceType.TOPIC, names, AclOperation.CREATE))
    describable = set(ctx.filter_authorized(ResourceType.TOPIC, names, AclOperation.DESCRIBE_CONFIGS))
    return {name for name in names if name not in creatable}, describable


_CREATE_DENIED = "Authorization failed."


async def handle_create_topics(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.CREATE_TOPICS, ctx.api_version, body)
    denied, describable = _creation_rights(ctx, req)
    if controller_requests.in_cluster(broker):
        return await _create_topics_in_cluster(broker, ctx, body, req, denied, describable)
    seen: dict[str, int] = {}
    for item in req.topics:
        seen[item.name] = seen.get(item.name, 0) + 1
    # Kafka's controller bounds what it is asked to create: the refused topics are not part of it.
    requested = sum(max(item.num_partitions if item.num_partitions != -1 else broker.config["num.partitions"], 0)
                    for item in req.topics if item.name not in denied)
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
        if item.name in denied:
            results.append(_created_entry(item.name, ErrorCode.TOPIC_AUTHORIZATION_FAILED, _CREATE_DENIED))
            continue
        results.append(await _create_one(broker, item, req.validate_only, ctx.api_version,
                                         item.name in describable))
    return encode_response(ApiKey.CREATE_TOPICS, ctx.api_version, {"throttle_time_ms": 0, "topics": results})


async def _create_topics_in_cluster(broker: BrokerServices, ctx: RequestContext, body: memoryview, req: Any,
                                   denied: set[str], describable: set[str]) -> bytes:
    from ...cluster.topic_plans import NewTopic
    from ..coordinator_leadership import INTERNAL_TOPICS

    cluster = broker.cluster
    too_many = sum(max(_requested_partitions(broker, item), 0) for item in req.topics
                   if item.name not in denied) > MAX_PARTITIONS_PER_REQUEST

    internal_ok = ctx.from_broker  # a broker creating an internal topic on first need

    def refused(item: Any) -> tuple[int, str] | None:
        if too_many:
            return ErrorCode.POLICY_VIOLATION, _TOO_MANY
        if item.name in denied:
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED, _CREATE_DENIED
        if item.name.startswith("__") and not (internal_ok and item.name in INTERNAL_TOPICS):
            return ErrorCode.INVALID_TOPIC_EXCEPTION, "Names starting with '__' are reserved for internal topics"
        return None

    async def run_here() -> dict[str, Any]:
        wanted = [item for item in req.topics if refused(item) is None]
        results = await cluster.controller.create_topics([
            NewTopic(item.name, item.num_partitions, item.replication_factor,
                     [(a.partition_index, list(a.broker_ids)) for a in item.assignments] or None,
                     {c.name: c.value for c in item.configs})
            for item in wanted], validate_only=req.validate_only)
        topics = []
        for item in req.topics:
            problem = refused(item)
            if problem is not None:
                topics.append(_created_entry(item.name, *problem))
                continue
            result = results[item.name]
            entry = _created_entry(item.name, result.code, result.message)
            if result.code == ErrorCode.NONE and item.name not in describable:
                entry.update(topic_id=topic_uuid(result.topic_id),
                             topic_config_error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            elif result.code == ErrorCode.NONE:
                entry.update(topic_id=topic_uuid(result.topic_id), num_partitions=result.num_partitions,
                             replication_factor=result.replication_factor)
                if ctx.api_version >= 5:
                    try:
                        config = broker.config.topic_config(
                            parse_topic_overrides({c.name: c.value for c in item.configs}))
                    except ConfigError:
                        config = broker.config.topic_config({})
                    entry["configs"] = [
                        {k: e[k] for k in ("name", "value", "read_only", "config_source", "is_sensitive")}
                        for e in describe_topic_entries(broker, config, None, False, False)]
            topics.append(entry)
        return {"throttle_time_ms": 0, "topics": topics}

    def settled(response: Any) -> Any:
        image = cluster.image
        created = [] if req.validate_only else [t.name for t in response.topics if t.error_code == 0]
        return lambda: all(name in image.topics and all((name, p) in image.states
                                                         for p in image.topics[name].assignment)
                           for name in created)

    def failed(code: ErrorCode, message: str) -> dict[str, Any]:
        return {"throttle_time_ms": 0, "topics": [_created_entry(item.name, code, message) for item in req.topics]}

    return await controller_requests.answer(broker, ctx, body, req.timeout_ms, run_here, settled, failed)


def _deletion_rights(ctx: RequestContext, names: list[str]) -> tuple[set[str], set[str]]:
    """(describable, deletable) among `names`: Cluster DELETE covers them all (its denial unlogged); else
    ControllerApis.deleteTopics' two filters in its order: DESCRIBE, then DELETE, each name once."""
    distinct = list(dict.fromkeys(names))
    if ctx.authorized_cluster(AclOperation.DELETE, log_denied=False):
        return set(distinct), set(distinct)  # Cluster DELETE: every topic is describable and deletable
    describable = set(ctx.filter_authorized(ResourceType.TOPIC, distinct, AclOperation.DESCRIBE))
    deletable = set(ctx.filter_authorized(ResourceType.TOPIC, distinct, AclOperation.DELETE))
    return describable, deletable


def _refuse_deletion(out: dict[str, Any], by_id: bool, exists: bool, describable: set[str],
                     deletable: set[str]) -> bool:
    """Answer `out` as Kafka's controller does when the caller may not delete its topic (or may not learn whether a
    named topic exists); True if it did. A topic named by id the caller may not DESCRIBE is answered without its
    name (the id is not secret); one named by name: TOPIC_AUTHORIZATION_FAILED without DESCRIBE, then
    UNKNOWN_TOPIC_OR_PARTITION if it does not exist, then TOPIC_AUTHORIZATION_FAILED without DELETE."""
    name = out["name"]
    denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    if by_id:
        if name in deletable:
            return False
        if name not in describable:
            out["name"] = None
        out["error_code"], out["error_message"] = denied, denied.message
    elif name not in describable:
        out["error_code"], out["error_message"] = denied, denied.message
    elif not exists:
        out["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    elif name not in deletable:
        out["error_code"], out["error_message"] = denied, denied.message
    else:
        return False
    return True


async def handle_delete_topics(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DELETE_TOPICS, ctx.api_version, body)
    if ctx.api_version >= 6:
        targets = [(t.name, t.topic_id) for t in req.topics]
    else:
        targets = [(name, None) for name in req.topic_names]
    if controller_requests.in_cluster(broker):
        return await _delete_topics_in_cluster(broker, ctx, body, req, targets)
    if not broker.config["delete.topic.enable"]:
        # Kafka refuses the whole request before resolving ids or authorizing anything
        code = ErrorCode.TOPIC_DELETION_DISABLED if ctx.api_version >= 3 else ErrorCode.INVALID_REQUEST
        return encode_response(ApiKey.DELETE_TOPICS, ctx.api_version, {"throttle_time_ms": 0, "responses": [
            {"name": name, "topic_id": topic_id or topic_uuid(None), "error_code": code,
             "error_message": "Topic deletion is disabled."} for name, topic_id in targets]})
    responses = []
    resolved: list[tuple[dict[str, Any], bool]] = []  # (answer, named by id)
    for name, topic_id in targets:
        out = {"name": name, "topic_id": topic_id or topic_uuid(None), "error_code": 0, "error_message": None}
        responses.append(out)
        if name is None:
            out["name"] = find_topic_by_id(broker, topic_id)
            if out["name"] is None:
                out["error_code"] = ErrorCode.UNKNOWN_TOPIC_ID
                continue
        resolved.append((out, name is None))
    describable, deletable = _deletion_rights(ctx, [out["name"] for out, _ in resolved])
    for out, by_id in resolved:
        name = out["name"]
        meta = broker.logs.topics.get(name)
        if _refuse_deletion(out, by_id, meta is not None, describable, deletable):
            continue
        try:
            if meta is not None and meta.internal:
                raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, "Internal topics cannot be deleted")
            if meta is not None:
                out["topic_id"] = topic_uuid(meta.topic_id)
            broker.logs.delete_topic(name)
            log.info("deleted topic %s", name)
        except KafkaError as exc:
            out["error_code"], out["error_message"] = exc.code, exc.message
    broker.watchers.notify_all()  # long-polls on deleted partitions answer now
    return encode_response(ApiKey.DELETE_TOPICS, ctx.api_version, {"throttle_time_ms": 0, "responses": responses})


async def _delete_topics_in_cluster(broker: BrokerServices, ctx: RequestContext, body: memoryview, req: Any,
                                    targets: list[tuple[str | None, Any]]) -> bytes:
    cluster = broker.cluster
    image = cluster.image

    def named(topic_id: Any) -> str | None:
        wanted = getattr(topic_id, "bytes", None)
        return next((n for n, info in image.topics.items() if info.topic_id == wanted), None)

    async def run_here() -> dict[str, Any]:
        responses, names = [], []
        resolved: list[tuple[dict[str, Any], bool]] = []  # (answer, named by id)
        for name, topic_id in targets:
            out = {"name": name, "topic_id": topic_id or topic_uuid(None), "error_code": 0, "error_message": None}
            responses.append(out)
            if name is None:
                out["name"] = named(topic_id)
                if out["name"] is None:
                    out["error_code"] = ErrorCode.UNKNOWN_TOPIC_ID
                    continue
            resolved.append((out, name is None))
        describable, deletable = _deletion_rights(ctx, [out["name"] for out, _ in resolved])
        for out, by_id in resolved:
            if _refuse_deletion(out, by_id, out["name"] in image.topics, describable, deletable):
                continue
            if out["name"].startswith("__"):
                out["error_code"], out["error_message"] = (ErrorCode.INVALID_TOPIC_EXCEPTION,
                                                           "Internal topics cannot be deleted")
                continue
            names.append(out["name"])
        results = await cluster.controller.delete_topics(names)
        for out in responses:
            result = results.get(out["name"]) if out["error_code"] == 0 else None
            if result is not None:
                out["error_code"], out["error_message"] = result.code, result.message
                if result.topic_id is not None:
                    out["topic_id"] = topic_uuid(result.topic_id)
        return {"throttle_time_ms": 0, "responses": responses}

    def settled(response: Any) -> Any:
        gone = [(r.name, getattr(r, "topic_id", None)) for r in response.responses if r.error_code == 0]

        def done() -> bool:
            for name, topic_id in gone:
                info = image.topics.get(name)
                if info is not None and (topic_id is None or topic_id.int == 0 or info.topic_id == topic_id.bytes):
                    return False
            return True

        return done

    def failed(code: ErrorCode, message: str) -> dict[str, Any]:
        return {"throttle_time_ms": 0, "responses": [
            {"name": name, "topic_id": topic_id or topic_uuid(None), "error_code": code, "error_message": message}
            for name, topic_id in targets]}

    answer = await controller_requests.answer(broker, ctx, body, req.timeout_ms, run_here, settled, failed)
    broker.watchers.notify_all()  # long-polls on deleted partitions answer now
    return answer


async def handle_create_partitions(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.CREATE_PARTITIONS, ctx.api_version, body)
    names = list(dict.fromkeys(item.name for item in req.topics))
    alterable = set(ctx.filter_authorized(ResourceType.TOPIC, names))
    if controller_requests.in_cluster(broker):
        return await _create_partitions_in_cluster(broker, ctx, body, req, alterable)
    added = 0
    for item in req.topics:
        if item.name in alterable:  # the refused topics are not part of what Kafka's controller is asked
            meta = broker.logs.topics.get(item.name)
            added += max(item.count - (meta.partitions if meta is not None else 0), 0)
    results = []
    for item in req.topics:
        out = {"name": item.name, "error_code": 0, "error_message": None}
        try:
            if added > MAX_PARTITIONS_PER_REQUEST:
                raise KafkaError(ErrorCode.POLICY_VIOLATION, _TOO_MANY)
            if item.name not in alterable:
                out["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED  # Kafka sets no message
                results.append(out)
                continue
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


async def _create_partitions_in_cluster(broker: BrokerServices, ctx: RequestContext, body: memoryview,
                                        req: Any, alterable: set[str]) -> bytes:
    cluster = broker.cluster
    image = cluster.image
    added = 0
    for item in req.topics:
        if item.name in alterable:
            info = image.topics.get(item.name)
            added += max(item.count - (info.partition_count if info is not None else 0), 0)

    def refused(item: Any) -> tuple[int, str | None] | None:
        if added > MAX_PARTITIONS_PER_REQUEST:
            return ErrorCode.POLICY_VIOLATION, _TOO_MANY
        if item.name not in alterable:
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED, None
        if item.name.startswith("__"):
            return ErrorCode.INVALID_TOPIC_EXCEPTION, "Internal topics cannot be resized"
        return None

    async def run_here() -> dict[str, Any]:
        wanted = {item.name: (item.count, None if item.assignments is None
                              else [list(a.broker_ids) for a in item.assignments])
                  for item in req.topics if refused(item) is None}
        results = await cluster.controller.create_partitions(wanted, validate_only=req.validate_only)
        out = []
        for item in req.topics:
            problem = refused(item)
            result = results.get(item.name) if problem is None else None
            code, message = problem if problem is not None else (result.code, result.message)
            out.append({"name": item.name, "error_code": code, "error_message": message})
        return {"throttle_time_ms": 0, "results": out}

    def settled(response: Any) -> Any:
        counts = {item.name: item.count for item in req.topics}
        grown = [] if req.validate_only else [(r.name, counts[r.name]) for r in response.results
                                                 if r.error_code == 0 and r.name in counts]
        return lambda: all(name in image.topics and image.topics[name].partition_count >= count
                           and all((name, p) in image.states for p in range(count)) for name, count in grown)

    def failed(code: ErrorCode, message: str) -> dict[str, Any]:
        return {"throttle_time_ms": 0, "results": [{"name": item.name, "error_code": code, "error_message": message}
                                                   for item in req.topics]}

    return await controller_requests.answer(broker, ctx, body, req.timeout_ms, run_here, settled, failed)
