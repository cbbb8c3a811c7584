"""compression.type is honoured: a batch whose codec is not the topic's is stored rebuilt in the topic's codec
(Kafka's LogValidator), with every record, offset, timestamp and producer field unchanged; a batch already in the
topic's codec, or any batch under 'producer', is stored as sent. Checked on the raw batches a Fetch returns.
"""

from __future__ import annotations

import time
import zlib

import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from tests.integration.helpers import (
    Out,
    Wire,
    admin,
    ck_consume,
    ck_produce,
    create_topic,
    fetch_raw,
    kp_produce,
    produce_raw,
)
from tests.integration.test_idempotence_rules import init_pid

from oncelog.records.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    HEADER_SIZE,
    OFF_MAGIC,
    iter_headers,
)
from oncelog.records.builder import build_batch
from oncelog.records.compression import inflate_batch

NONE = 0
MESSAGE_TOO_LARGE = 10
CODECS = {"uncompressed": COMPRESSION_NONE, "gzip": COMPRESSION_GZIP, "snappy": COMPRESSION_SNAPPY,
          "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD}


def stored(bootstrap: str, topic: str, offset: int = 0) -> list[tuple[int, bytes, list[tuple]]]:
    """Every stored batch from `offset`: (header, raw bytes, [(offset, timestamp, key, value, headers)])."""
    with Wire(bootstrap) as w:
        part = fetch_raw(w, topic, 0, offset)
    assert part.error_code == NONE
    data = bytes(part.records or b"")
    out = []
    for pos, header in iter_headers(data):
        raw = data[pos:pos + header.size]
        records = [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers))
                   for r in DefaultRecordBatch(inflate_batch(raw))]
        out.append((header, raw, records))
    return out


def outs(n: int, ts: int, null_header: bytes | None = None) -> list[Out]:
    """Records with a key or none, a value or none (a tombstone), headers (one null where the client allows it),
    own timestamps."""
    return [Out(0, None if i % 3 == 0 else b"k%d" % i, None if i % 4 == 1 and i % 3 else b"value-%d " % i * 20,
                (("h", b"x%d" % i), ("empty", null_header)) if i % 2 else (), ts + i)
            for i in range(n)]


def as_stored(sent: list[Out]) -> list[tuple]:
    return [(i, o.timestamp, o.key, o.value, o.headers) for i, o in enumerate(sent)]


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
@pytest.mark.parametrize("codec", list(CODECS))
def test_uncompressed_batches_are_stored_in_the_topic_codec(module_broker, topic_name, codec, client):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, config={"compression.type": codec})
    sent = outs(40, int(time.time() * 1000) - 5000, None if client == "confluent" else b"")
    if client == "confluent":
        acked = ck_produce(bs, topic_name, sent, **{"compression.type": "none", "linger.ms": 50})
    else:
        acked = kp_produce(bs, topic_name, sent, compression_type=None, linger_ms=50)
    assert acked == [(0, i) for i in range(40)]
    batches = stored(bs, topic_name)
    assert {header.compression for header, _, _ in batches} == {CODECS[codec]}
    assert [r for _, _, records in batches for r in records] == as_stored(sent)
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in ck_consume(bs, topic_name, {0: 0})] == \
        [(i, o.key, o.value, o.headers, o.timestamp) for i, o in enumerate(sent)]


def test_idempotent_batches_keep_producer_fields_and_retries_dedupe(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, config={"compression.type": "zstd"})
    ts = int(time.time() * 1000)
    with Wire(bs) as w:
        pid, epoch = init_pid(w)
        first = build_batch([(b"a", b"1", (), ts), (b"b", b"2", (), ts + 1)], producer_id=pid, producer_epoch=epoch,
                            base_sequence=0)
        second = build_batch([(b"c", None, (("h", b"v"),), ts + 2)], producer_id=pid, producer_epoch=epoch,
                             base_sequence=2, transactional=False)
        assert produce_raw(w, topic_name, 0, first).base_offset == 0
        assert produce_raw(w, topic_name, 0, second).base_offset == 2
        retry = produce_raw(w, topic_name, 0, first)        # an exact retry: its original offset, nothing appended
        assert (retry.error_code, retry.base_offset) == (NONE, 0)
    batches = stored(bs, topic_name)
    assert [(h.compression, h.producer_id, h.producer_epoch, h.base_sequence, h.base_offset, h.record_count)
            for h, _, _ in batches] == [(COMPRESSION_ZSTD, pid, epoch, 0, 0, 2), (COMPRESSION_ZSTD, pid, epoch, 2, 2, 1)]
    assert [r for _, _, records in batches for r in records] == [
        (0, ts, b"a", b"1", ()), (1, ts + 1, b"b", b"2", ()), (2, ts + 2, b"c", None, (("h", b"v"),))]


def test_gzip_batch_into_uncompressed_topic_is_stored_uncompressed(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, config={"compression.type": "uncompressed"})
    ts = int(time.time() * 1000)
    records = [(b"k%d" % i, b"v" * 100, (("h", None),), ts + i) for i in range(5)]
    sent = build_batch(records, compression=COMPRESSION_GZIP)
    with Wire(bs) as w:
        assert produce_raw(w, topic_name, 0, sent).error_code == NONE
    ((header, raw, got),) = stored(bs, topic_name)
    assert header.compression == COMPRESSION_NONE
    assert raw[HEADER_SIZE:] == bytes(build_batch(records))[HEADER_SIZE:]   # the uncompressed records, as built
    assert got == [(i, ts + i, b"k%d" % i, b"v" * 100, (("h", None),)) for i in range(5)]


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_matching_codec_is_stored_byte_identical(module_broker, topic_name, codec):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, config={"compression.type": codec})
    sent = bytes(build_batch([(b"k", b"v" * 500, (), int(time.time() * 1000))] * 3, compression=CODECS[codec]))
    with Wire(bs) as w:
        assert produce_raw(w, topic_name, 0, sent).error_code == NONE
    ((_, raw, _),) = stored(bs, topic_name)
    # Base offset 0 as sent; the leader epoch (bytes 12-15) is the broker's, everything from the magic on is the same.
    assert raw[:12] == sent[:12] and raw[OFF_MAGIC:] == sent[OFF_MAGIC:]


