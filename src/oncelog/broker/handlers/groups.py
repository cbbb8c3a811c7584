"""Group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups,
DeleteGroups. The rules live in coordinator/group/; this is the wire and its per-version shapes.

Authorization (security/api_acls.RULES) as Kafka's KafkaApis makes it, always before the coordinator is asked:
FindCoordinator DESCRIBE on each key's group or transactional id; JoinGroup, SyncGroup, Heartbeat and LeaveGroup
READ on the group for the whole request; DescribeGroups DESCRIBE and DeleteGroups DELETE on each group; ListGroups
the whole list with Cluster DESCRIBE, else only the groups the caller may DESCRIBE."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...coordinator.group.api import JoinRequest, LeavingMember
from ...coordinator.group.store import OFFSETS_TOPIC
from ...coordinator.txn.coordinator import TXN_TOPIC
from ...errors import ErrorCode
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import ResourceType
from .common import UNKNOWN_AUTHORIZED_OPERATIONS

if TYPE_CHECKING:
    from ...coordinator.group import GroupCoordinator
    from ..context import BrokerServices, CoordinatorNode, RequestContext

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1


def coordinator_of(broker: BrokerServices) -> GroupCoordinator | None:
    return getattr(broker, "group_coordinator", None)


def client_host(ctx: RequestContext) -> str:
    """The client's address as Kafka shows it (InetAddress.toString: "/127.0.0.1")."""
    return "/" + ctx.connection.peer.rpartition(":")[0]


# -- FindCoordinator ------------------------------------------------------------------------------------------
def _find(broker: BrokerServices, key: str, key_type: int,
          listener: Any = None) -> tuple[ErrorCode, str | None, CoordinatorNode | None]:
    """The coordinator of `key` is the leader of the internal-topic partition the key hashes to, as this broker
    sees it (the single node: itself); COORDINATOR_NOT_AVAILABLE when that partition has no leader yet."""
    if key_type == KEY_TYPE_GROUP:
        groups = coordinator_of(broker)
        if groups is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, "The group coordinator is not running", None
        topic, partition = OFFSETS_TOPIC, groups.partition_for(key)
    elif key_type == KEY_TYPE_TRANSACTION:
        txn = getattr(broker, "txn_coordinator", None)
        if txn is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, "The transaction coordinator is not running", None
        topic, partition = TXN_TOPIC, txn.partition_for(key)
    else:
        return ErrorCode.INVALID_REQUEST, f"Unknown coordinator key type {key_type}", None
    node = broker.coordinator_node(topic, partition, listener)
    if isinstance(node, ErrorCode):
        return node, f"{topic}-{partition} has no available leader", None
    return ErrorCode.NONE, None, node


def _coordinator_denial(ctx: RequestContext, key: str, key_type: int) -> ErrorCode:
    """DESCRIBE on the key's group or transactional id (per key), before the coordinator is looked up (which may
    create the internal topic)."""
    resource = {KEY_TYPE_GROUP: ResourceType.GROUP, KEY_TYPE_TRANSACTION: ResourceType.TRANSACTIONAL_ID}.get(key_type)
    if resource is not None and not ctx.authorized(resource, key):
        return ctx.denial(resource)
    return ErrorCode.NONE


async def handle_find_coordinator(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.FIND_COORDINATOR, ctx.api_version, body)
    version = ctx.api_version
    key_type = req.key_type if version >= 1 else KEY_TYPE_GROUP

    def answer(key: str) -> dict[str, Any]:
        denied = _coordinator_denial(ctx, key, key_type)
        if denied:
            # Kafka's v4+ entries carry no message; before v4 the error answer has the error's own
            error, message, node = denied, None if version >= 4 else denied.message, None
        else:
            error, message, node = _find(broker, key, key_type, ctx.connection.listener)
        if node is None:
            return {"key": key, "error_code": error, "error_message": message, "node_id": -1, "host": "",
                    "port": -1}
        return {"key": key, "error_code": error, "error_message": message, "node_id": node.node_id,
                "host": node.host, "port": node.port}

    if version >= 4:
        data: dict[str, Any] = {"throttle_time_ms": 0, "coordinators": [answer(k) for k in req.coordinator_keys]}
    else:
        data = answer(req.key)
        del data["key"]
        data["throttle_time_ms"] = 0
    return encode_response(ApiKey.FIND_COORDINATOR, version, data)


