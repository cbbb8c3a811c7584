"""Garbage in, ProtocolError out: the decoders never raise anything else, hang, or balloon.

Random bytes mostly fail in the first few fields, so the mutation tests start from
valid kafka-python encodings and damage them (flip bytes, splice in huge varints and
int32 lengths), which reaches the deeper loops.
"""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.producer import ProduceRequest

from oncelog.protocol import fetch_codec, produce_codec
from oncelog.protocol.header import decode_request_header
from oncelog.protocol.primitives import ProtocolError

FUZZ = settings(max_examples=300, deadline=500, suppress_health_check=[HealthCheck.too_slow])

# A decoder that loops on a lie would hang; make that a failure, not a stuck run.
pytestmark = pytest.mark.timeout(120)

PRODUCE_VERSIONS = st.integers(produce_codec.MIN_VERSION, produce_codec.MAX_VERSION)
FETCH_VERSIONS = st.integers(fetch_codec.MIN_VERSION, fetch_codec.MAX_VERSION)


def _valid_produce(version: int) -> bytes:
    req = ProduceRequest[version]
    td = req.TopicProduceData
    pd = td.PartitionProduceData
    return req(
        transactional_id="tx",
        acks=-1,
        timeout_ms=100,
        topic_data=[
            td(name="a", partition_data=[pd(index=0, records=b"x" * 40), pd(index=1, records=None)]),
            td(name="bcd", partition_data=[pd(index=9, records=b"y" * 3)]),
        ],
    ).encode()


def _valid_fetch(version: int) -> bytes:
    req = FetchRequest[version]
    ft = req.FetchTopic
    fp = ft.FetchPartition
    kwargs: dict[str, Any] = dict(
        replica_id=-1, max_wait_ms=1, min_bytes=1, max_bytes=100, isolation_level=0,
        topics=[ft(topic="a", partitions=[fp(partition=0, fetch_offset=1, partition_max_bytes=9),
                                          fp(partition=1, fetch_offset=2, partition_max_bytes=9)]),
                ft(topic="b", partitions=[])],
    )
    if version >= 7:
        kwargs.update(session_id=1, session_epoch=2,
                      forgotten_topics_data=[req.ForgottenTopic(topic="c", partitions=[1, 2])])
    if version >= 11:
        kwargs["rack_id"] = "r"
    return req(**kwargs).encode()


VALID_PRODUCE = {v: _valid_produce(v) for v in range(produce_codec.MIN_VERSION, produce_codec.MAX_VERSION + 1)}
VALID_FETCH = {v: _valid_fetch(v) for v in range(fetch_codec.MIN_VERSION, fetch_codec.MAX_VERSION + 1)}

# Values that a lying length field might carry.
EVIL = [
    b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x07", b"\x80\x80\x80\x80\x80\x01", b"\xff\xff\x03",
    struct.pack(">i", 0x7FFFFFFF), struct.pack(">i", -2), struct.pack(">i", -(2**31)), struct.pack(">h", -2),
    struct.pack(">h", 0x7FFF), b"\x00", b"\xff",
]


def _decode_or_protocol_error(decode: Callable[[memoryview, int], Any], data: bytes, version: int) -> None:
    try:
        decode(memoryview(data), version)
    except ProtocolError:
        pass


@FUZZ
@given(data=st.binary(max_size=256), version=PRODUCE_VERSIONS)
def test_produce_garbage(data: bytes, version: int) -> None:
    _decode_or_protocol_error(produce_codec.decode_produce_request, data, version)


@FUZZ
@given(data=st.binary(max_size=256), version=FETCH_VERSIONS)
def test_fetch_garbage(data: bytes, version: int) -> None:
    _decode_or_protocol_error(fetch_codec.decode_fetch_request, data, version)


@FUZZ
@given(data=st.binary(max_size=64), flexible=st.booleans())
def test_header_garbage(data: bytes, flexible: bool) -> None:
    try:
        decode_request_header(data, flexible)
    except ProtocolError:
        pass


mutation = st.tuples(
    st.integers(0, 10_000),  # position (taken modulo the length)
    st.one_of(st.binary(min_size=1, max_size=4), st.sampled_from(EVIL)),
    st.booleans(),  # overwrite or insert
)


def _mutate(wire: bytes, edits: list[tuple[int, bytes, bool]]) -> bytes:
    buf = bytearray(wire)
    for pos, patch, overwrite in edits:
        pos %= len(buf) + 1
        if overwrite:
            buf[pos:pos + len(patch)] = patch
        else:
            buf[pos:pos] = patch
    return bytes(buf)


@FUZZ
@given(version=PRODUCE_VERSIONS, edits=st.lists(mutation, min_size=1, max_size=4))
def test_produce_mutations(version: int, edits: list) -> None:
    _decode_or_protocol_error(produce_codec.decode_produce_request, _mutate(VALID_PRODUCE[version], edits), version)


@FUZZ
@given(version=FETCH_VERSIONS, edits=st.lists(mutation, min_size=1, max_size=4))
def test_fetch_mutations(version: int, edits: list) -> None:
    _decode_or_protocol_error(fetch_codec.decode_fetch_request, _mutate(VALID_FETCH[version], edits), version)


@pytest.mark.parametrize(
    "decode,valid",
    [(produce_codec.decode_produce_request, VALID_PRODUCE), (fetch_codec.decode_fetch_request, VALID_FETCH)],
)
def test_every_evil_length_at_every_offset_is_small(decode: Callable, valid: dict[int, bytes]) -> None:
    """Systematic version of the mutation test, with allocation tracked."""
    tracemalloc.start()
    try:
        for version, wire in valid.items():
            for pos in range(len(wire)):
                for patch in EVIL:
                    for overwrite in (True, False):
                        _decode_or_protocol_error(decode, _mutate(wire, [(pos, patch, overwrite)]), version)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024
