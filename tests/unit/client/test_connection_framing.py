"""The connection's frame reader, fed the bytes a socket might deliver, split at every possible place.

Pure logic: responses are matched to in-flight requests by order and correlation id, small frames are cut
out of the receive buffer, a large one is read into its own buffer, and a broken stream fails everything.
"""

from __future__ import annotations

import asyncio
import struct

import pytest

from oncelog.client.connection import BrokerConnection, _InFlight, _Protocol
from oncelog.client.errors import NetworkError


class _Transport:
    """Just enough of a transport for the reader: it can be closed."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _frame(correlation_id: int, body: bytes, flexible: bool) -> bytes:
    payload = struct.pack(">i", correlation_id) + (b"\x00" if flexible else b"") + body
    return struct.pack(">i", len(payload)) + payload


def _setup(requests):
    loop = asyncio.new_event_loop()
    conn = BrokerConnection("127.0.0.1", 9)
    proto = _Protocol(conn)
    proto.transport = _Transport()
    conn._protocol = proto
    conn._closed = False
    entries = []
    for correlation_id, api_key, version in requests:
        entry = _InFlight(correlation_id, api_key, version, loop.create_future())
        conn._in_flight.append(entry)
        entries.append(entry)
    return loop, conn, proto, entries


def _feed(proto: _Protocol, data: bytes, chunk: int) -> None:
    pos = 0
    while pos < len(data):
        buf = proto.get_buffer(-1)
        n = min(len(buf), chunk, len(data) - pos)
        buf[:n] = data[pos:pos + n]
        proto.buffer_updated(n)
        pos += n


BIG = bytes(range(256)) * 1500  # 384000 bytes: larger than half the 256 KiB receive buffer


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1000, 65536, 1 << 20])
def test_frames_split_anywhere_are_matched_in_order(chunk):
    requests = [(10, 3, 12), (11, 18, 3), (12, 1, 12), (13, 0, 8), (14, 3, 12)]
    bodies = [b"meta", b"apiversions", BIG, b"", b"x" * 300]
    data = b"".join(_frame(c, b, flexible=(k, v) in ((3, 12), (1, 12))) for (c, k, v), b in zip(requests, bodies, strict=True))
    loop, conn, proto, entries = _setup(requests)
    try:
        _feed(proto, data, chunk)
        assert [bytes(e.future.result()) for e in entries] == bodies
        assert not conn.closed and conn.in_flight == 0
        assert proto._frame is None and proto._start == proto._end == 0
    finally:
        loop.close()


def test_wrong_correlation_id_fails_everything_in_flight():
    loop, conn, proto, entries = _setup([(1, 3, 8), (2, 3, 8)])
    try:
        _feed(proto, _frame(2, b"out of order", False), 1 << 16)
        assert conn.closed and proto.transport.closed and conn.in_flight == 0
        for e in entries:
            assert isinstance(e.future.exception(), NetworkError)
    finally:
        loop.close()


@pytest.mark.parametrize("size", [-5, 0, 3, (1 << 30) + 1])
def test_impossible_frame_size_breaks_the_stream(size):
    loop, conn, proto, entries = _setup([(1, 3, 8)])
    try:
        _feed(proto, struct.pack(">i", size) + b"\x00" * 8, 1 << 16)
        assert conn.closed and isinstance(entries[0].future.exception(), NetworkError)
    finally:
        loop.close()


def test_unsolicited_response_breaks_the_stream():
    loop, conn, proto, _ = _setup([])
    try:
        _feed(proto, _frame(1, b"?", False), 1 << 16)
        assert conn.closed
    finally:
        loop.close()


def test_a_cancelled_request_still_consumes_its_answer():
    loop, conn, proto, entries = _setup([(1, 3, 8), (2, 3, 8)])
    try:
        entries[0].future.cancel()  # the caller gave up; the answer still arrives, in its place
        _feed(proto, _frame(1, b"first", False) + _frame(2, b"second", False), 5)
        assert bytes(entries[1].future.result()) == b"second" and not conn.closed
    finally:
        loop.close()
