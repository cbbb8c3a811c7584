"""Produce validation (KIP-467) with raw Produce requests: exact error codes, RecordErrors indexes,
ErrorMessage, nothing of a failed batch appended, LogStartOffset and LogAppendTime in responses,
and the failure counters on the metrics endpoint.
"""

from __future__ import annotations

import struct
import time

import crc32c
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME
from tests.integration.helpers import (
    Out,
    Wire,
    admin,
    ck_consume,
    ck_produce,
    create_topic,
    encode_framed,
    list_offset_raw,
    metric,
    produce_raw,
    produce_request,
    scrape,
    wait_until,
)

from oncelog.records.batch import COMPRESSION_GZIP, COMPRESSION_NONE, COMPRESSION_ZSTD
from oncelog.records.builder import build_batch

NONE = 0
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
INVALID_REQUIRED_ACKS = 21
INVALID_TIMESTAMP = 32
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87
LATEST = -1
HOUR = 3600 * 1000


def now_ms() -> int:
    return int(time.time() * 1000)


def hwm(wire: Wire, topic: str, partition: int = 0) -> int:
    code, offset, _ = list_offset_raw(wire, topic, partition, LATEST)
    assert code == 0
    return offset


def record_errors(part) -> list[int]:
    return [e.batch_index for e in part.record_errors]


def keyed(n: int, keyless: set[int] = frozenset(), ts: int | None = None) -> list[tuple]:
    ts = now_ms() if ts is None else ts
    return [(None if i in keyless else b"key-%d" % i, b"value-%d" % i, (), ts) for i in range(n)]


# -- keyless records on a compacted topic -----------------------------------------------------------------


@pytest.mark.parametrize("codec", [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_ZSTD], ids=["none", "gzip", "zstd"])
@pytest.mark.parametrize("version", [8, 9, 11])
def test_keyless_records_on_compacted_topic(module_broker, topic_name, codec, version):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"cleanup.policy": "compact"})
    with Wire(bs) as w:
        ok = produce_raw(w, topic_name, 0, build_batch(keyed(2), compression=codec), version=version)
        assert (ok.error_code, ok.base_offset, record_errors(ok)) == (NONE, 0, [])
        before = hwm(w, topic_name)
        assert before == 2
        part = produce_raw(w, topic_name, 0, build_batch(keyed(5, {1, 3}), compression=codec), version=version)
        assert part.error_code == INVALID_RECORD
        assert record_errors(part) == [1, 3]
        assert all(e.batch_index_error_message for e in part.record_errors)
        assert part.error_message and "2 of 5" in part.error_message
        assert part.base_offset == -1
        assert hwm(w, topic_name) == before  # nothing of the batch appended
        again = produce_raw(w, topic_name, 0, build_batch(keyed(3), compression=codec), version=version)
        assert (again.error_code, again.base_offset) == (NONE, 2)
    got = ck_consume(bs, topic_name, {0: 0})
    assert [(r.offset, r.key) for r in got] == [(0, b"key-0"), (1, b"key-1"), (2, b"key-0"), (3, b"key-1"),
                                                (4, b"key-2")]


def test_keyless_record_errors_before_kip467_versions(module_broker, topic_name):
    """Produce v3-v7 have no RecordErrors: the code alone says what happened."""
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"cleanup.policy": "compact"})
    with Wire(bs) as w:
        for version in (3, 5, 7):
            part = produce_raw(w, topic_name, 0, build_batch(keyed(4, {0})), version=version)
            assert part.error_code == INVALID_RECORD
        assert hwm(w, topic_name) == 0


def test_many_keyless_records_all_reported(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"cleanup.policy": "compact,delete"})
    bad = {0, 7, 8, 50, 99}
    with Wire(bs) as w:
        part = produce_raw(w, topic_name, 0, build_batch(keyed(100, bad)))
        assert (part.error_code, record_errors(part)) == (INVALID_RECORD, sorted(bad))
        assert "5 of 100" in part.error_message
        assert hwm(w, topic_name) == 0


