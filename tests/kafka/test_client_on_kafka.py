"""oncelog's client (`oncelog.client`) and its CLI against Apache Kafka 4.4.0 (KRaft), not oncelog's broker.

What a user checks before trusting oncelog's client with a Kafka cluster, each judged by what Kafka stores and
serves (record contents, offsets, error codes and classes, group and transaction state), mostly read back by an
independent client (confluent-kafka / librdkafka) as well as by oncelog's consumer:

- the idempotent producer: keys where the Java client puts them (murmur2), headers, timestamps, every codec,
  dense offsets from 0, one producer id with dense sequences; acks=1 and acks=0 without idempotence;
- transactions: commits and aborts interleaved with plain records, read_committed vs read_uncommitted, the last
  stable offset; consume-transform-produce with the group's offsets committed only with the transaction;
  fencing by a second instance; a transaction that outlives transaction.timeout.ms (Kafka's reaper aborts it);
- the idempotent producer through a SIGKILL and restart of its Kafka node (a node of its own);
- consumer groups: members splitting partitions (range, roundrobin), a third member joining, commits, close
  leaving the group at once, seek, offsets_for_times, watermarks, pause/resume;
- the Admin client's topic, config, record, offset, group, producer and transaction APIs;
- the `oncelog` CLI (`.venv/bin/oncelog` as a subprocess): topics, produce (plain and transactional), consume
  (assigned and in a group), groups, producers, transactions, records; over SASL_SSL with a client.properties
  file; a wrong password reported as one line, at once.

The same behaviours against oncelog's broker are in tests/integration. Where Kafka differs, the test asserts
what Kafka does and says so: a transaction's markers are written after EndTxn is answered (readers wait for the
last stable offset to move), topic and config changes reach the broker's metadata a moment after they are
acknowledged, and the owner of a transaction Kafka's reaper aborted is fenced rather than recovering by an abort.

Markers: every test here is `kafka` (tests/kafka/conftest.py); the SIGKILL, transaction-timeout and
hanging-transaction tests start a node of their own and are `kafka_slow`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncelog.client import (
    OFFSET_BEGINNING,
    AbortableError,
    Admin,
    ClientConfig,
    Consumer,
    KafkaError,
    KafkaTimeoutError,
    OffsetResetError,
    PartitionEOF,
    Producer,
    ProducerFenced,
    TopicPartition,
)
from oncelog.client.errors import RetriableError
from oncelog.client.partitioner import partition_for_key
from oncelog.client.types import TIMESTAMP_CREATE_TIME
from tests.integration.client.producer_support import log_batches
from tests.integration.helpers import Rec, ck_consume, norm_headers, wait_until

KAFKA_SLOW = pytest.mark.kafka_slow
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
TS0 = 1_700_000_000_000

# Every client here keeps the default request.timeout.ms; one operation (a flush, a transaction call, reading a
# topic to its end, a rebalance) is given two request timeouts, generous on a loaded two-core machine.
REQUEST_TIMEOUT_S = ClientConfig({"bootstrap.servers": "127.0.0.1:9092"}, "producer")["request.timeout.ms"] / 1000
WAIT = 2 * REQUEST_TIMEOUT_S
# Group members use a session timeout far longer than anything a test waits for "at once": a member that left
# on close() is gone in well under SESSION_TIMEOUT_S, one that merely vanished would stay for all of it.
SESSION_TIMEOUT_MS = 30_000
PROMPTLY_S = SESSION_TIMEOUT_MS / 1000 / 3
ONCELOG = Path(sys.executable).with_name("oncelog")


# -- helpers ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def admin(kafka):
    client = Admin({"bootstrap.servers": kafka.bootstrap}, api_timeout=WAIT)
    yield client
    client.close()


def code_of(call: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    with pytest.raises(KafkaError) as info:
        call(*args, **kwargs)
    return info.value.code


class Reports:
    """on_delivery(err, msg) reports, in the order they ran."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, Any]] = []

    def __call__(self, err: Any, msg: Any) -> None:
        self.items.append((err, msg))

    def errors(self) -> list[Any]:
        return [e for e, _ in self.items if e is not None]

    def delivered(self) -> list[Any]:
        return [m for e, m in self.items if e is None]


def produce_values(bootstrap: str, topic: str, values_by_partition: dict[int, list[bytes]], **conf: Any) -> None:
    """Write with oncelog's idempotent producer (explicit partitions, timestamps TS0 + 1000 * i)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    for partition, values in values_by_partition.items():
        for i, value in enumerate(values):
            producer.produce(topic, value, partition=partition, timestamp=TS0 + 1000 * i)
    assert producer.flush(WAIT) == 0
    producer.close()


def rec(m: Any) -> Rec:
    return Rec(m.partition(), m.offset(), m.key(), m.value(), norm_headers(m.headers()), m.timestamp()[1])


def ours_read(bootstrap: str, topic: str, starts: dict[int, int], **conf: Any) -> list[Rec]:
    """Read each partition of `starts` from its start offset to its end with oncelog's consumer (assign mode)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "enable.partition.eof": True, "fetch.wait.max.ms": 100,
                         **conf})
    out: list[Rec] = []
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        pending = set(starts)
        deadline = time.monotonic() + WAIT
        while pending:
            assert time.monotonic() < deadline, f"partitions {sorted(pending)} not read to their end in {WAIT} s"
            m = consumer.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                assert isinstance(m.error(), PartitionEOF), repr(m.error())
                pending.discard(m.partition())
                continue
            out.append(rec(m))
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))


def values(recs: list[Rec]) -> list[tuple[int, int, bytes | None]]:
    return [(r.partition, r.offset, r.value) for r in recs]


def settled(admin: Admin, topic: str, partitions: range | list[int], txn_id: str | None = None) -> None:
    """Wait until no transaction is open on the partitions (the last stable offset is the high watermark) and,
    with `txn_id`, until that transaction is complete. Kafka answers EndTxn once its decision is logged and writes
    the markers after that (oncelog's broker answers once the markers are written), so a reader started right
    after commit_transaction() can still stop short of the transaction."""
    tps = [TopicPartition(topic, p) for p in partitions]

    def done() -> bool:
        if txn_id is not None and admin.describe_transaction(txn_id).state not in ("CompleteCommit",
                                                                                     "CompleteAbort"):
            return False
        stable = admin.list_offsets({tp: "latest" for tp in tps}, isolation="read_committed")
        ends = admin.list_offsets({tp: "latest" for tp in tps})
        return all(stable[tp].offset == ends[tp].offset for tp in tps)

    wait_until(done, timeout=WAIT, interval=0.05, what=f"the transaction markers on {topic}")


def read_both(bootstrap: str, topic: str, starts: dict[int, int], isolation: str) -> list[Rec]:
    """confluent-kafka's and oncelog's consumer read the same records; returns them."""
    theirs = ck_consume(bootstrap, topic, starts, timeout=WAIT, **{"isolation.level": isolation})
    ours = ours_read(bootstrap, topic, starts, **{"isolation.level": isolation})
    assert ours == theirs
    return theirs


# -- producer -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_idempotent_producer_keys_headers_timestamps(kafka, admin, topic_name, codec):
    admin.create_topic(topic_name, 3, 1)
    reports = Reports()
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "compression.type": codec, "linger.ms": 5})
    sent = []
    for i in range(90):
        key = None if i % 10 == 0 else f"key-{i % 13}".encode()
        headers = [("n", str(i).encode()), ("empty", None)] if i % 3 == 0 else None
        value = f"value-{i}-".encode() * (1 + i % 5)
        producer.produce(topic_name, value, key=key, headers=headers, timestamp=TS0 + i, on_delivery=reports)
        sent.append((key, value, tuple(headers or ()), TS0 + i))
    assert producer.flush(WAIT) == 0
    pid = producer.transaction_identity()[0]
    producer.close()
    assert reports.errors() == []
    by_value = {m.value(): m for m in reports.delivered()}
    assert len(by_value) == 90
    expected = []
    for key, value, headers, ts in sent:
        m = by_value[value]
        assert (m.topic(), m.key(), m.timestamp(), tuple(m.headers() or ())) == (
            topic_name, key, (TIMESTAMP_CREATE_TIME, ts), headers)
        if key is not None:
            assert m.partition() == partition_for_key(key, 3), key  # where the Java client puts it
        expected.append(Rec(m.partition(), m.offset(), key, value, headers, ts))
    expected.sort(key=lambda r: (r.partition, r.offset))
    assert read_both(kafka.bootstrap, topic_name, {0: 0, 1: 0, 2: 0}, "read_uncommitted") == expected
    for partition in range(3):
        offsets = [r.offset for r in expected if r.partition == partition]
        assert offsets == list(range(len(offsets)))  # dense from 0: nothing lost, nothing twice
        batches = log_batches(kafka.bootstrap, topic_name, partition)
        assert {(b.producer_id, b.producer_epoch, b.compression) for b in batches} == {(pid, 0, CODEC_IDS[codec])}
        sequence = 0
        for b in batches:  # one producer id, its sequences consecutive across batches
            assert b.base_sequence == sequence
            sequence += b.header.record_count
    states = admin.describe_producers([(topic_name, p) for p in range(3)])
    assert {tp.partition: [(s.producer_id, s.last_sequence) for s in st] for tp, st in states.items()} == {
        p: [(pid, len([r for r in expected if r.partition == p]) - 1)] for p in range(3)}


