"""The znode layout under the chroot (docs/cluster.md §2) and, per znode kind, its JSON value: pure code, no
session. Every value carries a `version` field (FORMAT_VERSION); readers take what they know and default the
rest, so a newer writer's extra fields do not break an older reader. The znodes of ACLs, SCRAM credentials and
client quotas (docs/security.md §8 step 6, at the end) keep the layout and values of Kafka's ZooKeeper era
instead, so what Kafka's tools wrote there reads back."""

from __future__ import annotations

import base64
import json
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from ...security.acls import (
    AccessControlEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from ...security.credentials import ScramCredential
from ...security.quotas import CLIENT_ID as QUOTA_CLIENT_ID
from ...security.quotas import DEFAULT as QUOTA_DEFAULT
from ...security.quotas import USER as QUOTA_USER
from ...security.quotas import USER_CLIENT_KEYS as QUOTA_KEY_TYPES
from ...security.quotas import QuotaEntity
from ..metadata_image import PartitionAssignment, PartitionState, TopicDeletion, TopicInfo

DEFAULT_CHROOT = "/oncelog"
FORMAT_VERSION = 1

BROKERS = "/brokers/ids"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
CLUSTER_ID = "/cluster_id"
TOPICS = "/topics"
TOPIC_CONFIGS = "/configs/topics"
DELETING = "/deleting"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"

MAX_MULTI_BYTES = 1_000_000      # under ZooKeeper's default jute.maxbuffer (0xfffff), with room for the header


class Stat(Protocol):
    """What the codecs read of a znode's stat (kazoo's ZnodeStat has these)."""

    version: int
    czxid: int


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def encode_topic_id(topic_id: bytes) -> str:
    """Kafka's Uuid string form: URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(topic_id).decode().rstrip("=")


def decode_topic_id(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_cluster_id() -> str:
    return encode_topic_id(uuid.uuid4().bytes)


def dump(value: dict[str, Any]) -> bytes:
    return json.dumps({"version": FORMAT_VERSION, **value}, separators=(",", ":"), sort_keys=True).encode()


def load(data: bytes | None) -> dict[str, Any]:
    value = json.loads(data or b"{}")
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def state_json(state: PartitionState) -> bytes:
    return dump({"leader": state.leader, "leader_epoch": state.leader_epoch, "isr": list(state.isr),
                  "controller_epoch": state.controller_epoch, "log_start_floor": state.log_start_floor})


def state_from(data: bytes, stat: Stat) -> PartitionState:
    v = load(data)
    return PartitionState(int(v["leader"]), int(v["leader_epoch"]), tuple(int(r) for r in v["isr"]),
                          int(v.get("controller_epoch", 0)), stat.version, int(v.get("log_start_floor", 0)))


def topic_json(topic_id: bytes, assignment: Mapping[int, PartitionAssignment], creating: bool = False) -> bytes:
    value: dict[str, Any] = {
        "topic_id": encode_topic_id(topic_id),
        "replicas": {str(p): list(a.replicas) for p, a in sorted(assignment.items())},
        "adding": {str(p): list(a.adding) for p, a in sorted(assignment.items()) if a.adding},
        "removing": {str(p): list(a.removing) for p, a in sorted(assignment.items()) if a.removing},
    }
    if creating:
        value["creating"] = True        # created in steps (too big for one request): invisible until cleared
    return dump(value)


def creating(data: bytes) -> bool:
    return bool(load(data).get("creating"))


def topic_from(name: str, data: bytes, stat: Stat) -> TopicInfo:
    v = load(data)
    adding, removing = v.get("adding", {}), v.get("removing", {})
    assignment = {
        int(p): PartitionAssignment(tuple(int(r) for r in replicas), tuple(int(r) for r in adding.get(p, ())),
                                    tuple(int(r) for r in removing.get(p, ())))
        for p, replicas in v["replicas"].items()
    }
    return TopicInfo(name, decode_topic_id(v["topic_id"]), assignment, stat.version, stat.czxid)


def deletion_json(pending: Mapping[bytes, Sequence[int]]) -> bytes:
    return dump({"topics": [{"topic_id": encode_topic_id(t), "replicas": sorted(set(r))}
                             for t, r in pending.items()]})


def deletion_from(name: str, data: bytes, stat: Stat) -> TopicDeletion:
    v = load(data)
    pending = {decode_topic_id(e["topic_id"]): tuple(int(r) for r in e["replicas"]) for e in v.get("topics", [])}
    return TopicDeletion(name, pending, stat.version, stat.czxid)


def as_assignment(value: PartitionAssignment | Sequence[int]) -> PartitionAssignment:
    return value if isinstance(value, PartitionAssignment) else PartitionAssignment(tuple(value))


def endpoints_from(value: Mapping[str, Any]) -> tuple[tuple[str, str, int], ...]:
    """A broker znode's `endpoints` ("NAME://host:port" each, Kafka's layout) as (name, host, port) tuples."""
    out = []
    for item in value.get("endpoints") or ():
        name, sep, address = str(item).partition("://")
        host, _, port = address.rpartition(":")
        if sep and port.isdigit():
            out.append((name.upper(), host.strip("[]"), int(port)))
    return tuple(out)


# ---- issue 23: ACLs, SCRAM credentials, client quotas, in the layout of Kafka's ZooKeeper era (ZkData.scala) --------
#
# /kafka-acl/<Type>/<name>                       LITERAL ACLs of one resource: {"version":1,"acls":[{"principal":
# /kafka-acl-extended/prefixed/<Type>/<name>     "User:alice","permissionType":"Allow","operation":"Read","host":"*"}]}
# /kafka-acl-changes/acl_changes_<seq>           "TOPIC:orders": a LITERAL resource whose ACLs changed
# /kafka-acl-extended-changes/acl_changes_<seq>  {"version":1,"resourceType":"TOPIC","name":"ord","patternType":
#                                                "PREFIXED"}
# /config/users/<user>                           a user's config entity: {"version":1,"config":{"SCRAM-SHA-256":
#                                                "salt=...,stored_key=...,server_key=...,iterations=4096",
#                                                "producer_byte_rate":"1024"}}
# /config/users/<user>/clients/<client-id>       quotas of a user's client id
# /config/clients/<client-id>                    quotas of a client id
# /config/changes/config_change_<seq>            {"version":2,"entity_path":"users/alice"}
#
# Entity names are Kafka's sanitized form (URL-encoded, `*` as %2A); `<default>` names the default entity.

ACL_ROOTS = {PatternType.LITERAL: "/kafka-acl", PatternType.PREFIXED: "/kafka-acl-extended/prefixed"}
ACL_CHANGES = {PatternType.LITERAL: "/kafka-acl-changes", PatternType.PREFIXED: "/kafka-acl-extended-changes"}
ACL_CHANGE_PREFIX = "acl_changes_"
ACL_FORMAT_VERSION = 1
ACL_RESOURCE_TYPES = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID,
                      ResourceType.DELEGATION_TOKEN, ResourceType.USER)

CONFIG_USERS = "/config/users"
CONFIG_CLIENTS = "/config/clients"
CONFIG_CHANGES = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
CONFIG_CHANGE_VERSION = 2
# A notification older than this is deleted by whichever broker sees it (Kafka's changeExpirationMs): every broker
# has read it long before, and one that was cut off meanwhile reads everything again when it reconnects.
CHANGE_EXPIRATION_MS = 15 * 60 * 1000

SECURITY_LAYOUT = (*ACL_ROOTS.values(), *ACL_CHANGES.values(),
                   *(f"{root}/{t.pascal_name}" for root in ACL_ROOTS.values() for t in ACL_RESOURCE_TYPES),
                   CONFIG_USERS, CONFIG_CLIENTS, CONFIG_CHANGES)

_TYPES_BY_DIR = {t.pascal_name: t for t in ACL_RESOURCE_TYPES}


def znode_name_error(name: str) -> str | None:
    """Why `name` cannot be one znode's name (ZooKeeper's PathUtils.validatePath, and no `/`), or None."""
    if not name:
        return "it is empty"
    if "/" in name:
        return "it contains '/'"
    if name in (".", ".."):
        return f"{name!r} is not a znode name"
    for char in name:
        code = ord(char)
        if (code == 0 or 0x01 <= code <= 0x1F or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xF8FF
                or 0xFFF0 <= code <= 0xFFFF):
            return f"it contains the character U+{code:04X}, which ZooKeeper refuses in a path"
    return None


def acl_path(pattern: ResourcePattern) -> str:
    """/kafka-acl/Topic/orders, /kafka-acl-extended/prefixed/Group/app- (KeyError for a pattern type not stored)."""
    return f"{ACL_ROOTS[pattern.pattern_type]}/{pattern.resource_type.pascal_name}/{pattern.name}"


def acl_type_dir(name: str) -> ResourceType | None:
    """The resource type of a directory under an ACL root ("TransactionalId"), or None for a name Kafka never
    wrote."""
    return _TYPES_BY_DIR.get(name)


def _camel(name: str) -> str:
    return name.replace("_", "").replace("-", "").upper()


def _enum_named(enum: type[Any], text: str) -> Any:
    """An enum member from Kafka's spelling ("ClusterAction", "CLUSTER_ACTION", "Allow"); ValueError otherwise."""
    wanted = _camel(str(text))
    for member in enum:
        if _camel(member.name) == wanted and member.name not in ("UNKNOWN", "ANY", "MATCH"):
            return member
    raise ValueError(f"unknown {enum.__name__} {text!r}")


