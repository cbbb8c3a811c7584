"""Request dispatch: header parsing, version gating, handler call, response framing.

What the protocol says about bad requests is applied here, once: an unknown API key
or an unsupported version of anything but ApiVersions closes the connection (as a
Kafka broker does); ApiVersions at an unknown version is answered in v0 with
UNSUPPORTED_VERSION and the supported ranges, so the client can pick a version.
A handler that raises never takes the broker down: the connection is closed and the
error logged.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from typing import TYPE_CHECKING, Any

from ..protocol.apis import SPECS, ApiKey, request_header_flexible, response_header_flexible
from ..protocol.fetch_codec import pieces_size
from ..protocol.header import decode_request_header, encode_response_header, peek_api
from ..protocol.primitives import ProtocolError
from ..security.api_acls import RULES
from ..security.quotas import quota_user
from .context import Handler, RequestContext
from .request_quota import EXEMPT_APIS, timed, with_throttle_time
from .wire import close_pieces

if TYPE_CHECKING:
    from .context import BrokerServices, ClientConnection

log = logging.getLogger("oncelog.dispatch")

_SIZE = struct.Struct(">i")
_SASL_KEYS = (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)


class Dispatcher:
    """`handlers` are served and advertised; `internal` ones (inter-broker requests such as ControlledShutdown)
    are served but never advertised: clients have no use for them."""

    def __init__(self, broker: BrokerServices, handlers: dict[int, Handler],
                 internal: dict[int, Handler] | None = None) -> None:
        self.broker = broker
        self.advertised = dict(handlers)
        # The broker's authorizer (None: ACLs off, every check passes at the cost of one test).
        security = getattr(broker, "security", None)
        self.authorizer = getattr(security, "authorizer", None)
        # request_percentage's quota manager (its `enabled` is tested per request)
        self.request_quota = getattr(getattr(security, "quota_manager", None), "request", None)
        self.handlers = {**handlers, **(internal or {})}

    def supported_versions(self, sasl: bool = False) -> list[tuple[int, int, int]]:
        """(api key, min, max) for every API with a real handler: what ApiVersions advertises. SaslHandshake and
        SaslAuthenticate only on a SASL listener (`sasl`), the only place they do anything."""
        return [(k, SPECS[k].min_version, SPECS[k].max_version) for k in sorted(self.advertised)
                if sasl or k not in _SASL_KEYS]

    def dispatch(self, conn: ClientConnection, frame: bytearray, fut: asyncio.Future, seq: int) -> None:
        try:
            api_key, api_version, correlation_id = peek_api(frame)
        except ProtocolError:
            log.warning("closing connection from %s: request shorter than its header", conn.peer)
            fut.set_result(None)
            conn.close_after_pending(seq)
            return
        spec = SPECS.get(api_key)
        if api_key not in self.handlers or spec is None:
            log.warning("closing connection from %s: unknown API key %d", conn.peer, api_key)
            fut.set_result(None)
            conn.close_after_pending(seq)
            return
        if not spec.min_version <= api_version <= spec.max_version:
            if api_key == ApiKey.API_VERSIONS:
                fut.set_result(self._frame(correlation_id, False,
                                           self._unsupported_api_versions(conn.authenticator is not None)))
                return
            log.warning(
                "closing connection from %s: %s v%d is not supported (%d-%d)",
                conn.peer, ApiKey(api_key).name, api_version, spec.min_version, spec.max_version,
            )
            fut.set_result(None)
            conn.close_after_pending(seq)
            return
        if self.authorizer is not None and api_key not in RULES:
            # fail closed: an API nobody wrote the checks of is not served while ACLs are on
            log.error("closing connection from %s: %s has no row in security/api_acls.RULES", conn.peer,
                      ApiKey(api_key).name)
            fut.set_result(None)
            conn.close_after_pending(seq)
            return
        auth = conn.authenticator
        if auth is not None and not auth.allows(api_key):
            log.warning("closing connection from %s: %s %s", conn.peer, ApiKey(api_key).name,
                        "after its SASL session expired (connections.max.reauth.ms)" if auth.authenticated
                        else "before SASL authentication completed")
            fut.set_result(None)
            conn.close_after_pending(seq)
            return
        asyncio.get_running_loop().create_task(self._run(conn, frame, fut, api_key, api_version, seq))

    async def _run(
        self, conn: ClientConnection, frame: bytearray, fut: asyncio.Future, api_key: int, api_version: int, seq: int
    ) -> None:
        if conn.closed or (conn.close_at is not None and seq > conn.close_at):
            # An earlier request on this connection ended it: this one is not processed at all.
            if not fut.done():
                fut.set_result(None)
            return
        started = time.perf_counter()
        metrics = self.broker.metrics
        name = ApiKey(api_key).name
        try:
            header, body_offset = decode_request_header(
                memoryview(frame), request_header_flexible(api_key, api_version)
            )
            ctx = RequestContext(api_key, api_version, header.correlation_id, header.client_id, conn, seq,
                                 self.authorizer)
            body = memoryview(frame)[body_offset:]
            quota = self.request_quota
            if quota is None or not quota.enabled or api_key in EXEMPT_APIS:
                result = await self.handlers[api_key](self.broker, ctx, body)
            else:
                result = await self._metered(quota, ctx, body, started)
        except ProtocolError as exc:
            log.warning("closing connection from %s: malformed %s v%d: %s", conn.peer, name, api_version, exc)
            metrics.request_errors.labels(name).inc()
            if not fut.done():
                fut.set_result(None)
            conn.close_after_pending(seq)
            return
        except Exception:
            log.exception("handler for %s v%d failed; closing connection from %s", name, api_version, conn.peer)
            metrics.request_errors.labels(name).inc()
            if not fut.done():
                fut.set_result(None)
            conn.close_after_pending(seq)
            return
        metrics.requests.labels(name).inc()
        metrics.request_latency.labels(name).observe(time.perf_counter() - started)
        if fut.done():  # connection went away meanwhile
            if isinstance(result, list):
                close_pieces(result)
            return
        if result is None:
            fut.set_result(None)
            return
        fut.set_result(self._frame(ctx.correlation_id, response_header_flexible(api_key, api_version), result))

    async def _metered(self, quota: Any, ctx: RequestContext, body: memoryview, started: float) -> Any:
        """Run a request under request_percentage (broker/request_quota.py): behind a throttle of its connection
        it waits, as behind Kafka's muted channel; its time on the loop is recorded, and over the quota its answer
        says so and its connection is muted (a forwarded request is recorded, not throttled)."""
        conn: Any = ctx.connection
        if getattr(conn, "muted", False) and hasattr(conn, "until_unmuted"):
            await conn.until_unmuted()
            if conn.closed or (conn.close_at is not None and ctx.seq > conn.close_at):
                return None
            started = time.perf_counter()
        decoded = time.perf_counter() - started  # the header, decoded before the handler ran
        result, held = await timed(self.handlers[ctx.api_key](self.broker, ctx, body))
        if ctx.quota_exempt:
            return result
        now_ms = time.monotonic() * 1000
        throttle_ms, tags = quota.record(quota_user(ctx.principal), ctx.client_id or "", (held + decoded) * 100,
                                         now_ms)
        if throttle_ms <= 0:
            return result
        self.broker.metrics.throttle_time.labels(quota.quota_type, *tags).observe(throttle_ms)
        mute = getattr(conn, "mute_for", None)
        if mute is not None and not ctx.from_broker:
            mute(throttle_ms / 1000)
        if result is None:
            return None
        return with_throttle_time(ctx.api_key, ctx.api_version, result, throttle_ms)

    @staticmethod
    def _frame(correlation_id: int, flexible: bool, body: bytes | list[Any]) -> list[Any]:
        header = encode_response_header(correlation_id, flexible)
        if isinstance(body, (bytes, bytearray, memoryview)):
            return [_SIZE.pack(len(header) + len(body)) + header + bytes(body)]
        size = len(header) + pieces_size(body)
        return [_SIZE.pack(size) + header, *body]

    def _unsupported_api_versions(self, sasl: bool) -> bytes:
        # v0 body: error code, then [api_key, min, max] as a plain int32-length array.
        versions = self.supported_versions(sasl)
        out = [struct.pack(">hi", 35, len(versions))]
        out.extend(struct.pack(">hhh", k, lo, hi) for k, lo, hi in versions)
        return b"".join(out)
