"""DescribeConfigs and IncrementalAlterConfigs for topics and brokers.

Broker settings come from server.properties and `--set` and are static: describing
them works, altering them is refused with a message saying where to change them. The exception is a listener's key
and trust store (`listener.name.<listener>.ssl.keystore.location` and the other keys Kafka reconfigures on a running
listener): set per broker, they replace the listener's SSL context at run time and are kept for restarts
(broker/dynamic_listeners.py), and DescribeConfigs reports them as DYNAMIC_BROKER_CONFIG. Deleting a dynamic
override of any other key succeeds and changes nothing, since there never is one: Kafka's reassignment tool clears its
replication throttles that way (`kafka-reassign-partitions --verify`) whether or not it set any.

Replication throttles (Kafka's `leader/follower.replication.throttled.rate` on brokers and
`leader/follower.replication.throttled.replicas` on topics) do not exist here: setting one is refused, so
`kafka-reassign-partitions --execute --throttle` fails before it starts a reassignment instead of running it
unthrottled; deleting one is the no-op above.

In cluster mode topic configs live on ZooKeeper: DescribeConfigs reads them from this broker's metadata image,
IncrementalAlterConfigs is carried out by the controller (controller_requests.py), which computes the new
override set from its image and writes it with a compare-and-set; every broker applies it by watch.

Authorization is per resource, as Kafka's (ConfigHelper.handleDescribeConfigsRequest, and for
IncrementalAlterConfigs the broker's preprocessing plus ControllerApis.authorizeAlterResource): DESCRIBE_CONFIGS /
ALTER_CONFIGS on the topic (TOPIC_AUTHORIZATION_FAILED, whether or not it exists) or on the cluster for broker and
broker-logger resources (CLUSTER_AUTHORIZATION_FAILED); a refused resource is neither described nor changed. Kafka's
order for an alteration: a broker-logger resource is authorized first; a broker resource's name and changes are
validated by the broker before the controller authorizes it; a topic is authorized before anything about it is
looked at.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...config import (
    BROKER_KEYS,
    REFUSED_BROKER_KEYS,
    TOPIC_KEYS,
    TYPE_LIST,
    TYPE_PASSWORD,
    ConfigError,
    TopicConfig,
    parse_topic_overrides,
)
from ...errors import ErrorCode, KafkaError
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import ResourceType
from ..dynamic_listeners import NOT_IN_A_CLUSTER, check_broker_change, dynamic_listener_key
from . import controller_requests

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER = 2, 4, 8
SOURCE_TOPIC, SOURCE_DYNAMIC_BROKER, SOURCE_STATIC_BROKER, SOURCE_DEFAULT = 1, 2, 4, 5
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
STATIC_BROKER = ("Broker configs are static here: set them in server.properties or with --set and restart (only a "
                 "listener's key and trust store, listener.name.<listener>.ssl.keystore.* / ssl.truststore.* / "
                 "ssl.key.password, can be changed at run time)")
# Kafka's replication throttle keys, per resource type (names only: oncelog throttles no replication).
BROKER_THROTTLES = frozenset({"leader.replication.throttled.rate", "follower.replication.throttled.rate",
                              "replica.alter.log.dirs.io.max.bytes.per.second"})
TOPIC_THROTTLES = frozenset({"leader.replication.throttled.replicas", "follower.replication.throttled.replicas"})
NO_THROTTLES = "oncelog does not throttle replication: {name} cannot be set (deleting it is accepted)"


def describe_topic_entries(
    broker: BrokerServices, config: TopicConfig, keys: list[str] | None, synonyms: bool, docs: bool
) -> list[dict[str, Any]]:
    entries = []
    for name, key in TOPIC_KEYS.items():
        if keys is not None and name not in keys:
            continue
        broker_key = key.broker_synonym
        broker_set = broker_key in broker.config.explicit if broker_key else False
        if name in config.overrides:
            source = SOURCE_TOPIC
        elif broker_set:
            source = SOURCE_STATIC_BROKER
        else:
            source = SOURCE_DEFAULT
        syn = []
        if synonyms:
            if name in config.overrides:
                syn.append({"name": name, "value": key.render(config.overrides[name]), "source": SOURCE_TOPIC})
            if broker_set:
                syn.append({
                    "name": broker_key, "value": key.render(broker.config.topic_default(name)),
                    "source": SOURCE_STATIC_BROKER,
                })
            syn.append({"name": broker_key or name, "value": key.render(key.default), "source": SOURCE_DEFAULT})
        entries.append({
            "name": name, "value": key.render(config[name]), "read_only": False, "config_source": source,
            "is_sensitive": False, "synonyms": syn, "config_type": key.type, "documentation": key.doc if docs else None,
        })
    return entries


def _describe_broker(broker: BrokerServices, keys: list[str] | None, docs: bool,
                     synonyms: bool = False) -> list[dict[str, Any]]:
    entries = []
    for name, key in BROKER_KEYS.items():
        if keys is not None and name not in keys:
            continue
        explicit = name in broker.config.explicit
        entries.append({
            "name": name, "value": None if key.sensitive else key.render(broker.config[name]), "read_only": True,
            "config_source": SOURCE_STATIC_BROKER if explicit else SOURCE_DEFAULT, "is_sensitive": key.sensitive,
            "synonyms": [], "config_type": key.type, "documentation": key.doc if docs else None,
        })
    dynamic = broker.security.dynamic.values
    for name in sorted((broker.config.explicit - BROKER_KEYS.keys()) | dynamic.keys()):
        # listener.name.<listener>.<key>: reported as set, secrets (keys, passwords, JAAS configs) as null; the
        # dynamic SSL keys (set through IncrementalAlterConfigs) as DYNAMIC_BROKER_CONFIG, over the static value
        if keys is not None and name not in keys:
            continue
        base = BROKER_KEYS.get(name.split(".", 3)[-1])
        sensitive = base.sensitive if base is not None else True

        def shown(value: Any, base: Any = base, sensitive: bool = sensitive) -> str | None:
            return None if sensitive else (base.render(value) if base else str(value))

        found = []  # (source, value), most important first: Kafka's synonyms of a listener key
        if name in dynamic:
            found.append((SOURCE_DYNAMIC_BROKER, shown(base.parse(dynamic[name]))))
        if name in broker.config.explicit:
            found.append((SOURCE_STATIC_BROKER, shown(broker.config[name])))
        entries.append({
            "name": name, "value": found[0][1], "read_only": dynamic_listener_key(name) is None,
            "config_source": found[0][0], "is_sensitive": sensitive,
            "synonyms": [{"name": name, "value": value, "source": source} for source, value in found] + (
                _base_synonyms(broker, base) if base is not None else []) if synonyms else [],
            "config_type": base.type if base is not None else TYPE_PASSWORD, "documentation": None,
        })
    return entries


def _base_synonyms(broker: BrokerServices, base: Any) -> list[dict[str, Any]]:
    """The synonyms a listener key's base key adds (`ssl.keystore.location` for `listener.name.x.ssl.keystore.
    location`): its static value when set, then its default."""
    out = []
    value = None if base.sensitive else base.render(broker.config[base.name])
    if base.name in broker.config.explicit:
        out.append({"name": base.name, "value": value, "source": SOURCE_STATIC_BROKER})
    out.append({"name": base.name, "value": None if base.sensitive else base.render(base.default),
                "source": SOURCE_DEFAULT})
    return out


def _config_denial(ctx: RequestContext, resource_type: int, name: str) -> ErrorCode | None:
    """The error for a config resource the caller may not describe or alter (this API's operation, from the table),
    None when it may; resource types without a check (unsupported ones) are None and answered as such."""
    if resource_type == RESOURCE_TOPIC:
        allowed, resource = ctx.authorized(ResourceType.TOPIC, name), ResourceType.TOPIC
    elif resource_type in (RESOURCE_BROKER, RESOURCE_BROKER_LOGGER):
        allowed, resource = ctx.authorized_cluster(), ResourceType.CLUSTER
    else:
        return None
    return None if allowed else ctx.denial(resource)


async def handle_describe_configs(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DESCRIBE_CONFIGS, ctx.api_version, body)
    docs = bool(getattr(req, "include_documentation", False))
    # every resource is authorized before any is described, as Kafka's ConfigHelper does
    denials = [_config_denial(ctx, res.resource_type, res.resource_name) for res in req.resources]
    results = []
    for res, denied in zip(req.resources, denials, strict=True):
        out: dict[str, Any] = {
            "error_code": 0, "error_message": None, "resource_type": res.resource_type,
            "resource_name": res.resource_name, "configs": [],
        }
        keys = list(res.configuration_keys) if res.configuration_keys is not None else None
        if denied is not None:
            out["error_code"], out["error_message"] = denied, denied.message
        elif res.resource_type == RESOURCE_TOPIC:
            config = _topic_config(broker, res.resource_name)
            if config is None:
                out["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                out["error_message"] = f"Topic {res.resource_name} does not exist"
            else:
                out["configs"] = describe_topic_entries(broker, config, keys, req.include_synonyms, docs)
        elif res.resource_type == RESOURCE_BROKER:
            if res.resource_name not in ("", str(broker.node_id)):
                out["error_code"] = ErrorCode.INVALID_REQUEST
                out["error_message"] = f"Unknown broker {res.resource_name}"
            else:
                out["configs"] = _describe_broker(broker, keys, docs, req.include_synonyms)
        else:
            out["error_code"] = ErrorCode.INVALID_REQUEST
            out["error_message"] = f"Resource type {res.resource_type} is not supported"
        results.append(out)
    return encode_response(ApiKey.DESCRIBE_CONFIGS, ctx.api_version, {"throttle_time_ms": 0, "results": results})


def _topic_config(broker: BrokerServices, name: str) -> TopicConfig | None:
    """A topic's effective config: the local topic's, or in cluster mode the image's overrides over the broker's
    defaults."""
    if controller_requests.in_cluster(broker):
        image = broker.cluster.image
        if name not in image.topics:
            return None
        try:
            return broker.config.topic_config(parse_topic_overrides(image.topic_configs.get(name, {})))
        except ConfigError:
            return broker.config.topic_config({})
    meta = broker.logs.topics.get(name)
    return None if meta is None else meta.config


def _apply(current: dict[str, Any], changes: list[Any]) -> dict[str, Any]:
    """The new override set after applying SET/DELETE/APPEND/SUBTRACT, validated."""
    raw: dict[str, Any] = {k: TOPIC_KEYS[k].render(v) for k, v in current.items()}
    for change in changes:
        op = change.config_operation
        if change.name in TOPIC_THROTTLES:
            if op == OP_DELETE:
                continue
            raise KafkaError(ErrorCode.INVALID_CONFIG, NO_THROTTLES.format(name=change.name))
        key = TOPIC_KEYS.get(change.name)
        if key is None:
            raise KafkaError(ErrorCode.INVALID_CONFIG, f"Unknown topic config name: {change.name}")
        if op == OP_SET:
            raw[change.name] = change.value
        elif op == OP_DELETE:
            raw.pop(change.name, None)
        elif op in (OP_APPEND, OP_SUBTRACT):
            if key.type != TYPE_LIST:
                raise KafkaError(ErrorCode.INVALID_CONFIG, f"{change.name} is not a list; APPEND/SUBTRACT need a list")
            items = [x for x in str(raw.get(change.name, "")).split(",") if x]
            if not items and change.name not in raw:
                items = list(key.default)
            values = [x.strip() for x in (change.value or "").split(",") if x.strip()]
            if op == OP_APPEND:
                items += [v for v in values if v not in items]
            else:
                items = [x for x in items if x not in values]
            raw[change.name] = ",".join(items)
        else:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"Unknown config operation {op}")
    try:
        return parse_topic_overrides(raw)
    except ConfigError as exc:
        raise KafkaError(ErrorCode.INVALID_CONFIG, str(exc)) from None


def _alter_broker(res: Any, known: set[str]) -> list[tuple[str, int, str | None]]:
    """A broker resource's alteration, checked as Kafka's preprocessing checks it before authorization: the dynamic
    per-listener SSL keys (broker/dynamic_listeners.py) are returned as (name, operation, value), to be applied once
    authorized; deleting any other key changes nothing (it has no dynamic value); anything else raises the
    KafkaError to answer. `known`: the resource names that name a broker."""
    if res.resource_name not in known:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"Unknown broker {res.resource_name}")
    names = [change.name for change in res.configs]
    if len(set(names)) != len(names):
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    dynamic = []
    for change in res.configs:
        op = change.config_operation
        if op not in (OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT):
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"Unknown operations type {op}")
        if op != OP_DELETE and change.value is None:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"Null value not supported for : {change.name}")
        if op == OP_DELETE and dynamic_listener_key(change.name) is None:
            continue
        if check_broker_change(change.name, op, res.resource_name):
            dynamic.append((change.name, op, change.value))
            continue
        if change.name in BROKER_THROTTLES:
            raise KafkaError(ErrorCode.INVALID_CONFIG, NO_THROTTLES.format(name=change.name))
        if change.name in REFUSED_BROKER_KEYS:
            # Not "static, restart with it": a restart with it would be refused too (config.REFUSED_BROKER_KEYS).
            raise KafkaError(ErrorCode.INVALID_CONFIG, f"Configuration {change.name} is not supported: "
                                                       f"{REFUSED_BROKER_KEYS[change.name]}")
        raise KafkaError(ErrorCode.INVALID_REQUEST, STATIC_BROKER)
    return dynamic


def _authorize_alteration(ctx: RequestContext, res: Any, brokers: set[str]) -> list[tuple[str, int, str | None]]:
    """Raise the KafkaError to answer when `res` may not be altered, in Kafka's order: a broker resource is
    validated first (the broker's preprocessing, before the controller authorizes), anything else is authorized
    first. A broker resource's dynamic changes are returned; their key stores are loaded only once authorized
    (unlike Kafka, which loads them first: a refused caller learns nothing about the broker's files)."""
    dynamic = _alter_broker(res, brokers) if res.resource_type == RESOURCE_BROKER else []
    denied = _config_denial(ctx, res.resource_type, res.resource_name)
    if denied is not None:
        raise KafkaError(denied, denied.message)
    return dynamic


async def handle_incremental_alter_configs(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.INCREMENTAL_ALTER_CONFIGS, ctx.api_version, body)
    if controller_requests.in_cluster(broker):
        return await _alter_in_cluster(broker, ctx, body, req)
    responses = []
    for res in req.resources:
        out = {"error_code": 0, "error_message": None, "resource_type": res.resource_type,
               "resource_name": res.resource_name}
        try:
            dynamic = _authorize_alteration(ctx, res, {"", str(broker.node_id)})
            if res.resource_type == RESOURCE_BROKER:
                if dynamic:  # per-listener SSL: a new key store in service, or the old one and the reason
                    plan = broker.security.dynamic.prepare(dynamic)
                    if not req.validate_only:
                        try:
                            broker.security.dynamic.commit(plan)
                        except OSError as exc:
                            raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR,
                                             f"cannot keep the dynamic broker config: {exc}") from None
            elif res.resource_type != RESOURCE_TOPIC:
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"Resource type {res.resource_type} is not supported")
            elif (meta := broker.logs.topics.get(res.resource_name)) is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {res.resource_name} does not exist")
            else:
                overrides = _apply(dict(meta.config.overrides), list(res.configs))
                if not req.validate_only:
                    broker.logs.alter_topic_config(res.resource_name, overrides)
        except KafkaError as exc:
            out["error_code"], out["error_message"] = exc.code, exc.message
        responses.append(out)
    return encode_response(
        ApiKey.INCREMENTAL_ALTER_CONFIGS, ctx.api_version, {"throttle_time_ms": 0, "responses": responses}
    )


async def _alter_in_cluster(broker: BrokerServices, ctx: RequestContext, body: memoryview, req: Any) -> bytes:
    cluster = broker.cluster
    image = cluster.image
    before = {res.resource_name: image.config_version(res.resource_name) for res in req.resources
              if res.resource_type == RESOURCE_TOPIC}

    async def run_here() -> dict[str, Any]:
        responses = []
        for res in req.resources:
            out = {"error_code": 0, "error_message": None, "resource_type": res.resource_type,
                   "resource_name": res.resource_name}
            responses.append(out)
            try:
                dynamic = _authorize_alteration(ctx, res, {"", *map(str, image.brokers)})
                if dynamic:
                    raise KafkaError(ErrorCode.INVALID_REQUEST, NOT_IN_A_CLUSTER.format(name=dynamic[0][0]))
                if res.resource_type == RESOURCE_BROKER:
                    continue
                if res.resource_type != RESOURCE_TOPIC:
                    raise KafkaError(ErrorCode.INVALID_REQUEST, f"Resource type {res.resource_type} is not supported")
                name = res.resource_name
                if name not in image.topics:
                    raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name} does not exist")
                try:
                    current = parse_topic_overrides(image.topic_configs.get(name, {}))
                except ConfigError:
                    current = {}
                overrides = _apply(current, list(res.configs))
                if req.validate_only:
                    continue
                result = await cluster.controller.set_topic_configs(
                    name, {k: TOPIC_KEYS[k].render(v) for k, v in overrides.items()})
                out["error_code"], out["error_message"] = result.code, result.message
            except KafkaError as exc:
                out["error_code"], out["error_message"] = exc.code, exc.message
        return {"throttle_time_ms": 0, "responses": responses}

    def settled(response: Any) -> Any:
        changed = [] if req.validate_only else [
            r.resource_name for r in response.responses if r.error_code == 0 and r.resource_type == RESOURCE_TOPIC]

        def done() -> bool:
            for name in changed:
                version = image.config_version(name)
                if name in image.topics and version is not None and before.get(name) is not None \
                        and version <= before[name]:
                    return False
            return True

        return done

    def failed(code: ErrorCode, message: str) -> dict[str, Any]:
        return {"throttle_time_ms": 0, "responses": [
            {"error_code": code, "error_message": message, "resource_type": res.resource_type,
             "resource_name": res.resource_name} for res in req.resources]}

    return await controller_requests.answer(broker, ctx, body, controller_requests.DEFAULT_TIMEOUT_MS, run_here,
                                            settled, failed)
