"""A tiny synchronous Kafka wire client for tests that need exact requests and raw answers.

It frames requests encoded by kafka-python's schema codecs (an implementation
independent of the broker's hand-written codecs) and decodes the responses.
"""

from __future__ import annotations

import socket
import struct
from typing import Any


class Wire:
    def __init__(self, bootstrap: str, timeout: float = 30.0, client_id: str = "wire-test") -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.correlation = 0
        self.client_id = client_id

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(payload)

    def recv_frame(self) -> bytes:
        size = struct.unpack(">i", self._recv_exact(4))[0]
        return self._recv_exact(size)

    def _recv_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def request(self, message: Any, version: int, expect_response: bool = True) -> Any:
        """Send `message` (a kafka.protocol request object) at `version`; return the decoded response."""
        self.correlation += 1
        message.with_header(correlation_id=self.correlation, client_id=self.client_id)
        self.send_raw(bytes(message.encode(version=version, header=True, framed=True)))
        if not expect_response:
            return None
        frame = self.recv_frame()
        response_cls = type(message).__name__.replace("Request", "Response")
        import kafka.protocol.admin as a
        import kafka.protocol.consumer as c
        import kafka.protocol.metadata as m
        import kafka.protocol.producer as p
        import kafka.protocol.sasl as s

        cls = next(getattr(mod, response_cls) for mod in (a, c, m, p, s) if hasattr(mod, response_cls))
        flexible = cls.flexible_version_q(version) and cls.API_KEY != 18
        correlation_id = struct.unpack_from(">i", frame)[0]
        assert correlation_id == self.correlation, (correlation_id, self.correlation)
        offset = 4 + (1 if flexible else 0)  # response header v1: the broker sends no tags
        return cls.decode(frame[offset:], version=version)


def sasl_plain_wire(bootstrap: str, user: str, password: str, timeout: float = 30.0) -> Wire:
    """A Wire on a SASL_PLAINTEXT listener, authenticated with PLAIN (SaslHandshake v1, SaslAuthenticate v2)."""
    from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

    wire = Wire(bootstrap, timeout=timeout)
    try:
        handshake = wire.request(SaslHandshakeRequest[1](mechanism="PLAIN"), 1)
        if handshake.error_code:
            raise ConnectionError(f"SaslHandshake answered {handshake.error_code}")
        answer = wire.request(SaslAuthenticateRequest[2](auth_bytes=f"\0{user}\0{password}".encode()), 2)
        if answer.error_code:
            raise ConnectionError(f"SaslAuthenticate answered {answer.error_code}: {answer.error_message}")
    except BaseException:
        wire.close()
        raise
    return wire
