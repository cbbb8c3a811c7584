"""Spark's own Kafka connector (spark-sql-kafka-0-10, `format("kafka")`) reading oncelog topics.

Wire compatibility with Spark's connector: its Java consumer (kafka-clients) under `kafka.isolation.level=
read_committed` must return exactly what transactional producers committed (nothing aborted, nothing missing,
headers intact), and stop at the last stable offset while a transaction is still open. The connector's jars come
from Maven Central through `kafka_connector/pom.xml` (`mvn dependency:build-classpath`, cached in ~/.m2, offline
after the first run); without `mvn`, or when Maven Central cannot be reached the first time, the module is skipped
with the reason.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark tests need the `spark` extra: pip install -e '.[dev,spark]'")

from oncelog.spark import register  # noqa: E402
from oncelog.spark.sink import OVERWRITE_REFUSED  # noqa: E402
from tests.integration.helpers import Rec, ck_consume, create_topic, norm_headers  # noqa: E402
from tests.spark.session import require_spark, start_session, stop_session  # noqa: E402
from tests.spark.txn_data import (  # noqa: E402
    produce_in_transaction,
    records,
    timed_records,
    transactional_producer,
    write_transactions,
)

POM = Path(__file__).parent / "kafka_connector" / "pom.xml"
RESOLVE_TIMEOUT_S = 600
_OFFLINE = re.compile(
    r"Could not transfer|Unknown ?host|Network is unreachable|Connection refused|Connect(ion)? timed out|"
    r"Read timed out|No route to host|Temporary failure in name resolution|offline mode|"
    r"has not been downloaded from it before|Cannot access central|PKIX path",
    re.IGNORECASE,
)


def connector_classpath(work: Path) -> list[str]:
    """The connector's jars in the local Maven repository (resolved from Maven Central on first use)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        pytest.skip("Spark's Kafka connector: no `mvn` on PATH to resolve spark-sql-kafka-0-10 from Maven Central")
    out = work / "classpath.txt"
    proc = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "dependency:build-classpath",
                           f"-Dmdep.outputFile={out}"], capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S)
    if proc.returncode != 0:
        log = proc.stdout + proc.stderr
        if _OFFLINE.search(log):
            pytest.skip(f"Spark's Kafka connector: Maven Central not reachable to resolve it:\n{log[-1500:]}")
        raise AssertionError(f"mvn could not resolve the connector's classpath:\n{log[-3000:]}")
    jars = [j for j in out.read_text().strip().split(":") if j]
    assert any("spark-sql-kafka-0-10" in j for j in jars), jars
    return jars


@pytest.fixture(scope="module")
def kafka_spark(tmp_path_factory):
    """A SparkSession whose JVM has Spark's Kafka connector on its classpath."""
    require_spark()
    work = tmp_path_factory.mktemp("spark-kafka")
    jars = connector_classpath(work)
    session = start_session(work, {"spark.jars": ",".join(jars)})
    yield session
    stop_session(session)


@pytest.fixture(autouse=True)
def broker_log_clean(module_broker):
    """Whatever the connector sent, the broker answered without logging a warning or an error. (Event loop stall
    reports, logger oncelog.loop, say how busy the machine is, with Spark's JVM on the same 2 cores, not how the
    broker answered: they are left out.)"""
    yield
    bad = [line for line in module_broker.log_tail(400).splitlines()
           if (" WARNING " in line or " ERROR " in line) and " oncelog.loop: " not in line]
    assert not bad, "broker logged:\n" + "\n".join(bad[-10:])


def spark_read(spark, bootstrap: str, topic: str, isolation: str = "read_committed") -> list[Rec]:
    rows = (spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .option("includeHeaders", "true")
            .option("kafka.isolation.level", isolation)
            .load()
            .collect())
    for row in rows:
        assert row.topic == topic
        assert row.timestamp is not None and row.timestampType == 0  # CreateTime
    return sorted((Rec(r.partition, r.offset, r.key, r.value, norm_headers((h.key, h.value) for h in r.headers or ()))
                   for r in rows), key=lambda r: (r.partition, r.offset))