def test_acks_1_and_acks_0_without_idempotence(kafka, admin, topic_name):
    admin.create_topic(topic_name, 1, 1)
    reports = {"1": Reports(), "0": Reports()}
    for acks in ("1", "0"):
        producer = Producer({"bootstrap.servers": kafka.bootstrap, "acks": acks, "enable.idempotence": False,
                             "linger.ms": 5})
        for i in range(20):
            producer.produce(topic_name, f"acks{acks}-{i}".encode(), on_delivery=reports[acks])
        assert producer.flush(WAIT) == 0
        producer.close()
    assert reports["1"].errors() == [] and reports["0"].errors() == []
    assert [m.offset() for m in reports["1"].delivered()] == list(range(20))
    assert [m.offset() for m in reports["0"].delivered()] == [-1] * 20  # no answer: the offset is unknown
    got = read_both(kafka.bootstrap, topic_name, {0: 0}, "read_uncommitted")
    assert values(got) == [(0, i, f"acks1-{i}".encode()) for i in range(20)] + [
        (0, 20 + i, f"acks0-{i}".encode()) for i in range(20)]
    assert {b.producer_id for b in log_batches(kafka.bootstrap, topic_name)} == {-1}
    tp = TopicPartition(topic_name, 0)
    assert admin.describe_producers([tp])[tp] == []  # Kafka keeps no state for producers without an id


def test_what_kafka_does_to_a_write_reaches_the_producer(kafka, admin, topic_name):
    """Topic settings Kafka applies when it appends, as oncelog's producer reports them: LogAppendTime stamps,
    recompression to the topic's codec, a record outside message.timestamp.before.max.ms rejected alone (KIP-467,
    the rest of its batch written), a batch over max.message.bytes refused, a new topic created on first write."""
    bs = kafka.bootstrap
    admin.create_topic(f"{topic_name}-lat", 1, 1, {"message.timestamp.type": "LogAppendTime"})
    admin.create_topic(f"{topic_name}-zstd", 1, 1, {"compression.type": "zstd"})
    admin.create_topic(f"{topic_name}-ts", 1, 1, {"message.timestamp.before.max.ms": "3600000"})
    admin.create_topic(f"{topic_name}-big", 1, 1, {"max.message.bytes": "2000"})
    reports = Reports()
    producer = Producer({"bootstrap.servers": bs, "linger.ms": 1000})  # one batch per topic; flush() sends
    before = int(time.time() * 1000)
    producer.produce(f"{topic_name}-lat", b"stamped", timestamp=1000, on_delivery=reports)
    producer.produce(f"{topic_name}-zstd", b"recompressed" * 20, on_delivery=reports)
    now = int(time.time() * 1000)
    for i in range(5):  # one batch; record 2 is older than the topic accepts
        producer.produce(f"{topic_name}-ts", b"t%d" % i, timestamp=1000 if i == 2 else now, on_delivery=reports)
    producer.produce(f"{topic_name}-big", b"z" * 5000, on_delivery=reports)
    producer.produce(f"{topic_name}-auto", b"created", on_delivery=reports)  # auto.create.topics.enable
    assert producer.flush(WAIT) == 0
    producer.close()
    outcome = {(m.topic().removeprefix(topic_name), m.value()[:12]): (e, m) for e, m in reports.items}

    err, m = outcome[("-lat", b"stamped")]
    assert err is None and m.timestamp()[0] == 2 and before <= m.timestamp()[1] <= int(time.time() * 1000)
    (got,) = ours_read(bs, f"{topic_name}-lat", {0: 0})
    assert got.timestamp == m.timestamp()[1]
    assert outcome[("-zstd", b"recompressed")][0] is None
    assert [b.compression for b in log_batches(bs, f"{topic_name}-zstd")] == [CODEC_IDS["zstd"]]
    assert [r.value for r in read_both(bs, f"{topic_name}-zstd", {0: 0}, "read_uncommitted")] == [
        b"recompressed" * 20]
    err, m = outcome[("-ts", b"t2")]
    assert (type(err).__name__, err.code, err.batch_index, m.offset()) == ("RecordError", 32, 2, -1)
    assert [(outcome[("-ts", b"t%d" % i)][0], outcome[("-ts", b"t%d" % i)][1].offset()) for i in (0, 1, 3, 4)] == [
        (None, 0), (None, 1), (None, 2), (None, 3)]
    assert values(read_both(bs, f"{topic_name}-ts", {0: 0}, "read_uncommitted")) == [
        (0, 0, b"t0"), (0, 1, b"t1"), (0, 2, b"t3"), (0, 3, b"t4")]
    err, _ = outcome[("-big", b"z" * 12)]
    assert err.code == 10 and not err.retriable  # MESSAGE_TOO_LARGE
    err, m = outcome[("-auto", b"created")]
    assert err is None and m.offset() == 0
    assert admin.describe_topic(f"{topic_name}-auto").partitions[0].leader == 1


# -- transactions ---------------------------------------------------------------------------------------------


def test_transactions_commit_and_abort_interleaved(kafka, admin, topic_name):
    """p0: a0 a1 commit | x0 (aborted) | a2 commit; p1: x1 (aborted), a plain record written while the aborted
    transaction was open. Markers take offsets; read_committed skips the aborted records and stops at the last
    stable offset while a transaction is open."""
    bs = kafka.bootstrap
    admin.create_topic(topic_name, 2, 1)
    txn_id = f"tx-{topic_name}"
    producer = Producer({"bootstrap.servers": bs, "transactional.id": txn_id, "linger.ms": 0})
    plain = Producer({"bootstrap.servers": bs})
    producer.init_transactions(WAIT)
    producer.begin_transaction()
    producer.produce(topic_name, b"a0", partition=0)
    producer.produce(topic_name, b"a1", partition=0)
    producer.commit_transaction(WAIT)
    producer.begin_transaction()
    producer.produce(topic_name, b"x0", partition=0)
    producer.produce(topic_name, b"x1", partition=1)
    assert producer.flush(WAIT) == 0
    plain.produce(topic_name, b"plain", partition=1)
    assert plain.flush(WAIT) == 0
    producer.abort_transaction(WAIT)
    producer.begin_transaction()
    producer.produce(topic_name, b"a2", partition=0)
    producer.commit_transaction(WAIT)
    settled(admin, topic_name, [0, 1], txn_id)

    starts = {0: 0, 1: 0}
    # p0: a0 0, a1 1, commit 2, x0 3, abort 4, a2 5, commit 6.  p1: x1 0, plain 1, abort 2
    assert values(read_both(bs, topic_name, starts, "read_committed")) == [
        (0, 0, b"a0"), (0, 1, b"a1"), (0, 5, b"a2"), (1, 1, b"plain")]
    assert values(read_both(bs, topic_name, starts, "read_uncommitted")) == [
        (0, 0, b"a0"), (0, 1, b"a1"), (0, 3, b"x0"), (0, 5, b"a2"), (1, 0, b"x1"), (1, 1, b"plain")]
    tp0 = TopicPartition(topic_name, 0)
    assert admin.list_offsets({tp0: "latest"}, isolation="read_committed")[tp0].offset == 7

    # an open transaction holds read_committed readers at its first offset (the last stable offset)
    producer.begin_transaction()
    producer.produce(topic_name, b"open", partition=0)
    assert producer.flush(WAIT) == 0
    plain.produce(topic_name, b"behind", partition=0)
    assert plain.flush(WAIT) == 0
    assert admin.list_offsets({tp0: "latest"}, isolation="read_committed")[tp0].offset == 7
    assert admin.list_offsets({tp0: "latest"})[tp0].offset == 9
    assert values(read_both(bs, topic_name, {0: 5}, "read_committed")) == [(0, 5, b"a2")]
    producer.commit_transaction(WAIT)
    settled(admin, topic_name, [0], txn_id)
    assert admin.describe_transaction(txn_id).state == "CompleteCommit"
    assert values(read_both(bs, topic_name, {0: 5}, "read_committed")) == [
        (0, 5, b"a2"), (0, 7, b"open"), (0, 8, b"behind")]
    producer.close()
    plain.close()


