"""Property tests: random well-formed messages survive a trip through both codecs.

The example-based tests pin the layouts; these explore the value space (extreme
integers, empty and non-ASCII strings, nulls, long arrays, varint length boundaries).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from oncelog.protocol import fetch_codec, produce_codec
from oncelog.protocol.fetch_codec import FetchPartition, FetchPartitionResponse
from oncelog.protocol.produce_codec import ProducePartitionResponse

PROPS = settings(max_examples=150, deadline=1000, suppress_health_check=[HealthCheck.too_slow])

i16 = st.integers(-(2**15), 2**15 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
names = st.text(max_size=40)
opt_text = st.none() | st.text(max_size=40)
# Lengths around the 1- and 2-byte varint boundaries (127/128, 16383/16384) matter most.
records = st.none() | st.binary(max_size=200) | st.integers(120, 130).map(bytes) | st.sampled_from(
    [bytes(16382), bytes(16383), bytes(16384)]
)


@PROPS
@given(
    version=st.integers(produce_codec.MIN_VERSION, produce_codec.MAX_VERSION),
    txn=opt_text,
    acks=i16,
    timeout=i32,
    topics=st.lists(st.tuples(names, st.lists(st.tuples(i32, records), max_size=4)), max_size=4),
)
def test_produce_request_roundtrip(version: int, txn: str | None, acks: int, timeout: int, topics: list) -> None:
    req = ProduceRequest[version]
    td = req.TopicProduceData
    pd = td.PartitionProduceData
    wire = req(
        transactional_id=txn, acks=acks, timeout_ms=timeout,
        topic_data=[td(name=n, partition_data=[pd(index=i, records=r) for i, r in ps]) for n, ps in topics],
    ).encode()
    data = produce_codec.decode_produce_request(memoryview(wire), version)
    assert (data.transactional_id, data.acks, data.timeout_ms) == (txn, acks, timeout)
    assert [(n, [(i, None if r is None else bytes(r)) for i, r in ps]) for n, ps in data.topics] == topics


partition_response = st.builds(
    ProducePartitionResponse,
    index=i32, error_code=i16, base_offset=i64, log_append_time_ms=i64, log_start_offset=i64,
    record_errors=st.lists(st.tuples(i32, opt_text), max_size=3), error_message=opt_text,
)


@PROPS
@given(
    version=st.integers(produce_codec.MIN_VERSION, produce_codec.MAX_VERSION),
    responses=st.lists(st.tuples(names, st.lists(partition_response, max_size=4)), max_size=4),
    throttle=i32,
)
def test_produce_response_roundtrip(version: int, responses: list, throttle: int) -> None:
    ref = ProduceResponse.decode(produce_codec.encode_produce_response(version, responses, throttle), version=version)
    assert ref.throttle_time_ms == throttle
    got = [
        (
            t.name,
            [
                ProducePartitionResponse(
                    p.index, p.error_code, p.base_offset, p.log_append_time_ms,
                    p.log_start_offset if version >= 5 else -1,
                    [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] if version >= 8 else [],
                    p.error_message if version >= 8 else None,
                )
                for p in t.partition_responses
            ],
        )
        for t in ref.responses
    ]
    want = [
        (
            n,
            [
                p._replace(
                    log_start_offset=p.log_start_offset if version >= 5 else -1,
                    record_errors=list(p.record_errors) if version >= 8 else [],
                    error_message=p.error_message if version >= 8 else None,
                )
                for p in ps
            ],
        )
        for n, ps in responses
    ]
    assert got == want


fetch_partition = st.builds(
    FetchPartition,
    partition=i32, current_leader_epoch=i32, fetch_offset=i64, last_fetched_epoch=i32,
    log_start_offset=i64, partition_max_bytes=i32,
)


@PROPS
@given(
    version=st.integers(fetch_codec.MIN_VERSION, fetch_codec.MAX_VERSION),
    head=st.tuples(i32, i32, i32, i32, st.integers(-128, 127), i32, i32),
    topics=st.lists(st.tuples(names, st.lists(fetch_partition, max_size=4)), max_size=4),
    forgotten=st.lists(st.tuples(names, st.lists(i32, max_size=5)), max_size=3),
    rack=st.text(max_size=20),
    cluster_id=opt_text,
)
def test_fetch_request_roundtrip(
    version: int, head: tuple, topics: list, forgotten: list, rack: str, cluster_id: str | None
) -> None:
    req = FetchRequest[version]
    ft = req.FetchTopic
    fp = ft.FetchPartition
    replica, wait, min_b, max_b, iso, sid, sepoch = head
    kwargs: dict[str, Any] = dict(
        replica_id=replica, max_wait_ms=wait, min_bytes=min_b, max_bytes=max_b, isolation_level=iso,
        topics=[ft(topic=n, partitions=[fp(**p._asdict()) for p in ps]) for n, ps in topics],
    )
    if version >= 7:
        kwargs.update(session_id=sid, session_epoch=sepoch,
                      forgotten_topics_data=[req.ForgottenTopic(topic=n, partitions=ps) for n, ps in forgotten])
    if version >= 11:
        kwargs["rack_id"] = rack
    if version >= 12 and cluster_id is not None:
        kwargs["cluster_id"] = cluster_id
    data = fetch_codec.decode_fetch_request(memoryview(req(**kwargs).encode()), version)
    assert (data.replica_id, data.max_wait_ms, data.min_bytes, data.max_bytes, data.isolation_level) == head[:5]
    assert (data.session_id, data.session_epoch) == ((sid, sepoch) if version >= 7 else (0, -1))
    assert data.forgotten_topics == ([(n, ps) for n, ps in forgotten] if version >= 7 else [])
    assert data.rack_id == (rack if version >= 11 else "")
    assert data.topics == [
        (
            n,
            [
                FetchPartition(
                    p.partition,
                    p.current_leader_epoch if version >= 9 else -1,
                    p.fetch_offset,
                    p.last_fetched_epoch if version >= 12 else -1,
                    p.log_start_offset if version >= 5 else -1,
                    p.partition_max_bytes,
                )
                for p in ps
            ],
        )
        for n, ps in topics
    ]


fetch_response = st.builds(
    FetchPartitionResponse,
    partition_index=i32, error_code=i16, high_watermark=i64, last_stable_offset=i64, log_start_offset=i64,
    aborted_transactions=st.none() | st.lists(st.tuples(i64, i64), max_size=3),
    preferred_read_replica=i32, records=records, diverging_epoch=st.none() | st.tuples(i32, i64),
)


@PROPS
@given(
    version=st.integers(fetch_codec.MIN_VERSION, fetch_codec.MAX_VERSION),
    throttle=i32, error=i16, session=i32,
    topics=st.lists(st.tuples(names, st.lists(fetch_response, max_size=4)), max_size=3),
)
def test_fetch_response_roundtrip(version: int, throttle: int, error: int, session: int, topics: list) -> None:
    pieces = fetch_codec.encode_fetch_response(version, throttle, error, session, topics)
    wire = b"".join(bytes(p) for p in pieces)
    assert fetch_codec.pieces_size(pieces) == len(wire)
    ref = FetchResponse.decode(wire, version=version)
    assert ref.throttle_time_ms == throttle
    if version >= 7:
        assert (ref.error_code, ref.session_id) == (error, session)
    got = [
        (
            t.topic,
            [
                (
                    p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                    p.log_start_offset if version >= 5 else -1,
                    None if p.aborted_transactions is None
                    else [(a.producer_id, a.first_offset) for a in p.aborted_transactions],
                    p.preferred_read_replica if version >= 11 else -1,
                    None if p.records is None else bytes(p.records),
                    None if p.diverging_epoch is None else (p.diverging_epoch.epoch, p.diverging_epoch.end_offset),
                )
                for p in t.partitions
            ],
        )
        for t in ref.responses
    ]
    want = [
        (
            n,
            [
                (
                    p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                    p.log_start_offset if version >= 5 else -1,
                    None if p.aborted_transactions is None else list(p.aborted_transactions),
                    p.preferred_read_replica if version >= 11 else -1,
                    p.records,
                    p.diverging_epoch if version >= 12 else None,
                )
                for p in ps
            ],
        )
        for n, ps in topics
    ]
    assert got == want
