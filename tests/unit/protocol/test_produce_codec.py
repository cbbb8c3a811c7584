"""Produce codec round trips against kafka-python for every supported version."""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from oncelog.protocol.primitives import ProtocolError, UnsupportedVersionError
from oncelog.protocol.produce_codec import (
    MAX_VERSION,
    MIN_VERSION,
    ProducePartitionResponse,
    decode_produce_request,
    encode_produce_response,
)

VERSIONS = range(MIN_VERSION, MAX_VERSION + 1)

# (topic, [(partition, records or None)]) -- a mix of sizes, a null batch, an empty batch, non-ASCII name
TOPICS = [
    ("orders", [(0, b"A" * 100), (7, None), (3, b"")]),
    ("t\u00f6pic-\u00e9", [(2**31 - 1, bytes(range(256)) * 70)]),  # > 16 KiB: two-byte varint length
    ("empty-partitions", []),
]


def _kafka_request(version: int, txn: str | None, topics=TOPICS, acks: int = -1, timeout: int = 30000) -> bytes:
    req = ProduceRequest[version]
    td = req.TopicProduceData
    pd = td.PartitionProduceData
    msg = req(
        transactional_id=txn,
        acks=acks,
        timeout_ms=timeout,
        topic_data=[td(name=n, partition_data=[pd(index=i, records=r) for i, r in parts]) for n, parts in topics],
    )
    return msg.encode()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("txn", [None, "txn-\u00fc-1", ""])
def test_decode_matches_kafka(version: int, txn: str | None) -> None:
    wire = _kafka_request(version, txn, acks=1, timeout=-5)
    data = decode_produce_request(memoryview(wire), version)
    assert data.transactional_id == txn
    assert data.acks == 1
    assert data.timeout_ms == -5
    got = [(name, [(i, None if r is None else bytes(r)) for i, r in parts]) for name, parts in data.topics]
    assert got == TOPICS
    # and kafka-python agrees with itself on what it wrote
    ref = ProduceRequest.decode(wire, version=version)
    assert [t.name for t in ref.topic_data] == [t[0] for t in data.topics]


@pytest.mark.parametrize("version", VERSIONS)
def test_records_are_zero_copy(version: int) -> None:
    wire = _kafka_request(version, None)
    # As the connection hands it over: a bytearray frame with the header in front, body sliced off.
    frame = bytearray(b"HEADER" + wire)
    body = memoryview(frame)[6:]
    data = decode_produce_request(body, version)
    records = [r for _, parts in data.topics for _, r in parts if r is not None]
    assert len(records) == 3
    for r in records:
        assert isinstance(r, memoryview)
        assert r.obj is frame
        assert r.readonly is False  # the log patches base offsets in place
    big = data.topics[1][1][0][1]
    start = frame.index(bytes(range(256)))
    big[0] = 0xEE
    assert frame[start] == 0xEE

    data = decode_produce_request(memoryview(wire), version)
    assert all(r.obj is wire for _, parts in data.topics for _, r in parts if r is not None)


def _tagged_v9_request() -> tuple[bytes, list]:
    """A v9 request with unknown tags at every level, assembled by hand (kafka-python drops unknown tags)."""
    tags = b"\x02" + b"\x01\x03xyz" + b"\x0a\x00"  # two tags: #1 (3 bytes), #10 (empty)
    records = b"R" * 20
    body = (
        b"\x04txn"  # compact nullable string "txn"
        + struct.pack(">hi", -1, 1500)
        + b"\x02"  # one topic
        + b"\x02t"
        + b"\x02"  # one partition
        + struct.pack(">i", 4)
        + bytes([len(records) + 1])
        + records
        + tags  # partition tags
        + tags  # topic tags
        + tags  # request tags
    )
    return body, [("t", [(4, records)])]


def test_unknown_tags_skipped() -> None:
    body, expected = _tagged_v9_request()
    for version in range(9, MAX_VERSION + 1):
        data = decode_produce_request(memoryview(body), version)
        assert data.transactional_id == "txn" and data.acks == -1 and data.timeout_ms == 1500
        assert [(n, [(i, bytes(r)) for i, r in p]) for n, p in data.topics] == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_truncated_at_every_byte(version: int) -> None:
    wire = _kafka_request(version, "tx", topics=[("a", [(0, b"abcdef"), (1, None)]), ("bb", [(1, b"x")])])
    decode_produce_request(memoryview(wire), version)
    for cut in range(len(wire)):
        with pytest.raises(ProtocolError):
            decode_produce_request(memoryview(wire[:cut]), version)


@pytest.mark.parametrize("version", VERSIONS)
def test_trailing_bytes_rejected(version: int) -> None:
    wire = _kafka_request(version, None)
    with pytest.raises(ProtocolError, match="trailing"):
        decode_produce_request(memoryview(wire + b"\x00"), version)


