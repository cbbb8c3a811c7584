"""Our producer against a real broker: what it writes is exactly what other clients read, delivery reports tell
the truth, keys land where the Java client (and librdkafka's murmur2) would put them."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from tests.integration.client.producer_support import Reports, data_values, log_batches, producer
from tests.integration.helpers import Rec, ck_consume, ck_producer, create_topic, kcat_consume, kcat_path

from oncelog.client.admin import Admin
from oncelog.client.errors import KafkaError
from oncelog.client.partitioner import partition_for_key
from oncelog.client.producer import AsyncProducer

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_read_by_confluent_kafka(module_broker, topic_name, codec):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 3)
    reports = Reports()
    p = producer(bs, compression_type=codec)
    sent = []
    for i in range(300):
        key = None if i % 5 == 0 else f"key-{i % 17}".encode()
        headers = [("h", f"{i}".encode()), ("empty", None)] if i % 3 == 0 else None
        value = f"value-{i}".encode() * (1 + i % 4)
        ts = 1_700_000_000_000 + i
        p.produce(topic_name, value, key=key, headers=headers, timestamp=ts, on_delivery=reports)
        sent.append((key, value, tuple(headers or ()), ts))
    assert p.flush(30) == 0
    p.close()
    assert reports.errors() == []
    assert reports.threads == {threading.get_ident()}, "callbacks must run on the caller's thread"
    by_value = {m.value(): m for m in reports.delivered()}  # reports come per batch, not in produce order
    assert len(by_value) == 300
    expected = []
    for k, v, h, ts in sent:
        m = by_value[v]
        assert (m.topic(), m.key(), m.timestamp(), tuple(m.headers() or ())) == (topic_name, k, (1, ts), h)
        assert 0 < m.latency() < 30 and m.error() is None and len(m) == len(v)
        if k is not None:
            assert m.partition() == partition_for_key(k, 3)
        expected.append(Rec(m.partition(), m.offset(), k, v, h, ts))
    expected.sort(key=lambda r: (r.partition, r.offset))
    got = ck_consume(bs, topic_name, {0: 0, 1: 0, 2: 0})
    assert got == expected
    # per partition the offsets are dense from 0: nothing lost, nothing twice
    for part in range(3):
        offsets = [r.offset for r in got if r.partition == part]
        assert offsets == list(range(len(offsets)))


@pytest.mark.skipif(kcat_path() is None, reason="kcat not installed")
def test_read_by_kcat(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    p = producer(bs, compression_type="lz4")
    for i in range(50):
        p.produce(topic_name, f"v{i}", key=f"k{i}", headers={"n": str(i)}, timestamp=1_700_000_000_000 + i)
    assert p.flush(30) == 0
    p.close()
    got = kcat_consume(bs, topic_name, 0)
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in got] == [
        (i, f"k{i}".encode(), f"v{i}".encode(), (("n", str(i).encode()),), 1_700_000_000_000 + i)
        for i in range(50)]


def test_keys_land_where_librdkafka_murmur2_puts_them(module_broker, topic_name):
    """The same key bytes go to the same partition with librdkafka's Java-compatible partitioner and ours."""
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 7)
    keys = [f"user-{i}".encode() for i in range(200)] + [b"", b"a", b"ab", b"abc", bytes(range(256))]
    theirs: dict[bytes, int] = {}
    ck = ck_producer(bs, partitioner="murmur2_random")
    for k in keys:
        ck.produce(topic_name, b"x", key=k, on_delivery=lambda err, msg, k=k: theirs.__setitem__(k, msg.partition()))
    assert ck.flush(30) == 0
    ours = Reports()
    p = producer(bs)
    for k in keys:
        p.produce(topic_name, b"y", key=k, on_delivery=ours)
    assert p.flush(30) == 0
    p.close()
    assert {m.key(): m.partition() for m in ours.delivered()} == theirs
    assert len(set(theirs.values())) == 7


def test_keyless_records_fill_whole_batches(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 4)
    p = producer(bs, linger_ms=1000, batch_num_messages=100)
    reports = Reports()
    for i in range(400):
        p.produce(topic_name, f"{i}", on_delivery=reports)
    assert p.flush(30) == 0
    p.close()
    where = {int(m.value()): m.partition() for m in reports.delivered()}
    runs: list[list[int]] = []
    for i in range(400):  # in produce order
        if not runs or runs[-1][0] != where[i]:
            runs.append([where[i], 0])
        runs[-1][1] += 1
    assert [n for _, n in runs] == [100] * 4, "keyless records stick to one partition per batch"
    batches = [b for part in range(4) for b in log_batches(bs, topic_name, part)]
    assert sorted(b.header.record_count for b in batches) == [100] * 4


