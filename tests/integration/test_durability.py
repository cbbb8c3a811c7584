"""Durability: SIGKILL while producing with acks=all; retention and DeleteRecords moving the log start offset.

The crash test kills the broker (SIGKILL, several times, restarting on the same port) under a
confluent-kafka producer with acks=all. Afterwards every acknowledged record must be at its
acknowledged offset with its value, every partition must read back as a gap-free run of offsets
0..end-1 with each offset exactly once, and every record must be intact (its value carries a
digest of itself), read by both librdkafka and kafka-python with CRC checks on.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from tests.integration.helpers import (
    Out,
    Wire,
    admin,
    ck_consume,
    ck_produce,
    create_topic,
    fetch_raw,
    kp_consume,
    list_offset_raw,
    produce_raw,
    wait_until,
)

from oncelog.records.builder import build_batch

OFFSET_OUT_OF_RANGE = 1
POLICY_VIOLATION = 44
EARLIEST, LATEST = -2, -1


# -- SIGKILL under acks=all -------------------------------------------------------------------------------


def make_value(partition: int, seq: int, rnd: random.Random) -> bytes:
    body = f"p{partition}-s{seq}-".encode() + rnd.randbytes(rnd.randrange(200, 6000))
    return hashlib.sha256(body).hexdigest().encode() + b"|" + body


def intact(value: bytes) -> bool:
    digest, _, body = value.partition(b"|")
    return hashlib.sha256(body).hexdigest().encode() == digest


class AcksAllProducer(threading.Thread):
    """Produces continuously with acks=all; records what was acknowledged, at which offset."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.partitions = partitions
        self.stop_event = threading.Event()
        self.acked: list[tuple[int, int, bytes]] = []
        self.errors: dict[str, int] = {}
        self.lock = threading.Lock()
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False, "linger.ms": 2,
            "metadata.recovery.strategy": "none", "message.timeout.ms": 60000, "retries": 1000000,
            "retry.backoff.ms": 50, "retry.backoff.max.ms": 200, "reconnect.backoff.ms": 20,
            "reconnect.backoff.max.ms": 200, "queue.buffering.max.messages": 2000,
            "batch.size": 64 * 1024,  # below segment.bytes: larger batches are RECORD_LIST_TOO_LARGE
            "socket.connection.setup.timeout.ms": 5000,
        })

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)

    def _report(self, err, msg) -> None:
        if err is None:
            with self.lock:
                self.acked.append((msg.partition(), msg.offset(), msg.value()))
        else:
            self.errors[err.name()] = self.errors.get(err.name(), 0) + 1

    def run(self) -> None:
        rnd = random.Random(42)
        seq = 0
        while not self.stop_event.is_set():
            partition = seq % self.partitions
            try:
                self.producer.produce(self.topic, value=make_value(partition, seq, rnd), key=b"%d" % seq,
                                      partition=partition, on_delivery=self._report)
                seq += 1
            except BufferError:
                self.producer.poll(0.05)
            self.producer.poll(0)
        self.producer.flush(90)


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_restarts_while_producing_acks_all(broker_factory, topic_name, how):
    """SIGKILL (crash) or SIGTERM (clean shutdown under load) several times while a producer sends."""
    partitions = 4
    broker = broker_factory()
    bs = broker.bootstrap
    # Small segments, so kills also land around segment rolls.
    create_topic(bs, topic_name, partitions, {"segment.bytes": str(256 * 1024)})
    producer = AcksAllProducer(bs, topic_name, partitions)
    producer.start()
    kills = 4
    try:
        for _ in range(kills):
            seen = producer.acked_count()
            wait_until(lambda seen=seen: producer.acked_count() >= seen + 300, timeout=60,
                       what="the producer to make progress")
            time.sleep(random.uniform(0, 0.2))
            if how == "sigkill":
                broker.kill()
            else:
                started = time.monotonic()
                assert broker.stop(timeout=20) == 0
                assert time.monotonic() - started < 10, "clean shutdown under load took too long"
            time.sleep(0.3)
            broker.start()
            assert broker.bootstrap == bs
        seen = producer.acked_count()
        wait_until(lambda: producer.acked_count() >= seen + 300, timeout=60, what="progress after the last restart")
    finally:
        producer.stop_event.set()
        producer.join(120)
    assert not producer.is_alive()
    acked = list(producer.acked)
    assert len(acked) >= 300 * (kills + 1)
    assert producer.errors == {}  # with unlimited retries, every record gets through in the end

    def check(read: list) -> None:
        by_offset = {}
        for rec in read:
            assert (rec.partition, rec.offset) not in by_offset, f"offset {rec.offset} read twice"
            by_offset[(rec.partition, rec.offset)] = rec.value
        for p in range(partitions):
            offsets = sorted(o for (q, o) in by_offset if q == p)
            assert offsets == list(range(len(offsets))), f"partition {p} has gaps"
        torn = [k for k, v in by_offset.items() if v is None or not intact(v)]
        assert not torn, f"damaged records at {torn[:5]}"
        lost = [(p, o) for p, o, v in acked if by_offset.get((p, o)) != v]
        assert not lost, f"{len(lost)} acknowledged records missing or changed, e.g. {lost[:5]}"
        # every record carries its partition
        assert all(v.split(b"|", 1)[1].startswith(b"p%d-" % p) for (p, _), v in by_offset.items())

    starts = {p: 0 for p in range(partitions)}
    first = ck_consume(bs, topic_name, starts, timeout=60)
    check(first)
    assert kp_consume(bs, topic_name, starts, timeout=60) == first
    # A clean restart serves exactly the same log.
    broker.restart(clean=True)
    assert ck_consume(bs, topic_name, starts, timeout=60) == first
    log = broker.log_tail(100000)
    assert "Traceback" not in log
    if how == "sigterm":
        assert log.count("broker stopped cleanly") == kills + 1


