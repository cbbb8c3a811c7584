"""ApiVersions: the broker's supported ranges, from the handlers that really exist."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext


async def handle(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    # v3+ carries the client's software name: remembered, because recovering a timed-out transaction
    # needs the answer each client treats as abortable (see handlers/produce.py).
    req = decode_request(ApiKey.API_VERSIONS, ctx.api_version, body)
    if ctx.api_version >= 3:
        ctx.connection.client_software = req.client_software_name
    keys = [  # the SASL requests only on a SASL listener
        {"api_key": k, "min_version": lo, "max_version": hi} for k, lo, hi in broker.dispatcher.supported_versions(ctx.connection.authenticator is not None)
    ]
    data = {"error_code": 0, "api_keys": keys, "throttle_time_ms": 0}
    return encode_response(ApiKey.API_VERSIONS, ctx.api_version, data)