# -- timestamps -------------------------------------------------------------------------------------------


def test_timestamps_outside_the_window(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"message.timestamp.before.max.ms": str(HOUR),
                                     "message.timestamp.after.max.ms": str(HOUR)})
    now = now_ms()
    with Wire(bs) as w:
        old = build_batch([(b"k", b"v%d" % i, (), now - 2 * HOUR - i) for i in range(4)])
        part = produce_raw(w, topic_name, 0, old)
        assert (part.error_code, record_errors(part)) == (INVALID_TIMESTAMP, [0, 1, 2, 3])
        assert part.error_message and "4 of 4" in part.error_message
        future = build_batch([(b"k", b"v%d" % i, (), now + 2 * HOUR + i) for i in range(3)], compression=COMPRESSION_GZIP)
        part = produce_raw(w, topic_name, 0, future)
        assert (part.error_code, record_errors(part)) == (INVALID_TIMESTAMP, [0, 1, 2])
        mixed = build_batch([(b"k", b"ok", (), now), (b"k", b"old", (), now - 2 * HOUR), (b"k", b"ok", (), now + 1000),
                             (b"k", b"new", (), now + 2 * HOUR), (b"k", b"ok", (), now - HOUR + 60000)])
        part = produce_raw(w, topic_name, 0, mixed)
        assert (part.error_code, record_errors(part)) == (INVALID_TIMESTAMP, [1, 3])
        assert hwm(w, topic_name) == 0
        inside = build_batch([(b"k", b"in", (), now - HOUR + 60000), (b"k", b"in", (), now + HOUR - 60000)])
        part = produce_raw(w, topic_name, 0, inside)
        assert (part.error_code, part.base_offset) == (NONE, 0)


def test_broker_wide_timestamp_limit(broker_factory, topic_name):
    broker = broker_factory({"log.message.timestamp.after.max.ms": 60000})
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    create_topic(bs, f"{topic_name}-loose", 1, {"message.timestamp.after.max.ms": str(10 * HOUR)})
    later = now_ms() + HOUR
    with Wire(bs) as w:
        part = produce_raw(w, topic_name, 0, build_batch([(b"k", b"v", (), later), (b"k", b"v", (), now_ms())]))
        assert (part.error_code, record_errors(part)) == (INVALID_TIMESTAMP, [0])
        part = produce_raw(w, f"{topic_name}-loose", 0, build_batch([(b"k", b"v", (), later)]))
        assert (part.error_code, part.base_offset) == (NONE, 0)