def test_consume_transform_produce_commits_offsets_with_the_transaction(kafka, admin, topic_name):
    bs = kafka.bootstrap
    source, sink, group = topic_name, f"{topic_name}-out", f"g-{topic_name}"
    admin.create_topic(source, 2, 1)
    admin.create_topic(sink, 1, 1)
    produce_values(bs, source, {p: [b"in-%d-%d" % (p, i) for i in range(10)] for p in (0, 1)})
    tps = [TopicPartition(source, p) for p in (0, 1)]
    consumer = Consumer({"bootstrap.servers": bs, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "session.timeout.ms": SESSION_TIMEOUT_MS, "fetch.wait.max.ms": 100})
    txn_id = f"ctp-{topic_name}"
    producer = Producer({"bootstrap.servers": bs, "transactional.id": txn_id, "linger.ms": 5})
    producer.init_transactions(WAIT)
    consumer.subscribe([source])

    def one_round() -> list[bytes]:
        got: list[Any] = []
        deadline = time.monotonic() + WAIT
        while len(got) < 20:
            assert time.monotonic() < deadline, f"read {len(got)} of 20"
            got += [m for m in consumer.consume(20 - len(got), 0.5) if m.error() is None]
        producer.begin_transaction()
        for m in got:
            producer.produce(sink, m.value().replace(b"in", b"out"), key=m.key())
        producer.send_offsets_to_transaction(consumer.position(tps), consumer.consumer_group_metadata(), WAIT)
        assert producer.flush(WAIT) == 0
        return sorted(m.value() for m in got)

    try:
        assert one_round() == sorted(b"in-%d-%d" % (p, i) for p in (0, 1) for i in range(10))
        described = admin.describe_transaction(txn_id)
        assert described.state == "Ongoing" and (sink, 0) in described.partitions
        assert any(t == "__consumer_offsets" for t, _ in described.partitions)  # the group's offsets partition
        # the pending offsets are nobody's yet: an admin reads the last stable ones (none), and the consumer's
        # committed() (require_stable, KIP-447) waits for the transaction to end
        assert admin.list_group_offsets(group) == {}
        with pytest.raises(KafkaTimeoutError):
            consumer.committed(tps, timeout=2)
        producer.abort_transaction(WAIT)
        # committed() waits out the abort's markers (the pending offsets are unstable until they are written)
        assert [tp.offset for tp in consumer.committed(tps, timeout=WAIT)] == [-1001, -1001]
        assert admin.list_group_offsets(group) == {}

        for tp in tps:  # after an abort, go back to the committed offsets (none: the beginning)
            consumer.seek(TopicPartition(source, tp.partition, OFFSET_BEGINNING))
        one_round()
        assert admin.list_group_offsets(group) == {}
        producer.commit_transaction(WAIT)
        assert [tp.offset for tp in consumer.committed(tps, timeout=WAIT)] == [10, 10]
        assert {tp.partition: c.offset for tp, c in admin.list_group_offsets(group).items()} == {0: 10, 1: 10}
    finally:
        consumer.close()
        producer.close()
    settled(admin, sink, [0], txn_id)
    out = sorted(b"out-%d-%d" % (p, i) for p in (0, 1) for i in range(10))
    assert sorted(r.value for r in read_both(bs, sink, {0: 0}, "read_committed")) == out
    assert sorted(r.value for r in read_both(bs, sink, {0: 0}, "read_uncommitted")) == sorted(out * 2)


def test_a_second_instance_fences_the_first(kafka, admin, topic_name):
    bs = kafka.bootstrap
    admin.create_topic(topic_name, 1, 1)
    conf = {"bootstrap.servers": bs, "transactional.id": f"fence-{topic_name}", "linger.ms": 0}
    old = Producer(conf)
    old.init_transactions(WAIT)
    pid, epoch = old.transaction_identity()
    old.begin_transaction()
    old.produce(topic_name, b"zombie-0", partition=0)
    assert old.flush(WAIT) == 0

    new = Producer(conf)
    new.init_transactions(WAIT)  # Kafka fences the old epoch, aborts its transaction, then bumps again
    assert new.transaction_identity() == (pid, epoch + 2)

    # the zombie's next write is refused by the partition leader (INVALID_PRODUCER_EPOCH: abortable on Produce);
    # its abort then meets the coordinator, which says fenced: the instance is done
    reports = Reports()
    old.produce(topic_name, b"zombie-1", partition=0, on_delivery=reports)
    old.flush(WAIT)
    (error,) = reports.errors()
    assert isinstance(error, AbortableError) and error.code == 47
    with pytest.raises(AbortableError):
        old.commit_transaction(WAIT)
    with pytest.raises(ProducerFenced) as info:
        old.abort_transaction(WAIT)
    assert info.value.code == 90 and info.value.fatal
    with pytest.raises(ProducerFenced):
        old.begin_transaction()
    with pytest.raises(ProducerFenced):
        old.produce(topic_name, b"zombie-2", partition=0)
    old.close()

    new.begin_transaction()
    new.produce(topic_name, b"new", partition=0)
    new.commit_transaction(WAIT)
    new.close()
    settled(admin, topic_name, [0], conf["transactional.id"])
    # zombie-0 0, abort marker (the fence) 1, new 2, commit marker 3
    assert values(read_both(bs, topic_name, {0: 0}, "read_committed")) == [(0, 2, b"new")]
    assert values(read_both(bs, topic_name, {0: 0}, "read_uncommitted")) == [(0, 0, b"zombie-0"), (0, 2, b"new")]
    described = admin.describe_transaction(conf["transactional.id"])
    assert (described.state, described.producer_id, described.producer_epoch) == ("CompleteCommit", pid, epoch + 2)


@KAFKA_SLOW
def test_a_transaction_that_outlives_its_timeout_on_kafka(kafka_factory, topic_name):
    """Kafka's reaper (every 500 ms here) aborts a transaction older than transaction.timeout.ms and bumps the
    producer's epoch at the coordinator. What oncelog's producer then meets on Kafka 4.4 (requests of
    transaction version 1) differs from oncelog's broker, where the owner recovers by abort_transaction():

    - its next write to a partition of the transaction: INVALID_PRODUCER_EPOCH (47) from the leader, an
      AbortableError (as oncelog's broker's answer would be);
    - abort_transaction(): EndTxn(ABORT) at the old epoch is answered PRODUCER_FENCED (90): ProducerFenced, the
      instance is done (librdkafka 2.16 is fenced already at the write; the Java client only recovers with
      transaction version 2 requests). Any other next request (commit, a new partition, offsets) is fenced too.

    A new producer instance with the same transactional.id recovers: it initializes and commits. Nothing of the
    timed-out transaction is ever visible to read_committed readers."""
    cluster = kafka_factory({"transaction.abort.timed.out.transaction.cleanup.interval.ms": 500})
    bs = cluster.bootstrap
    timeout_ms = 2000
    with Admin({"bootstrap.servers": bs}, api_timeout=WAIT) as admin:
        admin.create_topic(topic_name, 2, 1)
        txn_id = f"slow-{topic_name}"
        conf = {"bootstrap.servers": bs, "transactional.id": txn_id, "transaction.timeout.ms": timeout_ms,
                "linger.ms": 0}
        producer = Producer(conf)
        producer.init_transactions(WAIT)
        pid, epoch = producer.transaction_identity()
        producer.begin_transaction()
        producer.produce(topic_name, b"timed-out", partition=0)
        assert producer.flush(WAIT) == 0
        # the reaper aborts it once it is older than the timeout: the coordinator's epoch moves on
        wait_until(lambda: admin.describe_transaction(txn_id).state == "CompleteAbort", timeout=WAIT,
                   interval=0.2, what="Kafka's reaper to abort the timed-out transaction")
        described = admin.describe_transaction(txn_id)
        assert (described.producer_id, described.producer_epoch) == (pid, epoch + 1)

        reports = Reports()
        producer.produce(topic_name, b"late", partition=0, on_delivery=reports)
        producer.flush(WAIT)
        (error,) = reports.errors()
        assert isinstance(error, AbortableError) and error.code == 47, repr(error)  # INVALID_PRODUCER_EPOCH
        with pytest.raises(AbortableError):
            producer.commit_transaction(WAIT)
        with pytest.raises(ProducerFenced) as info:
            producer.abort_transaction(WAIT)
        assert info.value.code == 90  # PRODUCER_FENCED: Kafka does not take the old epoch's EndTxn
        producer.close()

        # a commit after the timeout (nothing written since) is fenced the same way
        again = Producer(conf)
        again.init_transactions(WAIT)
        again.begin_transaction()
        again.produce(topic_name, b"committed-too-late", partition=1)
        assert again.flush(WAIT) == 0
        wait_until(lambda: admin.describe_transaction(txn_id).state == "CompleteAbort", timeout=WAIT,
                   interval=0.2, what="the second timed-out transaction to be aborted")
        with pytest.raises(ProducerFenced):
            again.commit_transaction(WAIT)
        again.close()

        fresh = Producer(conf)
        fresh.init_transactions(WAIT)
        fresh.begin_transaction()
        fresh.produce(topic_name, b"after", partition=0)
        fresh.commit_transaction(WAIT)
        fresh.close()
        settled(admin, topic_name, [0, 1], txn_id)
        assert admin.describe_transaction(txn_id).state == "CompleteCommit"
    committed = read_both(bs, topic_name, {0: 0, 1: 0}, "read_committed")
    assert [r.value for r in committed] == [b"after"]
    assert sorted(r.value for r in read_both(bs, topic_name, {0: 0, 1: 0}, "read_uncommitted")) == [
        b"after", b"committed-too-late", b"timed-out"]


