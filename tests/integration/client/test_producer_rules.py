"""The seeds' client rules (DESIGN §4), each as a scenario against a real broker that fails without the rule.

- KIP-360 / seed 004: UNKNOWN_PRODUCER_ID after retention or expiry → new epoch, resend, no error, no duplicate;
  after real loss → DataLossError for exactly the partition's pending records, and the producer goes on.
- KAFKA-12207: sequences never wrap (an epoch bump at 2^31-1, shown with the `oncelog.test.initial.sequence` hook);
  20 requests in flight through a SIGKILL and restart: no duplicate, no reordering.
"""

from __future__ import annotations

import shutil
import threading
import time

from tests.faults.proxy import FaultProxy
from tests.integration.client.producer_support import (
    Reports,
    data_values,
    delete_records,
    high_watermark,
    log_batches,
    producer,
    producers_of,
)
from tests.integration.helpers import Out, ck_consume, ck_produce, create_topic, wait_until

from oncelog.client.errors import DataLossError
from oncelog.client.partitioner import partition_for_key
from oncelog.storage.producer_state import CachedBatch, ProducerEntry, encode_snapshot

MAX_SEQ = 2**31 - 1
EXPIRY = {"producer.id.expiration.ms": 800, "producer.id.expiration.check.interval.ms": 200,
          "transactional.id.expiration.ms": 800}


def produce_values(p, topic: str, values: list[str], reports: Reports, partition: int = 0) -> None:
    for v in values:
        p.produce(topic, v, partition=partition, on_delivery=reports)
    assert p.flush(30) == 0


def wait_forgotten(bootstrap: str, topic: str) -> None:
    wait_until(lambda: producers_of(bootstrap, topic) == {}, timeout=20, what="the broker to forget the producer")


def test_records_deleted_under_an_idle_producer(module_broker, topic_name):
    """KIP-360: DeleteRecords to the high watermark; the producer's next batches just continue."""
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    p = producer(bs, batch_num_messages=4)
    reports = Reports()
    produce_values(p, topic_name, [f"a{i}" for i in range(10)], reports)
    end = high_watermark(bs, topic_name)
    assert delete_records(bs, topic_name, end) == end == 10
    time.sleep(0.5)
    produce_values(p, topic_name, [f"b{i}" for i in range(10)], reports)
    p.close()
    assert reports.errors() == []
    assert [m.offset() for m in reports.delivered()] == list(range(20))
    batches = log_batches(bs, topic_name)
    assert data_values(batches) == [f"b{i}".encode() for i in range(10)]
    assert {b.producer_epoch for b in batches} == {0}, "the broker kept the state: no epoch bump needed"


def test_retention_past_an_expired_producer_bumps_the_epoch(broker_factory, topic_name):
    """Seed 004: UNKNOWN_PRODUCER_ID with a log start offset past the last acknowledged offset is retention.

    Without the rule the producer would fail its records (or, resetting sequences at the same epoch, risk the
    duplicates KIP-360 forbids): here every record is delivered exactly once, under epoch 1 from sequence 0.
    """
    broker = broker_factory(EXPIRY)
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    p = producer(bs, batch_num_messages=4)
    reports = Reports()
    produce_values(p, topic_name, [f"a{i}" for i in range(10)], reports)
    assert delete_records(bs, topic_name, 10) == 10
    wait_forgotten(bs, topic_name)
    produce_values(p, topic_name, [f"b{i}" for i in range(10)], reports)
    p.close()
    assert reports.errors() == []
    assert [m.offset() for m in reports.delivered()] == list(range(20))
    batches = log_batches(bs, topic_name)
    assert data_values(batches) == [f"b{i}".encode() for i in range(10)]
    assert [(b.producer_epoch, b.base_sequence) for b in batches] == [(1, 0), (1, 4), (1, 8)]


