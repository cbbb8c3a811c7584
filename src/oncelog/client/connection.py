"""One TCP connection to one broker: framing, correlation ids, pipelining, ApiVersions, timeouts.

Kafka answers the requests of a connection in the order it received them, so the
in-flight requests are a FIFO: a response must carry the correlation id at the head,
and anything else means the stream is broken. A request is written synchronously in
the call that enqueues it (no await between numbering and writing), so the loop
thread is the one writer and wire order always equals queue order.

Any failure (a broken socket, a garbled frame, one request timing out) closes the
connection and fails *every* in-flight request with `NetworkError`: once one answer
is missing, the ones behind it cannot be trusted to line up, and the caller must
treat each of them as "the broker may or may not have acted" — the case the
idempotent producer exists for.

Frames are read with a `BufferedProtocol`: small frames are cut out of one receive
buffer; a large frame (a fetch response) gets its own bytearray that the socket fills
directly, and the caller gets a memoryview of it, so records are not copied.

A secured connection (client/security.py) wraps the socket in TLS and, after ApiVersions,
runs the SASL exchange (client/sasl.py). When the broker grants a session of limited
lifetime (KIP-368), the connection re-authenticates before it ends; while it does, new
requests wait, because the broker reads the next frames as the SASL exchange's.
A refusal is an `AuthenticationError`, never a retriable network error.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import ssl
import struct
from collections import deque
from collections.abc import Sequence
from typing import Any

from oncelog.protocol import client_codecs as codecs
from oncelog.protocol.apis import ApiKey
from oncelog.protocol.messages import REQUESTS
from oncelog.protocol.primitives import ProtocolError

from . import sasl
from .errors import (
    AuthenticationError,
    KafkaError,
    NetworkError,
    RequestTimedOut,
    SslAuthenticationError,
    UnsupportedVersion,
    error_for,
)
from .security import Security

__all__ = ["BrokerConnection", "CLIENT_SOFTWARE_NAME", "CLIENT_SOFTWARE_VERSION"]

log = logging.getLogger("oncelog.client.connection")

CLIENT_SOFTWARE_NAME = "oncelog-python"


def _software_version() -> str:
    """Our version in the form KIP-511 requires ([a-zA-Z0-9] at both ends, [-.a-zA-Z0-9] between):
    a broker answers INVALID_REQUEST to anything else, e.g. a local version "1.0+dev"."""
    try:
        from importlib.metadata import version

        text = version("oncelog")
    except Exception:  # running from a source tree without installed metadata
        return "0"
    text = re.sub(r"[^a-zA-Z0-9.-]", "-", text).strip("-.")
    return text or "0"


CLIENT_SOFTWARE_VERSION = _software_version()

_SIZE = struct.Struct(">i")
_CORRELATION = struct.Struct(">i")
_RECV_BUFFER = 256 * 1024
_JOIN_LIMIT = 256 * 1024  # below this a request goes out as one joined write
_MAX_FRAME = 1 << 30  # a response larger than 1 GiB is garbage, not a fetch
# The first answer on a connection is ApiVersions, a few hundred bytes. A "size" this large whose bytes
# read as a TLS record header (content type 21 alert or 22 handshake, version 3.x) is a TLS listener
# answering a plaintext client.
_FIRST_FRAME_SANE = 1 << 20
_API_VERSIONS_VERSION = 3


class _InFlight:
    __slots__ = ("correlation_id", "api_key", "version", "future", "timer")

    def __init__(self, correlation_id: int, api_key: int, version: int, future: asyncio.Future) -> None:
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.version = version
        self.future = future
        self.timer: asyncio.TimerHandle | None = None


class _Protocol(asyncio.BufferedProtocol):
    """Bytes in, frames out; everything else is the connection's business."""

    def __init__(self, conn: BrokerConnection) -> None:
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray(_RECV_BUFFER)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._frame: bytearray | None = None
        self._frame_pos = 0
        self._first = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(exc, ssl.SSLError) and self.conn._tls_failure is None:
            self.conn._tls_failure = exc
        self.conn._fail(NetworkError(f"connection to {self.conn.address} lost" + (f": {exc}" if exc else "")))

    def pause_writing(self) -> None:
        self.conn._can_write.clear()

    def resume_writing(self) -> None:
        self.conn._can_write.set()

    def eof_received(self) -> bool:
        return False  # close the transport: the broker hung up

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._frame_pos:]
        if self._end == len(self._buf):
            pending = self._end - self._start
            self._buf[:pending] = self._view[self._start:self._end]
            self._start, self._end = 0, pending
        return self._view[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._frame_pos += nbytes
            if self._frame_pos == len(self._frame):
                frame, self._frame = self._frame, None
                self.conn._on_frame(memoryview(frame))
            return
        self._end += nbytes
        buf = self._buf
        view = self._view
        while self._end - self._start >= 4 and not self.conn._closed:
            (size,) = _SIZE.unpack_from(buf, self._start)
            if self._first:
                self._first = False
                if size > _FIRST_FRAME_SANE and buf[self._start] in (21, 22) and buf[self._start + 1] == 3:
                    self.conn._tls_mismatch = True
                    self.conn._fail(NetworkError(f"{self.conn.address} answered with TLS to a plaintext client"))
                    return
            if not 4 <= size <= _MAX_FRAME:
                self.conn._fail(NetworkError(f"response of {size} bytes from {self.conn.address}: stream broken"))
                return
            body = self._start + 4
            available = self._end - body
            if available >= size:
                self._start = body + size
                self.conn._on_frame(memoryview(bytes(view[body:body + size])))
                continue
            if size > len(buf) // 2 or size > len(buf) - body:
                frame = bytearray(size)
                frame[:available] = view[body:self._end]
                self._frame, self._frame_pos = frame, available
                self._start = self._end = 0
            break
        if self._start == self._end:
            self._start = self._end = 0


class BrokerConnection:
    """One connection to one broker; create it, `await connect()`, then `request`/`call` from the loop."""

    def __init__(
        self,
        host: str,
        port: int,
        node_id: int = -1,
        *,
        client_id: str | None = "oncelog-python",
        request_timeout_ms: int = 30000,
        connect_timeout_ms: int = 10000,
        security: Security | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.node_id = node_id
        self.client_id = client_id
        self.request_timeout = request_timeout_ms / 1000
        self.connect_timeout = connect_timeout_ms / 1000
        #: api key -> (min version, max version), as the broker advertised in ApiVersions
        self.api_versions: dict[int, tuple[int, int]] = {}
        self._protocol: _Protocol | None = None
        self._in_flight: deque[_InFlight] = deque()
        self._next_correlation = 0
        self._closed = True
        self._close_reason: NetworkError | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.security = security
        #: session lifetime the broker granted at the last SASL exchange, ms (0: unlimited or no SASL)
        self.session_lifetime_ms = 0
        #: completed SASL exchanges on this connection (1 after connect, +1 per re-authentication)
        self.authentications = 0
        self._auth_gate: asyncio.Event | None = None  # set while re-authenticating; requests wait for it
        self._reauth_timer: asyncio.TimerHandle | None = None
        self._reauth_task: asyncio.Task | None = None
        self._tls_failure: ssl.SSLError | None = None
        self._tls_mismatch = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._in_flight)} in flight"
        return f"<BrokerConnection node {self.node_id} {self.address} {state}>"

    # -- connect ----------------------------------------------------------------------------------

    async def connect(self) -> None:
        """TCP connect (and TLS), ApiVersions (and SASL), within socket.connection.setup.timeout.ms.

        NetworkError when the broker cannot be reached; AuthenticationError when it can, but TLS or SASL
        refuses: that one is not worth retrying.
        """
        loop = asyncio.get_running_loop()
        context = self.security.ssl_context if self.security is not None else None
        tls: dict = {} if context is None else {
            "ssl": context, "server_hostname": self.host, "ssl_handshake_timeout": self.connect_timeout}
        self._tls_failure = None
        self._tls_mismatch = False
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _Protocol(self), self.host, self.port, **tls), self.connect_timeout)
        except ssl.SSLError as exc:
            raise self._tls_error(exc) from None
        except OSError as exc:  # TimeoutError included
            reason = "timed out" if isinstance(exc, TimeoutError) else str(exc)
            if context is not None and isinstance(exc, (ConnectionResetError, TimeoutError)):
                reason += " during the TLS handshake (is this a TLS listener?)"
            raise NetworkError(f"cannot connect to {self.address}: {reason}") from None
        self._protocol = protocol
        self._closed = False
        self._close_reason = None
        try:
            await self._negotiate_versions()
            if self.security is not None and self.security.sasl is not None:
                await self._authenticate(self.connect_timeout)
        except BaseException as exc:
            self._fail(NetworkError(f"connecting to {self.address} failed"))
            if self._tls_mismatch:
                raise SslAuthenticationError(
                    f"{self.address} answers with TLS but this client speaks plaintext: set security.protocol "
                    "to SSL or SASL_SSL") from None
            if self._tls_failure is not None and isinstance(exc, NetworkError):
                raise self._tls_error(self._tls_failure) from None
            raise

    def _tls_error(self, exc: ssl.SSLError) -> SslAuthenticationError:
        """A TLS failure in words: whose certificate, and which setting to look at."""
        if isinstance(exc, ssl.SSLCertVerificationError):
            what = exc.verify_message or exc.reason or str(exc)
            hint = "check ssl.ca.location"
            if "hostname" in str(what).lower() or "match" in str(what).lower():
                hint = ("the certificate does not name this host; check the address or "
                        "ssl.endpoint.identification.algorithm")
            return SslAuthenticationError(
                f"TLS handshake with {self.address} failed: the broker's certificate is not trusted: {what} "
                f"({hint})")
        reason = str(exc.reason or exc)
        upper = reason.upper()
        if "CERTIFICATE_REQUIRED" in upper or "UNKNOWN_CA" in upper or "BAD_CERTIFICATE" in upper:
            return SslAuthenticationError(
                f"TLS handshake with {self.address} failed: the broker refused this client's certificate "
                f"({reason}); check ssl.certificate.location and ssl.key.location")
        if "WRONG_VERSION_NUMBER" in upper or "RECORD_LAYER" in upper:
            return SslAuthenticationError(
                f"TLS handshake with {self.address} failed ({reason}): the listener does not speak TLS; "
                "check security.protocol and the port")
        return SslAuthenticationError(f"TLS with {self.address} failed: {reason}")

    async def _authenticate(self, timeout: float) -> None:
        """One SASL exchange on this connection; arms re-authentication if the session is limited."""
        assert self.security is not None and self.security.sasl is not None

        async def send(api_key: int, version: int, body: bytes) -> memoryview:
            frame = await self.request(api_key, version, body, timeout=timeout, _auth=True)
            assert frame is not None
            return frame

        lifetime = await sasl.authenticate(self.security.sasl, self.api_versions, self.address, send)
        self.session_lifetime_ms = lifetime
        self.authentications += 1
        if lifetime > 0 and not self._closed:
            delay = sasl.reauthentication_delay(lifetime, random.random())
            self._reauth_timer = asyncio.get_running_loop().call_later(delay, self._start_reauthentication)

    def _start_reauthentication(self) -> None:
        self._reauth_timer = None
        if not self._closed:
            self._reauth_task = asyncio.get_running_loop().create_task(self._reauthenticate())

    async def _reauthenticate(self) -> None:
        """KIP-368: the same exchange again, on this connection, with requests held back until it ends.

        Requests already in flight are answered first (the broker handles a connection's requests in
        order); new ones wait at the gate, since the broker reads the frames after SaslHandshake as the
        exchange's. A refusal closes the connection; the next connect reports the cause.
        """
        gate = self._auth_gate = asyncio.Event()
        try:
            await self._authenticate(self.request_timeout)
        except AuthenticationError as exc:
            log.warning("re-authentication with %s failed: %s", self.address, exc)
            self._fail(NetworkError(f"re-authentication with {self.address} failed: {exc.message}"))
        except KafkaError as exc:
            self._fail(NetworkError(f"re-authentication with {self.address} failed: {exc}"))
        except Exception as exc:  # a bug must not leave the gate shut
            log.exception("re-authentication with %s failed", self.address)
            self._fail(NetworkError(f"re-authentication with {self.address} failed: {exc!r}"))
        finally:
            self._auth_gate = None
            gate.set()

    async def _negotiate_versions(self) -> None:
        version = _API_VERSIONS_VERSION
        data = {"client_software_name": CLIENT_SOFTWARE_NAME, "client_software_version": CLIENT_SOFTWARE_VERSION}
        for _ in range(2):
            body = codecs.encode_request(ApiKey.API_VERSIONS, version, data)
            frame = await self.request(ApiKey.API_VERSIONS, version, body, timeout=self.connect_timeout)
            response = codecs.decode_response(ApiKey.API_VERSIONS, version, frame)
            self.api_versions = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
            if response.error_code == 0:
                return
            # UNSUPPORTED_VERSION comes with the broker's own ApiVersions range (in v0 layout): retry
            # once at its highest version, as Kafka's clients do.
            ours = self.api_versions.get(ApiKey.API_VERSIONS)
            if response.error_code != 35 or ours is None or ours[1] >= version:
                break
            version = ours[1]
        raise error_for(response.error_code) or UnsupportedVersion("ApiVersions failed")

    def api_version(self, api_key: int, ours_max: int, ours_min: int = 0) -> int:
        """The highest version of `api_key` both sides speak; `UnsupportedVersion` if there is none."""
        theirs = self.api_versions.get(api_key)
        if theirs is None:
            raise UnsupportedVersion(f"broker {self.address} does not support API key {api_key}")
        low, high = max(ours_min, theirs[0]), min(ours_max, theirs[1])
        if low > high:
            raise UnsupportedVersion(
                f"API key {api_key}: broker {self.address} speaks {theirs[0]}..{theirs[1]}, "
                f"this client {ours_min}..{ours_max}")
        return high

    # -- requests ---------------------------------------------------------------------------------

    async def request(
        self,
        api_key: int,
        version: int,
        body: bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview],
        *,
        timeout: float | None = None,
        expect_response: bool = True,
        client_id: str | None = None,
        _auth: bool = False,
    ) -> memoryview | None:
        """Send one request; the response body (header stripped) as a memoryview, or None without response.

        `body` is bytes or a list of pieces (as `encode_produce_request` returns). `timeout` is in
        seconds (default request.timeout.ms); when it passes, the connection is closed and every
        request in flight fails. Cancelling the awaiting task does not unsend the request. `client_id`
        replaces the connection's in this request's header (a broker forwarding an admin request names the
        client it forwards for there: security/forwarding.py).
        """
        if self._auth_gate is not None and not _auth:
            await self._auth_gate.wait()  # re-authentication in progress
        transport = None if self._protocol is None else self._protocol.transport
        if self._closed or transport is None or transport.is_closing():
            raise self._close_reason or NetworkError(f"connection to {self.address} is closed")
        correlation_id = self._next_correlation
        self._next_correlation = (correlation_id + 1) & 0x7FFFFFFF
        header = codecs.encode_request_header(api_key, version, correlation_id, client_id or self.client_id)
        pieces = [body] if isinstance(body, (bytes, bytearray, memoryview)) else list(body)
        size = len(header) + sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in pieces)
        loop = asyncio.get_running_loop()
        future: asyncio.Future | None = None
        if expect_response:
            future = loop.create_future()
            entry = _InFlight(correlation_id, api_key, version, future)
            entry.timer = loop.call_later(self.request_timeout if timeout is None else timeout,
                                          self._on_timeout, entry)
            self._in_flight.append(entry)
        if size <= _JOIN_LIMIT:
            transport.write(b"".join([_SIZE.pack(size), header, *pieces]))
        else:
            transport.write(_SIZE.pack(size) + header)
            for piece in pieces:
                transport.write(piece)
        if not self._can_write.is_set():
            await self._can_write.wait()  # back-pressure: the socket buffer is full
        if future is None:
            if self._closed:
                raise self._close_reason or NetworkError(f"connection to {self.address} is closed")
            return None
        return await future

    async def call(self, api_key: int, data: dict[str, Any], *, version: int | None = None,
                   timeout: float | None = None) -> Any:
        """A long-tail request from a dict of schema fields; the decoded kafka-python response object.

        Without `version`, the highest both sides speak (kafka-python's schema range on our side).
        """
        if version is None:
            cls = REQUESTS[api_key]
            version = self.api_version(api_key, cls.max_version, cls.min_version)
        body = codecs.encode_request(api_key, version, data)
        frame = await self.request(api_key, version, body, timeout=timeout)
        assert frame is not None
        try:
            return codecs.decode_response(api_key, version, frame)
        except ProtocolError as exc:
            # We and the broker disagree on the layout: nothing else it sends on this stream is trustworthy.
            error = NetworkError(f"undecodable response from {self.address} to API {api_key} v{version}: {exc}")
            self._fail(error)
            raise error from None

    # -- responses --------------------------------------------------------------------------------

    def _on_frame(self, frame: memoryview) -> None:
        if not self._in_flight:
            self._fail(NetworkError(f"unsolicited response from {self.address}"))
            return
        entry = self._in_flight[0]
        (correlation_id,) = _CORRELATION.unpack_from(frame, 0)
        if correlation_id != entry.correlation_id:
            self._fail(NetworkError(
                f"response from {self.address} has correlation id {correlation_id}, "
                f"expected {entry.correlation_id}: stream broken"))
            return
        self._in_flight.popleft()
        if entry.timer is not None:
            entry.timer.cancel()
        try:
            offset = codecs.response_body_offset(entry.api_key, entry.version, frame)
        except ProtocolError as exc:
            self._fail(NetworkError(f"bad response header from {self.address}: {exc}"))
            return
        if not entry.future.done():
            entry.future.set_result(frame[offset:])

    def _on_timeout(self, entry: _InFlight) -> None:
        entry.timer = None
        if entry.future.done() or self._closed:
            return
        seconds = self.request_timeout
        timed_out = RequestTimedOut(
            f"no response from {self.address} to API {entry.api_key} v{entry.version} "
            f"(correlation id {entry.correlation_id}) within the request timeout; connection closed")
        entry.future.set_exception(timed_out)
        entry.future.exception()  # retrieved: a caller that gave up must not cause "never retrieved" noise
        log.warning("request to %s timed out (%.1fs): closing the connection", self.address, seconds)
        self._fail(NetworkError(f"connection to {self.address} closed after a request timed out"))

    def _fail(self, error: NetworkError) -> None:
        """Close and fail everything in flight; idempotent."""
        if self._close_reason is None:
            self._close_reason = error
        self._closed = True
        self._can_write.set()
        if self._reauth_timer is not None:
            self._reauth_timer.cancel()
            self._reauth_timer = None
        protocol = self._protocol
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()
        while self._in_flight:
            entry = self._in_flight.popleft()
            if entry.timer is not None:
                entry.timer.cancel()
            if not entry.future.done():
                entry.future.set_exception(NetworkError(error.message))
                entry.future.exception()

    async def close(self) -> None:
        """Close the connection; requests still in flight fail with NetworkError."""
        self._fail(NetworkError(f"connection to {self.address} closed by the client"))
        await asyncio.sleep(0)  # let the transport run its close callbacks