# -- the idempotent producer through a Kafka crash --------------------------------------------------------------


@KAFKA_SLOW
def test_idempotent_producer_through_a_kafka_sigkill_and_restart(kafka_factory, topic_name):
    """Records in flight and queued while the node is SIGKILLed and restarted: every one is acknowledged, and
    Kafka holds each exactly once, in produce order per partition, at the offset its delivery report gave."""
    cluster = kafka_factory()
    node = cluster.node(1)
    bs = cluster.bootstrap
    partitions = 3
    with Admin({"bootstrap.servers": bs}, api_timeout=WAIT) as admin:
        admin.create_topic(topic_name, partitions, 1)
    # the outage lasts at most a restart (start timeout + Kafka's session timeout): deliveries must outlive it
    outage_s = cluster.start_timeout + cluster.session_timeout_s
    delivery_timeout_ms = int((outage_s + WAIT) * 1000)
    reports = Reports()
    producer = Producer({"bootstrap.servers": bs, "linger.ms": 5, "delivery.timeout.ms": delivery_timeout_ms,
                         "retry.backoff.max.ms": 1000, "reconnect.backoff.max.ms": 1000})
    counters = [0] * partitions

    def produce(n: int) -> None:
        for i in range(n):
            p = i % partitions
            producer.produce(topic_name, b"%d:%06d" % (p, counters[p]), partition=p, on_delivery=reports)
            counters[p] += 1
            producer.poll(0)

    produce(300)
    assert producer.flush(WAIT) == 0
    produce(300)        # in flight or just acknowledged when the node dies
    node.kill()
    produce(300)        # queued while it is down
    node.start()
    assert producer.flush(delivery_timeout_ms / 1000) == 0
    stats = producer._core.cluster.stats
    producer.close()
    assert stats["connect_failures"] > 0, "the producer never noticed the outage"
    assert reports.errors() == []
    acked = {(m.partition(), m.value()): m.offset() for m in reports.delivered()}
    assert len(acked) == 900

    got = read_both(bs, topic_name, {p: 0 for p in range(partitions)}, "read_uncommitted")
    for p in range(partitions):
        mine = [r for r in got if r.partition == p]
        assert [r.value for r in mine] == [b"%d:%06d" % (p, i) for i in range(counters[p])]  # once each, in order
        assert [r.offset for r in mine] == list(range(counters[p]))
        for r in mine:  # a duplicate answered by the broker reports no offset (-1); every other report is exact
            assert acked[(p, r.value)] in (r.offset, -1)


# -- consumer groups --------------------------------------------------------------------------------------------

Seen = list[tuple[int, int]]


def group_member(bootstrap: str, group: str, **conf: Any) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "fetch.wait.max.ms": 100, "heartbeat.interval.ms": 500,
                     "session.timeout.ms": SESSION_TIMEOUT_MS, "enable.auto.commit": True,
                     "auto.commit.interval.ms": 500, **conf})


def poll_members(members: dict[str, Consumer], seen: dict[str, Seen], until: Callable[[], bool],
                 what: str) -> None:
    """Poll every member in turn (short polls, one thread, so every member takes part in rebalances)."""
    deadline = time.monotonic() + WAIT
    while not until():
        assert time.monotonic() < deadline, f"timed out waiting for {what}; read {({k: len(v) for k, v in seen.items()})}"
        for name, consumer in members.items():
            m = consumer.poll(0.05)
            if m is not None:
                assert m.error() is None, f"{name}: {m.error()!r}"
                seen[name].append((m.partition(), m.offset()))


def assigned(members: dict[str, Consumer]) -> dict[str, list[int]]:
    return {name: sorted(tp.partition for tp in c.assignment()) for name, c in members.items()}


def covers(partitions: int, sizes: list[int]) -> Callable[[dict[str, list[int]]], bool]:
    def check(got: dict[str, list[int]]) -> bool:
        flat = [p for parts in got.values() for p in parts]
        return sorted(flat) == list(range(partitions)) and sorted(len(v) for v in got.values()) == sizes
    return check


@pytest.mark.parametrize("strategy", ["range", "roundrobin"])
def test_group_members_split_partitions_and_rebalance(kafka, admin, topic_name, strategy):
    bs, group = kafka.bootstrap, f"g-{topic_name}"
    admin.create_topic(topic_name, 4, 1)
    produce_values(bs, topic_name, {p: [b"a%d" % i for i in range(10)] for p in range(4)})
    conf = {"partition.assignment.strategy": strategy}
    members = {"a": group_member(bs, group, **conf), "b": group_member(bs, group, **conf)}
    seen: dict[str, Seen] = {"a": [], "b": [], "c": []}
    try:
        for c in members.values():
            c.subscribe([topic_name])
        poll_members(members, seen, lambda: covers(4, [2, 2])(assigned(members)), "a and b to split 4 partitions")
        got = assigned(members)
        if strategy == "range":  # one topic: each member gets a contiguous range
            assert sorted(got.values()) == [[0, 1], [2, 3]]
        else:
            assert sorted(got.values()) == [[0, 2], [1, 3]]
        described = admin.describe_group(group)
        assert (described.state, described.protocol_type, described.protocol) == ("Stable", "consumer", strategy)
        assert len(described.members) == 2
        generation = members["a"].consumer_group_metadata().generation_id
        poll_members(members, seen, lambda: len(seen["a"]) + len(seen["b"]) >= 40, "the first 40 records")

        members["c"] = group_member(bs, group, **conf)
        members["c"].subscribe([topic_name])
        poll_members(members, seen, lambda: covers(4, [1, 1, 2])(assigned(members)), "a rebalance onto 3 members")
        assert members["a"].consumer_group_metadata().generation_id > generation
        described = admin.describe_group(group)
        assert described.state == "Stable" and len(described.members) == 3
        assert sorted(p for m in described.members for _, p in m.assignment) == [0, 1, 2, 3]
        produce_values(bs, topic_name, {p: [b"b%d" % i for i in range(5)] for p in range(4)})
        poll_members(members, seen, lambda: sum(map(len, seen.values())) >= 60, "the next 20 records")
        assert seen["c"], "the new member read nothing"
    finally:
        started = time.monotonic()
        for c in members.values():
            c.close()
    # close() commits and sends LeaveGroup: the group is empty at once, not after the session timeout
    wait_until(lambda: admin.describe_group(group).state == "Empty", timeout=PROMPTLY_S, interval=0.1,
               what="the group to be empty after close()")
    assert time.monotonic() - started < PROMPTLY_S
    everything = [x for v in seen.values() for x in v]
    assert len(everything) == len(set(everything)), "a record was consumed twice"
    assert set(everything) == {(p, o) for p in range(4) for o in range(15)}
    assert {tp.partition: c.offset for tp, c in admin.list_group_offsets(group).items()} == {p: 15 for p in range(4)}


