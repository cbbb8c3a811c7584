"""The `oncelog` data source's read side against a real broker: batch and streaming reads.

Every test writes its data with a real transactional producer (confluent-kafka) and compares what Spark
returns with what was committed: exact partitions, offsets, keys, values and headers; nothing aborted,
nothing twice, nothing missing.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need the `spark` extra: pip install -e '.[dev,spark]'")

from oncelog.client.admin import Admin  # noqa: E402
from oncelog.spark import register  # noqa: E402
from tests.integration.helpers import Rec, create_topic, norm_headers  # noqa: E402
from tests.spark.txn_data import (  # noqa: E402
    produce_in_transaction,
    records,
    timed_records,
    transactional_producer,
    write_transactions,
)

KAFKA_SCHEMA = ("key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
                "timestampType int")


@pytest.fixture(scope="module")
def oncelog_spark(spark):
    return spark


def test_format_is_discovered_without_register_and_register_is_harmless(oncelog_spark, module_broker, topic_name):
    """`pyspark_oncelog.DefaultSource` makes format("oncelog") known to a new session; register() also works."""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=1)
    committed = write_transactions(bootstrap, topic_name, [("commit", records("r", 3, 1))])
    assert rows_to_recs(batch(oncelog_spark, bootstrap, topic_name).collect(), topic_name) == committed
    register(oncelog_spark)
    assert rows_to_recs(batch(oncelog_spark, bootstrap, topic_name).collect(), topic_name) == committed


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


def test_batch_read_with_nothing_to_read_is_empty(oncelog_spark, module_broker, topic_name):
    """No range to read (an empty topic; starts at the ends): PySpark runs one task with a placeholder
    partition, which must yield no rows (it failed an assertion before)."""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    assert batch(oncelog_spark, bootstrap, topic_name).collect() == []
    write_transactions(bootstrap, topic_name, [("commit", records("e", 4, 2))])
    ends = json.dumps({topic_name: {"0": 3, "1": 3}})  # two records and the commit marker in each
    assert batch(oncelog_spark, bootstrap, topic_name, startingOffsets=ends).count() == 0


def test_batch_offsets_json_and_assign(oncelog_spark, module_broker, topic_name):
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=3)
    committed = write_transactions(bootstrap, topic_name, [("commit", records("j", 12, 3)),
                                                           ("commit", records("k", 6, 3))])
    df = batch(oncelog_spark, bootstrap, assign=json.dumps({topic_name: [1]}),
               startingOffsets=json.dumps({topic_name: {"1": 1}}), endingOffsets=json.dumps({topic_name: {"1": 6}}))
    assert rows_to_recs(df.collect(), topic_name) == [r for r in committed if r.partition == 1 and 1 <= r.offset < 6]

    # -2 / -1 in the JSON mean earliest / latest, per partition.
    df = batch(oncelog_spark, bootstrap, topic_name, startingOffsets=json.dumps({topic_name: {"0": -2, "1": 5, "2": -2}}),
               endingOffsets=json.dumps({topic_name: {"0": 3, "1": -1, "2": -1}}))
    assert rows_to_recs(df.collect(), topic_name) == [
        r for r in committed if (r.partition == 0 and r.offset < 3) or (r.partition == 1 and r.offset >= 5)
        or r.partition == 2]


def test_batch_read_stops_at_the_last_stable_offset(oncelog_spark, module_broker, topic_name):
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    before = write_transactions(bootstrap, topic_name, [("commit", records("b", 6, 2))])
    holder = transactional_producer(bootstrap)
    try:
        produce_in_transaction(holder, topic_name, records("open", 4, 2))
        later = write_transactions(bootstrap, topic_name, [("commit", records("l", 4, 2))])
        assert rows_to_recs(batch(oncelog_spark, bootstrap, topic_name).collect(), topic_name) == before
        holder.commit_transaction(30)
    finally:
        holder.flush(5)
    values = [r.value for r in rows_to_recs(batch(oncelog_spark, bootstrap, topic_name).collect(), topic_name)]
    assert sorted(values) == sorted([r.value for r in before + later] + [o.value for o in records("open", 4, 2)])


def test_batch_read_after_delete_records_is_data_loss_unless_allowed(oncelog_spark, module_broker, topic_name):
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=1)
    committed = write_transactions(bootstrap, topic_name, [("commit", records("d", 10, 1))])
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.delete_records({(topic_name, 0): 4})
    from_zero = json.dumps({topic_name: {"0": 0}})
    with pytest.raises(Exception, match="failOnDataLoss"):
        batch(oncelog_spark, bootstrap, topic_name, startingOffsets=from_zero).collect()
    df = batch(oncelog_spark, bootstrap, topic_name, startingOffsets=from_zero, failOnDataLoss="false")
    assert rows_to_recs(df.collect(), topic_name) == [r for r in committed if r.offset >= 4]
    # "earliest" is the log start, not 0: no data loss to report.
    assert rows_to_recs(batch(oncelog_spark, bootstrap, topic_name).collect(), topic_name) == committed[4:]


def test_bad_options_fail_with_the_option_named(oncelog_spark, module_broker, topic_name):
    bootstrap = module_broker.bootstrap
    with pytest.raises(Exception, match="no such topic"):
        batch(oncelog_spark, bootstrap, "no-such-topic-here").collect()
    with pytest.raises(Exception, match="subscribe"):
        batch(oncelog_spark, bootstrap).collect()
    with pytest.raises(Exception, match="startingOffsets"):
        batch(oncelog_spark, bootstrap, topic_name, startingOffsets="latest").collect()


def stream_to_parquet(spark, bootstrap: str, topic: str | None, out: Path, checkpoint: Path, **options: str):
    reader = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
              .option("startingOffsets", "earliest"))
    if topic is not None:
        reader = reader.option("subscribe", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180), "the AvailableNow query did not finish in 180 s"
        assert query.exception() is None, query.exception()
        return [p for p in query.recentProgress if p.numInputRows > 0]
    finally:
        query.stop()


def test_stream_available_now_limits_batches_stops_at_the_lso_and_resumes(oncelog_spark, module_broker, topic_name,
                                                                            tmp_path):
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = write_transactions(bootstrap, topic_name, [
        ("commit", records("s1", 10, 2)), ("abort", records("x1", 6, 2)), ("commit", records("s2", 8, 2))])
    holder = transactional_producer(bootstrap)
    try:
        produce_in_transaction(holder, topic_name, records("open", 4, 2))
        progress = stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint, maxOffsetsPerTrigger="9")
        got = rows_to_recs(oncelog_spark.read.parquet(str(out)).collect(), topic_name)
        assert got == first  # everything committed below the open transaction, nothing of it
        assert len(progress) >= 3, f"maxOffsetsPerTrigger=9 over 30 offsets gave {len(progress)} batches"
        latest = json.loads(progress[-1].sources[0].latestOffset)
        assert set(latest[topic_name]) == {"0", "1"}  # reportLatestOffset: lag is visible in progress
        holder.commit_transaction(30)
    finally:
        holder.flush(5)
    second = write_transactions(bootstrap, topic_name, [("abort", records("x2", 4, 2)),
                                                        ("commit", records("s3", 6, 2))])
    stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint, maxOffsetsPerTrigger="9")
    got = rows_to_recs(oncelog_spark.read.parquet(str(out)).collect(), topic_name)
    opened = {o.value for o in records("open", 4, 2)}
    assert [r for r in got if r.value not in opened] == by_offset(first + second)
    assert sorted(r.value for r in got if r.value in opened) == sorted(opened)
    assert len({(r.partition, r.offset) for r in got}) == len(got)  # no record twice


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches(oncelog_spark, module_broker, topic_name, codec):
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    committed = write_transactions(bootstrap, topic_name, [
        ("commit", records("z1", 40, 2, with_headers=True)), ("abort", records("za", 10, 2)),
        ("commit", records("z2", 40, 2))], **{"compression.type": codec, "linger.ms": 50})
    df = batch(oncelog_spark, bootstrap, topic_name, includeHeaders="true")
    assert rows_to_recs(df.collect(), topic_name, headers=True) == committed


def test_stream_restart_after_delete_records_is_data_loss_unless_allowed(oncelog_spark, module_broker, topic_name,
                                                                          tmp_path):
    """Offsets from the checkpoint that retention (here DeleteRecords) removed are met at read time."""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=1)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = write_transactions(bootstrap, topic_name, [("commit", records("f", 5, 1))])
    stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint)
    second = write_transactions(bootstrap, topic_name, [("commit", records("g", 8, 1))])
    cut = second[3].offset  # the first 3 records of the second transaction are deleted before they are read
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.delete_records({(topic_name, 0): cut})
    with pytest.raises(Exception, match="failOnDataLoss"):
        stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint)
    stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint, failOnDataLoss="false")
    got = rows_to_recs(oncelog_spark.read.parquet(str(out)).collect(), topic_name)
    assert got == first + second[3:]


def test_stream_reads_partitions_added_while_it_runs_from_offset_zero(oncelog_spark, module_broker, topic_name,
                                                                       tmp_path):
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=1)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = write_transactions(bootstrap, topic_name, [("commit", records("p", 4, 1))])
    stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint)
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_partitions(topic_name, 3)
    second = write_transactions(bootstrap, topic_name, [("commit", records("q", 9, 3))])
    stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint)
    got = rows_to_recs(oncelog_spark.read.parquet(str(out)).collect(), topic_name)
    assert got == by_offset(first + second)
    assert {r.partition for r in got if r.offset == 0} == {0, 1, 2}


def test_subscribe_pattern_reads_matching_topics_and_picks_up_new_ones(oncelog_spark, module_broker, topic_name,
                                                                       tmp_path):
    """subscribePattern as with Spark's Kafka source: topics whose name the expression is found in (anchored
    here, so a longer name that merely contains a match is not read); a matching topic created while the stream
    runs is read from offset 0. (Unanchored, against Spark's own connector: test_kafka_connector.py.)"""
    bootstrap = module_broker.bootstrap
    pattern = "^" + re.escape(topic_name) + "-[a-z]$"
    for suffix, partitions in (("-a", 2), ("-b", 1), ("-zz", 1)):
        create_topic(bootstrap, topic_name + suffix, partitions=partitions)
    create_topic(bootstrap, "x" + topic_name + "-a", partitions=1)
    written = {}
    for name in (topic_name + "-a", topic_name + "-b", topic_name + "-zz", "x" + topic_name + "-a"):
        parts = 2 if name.endswith("-a") and not name.startswith("x") else 1
        written[name] = write_transactions(bootstrap, name, [("commit", records(name[-2:], 4, parts))])

    def as_set(rows):
        return {(r.topic, r.partition, r.offset, r.value) for r in rows}

    def expected(*names):
        return {(n, r.partition, r.offset, r.value) for n in names for r in written[n]}

    got = as_set(batch(oncelog_spark, bootstrap, subscribePattern=pattern).collect())
    assert got == expected(topic_name + "-a", topic_name + "-b")

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    stream_to_parquet(oncelog_spark, bootstrap, None, out, checkpoint, subscribePattern=pattern)
    create_topic(bootstrap, topic_name + "-c", partitions=2)
    written[topic_name + "-c"] = write_transactions(bootstrap, topic_name + "-c", [("commit", records("c", 6, 2))])
    stream_to_parquet(oncelog_spark, bootstrap, None, out, checkpoint, subscribePattern=pattern)
    got = as_set(oncelog_spark.read.parquet(str(out)).collect())
    assert got == expected(topic_name + "-a", topic_name + "-b", topic_name + "-c")
    assert len(oncelog_spark.read.parquet(str(out)).collect()) == len(got)  # each record once


def test_reads_by_time_batch_errors_and_stream_start(oncelog_spark, module_broker, topic_name, tmp_path):
    """A starting timestamp with no record at or after it fails the read, naming the partitions and the way out
    (Spark's default strategy "error"); a stream started at a timestamp reads from there, and with the "latest"
    strategy a partition with nothing that late starts at its end. Transaction markers carry the time they were
    written, so only a timestamp after them finds nothing. (Agreement with Spark's own connector on the same
    options: test_kafka_connector.py.)"""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    write_transactions(bootstrap, topic_name, [("commit", timed_records({0: [1000, 2000, 3000], 1: [1500]}))])
    future = str(int(time.time() * 1000) + 86_400_000)
    with pytest.raises(Exception, match=rf"option 'startingTimestamp': no record at or after the timestamp in "
                                        rf"{re.escape(topic_name)}-0 \(timestamp {future}\), "
                                        rf"{re.escape(topic_name)}-1 \(timestamp {future}\); set "
                                        rf"startingOffsetsByTimestampStrategy=latest"):
        batch(oncelog_spark, bootstrap, topic_name, startingTimestamp=future).collect()
    with pytest.raises(Exception, match="option 'startingTimestamp' must be a timestamp"):
        batch(oncelog_spark, bootstrap, topic_name, startingTimestamp="yesterday").collect()
    got = sorted((r.partition, r.offset) for r in batch(oncelog_spark, bootstrap, topic_name,
                                                        startingTimestamp="2000").collect())
    assert got == [(0, 1), (0, 2)]  # partition 1: its marker (offset 1, written now) is the first at/after 2000

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint, startingTimestamp=future,
                      startingOffsetsByTimestampStrategy="latest")
    write_transactions(bootstrap, topic_name, [("commit", timed_records({0: [500], 1: [500]}))])  # read: after
    stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint)
    got = sorted((r.partition, r.offset, r.value) for r in oncelog_spark.read.parquet(str(out)).collect())
    assert got == [(0, 4, b"p0-t500"), (1, 2, b"p1-t500")]


