"""KIP-467 on the client: a batch the broker refuses for some of its records (RecordErrors) loses only those
records, each failing with the broker's own message; the rest is delivered once, in order — also when later
batches of the partition were in flight behind it. Inside a transaction the rejection makes it abortable."""

from __future__ import annotations

import time

import pytest
from tests.integration.client.producer_support import (
    Reports,
    data_values,
    high_watermark,
    log_batches,
    producer,
)
from tests.integration.helpers import ck_consume, create_topic, wait_until

from oncelog.client.errors import AbortableError, RecordError
from oncelog.client.producer import Producer

INVALID_RECORD = 87
INVALID_TIMESTAMP = 32


def by_value(reports: Reports) -> dict[bytes, tuple]:
    return {m.value(): (e, m) for e, m in reports.items}


@pytest.mark.parametrize("acks", ["all", "1"])
def test_keyless_records_on_a_compacted_topic(module_broker, topic_name, acks):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"cleanup.policy": "compact"})
    # 10 records per batch, several batches in flight: the culprits sit in the first and the third batch.
    # Without idempotence nothing stops later batches from being written meanwhile (Kafka's semantics), so
    # order holds only with one request in flight.
    in_flight = 5 if acks == "all" else 1
    p = producer(bs, acks=acks, batch_num_messages=10, linger_ms=50, max_in_flight_requests_per_connection=in_flight)
    reports = Reports()
    values = [f"v{i:02d}" for i in range(40)]
    culprits = {3, 7, 25}
    for i, v in enumerate(values):
        p.produce(topic_name, v, key=None if i in culprits else f"k{i}", partition=0, on_delivery=reports)
    assert p.flush(30) == 0
    p.close()
    seen = by_value(reports)
    assert len(reports.items) == 40
    for i, v in enumerate(values):
        err, msg = seen[v.encode()]
        if i in culprits:
            assert isinstance(err, RecordError) and err.code == INVALID_RECORD, (i, err)
            assert err.message and "key" in err.message.lower(), err.message  # the broker's own words
            assert msg.offset() == -1
        else:
            assert err is None, (i, err)
    good = [v.encode() for i, v in enumerate(values) if i not in culprits]
    # acks=1 is answered before the fsync; consumers see the records once the flusher has run
    wait_until(lambda: high_watermark(bs, topic_name) == len(good), what="the high watermark")
    batches = log_batches(bs, topic_name)
    assert data_values(batches) == good, "the other records: all there, once, in produce order"
    assert sorted(seen[v][1].offset() for v in good) == list(range(len(good)))
    if acks == "all":  # idempotent: sequences have no gap and no repeat, at one epoch (no bump was needed)
        seq = 0
        for b in batches:
            assert (b.producer_epoch, b.base_sequence) == (0, seq)
            seq += b.header.record_count


def test_timestamps_outside_the_window(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"message.timestamp.before.max.ms": "60000"})
    p = producer(bs, batch_num_messages=20)
    reports = Reports()
    now = int(time.time() * 1000)
    old = now - 3_600_000
    for i in range(20):
        p.produce(topic_name, f"t{i}", partition=0, timestamp=old if i % 4 == 1 else now, on_delivery=reports)
    assert p.flush(30) == 0
    p.close()
    seen = by_value(reports)
    bad = [i for i in range(20) if i % 4 == 1]
    for i in range(20):
        err, _ = seen[f"t{i}".encode()]
        if i in bad:
            assert isinstance(err, RecordError) and err.code == INVALID_TIMESTAMP and err.batch_index == i, err
        else:
            assert err is None
    got = ck_consume(bs, topic_name, {0: 0})
    assert [r.value for r in got] == [f"t{i}".encode() for i in range(20) if i not in bad]


def test_culprits_inside_a_transaction_make_it_abortable(module_broker, topic_name):
    """In a transaction the culprits fail with the broker's message as elsewhere, but the transaction cannot
    commit as if it were complete (an exactly-once pipeline would lose them): commit raises AbortableError, the
    abort recovers, and the next transaction commits."""
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"cleanup.policy": "compact"})
    p = Producer({"bootstrap.servers": bs, "transactional.id": f"tx-{topic_name}", "linger.ms": 20})
    p.init_transactions(15)
    p.begin_transaction()
    reports = Reports()
    for i in range(12):
        p.produce(topic_name, f"x{i}", key=None if i == 5 else f"k{i}", partition=0, on_delivery=reports)
    with pytest.raises(AbortableError) as info:
        p.commit_transaction(15)
    assert info.value.code == INVALID_RECORD and "record 5" in info.value.message
    culprits = [e for e in reports.errors() if isinstance(e, RecordError)]
    assert len(culprits) == 1 and culprits[0].batch_index == 5
    p.abort_transaction(15)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic_name, f"y{i}", key=f"k{i}", partition=0)
    p.commit_transaction(15)
    p.close()
    got = ck_consume(bs, topic_name, {0: 0}, **{"isolation.level": "read_committed"})
    assert [r.value for r in got] == [b"y0", b"y1", b"y2"]
