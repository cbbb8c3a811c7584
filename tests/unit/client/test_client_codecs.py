"""Client-direction codecs against the broker's own codecs and kafka-python's schemas, every version."""

from __future__ import annotations

import time

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.producer import ProduceResponse

from oncelog.protocol import client_codecs as cc
from oncelog.protocol.apis import SPECS, ApiKey
from oncelog.protocol.fetch_codec import FetchPartitionResponse, decode_fetch_request, encode_fetch_response
from oncelog.protocol.header import decode_request_header
from oncelog.protocol.messages import _build, decode_request, encode_response
from oncelog.protocol.primitives import ProtocolError, UnsupportedVersionError
from oncelog.protocol.produce_codec import (
    ProducePartitionResponse,
    decode_produce_request,
    encode_produce_response,
)

PRODUCE = range(cc.PRODUCE_VERSIONS[0], cc.PRODUCE_VERSIONS[1] + 1)
FETCH = range(cc.FETCH_VERSIONS[0], cc.FETCH_VERSIONS[1] + 1)


def test_versions_are_the_brokers():
    assert cc.PRODUCE_VERSIONS == (SPECS[ApiKey.PRODUCE].min_version, SPECS[ApiKey.PRODUCE].max_version)
    assert cc.FETCH_VERSIONS == (SPECS[ApiKey.FETCH].min_version, SPECS[ApiKey.FETCH].max_version)


# -- Produce ----------------------------------------------------------------------------------------

BATCH_A = memoryview(bytearray(b"A" * 300))  # > 127 bytes: a two-byte compact length
BATCH_B = b"\x01\x02\x03"


@pytest.mark.parametrize("version", PRODUCE)
@pytest.mark.parametrize("txn", [None, "txn-\u00e9"])
def test_produce_request_round_trip_through_the_broker_decoder(version, txn):
    big = memoryview(bytearray(range(256)) * 64)  # 16 KiB: a three-byte compact length
    topics = [("orders", [(0, BATCH_A), (7, BATCH_B)]), ("t\u00f6pic", [(2**31 - 1, big)])]
    pieces = cc.encode_produce_request(version, txn, -1, 30000, topics)
    # the record batches are passed through by identity, never copied
    assert any(p is BATCH_A for p in pieces) and any(p is BATCH_B for p in pieces) and any(p is big for p in pieces)
    body = b"".join(pieces)
    decoded = decode_produce_request(memoryview(body), version)
    assert decoded.transactional_id == txn and decoded.acks == -1 and decoded.timeout_ms == 30000
    assert [(name, [(i, bytes(r)) for i, r in parts]) for name, parts in decoded.topics] == [
        ("orders", [(0, bytes(BATCH_A)), (7, BATCH_B)]), ("t\u00f6pic", [(2**31 - 1, bytes(big))])]


@pytest.mark.parametrize("version", PRODUCE)
def test_produce_request_matches_kafka_python_bytes(version):
    pieces = cc.encode_produce_request(version, "t", 1, 100, [("a", [(3, BATCH_B)])])
    msg = decode_request(0, version, memoryview(b"".join(pieces)))  # kafka-python's schema decoder
    topic = msg.topic_data[0]
    assert (msg.transactional_id, msg.acks, msg.timeout_ms, topic.name) == ("t", 1, 100, "a")
    assert topic.partition_data[0].index == 3 and bytes(topic.partition_data[0].records) == BATCH_B


@pytest.mark.parametrize("version", PRODUCE)
def test_produce_response_round_trip(version):
    parts = [
        ProducePartitionResponse(0, 0, 42, -1, 7),
        ProducePartitionResponse(1, 87, -1, -1, 3, [(0, "no key"), (5, None)], "2 records failed"),
        ProducePartitionResponse(2, 59, -1, -1, 1000, (), "unknown producer"),
    ]
    body = encode_produce_response(version, [("orders", parts), ("empty", [])], throttle_time_ms=9)
    [orders, empty] = cc.decode_produce_response(version, memoryview(body))
    assert orders.name == "orders" and empty == ("empty", [])
    ok, bad, lost = orders.partitions
    assert (ok.partition, ok.error_code, ok.base_offset, ok.log_append_time) == (0, 0, 42, -1)
    assert ok.record_errors == [] and ok.error_message is None
    assert ok.log_start_offset == (7 if version >= 5 else -1)
    if version >= 8:
        assert bad.record_errors == [(0, "no key"), (5, None)] and bad.error_message == "2 records failed"
        assert lost.error_message == "unknown producer"
    else:
        assert bad.record_errors == [] and bad.error_message is None
    assert lost.log_start_offset == (1000 if version >= 5 else -1) and lost.error_code == 59