def test_batch_read_committed_returns_exactly_the_committed_records(kafka_spark, module_broker, topic_name):
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    committed = write_transactions(bootstrap, topic_name, [
        ("commit", records("c1", 10, 2, with_headers=True)),
        ("abort", records("a1", 7, 2, with_headers=True)),
        ("commit", records("c2", 5, 2)),
        ("abort", records("a2", 4, 2)),
        ("commit", records("c3", 6, 2, with_headers=True)),
    ])
    assert len(committed) == 21

    got = spark_read(kafka_spark, bootstrap, topic_name)
    assert got == committed

    # The same read under read_uncommitted also returns the aborted records: the isolation level reached the broker.
    uncommitted = spark_read(kafka_spark, bootstrap, topic_name, isolation="read_uncommitted")
    assert sorted(r.value for r in uncommitted if r.value.startswith((b"a1-", b"a2-"))) == \
        sorted(o.value for o in records("a1", 7, 2) + records("a2", 4, 2))
    assert [r for r in uncommitted if not r.value.startswith((b"a1-", b"a2-"))] == committed


def test_batch_read_committed_stops_at_an_open_transaction(kafka_spark, module_broker, topic_name):
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    before = write_transactions(bootstrap, topic_name, [("commit", records("before", 6, 2))])
    holder = transactional_producer(bootstrap)
    try:
        produce_in_transaction(holder, topic_name, records("open", 4, 2))
        # Committed after the open transaction started: above the last stable offset until it ends.
        later = write_transactions(bootstrap, topic_name, [("commit", records("later", 4, 2))])

        assert spark_read(kafka_spark, bootstrap, topic_name) == before

        holder.abort_transaction(30)
        assert spark_read(kafka_spark, bootstrap, topic_name) == sorted(before + later,
                                                                         key=lambda r: (r.partition, r.offset))
    finally:
        holder.flush(5)


def test_streaming_read_committed_available_now(kafka_spark, module_broker, topic_name, tmp_path):
    """The streaming source plans offsets with the connector's admin client (ListOffsets under read_committed)."""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    committed = write_transactions(bootstrap, topic_name, [
        ("commit", records("s1", 8, 2)), ("abort", records("x1", 5, 2)), ("commit", records("s2", 6, 2)),
    ])
    query = (kafka_spark.readStream.format("kafka")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic_name)
             .option("startingOffsets", "earliest")
             .option("kafka.isolation.level", "read_committed")
             .option("maxOffsetsPerTrigger", "7")
             .load()
             .writeStream.format("memory").queryName("kafka_stream_out")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True)
             .start())
    try:
        assert query.awaitTermination(120), "the AvailableNow query did not finish in 120 s"
        assert query.exception() is None, query.exception()
        rows = kafka_spark.sql("select partition, offset, key, value from kafka_stream_out").collect()
        batches = [p for p in query.recentProgress if p.numInputRows > 0]
    finally:
        query.stop()
    got = sorted((Rec(r.partition, r.offset, r.key, r.value) for r in rows), key=lambda r: (r.partition, r.offset))
    assert got == committed
    assert len(batches) >= 3, f"maxOffsetsPerTrigger=7 over 26 offsets gave {len(batches)} batches"


def test_oncelog_source_returns_the_same_rows_as_spark_kafka_source(kafka_spark, module_broker, topic_name):
    """Same topic, same options: format("oncelog") and format("kafka") agree on every column of every row
    (timestamps, timestamp types and headers included), and on the schema."""
    register(kafka_spark)
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    write_transactions(bootstrap, topic_name, [
        ("commit", records("h", 10, 2, with_headers=True)), ("abort", records("x", 4, 2)),
        ("commit", records("n", 6, 2))], **{"compression.type": "lz4"})

    def load(fmt: str):
        return (kafka_spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic_name).option("includeHeaders", "true")
                .option("kafka.isolation.level", "read_committed").load())

    kafka_df, oncelog_df = load("kafka"), load("oncelog")
    assert oncelog_df.schema.simpleString() == kafka_df.schema.simpleString()
    expected = sorted(kafka_df.collect(), key=lambda r: (r.partition, r.offset))
    assert len(expected) == 16
    assert sorted(oncelog_df.collect(), key=lambda r: (r.partition, r.offset)) == expected