def test_expired_state_with_intact_records_is_not_data_loss(broker_factory, topic_name):
    """The broker forgot an idle producer whose records are all still there (log start 0 ≤ last acked offset).

    Seed 004's comparison alone would call this data loss; the producer finds its last acknowledged batch at its
    offset in the log, so it bumps the epoch and goes on.
    """
    broker = broker_factory(EXPIRY)
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    p = producer(bs, batch_num_messages=5)
    reports = Reports()
    produce_values(p, topic_name, [f"a{i}" for i in range(10)], reports)
    wait_forgotten(bs, topic_name)
    produce_values(p, topic_name, [f"b{i}" for i in range(10)], reports)
    p.close()
    assert reports.errors() == []
    values = data_values(log_batches(bs, topic_name))
    assert values == [f"a{i}".encode() for i in range(10)] + [f"b{i}".encode() for i in range(10)]
    assert [(b.producer_epoch, b.base_sequence) for b in log_batches(bs, topic_name)] == \
        [(0, 0), (0, 5), (1, 0), (1, 5)]


def test_lost_records_are_reported_as_data_loss(broker_factory, topic_name):
    """The partition lost acknowledged records (its files are gone): DataLossError for the pending records,
    nothing resent silently, and the producer goes on under a new epoch."""
    broker = broker_factory()
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    p = producer(bs, batch_num_messages=5)
    reports = Reports()
    produce_values(p, topic_name, [f"a{i}" for i in range(10)], reports)
    broker.stop()
    part_dir = broker.data_dir / f"{topic_name}-0"
    for f in part_dir.iterdir():
        f.unlink() if f.is_file() else shutil.rmtree(f)
    broker.start()
    assert high_watermark(bs, topic_name) == 0
    lost = Reports()
    produce_values(p, topic_name, [f"b{i}" for i in range(5)], lost)
    assert len(lost.items) == 5 and all(isinstance(e, DataLossError) for e in lost.errors()), lost.items
    assert "offset 9" in str(lost.errors()[0])
    after = Reports()
    produce_values(p, topic_name, [f"c{i}" for i in range(5)], after)
    p.close()
    assert after.errors() == []
    batches = log_batches(bs, topic_name)
    assert data_values(batches) == [f"c{i}".encode() for i in range(5)]
    assert [(b.producer_epoch, b.base_sequence) for b in batches] == [(1, 0)]


def test_sequence_overflow_bumps_the_epoch_instead_of_wrapping(broker_factory, topic_name):
    """KAFKA-12207 with the test hook: each partition's sequences start 7 below 2^31-1. The broker is given the
    matching state (a producer-state snapshot saying the last sequence was just before), so the first batch is
    accepted; the batch that would cross 2^31-1 goes out under the next epoch from sequence 0 instead of
    wrapping. A producer that wrapped would write (epoch 1, sequence 2^31-1 .. 1) — the broker accepts that too,
    so only the batches' identities in the log tell the two apart."""
    broker = broker_factory()
    bs = broker.bootstrap
    create_topic(bs, topic_name, 2)
    start = MAX_SEQ - 6  # sequences start .. MAX_SEQ: 7 records fit before the end of the space
    p = producer(bs, batch_num_messages=3, **{"oncelog.test.initial.sequence": start})
    reports = Reports()
    # partition 1 first: the broker does not know the producer and refuses sequence `start` (59), so the
    # producer moves to epoch 1 there (retention rule) — which tells us its id and epoch without any internals
    produce_values(p, topic_name, ["warm"], reports, partition=1)
    (warm,) = log_batches(bs, topic_name, 1)
    pid, epoch = warm.producer_id, warm.producer_epoch
    assert (epoch, warm.base_sequence) == (1, 0)
    ck_produce(bs, topic_name, [Out(0, None, b"plain")])  # partition 0: one record, no producer state
    broker.stop()
    part_dir = broker.data_dir / f"{topic_name}-0"
    for old in part_dir.glob("*.snapshot"):
        old.unlink()
    now = int(time.time() * 1000)
    entry = ProducerEntry(pid, epoch, -1, now, now, -1)
    entry.batches.append(CachedBatch(start - 1, start - 1, 0, 0, now))
    (part_dir / f"{1:020d}.snapshot").write_bytes(encode_snapshot([entry]))
    broker.start()
    assert producers_of(bs, topic_name)[pid].last_sequence == start - 1
    values = [f"v{i}" for i in range(13)]
    produce_values(p, topic_name, values, reports, partition=0)
    p.close()
    assert reports.errors() == []
    batches = log_batches(bs, topic_name)[1:]
    assert data_values(batches) == [v.encode() for v in values]
    ids = [(b.producer_epoch, b.base_sequence, b.header.record_count) for b in batches]
    assert ids == [(1, start, 3), (1, start + 3, 3), (2, 0, 3), (2, 3, 3), (2, 6, 1)], ids
    for b in batches:
        assert b.base_sequence + b.header.record_count - 1 <= MAX_SEQ, "a batch wrapped past 2^31-1"


