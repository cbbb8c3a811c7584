"""Fetch codec round trips against kafka-python for every supported version."""

from __future__ import annotations

import array
import struct
import tracemalloc
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse

from oncelog.protocol.fetch_codec import (
    MAX_VERSION,
    MIN_VERSION,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequestData,
    ForgottenTopic,
    decode_fetch_request,
    encode_fetch_response,
    pieces_size,
)
from oncelog.protocol.primitives import ProtocolError, UnsupportedVersionError

VERSIONS = range(MIN_VERSION, MAX_VERSION + 1)


# -- request --------------------------------------------------------------------------------------

PARTS = {
    "orders": [FetchPartition(0, 5, 100, 4, 7, 1048576), FetchPartition(2**31 - 1, 6, 2**62, 3, -1, 1)],
    "t\u00f6pic": [FetchPartition(3, 0, 0, 0, 0, 0)],
    "idle": [],
}
FORGOTTEN = [ForgottenTopic("gone", [1, 2, 3]), ForgottenTopic("none", [])]


def _kafka_request(version: int, cluster_id: str | None = None, parts=PARTS, forgotten=FORGOTTEN) -> bytes:
    req = FetchRequest[version]
    ft = req.FetchTopic
    fp = ft.FetchPartition
    kwargs: dict[str, Any] = dict(
        replica_id=-1,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=52428800,
        isolation_level=1,
        topics=[
            ft(
                topic=name,
                partitions=[
                    fp(
                        partition=p.partition,
                        current_leader_epoch=p.current_leader_epoch,
                        fetch_offset=p.fetch_offset,
                        last_fetched_epoch=p.last_fetched_epoch,
                        log_start_offset=p.log_start_offset,
                        partition_max_bytes=p.partition_max_bytes,
                    )
                    for p in ps
                ],
            )
            for name, ps in parts.items()
        ],
    )
    if version >= 7:
        kwargs.update(
            session_id=123,
            session_epoch=9,
            forgotten_topics_data=[req.ForgottenTopic(topic=f.name, partitions=f.partitions) for f in forgotten],
        )
    if version >= 11:
        kwargs["rack_id"] = "rack-\u00e9"
    if cluster_id is not None:
        kwargs["cluster_id"] = cluster_id
    return req(**kwargs).encode()