def acls_json(entries: Iterable[AccessControlEntry]) -> bytes:
    """Kafka's AclEntry JSON for one resource's ACLs: operation and permission in its Pascal spelling."""
    return json.dumps({"version": ACL_FORMAT_VERSION, "acls": [
        {"principal": e.principal, "permissionType": e.permission.pascal_name, "operation": e.operation.pascal_name,
         "host": e.host} for e in entries]}, separators=(",", ":")).encode()


def acls_from(data: bytes | None) -> tuple[AccessControlEntry, ...]:
    """One resource's ACLs (empty data: none); ValueError for anything Kafka's AclEntry.fromBytes would refuse."""
    if not data:
        return ()
    value = load(data)
    if value.get("version") != ACL_FORMAT_VERSION or not isinstance(value.get("acls"), list):
        raise ValueError(f"not a version {ACL_FORMAT_VERSION} ACL list")
    entries: dict[AccessControlEntry, None] = {}
    for item in value["acls"]:
        if not isinstance(item, dict):
            raise ValueError(f"an ACL that is not an object: {item!r}")
        principal, host = item.get("principal"), item.get("host")
        if not isinstance(principal, str) or ":" not in principal or not isinstance(host, str):
            raise ValueError(f"an ACL without a principal or host: {item!r}")
        entries[AccessControlEntry(principal, host, _enum_named(AclOperation, item.get("operation", "")),
                                   _enum_named(AclPermissionType, item.get("permissionType", "")))] = None
    return tuple(entries)