# -- retention --------------------------------------------------------------------------------------------


def _batch(ts: int, i: int) -> bytearray:
    return build_batch([(b"key-%03d" % i, b"value-%03d-" % i + b"x" * 100, (), ts)])


def _produce_batches(bs: str, topic: str, batches: list[bytearray], partition: int = 0) -> list[int]:
    with Wire(bs) as w:
        out = []
        for batch in batches:
            resp = produce_raw(w, topic, partition, batch)
            assert resp.error_code == 0, resp
            out.append(resp.base_offset)
        return out


def _offsets(bs: str, topic: str, partition: int = 0) -> tuple[int, int]:
    with Wire(bs) as w:
        e = list_offset_raw(w, topic, partition, EARLIEST)
        latest = list_offset_raw(w, topic, partition, LATEST)
    assert e[0] == 0 and latest[0] == 0
    return e[1], latest[1]


def _segment_bases(data_dir: Path, topic: str, partition: int = 0) -> list[int]:
    return sorted(int(f.stem) for f in (data_dir / f"{topic}-{partition}").glob("*.log"))


def _values(recs) -> list[tuple[int, bytes]]:
    return [(r.offset, r.key) for r in recs]


@pytest.mark.parametrize("restart", ["sigkill", "sigterm"])
def test_retention_by_time(broker_factory, topic_name, restart):
    broker = broker_factory({"log.retention.check.interval.ms": 100})
    bs = broker.bootstrap
    size = len(_batch(0, 0))
    # One batch per segment; an hour of retention.
    create_topic(bs, topic_name, 1, {"segment.bytes": str(size), "retention.ms": "3600000"})
    now = int(time.time() * 1000)
    old = [_batch(now - 10 * 3600 * 1000 + i, i) for i in range(10)]
    new = [_batch(now + i, 10 + i) for i in range(10)]
    assert _produce_batches(bs, topic_name, old + new) == list(range(20))
    wait_until(lambda: _offsets(bs, topic_name) == (10, 20), what="retention to delete the ten old records")
    time.sleep(0.5)  # several more retention rounds: nothing else goes
    assert _offsets(bs, topic_name) == (10, 20)
    assert _segment_bases(broker.data_dir, topic_name) == list(range(10, 20))
    want = [(o, b"key-%03d" % o) for o in range(10, 20)]
    # Reading below the log start: OFFSET_OUT_OF_RANGE, with the new log start in the answer ...
    with Wire(bs) as w:
        part = fetch_raw(w, topic_name, 0, 3)
        assert (part.error_code, part.log_start_offset, part.high_watermark) == (OFFSET_OUT_OF_RANGE, 10, 20)
    # ... so consumers reset: to the earliest offset, or fail when told not to reset.
    assert _values(ck_consume(bs, topic_name, {0: 3}, **{"auto.offset.reset": "earliest"})) == want
    assert _values(kp_consume(bs, topic_name, {0: 3}, auto_offset_reset="earliest")) == want
    assert _reset_error(bs, topic_name, 3) == KafkaError._AUTO_OFFSET_RESET

    broker.restart(clean=restart == "sigterm")
    assert _offsets(bs, topic_name) == (10, 20)
    assert _values(ck_consume(bs, topic_name, {0: 10})) == want
    # The old (expired) timestamps are gone for good; fresh records still append after the end.
    assert _produce_batches(bs, topic_name, [_batch(now, 20)]) == [20]
    assert _offsets(bs, topic_name) == (10, 21)


