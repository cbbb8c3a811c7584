"""The `oncelog` data source's read side against a real broker: batch and streaming reads.

Every test writes its data with a real transactional producer (confluent-kafka) and compares what Spark
returns with what was committed: exact partitions, offsets, keys, values and headers; nothing aborted,
nothing twice, nothing missing.
"""

from __future__ import annotations

import pytest

from oncelog.spark import register
from tests.integration.helpers import Rec, create_topic, norm_headers
from tests.spark.txn_data import records, write_transactions

KAFKA_SCHEMA = ("key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
                "timestampType int")


@pytest.fixture(scope="module")
def oncelog_spark(spark):
    register(spark)
    return spark


def by_offset(recs):
    return sorted(recs, key=lambda r: (r.partition, r.offset))


def rows_to_recs(rows, topic: str, headers: bool = False) -> list[Rec]:
    out = []
    for r in rows:
        assert r.topic == topic
        assert r.timestampType == 0 and r.timestamp is not None
        hs = norm_headers((h.key, h.value) for h in r.headers or ()) if headers else ()
        out.append(Rec(r.partition, r.offset, r.key, r.value, hs))
    return by_offset(out)


def batch(spark, bootstrap: str, topic: str | None = None, **options: str):
    reader = spark.read.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
    if topic is not None:
        reader = reader.option("subscribe", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_returns_exactly_the_committed_records(oncelog_spark, module_broker, topic_name):
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=3)
    committed = write_transactions(bootstrap, topic_name, [
        ("commit", records("c1", 12, 3, with_headers=True)),
        ("abort", records("a1", 9, 3, with_headers=True)),
        ("commit", records("c2", 6, 3)),
        ("abort", records("a2", 3, 3)),
        ("commit", records("c3", 9, 3, with_headers=True)),
    ])
    df = batch(oncelog_spark, bootstrap, topic_name, includeHeaders="true")
    assert df.schema.simpleString() == oncelog_spark.createDataFrame(
        [], KAFKA_SCHEMA + ", headers array<struct<key: string, value: binary>>").schema.simpleString()
    assert rows_to_recs(df.collect(), topic_name, headers=True) == committed

    # Without includeHeaders the schema is Spark's Kafka schema without the column.
    plain = batch(oncelog_spark, bootstrap, topic_name)
    assert plain.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    # read_uncommitted also shows the aborted transactions' records.
    values = {r.value for r in batch(oncelog_spark, bootstrap, topic_name, **{"isolation.level": "read_uncommitted"})
              .select("value").collect()}
    assert values == {r.value for r in committed} | {o.value for o in records("a1", 9, 3) + records("a2", 3, 3)}
