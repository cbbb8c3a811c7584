"""Round trips through the broker with unmodified clients: confluent-kafka (librdkafka), kafka-python,
aiokafka and kcat.

Every test compares exact record lists: partition, offset, key, value, headers (order, duplicates and
null values included) and, where the client can set it, the CreateTime timestamp; and every consumer
reads to the high watermark, so an extra, missing or reordered record fails the test.
"""

from __future__ import annotations

import os
import random
import string
import threading
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka.protocol.consumer import FetchRequest
from tests.integration.helpers import (
    Out,
    Rec,
    Wire,
    aio_consume,
    aio_produce,
    ck_consume,
    ck_produce,
    create_topic,
    expected_records,
    fetch_raw,
    in_log_order,
    kcat_consume,
    kcat_produce,
    kp_consume,
    kp_produce,
    produce_raw,
    wait_until,
)

from oncelog.records.builder import build_batch

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
BASE_TS = 1_700_000_000_000


def _kafka_python_has(codec: str) -> bool:
    import kafka.codec as kc

    return {"none": True, "gzip": kc.has_gzip(), "snappy": kc.has_snappy(), "lz4": kc.has_lz4(),
            "zstd": kc.has_zstd()}[codec]


def sample(partitions: int, count: int, tag: str, *, null_headers: bool = True, both_null: bool = True,
           seed: int = 0, text: bool = False) -> list[Out]:
    """Records with keys, null keys, null values, empty values, repeated and null header values.

    kafka-python refuses null header values (`null_headers=False`); kafka-python and aiokafka refuse a record
    with neither key nor value (`both_null=False`).
    `text`: printable values only (with JSON's special characters), for kcat's JSON output.
    """
    rnd = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + ' "\\/{}[],:'

    def filler(n: int) -> bytes:
        if text:
            return "".join(rnd.choice(alphabet) for _ in range(n)).encode()
        return bytes(rnd.randrange(256) for _ in range(n))

    outs = []
    for i in range(count):
        key = None if i % 7 == 3 else f"{tag}-key-{i}".encode()
        if i % 5 == 2:
            value = None
        elif i % 11 == 4:
            value = b""
        else:
            value = f"{tag}-value-{i}-".encode() + filler(rnd.randrange(0, 300))
        if key is None and value is None and not both_null:
            value = b"this client needs a key or a value"
        if i % 3 == 0:
            headers: tuple = ()
        else:
            headers = (("trace", f"{i}".encode()), ("null-or-empty", None if null_headers else b""),
                       ("trace", b"second value, same key"), ("bin", filler(i % 17)))
        outs.append(Out(i % partitions, key, value, headers, BASE_TS + i * 1000 + rnd.randrange(1000)))
    return outs


def ordered(recs: list[Rec]) -> list[Rec]:
    return sorted(recs, key=lambda r: (r.partition, r.offset))


# -- one client, all codecs -------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_roundtrip(module_broker, topic_name, codec):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 3)
    outs = sample(3, 90, "ck")
    acked = ck_produce(bs, topic_name, outs, **{"compression.type": codec})
    want = in_log_order(outs)
    assert expected_records(outs, acked) == want  # the acknowledged offsets are 0, 1, 2, ... per partition
    assert ck_consume(bs, topic_name, {0: 0, 1: 0, 2: 0}) == want
    # A read from the middle of a (compressed) batch starts at exactly that offset.
    assert ck_consume(bs, topic_name, {1: 17}) == [r for r in want if r.partition == 1 and r.offset >= 17]


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_roundtrip(module_broker, topic_name, codec):
    if not _kafka_python_has(codec):
        pytest.skip(f"kafka-python has no {codec} codec installed (needs python-snappy/lz4/zstandard)")
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2)
    outs = sample(2, 60, "kp", null_headers=False, both_null=False)  # kafka-python refuses None header values
    acked = kp_produce(bs, topic_name, outs, compression_type=None if codec == "none" else codec)
    want = in_log_order(outs)
    assert expected_records(outs, acked) == want
    assert kp_consume(bs, topic_name, {0: 0, 1: 0}) == want
    assert kp_consume(bs, topic_name, {0: 11}) == [r for r in want if r.partition == 0 and r.offset >= 11]