@pytest.mark.parametrize("options", [
    {"startingTimestamp": "2000", "endingTimestamp": "3000"},
    {"startingOffsetsByTimestamp": '{"T":{"0":0,"1":2500}}', "endingOffsetsByTimestamp": '{"T":{"0":2500,"1":9000}}'},
    {"startingTimestamp": "2000", "startingOffsetsByTimestamp": '{"T":{"0":0,"1":0}}', "startingOffsets": "earliest"},
    {"startingTimestamp": "9000"},  # partition 1 has no record that late, but its marker (written now) is
    {"startingTimestamp": "FUTURE", "startingOffsetsByTimestampStrategy": "latest"},
], ids=["timestamps", "by-partition", "precedence", "marker", "none-found-latest"])
def test_reads_by_time_match_spark_kafka_source(kafka_spark, module_broker, topic_name, options):
    """Positions by record time, with Spark's own connector as the oracle: the first record at or after each
    timestamp, an end with no such record is the partition's end, one timestamp wins over per-partition ones
    over offsets, and startingOffsetsByTimestampStrategy=latest starts a partition with none at its end."""
    register(kafka_spark)
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    write_transactions(bootstrap, topic_name, [("commit", timed_records({0: [1000, 2000, 3000], 1: [1500, 2500]})),
                                               ("commit", timed_records({0: [3500]}))])
    future = str(int(time.time() * 1000) + 86_400_000)  # after every record and marker
    options = {k: v.replace('"T"', json.dumps(topic_name)).replace("FUTURE", future) for k, v in options.items()}

    def load(fmt: str):
        reader = (kafka_spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", topic_name).option("kafka.isolation.level", "read_committed"))
        for key, value in options.items():
            reader = reader.option(key, value)
        return sorted((r.partition, r.offset, r.value) for r in reader.load().collect())

    expected = load("kafka")
    assert load("oncelog") == expected
    if "startingOffsetsByTimestampStrategy" not in options:
        assert expected, "the oracle read nothing: the options test nothing"


def test_subscribe_pattern_matches_spark_kafka_source(kafka_spark, module_broker, topic_name):
    """subscribePattern: the same topics as Spark's connector, which searches each name for the expression
    (Scala's findFirstIn: longer names that contain a match are read too, unlike a Java consumer's pattern
    subscription), and the same rows."""
    register(kafka_spark)
    bootstrap = module_broker.bootstrap
    for name in (topic_name + "-a", topic_name + "-b", topic_name + "-bb", "x" + topic_name + "-a"):
        create_topic(bootstrap, name, partitions=2)
        write_transactions(bootstrap, name, [("commit", records(name[-3:], 4, 2))])

    def load(fmt: str):
        df = (kafka_spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap)
              .option("subscribePattern", re.escape(topic_name) + "-[a-z]")
              .option("kafka.isolation.level", "read_committed").load())
        return sorted((r.topic, r.partition, r.offset, r.value) for r in df.collect())

    expected = load("kafka")
    assert {t for t, *_ in expected} == {topic_name + "-a", topic_name + "-b", topic_name + "-bb",
                                         "x" + topic_name + "-a"}
    assert load("oncelog") == expected


