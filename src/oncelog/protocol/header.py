"""Request and response headers.

Request header v1 is api_key, api_version, correlation_id, client_id (int16-length
nullable string); v2 adds a tagged-fields section. The client id stays a classic
int16 string even in v2: the header has to be readable before the broker knows
whether it understands the API version, so its layout cannot depend on flexibility.

Which header version a request uses depends on (api_key, api_version) and is decided
by the caller (`apis.request_header_flexible`); this module only reads bytes.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .primitives import INT32, ProtocolError, as_memoryview, decode_text, skip_tags_at

__all__ = ["RequestHeader", "decode_request_header", "peek_api", "encode_response_header"]

_PEEK = struct.Struct(">hhi")
_HEADER_V1 = struct.Struct(">hhih")
_pack_i32 = INT32.pack
_new_tuple = tuple.__new__


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def peek_api(frame: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) from the first 8 bytes.

    These three fields sit at the same offsets in every header version, so the
    dispatcher can route, version-gate, and answer (even with an error) before it
    knows how to parse the rest.
    """
    if len(frame) < 8:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    return _PEEK.unpack_from(frame, 0)


def decode_request_header(
    frame: bytes | bytearray | memoryview, flexible_header: bool
) -> tuple[RequestHeader, int]:
    """Parse a request header (v2 if `flexible_header`, else v1).

    Returns the header and the offset where the body starts, so the body can be
    handed on as a slice of the same buffer.
    """
    mv = as_memoryview(frame)
    end = len(mv)
    if end < 10:
        raise ProtocolError(f"request of {end} bytes is shorter than a request header")
    api_key, api_version, correlation_id, n = _HEADER_V1.unpack_from(mv, 0)
    pos = 10
    if n < 0:
        if n != -1:
            raise ProtocolError(f"client id has negative length {n}")
        client_id = None
    else:
        new = pos + n
        if new > end:
            raise ProtocolError(f"client id of {n} bytes overruns a {end}-byte request")
        client_id = decode_text(mv[pos:new])
        pos = new
    if flexible_header:
        if pos < end and mv[pos] == 0:
            pos += 1
        else:
            pos = skip_tags_at(mv, pos)
    # tuple.__new__ skips NamedTuple's Python-level __new__: half the cost, same object.
    return _new_tuple(RequestHeader, (api_key, api_version, correlation_id, client_id)), pos


_FLEXIBLE_SUFFIX = b"\x00"


def encode_response_header(correlation_id: int, flexible: bool) -> bytes:
    """Response header v0 (correlation id) or v1 (plus an empty tagged-fields section).

    The caller decides the version: ApiVersions answers with v0 even at flexible
    versions, so that a client can parse the answer to a version it guessed wrong.
    """
    if flexible:
        return _pack_i32(correlation_id) + _FLEXIBLE_SUFFIX
    return _pack_i32(correlation_id)
