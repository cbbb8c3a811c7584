"""One client connection: framing, ordered responses, backpressure.

Frames are read with `BufferedProtocol`: small frames are sliced out of one reusable
receive buffer; a frame larger than what is buffered gets its own bytearray and the
socket reads straight into it, so a produce batch is never copied on the way in and
can be patched in place by the log. Requests of a connection start in arrival order
(each handler runs synchronously up to its first await, so appends keep the client's
order), and responses leave in that same order, as Kafka clients require.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .wire import FileRegion, close_pieces

if TYPE_CHECKING:
    from ..config import BrokerConfig
    from ..security.sasl.authenticator import Authenticator
    from .context import RequestDispatcher
    from .security_layer import ListenerRuntime

log = logging.getLogger("oncelog.connection")

_SIZE = struct.Struct(">i")
_RECV_BUFFER = 256 * 1024
_SMALL_SEND = 64 * 1024
_TLS_CHUNK = 1024 * 1024  # bytes read at a time for a TLS connection's fetch answer
_CLOSE = object()  # a place in the response queue where the connection ends


class ConnectionHost(Protocol):
    """What a connection needs from the broker that accepted it (`server.Broker` is one)."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def dispatcher(self) -> RequestDispatcher: ...

    def register_connection(self, conn: Connection) -> bool: ...

    def admit_connection(self, conn: Connection) -> float | None: ...

    def unregister_connection(self, conn: Connection) -> None: ...


ANONYMOUS = "User:ANONYMOUS"


