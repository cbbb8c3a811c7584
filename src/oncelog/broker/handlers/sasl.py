"""SaslHandshake and SaslAuthenticate: the connection's SASL state machine (security/sasl/authenticator.py) fed
with the decoded request, and Kafka's way of ending a failed authentication: the answer is sent after
`connection.failed.authentication.delay.ms`, then the connection is closed."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ...errors import ErrorCode
from ...protocol.apis import ApiKey
from ...protocol.messages import decode_request, encode_response

if TYPE_CHECKING:
    from ..context import BrokerServices, RequestContext

log = logging.getLogger("oncelog.security")


async def handle_sasl_handshake(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.SASL_HANDSHAKE, ctx.api_version, body)
    auth = ctx.connection.authenticator
    if auth is None:  # not a SASL listener: Kafka answers ILLEGAL_SASL_STATE
        data = {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": []}
        return encode_response(ApiKey.SASL_HANDSHAKE, ctx.api_version, data)
    error = auth.handshake(str(req.mechanism or ""))
    if error != ErrorCode.NONE:
        log.info("closing connection from %s: SaslHandshake for %s refused (%s)", ctx.connection.peer,
                 req.mechanism, ErrorCode(error).name)
        ctx.connection.close_after_pending(ctx.seq)
    data = {"error_code": error, "mechanisms": list(auth.mechanisms)}
    return encode_response(ApiKey.SASL_HANDSHAKE, ctx.api_version, data)


async def handle_sasl_authenticate(broker: BrokerServices, ctx: RequestContext, body: memoryview) -> bytes:
    req = decode_request(ApiKey.SASL_AUTHENTICATE, ctx.api_version, body)
    conn = ctx.connection
    auth = conn.authenticator
    if auth is None:
        conn.close_after_pending(ctx.seq)
        return _answer(ctx, ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate on a listener without SASL", b"", 0)
    again = auth.reauthenticating
    error, message, out, lifetime_ms = auth.authenticate(bytes(req.auth_bytes or b""))
    labels = (conn.listener.name if conn.listener is not None else "", auth.mechanism or "")
    if error == ErrorCode.NONE:
        if auth.principal is not None and auth.authenticated:
            conn.principal = auth.principal
            (broker.metrics.reauthentications if again else broker.metrics.authentications).labels(*labels).inc()
            log.debug("%s %sauthenticated as %s with %s", conn.peer, "re-" if again else "", auth.principal,
                      auth.mechanism)
        return _answer(ctx, error, None, out, lifetime_ms)
    broker.metrics.failed_authentications.labels(*labels).inc()
    log.info("closing connection from %s: authentication with %s failed: %s", conn.peer, auth.mechanism, message)
    conn.close_after_pending(ctx.seq)
    if error == ErrorCode.SASL_AUTHENTICATION_FAILED:
        # as Kafka: the failure is answered late, so guessing passwords costs time
        await asyncio.sleep(broker.config["connection.failed.authentication.delay.ms"] / 1000)
    return _answer(ctx, error, message, b"", 0)


def _answer(ctx: RequestContext, error: int, message: str | None, out: bytes, lifetime_ms: int) -> bytes:
    data = {"error_code": error, "error_message": message, "auth_bytes": out, "session_lifetime_ms": lifetime_ms}
    return encode_response(ApiKey.SASL_AUTHENTICATE, ctx.api_version, data)