def test_consumer_commit_seek_times_watermarks_pause_resume(kafka, admin, topic_name):
    bs, group = kafka.bootstrap, f"g-{topic_name}"
    admin.create_topic(topic_name, 2, 1)
    produce_values(bs, topic_name, {0: [b"r%d" % i for i in range(20)], 1: [b"s%d" % i for i in range(10)]})
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    consumer = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})

    def take(n: int) -> list[Any]:
        out: list[Any] = []
        deadline = time.monotonic() + WAIT
        while len(out) < n:
            assert time.monotonic() < deadline, f"read {len(out)} of {n}"
            m = consumer.poll(0.2)
            if m is not None:
                assert m.error() is None, repr(m.error())
                out.append(m)
        return out

    try:
        consumer.assign([TopicPartition(topic_name, 0, 0)])
        first = take(10)
        assert [(m.offset(), m.value(), m.timestamp()) for m in first] == [
            (i, b"r%d" % i, (TIMESTAMP_CREATE_TIME, TS0 + 1000 * i)) for i in range(10)]
        assert consumer.position([tp0])[0].offset == 10
        # commit one message's offset (+1), then explicit offsets; committed() and the admin agree
        assert [(tp.partition, tp.offset) for tp in consumer.commit(message=first[-1], asynchronous=False)] == [
            (0, 10)]
        consumer.commit(offsets=[TopicPartition(topic_name, 1, 4)], asynchronous=False)
        assert [tp.offset for tp in consumer.committed([tp0, tp1], timeout=WAIT)] == [10, 4]
        assert {tp.partition: c.offset for tp, c in admin.list_group_offsets(group).items()} == {0: 10, 1: 4}

        assert consumer.get_watermark_offsets(tp0, timeout=WAIT) == (0, 20)
        assert consumer.get_watermark_offsets(tp0, cached=True) == (0, 20)  # from the last fetch
        found = consumer.offsets_for_times([TopicPartition(topic_name, 0, TS0 + 5500),
                                            TopicPartition(topic_name, 1, TS0 + 10**9)], timeout=WAIT)
        assert [(tp.partition, tp.offset) for tp in found] == [(0, 6), (1, -1)]

        consumer.seek(TopicPartition(topic_name, 0, 15))
        assert [m.offset() for m in take(2)] == [15, 16]
        admin.delete_records({tp0: 3})
        assert consumer.get_watermark_offsets(tp0, timeout=WAIT) == (3, 20)
        consumer.seek(TopicPartition(topic_name, 0, OFFSET_BEGINNING))
        assert take(1)[0].offset() == 3  # the beginning moved with the log start offset
        strict = Consumer({"bootstrap.servers": bs, "auto.offset.reset": "error", "fetch.wait.max.ms": 100})
        try:  # a position below the log start is OFFSET_OUT_OF_RANGE: with reset "error", an error to the caller
            strict.assign([TopicPartition(topic_name, 0, 1)])
            event = wait_until(lambda: strict.poll(0.2), timeout=WAIT, interval=0, what="the reset error")
            assert isinstance(event.error(), OffsetResetError) and event.error().code == 1, repr(event.error())
        finally:
            strict.close()
        assert consumer.offsets_for_times([TopicPartition(topic_name, 0, TS0)], timeout=WAIT)[0].offset == 3

        # pause: a paused partition returns nothing while the other flows; resume picks up where it stopped
        consumer.assign([TopicPartition(topic_name, 0, 18), TopicPartition(topic_name, 1, 0)])
        consumer.pause([tp1])
        assert [(m.partition(), m.offset()) for m in take(2)] == [(0, 18), (0, 19)]
        quiet_until = time.monotonic() + 20 * 0.1  # twenty fetch waits (fetch.wait.max.ms) with nothing from p1
        while time.monotonic() < quiet_until:
            m = consumer.poll(0.1)
            assert m is None, f"a record while paused: {m.partition()}@{m.offset()}"
        consumer.resume([tp1])
        assert [(m.partition(), m.offset()) for m in take(10)] == [(1, i) for i in range(10)]
    finally:
        consumer.close()


# -- admin --------------------------------------------------------------------------------------------------------


def test_admin_cluster_topics_and_configs(kafka, admin, topic_name):
    created = admin.create_topic(topic_name, 2, 1, {"retention.ms": "3600000", "cleanup.policy": "compact,delete"})
    assert (created.name, created.num_partitions, created.replication_factor) == (topic_name, 2, 1)
    assert created.topic_id and created.configs["retention.ms"] == "3600000"
    with pytest.raises(KafkaError) as info:
        admin.create_topic(topic_name, 2, 1)
    assert (info.value.code, info.value.name) == (36, "TOPIC_ALREADY_EXISTS")
    assert not info.value.retriable and topic_name in str(info.value)
    assert code_of(admin.create_topic, f"{topic_name}-rf", 1, 3) == 38  # INVALID_REPLICATION_FACTOR: one broker
    assert code_of(admin.create_topic, f"{topic_name}-cfg", 1, 1, {"retention.ms": "soon"}) == 40  # INVALID_CONFIG

    cluster = admin.describe_cluster()
    assert cluster.cluster_id == kafka.cluster_id
    assert cluster.brokers == ((1, "127.0.0.1", kafka.node(1).ports["PLAINTEXT"]),)
    assert cluster.controller_id == 1

    listing = {t.name: t for t in admin.list_topics()}
    assert (listing[topic_name].partitions, listing[topic_name].internal, listing[topic_name].topic_id) == (
        2, False, created.topic_id)
    assert not any(t.internal for t in listing.values())
    described = admin.describe_topics([topic_name])[topic_name]
    assert [(p.partition, p.leader, p.replicas, p.isr) for p in described.partitions] == [
        (0, 1, (1,), (1,)), (1, 1, (1,), (1,))]
    assert described.topic_id == created.topic_id
    admin.create_partitions(topic_name, 3)  # returns once the metadata shows them
    assert len(admin.describe_topic(topic_name).partitions) == 3
    assert code_of(admin.create_partitions, topic_name, 2) == 37  # INVALID_PARTITIONS: no shrinking

    # Kafka applies a config change to the answering broker's metadata a moment after it acknowledged it
    # (oncelog's broker before): what follows an alter is read until it shows

    def shows(expected: dict[str, tuple[str, str]]) -> Callable[[], bool]:
        def check() -> bool:
            found = admin.describe_topic_configs(topic_name, list(expected))
            return {k: (c.value, c.source) for k, c in found.items()} == expected
        return check

    configs = admin.describe_topic_configs(topic_name)
    assert (configs["retention.ms"].value, configs["retention.ms"].source) == ("3600000", "DYNAMIC_TOPIC_CONFIG")
    assert configs["cleanup.policy"].value == "compact,delete"
    assert configs["segment.bytes"].source == "DEFAULT_CONFIG"
    with_synonyms = admin.describe_topic_configs(topic_name, ["segment.bytes"], synonyms=True)["segment.bytes"]
    assert ("log.segment.bytes", "1073741824", "DEFAULT_CONFIG") in with_synonyms.synonyms
    admin.alter_topic_configs(topic_name, set={"retention.ms": "7200000", "max.message.bytes": "2000000"},
                              delete=["cleanup.policy"])
    wait_until(shows({"retention.ms": ("7200000", "DYNAMIC_TOPIC_CONFIG"),
                      "max.message.bytes": ("2000000", "DYNAMIC_TOPIC_CONFIG"),
                      "cleanup.policy": ("delete", "DEFAULT_CONFIG")}), timeout=WAIT, what="the altered configs")
    assert code_of(admin.alter_topic_configs, topic_name, set={"retention.ms": "soon"}) == 40
    admin.alter_topic_configs(topic_name, append={"cleanup.policy": "compact"})
    wait_until(shows({"cleanup.policy": ("delete,compact", "DYNAMIC_TOPIC_CONFIG")}), timeout=WAIT,
               what="the appended list value")
    admin.alter_topic_configs(topic_name, subtract={"cleanup.policy": "delete"})
    wait_until(shows({"cleanup.policy": ("compact", "DYNAMIC_TOPIC_CONFIG")}), timeout=WAIT,
               what="the subtracted list value")
    admin.alter_topic_configs(topic_name, set={"retention.ms": "1"}, validate_only=True)
    assert admin.describe_topic_configs(topic_name, ["retention.ms"])["retention.ms"].value == "7200000"
    assert admin.create_topic(f"{topic_name}-v", 3, 1, validate_only=True).num_partitions == 3
    defaults = admin.create_topic(f"{topic_name}-d")  # -1, -1: the broker's num.partitions and factor
    assert (defaults.num_partitions, defaults.replication_factor) == (1, 1)

    broker = admin.describe_broker_configs()
    assert (broker["node.id"].value, broker["node.id"].source, broker["node.id"].read_only) == (
        "1", "STATIC_BROKER_CONFIG", True)
    assert admin.describe_broker_configs(1, ["num.partitions"])["num.partitions"].value == "1"

    assert f"{topic_name}-v" not in {t.name for t in admin.list_topics()}
    admin.delete_topics([topic_name, f"{topic_name}-d"])
    wait_until(lambda: not {topic_name, f"{topic_name}-d"} & {t.name for t in admin.list_topics()}, timeout=WAIT,
               what="the deleted topics to leave the metadata")
    assert code_of(admin.describe_topic, topic_name) == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert code_of(admin.delete_topics, [topic_name]) == 3


def test_a_created_topic_is_usable_at_once(kafka, admin, topic_name):
    """Kafka acknowledges CreateTopics / CreatePartitions when its controller has committed them and serves the
    topic a moment later; before oncelog's Admin waited for the metadata, about one use in ten right after a
    create failed with UNKNOWN_TOPIC_OR_PARTITION (final for the Admin) or saw the old partition count."""
    names = [f"{topic_name}-{i}" for i in range(20)]
    for name in names:
        admin.create_topic(name, 2, 1)
        assert admin.list_offsets({(name, 1): "latest"})[TopicPartition(name, 1)].offset == 0
        assert admin.describe_topic_configs(name, ["retention.ms"])["retention.ms"].source == "DEFAULT_CONFIG"
        admin.create_partitions(name, 3)
        assert [p.partition for p in admin.describe_topic(name).partitions] == [0, 1, 2]
        assert admin.list_offsets({(name, 2): "earliest"})[TopicPartition(name, 2)].offset == 0
    admin.delete_topics(names)


