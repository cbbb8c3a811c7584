"""Our consumer in assign mode against a real broker: data written by confluent-kafka (every codec),
read_committed vs read_uncommitted around committed and aborted transactions, auto.offset.reset,
seek, offsets_for_times, watermarks, batch consume, and the asyncio facade.

Every test compares exact record lists (partition, offset, key, value, headers, timestamp).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from confluent_kafka import Producer as CKProducer
from tests.integration.helpers import Out, Rec, ck_produce, create_topic, expected_records, norm_headers

from oncelog.client.consumer.consumer import AsyncConsumer, Consumer
from oncelog.client.consumer.fetcher import OffsetResetError, PartitionEOF
from oncelog.client.types import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Message,
    TopicPartition,
)


def rec(m: Message) -> Rec:
    return Rec(m.partition(), m.offset(), m.key(), m.value(), norm_headers(m.headers()), m.timestamp()[1])


def consumer(bootstrap: str, **conf: Any) -> Consumer:
    base = {"bootstrap.servers": bootstrap, "enable.partition.eof": True, "fetch.wait.max.ms": 100}
    base.update(conf)
    return Consumer(base)


def read_to_eof(c: Consumer, partitions: int, timeout: float = 20.0) -> list[Rec]:
    """Poll until every one of `partitions` partitions reported end of partition; records sorted."""
    out: list[Rec] = []
    eof: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(eof) < partitions:
        assert time.monotonic() < deadline, f"only partitions {sorted(eof)} reached their end in {timeout}s"
        m = c.poll(0.5)
        if m is None:
            continue
        err = m.error()
        if err is not None:
            assert isinstance(err, PartitionEOF), f"unexpected error {err!r}"
            eof.add(m.partition())
            continue
        out.append(rec(m))
    return sorted(out, key=lambda r: (r.partition, r.offset))


@pytest.fixture
def topic(module_broker, topic_name):
    create_topic(module_broker.bootstrap, topic_name, 3)
    return topic_name


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_reads_exactly_what_confluent_kafka_wrote(module_broker, topic, codec):
    outs = [Out(i % 3, None if i % 7 == 0 else b"key-%d" % i, b"value-%d" % i * (1 + i % 5),
                (("h", b"x"), ("empty", None)) if i % 4 == 0 else (), 1_700_000_000_000 + i)
            for i in range(300)]
    outs.append(Out(1, b"null-value", None))
    acked = ck_produce(module_broker.bootstrap, topic, outs, **{"compression.type": codec})
    want = expected_records(outs, acked)
    c = consumer(module_broker.bootstrap)
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(3)])
        got = read_to_eof(c, 3)
    finally:
        c.close()
    assert [r._replace(timestamp=None) for r in got] == [r._replace(timestamp=None) for r in want]
    stamps = {(r.partition, r.offset): r.timestamp for r in got}
    assert all(stamps[(r.partition, r.offset)] == r.timestamp for r in want if r.timestamp is not None)


def test_message_api_shape(module_broker, topic):
    ck_produce(module_broker.bootstrap, topic, [Out(2, b"k", b"v", (("a", b"1"),), 1_700_000_000_123)])
    c = consumer(module_broker.bootstrap)
    try:
        c.assign([TopicPartition(topic, 2, 0)])
        m = c.poll(10)
        assert m is not None and m.error() is None
        assert (m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.headers(), len(m)) == \
            (topic, 2, 0, b"k", b"v", [("a", b"1")], 1)
        assert m.timestamp() == (TIMESTAMP_CREATE_TIME, 1_700_000_000_123)
        eof = c.poll(10)
        assert isinstance(eof.error(), PartitionEOF) and (eof.partition(), eof.offset()) == (2, 1)
        assert c.position([TopicPartition(topic, 2)])[0].offset == 1
        assert c.get_watermark_offsets(TopicPartition(topic, 2)) == (0, 1)
        assert c.get_watermark_offsets(TopicPartition(topic, 2), cached=True) == (0, 1)
    finally:
        c.close()
    with pytest.raises(RuntimeError):
        c.poll(0)


def test_log_append_time_topic(module_broker, topic_name):
    create_topic(module_broker.bootstrap, topic_name, 1, {"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    ck_produce(module_broker.bootstrap, topic_name, [Out(0, None, b"a", (), 1_000)])
    c = consumer(module_broker.bootstrap)
    try:
        c.assign([TopicPartition(topic_name, 0, 0)])
        m = c.poll(10)
        kind, ts = m.timestamp()
        assert kind == TIMESTAMP_LOG_APPEND_TIME and before - 1000 <= ts <= int(time.time() * 1000) + 1000
    finally:
        c.close()


# -- transactions ---------------------------------------------------------------------------------------


def _transactional_history(bootstrap: str, topic: str, codec: str = "none") -> None:
    """p0: committed a0 a1, aborted x0 x1, committed a2; plain records interleaved on p1. Markers take offsets."""
    p = CKProducer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn", "linger.ms": 5,
                    "compression.type": codec})
    p.init_transactions(15)
    p.begin_transaction()
    p.produce(topic, b"a0", partition=0)
    p.produce(topic, b"a1", partition=0)
    p.commit_transaction(15)
    p.begin_transaction()
    p.produce(topic, b"x0", partition=0)
    p.produce(topic, b"x1", partition=1)
    p.flush(15)
    ck_produce(bootstrap, topic, [Out(1, None, b"plain")])
    p.abort_transaction(15)
    p.begin_transaction()
    p.produce(topic, b"a2", partition=0)
    p.commit_transaction(15)


def values(recs: list[Rec]) -> list[tuple[int, int, bytes | None]]:
    return [(r.partition, r.offset, r.value) for r in recs]


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_read_committed_and_read_uncommitted_see_exactly_their_records(module_broker, topic, codec):
    _transactional_history(module_broker.bootstrap, topic, codec)
    seen = {}
    for level in ("read_committed", "read_uncommitted"):
        c = consumer(module_broker.bootstrap, **{"isolation.level": level})
        try:
            c.assign([TopicPartition(topic, p, 0) for p in range(2)])
            seen[level] = values(read_to_eof(c, 2))
        finally:
            c.close()
    # p0: a0 a1 (0,1) commit marker 2, x0 3, abort marker 4, a2 5, marker 6.  p1: x1 0, plain 1, abort marker 2
    assert seen["read_committed"] == [(0, 0, b"a0"), (0, 1, b"a1"), (0, 5, b"a2"), (1, 1, b"plain")]
    assert seen["read_uncommitted"] == [(0, 0, b"a0"), (0, 1, b"a1"), (0, 3, b"x0"), (0, 5, b"a2"),
                                        (1, 0, b"x1"), (1, 1, b"plain")]


def test_read_committed_stops_at_the_last_stable_offset(module_broker, topic):
    p = CKProducer({"bootstrap.servers": module_broker.bootstrap, "transactional.id": f"{topic}-open",
                    "linger.ms": 0})
    p.init_transactions(15)
    ck_produce(module_broker.bootstrap, topic, [Out(0, None, b"before")])
    p.begin_transaction()
    p.produce(topic, b"pending", partition=0)
    p.flush(15)
    ck_produce(module_broker.bootstrap, topic, [Out(0, None, b"after")])
    committed = consumer(module_broker.bootstrap)
    uncommitted = consumer(module_broker.bootstrap, **{"isolation.level": "read_uncommitted"})
    try:
        committed.assign([TopicPartition(topic, 0, 0)])
        uncommitted.assign([TopicPartition(topic, 0, 0)])
        assert values(read_to_eof(committed, 1)) == [(0, 0, b"before")]
        assert values(read_to_eof(uncommitted, 1)) == [(0, 0, b"before"), (0, 1, b"pending"), (0, 2, b"after")]
        p.commit_transaction(15)
        deadline = time.monotonic() + 15
        got: list[Rec] = []
        while len(got) < 2 and time.monotonic() < deadline:
            m = committed.poll(0.5)
            if m is not None and m.error() is None:
                got.append(rec(m))
        assert values(got) == [(0, 1, b"pending"), (0, 2, b"after")]
    finally:
        committed.close()
        uncommitted.close()


# -- positions -------------------------------------------------------------------------------------------


def _fill(bootstrap: str, topic: str, n: int, partition: int = 0, ts0: int = 1_700_000_000_000) -> None:
    ck_produce(bootstrap, topic, [Out(partition, None, b"r%d" % i, (), ts0 + 1000 * i) for i in range(n)])


@pytest.mark.parametrize("reset, first", [("earliest", 0), ("latest", None)])
def test_auto_offset_reset_without_a_committed_offset(module_broker, topic, reset, first):
    _fill(module_broker.bootstrap, topic, 5)
    c = consumer(module_broker.bootstrap, **{"auto.offset.reset": reset, "enable.partition.eof": False})
    try:
        c.assign([TopicPartition(topic, 0)])
        m = c.poll(3 if first is None else 10)
        if first is None:
            assert m is None
            assert c.position([TopicPartition(topic, 0)])[0].offset == 5
            ck_produce(module_broker.bootstrap, topic, [Out(0, None, b"new")])
            m = c.poll(10)
            assert (m.offset(), m.value()) == (5, b"new")
        else:
            assert (m.offset(), m.value()) == (0, b"r0")
    finally:
        c.close()


def test_auto_offset_reset_error_and_out_of_range(module_broker, topic):
    _fill(module_broker.bootstrap, topic, 3)
    c = consumer(module_broker.bootstrap, **{"auto.offset.reset": "error"})
    try:
        c.assign([TopicPartition(topic, 0)])
        m = c.poll(10)
        assert isinstance(m.error(), OffsetResetError)
        c.seek(TopicPartition(topic, 0, 99))
        m = c.poll(10)
        assert isinstance(m.error(), OffsetResetError) and m.error().code == 1  # OFFSET_OUT_OF_RANGE
        c.seek(TopicPartition(topic, 0, 1))
        assert c.poll(10).offset() == 1
    finally:
        c.close()
    earliest = consumer(module_broker.bootstrap, **{"auto.offset.reset": "earliest"})
    try:
        earliest.assign([TopicPartition(topic, 0, 99)])  # out of range: reset to the start
        assert earliest.poll(10).offset() == 0
    finally:
        earliest.close()


def test_seek_moves_the_next_message_and_drops_prefetched_data(module_broker, topic):
    _fill(module_broker.bootstrap, topic, 50)
    c = consumer(module_broker.bootstrap)
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        assert [c.poll(10).offset() for _ in range(3)] == [0, 1, 2]
        c.seek(TopicPartition(topic, 0, 40))
        assert c.poll(10).offset() == 40
        c.seek(TopicPartition(topic, 0, OFFSET_BEGINNING))
        assert c.poll(10).offset() == 0
        c.seek(TopicPartition(topic, 0, OFFSET_END))
        assert isinstance(c.poll(10).error(), PartitionEOF)
        assert c.position([TopicPartition(topic, 0)])[0].offset == 50
    finally:
        c.close()


def test_offsets_for_times(module_broker, topic):
    ts0 = 1_700_000_000_000
    _fill(module_broker.bootstrap, topic, 10, ts0=ts0)
    c = consumer(module_broker.bootstrap)
    try:
        found = c.offsets_for_times([TopicPartition(topic, 0, ts0 + 3500), TopicPartition(topic, 1, ts0)], 10)
        assert [(tp.partition, tp.offset) for tp in found] == [(0, 4), (1, -1)]
        assert c.offsets_for_times([TopicPartition(topic, 0, ts0 + 10**9)], 10)[0].offset == -1
        c.assign([TopicPartition(topic, 0, found[0].offset)])
        assert c.poll(10).value() == b"r4"
    finally:
        c.close()


def test_consume_returns_batches_in_order(module_broker, topic):
    _fill(module_broker.bootstrap, topic, 1000)
    c = consumer(module_broker.bootstrap, **{"enable.partition.eof": False, "max.partition.fetch.bytes": 2000,
                                             "max.poll.records": 250})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got: list[int] = []
        deadline = time.monotonic() + 20
        sizes = set()
        while len(got) < 1000 and time.monotonic() < deadline:
            batch = c.consume(300, 1.0)
            sizes.add(len(batch))
            got += [m.offset() for m in batch]
        assert max(sizes) == 250  # max.poll.records caps a call
        assert got == list(range(1000))
        assert c.consume(10, 0.3) == []
    finally:
        c.close()


def test_async_consumer_round_trip(module_broker, topic):
    outs = [Out(i % 3, b"k%d" % i, b"v%d" % i) for i in range(60)]
    want = expected_records(outs, ck_produce(module_broker.bootstrap, topic, outs))

    async def main() -> list[Rec]:
        async with AsyncConsumer({"bootstrap.servers": module_broker.bootstrap, "fetch.wait.max.ms": 100}) as c:
            await c.assign([TopicPartition(topic, p, 0) for p in range(3)])
            got: list[Rec] = []
            while len(got) < 60:
                m = await c.poll(10)
                assert m is not None and m.error() is None
                got.append(rec(m))
            assert await c.poll(0.3) is None
            assert [tp.offset for tp in c.position([TopicPartition(topic, p) for p in range(3)])] == [20, 20, 20]
            return sorted(got, key=lambda r: (r.partition, r.offset))

    got = asyncio.run(main())
    assert [r._replace(timestamp=None) for r in got] == [r._replace(timestamp=None) for r in want]


def test_prefetch_keeps_one_more_fetch_ready_and_no_more(module_broker, topic):
    """While the application works through one fetched chunk, the next is fetched; then fetching pauses."""
    # batches of 10 records (10 KB): a 20 KB fetch holds about two of them
    ck_produce(module_broker.bootstrap, topic, [Out(0, None, b"x" * 1000) for _ in range(400)],
               **{"batch.num.messages": 10})
    c = consumer(module_broker.bootstrap, **{"max.partition.fetch.bytes": 20_000, "enable.partition.eof": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        assert c.poll(10).offset() == 0
        state = c._feed.fetcher.states[(topic, 0)]

        def buffered() -> int:
            return state.chunks_put - state.chunks_done

        deadline = time.monotonic() + 10
        while buffered() < 2:
            assert time.monotonic() < deadline, "the next chunk was not prefetched"
            time.sleep(0.02)
        time.sleep(0.5)
        assert buffered() == 2 and state.chunks_put == 2  # bounded: nothing more while the application is idle
        first_chunk = len(c._feed.cur.records)
        for expected in range(1, first_chunk + 1):  # finish chunk 1, take the first message of chunk 2
            assert c.poll(10).offset() == expected
        deadline = time.monotonic() + 10
        while state.chunks_put < 3:
            assert time.monotonic() < deadline, "finishing a chunk did not start the next fetch"
            time.sleep(0.02)
    finally:
        c.close()


def test_incremental_assign_and_unassign_leave_other_partitions_alone(module_broker, topic):
    for p in range(3):
        _fill(module_broker.bootstrap, topic, 10, partition=p)
    c = consumer(module_broker.bootstrap, **{"enable.partition.eof": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        assert [c.poll(10).offset() for _ in range(4)] == [0, 1, 2, 3]
        c.incremental_assign([TopicPartition(topic, 1, 7)])
        got = sorted((m.partition(), m.offset()) for m in (c.poll(10) for _ in range(9)))
        assert got == [(0, o) for o in range(4, 10)] + [(1, 7), (1, 8), (1, 9)]  # p0 went on from 4
        c.incremental_unassign([TopicPartition(topic, 0)])
        assert sorted(tp.partition for tp in c.assignment()) == [1]
        c.incremental_assign([TopicPartition(topic, 2, OFFSET_BEGINNING)])
        assert [(m.partition(), m.offset()) for m in (c.poll(10) for _ in range(10))] == [(2, o) for o in range(10)]
        assert c.poll(0.5) is None
    finally:
        c.close()
