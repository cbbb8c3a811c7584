"""The `oncelog` sink against a real broker: batch writes, exactly-once streaming writes, replays and aborts.

Output is read back with librdkafka under read_committed and compared exactly with what the input implies:
every expected record once, nothing else. Replays are produced the two ways Spark produces them: a query
restarted from a checkpoint whose commit log lacks its last batch, and the task-side write run twice for
one batch id.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from oncelog.client import Producer
from oncelog.client.errors import KafkaError
from oncelog.client.partitioner import partition_for_key
from oncelog.spark import register
from oncelog.spark.options import OptionError
from oncelog.spark.sink import OVERWRITE_REFUSED, OncelogStreamWriter, SinkCommit, finish, write_partition
from oncelog.spark.sink_rows import check_schema
from oncelog.spark.txn_ids import marker_group, transactional_id
from oncelog.spark.write_options import parse_write_options
from tests.integration.helpers import ck_consume, create_topic, norm_headers
from tests.spark.eos_check import assert_exactly_once, nothing_pending, read_values, write_input


@pytest.fixture(scope="module")
def sink_spark(spark):
    register(spark)
    return spark


def stream(spark, bootstrap: str, source: str, sink: str, checkpoint, *, per_trigger: int, **sink_options: str):
    """AvailableNow query: source topic -> value + "!" -> sink topic, exactly once."""
    src = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", source).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", str(per_trigger)).load())
    writer = (src.selectExpr("key", "concat(value, '!') AS value").writeStream.format("oncelog")
              .option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
              .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True))
    for key, value in sink_options.items():
        writer = writer.option(key, value)
    query = writer.start()
    assert query.awaitTermination(240), "the query did not finish in 240 s"
    assert query.exception() is None, query.exception()
    return query


def test_batch_write_round_trip(sink_spark, module_broker, topic_name):
    """Keys, values, headers and explicit partitions arrive as written, once each."""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=3)
    rows = [(f"k{i}", f"value-{i}".encode(), i % 3, [("h", f"{i}".encode()), ("empty", None)] if i % 2 else None)
            for i in range(90)]
    df = sink_spark.createDataFrame(
        rows, "key string, value binary, partition int, headers array<struct<key: string, value: binary>>")
    df.repartition(2).write.format("oncelog").option("kafka.bootstrap.servers", bootstrap) \
        .option("topic", topic_name).mode("append").save()
    got = ck_consume(bootstrap, topic_name, {0: 0, 1: 0, 2: 0}, **{"isolation.level": "read_committed"})
    assert sorted((r.partition, r.key, r.value, r.headers) for r in got) == sorted(
        (p, k.encode(), v, norm_headers(h)) for k, v, p, h in rows)
    assert nothing_pending(bootstrap, topic_name, 3)


def test_batch_write_routes_rows_by_topic_column(sink_spark, module_broker, topic_name):
    bootstrap = module_broker.bootstrap
    first, second = f"{topic_name}-a", f"{topic_name}-b"
    create_topic(bootstrap, first)
    create_topic(bootstrap, second)
    rows = [(first if i % 3 else second, f"v{i}") for i in range(30)]
    sink_spark.createDataFrame(rows, "topic string, value string").write.format("oncelog") \
        .option("bootstrap.servers", bootstrap).mode("append").save()
    assert sorted(read_values(bootstrap, first, 1)) == sorted(v.encode() for t, v in rows if t == first)
    assert sorted(read_values(bootstrap, second, 1)) == sorted(v.encode() for t, v in rows if t == second)


def test_stream_writes_each_record_once_across_batches(sink_spark, module_broker, topic_name, tmp_path):
    bootstrap = module_broker.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    data = write_input(bootstrap, source, 600)
    create_topic(bootstrap, sink, partitions=2)
    query = stream(sink_spark, bootstrap, source, sink, tmp_path / "ckpt", per_trigger=200)
    assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3
    assert_exactly_once(bootstrap, sink, 2, [v + b"!" for _, v in data])
    assert nothing_pending(bootstrap, sink, 2)


def test_restart_replays_an_uncommitted_batch_without_writing_it_twice(sink_spark, module_broker, topic_name,
                                                                       tmp_path):
    """The commit log loses its last entry (as when the driver dies after the sink committed): the restarted
    query runs that batch again, with the same id and offsets, and the sink writes nothing for it."""
    bootstrap = module_broker.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    data = write_input(bootstrap, source, 400)
    create_topic(bootstrap, sink, partitions=2)
    checkpoint = tmp_path / "ckpt"
    first = stream(sink_spark, bootstrap, source, sink, checkpoint, per_trigger=150)
    last = max(p["batchId"] for p in first.recentProgress if p["numInputRows"])
    assert_exactly_once(bootstrap, sink, 2, [v + b"!" for _, v in data])
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)

    second = stream(sink_spark, bootstrap, source, sink, checkpoint, per_trigger=150)
    replayed = [p for p in second.recentProgress if p["batchId"] == last]
    assert replayed and replayed[0]["numInputRows"] > 0, "the last batch was not replayed"
    assert_exactly_once(bootstrap, sink, 2, [v + b"!" for _, v in data])
    assert nothing_pending(bootstrap, sink, 2)


def _batches(values: list[bytes]) -> iter:
    return iter([pa.record_batch([pa.array(values[:5], pa.binary())], names=["value"]),
                 pa.record_batch([pa.array(values[5:], pa.binary())], names=["value"])])


def test_a_batch_written_twice_is_written_once(module_broker, topic_name):
    """The task-side write for (sink, partition, batch) run again after the driver committed it: the second
    finds the marker and writes nothing. Before the driver's commit nothing of it is visible."""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name)
    options = parse_write_options({"kafka.bootstrap.servers": bootstrap, "topic": topic_name})
    batch3 = [f"b3-{i}".encode() for i in range(12)]
    first = write_partition(options, "twice", "query-1", 3, 0, _batches(batch3))
    assert (first.rows, first.skipped, first.transactional_id) == (12, False, transactional_id("twice", 0))
    assert read_values(bootstrap, topic_name, 1) == [] and not nothing_pending(bootstrap, topic_name, 1)
    finish(options, [first], "batch 3")
    finish(options, [first], "batch 3")  # Spark may run commit(N) twice: harmless
    assert sorted(read_values(bootstrap, topic_name, 1)) == sorted(batch3)

    again = write_partition(options, "twice", "query-1", 3, 0, _batches(batch3))
    assert again.skipped and again.rows == 0 and not again.prepared
    older = write_partition(options, "twice", "query-1", 2, 0, _batches([b"never"] * 10))
    assert older.skipped
    finish(options, [again, older], "replays")
    assert sorted(read_values(bootstrap, topic_name, 1)) == sorted(batch3)

    # A prepared batch that the driver never committed (it died) is replaced by its replay.
    batch4 = [f"b4-{i}".encode() for i in range(7)]
    lost = write_partition(options, "twice", "query-1", 4, 0, _batches(batch4))
    replay = write_partition(options, "twice", "query-1", 4, 0, _batches(batch4))
    assert replay.prepared and replay.epoch > lost.epoch
    with pytest.raises(KafkaError):
        finish(options, [lost], "batch 4 of the dead driver")  # fenced by the replay: it cannot commit
    finish(options, [replay], "batch 4")
    # A new query reusing the sink id (a new checkpoint) starts its batch ids afresh: not skipped.
    fresh = [f"q2-{i}".encode() for i in range(6)]
    finish(options, [write_partition(options, "twice", "query-2", 0, 0, _batches(fresh))], "batch 0")
    assert sorted(read_values(bootstrap, topic_name, 1)) == sorted(batch3 + batch4 + fresh)
    assert nothing_pending(bootstrap, topic_name, 1)
    # Empty partitions touch nothing.
    assert write_partition(options, "twice", "query-2", 1, 5, iter([])) == SinkCommit("twice", 5, 1, 0)