def test_admin_offsets_and_delete_records(kafka, admin, topic_name):
    admin.create_topic(topic_name, 2, 1)
    produce_values(kafka.bootstrap, topic_name, {0: [b"r%d" % i for i in range(10)]})
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)

    def offsets(spec: Any, tp: TopicPartition = tp0) -> tuple[int, int]:
        found = admin.list_offsets({tp: spec})[tp]
        return found.offset, found.timestamp

    assert offsets("earliest") == (0, -1) and offsets("latest") == (10, -1)
    assert offsets("earliest", tp1) == (0, -1) and offsets("latest", tp1) == (0, -1)
    assert offsets("max_timestamp") == (9, TS0 + 9000)
    assert offsets(TS0 + 3500) == (4, TS0 + 4000)  # the first record at or after the time
    assert offsets(TS0 + 10**9)[0] == -1
    assert admin.delete_records({tp0: 4}) == {tp0: 4}
    assert offsets("earliest") == (4, -1)
    assert offsets(TS0) == (4, TS0 + 4000)
    assert code_of(admin.delete_records, {tp0: 11}) == 1  # OFFSET_OUT_OF_RANGE: past the high watermark
    assert admin.delete_records({tp0: -1}) == {tp0: 10}  # -1: up to the high watermark
    assert offsets("earliest") == (10, -1) and offsets("latest") == (10, -1)
    assert ck_consume(kafka.bootstrap, topic_name, {0: 10}, timeout=WAIT) == []


def test_admin_groups(kafka, admin, topic_name):
    bs, group = kafka.bootstrap, f"g-{topic_name}"
    admin.create_topic(topic_name, 2, 1)
    produce_values(bs, topic_name, {p: [b"%d-%d" % (p, i) for i in range(4)] for p in (0, 1)})
    consumer = group_member(bs, group, **{"client.id": "member-1", "enable.auto.commit": False})
    seen: dict[str, Seen] = {"m": []}
    try:
        consumer.subscribe([topic_name])
        poll_members({"m": consumer}, seen, lambda: len(seen["m"]) >= 8, "the member to read 8 records")
        consumer.commit(offsets=[TopicPartition(topic_name, 0, 3), TopicPartition(topic_name, 1, 4)],
                        asynchronous=False)
        listed = {g.group_id: g for g in admin.list_groups()}
        assert (listed[group].state, listed[group].protocol_type) == ("Stable", "consumer")
        assert group in {g.group_id for g in admin.list_groups(["Stable"])}
        assert group not in {g.group_id for g in admin.list_groups(["Empty"])}
        described = admin.describe_group(group)
        assert (described.state, described.protocol_type, described.protocol, described.coordinator) == (
            "Stable", "consumer", "range", 1)
        (m,) = described.members
        assert (m.client_id, m.host, m.assignment) == ("member-1", "/127.0.0.1", ((topic_name, 0), (topic_name, 1)))
        assert m.member_id == consumer.consumer_group_metadata().member_id
        offsets = admin.list_group_offsets(group)
        assert {tp.partition: c.offset for tp, c in offsets.items()} == {0: 3, 1: 4}
        assert list(admin.list_group_offsets(group, [(topic_name, 1)])) == [TopicPartition(topic_name, 1)]
        # a live group's offsets belong to its members (as on oncelog's broker)
        assert code_of(admin.alter_group_offsets, group, {(topic_name, 0): 0}) == 25  # UNKNOWN_MEMBER_ID
        assert code_of(admin.plan_group_offset_reset, group, [(topic_name, 0)], to="earliest") == 68
        assert code_of(admin.delete_groups, [group]) == 68  # NON_EMPTY_GROUP
    finally:
        consumer.close()
    assert admin.describe_group(group).state == "Empty"
    admin.alter_group_offsets(group, {(topic_name, 0): 1, (topic_name, 1): 2})
    assert {tp.partition: c.offset for tp, c in admin.list_group_offsets(group).items()} == {0: 1, 1: 2}
    assert admin.plan_group_offset_reset(group, [(topic_name, 0)], to="shift", value=-5)[0].target == 0
    admin.delete_groups([group])
    assert admin.describe_group(group).state == "Dead"
    assert admin.list_group_offsets(group) == {}
    assert code_of(admin.delete_groups, [group]) == 69  # GROUP_ID_NOT_FOUND


def test_admin_producers_and_transactions(kafka, admin, topic_name):
    bs = kafka.bootstrap
    admin.create_topic(topic_name, 2, 1)
    idempotent = Producer({"bootstrap.servers": bs})
    for i in range(5):
        idempotent.produce(topic_name, b"i%d" % i, partition=0)
    assert idempotent.flush(WAIT) == 0
    idem_pid = idempotent.transaction_identity()[0]
    idempotent.close()
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    (state,) = admin.describe_producers([tp0])[tp0]
    assert (state.producer_id, state.producer_epoch, state.last_sequence, state.current_txn_start_offset) == (
        idem_pid, 0, 4, None)

    txn_id = f"adm-{topic_name}"
    producer = Producer({"bootstrap.servers": bs, "transactional.id": txn_id, "transaction.timeout.ms": 45000,
                         "linger.ms": 0})
    producer.init_transactions(WAIT)
    pid, epoch = producer.transaction_identity()
    before = int(time.time() * 1000)
    producer.begin_transaction()
    producer.produce(topic_name, b"t0", partition=1)
    producer.produce(topic_name, b"t1", partition=1)
    assert producer.flush(WAIT) == 0
    try:
        (open_state,) = admin.describe_producers([tp1])[tp1]
        assert (open_state.producer_id, open_state.producer_epoch, open_state.current_txn_start_offset) == (
            pid, epoch, 0)
        d = admin.describe_transaction(txn_id)
        assert (d.transactional_id, d.coordinator_id, d.state, d.producer_id, d.producer_epoch, d.timeout_ms) == (
            txn_id, 1, "Ongoing", pid, epoch, 45000)
        assert d.partitions == ((topic_name, 1),) and before - 1000 <= d.start_time_ms <= int(time.time() * 1000)
        listed = {t.transactional_id: t for t in admin.list_transactions()}
        assert (listed[txn_id].producer_id, listed[txn_id].state) == (pid, "Ongoing")
        assert [t.transactional_id for t in admin.list_transactions(producer_ids=[pid])] == [txn_id]
        assert txn_id in {t.transactional_id for t in admin.list_transactions(["Ongoing"])}
        assert txn_id not in {t.transactional_id for t in admin.list_transactions(["CompleteCommit"])}
        assert txn_id in {t.transactional_id for t in admin.list_transactions(min_duration_ms=0)}
        assert txn_id not in {t.transactional_id for t in admin.list_transactions(min_duration_ms=3_600_000)}
        with pytest.raises(KafkaError, match="unknown transaction states: Bogus"):
            admin.list_transactions(["Bogus"])
        assert admin.list_offsets({tp1: "latest"}, isolation="read_committed")[tp1].offset == 0  # held back
        assert admin.list_offsets({tp1: "latest"})[tp1].offset == 2
        # find-hanging's checks run on Kafka (DescribeProducers, ListTransactions by producer id,
        # DescribeTransactions): the open transaction is old enough with no allowance, but its coordinator
        # lists the partition, so it will end it: not hanging
        wait_until(lambda: int(time.time() * 1000) > open_state.last_timestamp, what="the clock to move on")
        assert admin.find_hanging_transactions(topic_name, max_transaction_timeout_ms=0) == []
        assert admin.find_hanging_transactions(topic_name, 1, max_transaction_timeout_ms=0) == []
        assert admin.find_hanging_transactions(topic_name) == []
    finally:
        producer.commit_transaction(WAIT)
        producer.close()
    settled(admin, topic_name, [1], txn_id)
    d = admin.describe_transaction(txn_id)
    assert (d.state, d.partitions) == ("CompleteCommit", ())
    assert admin.list_offsets({tp1: "latest"}, isolation="read_committed")[tp1].offset == 3
    assert admin.describe_producers([tp1])[tp1][0].current_txn_start_offset is None
    assert code_of(admin.describe_transaction, f"{txn_id}-missing") == 105  # TRANSACTIONAL_ID_NOT_FOUND


def _raw_transactional_write(bootstrap: str, topic: str, partition: int, txn_id: str, producer_id: int,
                             values: list[bytes]) -> int:
    """One transactional batch (epoch 0, sequence 0) by a Produce request of its own, with no AddPartitionsToTxn
    before it; returns its base offset."""
    from kafka.protocol.producer import ProduceRequest

    from oncelog.records.builder import build_batch
    from tests.support.wire import Wire

    batch = build_batch([(None, v) for v in values], transactional=True, producer_id=producer_id, producer_epoch=0,
                        base_sequence=0)
    req = ProduceRequest[9]
    data = req.TopicProduceData
    message = req(transactional_id=txn_id, acks=-1, timeout_ms=int(REQUEST_TIMEOUT_S * 1000), topic_data=[
        data(name=topic, partition_data=[data.PartitionProduceData(index=partition, records=bytes(batch))])])
    with Wire(bootstrap, timeout=REQUEST_TIMEOUT_S) as wire:
        resp = wire.request(message, 9)
    (part,) = resp.responses[0].partition_responses
    assert part.error_code == 0, part
    return part.base_offset