@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_roundtrip(module_broker, topic_name, codec):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2)
    outs = sample(2, 60, "aio", both_null=False)
    acked = aio_produce(bs, topic_name, outs, compression_type=None if codec == "none" else codec)
    want = in_log_order(outs)
    assert expected_records(outs, acked) == want
    assert aio_consume(bs, topic_name, {0: 0, 1: 0}) == want
    assert aio_consume(bs, topic_name, {1: 20}) == [r for r in want if r.partition == 1 and r.offset >= 20]


@pytest.mark.parametrize("codec", CODECS)
def test_kcat_roundtrip(module_broker, topic_name, codec):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2)
    lines = [(None if i % 4 == 1 else f"key-{i}", f"value {i} " + "x" * i) for i in range(40)]
    kcat_produce(bs, topic_name, 1, lines, headers=["a=1", "nullhdr", "a=2"],
                 codec=None if codec == "none" else codec)
    headers = (("a", b"1"), ("nullhdr", None), ("a", b"2"))
    want = [Rec(1, i, None if k is None else k.encode(), v.encode(), headers) for i, (k, v) in enumerate(lines)]
    got = kcat_consume(bs, topic_name, 1)
    assert [r._replace(timestamp=None) for r in got] == want
    assert kcat_consume(bs, topic_name, 0) == []
    # kcat agrees with librdkafka's consumer (timestamps included) and can start mid-log.
    assert ck_consume(bs, topic_name, {1: 0}) == got
    assert kcat_consume(bs, topic_name, 1, start=33) == got[33:]


# -- across clients ---------------------------------------------------------------------------------------


def test_cross_client(module_broker, topic_name):
    """Each client produces one partition with its own codec; every client reads all four back."""
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 4)
    ck_outs = [o._replace(partition=0) for o in sample(1, 30, "ck", seed=1, text=True)]
    kp_outs = [o._replace(partition=1) for o in sample(1, 30, "kp", null_headers=False, both_null=False, seed=2, text=True)]
    aio_outs = [o._replace(partition=2) for o in sample(1, 30, "aio", both_null=False, seed=3, text=True)]
    kp_codec = "gzip"  # the one codec kafka-python has without extra packages
    assert ck_produce(bs, topic_name, ck_outs, **{"compression.type": "zstd"}) == [(0, i) for i in range(30)]
    assert kp_produce(bs, topic_name, kp_outs, compression_type=kp_codec) == [(1, i) for i in range(30)]
    assert aio_produce(bs, topic_name, aio_outs, compression_type="lz4") == [(2, i) for i in range(30)]
    lines = [(f"kcat-{i}" if i % 3 else None, f"kcat value {i}") for i in range(30)]
    kcat_produce(bs, topic_name, 3, lines, headers=["origin=kcat", "empty"], codec="snappy")
    kcat_recs = [Rec(3, i, None if k is None else k.encode(), v.encode(), (("origin", b"kcat"), ("empty", None)))
                 for i, (k, v) in enumerate(lines)]

    want = in_log_order(ck_outs + kp_outs + aio_outs)
    starts = {0: 0, 1: 0, 2: 0, 3: 0}

    def check(got: list[Rec]) -> None:
        assert [r for r in got if r.partition < 3] == want
        assert [r._replace(timestamp=None) for r in got if r.partition == 3] == kcat_recs

    by_ck = ck_consume(bs, topic_name, starts)
    check(by_ck)
    # kafka-python reads the partitions whose codec it has (gzip is built in; the others need the dev extras)
    codec_of = {0: "zstd", 1: kp_codec, 2: "lz4", 3: "snappy"}
    kp_parts = {p: 0 for p, codec in codec_of.items() if _kafka_python_has(codec)}
    by_kp = kp_consume(bs, topic_name, kp_parts)
    assert by_kp == [r for r in by_ck if r.partition in kp_parts]
    by_aio = aio_consume(bs, topic_name, starts)
    check(by_aio)
    # aiokafka reads the kcat records' timestamps exactly as librdkafka does
    assert by_aio == by_ck
    by_kcat = [r for p in range(4) for r in kcat_consume(bs, topic_name, p)]
    assert by_kcat == by_ck


# -- large messages ---------------------------------------------------------------------------------------

LARGE = 900 * 1024