def test_in_flight_20_through_sigkill_and_restart(broker_factory, topic_name):
    """max.in.flight=20 with small batches while the broker is SIGKILLed and restarted twice: every record
    exactly once, each key's records in produce order (read back with confluent-kafka)."""
    broker = broker_factory()
    bs = broker.bootstrap
    create_topic(bs, topic_name, 3)
    p = producer(bs, batch_num_messages=5, linger_ms=1, max_in_flight_requests_per_connection=20,
                 request_timeout_ms=5000, retry_backoff_ms=50)
    reports = Reports()
    keys = [f"key-{k}".encode() for k in range(12)]
    total = 6000
    stop = threading.Event()

    def nemesis() -> None:
        for _ in range(2):
            time.sleep(0.6)
            broker.kill()
            time.sleep(0.3)
            broker.start()
        stop.set()

    killer = threading.Thread(target=nemesis)
    killer.start()
    for i in range(total):
        key = keys[i % len(keys)]
        while True:
            try:
                p.produce(topic_name, f"{key.decode()}:{i}", key=key, on_delivery=reports)
                break
            except BufferError:
                p.poll(0.05)
        if i % 50 == 0:
            p.poll(0)
            time.sleep(0.01)  # spread the records over the kills
    killer.join()
    assert p.flush(60) == 0
    stats = dict(p._core.sender.stats)
    p.close()
    # a kill hits requests in flight (retries) or, between two answers, the next connection attempt (unreachable)
    assert stats["retries"] + stats["unreachable"] > 0, f"the kills should have hit the producer: {stats}"
    assert reports.errors() == []
    got = ck_consume(bs, topic_name, {0: 0, 1: 0, 2: 0}, **{"metadata.recovery.strategy": "none"})
    values = [r.value.decode() for r in got]
    assert len(values) == len(set(values)) == total, "a record was lost or written twice"
    for key in keys:
        part = partition_for_key(key, 3)
        seq = [int(r.value.decode().split(":")[1]) for r in got if r.key == key]
        assert seq == sorted(seq), f"records of {key!r} out of order"
        assert all(r.partition == part for r in got if r.key == key)
    assert stop.is_set()


def test_a_possibly_written_batch_is_not_resent_under_a_new_epoch(broker_factory, topic_name):
    """Seed 000: batch B is written, its answer is lost (the connection dies), and before the retry arrives the
    broker forgets the idle producer. The retry gets UNKNOWN_PRODUCER_ID; resending B from sequence 0 under a new
    epoch would write it twice. The producer finds B in the log after its last acknowledged offset instead and
    reports it delivered there: the log holds every record once."""
    proxy = FaultProxy(upstream_port=0).start()
    try:
        broker = broker_factory({**EXPIRY, "advertised.listeners": proxy.address})
        proxy.upstream_port = broker.port
        direct = broker.bootstrap
        create_topic(direct, topic_name, 1)
        p = producer(proxy.address, batch_num_messages=5, retry_backoff_ms=200, retry_backoff_max_ms=500)
        reports = Reports()
        produce_values(p, topic_name, [f"a{i}" for i in range(5)], reports)
        proxy.set_mode("lose_responses")
        for i in range(5):
            p.produce(topic_name, f"b{i}", partition=0, on_delivery=reports)
        wait_until(lambda: high_watermark(direct, topic_name) == 10, what="batch B in the log")
        wait_forgotten(direct, topic_name)
        proxy.set_mode("pass")
        assert p.flush(30) == 0
        stats = dict(p._core.sender.stats)
        p.close()
    finally:
        proxy.stop()
    assert reports.errors() == []
    assert sorted(m.offset() for m in reports.delivered()) == list(range(10))
    assert data_values(log_batches(direct, topic_name)) == \
        [f"a{i}".encode() for i in range(5)] + [f"b{i}".encode() for i in range(5)]
    assert stats["unknown_producer"] >= 1, stats