def test_abort_ends_prepared_transactions_and_fences_the_silent_partitions(module_broker, topic_name):
    """abort(N): partitions that prepared are aborted, partitions that reported nothing (their task died with
    a transaction open) are fenced, and a partition committed before (a commit(N) that failed later) stays."""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name)
    options = parse_write_options({"kafka.bootstrap.servers": bootstrap, "topic": topic_name,
                                   "transaction.timeout.ms": "600000"})
    committed = write_partition(options, "fence", "q", 0, 0, _batches([f"ok-{i}".encode() for i in range(10)]))
    finish(options, [committed], "batch 0, partition 0")
    prepared = write_partition(options, "fence", "q", 0, 2, _batches([f"prep-{i}".encode() for i in range(10)]))
    zombie = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id("fence", 1)})
    zombie.init_transactions()
    zombie.begin_transaction()
    for i in range(5):
        zombie.produce(topic_name, f"zombie-{i}".encode())
    assert zombie.flush(30) == 0
    assert not nothing_pending(bootstrap, topic_name, 1)

    OncelogStreamWriter(options).abort([committed, None, prepared], 0)
    assert nothing_pending(bootstrap, topic_name, 1)
    assert sorted(read_values(bootstrap, topic_name, 1)) == sorted(f"ok-{i}".encode() for i in range(10))
    with pytest.raises(Exception, match="(?i)fenced|epoch"):
        zombie.commit_transaction(10)
    zombie.close(1)
    assert marker_group("fence", 1) == transactional_id("fence", 1)


