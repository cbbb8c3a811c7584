"""A TCP proxy between clients and the broker that misbehaves on command (loopback only).

The broker advertises the proxy's address (`advertised.listeners`), so every client connection, bootstrap and
leader alike, goes through it. Modes:
- pass:           forward both ways;
- delay:          hold every chunk for `delay_s` before forwarding it;
- blackhole:      forward nothing either way (requests stall, clients hit their timeouts);
- lose_responses: forward requests, but when the broker answers, drop the answer and cut the connection, so
                  the broker acted and the client never learns it did (the case idempotence exists for);
and `cut()` resets every open connection at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading


class FaultProxy:
    def __init__(self, upstream_port: int, listen_port: int = 0) -> None:
        self.upstream_port = upstream_port
        self.mode = "pass"
        self.delay_s = 0.0
        self.port = listen_port
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self.connections = 0
        self.cuts = 0

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            self._reset_all()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- faults ---------------------------------------------------------------------------------------------
    def set_mode(self, mode: str, delay_s: float = 0.0) -> None:
        if mode not in ("pass", "delay", "blackhole", "lose_responses"):
            raise ValueError(mode)
        self.mode, self.delay_s = mode, delay_s

    def cut(self) -> None:
        """Reset every open connection (clients see ECONNRESET mid-request)."""
        self._loop.call_soon_threadsafe(self._reset_all)

    # -- internals ------------------------------------------------------------------------------------------
    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    def _reset_all(self) -> None:
        self.cuts += 1
        for writer in list(self._writers):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            broker_r, broker_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.transport.abort()
            return
        self._writers.update((client_w, broker_w))
        pair = (client_w, broker_w)
        await asyncio.gather(self._pump(client_r, broker_w, pair, upstream=True),
                             self._pump(broker_r, client_w, pair, upstream=False), return_exceptions=True)
        for w in pair:
            self._writers.discard(w)
            w.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter], upstream: bool) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            mode = self.mode
            if mode == "blackhole":
                continue
            if mode == "delay" and self.delay_s > 0:
                await asyncio.sleep(self.delay_s)
            if mode == "lose_responses" and not upstream:
                for w in pair:  # the broker has answered: nobody will ever read that answer
                    w.transport.abort()
                break
            if writer.transport.is_closing():
                break
            writer.write(data)
            await writer.drain()
        for w in pair:
            w.transport.abort()
