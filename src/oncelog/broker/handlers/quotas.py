"""DescribeClientQuotas and AlterClientQuotas (KIP-546): `kafka-configs --entity-type users|clients --describe` and
`--alter --add-config producer_byte_rate=...`; and `throttle`, what Produce and Fetch do on a quota violation.

The rules are security/quotas.py's (Kafka's ClientQuotasImage.describe and ClientQuotaControlManager): filters
answer INVALID_REQUEST (UNSUPPORTED_VERSION for an unknown entity type) at the top level, alterations answer per
entity, and a key oncelog does not enforce is refused with INVALID_REQUEST rather than accepted and ignored.
DESCRIBE_CONFIGS / ALTER_CONFIGS on the cluster are checked first, as Kafka's: refused, a description answers
CLUSTER_AUTHORIZATION_FAILED with no entries (DescribeClientQuotasRequest.getErrorResponse) and an alteration
answers it for every entry of the request, changing nothing. The store is the single node's
`__oncelog_meta/quotas.json`, or a cluster's znodes (cluster/store/quotas.py), whose writes are awaited.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING, Any

from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response
from ...security.acls import ResourceType
from ...security.quotas import (
    INT_MAX,
    IP,
    UNKNOWN_SERVER_ERROR,
    ApiError,
    ClientQuotaManager,
    QuotaAlteration,
    QuotaEntity,
    QuotaFilter,
    QuotaFilterError,
    quota_user,
    validate_alterations,
)
from ...security.settled import settled

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext


def _entity_data(pairs: Any) -> list[dict[str, Any]]:
    return [{"entity_type": entity_type, "entity_name": name} for entity_type, name in pairs]


async def handle_describe(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.DESCRIBE_CLIENT_QUOTAS, ctx.api_version, body)
    data: dict[str, Any] = {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "entries": []}
    store = broker.security.quotas
    if not ctx.authorized_cluster():
        data.update(error_code=ctx.denial(ResourceType.CLUSTER), entries=None)
    elif store is None:  # not served without a store (server.py); an answer rather than a closed connection
        data.update(error_code=UNKNOWN_SERVER_ERROR, entries=None)
    else:
        try:
            quota_filter = QuotaFilter.parse(((c.entity_type, c.match_type, c.match) for c in req.components),
                                             req.strict)
        except QuotaFilterError as exc:
            data.update(error_code=exc.code, error_message=exc.message, entries=None)
        else:
            data["entries"] = [{"entity": _entity_data(entity.entries),
                                "values": [{"key": key, "value": value} for key, value in values.items()]}
                               for entity, values in store.describe(quota_filter)]
    return encode_response(ApiKey.DESCRIBE_CLIENT_QUOTAS, ctx.api_version, data)


async def handle_alter(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.ALTER_CLIENT_QUOTAS, ctx.api_version, body)
    store = broker.security.quotas
    refusal = None
    if not ctx.authorized_cluster():
        code = ctx.denial(ResourceType.CLUSTER)
        refusal = ApiError(code, code.message)
    elif store is None:
        refusal = ApiError(UNKNOWN_SERVER_ERROR, None)
    if refusal is not None:  # every entry as the request has it (AlterClientQuotasRequest.getErrorResponse)
        entries = [{"error_code": refusal.code, "error_message": refusal.message,
                    "entity": _entity_data((e.entity_type, e.entity_name) for e in entry.entity)}
                   for entry in req.entries]
        return encode_response(ApiKey.ALTER_CLIENT_QUOTAS, ctx.api_version, {"throttle_time_ms": 0,
                                                                            "entries": entries})
    assert store is not None
    alterations = [QuotaAlteration(QuotaEntity.of((e.entity_type, e.entity_name) for e in entry.entity),
                                   tuple((op.key, None if op.remove else op.value) for op in entry.ops))
                   for entry in req.entries]
    unresolvable = await _unresolvable_ips(alterations)
    results, changes = validate_alterations(alterations, store.load(), lambda name: name not in unresolvable)
    if changes and not req.validate_only:
        try:
            await settled(store.alter(changes))
        except OSError as exc:
            failed = ApiError(UNKNOWN_SERVER_ERROR, f"Could not store the quotas: {exc}")
            changed = {entity for entity, _, _ in changes}
            results = {entity: failed if entity in changed else result for entity, result in results.items()}
    entries = [{"error_code": result.code, "error_message": result.message, "entity": _entity_data(entity.entries)}
               for entity, result in results.items()]
    return encode_response(ApiKey.ALTER_CLIENT_QUOTAS, ctx.api_version, {"throttle_time_ms": 0, "entries": entries})


async def _unresolvable_ips(alterations: list[QuotaAlteration]) -> set[str]:
    """The ip entity names that are neither an address nor a host name that resolves (Kafka:
    InetAddress.getByName), looked up off the event loop."""
    names = {a.entity.name(IP) for a in alterations if IP in a.entity}
    bad = set()
    loop = asyncio.get_running_loop()
    for name in names:
        if not name:
            continue  # the default, or empty (refused as such)
        try:
            await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            bad.add(name)
    return bad


async def until_unmuted(ctx: RequestContext) -> bool:
    """Wait while the caller's connection is muted by a throttle: what Kafka's muted channel does to the requests
    behind the throttled one (it reads them only after the throttle), for the requests oncelog read ahead. False
    when the connection ended meanwhile (or is ending before this request): the request is then dropped unprocessed,
    as Kafka never read it."""
    conn: Any = ctx.connection
    if not getattr(conn, "muted", False):
        return True
    await conn.until_unmuted()
    return not (conn.closed or (conn.close_at is not None and ctx.seq > conn.close_at))


def throttle(broker: BrokerServices, ctx: RequestContext, manager: ClientQuotaManager, value: float, *,
             unrecord_if_throttled: bool = False) -> int:
    """Kafka's maybeRecordAndGetThrottleTimeMs then throttle(): record `value` (bytes) against the quota of the
    caller's user and client id; on a violation mute the connection for the throttle time (KIP-219) and count it.
    The throttle time for the response (0: within the quota). `unrecord_if_throttled`: the value was not sent (a
    throttled fetch answers no records), so it does not count (unrecordQuotaSensor)."""
    user, client_id = quota_user(ctx.principal), ctx.client_id or ""
    now_ms = time.monotonic() * 1000
    throttle_ms, tags = manager.record(user, client_id, value, now_ms)
    if throttle_ms <= 0:
        return 0
    if unrecord_if_throttled:
        manager.unrecord(user, client_id, value, now_ms)
    broker.metrics.throttle_time.labels(manager.quota_type, *tags).observe(throttle_ms)
    mute = getattr(ctx.connection, "mute_for", None)
    if mute is not None:
        mute(throttle_ms / 1000)
    return min(throttle_ms, INT_MAX)