def test_producer_keeps_what_came(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name)   # compression.type=producer, the default
    ts = int(time.time() * 1000)
    with Wire(bs) as w:
        for codec in (COMPRESSION_NONE, COMPRESSION_LZ4, COMPRESSION_GZIP):
            assert produce_raw(w, topic_name, 0, build_batch([(None, b"v", (), ts)], compression=codec)).error_code == 0
    assert [h.compression for h, _, _ in stored(bs, topic_name)] == [COMPRESSION_NONE, COMPRESSION_LZ4,
                                                                     COMPRESSION_GZIP]


def test_altered_compression_type_applies_to_next_batches(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name)
    ts = int(time.time() * 1000)
    with Wire(bs) as w:
        assert produce_raw(w, topic_name, 0, build_batch([(None, b"before", (), ts)])).error_code == NONE
        resource = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
            ConfigEntry("compression.type", "lz4", incremental_operation=AlterConfigOpType.SET)])
        client = admin(bs)
        (future,) = client.incremental_alter_configs([resource]).values()
        future.result(timeout=15)
        assert produce_raw(w, topic_name, 0, build_batch([(None, b"after", (), ts)])).error_code == NONE
    assert [(h.compression, records[0][3]) for h, _, records in stored(bs, topic_name)] == [
        (COMPRESSION_NONE, b"before"), (COMPRESSION_LZ4, b"after")]


def test_broker_default_compression_type_and_levels(broker_factory, topic_name):
    """The broker's compression.type is every topic's default; compression.gzip.level sets the level it uses."""
    broker = broker_factory({"compression.type": "gzip", "compression.gzip.level": 1})
    bs = broker.bootstrap
    create_topic(bs, topic_name)
    create_topic(bs, topic_name + "-9", config={"compression.gzip.level": "9"})
    text = b" ".join(b"record %d of a compressible batch with repeated words" % i for i in range(400))
    records = [(None, text, (), int(time.time() * 1000))]
    with Wire(bs) as w:
        for name in (topic_name, topic_name + "-9"):
            assert produce_raw(w, name, 0, build_batch(records)).error_code == NONE
    ((fast, fast_raw, fast_records),) = stored(bs, topic_name)
    ((best, best_raw, best_records),) = stored(bs, topic_name + "-9")
    assert fast.compression == best.compression == COMPRESSION_GZIP
    assert fast_records == best_records == [(0, records[0][3], None, text, ())]
    body = bytes(build_batch(records))[HEADER_SIZE:]
    for raw, level in ((fast_raw, 1), (best_raw, 9)):
        c = zlib.compressobj(level, zlib.DEFLATED, 31)
        assert raw[HEADER_SIZE:] == c.compress(body) + c.flush()
    assert fast_raw[HEADER_SIZE:] != best_raw[HEADER_SIZE:]


def test_batch_that_grows_past_max_message_bytes_is_refused(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, config={"compression.type": "uncompressed", "max.message.bytes": "2000"})
    sent = build_batch([(None, b"z" * 5000, (), int(time.time() * 1000))], compression=COMPRESSION_ZSTD)
    assert len(sent) < 2000
    with Wire(bs) as w:
        part = produce_raw(w, topic_name, 0, sent)
        assert part.error_code == MESSAGE_TOO_LARGE
        assert "once stored as uncompressed (compression.type), above max.message.bytes (2000)" in part.error_message
    assert stored(bs, topic_name) == []


@pytest.mark.parametrize(("codec", "key", "level"), [("zstd", "compression.zstd.level", 19),
                                                     ("lz4", "compression.lz4.level", 12)])
def test_zstd_and_lz4_levels(module_broker, topic_name, codec, key, level):
    """The topic's level is the one the batch is compressed at (lz4: Kafka's default 9 is lz4's fast mode,
    other levels its high-compression mode)."""
    import cramjam

    bs = module_broker.bootstrap
    create_topic(bs, topic_name, config={"compression.type": codec})
    create_topic(bs, topic_name + "-level", config={"compression.type": codec, key: str(level)})
    text = b" ".join(b"line %d: the broker recompresses what the producer sent uncompressed" % i for i in range(300))
    records = [(None, text, (), int(time.time() * 1000))]
    body = bytes(build_batch(records))[HEADER_SIZE:]

    def expected(lvl: int | None) -> bytes:
        if codec == "zstd":
            return bytes(cramjam.zstd.compress(body, level=3 if lvl is None else lvl))
        c = cramjam.lz4.Compressor(lvl, content_checksum=False, block_linked=False)
        c.compress(body)
        return bytes(c.finish())

    with Wire(bs) as w:
        for name in (topic_name, topic_name + "-level"):
            assert produce_raw(w, name, 0, build_batch(records)).error_code == NONE
    ((_, default_raw, default_records),) = stored(bs, topic_name)
    ((_, level_raw, level_records),) = stored(bs, topic_name + "-level")
    assert default_records == level_records == [(0, records[0][3], None, text, ())]
    assert default_raw[HEADER_SIZE:] == expected(None)
    assert level_raw[HEADER_SIZE:] == expected(level)
    assert default_raw[HEADER_SIZE:] != level_raw[HEADER_SIZE:]