def test_sink_options_and_columns_are_checked(sink_spark):
    with pytest.raises(OptionError, match="bootstrap.servers"):
        parse_write_options({"topic": "t"})
    with pytest.raises(OptionError, match="transactional.id"):
        parse_write_options({"bootstrap.servers": "x:1", "kafka.transactional.id": "mine"})
    with pytest.raises(OptionError, match="sink.id"):
        parse_write_options({"bootstrap.servers": "x:1", "sink.id": "has space"})
    with pytest.raises(OptionError, match="transaction.timeout.ms"):
        parse_write_options({"bootstrap.servers": "x:1", "transaction.timeout.ms": "soon"})
    schema = sink_spark.createDataFrame([], "key string, data binary").schema
    with pytest.raises(OptionError, match="'value' column"):
        check_schema(schema, "t")
    with pytest.raises(OptionError, match="topic"):
        check_schema(sink_spark.createDataFrame([], "value string").schema, None)
    with pytest.raises(OptionError, match="column 'partition'"):
        check_schema(sink_spark.createDataFrame([], "value string, partition string").schema, "t")


def save_error(writer) -> tuple[str | None, str]:
    """The error condition and message of writer.save() (which must fail)."""
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException) as failed:
        writer.save()
    return failed.value.getCondition(), str(failed.value)


def test_batch_write_save_modes(sink_spark, module_broker, topic_name):
    """Save modes as Spark's Kafka sink has them, as far as a Python data source can: Append writes, Overwrite is
    refused with a message that says what to write. Spark itself refuses its default mode (ErrorIfExists) and
    Ignore for every Python data source before the source is asked, so the README's call needs .mode("append")."""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name)
    df = sink_spark.createDataFrame([("a",), ("b",)], "value string")

    def writer():  # the README's call
        return df.write.format("oncelog").option("kafka.bootstrap.servers", bootstrap).option("topic", topic_name)

    for refused in (writer(), writer().mode("errorifexists"), writer().mode("ignore")):
        condition, message = save_error(refused)
        assert condition == "UNSUPPORTED_DATA_SOURCE_SAVE_MODE", message
        assert 'The data source "oncelog" cannot be written in the' in message and '"Append"' in message
    condition, message = save_error(writer().mode("overwrite"))
    assert condition == "PYTHON_DATA_SOURCE_ERROR", message
    assert OVERWRITE_REFUSED in message
    assert 'Save mode Overwrite not allowed for oncelog' in message and '.mode("append")' in message
    assert ck_consume(bootstrap, topic_name, {0: 0}) == []  # the refused writes wrote nothing, not even aborted

    writer().mode("append").save()
    assert sorted(read_values(bootstrap, topic_name, 1)) == [b"a", b"b"]
    assert nothing_pending(bootstrap, topic_name, 1)


def test_keyed_rows_land_on_the_java_partitioner_partition(sink_spark, module_broker, topic_name):
    """Without a partition column a key's partition is Java's murmur2 rule (hashed per Arrow column)."""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=3)
    rows = [(f"user-{i % 37}", f"v{i}") for i in range(300)]
    sink_spark.createDataFrame(rows, "key string, value string").repartition(2).write.format("oncelog") \
        .option("kafka.bootstrap.servers", bootstrap).option("topic", topic_name).mode("append").save()
    got = ck_consume(bootstrap, topic_name, {0: 0, 1: 0, 2: 0}, **{"isolation.level": "read_committed"})
    assert sorted(r.value for r in got) == sorted(v.encode() for _, v in rows)
    assert all(r.partition == partition_for_key(r.key, 3) for r in got)