def acl_change_json(pattern: ResourcePattern) -> bytes:
    """The notification of a change to `pattern`'s ACLs, as Kafka's Literal/ExtendedAclChangeStore encode it."""
    if pattern.pattern_type == PatternType.LITERAL:
        return f"{pattern.resource_type.name}:{pattern.name}".encode()
    return json.dumps({"version": 1, "resourceType": pattern.resource_type.name, "name": pattern.name,
                       "patternType": pattern.pattern_type.name}, separators=(",", ":")).encode()


def acl_change_from(pattern_type: PatternType, data: bytes) -> ResourcePattern:
    """The resource a notification under ACL_CHANGES[pattern_type] names; ValueError if it names none."""
    if pattern_type == PatternType.LITERAL:
        text = data.decode()
        type_name, sep, name = text.partition(":")
        if not sep:
            raise ValueError(f"expected a string in format ResourceType:ResourceName but got {text}")
        return ResourcePattern(_enum_named(ResourceType, type_name), name, PatternType.LITERAL)
    value = load(data)
    found = _enum_named(PatternType, value["patternType"])
    if found == PatternType.LITERAL or not isinstance(value.get("name"), str):
        raise ValueError(f"not an extended ACL change: {value!r}")
    return ResourcePattern(_enum_named(ResourceType, value["resourceType"]), value["name"], found)


def sanitize(name: str) -> str:
    """Kafka's Sanitizer.sanitize, the znode name of an entity: UTF-8 URL-encoding with `*` as %2A and space as
    %20 (Java's URLEncoder keeps letters, digits and `.-*_`); "." and ".." are encoded too, which ZooKeeper
    could not hold."""
    text = urllib.parse.quote(name, safe="").replace("~", "%7E")
    return text.replace(".", "%2E") if text in (".", "..") else text


def desanitize(text: str) -> str:
    return urllib.parse.unquote(text)


def _entity_name(name: str | None) -> str:
    return QUOTA_DEFAULT if name is None else sanitize(name)


def _name_of(text: str) -> str | None:
    return None if text == QUOTA_DEFAULT else desanitize(text)


def user_entity(user: str | None) -> str:
    """The entity path of a user ("users/alice"; None: the default user, "users/<default>")."""
    return f"users/{_entity_name(user)}"


def quota_entity_path(entity: QuotaEntity) -> str:
    """The entity path of a user / client-id quota entity (KeyError for one that has neither)."""
    names = entity.as_dict()
    if QUOTA_USER in names and QUOTA_CLIENT_ID in names:
        return f"users/{_entity_name(names[QUOTA_USER])}/clients/{_entity_name(names[QUOTA_CLIENT_ID])}"
    if QUOTA_USER in names:
        return user_entity(names[QUOTA_USER])
    return f"clients/{_entity_name(names[QUOTA_CLIENT_ID])}"


