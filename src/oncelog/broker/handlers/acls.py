"""CreateAcls, DescribeAcls and DeleteAcls (KIP-140): `kafka-acls --add / --list / --remove`.

CLUSTER ALTER (create, delete) or DESCRIBE (describe) is checked first, as the table says; without an authorizer
each answers SECURITY_DISABLED, as a Kafka broker without one does. The store validates and persists
(security/acl_store.py on the single node, cluster/store/acls.py in a cluster, whose writes are awaited) and this
broker's authorizer snapshot follows every change before the answer leaves.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from ...errors import ErrorCode
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import (
    NO_AUTHORIZER_ALTER,
    NO_AUTHORIZER_DESCRIBE,
    AccessControlEntryFilter,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePatternFilter,
    ResourceType,
    acl,
)
from ...security.settled import settled

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

_CLUSTER_DENIED = "Cluster authorization failed."


def _filter(item: Any, version: int) -> AclBindingFilter:
    pattern_type = PatternType.from_code(item.pattern_type_filter) if version >= 1 else PatternType.LITERAL
    return AclBindingFilter(
        ResourcePatternFilter(ResourceType.from_code(item.resource_type_filter), item.resource_name_filter,
                              pattern_type),
        AccessControlEntryFilter(item.principal_filter, item.host_filter, AclOperation.from_code(item.operation),
                                 AclPermissionType.from_code(item.permission_type)))


def _binding_fields(binding: AclBinding) -> dict[str, Any]:
    p, e = binding.pattern, binding.entry
    return {"resource_type": int(p.resource_type), "resource_name": p.name, "pattern_type": int(p.pattern_type),
            "principal": e.principal, "host": e.host, "operation": int(e.operation),
            "permission_type": int(e.permission)}


async def handle_describe_acls(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DESCRIBE_ACLS, ctx.api_version, body)
    store = broker.security.acl_store
    data: dict[str, Any] = {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "resources": []}
    binding_filter = _filter(req, ctx.api_version)
    if store is None:
        data["error_code"], data["error_message"] = NO_AUTHORIZER_DESCRIBE
    elif not ctx.authorized_cluster():
        data["error_code"], data["error_message"] = ErrorCode.CLUSTER_AUTHORIZATION_FAILED, _CLUSTER_DENIED
    elif binding_filter.is_unknown:
        data["error_code"], data["error_message"] = ErrorCode.INVALID_REQUEST, "The filter has UNKNOWN fields."
    else:
        by_pattern: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for binding in store.describe(binding_filter):
            e = binding.entry
            by_pattern[binding.pattern].append({"principal": e.principal, "host": e.host,
                                                "operation": int(e.operation), "permission_type": int(e.permission)})
        data["resources"] = [{"resource_type": int(p.resource_type), "resource_name": p.name,
                              "pattern_type": int(p.pattern_type), "acls": acls}
                             for p, acls in by_pattern.items()]
    return encode_response(ApiKey.DESCRIBE_ACLS, ctx.api_version, data)


def _alter_refusal(broker: BrokerServices, ctx: RequestContext) -> tuple[int, str] | None:
    """Why CreateAcls / DeleteAcls change nothing: no authorizer (SECURITY_DISABLED), or no Cluster ALTER."""
    if broker.security.acl_store is None:
        return NO_AUTHORIZER_ALTER
    if not ctx.authorized_cluster():
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, _CLUSTER_DENIED
    return None


async def handle_create_acls(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.CREATE_ACLS, ctx.api_version, body)
    store = broker.security.acl_store
    refusal = _alter_refusal(broker, ctx)
    if refusal is not None:
        results = [{"error_code": refusal[0], "error_message": refusal[1]} for _ in req.creations]
    else:
        bindings = [acl(ResourceType.from_code(c.resource_type), c.resource_name,
                        PatternType.from_code(c.resource_pattern_type) if ctx.api_version >= 1 else PatternType.LITERAL,
                        c.principal, c.host, AclOperation.from_code(c.operation),
                        AclPermissionType.from_code(c.permission_type)) for c in req.creations]
        results = [{"error_code": r.error_code, "error_message": r.error_message} for r in await settled(store.create(bindings))]
    data = {"throttle_time_ms": 0, "results": results}
    return encode_response(ApiKey.CREATE_ACLS, ctx.api_version, data)


async def handle_delete_acls(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DELETE_ACLS, ctx.api_version, body)
    store = broker.security.acl_store
    refusal = _alter_refusal(broker, ctx)
    if refusal is not None:
        results = [{"error_code": refusal[0], "error_message": refusal[1], "matching_acls": []} for _ in req.filters]
    else:
        results = []
        for outcome in await settled(store.delete([_filter(f, ctx.api_version) for f in req.filters])):
            results.append({"error_code": outcome.error_code, "error_message": outcome.error_message,
                            "matching_acls": [{"error_code": 0, "error_message": None, **_binding_fields(b)}
                                              for b in outcome.deleted]})
    data = {"throttle_time_ms": 0, "filter_results": results}
    return encode_response(ApiKey.DELETE_ACLS, ctx.api_version, data)