def _absurd_bodies(version: int) -> list[bytes]:
    flexible = version >= 9
    if flexible:
        head = b"\x00" + struct.pack(">hi", 1, 100)
        return [
            head + b"\xff\xff\xff\xff\x0f",  # topic count 2**32-2
            head + b"\xff\xff\xff\xff\x07",  # topic count 2**31-2
            head + b"\x02\x02t" + b"\xff\xff\xff\xff\x07",  # partition count
            head + b"\x02\x02t\x02" + struct.pack(">i", 0) + b"\xff\xff\xff\xff\x07",  # records length
            head + b"\x02\xff\xff\x03" + b"x" * 16,  # topic name 65534 bytes
            head + b"\x02\x00",  # null topic name
            head + b"\x02\x02t\x02\x00\x00\x00\x00\x01\xff\xff\xff\xff\x0f",  # tag count
            head + b"\x02\x02t\x02\x00\x00\x00\x00\x01\x01\x00\xff\xff\xff\xff\x07",  # tag size
            b"\xff\xff\xff\xff\x0f",  # transactional id length
        ]
    head = struct.pack(">hhi", -1, 1, 100)
    return [
        head + struct.pack(">i", 0x7FFFFFFF),
        head + struct.pack(">i", -1),  # null topics array
        head + struct.pack(">i", -(2**31)),
        head + struct.pack(">ih", 1, -1),  # null topic name
        head + struct.pack(">ih", 1, -2),  # negative topic name length
        head + struct.pack(">ih", 1, 0x7FFF) + b"x" * 8,
        head + struct.pack(">ihi", 1, 0, 0x7FFFFFFF),  # partition count
        head + struct.pack(">ihiii", 1, 0, 1, 0, 0x7FFFFFFF),  # records length
        head + struct.pack(">ihiii", 1, 0, 1, 0, -2),  # negative records length
        struct.pack(">h", -2) + struct.pack(">hi", 1, 100) + struct.pack(">i", 0),  # transactional id -2
        struct.pack(">h", 0x7FFF),
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_absurd_lengths_fail_fast_and_small(version: int) -> None:
    for body in _absurd_bodies(version):
        tracemalloc.start()
        try:
            with pytest.raises(ProtocolError):
                decode_produce_request(memoryview(body), version)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 64 * 1024, body


@pytest.mark.parametrize("version", [0, 1, 2, 12, 13])
def test_unsupported_versions(version: int) -> None:
    with pytest.raises(UnsupportedVersionError):
        decode_produce_request(memoryview(b""), version)
    with pytest.raises(UnsupportedVersionError):
        encode_produce_response(version, [])


# -- response -------------------------------------------------------------------------------------

RESPONSES = [
    (
        "orders",
        [
            ProducePartitionResponse(0, 0, 1234567890123, -1, 0),
            ProducePartitionResponse(
                7, 87, -1, 1700000000000, 5, [(0, None), (3, "bad \u00e9 timestamp")], "INVALID_RECORD"
            ),
            ProducePartitionResponse(3, 47, -1),
        ],
    ),
    ("t\u00f6pic", [ProducePartitionResponse(2**31 - 1, 6, 42, 43, 44, [], None)]),
    ("none", []),
]


def _kafka_response(version: int, responses, throttle: int) -> bytes:
    resp = ProduceResponse[version]
    tr = resp.TopicProduceResponse
    pr = tr.PartitionProduceResponse
    be = pr.BatchIndexAndErrorMessage
    return resp(
        responses=[
            tr(
                name=name,
                partition_responses=[
                    pr(
                        index=p.index,
                        error_code=p.error_code,
                        base_offset=p.base_offset,
                        log_append_time_ms=p.log_append_time_ms,
                        log_start_offset=p.log_start_offset,
                        record_errors=[be(batch_index=i, batch_index_error_message=m) for i, m in p.record_errors],
                        error_message=p.error_message,
                    )
                    for p in parts
                ],
            )
            for name, parts in responses
        ],
        throttle_time_ms=throttle,
    ).encode()


@pytest.mark.parametrize("version", VERSIONS)
def test_response_decodes_in_kafka(version: int) -> None:
    wire = encode_produce_response(version, RESPONSES, throttle_time_ms=250)
    assert isinstance(wire, bytes)
    ref = ProduceResponse.decode(wire, version=version)
    assert ref.throttle_time_ms == 250
    assert [t.name for t in ref.responses] == [n for n, _ in RESPONSES]
    for topic, (_, parts) in zip(ref.responses, RESPONSES, strict=True):
        assert len(topic.partition_responses) == len(parts)
        for got, want in zip(topic.partition_responses, parts, strict=True):
            assert got.index == want.index
            assert got.error_code == want.error_code
            assert got.base_offset == want.base_offset
            assert got.log_append_time_ms == want.log_append_time_ms
            if version >= 5:
                assert got.log_start_offset == want.log_start_offset
            if version >= 8:
                assert [(e.batch_index, e.batch_index_error_message) for e in got.record_errors] == list(
                    want.record_errors
                )
                assert got.error_message == want.error_message
            if version >= 10:
                assert got.current_leader is None  # tagged field left out
    if version >= 10:
        assert ref.node_endpoints in (None, [])


@pytest.mark.parametrize("version", VERSIONS)
def test_response_byte_identical_to_kafka(version: int) -> None:
    assert encode_produce_response(version, RESPONSES, 3) == _kafka_response(version, RESPONSES, 3)


@pytest.mark.parametrize("version", VERSIONS)
def test_response_accepts_plain_tuples(version: int) -> None:
    plain = [("x", [(1, 0, 10, -1, 0, (), None)])]
    named = [("x", [ProducePartitionResponse(1, 0, 10, -1, 0)])]
    assert encode_produce_response(version, plain) == encode_produce_response(version, named)


def test_empty_response() -> None:
    for version in VERSIONS:
        ref = ProduceResponse.decode(encode_produce_response(version, []), version=version)
        assert ref.responses == [] and ref.throttle_time_ms == 0