def test_producer_set_log_append_time_rejected(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        part = produce_raw(w, topic_name, 0, build_batch(keyed(3), log_append_time=True))
        assert (part.error_code, record_errors(part)) == (INVALID_TIMESTAMP, [0, 1, 2])
        assert hwm(w, topic_name) == 0


# -- batch-level failures ---------------------------------------------------------------------------------


def _corrupt_crc(batch: bytearray) -> bytearray:
    batch[-1] ^= 0x01  # a payload byte: the stored CRC no longer matches
    return batch


def _set_magic(batch: bytearray, magic: int) -> bytearray:
    batch[16] = magic
    return batch


def _two_batches() -> bytes:
    return bytes(build_batch(keyed(1))) + bytes(build_batch(keyed(1)))


def _recrc(batch: bytearray) -> bytearray:
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return batch


def _bad_count(batch: bytearray) -> bytearray:
    struct.pack_into(">i", batch, 57, 5)  # claims 5 records; holds 2
    return _recrc(batch)


BATCH_FAILURES = {
    "crc": (lambda: _corrupt_crc(build_batch(keyed(3))), CORRUPT_MESSAGE),
    "crc-compressed": (lambda: _corrupt_crc(build_batch(keyed(3), compression=COMPRESSION_GZIP)), CORRUPT_MESSAGE),
    "truncated": (lambda: build_batch(keyed(3))[:-5], CORRUPT_MESSAGE),
    "control-batch": (lambda: build_batch([(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", (), now_ms())],
                                          control=True, transactional=True, producer_id=1000, producer_epoch=0),
                      INVALID_RECORD),
    "magic-1": (lambda: _recrc(_set_magic(build_batch(keyed(1)), 1)), INVALID_RECORD),
    "two-batches": (_two_batches, INVALID_RECORD),
    "record-count": (lambda: _bad_count(build_batch(keyed(2))), INVALID_RECORD),
    "no-records": (lambda: None, INVALID_RECORD),
}


@pytest.mark.parametrize("case", sorted(BATCH_FAILURES))
def test_batch_level_failures(module_broker, topic_name, case):
    make, code = BATCH_FAILURES[case]
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        part = produce_raw(w, topic_name, 0, make())
        assert part.error_code == code
        assert record_errors(part) == []  # batch-level: no record list
        assert part.error_message
        assert part.base_offset == -1
        assert hwm(w, topic_name) == 0
        # the connection and the partition still work
        part = produce_raw(w, topic_name, 0, build_batch(keyed(2)))
        assert (part.error_code, part.base_offset) == (NONE, 0)


def test_message_too_large(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"max.message.bytes": "2000"})
    with Wire(bs) as w:
        big = build_batch([(b"k", b"x" * 2000, (), now_ms())])
        part = produce_raw(w, topic_name, 0, big)
        assert (part.error_code, record_errors(part)) == (MESSAGE_TOO_LARGE, [])
        fits = build_batch([(b"k", b"x" * 1800, (), now_ms())])
        assert len(fits) <= 2000
        assert produce_raw(w, topic_name, 0, fits).error_code == NONE
        assert hwm(w, topic_name) == 1


def test_zstd_needs_produce_v7(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        part = produce_raw(w, topic_name, 0, build_batch(keyed(2), compression=COMPRESSION_ZSTD), version=6)
        assert part.error_code == UNSUPPORTED_COMPRESSION_TYPE
        part = produce_raw(w, topic_name, 0, build_batch(keyed(2), compression=COMPRESSION_ZSTD), version=7)
        assert (part.error_code, part.base_offset) == (NONE, 0)


def test_unknown_partition_and_bad_acks(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    with Wire(bs) as w:
        assert produce_raw(w, f"{topic_name}-missing", 0, build_batch(keyed(1))).error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert produce_raw(w, topic_name, 1, build_batch(keyed(1))).error_code == UNKNOWN_TOPIC_OR_PARTITION
        assert produce_raw(w, topic_name, 0, build_batch(keyed(1)), acks=2).error_code == INVALID_REQUIRED_ACKS
        assert hwm(w, topic_name) == 0
    # Produce does not auto-create topics (only Metadata does).
    assert f"{topic_name}-missing" not in admin(bs).list_topics(timeout=10).topics


def test_acks0_failure_closes_the_connection(module_broker, topic_name):
    """acks=0 has no answer, so a failed batch closes the connection (as Kafka does)."""
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"cleanup.policy": "compact"})
    with Wire(bs, timeout=10) as w:
        assert produce_raw(w, topic_name, 0, build_batch(keyed(2)), acks=0) is None
        assert produce_raw(w, topic_name, 0, build_batch(keyed(2, {0})), acks=0) is None
        time.sleep(0.2)
        with pytest.raises((ConnectionError, OSError)):
            produce_raw(w, topic_name, 0, build_batch(keyed(1)), acks=1)
    with Wire(bs) as w:
        wait_until(lambda: hwm(w, topic_name) >= 2, timeout=10, what="the good acks=0 batch")


def test_requests_behind_a_failed_acks0_produce_are_not_processed(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"cleanup.policy": "compact"})
    good0 = encode_framed(produce_request(topic_name, 0, build_batch(keyed(2)), acks=0), 9, 1)
    bad0 = encode_framed(produce_request(topic_name, 0, build_batch(keyed(2, {0})), acks=0), 9, 2)
    then1 = encode_framed(produce_request(topic_name, 0, build_batch(keyed(1)), acks=1), 9, 3)
    with Wire(bs, timeout=10) as w:
        w.send_raw(good0 + bad0 + then1)  # one write: the broker reads all three before running any
        with pytest.raises((ConnectionError, OSError)):
            w.recv_frame()
    with Wire(bs) as w:
        wait_until(lambda: hwm(w, topic_name) >= 2, timeout=10, what="the good acks=0 batch")
        time.sleep(0.3)
        # The client never got an answer for the acks=1 batch (its connection was closed): it must not
        # have been appended, or the client's retry duplicates it.
        assert hwm(w, topic_name) == 2


# -- what every response carries --------------------------------------------------------------------------


@pytest.mark.parametrize("version", [5, 7, 8, 9, 10, 11])
def test_log_start_offset_in_every_response(module_broker, topic_name, version):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"cleanup.policy": "delete"})
    with Wire(bs) as w:
        part = produce_raw(w, topic_name, 0, build_batch(keyed(5)), version=version)
        assert (part.error_code, part.base_offset, part.log_start_offset) == (NONE, 0, 0)
        client = admin(bs)
        from confluent_kafka import TopicPartition

        (future,) = client.delete_records([TopicPartition(topic_name, 0, 3)]).values()
        assert future.result(timeout=15).low_watermark == 3
        part = produce_raw(w, topic_name, 0, build_batch(keyed(2)), version=version)
        assert (part.error_code, part.base_offset, part.log_start_offset) == (NONE, 5, 3)
        # a rejected batch's answer carries it too
        part = produce_raw(w, topic_name, 0, _corrupt_crc(build_batch(keyed(2))), version=version)
        assert (part.error_code, part.log_start_offset) == (CORRUPT_MESSAGE, 3)
        # and the log start offset moves again with the next DeleteRecords
        (future,) = client.delete_records([TopicPartition(topic_name, 0, 7)]).values()
        assert future.result(timeout=15).low_watermark == 7
        part = produce_raw(w, topic_name, 0, build_batch(keyed(1)), version=version)
        assert (part.error_code, part.base_offset, part.log_start_offset) == (NONE, 7, 7)