# -- JoinGroup / SyncGroup / Heartbeat / LeaveGroup -------------------------------------------------------------
async def handle_join_group(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.JOIN_GROUP, ctx.api_version, body)
    version = ctx.api_version
    groups = coordinator_of(broker)
    data: dict[str, Any] = {"throttle_time_ms": 0, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                            "generation_id": -1, "protocol_type": None, "protocol_name": None if version >= 7 else "",
                            "leader": "", "skip_assignment": False, "member_id": req.member_id, "members": []}
    if not ctx.authorized(ResourceType.GROUP, req.group_id):
        # Kafka's error answer: no member id, generation or leader; nothing joined
        data.update(error_code=ctx.denial(ResourceType.GROUP), member_id="")
    elif groups is not None:
        result = await groups.join_group(JoinRequest(
            group_id=req.group_id, member_id=req.member_id,
            group_instance_id=req.group_instance_id if version >= 5 else None,
            client_id=ctx.client_id or "", client_host=client_host(ctx),
            session_timeout_ms=req.session_timeout_ms,
            rebalance_timeout_ms=req.rebalance_timeout_ms if version >= 1 else req.session_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=[(p.name, bytes(p.metadata)) for p in req.protocols],
            require_known_member_id=version >= 4, supports_skip_assignment=version >= 9,
            reason=req.reason if version >= 8 else None,
        ))
        data.update(
            error_code=result.error, generation_id=result.generation_id, member_id=result.member_id,
            protocol_type=result.protocol_type if result.error == ErrorCode.NONE else None,
            protocol_name=result.protocol_name if result.protocol_name is not None or version >= 7 else "",
            leader=result.leader, skip_assignment=result.skip_assignment,
            members=[{"member_id": m, "group_instance_id": i, "metadata": md} for m, i, md in result.members],
        )
        if version < 7 and data["protocol_name"] is None:
            data["protocol_name"] = ""
    return encode_response(ApiKey.JOIN_GROUP, version, data)


async def handle_sync_group(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.SYNC_GROUP, ctx.api_version, body)
    version = ctx.api_version
    groups = coordinator_of(broker)
    data: dict[str, Any] = {"throttle_time_ms": 0, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                            "protocol_type": None, "protocol_name": None, "assignment": b""}
    if version >= 5 and (req.protocol_type is None or req.protocol_name is None):
        data["error_code"] = ErrorCode.INCONSISTENT_GROUP_PROTOCOL  # mandatory from v5, checked first (Kafka)
    elif not ctx.authorized(ResourceType.GROUP, req.group_id):
        data["error_code"] = ctx.denial(ResourceType.GROUP)
    elif groups is not None:
        result = await groups.sync_group(
            req.group_id, req.generation_id, req.member_id, req.group_instance_id if version >= 3 else None,
            req.protocol_type if version >= 5 else None, req.protocol_name if version >= 5 else None,
            {a.member_id: bytes(a.assignment) for a in req.assignments},
        )
        data.update(error_code=result.error, protocol_type=result.protocol_type, protocol_name=result.protocol_name,
                    assignment=result.assignment)
    return encode_response(ApiKey.SYNC_GROUP, version, data)


async def handle_heartbeat(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.HEARTBEAT, ctx.api_version, body)
    groups = coordinator_of(broker)
    error = ErrorCode.COORDINATOR_NOT_AVAILABLE
    if not ctx.authorized(ResourceType.GROUP, req.group_id):
        error = ctx.denial(ResourceType.GROUP)
    elif groups is not None:
        error = groups.heartbeat(req.group_id, req.generation_id, req.member_id,
                                 req.group_instance_id if ctx.api_version >= 3 else None)
    return encode_response(ApiKey.HEARTBEAT, ctx.api_version, {"throttle_time_ms": 0, "error_code": error})