def test_a_failed_batch_fails_the_sequenced_batches_behind_it(broker_factory, topic_name):
    """KIP-360: a batch that fails for good (here MESSAGE_TOO_LARGE) takes every later batch of its partition
    that already has a sequence with it — they can never be written without it — and the producer moves to a
    new epoch, so records produced afterwards are delivered. (The proxy delays every chunk, so all four batches
    are in flight before the first answer.)"""
    proxy = FaultProxy(upstream_port=0).start()
    try:
        broker = broker_factory({"advertised.listeners": proxy.address})
        proxy.upstream_port = broker.port
        direct = broker.bootstrap
        create_topic(direct, topic_name, 1, {"max.message.bytes": "2000"})
        p = producer(proxy.address, batch_num_messages=1, linger_ms=0)
        p.produce(topic_name, "warm", partition=0)
        assert p.flush(15) == 0
        proxy.set_mode("delay", 0.2)
        reports = Reports()
        for v in ["r1", "B" * 3000, "r3", "r4"]:
            p.produce(topic_name, v, partition=0, on_delivery=reports)
        assert p.flush(30) == 0
        proxy.set_mode("pass")
        after = Reports()
        produce_values(p, topic_name, ["r5", "r6"], after)
        p.close()
    finally:
        proxy.stop()
    seen = {m.value()[:2]: e for e, m in reports.items}
    assert seen[b"r1"] is None
    assert seen[b"BB"] is not None and seen[b"BB"].code == 10, seen[b"BB"]
    for v in (b"r3", b"r4"):
        assert seen[v] is not None and seen[v].code == 10 and "earlier batch" in seen[v].message, seen[v]
    assert after.errors() == []
    batches = log_batches(direct, topic_name)
    assert data_values(batches) == [b"warm", b"r1", b"r5", b"r6"]
    assert [(b.producer_epoch, b.base_sequence) for b in batches] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_transactional_producer_moves_to_a_new_epoch_before_its_sequences_run_out(broker_factory, topic_name):
    """KAFKA-12207 for transactions: a transactional producer cannot bump its epoch in the middle of a
    transaction, so begin_transaction() asks the coordinator for the next epoch (InitProducerId(pid, epoch))
    when a partition has used most of its sequence space. Set up like the idempotent overflow test: the test
    hook starts the sequences 7 below 2^31-1 and the broker is given the matching producer state."""
    from tests.integration.test_transactions_rules import Txn

    broker = broker_factory()
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    txn_id = f"tx-{topic_name}"
    with Txn(bs) as w:
        code, pid, epoch0 = w.init_until_done(txn_id)
    assert code == 0
    epoch = epoch0 + 1  # the producer's own InitProducerId bumps once more
    start = MAX_SEQ - 6
    ck_produce(bs, topic_name, [Out(0, None, b"plain")])
    broker.stop()
    part_dir = broker.data_dir / f"{topic_name}-0"
    for old in part_dir.glob("*.snapshot"):
        old.unlink()
    now = int(time.time() * 1000)
    entry = ProducerEntry(pid, epoch, -1, now, now, -1)
    entry.batches.append(CachedBatch(start - 1, start - 1, 0, 0, now))
    (part_dir / f"{1:020d}.snapshot").write_bytes(encode_snapshot([entry]))
    broker.start()
    p = producer(bs, batch_num_messages=3, transactional_id=txn_id, **{"oncelog.test.initial.sequence": start})
    p.init_transactions(15)
    for round_no in range(2):
        p.begin_transaction()
        for i in range(6):
            p.produce(topic_name, f"r{round_no}-{i}", partition=0)
        p.commit_transaction(15)
    p.close()
    batches = [b for b in log_batches(bs, topic_name)[1:] if not b.is_control]
    assert data_values(batches) == [f"r{r}-{i}".encode() for r in range(2) for i in range(6)]
    ids = [(b.producer_id, b.producer_epoch, b.base_sequence) for b in batches]
    assert ids == [(pid, epoch, start), (pid, epoch, start + 3), (pid, epoch + 1, 0), (pid, epoch + 1, 3)], ids
