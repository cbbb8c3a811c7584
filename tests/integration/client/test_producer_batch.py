"""`Producer.produce_batch` against a real broker, in transactions: confluent-kafka reads back exactly the
records given, and the log holds the same batches (boundaries, sequences, records) as produce() of each."""

from __future__ import annotations

import pytest
from tests.integration.client.producer_support import Reports, log_batches
from tests.integration.helpers import Rec, ck_consume, create_topic

from oncelog.client.producer import Producer

TS = 1_700_000_000_000
COMMITTED = {"isolation.level": "read_committed"}


def _txn_producer(bootstrap: str, txn_id: str, **conf) -> Producer:
    base = {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 2, "batch.size": 20_000,
            "batch.num.messages": 150}
    base.update(conf)
    p = Producer(base)
    p.init_transactions(15)
    return p


def _runs() -> list[tuple[int | None, list, list]]:
    """(partition, keys, values) runs: keyed, keyless, with null values and empty keys, long and short."""
    runs = []
    for r in range(6):
        n = 50 + 170 * r
        keys = None if r % 3 == 2 else [b"" if i % 7 == 0 else f"key-{r}-{i}".encode() for i in range(n)]
        values = [None if i % 11 == 5 else f"value-{r}-{i}".encode() * (1 + i % 5) for i in range(n)]
        runs.append((r % 2 if r != 5 else 1, keys, values))
    return runs


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_produce_batch_read_back_by_confluent_kafka(module_broker, topic_name, codec):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2)
    reports = Reports()
    p = _txn_producer(bs, f"batch-{topic_name}", **{"compression.type": codec})
    p.begin_transaction()
    want: list[tuple[int, bytes | None, bytes | None, int]] = []
    for i, (partition, keys, values) in enumerate(_runs()):
        ts = TS + i
        on_delivery = reports if i == 0 else None
        assert p.produce_batch(topic_name, values, keys, partition, ts, on_delivery) == len(values)
        want += [(partition, k, v, ts) for k, v in zip(keys or [None] * len(values), values, strict=True)]
    p.commit_transaction(30)
    p.close()
    got = ck_consume(bs, topic_name, {0: 0, 1: 0}, **COMMITTED)
    expected: list[Rec] = []
    for part in (0, 1):
        mine = [w for w in want if w[0] == part]
        expected += [Rec(part, off, k, v, (), ts) for off, (_, k, v, ts) in enumerate(mine)]
    assert got == expected
    first = _runs()[0]
    assert reports.errors() == []
    assert [(m.partition(), m.offset(), m.key(), m.value()) for m in reports.delivered()] == \
        [(0, i, k, v) for i, (k, v) in enumerate(zip(first[1], first[2], strict=True))]


def test_produce_batch_writes_the_batches_produce_writes(module_broker, topic_name):
    bs = module_broker.bootstrap
    one, many = f"{topic_name}-each", f"{topic_name}-batch"
    for t in (one, many):
        create_topic(bs, t, 2)
    # a long linger: batches go when full or flushed, never cut by timing
    p = _txn_producer(bs, f"each-{topic_name}", **{"linger.ms": 60_000})
    q = _txn_producer(bs, f"many-{topic_name}", **{"linger.ms": 60_000})
    p.begin_transaction()
    q.begin_transaction()
    for i, (partition, keys, values) in enumerate(_runs()):
        for k, v in zip(keys or [None] * len(values), values, strict=True):
            p.produce(one, v, k, partition, timestamp=TS + i)
        p.flush(30)
        q.produce_batch(many, values, keys, partition, TS + i)
        q.flush(30)
    p.commit_transaction(30)
    q.commit_transaction(30)
    p.close()
    q.close()
    for part in (0, 1):
        a = [x for x in log_batches(bs, one, part) if not x.is_control]
        b = [y for y in log_batches(bs, many, part) if not y.is_control]
        assert len(a) == len(b) > 4
        for x, y in zip(a, b, strict=True):
            assert x.records == y.records
            assert (x.base_sequence, x.header.record_count, x.header.length, x.is_transactional) == \
                (y.base_sequence, y.header.record_count, y.header.length, y.is_transactional)