class Connection(asyncio.BufferedProtocol):
    def __init__(self, broker: ConnectionHost, listener: ListenerRuntime | None = None) -> None:
        self.broker = broker
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.client_host = "?"
        # Who is calling: the listener the client came in on, its principal (User:ANONYMOUS until TLS or SASL
        # says otherwise) and, on a SASL listener, the state machine every request passes before dispatch.
        self.listener = listener
        self.principal = ANONYMOUS
        self.authenticator: Authenticator | None = listener.new_authenticator() if listener is not None else None
        self._tls = listener is not None and listener.ssl_context is not None
        self._auth_timer: asyncio.TimerHandle | None = None
        self._buf = bytearray(_RECV_BUFFER)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._frame: bytearray | None = None
        self._frame_pos = 0
        self._pending: deque[asyncio.Future] = deque()
        self._writer: asyncio.Task | None = None
        self._wakeup = asyncio.Event()
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._reading_paused = False  # backpressure: queued.max.requests requests in progress
        # A quota throttle (KIP-219): reading waits until this timer fires, whatever backpressure says.
        self._mute_timer: asyncio.TimerHandle | None = None
        self._unmuted: asyncio.Future[None] | None = None  # done when the mute ends (or the connection does)
        self.closed = False
        # True when the listener's acceptor already admitted the connection (a TLS listener does, before the
        # handshake: tls_accept.py); otherwise it is admitted when the transport is made.
        self.admitted = False
        self.abort_handshake: Callable[[], None] | None = None
        # Set when the connection must end after the answers already owed are sent: later requests are
        # neither read nor processed.
        self.closing = False
        # Requests are numbered as they arrive; those after `close_at` are dropped unprocessed.
        self.received = 0
        self.close_at: int | None = None
        # Last fetch offset per partition, so records out can be counted when the next fetch moves past them.
        self.fetch_positions: dict[tuple[str, int], int] = {}
        # Set while a produce request waits (for a remote transaction coordinator) before appending: the
        # connection's later produce requests append after it (handlers/produce.py).
        self.produce_gate: asyncio.Future[None] | None = None
        # What the client said it is in ApiVersions v3+ (e.g. "apache-kafka-java", "librdkafka").
        self.client_software: str | None = None
        self.last_active = time.monotonic()
        self.max_frame = broker.config["socket.request.max.bytes"]
        self.max_queued = broker.config["queued.max.requests"]

    # -- asyncio protocol -------------------------------------------------------------------------
    def set_peer(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.client_host = str(peer[0]) if peer else "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.admitted:
            self.set_peer(transport)
            if not self.broker.register_connection(self):  # it logs why (max.connections, max.connections.per.ip)
                self.closed = True
                transport.close()
                return
        listener = self.listener
        if listener is not None and listener.principal_mapper is not None:
            from ..security.tls import tls_principal

            principal = tls_principal(transport.get_extra_info("ssl_object"), listener.principal_mapper)
            if principal is None:
                log.warning("closing connection from %s: no ssl.principal.mapping.rules rule maps its "
                            "certificate's name", self.peer)
                self.close()
                return
            self.principal = principal
        if self.authenticator is not None:
            timeout = self.broker.config["oncelog.authentication.timeout.ms"] / 1000
            self._auth_timer = asyncio.get_running_loop().call_later(timeout, self._authentication_timed_out)
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())

    def _authentication_timed_out(self) -> None:
        if self.authenticator is not None and not self.authenticator.authenticated and not self.closed:
            log.warning("closing connection from %s: SASL authentication not completed within "
                        "oncelog.authentication.timeout.ms", self.peer)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        if self._mute_timer is not None:
            self._mute_timer.cancel()
            self._unmute()
        self.broker.unregister_connection(self)
        self._wakeup.set()
        self._can_write.set()
        for fut in self._pending:
            if not fut.done():
                fut.cancel()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._frame_pos :]
        if self._end == len(self._buf):
            # Move the partial frame to the front so the socket has room to write.
            pending = self._end - self._start
            self._buf[:pending] = self._view[self._start : self._end]
            self._start, self._end = 0, pending
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        if self._frame is not None:
            self._frame_pos += nbytes
            if self._frame_pos == len(self._frame):
                frame, self._frame = self._frame, None
                self._deliver(frame)
            return
        self._end += nbytes
        self._split_frames()

    def eof_received(self) -> bool:
        return False

    # -- framing ----------------------------------------------------------------------------------
    def _split_frames(self) -> None:
        while not self.closed and self._end - self._start >= 4:
            (size,) = _SIZE.unpack_from(self._buf, self._start)
            limit, key = self.max_frame, "socket.request.max.bytes"
            auth = self.authenticator
            if auth is not None and not auth.authenticated and auth.max_receive < limit:
                # Before SASL authentication a frame is bounded by sasl.server.max.receive.size, as Kafka's
                # SaslServerAuthenticator bounds it: an anonymous client must not make the broker allocate
                # socket.request.max.bytes per connection.
                limit, key = auth.max_receive, "sasl.server.max.receive.size before authentication"
            if size <= 0 or size > limit:
                log.warning("closing connection from %s: request size %d outside 1..%d (%s)", self.peer, size,
                            limit, key)
                self.close()
                return
            available = self._end - self._start - 4
            body_start = self._start + 4
            if available >= size:
                frame = bytearray(self._view[body_start : body_start + size])
                self._start = body_start + size
                self._deliver(frame)
                continue
            if size > len(self._buf) - self._start - 4 or size > _RECV_BUFFER // 2:
                # Large frame: give it its own buffer and let the socket fill it directly.
                frame = bytearray(size)
                frame[:available] = self._view[body_start : self._end]
                self._frame, self._frame_pos = frame, available
                self._start = self._end = 0
            break
        if self._start == self._end:
            self._start = self._end = 0

    def _deliver(self, frame: bytearray) -> None:
        if self.closed or self.closing:
            return
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append(fut)
        self._wakeup.set()
        self.received += 1
        self.broker.dispatcher.dispatch(self, frame, fut, self.received)
        if len(self._pending) >= self.max_queued and not self._reading_paused and self.transport:
            self.transport.pause_reading()
            self._reading_paused = True

    # -- responses --------------------------------------------------------------------------------
    async def _write_loop(self) -> None:
        try:
            while not self.closed:
                if not self._pending:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                fut = self._pending[0]
                try:
                    pieces = await fut
                except asyncio.CancelledError:
                    return
                self._pending.popleft()
                # Resume at half the limit, and at the latest when nothing is pending (queued.max.requests=1).
                if self._reading_paused and len(self._pending) < max(1, self.max_queued // 2) and self.transport:
                    self._reading_paused = False
                    if self._mute_timer is None and not self.closing:
                        self.transport.resume_reading()
                if pieces is _CLOSE:
                    self.close()
                    return
                if pieces is None:
                    continue
                if self.closed:
                    close_pieces(pieces)
                    return
                await self._send(pieces)
                self.last_active = time.monotonic()
        except ConnectionError as exc:
            # The client went away while its answer was being sent (BrokenPipeError, ConnectionResetError,
            # asyncio's "Connection closed by peer"): a consumer closing mid-fetch is normal, not a broker fault.
            log.debug("client %s went away while a response was being sent (%s)", self.peer, exc.strerror or exc)
            self.close()
        except Exception:  # a writer failure must not leave the connection half alive
            log.exception("response writer for %s failed", self.peer)
            self.close()

    async def _send(self, pieces: list[Any]) -> None:
        transport = self.transport
        assert transport is not None
        try:
            total_files = sum(p.size for p in pieces if isinstance(p, FileRegion))
            if self._tls and total_files > _SMALL_SEND:
                # TLS encrypts in the loop anyway, so sendfile has nothing to save: asyncio's fallback would read
                # each 256 KiB through a thread. Read straight from the page cache and let the transport's
                # flow control pace us.
                for piece in pieces:
                    if self.closed or transport.is_closing():
                        return
                    if isinstance(piece, FileRegion):
                        position, end = piece.position, piece.position + piece.size
                        while position < end:
                            chunk = os.pread(piece.fd, min(_TLS_CHUNK, end - position), position)
                            if not chunk:  # the file ended early: the frame's size is a promise we cannot keep
                                self.close()
                                return
                            position += len(chunk)
                            transport.write(chunk)
                            if not self._can_write.is_set():
                                await self._can_write.wait()
                                if self.closed or transport.is_closing():
                                    return
                    else:
                        transport.write(piece)
            elif total_files <= _SMALL_SEND:
                out = []
                for piece in pieces:
                    if isinstance(piece, FileRegion):
                        out.append(os.pread(piece.fd, piece.size, piece.position) if piece.size else b"")
                    else:
                        out.append(piece)
                transport.writelines(out)
            else:
                loop = asyncio.get_running_loop()
                for piece in pieces:
                    if self.closed or transport.is_closing():
                        return
                    if isinstance(piece, FileRegion):
                        if piece.size:
                            await self._can_write.wait()
                            if self.closed or transport.is_closing():
                                # lost while waiting; connection_lost may not have run yet, and sendfile on
                                # a closing transport raises RuntimeError rather than a ConnectionError
                                return
                            with os.fdopen(os.dup(piece.fd), "rb", buffering=0) as fileobj:
                                await loop.sendfile(transport, fileobj, piece.position, piece.size)
                    else:
                        transport.write(piece)
            if not self._can_write.is_set():
                await self._can_write.wait()
        finally:
            close_pieces(pieces)

    def mute_for(self, seconds: float) -> None:
        """Read no further request for `seconds`: a quota's throttle time (KIP-219; the answer saying so still goes
        out, and requests already read wait in `until_unmuted`). A longer throttle extends the mute, a shorter one
        leaves it; when it ends, reading resumes unless backpressure or closing still hold it."""
        if self.closed or self.transport is None or seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        if self._mute_timer is not None:
            if until <= self._mute_timer.when():
                return
            self._mute_timer.cancel()
        else:
            self._unmuted = loop.create_future()
            if not self._reading_paused and not self.closing:
                self.transport.pause_reading()
        self._mute_timer = loop.call_at(until, self._unmute)

    @property
    def muted(self) -> bool:
        return self._unmuted is not None

    async def until_unmuted(self) -> None:
        """Return once the connection is not muted. A request read before the mute began waits here, so that
        behind a throttled request nothing of the connection is processed until the throttle ends, as behind
        Kafka's muted channel (which reads one request at a time); waiters resume in their order."""
        while self._unmuted is not None:
            await asyncio.shield(self._unmuted)

    def _unmute(self) -> None:
        self._mute_timer = None
        unmuted, self._unmuted = self._unmuted, None
        if unmuted is not None and not unmuted.done():
            unmuted.set_result(None)
        if not (self._reading_paused or self.closing or self.closed) and self.transport is not None:
            self.transport.resume_reading()

    def close_after_pending(self, seq: int | None = None) -> None:
        """End the connection after request `seq` (default: the last one read): requests before it are
        processed and answered in order, as Kafka does before it closes on a bad request; later ones are
        dropped unprocessed."""
        if self.closed:
            return
        seq = self.received if seq is None else seq
        self.close_at = seq if self.close_at is None else min(self.close_at, seq)
        if self.closing:
            return
        self.closing = True
        if self.transport is not None:
            self.transport.pause_reading()
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        fut.set_result(_CLOSE)
        self._pending.append(fut)
        self._wakeup.set()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
            elif self.abort_handshake is not None:  # admitted, its TLS handshake not done: the socket goes now
                self.abort_handshake()
