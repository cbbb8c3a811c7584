"""A TCP proxy between clients and the broker that misbehaves on command (loopback only).

The broker advertises the proxy's address (`advertised.listeners`), so every connection to it, bootstrap and
leader alike, goes through it. In a cluster each broker has its own proxy and registers the proxy's address, so
the other brokers' replica fetches and forwarded requests reach it through the proxy as well; the proxy tells
those apart from clients by the client id of a connection's first request (`oncelog-replica-<node>`,
`oncelog-forwarded-by-<node>`: a connection *from* broker <node>), so faults can strike the links between
brokers while clients keep their connections, or the reverse.

Client connections follow `mode`:
- pass:           forward both ways;
- delay:          hold every chunk for `delay_s` before forwarding it;
- blackhole:      forward nothing either way (requests stall, clients hit their timeouts);
- lose_responses: forward requests, but when the broker answers, drop the answer and cut the connection, so
                  the broker acted and the client never learns it did (the case idempotence exists for);
and `cut()` resets every open connection at once. Connections from another broker follow the mode set for that
broker with `set_link(node, mode)`: pass, delay, blackhole, or `refuse` (open ones are reset and new ones
closed at once: a network partition between the two brokers); `clear_links()` heals them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import struct
import threading
from collections.abc import Iterable

# The client ids oncelog brokers use for connections to other brokers (cluster/replica_fetcher.py: fetches and
# FetchSnapshot with a `-snapshots` suffix; inter_broker.py: forwarded admin requests, controlled shutdown).
_INTER_BROKER = re.compile(rb"^oncelog-(?:replica|forwarded-by)-(\d+)(?:-[\w.-]*)?$")
_HEADER = struct.Struct(">ihhih")  # size, api key, api version, correlation id, client id length
CLIENT_MODES = ("pass", "delay", "blackhole", "lose_responses")
LINK_MODES = ("pass", "delay", "blackhole", "refuse")


class FaultProxy:
    def __init__(self, upstream_port: int, listen_port: int = 0) -> None:
        self.upstream_port = upstream_port
        self.mode = "pass"
        self.delay_s = 0.0
        self.port = listen_port
        self.links: dict[int, tuple[str, float]] = {}  # node id of a peer broker -> (mode, delay_s)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._writers: dict[asyncio.StreamWriter, int | None] = {}  # open sockets -> the peer broker, None: client
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self.connections = 0
        self.cuts = 0
        self.peers_seen: set[int] = set()

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            self._reset(lambda peer: True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- faults ---------------------------------------------------------------------------------------------
    def set_mode(self, mode: str, delay_s: float = 0.0) -> None:
        """The mode of client connections (not of connections from other brokers)."""
        if mode not in CLIENT_MODES:
            raise ValueError(mode)
        self.mode, self.delay_s = mode, delay_s

    def cut(self) -> None:
        """Reset every open connection (clients see ECONNRESET mid-request)."""
        self._loop.call_soon_threadsafe(self._reset, lambda peer: True)

    def set_link(self, peers: Iterable[int], mode: str, delay_s: float = 0.0) -> None:
        """Connections from the brokers `peers` follow `mode` from now on; `refuse` also resets the open ones."""
        if mode not in LINK_MODES:
            raise ValueError(mode)
        chosen = set(peers)
        for peer in chosen:
            if mode == "pass":
                self.links.pop(peer, None)
            else:
                self.links[peer] = (mode, delay_s)
        if mode == "refuse":
            self._loop.call_soon_threadsafe(self._reset, lambda peer: peer in chosen)

    def clear_links(self) -> None:
        """Every link to another broker back to pass; connections stalled by a blackhole are reset (their
        requests would otherwise wait for the fetcher's socket timeout)."""
        stalled = {peer for peer, (mode, _) in self.links.items() if mode == "blackhole"}
        self.links.clear()
        if stalled:
            self._loop.call_soon_threadsafe(self._reset, lambda peer: peer in stalled)

    # -- internals ------------------------------------------------------------------------------------------
    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    def _reset(self, which) -> None:  # noqa: ANN001 - a predicate on the peer (None: a client)
        self.cuts += 1
        for writer, peer in list(self._writers.items()):
            if not which(peer):
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            writer.transport.abort()
            self._writers.pop(writer, None)

    def _link_mode(self, peer: int | None) -> tuple[str, float]:
        if peer is None:
            return self.mode, self.delay_s
        return self.links.get(peer, ("pass", 0.0))

    @staticmethod
    async def _first_request(reader: asyncio.StreamReader) -> tuple[bytes, int | None]:
        """The bytes of the first request's header up to its client id, and the peer broker it names."""
        head = await reader.readexactly(_HEADER.size)
        length = _HEADER.unpack(head)[4]
        client_id = await reader.readexactly(length) if length > 0 else b""
        match = _INTER_BROKER.match(client_id)
        return head + client_id, int(match.group(1)) if match else None

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers[client_w] = None  # a cut before the first request resets it too
        try:
            first, peer = await self._first_request(client_r)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            self._writers.pop(client_w, None)
            client_w.transport.abort()
            return
        if client_w not in self._writers or client_w.transport.is_closing():
            return  # reset while its first request was on the way
        if peer is not None:
            self.peers_seen.add(peer)
        if self._link_mode(peer)[0] == "refuse":
            self._writers.pop(client_w, None)
            client_w.transport.abort()
            return
        try:
            broker_r, broker_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            self._writers.pop(client_w, None)
            client_w.transport.abort()
            return
        self._writers.update({client_w: peer, broker_w: peer})
        pair = (client_w, broker_w)
        broker_w.write(first)
        await asyncio.gather(self._pump(client_r, broker_w, pair, peer, upstream=True),
                             self._pump(broker_r, client_w, pair, peer, upstream=False), return_exceptions=True)
        for w in pair:
            self._writers.pop(w, None)
            w.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter], peer: int | None,
                    upstream: bool) -> None:
        """Forward one direction; however it ends (EOF, a reset, a fault), both sockets go, so the other side
        never waits on a half-dead pair (a broker SIGKILLed with a request unread resets its socket: the client
        must see its connection close, not wait for its own socket timeout)."""
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                mode, delay_s = self._link_mode(peer)
                if mode in ("blackhole", "refuse"):
                    continue
                if mode == "delay" and delay_s > 0:
                    await asyncio.sleep(delay_s)
                if mode == "lose_responses" and not upstream:
                    break  # the broker has answered: nobody will ever read that answer
                if writer.transport.is_closing():
                    break
                writer.write(data)
                await writer.drain()
        finally:
            for w in pair:
                w.transport.abort()