@KAFKA_SLOW
def test_find_and_abort_a_hanging_transaction_on_kafka(kafka_factory, topic_name):
    """A transaction no coordinator will end, made the way Kafka made them before KIP-890 verified transactional
    writes (a node with transaction.partition.verification.enable=false): a transactional batch written by a
    producer id no transactional id maps to. It holds read_committed readers back; find_hanging_transactions (and
    `oncelog transactions find-hanging`) finds it, `oncelog transactions abort` writes its abort marker
    (WriteTxnMarkers to the leader, as kafka-transactions.sh does), and the last stable offset moves on."""
    cluster = kafka_factory({"transaction.partition.verification.enable": "false"})
    bs = cluster.bootstrap
    with Admin({"bootstrap.servers": bs}, api_timeout=WAIT) as admin:
        admin.create_topic(topic_name, 2, 1)
        idempotent = Producer({"bootstrap.servers": bs})
        idempotent.produce(topic_name, b"elsewhere", partition=1)
        assert idempotent.flush(WAIT) == 0
        pid = idempotent.transaction_identity()[0]
        idempotent.close()
        produce_values(bs, topic_name, {0: [b"before"]})
        start = _raw_transactional_write(bs, topic_name, 0, f"unknown-{topic_name}", pid, [b"h0", b"h1"])
        assert start == 1
        produce_values(bs, topic_name, {0: [b"after"]})
        tp = TopicPartition(topic_name, 0)
        assert admin.list_offsets({tp: "latest"}, isolation="read_committed")[tp].offset == 1  # held back
        assert admin.list_offsets({tp: "latest"})[tp].offset == 4
        (state,) = [s for s in admin.describe_producers([tp])[tp] if s.producer_id == pid]
        assert (state.producer_epoch, state.current_txn_start_offset, state.coordinator_epoch) == (0, 1, -1)
        assert admin.find_hanging_transactions(topic_name) == []  # silent for less than 15 minutes
        wait_until(lambda: int(time.time() * 1000) > state.last_timestamp, what="the clock to move on")
        (hanging,) = admin.find_hanging_transactions(topic_name, max_transaction_timeout_ms=0)
        assert (hanging.topic, hanging.partition, hanging.producer_id, hanging.producer_epoch, hanging.start_offset,
                hanging.reason) == (topic_name, 0, pid, 0, 1, "unknown producer id")
        assert admin.find_hanging_transactions(topic_name, 1, max_transaction_timeout_ms=0) == []

        (found,) = cli_json(bs, "transactions", "find-hanging", "--topic", topic_name,
                            "--max-transaction-timeout", "0")
        assert (found["producer_id"], found["start_offset"], found["reason"]) == (pid, 1, "unknown producer id")
        assert cli_error(bs, "transactions", "abort", "--topic", topic_name, "--partition", "0",
                         "--start-offset", "2") == (
            f"oncelog: error: no open transaction starts at offset 2 on {topic_name}-0")
        aborted = cli_json(bs, "transactions", "abort", "--topic", topic_name, "--partition", "0",
                           "--start-offset", "1")
        assert aborted == {"topic": topic_name, "partition": 0, "producer_id": pid, "producer_epoch": 0,
                           "coordinator_epoch": -1, "aborted": True}
        # the marker went at 4: the last stable offset is the end of the log again
        assert admin.list_offsets({tp: "latest"}, isolation="read_committed")[tp].offset == 5
        assert admin.find_hanging_transactions(max_transaction_timeout_ms=0) == []
    assert values(read_both(bs, topic_name, {0: 0}, "read_committed")) == [(0, 0, b"before"), (0, 3, b"after")]


# -- the CLI ------------------------------------------------------------------------------------------------------


def run_cli(bootstrap: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("ONCELOG_BOOTSTRAP", None)
    return subprocess.run([str(ONCELOG), *args, "--bootstrap-server", bootstrap], input=input,
                          capture_output=True, text=True, timeout=3 * WAIT, env=env)


def cli_json(bootstrap: str, *args: str, input: str | None = None) -> Any:
    proc = run_cli(bootstrap, *args, "--json", input=input)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    assert proc.stderr == "", proc.stderr
    return json.loads(proc.stdout)


def cli_lines(bootstrap: str, *args: str) -> list[dict]:
    """A command printing JSON Lines (consume --json)."""
    proc = run_cli(bootstrap, *args, "--json")
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    return [json.loads(line) for line in proc.stdout.splitlines()]


def cli_error(bootstrap: str, *args: str, input: str | None = None) -> str:
    """A command that must fail: exit status 1, one line on stderr, nothing on stdout; returns the line."""
    proc = run_cli(bootstrap, *args, input=input)
    assert proc.returncode == 1, f"exit {proc.returncode}: {proc.stdout} {proc.stderr}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert proc.stdout == "", proc.stdout
    return lines[0]


def test_cli_is_installed():
    assert ONCELOG.is_file(), f"{ONCELOG} missing: the project is not installed in this interpreter's venv"


def test_cli_topics(kafka, topic_name):
    bs = kafka.bootstrap
    created = cli_json(bs, "topics", "create", topic_name, "-p", "2", "-c", "retention.ms=3600000")
    assert (created["name"], created["num_partitions"], created["created"]) == (topic_name, 2, True)
    assert cli_error(bs, "topics", "create", topic_name) == (
        f"oncelog: error: TOPIC_ALREADY_EXISTS (36): Topic '{topic_name}' already exists.")
    assert cli_json(bs, "topics", "create", topic_name, "--if-not-exists") == {"name": topic_name, "created": False}
    listed = {t["name"]: t for t in cli_json(bs, "topics", "list")}
    assert (listed[topic_name]["partitions"], listed[topic_name]["topic_id"]) == (2, created["topic_id"])
    (described,) = cli_json(bs, "topics", "describe", topic_name)
    assert [(p["partition"], p["leader"], p["replicas"], p["isr"]) for p in described["partitions"]] == [
        (0, 1, [1], [1]), (1, 1, [1], [1])]
    assert (described["configs"]["retention.ms"]["value"], described["configs"]["retention.ms"]["source"]) == (
        "3600000", "DYNAMIC_TOPIC_CONFIG")
    text = run_cli(bs, "topics", "describe", topic_name).stdout
    assert text.splitlines()[0].split()[:6] == ["Topic:", topic_name, "TopicId:", created["topic_id"],
                                                "Partitions:", "2"]
    altered = cli_json(bs, "topics", "alter", topic_name, "-p", "3", "-c", "segment.ms=100000",
                       "--delete-config", "retention.ms")
    assert altered == {"name": topic_name, "partitions": 3, "overrides": {"segment.ms": "100000"},
                       "validate_only": False}
    assert cli_error(bs, "topics", "alter", topic_name, "-c", "retention.ms=soon").startswith(
        "oncelog: error: INVALID_CONFIG (40): ")
    assert cli_json(bs, "topics", "delete", topic_name) == {"deleted": [topic_name]}
    wait_until(lambda: topic_name not in {t["name"] for t in cli_json(bs, "topics", "list")}, timeout=WAIT,
               interval=0.5, what="the topic to leave the listing")
    assert cli_error(bs, "topics", "delete", topic_name).startswith(
        "oncelog: error: UNKNOWN_TOPIC_OR_PARTITION (3): ")
    assert cli_json(bs, "topics", "delete", topic_name, "--if-exists") == {"deleted": []}


def test_cli_produce_and_consume(kafka, admin, topic_name):
    bs = kafka.bootstrap
    cli_json(bs, "topics", "create", topic_name, "-p", "3")
    keys = [f"k{i}" for i in range(12)]
    summary = cli_json(bs, "produce", topic_name, "-K", ":", input="".join(f"{k}:v-{k}\n" for k in keys))
    assert summary["records"] == 12 and summary["transactional_id"] is None
    per_partition = {str(p): sum(1 for k in keys if partition_for_key(k.encode(), 3) == p) for p in range(3)}
    assert {p: r["records"] for p, r in summary["partitions"].items()} == {
        p: n for p, n in per_partition.items() if n}
    txn_id = f"cli-{topic_name}"
    summary = cli_json(bs, "produce", topic_name, "--transactional", "--transactional-id", txn_id, "-p", "1",
                       input="t0\nt1\n")
    first = per_partition["1"]
    assert summary == {"topic": topic_name, "records": 2, "transactional_id": txn_id,
                       "partitions": {"1": {"records": 2, "first_offset": first, "last_offset": first + 1}}}
    settled(admin, topic_name, range(3), txn_id)
    assert cli_json(bs, "transactions", "describe", txn_id)["state"] == "CompleteCommit"
    # a failed transactional run (a line without the key separator) leaves nothing visible
    assert cli_error(bs, "produce", topic_name, "--transactional", "-p", "2", "-K", ":",
                     input="k:x\nbroken\n") == "oncelog: error: line 2 has no key separator ':'"
    settled(admin, topic_name, range(3))

    records = cli_lines(bs, "consume", topic_name, "--from-beginning", "--until-end")
    got = sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in records)
    theirs = ck_consume(bs, topic_name, {0: 0, 1: 0, 2: 0}, timeout=WAIT, **{"isolation.level": "read_committed"})
    assert got == [(r.partition, r.offset, None if r.key is None else r.key.decode(), r.value.decode())
                   for r in theirs]
    assert sorted(v for *_, v in got) == sorted([f"v-{k}" for k in keys] + ["t0", "t1"])
    # read_uncommitted also shows the failed run's record, if it was sent before the abort
    uncommitted = cli_lines(bs, "consume", topic_name, "--from-beginning", "--until-end", "--isolation",
                            "read_uncommitted", "-p", "2")
    assert sorted(r["value"] for r in uncommitted if r["value"] != "x") == sorted(
        f"v-{k}" for k in keys if partition_for_key(k.encode(), 3) == 2)
    text = run_cli(bs, "consume", topic_name, "-p", "1", "-o", str(first), "--max", "2", "--print-key")
    assert (text.returncode, text.stdout) == (0, "\tt0\n\tt1\n")