def test_spark_kafka_sink_writes_to_oncelog(kafka_spark, module_broker, topic_name):
    """Spark's own Kafka sink (the Java producer, idempotent by default) writes rows with keys, headers and
    explicit partitions; librdkafka reads exactly those records back."""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, partitions=3)
    rows = [(f"k{i}".encode(), f"v{i}".encode() * 5, i % 3, [("i", str(i).encode())]) for i in range(300)]
    df = kafka_spark.createDataFrame(rows, "key binary, value binary, partition int, "
                                           "headers array<struct<key: string, value: binary>>")
    (df.repartition(2).write.format("kafka").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic_name).option("includeHeaders", "true").save())
    got = ck_consume(bootstrap, topic_name, {0: 0, 1: 0, 2: 0}, **{"isolation.level": "read_committed"})
    assert sorted((r.partition, r.key, r.value, r.headers) for r in got) == sorted(
        (p, k, v, (("i", h[0][1]),)) for k, v, p, h in rows)
    for partition in range(3):
        offsets = [r.offset for r in got if r.partition == partition]
        assert offsets == list(range(100)), f"partition {partition}: offsets {offsets[:5]}..."


def test_batch_write_save_modes_against_spark_kafka_sink(kafka_spark, module_broker, topic_name):
    """Spark's Kafka sink as the oracle for save modes: it appends in Append and ErrorIfExists (the default, so
    a bare .save() works) and refuses Overwrite and Ignore. The oncelog sink appends in Append and refuses
    Overwrite in the same words, adding what to write; ErrorIfExists and Ignore Spark refuses for every Python
    data source before the source is asked (the one difference: the oncelog sink needs .mode("append"))."""
    from pyspark.errors import AnalysisException

    register(kafka_spark)
    bootstrap = module_broker.bootstrap
    modes = [None, "errorifexists", "append", "overwrite", "ignore"]

    def outcomes(fmt: str, topic: str) -> dict[str | None, tuple[str | None, str]]:
        """mode (None: none set) -> ("written", "") or (error condition, message)."""
        create_topic(bootstrap, topic)
        got = {}
        for mode in modes:
            writer = (kafka_spark.createDataFrame([(f"{mode}",)], "value string").write.format(fmt)
                      .option("kafka.bootstrap.servers", bootstrap).option("topic", topic))
            try:
                (writer if mode is None else writer.mode(mode)).save()
                got[mode] = ("written", "")
            except AnalysisException as exc:
                got[mode] = (exc.getCondition(), str(exc))
        written = ck_consume(bootstrap, topic, {0: 0}, **{"isolation.level": "read_committed"})
        assert sorted(r.value.decode() for r in written) == sorted(f"{m}" for m in modes if got[m][0] == "written")
        return got

    kafka = outcomes("kafka", topic_name + "-kafka")
    assert {mode: condition for mode, (condition, _) in kafka.items()} == {
        None: "written", "errorifexists": "written", "append": "written",
        "overwrite": "_LEGACY_ERROR_TEMP_3081", "ignore": "_LEGACY_ERROR_TEMP_3081"}
    for mode in ("Overwrite", "Ignore"):
        assert (f"Save mode {mode} not allowed for Kafka. Allowed save modes are Append and ErrorIfExists "
                "(default).") in kafka[mode.lower()][1]

    oncelog = outcomes("oncelog", topic_name + "-oncelog")
    assert {mode: condition for mode, (condition, _) in oncelog.items()} == {
        None: "UNSUPPORTED_DATA_SOURCE_SAVE_MODE", "errorifexists": "UNSUPPORTED_DATA_SOURCE_SAVE_MODE",
        "append": "written", "overwrite": "PYTHON_DATA_SOURCE_ERROR", "ignore": "UNSUPPORTED_DATA_SOURCE_SAVE_MODE"}
    for mode, name in ((None, "ErrorIfExists"), ("errorifexists", "ErrorIfExists"), ("ignore", "Ignore")):
        assert f'The data source "oncelog" cannot be written in the "{name}" mode.' in oncelog[mode][1]
    assert f"oncelog.spark.options.OptionError: {OVERWRITE_REFUSED}" in oncelog["overwrite"][1]