def test_retention_expires_everything(broker_factory, topic_name):
    """When every segment is past retention.ms the active one goes too: the log is empty at its old end."""
    broker = broker_factory({"log.retention.check.interval.ms": 100})
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1, {"segment.bytes": str(3 * len(_batch(0, 0))), "retention.ms": "60000"})
    old = int(time.time() * 1000) - 3600 * 1000
    assert _produce_batches(bs, topic_name, [_batch(old + i, i) for i in range(7)]) == list(range(7))
    wait_until(lambda: _offsets(bs, topic_name) == (7, 7), what="retention to empty the log")
    assert ck_consume(bs, topic_name, {0: 7}) == []
    now = int(time.time() * 1000)
    assert _produce_batches(bs, topic_name, [_batch(now, 7)]) == [7]
    time.sleep(0.4)
    assert _offsets(bs, topic_name) == (7, 8)
    broker.restart(clean=False)
    assert _offsets(bs, topic_name) == (7, 8)
    assert _values(ck_consume(bs, topic_name, {0: 7})) == [(7, b"key-007")]


def test_consumer_rides_through_a_broker_restart(broker_factory, topic_name):
    """An assigned librdkafka consumer keeps its position across a SIGKILL and restart of the broker and
    reads on without gaps or repeats."""
    broker = broker_factory()
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    first = [Out(0, b"k", b"before-%d" % i) for i in range(20)]
    ck_produce(bs, topic_name, first)
    consumer = Consumer({"bootstrap.servers": bs, "group.id": "x", "enable.auto.commit": False,
                         "metadata.recovery.strategy": "none", "reconnect.backoff.ms": 20,
                         "reconnect.backoff.max.ms": 200, "auto.offset.reset": "error"})
    seen: list[tuple[int, bytes]] = []

    def read_until(n: int) -> None:
        deadline = time.monotonic() + 30
        while len(seen) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                seen.append((msg.offset(), msg.value()))

    try:
        consumer.assign([TopicPartition(topic_name, 0, 0)])
        read_until(20)
        broker.kill()
        time.sleep(0.3)
        broker.start()
        second = [Out(0, b"k", b"after-%d" % i) for i in range(20)]
        ck_produce(bs, topic_name, second)
        read_until(40)
    finally:
        consumer.close()
    assert seen == [(i, b"before-%d" % i) for i in range(20)] + [(20 + i, b"after-%d" % i) for i in range(20)]