def _expected_partition(p: FetchPartition, version: int) -> FetchPartition:
    return FetchPartition(
        p.partition,
        p.current_leader_epoch if version >= 9 else -1,
        p.fetch_offset,
        p.last_fetched_epoch if version >= 12 else -1,
        p.log_start_offset if version >= 5 else -1,
        p.partition_max_bytes,
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_decode_matches_kafka(version: int) -> None:
    wire = _kafka_request(version)
    data = decode_fetch_request(memoryview(wire), version)
    assert isinstance(data, FetchRequestData)
    assert (data.replica_id, data.max_wait_ms, data.min_bytes, data.max_bytes, data.isolation_level) == (
        -1, 500, 1, 52428800, 1,
    )
    assert [(t.name, t.partitions) for t in data.topics] == [
        (name, [_expected_partition(p, version) for p in ps]) for name, ps in PARTS.items()
    ]
    if version >= 7:
        assert (data.session_id, data.session_epoch) == (123, 9)
        assert data.forgotten_topics == FORGOTTEN
    else:
        assert (data.session_id, data.session_epoch, data.forgotten_topics) == (0, -1, [])
    assert data.rack_id == ("rack-\u00e9" if version >= 11 else "")


def test_v12_cluster_id_tag_skipped() -> None:
    wire = _kafka_request(12, cluster_id="cluster-\u00e9" * 20)
    assert wire != _kafka_request(12)
    data = decode_fetch_request(memoryview(wire), 12)
    assert data == decode_fetch_request(memoryview(_kafka_request(12)), 12)


def test_v12_unknown_tags_everywhere_skipped() -> None:
    tags = b"\x02" + b"\x00\x02ab" + b"\x07\x01!"
    body = (
        struct.pack(">iiiibii", -1, 100, 1, 1000, 0, 0, -1)
        + b"\x02" + b"\x02t"  # one topic "t"
        + b"\x02" + struct.pack(">iiqiqi", 0, 1, 2, 3, 4, 5) + tags  # one partition
        + tags  # topic tags
        + b"\x02" + b"\x02f" + b"\x03" + struct.pack(">ii", 8, 9) + tags  # forgotten topic
        + b"\x03ra"  # rack id
        + tags
    )
    data = decode_fetch_request(memoryview(body), 12)
    assert data.topics == [("t", [FetchPartition(0, 1, 2, 3, 4, 5)])]
    assert data.forgotten_topics == [("f", [8, 9])]
    assert data.rack_id == "ra"


@pytest.mark.parametrize("version", VERSIONS)
def test_request_truncated_at_every_byte(version: int) -> None:
    wire = _kafka_request(version, parts={"a": [FetchPartition(0, 1, 2, 3, 4, 5)]},
                          forgotten=[ForgottenTopic("b", [1])])
    decode_fetch_request(memoryview(wire), version)
    for cut in range(len(wire)):
        with pytest.raises(ProtocolError):
            decode_fetch_request(memoryview(wire[:cut]), version)


@pytest.mark.parametrize("version", VERSIONS)
def test_request_trailing_bytes_rejected(version: int) -> None:
    with pytest.raises(ProtocolError, match="trailing"):
        decode_fetch_request(memoryview(_kafka_request(version) + b"\x00"), version)


def _absurd_bodies(version: int) -> list[bytes]:
    if version >= 12:
        head = struct.pack(">iiiibii", -1, 100, 1, 1000, 0, 0, -1)
        return [
            head + b"\xff\xff\xff\xff\x0f",
            head + b"\x02\x02t\xff\xff\xff\xff\x07",
            head + b"\x01\xff\xff\xff\xff\x07",  # forgotten topics
            head + b"\x01\x02\x02f\xff\xff\xff\xff\x07",  # forgotten partitions
            head + b"\x01\x01\xff\xff\x03",  # rack id longer than 32767
            head + b"\x02\x00",  # null topic name
        ]
    head = struct.pack(">iiiib", -1, 100, 1, 1000, 0) + (struct.pack(">ii", 0, -1) if version >= 7 else b"")
    bodies = [
        head + struct.pack(">i", 0x7FFFFFFF),
        head + struct.pack(">i", -1),
        head + struct.pack(">ih", 1, -1),
        head + struct.pack(">ih", 1, -5),
        head + struct.pack(">ih", 1, 0x7FFF),
        head + struct.pack(">ihi", 1, 0, 0x7FFFFFFF),
    ]
    if version >= 7:
        bodies += [
            head + struct.pack(">ii", 0, 0x7FFFFFFF),
            head + struct.pack(">iihi", 0, 1, 0, 0x7FFFFFFF),
            head + struct.pack(">iihi", 0, 1, 0, -1),
        ]
    if version >= 11:
        bodies.append(head + struct.pack(">iih", 0, 0, -1))  # null rack id
    return bodies


@pytest.mark.parametrize("version", VERSIONS)
def test_request_absurd_lengths_fail_fast_and_small(version: int) -> None:
    for body in _absurd_bodies(version):
        tracemalloc.start()
        try:
            with pytest.raises(ProtocolError):
                decode_fetch_request(memoryview(body), version)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 64 * 1024, body


@pytest.mark.parametrize("version", [0, 3, 13, 18])
def test_unsupported_versions(version: int) -> None:
    with pytest.raises(UnsupportedVersionError):
        decode_fetch_request(memoryview(b""), version)
    with pytest.raises(UnsupportedVersionError):
        encode_fetch_response(version, 0, 0, 0, [])


# -- response -------------------------------------------------------------------------------------


class Region:
    """Stands in for a sendfile file region: only `size` is visible to the codec."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.size = len(data)


BATCH = bytes(range(256)) * 64  # 16 KiB


def _response_topics() -> list:
    return [
        (
            "orders",
            [
                FetchPartitionResponse(0, 0, 1000, 990, 5, None, -1, BATCH),
                FetchPartitionResponse(1, 0, 50, 40, 0, [(77, 10), (78, 12)], 3, Region(b"file-bytes" * 100)),
                FetchPartitionResponse(2, 1, -1, -1, -1, [], -1, None),
                FetchPartitionResponse(3, 0, 7, 7, 7, None, -1, b""),
                FetchPartitionResponse(4, 0, 9, 9, 0, None, -1, memoryview(bytearray(b"mv" * 300))[10:500]),
                FetchPartitionResponse(5, 0, 9, 9, 0, None, -1, Region(b"adjacent")),
                FetchPartitionResponse(6, 0, 9, 9, 0, None, -1, Region(b"")),  # owns a descriptor: kept
            ],
        ),
        ("t\u00f6pic", [FetchPartitionResponse(2**31 - 1, 0, 2**62, 2**62, 2**61, None, -1, bytearray(b"ba"))]),
        ("idle", []),
    ]


def _flatten(pieces: list) -> bytes:
    out = []
    for p in pieces:
        out.append(p.data if isinstance(p, Region) else bytes(p))
    return b"".join(out)


def _records_bytes(r: Any) -> bytes | None:
    if r is None:
        return None
    return r.data if isinstance(r, Region) else bytes(r)


@pytest.mark.parametrize("version", VERSIONS)
def test_response_decodes_in_kafka(version: int) -> None:
    topics = _response_topics()
    pieces = encode_fetch_response(version, 15, 0, 4242, topics)
    wire = _flatten(pieces)
    assert pieces_size(pieces) == len(wire)
    ref = FetchResponse.decode(wire, version=version)
    assert ref.throttle_time_ms == 15
    if version >= 7:
        assert (ref.error_code, ref.session_id) == (0, 4242)
    assert [t.topic for t in ref.responses] == [n for n, _ in topics]
    for rt, (_, parts) in zip(ref.responses, topics, strict=True):
        assert len(rt.partitions) == len(parts)
        for got, want in zip(rt.partitions, parts, strict=True):
            assert got.partition_index == want.partition_index
            assert got.error_code == want.error_code
            assert got.high_watermark == want.high_watermark
            assert got.last_stable_offset == want.last_stable_offset
            if version >= 5:
                assert got.log_start_offset == want.log_start_offset
            if want.aborted_transactions is None:
                assert got.aborted_transactions is None
            else:
                assert [(a.producer_id, a.first_offset) for a in got.aborted_transactions] == list(
                    want.aborted_transactions
                )
            if version >= 11:
                assert got.preferred_read_replica == want.preferred_read_replica
            assert _records_bytes(got.records) == _records_bytes(want.records)


@pytest.mark.parametrize("version", VERSIONS)
def test_response_pieces_keep_records_by_identity(version: int) -> None:
    topics = _response_topics()
    pieces = encode_fetch_response(version, 0, 0, 0, topics)
    given = [p.records for _, ps in topics for p in ps]
    nonempty = [r for r in given if r is not None and (isinstance(r, Region) or len(r))]
    carried = [p for p in pieces if any(p is r for r in given)]
    assert len(carried) == len(nonempty)
    assert all(a is b for a, b in zip(carried, nonempty, strict=True))
    # Codec bytes are joined: never two codec pieces in a row, and the list stays short.
    is_records = [any(p is r for r in given) for p in pieces]
    for a, b in zip(is_records, is_records[1:], strict=False):
        assert a or b
    assert len(pieces) <= 2 * len(nonempty) + 1
    assert all(isinstance(p, bytes) or any(p is r for r in given) for p in pieces)


@pytest.mark.parametrize("version", VERSIONS)
def test_response_byte_identical_to_kafka(version: int) -> None:
    topics = _response_topics()
    resp = FetchResponse[version]
    tr = resp.FetchableTopicResponse
    pd = tr.PartitionData
    at = pd.AbortedTransaction
    kwargs: dict[str, Any] = dict(
        throttle_time_ms=1,
        responses=[
            tr(
                topic=name,
                partitions=[
                    pd(
                        partition_index=p.partition_index,
                        error_code=p.error_code,
                        high_watermark=p.high_watermark,
                        last_stable_offset=p.last_stable_offset,
                        log_start_offset=p.log_start_offset,
                        aborted_transactions=None if p.aborted_transactions is None else [
                            at(producer_id=a, first_offset=b) for a, b in p.aborted_transactions
                        ],
                        preferred_read_replica=p.preferred_read_replica,
                        records=_records_bytes(p.records),
                    )
                    for p in ps
                ],
            )
            for name, ps in topics
        ],
    )
    if version >= 7:
        kwargs.update(error_code=0, session_id=77)
    expected = resp(**kwargs).encode()
    assert _flatten(encode_fetch_response(version, 1, 0, 77, topics)) == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_empty_response(version: int) -> None:
    pieces = encode_fetch_response(version, 0, 35 if version >= 7 else 0, 0, [])
    assert len(pieces) == 1 and isinstance(pieces[0], bytes)
    ref = FetchResponse.decode(pieces[0], version=version)
    assert ref.responses == []
    if version >= 7:
        assert ref.error_code == 35


def test_response_rejects_records_without_size() -> None:
    with pytest.raises(TypeError):
        encode_fetch_response(12, 0, 0, 0, [("t", [FetchPartitionResponse(0, records=object())])])


def test_response_length_prefix_for_large_region() -> None:
    # A region the codec never reads: only its size reaches the wire.
    region = Region(b"")
    region.size = 1 << 20
    for version in (11, 12):
        pieces = encode_fetch_response(version, 0, 0, 0, [("t", [FetchPartitionResponse(0, records=region)])])
        assert pieces[1] is region
        prefix = pieces[0]
        if version == 12:
            assert prefix.endswith(bytes([0x81, 0x80, 0x40]))  # uvarint(2**20 + 1)
        else:
            assert prefix.endswith(struct.pack(">i", 1 << 20))
        assert len(pieces) == (3 if version == 12 else 2)  # v12 ends with tag bytes after the records
        assert pieces_size(pieces) == sum(len(p) for p in pieces if p is not region) + (1 << 20)


def test_response_sizes_memoryview_records_in_bytes_not_items() -> None:
    words = memoryview(array.array("i", range(50)))  # 50 items, 200 bytes
    for version in (11, 12):
        pieces = encode_fetch_response(version, 0, 0, 0, [("t", [FetchPartitionResponse(0, records=words)])])
        assert pieces[1] is words
        assert pieces_size(pieces) == sum(len(p) for p in pieces if p is not words) + 200
        ref = FetchResponse.decode(b"".join(bytes(p) for p in pieces), version=version)
        assert bytes(ref.responses[0].partitions[0].records) == words.tobytes()


def test_diverging_epoch_is_the_v12_partition_tag_0() -> None:
    """To follower replicas the leader answers where their log diverges (KIP-320): kafka-python's schema reads it
    from the tag, and so does oncelog's client decoder; older versions carry no tag."""
    from oncelog.protocol.client_codecs import decode_fetch_response

    topics = [("orders", [
        FetchPartitionResponse(0, 0, 40, 40, 3, None, -1, b"", (4, 37)),
        FetchPartitionResponse(1, 0, 40, 40, 3, [(7, 1)], -1, Region(b"file-bytes"), (-1, 3)),
        FetchPartitionResponse(2, 0, 40, 40, 3, None, -1, None, (6, 2**40)),
        FetchPartitionResponse(3, 0, 40, 40, 3, None, -1, BATCH, None),
        (4, 0, 40, 40, 3, None, -1, b""),  # a plain 8-tuple: no tag
    ])]
    wire = _flatten(encode_fetch_response(12, 0, 0, 0, topics))
    ref = FetchResponse.decode(wire, version=12)
    got = [None if p.diverging_epoch is None else (p.diverging_epoch.epoch, p.diverging_epoch.end_offset)
           for p in ref.responses[0].partitions]
    assert got == [(4, 37), (-1, 3), (6, 2**40), None, None]
    assert [_records_bytes(p.records) for p in ref.responses[0].partitions] == [b"", b"file-bytes", None, BATCH, b""]
    ours = decode_fetch_response(12, wire)
    assert [p.diverging_epoch for p in ours.topics[0][1]] == [(4, 37), (-1, 3), (6, 2**40), None, None]
    assert bytes(ours.topics[0][1][3].records) == BATCH
    for version in (4, 11):
        old = _flatten(encode_fetch_response(version, 0, 0, 0, topics))
        assert [p.diverging_epoch for p in decode_fetch_response(version, old).topics[0][1]] == [None] * 5
