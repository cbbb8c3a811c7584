"""A TLS listener's accept: admission first, then the handshake, and a refused handshake's alert sent.

asyncio's own TLS server (`create_server(ssl=...)`) hands the connection to the protocol only once the handshake
is done, so `max.connections`, `max.connections.per.ip` and `max.connection.creation.rate` could only count a TLS
connection after it: half-open handshakes were unlimited until the authentication timeout. Kafka's acceptor counts
a connection when it accepts it. Here the listener is a plain TCP server whose protocol admits the connection at
accept (refusing it before a byte of TLS), waits out a creation-rate throttle, and only then puts the TLS layer
between the socket and the `Connection`, with the handshake bounded as before.

The TLS layer is asyncio's own SSL protocol with one change: when OpenSSL refuses the peer during the handshake (no
client certificate where `ssl.client.auth=required`, an untrusted one, no common protocol version), the alert
OpenSSL wrote is sent before the socket closes. asyncio drops it, and a Java client that gets no alert sees an EOF
and retries until its timeouts instead of failing at once with SslAuthenticationException, as it does with Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from asyncio import sslproto
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("oncelog.connection")


class _AlertingSSLProtocol(sslproto.SSLProtocol):
    """asyncio's server-side TLS protocol, sending the alert of a failed handshake and reporting the failure."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: Connection, context: ssl.SSLContext,
                 handshake_timeout: float, on_failed: Any) -> None:
        super().__init__(loop, conn, context, None, server_side=True, ssl_handshake_timeout=handshake_timeout)
        self._on_failed = on_failed

    def _do_handshake(self) -> None:
        try:
            self._sslobj.do_handshake()
        except sslproto.SSLAgainErrors:
            self._process_outgoing()
        except ssl.SSLError as exc:
            self._process_outgoing()  # the alert, written to the socket before the close that follows
            self._report(exc)
            self._on_handshake_complete(exc)
        else:
            self._on_handshake_complete(None)

    def _check_handshake_timeout(self) -> None:
        if self._app_state == sslproto.AppProtocolState.STATE_INIT:
            self._report(TimeoutError("TLS handshake not completed within oncelog.authentication.timeout.ms"))
        super()._check_handshake_timeout()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._app_state == sslproto.AppProtocolState.STATE_INIT:
            # never handed to the connection (the peer left mid-handshake, or the handshake failed after OpenSSL
            # was done with it): it is released here
            self._report(exc or ConnectionError("closed during the TLS handshake"))
        super().connection_lost(exc)

    def _report(self, exc: BaseException) -> None:
        callback, self._on_failed = self._on_failed, None
        if callback is not None:
            callback(exc)


class TlsAcceptor(asyncio.Protocol):
    """The protocol of a TLS listener's accepted socket until its connection is admitted and handed to TLS."""

    def __init__(self, conn: Connection, context: ssl.SSLContext, handshake_timeout: float) -> None:
        self.conn = conn
        self.context = context
        self.handshake_timeout = handshake_timeout
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        conn = self.conn
        conn.set_peer(transport)
        delay = conn.broker.admit_connection(conn)  # logs why it refuses
        if delay is None:
            conn.closed = True
            transport.close()
            return
        conn.admitted = True
        conn.abort_handshake = transport.abort  # type: ignore[attr-defined]
        if delay > 0:  # max.connection.creation.rate: the handshake starts after the throttle
            transport.pause_reading()  # type: ignore[attr-defined]
            self._timer = asyncio.get_running_loop().call_later(delay, self._start_tls)
        else:
            self._start_tls()

    def _start_tls(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        loop = asyncio.get_running_loop()
        layer = _AlertingSSLProtocol(loop, self.conn, self.context, self.handshake_timeout, self._handshake_failed)
        transport.set_protocol(layer)
        layer.connection_made(transport)
        transport.resume_reading()  # type: ignore[attr-defined]

    def _handshake_failed(self, exc: BaseException) -> None:
        """As Kafka's selector: a handshake OpenSSL refused is a failed authentication (INFO, and counted); a peer
        that left or a handshake that timed out is a disconnection."""
        conn = self.conn
        listener = conn.listener.name if conn.listener is not None else ""
        if isinstance(exc, ssl.SSLError):
            conn.broker.metrics.failed_authentications.labels(listener, "").inc()
            log.info("Failed authentication with %s (listener %s): SSL handshake failed (%s)", conn.peer, listener,
                     exc.reason or exc)
        elif isinstance(exc, TimeoutError):
            log.info("closing connection from %s (listener %s): %s", conn.peer, listener, exc)
        else:
            log.debug("connection from %s (listener %s) closed during the TLS handshake", conn.peer, listener)
        conn.closed = True
        conn.broker.unregister_connection(conn)

    def data_received(self, data: bytes) -> None:  # only while throttled, reading is paused; nothing to keep
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        # gone while throttled, before TLS started (afterwards the TLS layer is the transport's protocol)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport = None
        self.conn.closed = True
        self.conn.broker.unregister_connection(self.conn)