def test_produce_response_skips_tagged_fields():
    data = {"responses": [{"name": "a", "partition_responses": [
        {"index": 1, "error_code": 6, "base_offset": -1, "log_start_offset": 4,
         "current_leader": {"leader_id": 1, "leader_epoch": 2}}]}],
        "throttle_time_ms": 3, "node_endpoints": [{"node_id": 1, "host": "h", "port": 9, "rack": None}]}
    body = bytes(_build(ProduceResponse[11], data).encode(version=11))
    [topic] = cc.decode_produce_response(11, body)
    assert topic.partitions[0][:5] == (1, 6, -1, -1, 4)


@pytest.mark.parametrize("version", [2, 12])
def test_produce_versions_outside_the_range(version):
    with pytest.raises(UnsupportedVersionError):
        cc.encode_produce_request(version, None, -1, 1, [])
    with pytest.raises(UnsupportedVersionError):
        cc.decode_produce_response(version, b"")


def test_truncated_produce_response_is_a_protocol_error():
    body = encode_produce_response(11, [("orders", [ProducePartitionResponse(0, 0, 42, -1, 7)])])
    for cut in range(len(body)):
        with pytest.raises(ProtocolError):
            cc.decode_produce_response(11, body[:cut])


# -- Fetch ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", FETCH)
@pytest.mark.parametrize("isolation", [0, 1])
def test_fetch_request_round_trip_through_the_broker_decoder(version, isolation):
    topics = [("orders", [(0, 100, 1048576), (2**31 - 1, 2**62, 1)]), ("t\u00f6pic", [(3, 0, 0)]), ("idle", [])]
    body = cc.encode_fetch_request(version, max_wait_ms=500, min_bytes=1, max_bytes=52428800,
                                   isolation_level=isolation, topics=topics)
    req = decode_fetch_request(memoryview(body), version)
    assert (req.replica_id, req.max_wait_ms, req.min_bytes, req.max_bytes) == (-1, 500, 1, 52428800)
    assert req.isolation_level == isolation and (req.session_id, req.session_epoch) == (0, -1)
    assert req.forgotten_topics == [] and req.rack_id == ""
    got = [(t.name, [(p.partition, p.fetch_offset, p.partition_max_bytes) for p in t.partitions]) for t in req.topics]
    assert got == topics
    for t in req.topics:
        for p in t.partitions:
            assert (p.current_leader_epoch, p.last_fetched_epoch, p.log_start_offset) == (-1, -1, -1)


@pytest.mark.parametrize("version", FETCH)
def test_fetch_request_decodes_with_kafka_python(version):
    body = cc.encode_fetch_request(version, max_wait_ms=5, min_bytes=2, max_bytes=3, isolation_level=1,
                                   topics=[("a", [(1, 2, 3)])])
    msg = decode_request(1, version, memoryview(body))
    assert msg.topics[0].topic == "a" and msg.topics[0].partitions[0].fetch_offset == 2


@pytest.mark.parametrize("version", FETCH)
def test_fetch_response_round_trip_records_are_slices_of_the_response(version):
    records = b"R" * 200
    parts = [
        FetchPartitionResponse(0, 0, 10, 8, 2, [(77, 3), (78, 5)], -1, records),
        FetchPartitionResponse(1, 1, 10, 10, 0, None, -1, None),
        FetchPartitionResponse(2, 0, 5, 5, 0, [], -1, b""),
    ]
    pieces = encode_fetch_response(version, 4, 0, 0, [("orders", parts), ("empty", [])])
    body = memoryview(b"".join(pieces))
    result = cc.decode_fetch_response(version, body)
    assert result.throttle_time_ms == 4 and result.error_code == 0
    [(name, [a, b, c]), (empty_name, empty)] = result.topics
    assert name == "orders" and empty_name == "empty" and empty == []
    assert (a.partition, a.error_code, a.high_watermark, a.last_stable_offset) == (0, 0, 10, 8)
    assert a.log_start_offset == (2 if version >= 5 else -1)
    assert [tuple(x) for x in a.aborted_transactions] == [(77, 3), (78, 5)]
    assert bytes(a.records) == records and a.records.obj is body.obj  # a view of the response, not a copy
    assert b.error_code == 1 and b.aborted_transactions is None and bytes(b.records) == b""
    assert c.aborted_transactions == [] and bytes(c.records) == b""