def test_log_append_time(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"message.timestamp.type": "LogAppendTime"})
    create_topic(bs, f"{topic_name}-create", 1)
    with Wire(bs) as w:
        before = now_ms()
        part = produce_raw(w, topic_name, 0, build_batch(keyed(3, ts=12345)))
        after = now_ms()
        assert (part.error_code, part.base_offset) == (NONE, 0)
        assert before <= part.log_append_time_ms <= after
        append_time = part.log_append_time_ms
        # CreateTime topics answer -1
        other = produce_raw(w, f"{topic_name}-create", 0, build_batch(keyed(1, ts=12345)))
        assert (other.error_code, other.log_append_time_ms) == (NONE, -1)
        # a record far outside any timestamp window is fine on a LogAppendTime topic
        part = produce_raw(w, topic_name, 0, build_batch(keyed(1, ts=0)))
        assert part.error_code == NONE
    got = ck_consume(bs, topic_name, {0: 0})
    assert [r.offset for r in got] == [0, 1, 2, 3]
    assert [r.timestamp for r in got[:3]] == [append_time] * 3
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bs, "group.id": "x", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic_name, 0, 0), TopicPartition(f"{topic_name}-create", 0, 0)])
        types = {}
        deadline = time.monotonic() + 15
        while len(types) < 2 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                types.setdefault(msg.topic(), msg.timestamp())  # offset 0 of each
    finally:
        consumer.close()
    assert types == {topic_name: (TIMESTAMP_LOG_APPEND_TIME, append_time),
                     f"{topic_name}-create": (TIMESTAMP_CREATE_TIME, 12345)}


# -- metrics ----------------------------------------------------------------------------------------------