def test_reads_survive_a_broker_restart_between_queries(oncelog_spark, broker_factory, topic_name, tmp_path):
    """Spark reuses its Python workers, and with them the cached clients: after a broker SIGKILL and restart on
    the same port, the next batch read and the next micro-batch reconnect instead of failing."""
    broker = broker_factory()
    bootstrap = broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = write_transactions(bootstrap, topic_name, [("commit", records("r1", 10, 2))])
    assert rows_to_recs(batch(oncelog_spark, bootstrap, topic_name).collect(), topic_name) == first
    stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint)
    broker.restart()
    assert broker.bootstrap == bootstrap
    second = write_transactions(bootstrap, topic_name, [("abort", records("x", 4, 2)),
                                                        ("commit", records("r2", 10, 2))])
    assert rows_to_recs(batch(oncelog_spark, bootstrap, topic_name).collect(), topic_name) == by_offset(first + second)
    stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint)
    assert rows_to_recs(oncelog_spark.read.parquet(str(out)).collect(), topic_name) == by_offset(first + second)


def test_stream_subscribed_to_a_topic_that_does_not_exist_yet(oncelog_spark, module_broker, topic_name, tmp_path):
    """A stream may start before its topic exists (subscribe, as with Spark's Kafka source): nothing to read,
    then everything from offset 0 once the topic appears."""
    bootstrap = module_broker.bootstrap
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    progress = stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint, startingOffsets="latest")
    assert progress == []
    create_topic(bootstrap, topic_name, partitions=2)
    committed = write_transactions(bootstrap, topic_name, [("commit", records("late", 6, 2))])
    stream_to_parquet(oncelog_spark, bootstrap, topic_name, out, checkpoint, startingOffsets="latest")
    assert rows_to_recs(oncelog_spark.read.parquet(str(out)).collect(), topic_name) == committed