async def handle_leave_group(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.LEAVE_GROUP, ctx.api_version, body)
    version = ctx.api_version
    if version >= 3:
        leaving = [LeavingMember(m.member_id, m.group_instance_id, m.reason if version >= 5 else None)
                   for m in req.members]
    else:
        leaving = [LeavingMember(req.member_id)]
    groups = coordinator_of(broker)
    if not ctx.authorized(ResourceType.GROUP, req.group_id):
        error, errors = ctx.denial(ResourceType.GROUP), []  # no member leaves, no member answers
    elif groups is None:
        error, errors = ErrorCode.COORDINATOR_NOT_AVAILABLE, []
    else:
        error, errors = groups.leave_group(req.group_id, leaving)
    if version < 3 and error == ErrorCode.NONE and errors:
        error = errors[0]  # one member, no per-member answers: its error is the answer
    members = [{"member_id": lm.member_id, "group_instance_id": lm.group_instance_id, "error_code": e}
               for lm, e in zip(leaving, errors, strict=False)]
    return encode_response(ApiKey.LEAVE_GROUP, version,
                           {"throttle_time_ms": 0, "error_code": error, "members": members})


# -- DescribeGroups / ListGroups / DeleteGroups -------------------------------------------------------------
async def handle_describe_groups(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DESCRIBE_GROUPS, ctx.api_version, body)
    groups = coordinator_of(broker)
    wants_ops = ctx.api_version >= 3 and req.include_authorized_operations
    allowed = set(ctx.filter_authorized(ResourceType.GROUP, req.groups))
    described = []
    for group_id in req.groups:
        if group_id not in allowed or groups is None:
            error = ctx.denial(ResourceType.GROUP) if group_id not in allowed else ErrorCode.COORDINATOR_NOT_AVAILABLE
            entry: dict[str, Any] = {"group_id": group_id, "error_code": error, "group_state": "",
                                     "protocol_type": "", "protocol_data": "", "members": []}
        else:
            entry = groups.describe_group(group_id)
            entry.setdefault("error_code", ErrorCode.NONE)
        # Kafka fills them in only for the groups described without error (all of them without ACLs)
        entry["authorized_operations"] = (ctx.authorized_operations(ResourceType.GROUP, group_id)
                                          if wants_ops and not entry["error_code"] else UNKNOWN_AUTHORIZED_OPERATIONS)
        described.append(entry)
    return encode_response(ApiKey.DESCRIBE_GROUPS, ctx.api_version, {"throttle_time_ms": 0, "groups": described})


async def handle_list_groups(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.LIST_GROUPS, ctx.api_version, body)
    groups = coordinator_of(broker)
    if groups is None:
        data = {"throttle_time_ms": 0, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE, "groups": []}
    elif groups.loading:
        # A partition is still loading: its groups are not known yet, so no list would be complete (Kafka's answer).
        data = {"throttle_time_ms": 0, "error_code": ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "groups": []}
    else:
        states = list(req.states_filter) if ctx.api_version >= 4 and req.states_filter else []
        listed = [dict(g, group_type="classic") for g in groups.list_groups(states)]
        if not ctx.authorized_cluster():
            # without Cluster DESCRIBE: only the groups the caller may DESCRIBE, the others as if absent
            visible = set(ctx.filter_authorized(ResourceType.GROUP, [g["group_id"] for g in listed]))
            listed = [g for g in listed if g["group_id"] in visible]
        data = {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "groups": listed}
    return encode_response(ApiKey.LIST_GROUPS, ctx.api_version, data)


async def handle_delete_groups(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DELETE_GROUPS, ctx.api_version, body)
    groups = coordinator_of(broker)
    names = list(dict.fromkeys(req.groups_names))
    allowed = ctx.filter_authorized(ResourceType.GROUP, names)
    refused = set(names) - set(allowed)
    results = dict.fromkeys(refused, ctx.denial(ResourceType.GROUP)) if refused else {}
    if groups is None:
        results.update((name, ErrorCode.COORDINATOR_NOT_AVAILABLE) for name in allowed)
    elif allowed:
        results.update(await groups.delete_groups(allowed))
    data = {"throttle_time_ms": 0,
            "results": [{"group_id": name, "error_code": results[name]} for name in names]}
    return encode_response(ApiKey.DELETE_GROUPS, ctx.api_version, data)
