"""Request/response headers against kafka-python's header codec."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.api_header import ResponseHeader
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import ProduceRequest

from oncelog.protocol.header import RequestHeader, decode_request_header, encode_response_header, peek_api
from oncelog.protocol.primitives import ProtocolError


def _produce_v9() -> ProduceRequest:
    r = ProduceRequest[9]
    return r(transactional_id=None, acks=1, timeout_ms=1000, topic_data=[])


@pytest.mark.parametrize("client_id", ["rdkafka", "", None, "kl\u00e9"])
@pytest.mark.parametrize("flexible", [False, True])
def test_request_header_matches_kafka(client_id: str | None, flexible: bool) -> None:
    if flexible:
        msg = _produce_v9()
        version = 9
    else:
        msg = ProduceRequest[8](transactional_id=None, acks=1, timeout_ms=1000, topic_data=[])
        version = 8
    msg.with_header(correlation_id=0x12345678, client_id=client_id)
    frame = msg.encode(header=True)
    body = msg.encode()
    header, offset = decode_request_header(memoryview(frame), flexible)
    assert header == RequestHeader(0, version, 0x12345678, client_id)
    assert frame[offset:] == body
    assert peek_api(frame) == (0, version, 0x12345678)


def test_header_v2_client_id_is_not_compact() -> None:
    # The one field that stays int16-length in a flexible header.
    msg = ApiVersionsRequest[3](client_software_name="x", client_software_version="1")
    msg.with_header(correlation_id=7, client_id="abc")
    frame = msg.encode(header=True)
    assert frame[8:13] == b"\x00\x03abc"
    header, offset = decode_request_header(frame, True)
    assert header.client_id == "abc"
    assert frame[offset:] == msg.encode()


def test_header_v2_skips_tags() -> None:
    frame = struct.pack(">hhih", 1, 12, 99, 1) + b"c" + b"\x02\x00\x02zz\x05\x00" + b"BODY"
    header, offset = decode_request_header(frame, True)
    assert header == RequestHeader(1, 12, 99, "c")
    assert frame[offset:] == b"BODY"


def test_header_accepts_bytearray_and_returns_offset_into_it() -> None:
    msg = FetchRequest[12](replica_id=-1, max_wait_ms=1, min_bytes=1, max_bytes=1, isolation_level=0,
                          session_id=0, session_epoch=-1, topics=[], forgotten_topics_data=[], rack_id="")
    msg.with_header(correlation_id=3, client_id="cli")
    frame = bytearray(msg.encode(header=True))
    header, offset = decode_request_header(frame, True)
    assert header.api_key == 1 and header.api_version == 12
    assert bytes(frame[offset:]) == msg.encode()


@pytest.mark.parametrize("flexible", [False, True])
def test_header_truncated_everywhere(flexible: bool) -> None:
    frame = struct.pack(">hhih", 0, 9, 1, 5) + b"hello" + (b"\x01\x00\x01x" if flexible else b"")
    decode_request_header(frame, flexible)
    for cut in range(len(frame)):
        with pytest.raises(ProtocolError):
            decode_request_header(frame[:cut], flexible)


def test_header_negative_client_id_length() -> None:
    with pytest.raises(ProtocolError):
        decode_request_header(struct.pack(">hhih", 0, 9, 1, -2), False)
    header, offset = decode_request_header(struct.pack(">hhih", 0, 9, 1, -1), False)
    assert header.client_id is None and offset == 10


def test_peek_api_short() -> None:
    with pytest.raises(ProtocolError):
        peek_api(b"\x00" * 7)
    assert peek_api(bytearray(struct.pack(">hhi", 18, 3, -1))) == (18, 3, -1)


@given(st.binary(max_size=64), st.booleans())
def test_header_garbage(data: bytes, flexible: bool) -> None:
    try:
        header, offset = decode_request_header(data, flexible)
    except ProtocolError:
        return
    assert 10 <= offset <= len(data)


@pytest.mark.parametrize("cid", [0, 1, -1, 2**31 - 1, -(2**31)])
@pytest.mark.parametrize("flexible", [False, True])
def test_response_header_matches_kafka(cid: int, flexible: bool) -> None:
    assert encode_response_header(cid, flexible) == ResponseHeader(correlation_id=cid).encode(flexible=flexible)