def test_running_stream_follows_the_lso_while_transactions_commit_and_abort(oncelog_spark, module_broker,
                                                                            topic_name, tmp_path):
    """A query with a processing-time trigger while producers write: transactions commit and abort under it,
    one stays open across several micro-batches. The output is exactly the committed records, once each."""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    query = (oncelog_spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic_name).option("startingOffsets", "earliest").load()
             .writeStream.format("memory").queryName("live_stream_out")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        early: list[Rec] = []
        for i in range(3):
            early += write_transactions(bootstrap, topic_name, [("commit", records(f"e{i}", 8, 2)),
                                                                ("abort", records(f"x{i}", 4, 2))])
            time.sleep(0.3)
        holder = transactional_producer(bootstrap)
        held = produce_in_transaction(holder, topic_name, records("held", 6, 2))
        later: list[Rec] = []
        for i in range(3):
            later += write_transactions(bootstrap, topic_name, [("commit", records(f"c{i}", 8, 2)),
                                                                ("abort", records(f"a{i}", 4, 2))])
            time.sleep(0.3)
        # What was committed before the open transaction shows; everything after it is above the LSO.
        deadline = time.monotonic() + 30
        while len(oncelog_spark.sql("select value from live_stream_out").collect()) < len(early):
            assert time.monotonic() < deadline, "the records committed before the open transaction did not show"
            time.sleep(0.2)
        time.sleep(1.5)
        seen = oncelog_spark.sql("select partition, offset, key, value from live_stream_out").collect()
        assert by_offset(Rec(r.partition, r.offset, r.key, r.value) for r in seen) == by_offset(early)
        holder.commit_transaction(30)
        expected = by_offset(early + held + later)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = oncelog_spark.sql("select partition, offset, key, value from live_stream_out").collect()
            if len(rows) >= len(expected):
                break
            assert query.exception() is None, query.exception()
            time.sleep(0.2)
        time.sleep(1.0)  # a duplicate would arrive in a later micro-batch
        rows = oncelog_spark.sql("select partition, offset, key, value from live_stream_out").collect()
        batches = [p for p in query.recentProgress if p.numInputRows > 0]
    finally:
        query.stop()
    assert by_offset(Rec(r.partition, r.offset, r.key, r.value) for r in rows) == expected
    assert len(batches) >= 2
