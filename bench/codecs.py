"""Hot-path codec cost, measured the way research/libraries.md did: median thread CPU time.

Run `python bench/codecs.py`; it prints microseconds per operation. Numbers, not assertions:
timings belong in notes, never in tests.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from kafka.protocol.consumer import FetchRequest
from kafka.protocol.producer import ProduceRequest

from oncelog.protocol.fetch_codec import (
    FetchPartitionResponse,
    decode_fetch_request,
    encode_fetch_response,
    pieces_size,
)
from oncelog.protocol.header import decode_request_header
from oncelog.protocol.produce_codec import (
    ProducePartitionResponse,
    decode_produce_request,
    encode_produce_response,
)

BATCH = bytes(16_361)  # the research fixture's size: 148 x 100-byte records in one RecordBatch v2


def _cpu_us_per_op(fn: Callable[[], object], loops: int = 2000, rounds: int = 41) -> float:
    for _ in range(loops):
        fn()
    samples = []
    for _ in range(rounds):
        t0 = time.thread_time_ns()
        for _ in range(loops):
            fn()
        samples.append((time.thread_time_ns() - t0) / loops / 1000)
    return statistics.median(samples)


def _report(name: str, us: float) -> None:
    print(f"{name:<75} {us:8.2f} us/op")


def decode_produce_v9_16k() -> None:
    req = ProduceRequest[9]
    td = req.TopicProduceData
    wire = req(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[
        td(name="bench", partition_data=[td.PartitionProduceData(index=0, records=BATCH)])
    ]).encode()
    body = memoryview(bytearray(wire))
    data = decode_produce_request(body, 9)
    assert data.topics[0][1][0][1].nbytes == len(BATCH)
    us = _cpu_us_per_op(lambda: decode_produce_request(body, 9))
    _report("decode Produce v9 request, 1 x 16 KiB batch", us)


def encode_fetch_v12_10_partitions() -> None:
    def build_and_encode() -> list:
        parts = [FetchPartitionResponse(i, 0, 1000, 1000, 0, None, -1, BATCH) for i in range(10)]
        return encode_fetch_response(12, 0, 0, 0, [("bench", parts)])

    pieces = build_and_encode()
    assert len(pieces) == 21 and pieces_size(pieces) > 10 * len(BATCH)
    us = _cpu_us_per_op(build_and_encode)
    _report("build+encode Fetch v12 response, 10 x 16 KiB partitions, as pieces", us)

    def build_tuples_and_encode() -> list:
        parts = [(i, 0, 1000, 1000, 0, None, -1, BATCH) for i in range(10)]
        return encode_fetch_response(12, 0, 0, 0, [("bench", parts)])

    assert build_tuples_and_encode() == pieces
    us = _cpu_us_per_op(build_tuples_and_encode)
    _report("build (plain tuples)+encode Fetch v12 response, 10 x 16 KiB partitions", us)

    prebuilt = [("bench", [FetchPartitionResponse(i, 0, 1000, 1000, 0, None, -1, BATCH) for i in range(10)])]
    us = _cpu_us_per_op(lambda: encode_fetch_response(12, 0, 0, 0, prebuilt))
    _report("encode only Fetch v12 response, 10 partitions", us)


def other_hot_path_ops() -> None:
    responses = [("bench", [ProducePartitionResponse(0, 0, 12345, -1, 0)])]
    _report("encode Produce v9 response, 1 partition", _cpu_us_per_op(lambda: encode_produce_response(9, responses)))
    frame = memoryview(b"\x00\x00\x00\x09\x00\x00\x00\x01\x00\x07rdkafka\x00" + bytes(100))
    _report("decode request header v2", _cpu_us_per_op(lambda: decode_request_header(frame, True)))
    fetch = FetchRequest[12](
        replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=52428800, isolation_level=0, session_id=0,
        session_epoch=-1, forgotten_topics_data=[], rack_id="",
        topics=[FetchRequest[12].FetchTopic(topic="bench", partitions=[
            FetchRequest[12].FetchTopic.FetchPartition(partition=i, fetch_offset=1000, partition_max_bytes=1048576)
            for i in range(10)
        ])],
    ).encode()
    body = memoryview(fetch)
    _report("decode Fetch v12 request, 10 partitions", _cpu_us_per_op(lambda: decode_fetch_request(body, 12)))


if __name__ == "__main__":
    decode_produce_v9_16k()
    encode_fetch_v12_10_partitions()
    other_hot_path_ops()