def test_metrics_count_failures_and_traffic(broker_factory, topic_name):
    broker = broker_factory(metrics=True)
    bs = broker.bootstrap
    assert broker.metrics_port
    compacted, windowed, plain = f"{topic_name}-c", f"{topic_name}-w", f"{topic_name}-p"
    create_topic(bs, compacted, 1, {"cleanup.policy": "compact"})
    create_topic(bs, windowed, 1, {"message.timestamp.after.max.ms": str(HOUR), "max.message.bytes": "3000"})
    create_topic(bs, plain, 2)
    good_sizes: dict[str, int] = {}
    good_counts: dict[str, int] = {}
    with Wire(bs) as w:
        def ok(topic: str, batch: bytearray, partition: int = 0) -> None:
            size = len(batch)
            assert produce_raw(w, topic, partition, batch).error_code == NONE
            good_sizes[topic] = good_sizes.get(topic, 0) + size
            good_counts[topic] = good_counts.get(topic, 0) + int.from_bytes(batch[57:61], "big")

        def fail(topic: str, batch: bytearray, code: int) -> None:
            assert produce_raw(w, topic, 0, batch).error_code == code

        ok(compacted, build_batch(keyed(4)))
        fail(compacted, build_batch(keyed(6, {1, 3, 5})), INVALID_RECORD)  # 3 keyless records
        fail(compacted, build_batch(keyed(2, {0})), INVALID_RECORD)  # 1 more
        ok(windowed, build_batch(keyed(2)))
        fail(windowed, build_batch(keyed(3, ts=now_ms() + 2 * HOUR)), INVALID_TIMESTAMP)  # 3 records
        fail(windowed, build_batch([(b"k", b"x" * 4000, (), now_ms())]), MESSAGE_TOO_LARGE)
        fail(plain, _corrupt_crc(build_batch(keyed(2))), CORRUPT_MESSAGE)
        fail(plain, _corrupt_crc(build_batch(keyed(2))), CORRUPT_MESSAGE)
        fail(plain, build_batch([(b"\0\0\0\0", b"\0\0\0\0\0\0", (), now_ms())], control=True, transactional=True,
                                producer_id=7, producer_epoch=0), INVALID_RECORD)
        ok(plain, build_batch(keyed(3), compression=COMPRESSION_GZIP))
        ok(plain, build_batch(keyed(5)), partition=1)
    ck_produce(bs, plain, [Out(0, b"k", b"v" * 100)], **{"linger.ms": 0})
    ck_consume(bs, plain, {0: 0, 1: 0})

    samples = scrape(broker.metrics_port)
    name = "oncelog_produce_validation_failures_total"
    assert metric(samples, name, kind="no_key_compacted") == 4
    assert metric(samples, name, kind="invalid_timestamp") == 3
    assert metric(samples, name, kind="message_too_large") == 1
    assert metric(samples, name, kind="invalid_crc") == 2
    assert metric(samples, name, kind="invalid_record") == 1
    assert good_counts == {compacted: 4, windowed: 2, plain: 8}
    for topic in (compacted, windowed):
        assert metric(samples, "oncelog_bytes_in_total", topic=topic) == good_sizes[topic]
        assert metric(samples, "oncelog_messages_in_total", topic=topic) == good_counts[topic]
    assert metric(samples, "oncelog_messages_in_total", topic=plain) == 9
    assert metric(samples, "oncelog_bytes_in_total", topic=plain) > good_sizes[plain]
    assert metric(samples, "oncelog_messages_in_total", topic=f"{topic_name}-missing") == 0
    # Per-partition log gauges: the end offsets of what was appended.
    assert metric(samples, "oncelog_log_end_offset", topic=plain, partition="0") == 4
    assert metric(samples, "oncelog_log_end_offset", topic=plain, partition="1") == 5
    assert metric(samples, "oncelog_high_watermark", topic=compacted, partition="0") == 4
    assert metric(samples, "oncelog_log_start_offset", topic=plain, partition="0") == 0
    # Bytes out: the consumer read both partitions of `plain` to the end.
    assert metric(samples, "oncelog_bytes_out_total", topic=plain) >= metric(samples, "oncelog_bytes_in_total",
                                                                             topic=plain)
    assert metric(samples, "oncelog_requests_total", api="PRODUCE") >= 11
    assert metric(samples, "oncelog_request_latency_seconds_count", api="PRODUCE") >= 11