def parse_entity_path(path: str) -> tuple[str | None, str | None, bool, bool]:
    """(user, client id, has user, has client id) of "users/alice/clients/app", "users/<default>", "clients/app";
    ValueError for any other path."""
    parts = path.split("/")
    if len(parts) == 2 and parts[0] == "users" and parts[1]:
        return _name_of(parts[1]), None, True, False
    if len(parts) == 2 and parts[0] == "clients" and parts[1]:
        return None, _name_of(parts[1]), False, True
    if len(parts) == 4 and parts[0] == "users" and parts[2] == "clients" and parts[1] and parts[3]:
        return _name_of(parts[1]), _name_of(parts[3]), True, True
    raise ValueError(f"not a user or client entity path: {path!r}")


def entity_user(path: str) -> str | None:
    """The user whose own config entity `path` is ("users/alice" -> "alice"), None for every other path (a
    default user, a client id, a user's client id) and for a path that is not an entity's."""
    try:
        user, _, has_user, has_client = parse_entity_path(path)
    except ValueError:
        return None
    return user if has_user and not has_client else None


def quota_entity_of(path: str) -> QuotaEntity:
    """The quota entity of an entity path (ValueError for a path that is not one)."""
    user, client, has_user, has_client = parse_entity_path(path)
    names: dict[str, str | None] = {}
    if has_user:
        names[QUOTA_USER] = user
    if has_client:
        names[QUOTA_CLIENT_ID] = client
    return QuotaEntity.of(names)


def entity_znode(path: str) -> str:
    """The znode of an entity path: "users/alice" -> /config/users/alice."""
    return f"/config/{path}"


def config_json(config: Mapping[str, str]) -> bytes:
    """Kafka's ConfigEntityZNode: {"version":1,"config":{key: string value}}."""
    return json.dumps({"version": 1, "config": dict(sorted(config.items()))}, separators=(",", ":")).encode()


def config_from(data: bytes | None) -> dict[str, str]:
    """An entity's config (no data, as a parent Kafka created on the way to a user's client id: empty)."""
    if not data:
        return {}
    config = load(data).get("config") or {}
    if not isinstance(config, dict):
        raise ValueError("config is not an object")
    return {str(k): str(v) for k, v in config.items()}


def config_change_json(entity_path: str) -> bytes:
    return json.dumps({"version": CONFIG_CHANGE_VERSION, "entity_path": entity_path},
                      separators=(",", ":")).encode()


def config_change_from(data: bytes) -> str:
    """The entity path a /config/changes notification names: version 2's entity_path, or version 1's
    entity_type/entity_name; ValueError otherwise."""
    value = load(data)
    if value.get("version") == CONFIG_CHANGE_VERSION and isinstance(value.get("entity_path"), str):
        return value["entity_path"]
    if value.get("version") == 1 and isinstance(value.get("entity_type"), str):
        return f"{value['entity_type']}/{value['entity_name']}"
    raise ValueError(f"not a config change notification: {value!r}")


def scram_text(credential: ScramCredential) -> str:
    """Kafka's ScramCredentialUtils.credentialToString."""
    b64 = base64.b64encode
    return (f"salt={b64(credential.salt).decode()},stored_key={b64(credential.stored_key).decode()},"
            f"server_key={b64(credential.server_key).decode()},iterations={credential.iterations}")


def scram_from(mechanism: str, text: str) -> ScramCredential:
    """ScramCredentialUtils.credentialFromString: exactly the four keys, each split at its first `=`."""
    fields = {}
    for token in text.split(","):
        key, sep, value = token.partition("=")
        if not sep:
            raise ValueError(f"Credentials not valid: {text}")
        fields[key] = value
    if set(fields) != {"salt", "stored_key", "server_key", "iterations"}:
        raise ValueError(f"Credentials not valid: {text}")
    b64 = base64.b64decode
    return ScramCredential(mechanism, b64(fields["salt"], validate=True), b64(fields["stored_key"], validate=True),
                           b64(fields["server_key"], validate=True), int(fields["iterations"]))


def quota_text(key: str, value: float) -> str:
    """A quota's value as ZkAdminManager.alterClientQuotas stores it: a whole number for LONG and INT keys."""
    return str(int(value)) if QUOTA_KEY_TYPES.get(key, "DOUBLE") in ("LONG", "INT") else repr(float(value))