def test_cli_consumer_groups(kafka, admin, topic_name):
    bs, group = kafka.bootstrap, f"g-{topic_name}"
    cli_json(bs, "topics", "create", topic_name, "-p", "2")
    cli_json(bs, "produce", topic_name, "-p", "0", input="a\nb\nc\n")
    cli_json(bs, "produce", topic_name, "-p", "1", input="d\n")
    proc = run_cli(bs, "consume", topic_name, "--group", group, "--from-beginning", "--until-end")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == ["a", "b", "c", "d"]
    assert {"group_id": group, "state": "Empty", "protocol_type": "consumer"} in cli_json(bs, "groups", "list")
    assert group in {g["group_id"] for g in cli_json(bs, "groups", "list", "--state", "Empty")}
    described = cli_json(bs, "groups", "describe", group)
    assert (described["state"], described["members"]) == ("Empty", [])
    assert [(o["partition"], o["current_offset"], o["log_end_offset"], o["lag"]) for o in described["offsets"]] == [
        (0, 3, 3, 0), (1, 1, 1, 0)]
    cli_json(bs, "produce", topic_name, "-p", "0", input="e\n")
    assert cli_json(bs, "groups", "describe", group)["offsets"][0]["lag"] == 1
    again = run_cli(bs, "consume", topic_name, "--group", group, "--until-end")
    assert (again.returncode, again.stdout) == (0, "e\n")  # from the committed offsets

    plan = cli_json(bs, "groups", "reset-offsets", group, "--all-topics", "--to-earliest", "--dry-run")
    assert plan["dry_run"] is True
    assert {tp.partition: c.offset for tp, c in admin.list_group_offsets(group).items()} == {0: 4, 1: 1}
    reset = cli_json(bs, "groups", "reset-offsets", group, "--topic", f"{topic_name}:0", "--to-offset", "1",
                     "--execute")
    assert (reset["dry_run"], reset["partitions"]) == (False, [
        {"topic": topic_name, "partition": 0, "current": 4, "target": 1}])
    assert {tp.partition: c.offset for tp, c in admin.list_group_offsets(group).items()} == {0: 1, 1: 1}
    replay = run_cli(bs, "consume", topic_name, "--group", group, "--until-end")
    assert (replay.returncode, replay.stdout) == (0, "b\nc\ne\n")
    assert cli_json(bs, "groups", "delete", group) == {"deleted": [group]}
    assert cli_error(bs, "groups", "describe", group) == f"oncelog: error: group '{group}' does not exist"


def test_cli_producers_transactions_and_records(kafka, admin, topic_name):
    bs = kafka.bootstrap
    cli_json(bs, "topics", "create", topic_name, "-p", "2")
    cli_json(bs, "produce", topic_name, "-p", "0", input="".join(f"r{i}\n" for i in range(6)))
    txn_id = f"cli-{topic_name}"
    cli_json(bs, "produce", topic_name, "--transactional", "--transactional-id", txn_id, "-p", "1", input="t\n")
    settled(admin, topic_name, range(2), txn_id)

    states = cli_json(bs, "producers", "describe", topic_name)
    assert [(s["partition"], s["last_sequence"], s["current_txn_start_offset"]) for s in states] == [
        (0, 5, None), (1, 0, None)]
    (only,) = cli_json(bs, "producers", "describe", topic_name, "-p", "1")
    listed = cli_json(bs, "transactions", "list", "--producer-id", str(only["producer_id"]))
    assert listed == [{"transactional_id": txn_id, "producer_id": only["producer_id"], "state": "CompleteCommit"}]
    assert txn_id in {t["transactional_id"] for t in cli_json(bs, "transactions", "list")}
    described = cli_json(bs, "transactions", "describe", txn_id)
    assert (described["state"], described["coordinator_id"], described["producer_id"]) == (
        "CompleteCommit", 1, only["producer_id"])
    assert cli_json(bs, "transactions", "find-hanging", "--topic", topic_name,
                    "--max-transaction-timeout", "0") == []
    assert cli_error(bs, "transactions", "describe", f"{txn_id}-missing") == (
        f"oncelog: error: TRANSACTIONAL_ID_NOT_FOUND (105): transactional id '{txn_id}-missing': "
        "Transactional id not found.")

    assert cli_json(bs, "records", "delete", f"{topic_name}:0", "--before", "4") == [
        {"topic": topic_name, "partition": 0, "low_watermark": 4}]
    assert cli_json(bs, "records", "offsets", topic_name, "--time", "earliest") == [
        {"topic": topic_name, "partition": 0, "offset": 4, "timestamp": -1},
        {"topic": topic_name, "partition": 1, "offset": 0, "timestamp": -1}]
    assert [r["offset"] for r in cli_json(bs, "records", "offsets", topic_name)] == [6, 2]  # after the marker
    assert cli_error(bs, "records", "delete", f"{topic_name}:0", "--before", "9").startswith(
        "oncelog: error: OFFSET_OUT_OF_RANGE (1): ")
    assert [r.value for r in ck_consume(bs, topic_name, {0: 4}, timeout=WAIT)] == [b"r4", b"r5"]


def _properties(path: Path, conf: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in conf.items() if k != "bootstrap.servers"))
    return path


def test_cli_over_sasl_ssl_with_a_client_properties_file(kafka, admin, topic_name, tmp_path):
    conf = kafka.client_config("SASL_SSL", mechanism="SCRAM-SHA-512")
    props = str(_properties(tmp_path / "client.properties", conf))
    bs = conf["bootstrap.servers"]
    assert cli_json(bs, "topics", "create", topic_name, "-p", "2", "--command-config", props)["created"] is True
    summary = cli_json(bs, "produce", topic_name, "--transactional", "--command-config", props,
                       input="one\ntwo\nthree\n")
    assert summary["records"] == 3
    settled(admin, topic_name, range(2), summary["transactional_id"])
    records = cli_lines(bs, "consume", topic_name, "--from-beginning", "--until-end", "--command-config", props)
    assert sorted(r["value"] for r in records) == ["one", "three", "two"]
    assert topic_name in {t["name"] for t in cli_json(bs, "topics", "list", "--command-config", props)}
    # the same properties file works for confluent-kafka: it names what Kafka's tools name
    theirs = ck_consume(bs, topic_name, {0: 0, 1: 0}, timeout=WAIT,
                        **{k: v for k, v in conf.items() if k != "bootstrap.servers"})
    assert sorted(r.value for r in theirs) == [b"one", b"three", b"two"]


@pytest.mark.parametrize("command", [["topics", "list"], ["consume", "some-topic", "--until-end"],
                                     ["produce", "some-topic"]], ids=["topics-list", "consume", "produce"])
def test_cli_wrong_password_is_one_line_at_once(kafka, tmp_path, command):
    conf = kafka.client_config("SASL_SSL", mechanism="SCRAM-SHA-512", password="not-the-password")
    props = str(_properties(tmp_path / "client.properties", conf))
    started = time.monotonic()
    line = cli_error(conf["bootstrap.servers"], *command, "--command-config", props, input="x\n")
    elapsed = time.monotonic() - started
    assert line.startswith("oncelog: error: SASL_AUTHENTICATION_FAILED (58): "), line
    assert "'alice'" in line and "not-the-password" not in line
    # no retry loop: well inside one request timeout (the CLI's default --timeout is 60 s)
    assert elapsed < REQUEST_TIMEOUT_S / 2, f"took {elapsed:.1f} s"


def test_admin_on_a_missing_topic_fails_at_once(kafka, admin, topic_name):
    """An admin call on a topic that does not exist fails at once (after a metadata refresh), with the wire
    code, although UNKNOWN_TOPIC_OR_PARTITION is retriable on the wire."""
    started = time.monotonic()
    with pytest.raises(RetriableError) as info:
        admin.list_offsets({(topic_name, 0): "latest"})
    assert info.value.code == 3 and time.monotonic() - started < REQUEST_TIMEOUT_S