def _reset_error(bs: str, topic: str, offset: int) -> int:
    consumer = Consumer({"bootstrap.servers": bs, "group.id": "x", "auto.offset.reset": "error",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is not None, f"read offset {msg.offset()} below the log start"
            return msg.error().code()
    finally:
        consumer.close()
    raise AssertionError("no error for an offset below the log start")


def test_retention_by_size(broker_factory, topic_name):
    broker = broker_factory({"log.retention.check.interval.ms": 100})
    bs = broker.bootstrap
    size = len(_batch(0, 0))
    create_topic(bs, topic_name, 1, {"segment.bytes": str(2 * size)})  # two batches per segment
    now = int(time.time() * 1000)
    assert _produce_batches(bs, topic_name, [_batch(now + i, i) for i in range(10)]) == list(range(10))
    assert _segment_bases(broker.data_dir, topic_name) == [0, 2, 4, 6, 8]
    time.sleep(0.3)
    assert _offsets(bs, topic_name) == (0, 10)  # no retention.bytes: nothing deleted
    # Turn size retention on at runtime: keep at most three segments' worth.
    client = admin(bs)
    (future,) = client.incremental_alter_configs([ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.bytes", str(6 * size), incremental_operation=AlterConfigOpType.SET)])]).values()
    future.result(timeout=15)
    wait_until(lambda: _offsets(bs, topic_name) == (4, 10), what="size retention")
    time.sleep(0.4)
    assert _offsets(bs, topic_name) == (4, 10)
    assert _segment_bases(broker.data_dir, topic_name) == [4, 6, 8]
    assert _values(ck_consume(bs, topic_name, {0: 4})) == [(o, b"key-%03d" % o) for o in range(4, 10)]
    broker.restart(clean=False)
    assert _offsets(bs, topic_name) == (4, 10)


# -- DeleteRecords ----------------------------------------------------------------------------------------


def test_delete_records(broker_factory, topic_name):
    broker = broker_factory()
    bs = broker.bootstrap
    create_topic(bs, topic_name, 2)
    now = int(time.time() * 1000)
    # Batches of three records: 0-2, 3-5, 6-8, 9-11 on both partitions.
    batches = [build_batch([(b"k%02d" % (3 * b + i), b"v%02d" % (3 * b + i), (), now) for i in range(3)])
               for b in range(4)]
    for p in (0, 1):
        assert _produce_batches(bs, topic_name, [bytearray(b) for b in batches], partition=p) == [0, 3, 6, 9]

    client = admin(bs)

    def delete(partition: int, offset: int) -> tuple[int, int]:
        (future,) = client.delete_records([TopicPartition(topic_name, partition, offset)]).values()
        try:
            return 0, future.result(timeout=15).low_watermark
        except Exception as exc:  # KafkaException
            return exc.args[0].code(), -1

    # The middle of a batch: the log start offset is exactly that offset.
    assert delete(0, 4) == (0, 4)
    assert _offsets(bs, topic_name, 0) == (4, 12)
    assert delete(0, 2) == (0, 4)  # never backwards
    assert delete(0, 13)[0] == OFFSET_OUT_OF_RANGE  # beyond the high watermark
    assert _offsets(bs, topic_name, 0) == (4, 12)
    # kafka-python: offset -1 means "up to the high watermark"
    from kafka import TopicPartition as KTP
    from kafka.admin import KafkaAdminClient

    kp = KafkaAdminClient(bootstrap_servers=bs)
    try:
        result = kp.delete_records({KTP(topic_name, 1): -1})
    finally:
        kp.close()
    assert {tp.partition: r["low_watermark"] for tp, r in result.items()} == {1: 12}
    assert _offsets(bs, topic_name, 1) == (12, 12)

    want = [(o, b"k%02d" % o) for o in range(4, 12)]
    assert _values(ck_consume(bs, topic_name, {0: 4})) == want  # starts mid-batch, at exactly 4
    assert _values(ck_consume(bs, topic_name, {0: 0}, **{"auto.offset.reset": "earliest"})) == want
    assert _values(kp_consume(bs, topic_name, {0: 1}, auto_offset_reset="earliest")) == want
    assert _reset_error(bs, topic_name, 3) == KafkaError._AUTO_OFFSET_RESET
    assert ck_consume(bs, topic_name, {1: 12}) == []
    with Wire(bs) as w:
        part = fetch_raw(w, topic_name, 0, 3)
        assert (part.error_code, part.log_start_offset) == (OFFSET_OUT_OF_RANGE, 4)
        part = fetch_raw(w, topic_name, 1, 11)
        assert (part.error_code, part.log_start_offset) == (OFFSET_OUT_OF_RANGE, 12)

    for clean in (False, True):
        broker.restart(clean=clean)
        assert _offsets(bs, topic_name, 0) == (4, 12)
        assert _offsets(bs, topic_name, 1) == (12, 12)
        assert _values(ck_consume(bs, topic_name, {0: 4})) == want
    # Appends continue after the end.
    assert ck_produce(bs, topic_name, [Out(1, b"after", b"delete")]) == [(1, 12)]
    assert _offsets(bs, topic_name, 1) == (12, 13)


def test_delete_records_errors(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, f"{topic_name}-c", 1, {"cleanup.policy": "compact"})
    ck_produce(bs, f"{topic_name}-c", [Out(0, b"k", b"v")])
    client = admin(bs)

    def code(topic: str, partition: int, offset: int) -> int:
        (future,) = client.delete_records([TopicPartition(topic, partition, offset)]).values()
        try:
            future.result(timeout=15)
        except Exception as exc:  # KafkaException
            return exc.args[0].code()
        return 0

    assert code(f"{topic_name}-c", 0, 1) == POLICY_VIOLATION
    assert _offsets(bs, f"{topic_name}-c") == (0, 1)


# -- a torn tail after a crash ----------------------------------------------------------------------------


def _torn_tail(kind: str, now: int) -> bytes:
    whole = bytes(build_batch([(b"torn", b"t" * 500, (), now)], base_offset=10))
    if kind == "partial-header":
        return whole[:30]
    if kind == "partial-batch":
        return whole[: len(whole) - 100]
    if kind == "bad-crc":
        damaged = bytearray(whole)
        damaged[-10] ^= 0xFF
        return bytes(damaged)
    assert kind == "zeros"
    return b"\0" * 4096


@pytest.mark.parametrize("kind", ["partial-header", "partial-batch", "bad-crc", "zeros"])
def test_torn_tail_is_truncated_on_recovery(broker_factory, topic_name, kind):
    """What a crash can leave after the last complete batch (a partial write, a torn page, preallocated
    zeros) is cut off on restart; the intact records are served and appends continue after them."""
    broker = broker_factory()
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    now = int(time.time() * 1000)
    assert _produce_batches(bs, topic_name, [_batch(now + i, i) for i in range(10)]) == list(range(10))
    log_file = broker.data_dir / f"{topic_name}-0" / "00000000000000000000.log"
    good_size = log_file.stat().st_size
    assert good_size == 10 * len(_batch(0, 0))
    broker.kill()
    with open(log_file, "ab") as f:
        f.write(_torn_tail(kind, now))
    broker.start()
    assert _offsets(bs, topic_name) == (0, 10)
    want = [(o, b"key-%03d" % o) for o in range(10)]
    assert _values(ck_consume(bs, topic_name, {0: 0})) == want
    assert log_file.stat().st_size == good_size
    assert _produce_batches(bs, topic_name, [_batch(now + 10, 10)]) == [10]
    assert _values(ck_consume(bs, topic_name, {0: 0})) == [*want, (10, b"key-010")]
    with Wire(bs) as w:  # the time index was rebuilt too
        assert list_offset_raw(w, topic_name, 0, now + 5)[:2] == (0, 5)
        assert list_offset_raw(w, topic_name, 0, now + 10)[:2] == (0, 10)
    broker.restart(clean=False)
    assert _values(ck_consume(bs, topic_name, {0: 0})) == [*want, (10, b"key-010")]