def test_idempotent_batches_carry_consecutive_sequences(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    p = producer(bs, batch_num_messages=7, max_in_flight_requests_per_connection=20)
    for i in range(100):
        p.produce(topic_name, f"{i}")
    assert p.flush(30) == 0
    p.close()
    batches = log_batches(bs, topic_name)
    assert data_values(batches) == [f"{i}".encode() for i in range(100)]
    pids = {b.producer_id for b in batches}
    assert len(pids) == 1 and pids.pop() >= 0
    seq = 0
    for b in batches:
        assert (b.producer_epoch, b.base_sequence) == (0, seq)
        seq += b.header.record_count


def test_produce_errors_surface(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2)
    p = producer(bs, queue_buffering_max_messages=10, linger_ms=10000)
    with pytest.raises(KafkaError):
        p.produce(topic_name, b"x", partition=5)
    with pytest.raises(TypeError):
        p.produce(topic_name, 12)
    for _ in range(10):
        p.produce(topic_name, b"x", partition=0)
    with pytest.raises(BufferError):
        p.produce(topic_name, b"x", partition=0)
    assert len(p) == 10
    assert p.flush(30) == 0 and len(p) == 0
    p.close()


def test_partitions_added_later_are_used(module_broker, topic_name):
    """CreatePartitions grows the topic under running producers: keys are spread over the new count once the
    periodic refresh (metadata.max.age.ms) has seen it, and an explicit partition past the known count refreshes
    metadata instead of failing, as Kafka's clients do."""
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    reports = Reports()
    p = producer(bs, metadata_max_age_ms=300)
    explicit = producer(bs)  # default max age: only the explicit partition makes it look again
    for q in (p, explicit):
        q.produce(topic_name, b"before", key=b"k0", on_delivery=reports)
        assert q.flush(10) == 0
    with Admin({"bootstrap.servers": bs}) as admin:
        admin.create_partitions(topic_name, 4)
    time.sleep(1.0)  # past metadata.max.age.ms: the periodic refresh has run
    keys = [f"k{i}".encode() for i in range(40)]
    for k in keys:
        p.produce(topic_name, b"after", key=k, on_delivery=reports)
    explicit.produce(topic_name, b"explicit", partition=3, on_delivery=reports)
    for q in (p, explicit):
        assert q.flush(10) == 0
        q.close()
    assert reports.errors() == []
    got = {(m.value(), m.key()): m.partition() for m in reports.delivered()}
    assert got[(b"before", b"k0")] == 0 and got[(b"explicit", None)] == 3
    assert {k: got[(b"after", k)] for k in keys} == {k: partition_for_key(k, 4) for k in keys}


def test_async_producer(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2)

    async def scenario():
        async with AsyncProducer({"bootstrap.servers": bs, "linger.ms": 1}) as p:
            first = await p.send(topic_name, b"one", key=b"k")
            futures = [await p.produce(topic_name, f"{i}".encode(), key=b"k") for i in range(50)]
            reports = await asyncio.gather(*futures)
            assert await p.flush(10) == 0
        return first, reports

    first, reports = asyncio.run(asyncio.wait_for(scenario(), 60))
    part = partition_for_key(b"k", 2)
    assert (first.partition(), first.offset(), first.value()) == (part, 0, b"one")
    assert [(m.partition(), m.offset()) for m in reports] == [(part, i + 1) for i in range(50)]
    got = ck_consume(bs, topic_name, {part: 0})
    assert [r.value for r in got] == [b"one"] + [f"{i}".encode() for i in range(50)]


def test_a_lone_record_goes_out_after_linger_ms(module_broker, topic_name):
    """Nothing else arrives to fill the batch: the sender must wake when linger.ms is up, not at some later
    housekeeping tick."""
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    p = producer(bs, linger_ms=20)
    p.produce(topic_name, b"warm")
    assert p.flush(15) == 0
    latencies = []
    for _ in range(10):
        done: list[int] = []
        started = time.monotonic()
        p.produce(topic_name, b"x", on_delivery=lambda err, msg, done=done: done.append(1))
        while not done:
            p.poll(0.001)
        latencies.append(time.monotonic() - started)
    p.close()
    assert sorted(latencies)[5] < 0.5, latencies  # the bug this guards against waited ~1 s


def test_many_threads_share_one_producer(module_broker, topic_name):
    """produce() from several threads at once: every record delivered once, each thread's records of a key in
    the order that thread produced them, and each thread's callbacks on its own poll()/flush()."""
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 3)
    p = producer(bs, batch_num_messages=50)
    per_thread = 2000
    reports = {n: Reports() for n in range(4)}

    def work(n: int) -> None:
        for i in range(per_thread):
            p.produce(topic_name, f"{n}:{i}", key=f"t{n}".encode(), on_delivery=reports[n])
            if i % 200 == 0:
                p.poll(0)
        p.flush(30)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert p.flush(30) == 0
    p.close()
    assert sum(len(r.items) for r in reports.values()) == 4 * per_thread
    assert all(not r.errors() for r in reports.values())
    got = ck_consume(bs, topic_name, {0: 0, 1: 0, 2: 0})
    assert len(got) == len({r.value for r in got}) == 4 * per_thread
    for n in range(4):
        mine = [int(r.value.split(b":")[1]) for r in got if r.key == f"t{n}".encode()]
        assert mine == list(range(per_thread))


def test_async_producer_transactions(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)

    async def scenario():
        p = await AsyncProducer.create({"bootstrap.servers": bs, "transactional.id": f"atx-{topic_name}"})
        await p.init_transactions(15)
        await p.begin_transaction()
        futures = [await p.produce(topic_name, f"c{i}", partition=0) for i in range(5)]
        await p.commit_transaction(15)
        offsets = [f.result().offset() for f in futures]
        await p.begin_transaction()
        await p.produce(topic_name, b"aborted", partition=0)
        await p.flush(10)
        await p.abort_transaction(15)
        await p.close()
        return offsets

    offsets = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert offsets == [0, 1, 2, 3, 4]
    got = ck_consume(bs, topic_name, {0: 0}, **{"isolation.level": "read_committed"})
    assert [r.value for r in got] == [f"c{i}".encode() for i in range(5)]