def test_large_messages_across_clients(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 4)
    rnd = random.Random(7)
    ck_outs = [Out(0, b"ck-big-%d" % i, os.urandom(LARGE), (("n", b"%d" % i),), BASE_TS + i) for i in range(3)]
    # Compressible: 900 KB values that zstd shrinks to a few KB, inflated again by every consumer.
    ck_zstd = [Out(1, b"ck-zstd-%d" % i, (b"abcdefgh%d" % i) * (LARGE // 9), (), BASE_TS + i) for i in range(2)]
    kp_outs = [Out(2, b"kp-big-%d" % i, os.urandom(LARGE), (("n", b"%d" % i),), BASE_TS + i) for i in range(3)]
    aio_outs = [Out(3, b"aio-big-%d" % i, os.urandom(LARGE), (("n", None),), BASE_TS + i) for i in range(3)]
    assert ck_produce(bs, topic_name, ck_outs, **{"linger.ms": 0}) == [(0, 0), (0, 1), (0, 2)]
    assert ck_produce(bs, topic_name, ck_zstd, **{"compression.type": "zstd"}) == [(1, 0), (1, 1)]
    assert kp_produce(bs, topic_name, kp_outs) == [(2, 0), (2, 1), (2, 2)]
    assert aio_produce(bs, topic_name, aio_outs) == [(3, 0), (3, 1), (3, 2)]
    want = in_log_order(ck_outs + ck_zstd + kp_outs + aio_outs)
    assert ck_consume(bs, topic_name, {0: 0, 1: 0, 2: 0, 3: 0}) == want
    kp_parts = [0, 1, 2, 3] if _kafka_python_has("zstd") else [0, 2, 3]
    assert kp_consume(bs, topic_name, {p: 0 for p in kp_parts}) == [r for r in want if r.partition in kp_parts]
    assert aio_consume(bs, topic_name, {0: 0, 1: 0, 2: 0, 3: 0}) == want

    text = ["".join(rnd.choice(string.ascii_letters) for _ in range(LARGE)) for _ in range(2)]
    other = f"{topic_name}-kcat"
    create_topic(bs, other, 1)
    kcat_produce(bs, other, 0, [("big-0", text[0]), ("big-1", text[1])], codec="lz4")
    got = kcat_consume(bs, other, 0)
    assert [(r.offset, r.key, r.value) for r in got] == [(0, b"big-0", text[0].encode()), (1, b"big-1", text[1].encode())]


# -- many partitions --------------------------------------------------------------------------------------


def test_many_partitions(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 32)
    outs = [Out(i % 32, b"k%d" % i, b"v%d" % i, (("p", b"%d" % (i % 32)),), BASE_TS + i) for i in range(32 * 6)]
    acked = ck_produce(bs, topic_name, outs, **{"compression.type": "lz4"})
    want = in_log_order(outs)
    assert expected_records(outs, acked) == want
    starts = {p: 0 for p in range(32)}
    assert ck_consume(bs, topic_name, starts) == want
    assert kp_consume(bs, topic_name, starts) == want
    # Per-partition end offsets: exactly 6 in each.
    consumer = Consumer({"bootstrap.servers": bs, "group.id": "x"})
    try:
        marks = [consumer.get_watermark_offsets(TopicPartition(topic_name, p), timeout=10) for p in range(32)]
    finally:
        consumer.close()
    assert marks == [(0, 6)] * 32


# -- acks -------------------------------------------------------------------------------------------------


def _produce_with(client: str, bs: str, topic: str, outs: list[Out], acks: str) -> list[tuple[int, int]]:
    if client == "confluent":
        return ck_produce(bs, topic, outs, acks=acks)
    if client == "kafka-python":
        return kp_produce(bs, topic, outs, acks={"0": 0, "1": 1, "all": "all"}[acks])
    return aio_produce(bs, topic, outs, acks={"0": 0, "1": 1, "all": "all"}[acks])


@pytest.mark.parametrize("acks", ["0", "1", "all"])
@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
def test_acks(module_broker, topic_name, client, acks):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2)
    outs = sample(2, 40, f"{client}-{acks}", null_headers=client != "kafka-python",
                  both_null=client == "confluent")
    acked = _produce_with(client, bs, topic_name, outs, acks)
    want = in_log_order(outs)
    if acks != "0":
        assert expected_records(outs, acked) == want
    else:
        # Nothing is acknowledged with acks=0; the records still land, in order.
        consumer = Consumer({"bootstrap.servers": bs, "group.id": "x"})
        try:
            wait_until(lambda: all(consumer.get_watermark_offsets(TopicPartition(topic_name, p), timeout=5) == (0, 20)
                                   for p in (0, 1)), what="acks=0 records to arrive")
        finally:
            consumer.close()
    assert ck_consume(bs, topic_name, {0: 0, 1: 0}) == want


def test_consumer_waits_for_new_records(module_broker, topic_name):
    """A consumer at the end of the log gets a record produced later (long-poll fetch), promptly."""
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    consumer = Consumer({"bootstrap.servers": bs, "group.id": "x", "fetch.wait.max.ms": 5000,
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic_name, 0, 0)])
        assert consumer.poll(1.0) is None
        ck_produce(bs, topic_name, [Out(0, b"late", b"arrival")])
        started = time.monotonic()
        msg = None
        while msg is None and time.monotonic() - started < 10:
            msg = consumer.poll(0.5)
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    assert msg is not None and msg.error() is None
    assert (msg.offset(), msg.key(), msg.value()) == (0, b"late", b"arrival")
    assert elapsed < 3.0, f"the long poll answered after {elapsed:.1f}s, not when the record arrived"


def test_concurrent_producers_one_partition(module_broker, topic_name):
    """Several producers (connections) appending to one partition at once, acks=all and acks=1 mixed: every
    record gets its own offset, the offsets form one gap-free run, and each producer's records keep its order."""
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    results: dict[int, list[tuple[int, int]]] = {}
    outs = {n: [Out(0, b"producer-%d" % n, b"%d-%04d" % (n, i)) for i in range(300)] for n in range(4)}

    def run(n: int) -> None:
        results[n] = ck_produce(bs, topic_name, outs[n], acks="all" if n % 2 else "1", **{"linger.ms": n})

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1, 2, 3]
    offsets = sorted(o for acked in results.values() for _, o in acked)
    assert offsets == list(range(1200))
    for n, acked in results.items():
        assert [o for _, o in acked] == sorted(o for _, o in acked), f"producer {n} reordered"
    got = ck_consume(bs, topic_name, {0: 0})
    by_offset = {r.offset: (r.key, r.value) for r in got}
    assert len(got) == 1200
    for n, acked in results.items():
        assert [by_offset[o] for _, o in acked] == [(out.key, out.value) for out in outs[n]]