def test_fetch_response_top_level_error_and_tags_skipped():
    data = {"throttle_time_ms": 1, "error_code": 71, "session_id": 0, "responses": [
        {"topic": "a", "partitions": [{"partition_index": 0, "error_code": 0, "high_watermark": 3,
                                       "last_stable_offset": 3, "log_start_offset": 0,
                                       "aborted_transactions": None, "preferred_read_replica": -1,
                                       "records": b"xyz",
                                       "current_leader": {"leader_id": 1, "leader_epoch": 1}}]}]}
    body = bytes(_build(FetchResponse[12], data).encode(version=12))
    result = cc.decode_fetch_response(12, body)
    assert result.error_code == 71 and bytes(result.topics[0][1][0].records) == b"xyz"


def test_truncated_fetch_response_is_a_protocol_error():
    pieces = encode_fetch_response(12, 0, 0, 0, [("o", [FetchPartitionResponse(0, 0, 1, 1, 0, [(1, 1)], -1, b"x")])])
    body = b"".join(pieces)
    for cut in range(len(body)):
        with pytest.raises(ProtocolError):
            cc.decode_fetch_response(12, body[:cut])
    with pytest.raises(ProtocolError):
        cc.decode_fetch_response(12, body + b"\x00")


# -- headers and the long tail ------------------------------------------------------------------------


@pytest.mark.parametrize("api_key, version", [(3, 8), (3, 12), (18, 3), (0, 11), (1, 4)])
def test_request_header_decodes_on_the_broker(api_key, version):
    head = cc.encode_request_header(api_key, version, 1234, "me")
    flexible = cc.request_flexible(api_key, version)
    header, offset = decode_request_header(head + b"BODY", flexible)
    assert tuple(header) == (api_key, version, 1234, "me") and offset == len(head)


def test_response_body_offset():
    assert cc.response_body_offset(18, 3, b"\x00\x00\x00\x01rest") == 4  # ApiVersions: header v0
    assert cc.response_body_offset(3, 12, b"\x00\x00\x00\x01\x00rest") == 5
    assert cc.response_body_offset(3, 8, b"\x00\x00\x00\x01rest") == 4
    tagged = b"\x00\x00\x00\x01" + b"\x01\x00\x02ab" + b"rest"  # one tag (0) of 2 bytes
    assert cc.response_body_offset(3, 12, tagged) == len(tagged) - 4


def test_long_tail_encode_decodes_on_the_broker_and_back():
    body = cc.encode_request(3, 12, {"topics": [{"name": "a"}], "allow_auto_topic_creation": True})
    msg = decode_request(3, 12, memoryview(body))
    assert msg.topics[0].name == "a" and msg.allow_auto_topic_creation is True
    resp = encode_response(10, 4, {"coordinators": [{"key": "g", "node_id": 1, "host": "h", "port": 9,
                                                     "error_code": 0, "error_message": None}]})
    decoded = cc.decode_response(10, 4, memoryview(resp))
    assert decoded.coordinators[0].node_id == 1 and decoded.coordinators[0].host == "h"
    with pytest.raises(ProtocolError):
        cc.decode_response(10, 4, resp[:-3])
    with pytest.raises(UnsupportedVersionError):
        cc.encode_request(3, 99, {})


def test_encode_is_cheap_for_many_partitions():
    """Whole-batch work: one request with 1000 partitions encodes in well under a few ms (no per-byte work)."""
    batch = memoryview(bytearray(16384))
    topics = [("t", [(i, batch) for i in range(1000)])]
    start = time.perf_counter()
    for _ in range(10):
        pieces = cc.encode_produce_request(11, None, -1, 30000, topics)
    elapsed = (time.perf_counter() - start) / 10
    assert sum(p is batch for p in pieces) == 1000
    assert elapsed < 0.05, elapsed