def test_fetch_size_limits(module_broker, topic_name):
    """Raw Fetch: whole batches within partition_max_bytes and max_bytes, at least one batch (KIP-74),
    an empty answer at the high watermark and OFFSET_OUT_OF_RANGE past it."""


    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2)
    with Wire(bs) as w:
        batch_size = len(build_batch([(b"k", b"x" * 1000)]))
        for p in (0, 1):
            for i in range(5):
                part = produce_raw(w, topic_name, p, build_batch([(b"k", b"x" * 999 + b"%d" % i)]))
                assert (part.error_code, part.base_offset) == (0, i)
        for limit, batches in ((10, 1), (batch_size - 1, 1), (batch_size, 1), (2 * batch_size + 5, 2),
                               (10 * batch_size, 5)):
            part = fetch_raw(w, topic_name, 0, 0, max_bytes=limit)
            assert (part.error_code, part.high_watermark, len(part.records)) == (0, 5, batches * batch_size)
        part = fetch_raw(w, topic_name, 0, 3, max_bytes=10 * batch_size)
        assert len(part.records) == 2 * batch_size
        part = fetch_raw(w, topic_name, 0, 5)
        assert (part.error_code, part.records) == (0, b"")
        part = fetch_raw(w, topic_name, 0, 6)
        assert (part.error_code, part.high_watermark, part.log_start_offset) == (1, 5, 0)
        # The response limit spans partitions; the first partition still gets a batch when it alone is larger.
        req = FetchRequest[11]
        ft = req.FetchTopic
        fp = ft.FetchPartition

        def both(max_bytes: int) -> list[int]:
            resp = w.request(req(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes, isolation_level=0,
                                 session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                                 topics=[ft(topic=topic_name, partitions=[
                                     fp(partition=p, fetch_offset=0, log_start_offset=-1, partition_max_bytes=1 << 20,
                                        current_leader_epoch=-1) for p in (0, 1)])]), 11)
            (t,) = resp.responses
            assert [p.error_code for p in t.partitions] == [0, 0]
            return [len(p.records or b"") for p in t.partitions]

        assert both(1 << 20) == [5 * batch_size, 5 * batch_size]
        assert both(7 * batch_size) == [5 * batch_size, 2 * batch_size]
        assert both(10) == [batch_size, 0]
