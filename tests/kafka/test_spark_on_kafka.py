"""The `oncelog` Spark source and exactly-once sink against Apache Kafka 4.4.0 (KRaft), not oncelog's broker.

Everything tests/spark shows against oncelog's broker, shown again where it matters against the real thing:

- the source in batch (subscribe, assign, startingOffsets / endingOffsets, read_committed hiding what a
  transactional producer aborted) and in streaming (Trigger.AvailableNow, then more data, then a second run
  from the checkpoint reads only the new data);
- the exactly-once sink, streaming from the oncelog source into a Kafka topic, judged by librdkafka under
  read_committed (tests/spark/eos_check.py), and under each fault of tests/spark/test_eos_faults.py (the same
  scenarios, tests/spark/eos_faults.py): a task failing half-way, a transaction timeout (Kafka's reaper),
  Kafka SIGKILLed in the middle of a batch and restarted, the driver SIGKILLed in the middle of a batch;
- the sink and the source over SASL_SSL with SCRAM-SHA-512, configured with Spark's own `kafka.`-prefixed
  option names (what a pipeline written for `format("kafka")` passes), and with librdkafka's in mixed case;
- on three nodes, a replication-factor-3 output topic whose partition leader is SIGKILLed in the middle of a
  batch;
- `python -m oncelog.spark.demo --bootstrap` against an existing Kafka, over PLAINTEXT and over SASL_SSL.

Markers: every test here is `kafka` (tests/kafka/conftest.py); the three-node test is `kafka_cluster`; the
tests that take about a minute or more on a busy machine (the faults that start a Kafka of their own or a
second Spark driver, the demo runs with a Spark of their own) are `kafka_slow`. `make test` leaves out `kafka_slow` and
`kafka_cluster`, `make kafka-test` runs everything. Input is a few hundred records of at most 2 KB.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import Out, Rec, ck_produce, create_topic
from tests.spark.eos_check import assert_exactly_once, nothing_pending, pending_partitions, write_input
from tests.spark.eos_faults import (
    broker_down_during_a_batch,
    driver_sigkill_in_the_middle_of_a_batch,
    retry_session,
    run_query,
    task_failure_half_way,
    transaction_timeout_in_a_slow_task,
)
from tests.spark.session import require_spark, stop_session
from tests.spark.txn_data import records, write_transactions

REPO = Path(__file__).resolve().parents[2]
KAFKA_SLOW = pytest.mark.kafka_slow

# Kafka's transaction-timeout reaper runs every 10 s by default; the timeout test wants it within a second.
REAPER_SETTINGS = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 500}


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """One SparkSession (and JVM) for the module: `local[2,3]` (failed tasks are retried), Arrow batches of 25."""
    require_spark()
    session = retry_session(tmp_path_factory.mktemp("spark-on-kafka"))
    yield session
    stop_session(session)


# -- helpers ------------------------------------------------------------------------------------------------


def batch(spark, bootstrap: str, **options: str):
    reader = spark.read.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def recs(rows, topic: str) -> list[Rec]:
    out = []
    for row in rows:
        assert row.topic == topic
        out.append(Rec(row.partition, row.offset, row.key, row.value))
    return sorted(out, key=lambda r: (r.partition, r.offset))


def spark_security(kafka, *, jaas: bool) -> dict[str, str]:
    """SASL_SSL + SCRAM-SHA-512 as Spark options: the Java client's spellings (sasl.jaas.config, a PEM trust
    store), or librdkafka's (sasl.mechanisms, sasl.username / sasl.password, ssl.ca.location) in mixed case:
    Spark lower-cases option names before a data source sees them."""
    tls = kafka.tls
    if jaas:
        return {
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                      'username="alice" password="alice-secret";',
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": str(tls.ca_pem),
        }
    return {
        "kafka.Security.Protocol": "SASL_SSL",
        "kafka.SASL.Mechanisms": "SCRAM-SHA-512",
        "kafka.sasl.username": "alice",
        "kafka.sasl.password": "alice-secret",
        "kafka.ssl.ca.location": str(tls.ca_pem),
    }


# -- the source -----------------------------------------------------------------------------------------


def test_batch_read_subscribe_assign_and_offsets(spark, kafka, topic_name):
    bootstrap = kafka.bootstrap
    create_topic(bootstrap, topic_name, partitions=3)
    outs = [Out(i % 3, f"k{i}".encode(), f"v{i}".encode()) for i in range(30)]
    acked = ck_produce(bootstrap, topic_name, outs)
    written = sorted((Rec(p, o, out.key, out.value) for out, (p, o) in zip(outs, acked, strict=True)),
                     key=lambda r: (r.partition, r.offset))

    df = batch(spark, bootstrap, subscribe=topic_name)
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    assert recs(df.collect(), topic_name) == written

    df = batch(spark, bootstrap, assign=json.dumps({topic_name: [0, 2]}))
    assert recs(df.collect(), topic_name) == [r for r in written if r.partition in (0, 2)]

    df = batch(spark, bootstrap, subscribe=topic_name,
               startingOffsets=json.dumps({topic_name: {"0": 2, "1": -2, "2": 9}}),
               endingOffsets=json.dumps({topic_name: {"0": 5, "1": 3, "2": -1}}))
    assert recs(df.collect(), topic_name) == [
        r for r in written if (r.partition == 0 and 2 <= r.offset < 5) or (r.partition == 1 and r.offset < 3)
        or (r.partition == 2 and r.offset >= 9)]


def test_batch_read_committed_hides_what_a_transactional_producer_aborted(spark, kafka, topic_name):
    bootstrap = kafka.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    committed = write_transactions(bootstrap, topic_name, [
        ("commit", records("c1", 10, 2)), ("abort", records("a1", 6, 2)), ("commit", records("c2", 8, 2)),
        ("abort", records("a2", 4, 2))])
    # Kafka's offsets: records and transaction markers; what read_committed returns is exactly the committed
    # records at the offsets the producer was given.
    assert recs(batch(spark, bootstrap, subscribe=topic_name).collect(), topic_name) == committed
    everything = batch(spark, bootstrap, subscribe=topic_name, **{"kafka.isolation.level": "read_uncommitted"})
    aborted = {o.value for o in records("a1", 6, 2) + records("a2", 4, 2)}
    assert {r.value for r in everything.collect()} == {r.value for r in committed} | aborted


def test_stream_available_now_then_resume_from_the_checkpoint(spark, kafka, topic_name, tmp_path):
    """A first AvailableNow run reads what is there; a second from the same checkpoint only what came since."""
    bootstrap = kafka.bootstrap
    create_topic(bootstrap, topic_name, partitions=2)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = write_transactions(bootstrap, topic_name, [("commit", records("s1", 20, 2)),
                                                       ("abort", records("x1", 6, 2))])
    progress = stream_to_parquet(spark, bootstrap, topic_name, out, checkpoint, maxOffsetsPerTrigger="10")
    assert recs(spark.read.parquet(str(out)).collect(), topic_name) == first
    assert len(progress) >= 2, f"maxOffsetsPerTrigger=10 over 28 offsets gave {len(progress)} batches"

    second = write_transactions(bootstrap, topic_name, [("commit", records("s2", 12, 2))])
    progress = stream_to_parquet(spark, bootstrap, topic_name, out, checkpoint)
    assert sum(p.numInputRows for p in progress) == len(second), "the second run read more than the new data"
    assert recs(spark.read.parquet(str(out)).collect(), topic_name) == sorted(
        first + second, key=lambda r: (r.partition, r.offset))


def stream_to_parquet(spark, bootstrap: str, topic: str, out: Path, checkpoint: Path, **options: str):
    reader = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(300), "the AvailableNow query did not finish in 300 s"
        assert query.exception() is None, query.exception()
        return [p for p in query.recentProgress if p.numInputRows > 0]
    finally:
        query.stop()


# -- the exactly-once sink ----------------------------------------------------------------------------------


def test_exactly_once_sink_from_the_oncelog_source(spark, kafka, topic_name, tmp_path):
    """Source topic -> oncelog sink -> Kafka topic in several micro-batches, then more input and a restart from
    the checkpoint: every record once under read_committed, no transaction left open."""
    bootstrap = kafka.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    data = write_input(bootstrap, source, 300, pad=100)
    create_topic(bootstrap, sink, partitions=2)
    run_query(spark, bootstrap, source, sink, tmp_path / "ckpt", per_trigger=120)
    assert_exactly_once(bootstrap, sink, 2, [v for _, v in data])
    more = [Out(i % 2, f"k{i}".encode(), f"v{i}|".encode()) for i in range(300, 340)]
    ck_produce(bootstrap, source, more)
    run_query(spark, bootstrap, source, sink, tmp_path / "ckpt", per_trigger=120)
    assert_exactly_once(bootstrap, sink, 2, [v for _, v in data] + [o.value for o in more])
    assert nothing_pending(bootstrap, sink, 2)


def test_task_failure_half_way_is_retried_without_duplicates(spark, kafka, topic_name, tmp_path):
    task_failure_half_way(spark, kafka.bootstrap, f"{topic_name}-in", f"{topic_name}-out", tmp_path)


@KAFKA_SLOW
def test_transaction_timeout_in_a_slow_task(spark, kafka_factory, topic_name, tmp_path):
    """Kafka's coordinator aborts a transaction that outlives transaction.timeout.ms (its reaper runs every
    500 ms here): the slow task's next send is fenced and the task retried; the driver's late commit of the
    other partition fails and the query, restarted from its checkpoint, replays the batch."""
    cluster = kafka_factory(REAPER_SETTINGS)
    transaction_timeout_in_a_slow_task(spark, cluster.bootstrap, f"{topic_name}-in", f"{topic_name}-out",
                                       tmp_path, timeout_ms=3000, slow_s=9.0)


@KAFKA_SLOW
def test_kafka_sigkill_during_a_batch(spark, kafka_factory, topic_name, tmp_path):
    """kill -9 of the only Kafka node while batch 1 holds open transactions with records in them, then a
    restart on the same data; the query is restarted from its checkpoint if it gave up meanwhile."""
    cluster = kafka_factory()
    node = cluster.node(1)
    pids: list[int | None] = [node.pid]

    def kill() -> None:
        node.kill()
        assert not node.alive()

    def restart() -> None:
        node.start()
        pids.append(node.pid)

    broker_down_during_a_batch(spark, cluster.bootstrap, f"{topic_name}-in", f"{topic_name}-out", tmp_path,
                               kill=kill, restart=restart, slow_s=10.0)
    assert len(pids) == 2 and pids[0] != pids[1], "Kafka was not killed and restarted"


@KAFKA_SLOW
def test_driver_sigkill_in_the_middle_of_a_batch(kafka, topic_name, tmp_path):
    require_spark()
    driver_sigkill_in_the_middle_of_a_batch(kafka.bootstrap, f"{topic_name}-in", f"{topic_name}-out", tmp_path)


# -- secured ------------------------------------------------------------------------------------------------


def test_sink_and_source_over_sasl_ssl_with_spark_option_names(spark, kafka, topic_name, tmp_path):
    """SCRAM-SHA-512 over TLS, configured as a `format("kafka")` pipeline would be: the streaming source and
    the exactly-once sink with the Java client's spellings; a batch write and a batch read with librdkafka's,
    in mixed case (its `sasl.mechanisms` was dropped on the way to the source's admin and fetch clients, and
    refused by the sink). The data is written and judged over PLAINTEXT by librdkafka."""
    plain, secured = kafka.bootstrap, kafka.bootstrap_for("SASL_SSL")
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    data = write_input(plain, source, 200, pad=100)
    create_topic(plain, sink, partitions=2)
    run_query(spark, secured, source, sink, tmp_path / "ckpt", per_trigger=80,
              client=spark_security(kafka, jaas=True))
    assert_exactly_once(plain, sink, 2, [v for _, v in data])
    assert nothing_pending(plain, sink, 2)

    extra = [(f"x{i}".encode(), f"extra-{i}".encode()) for i in range(20)]
    writer = (spark.createDataFrame(extra, "key binary, value binary").write.format("oncelog").mode("append")
              .option("kafka.bootstrap.servers", secured).option("topic", sink))
    reader = spark.read.format("oncelog").option("kafka.bootstrap.servers", secured).option("subscribe", sink)
    for key, value in spark_security(kafka, jaas=False).items():
        writer, reader = writer.option(key, value), reader.option(key, value)
    writer.save()
    expected = [v for _, v in data] + [v for _, v in extra]
    assert_exactly_once(plain, sink, 2, expected)
    assert sorted(r.value for r in reader.load().collect()) == sorted(expected)


# -- three nodes --------------------------------------------------------------------------------------------


@pytest.mark.kafka_cluster
@KAFKA_SLOW
def test_leader_of_the_output_sigkilled_during_a_batch(spark, kafka_cluster, topic_name, tmp_path):
    """Replication factor 3, min.insync.replicas 2: the leader of an output partition that an open transaction
    of batch 1 has written to is SIGKILLed, and started again once another replica leads; exactly once."""
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    killed: list[tuple[int, int]] = []  # (partition, its leader)

    def kill_leader() -> None:
        pending = pending_partitions(kafka_cluster.bootstrap, sink, 2)
        assert pending, "no open transaction holds records in the output: no fault tested"
        leader = kafka_cluster.partition_leader(sink, pending[0])
        kafka_cluster.node(leader).kill()
        killed.append((pending[0], leader))

    def restart_leader() -> None:
        partition, leader = killed[0]
        kafka_cluster.partition_leader(sink, partition, timeout=120, exclude=[leader])  # a new leader
        kafka_cluster.node(leader).start()

    broker_down_during_a_batch(spark, kafka_cluster.bootstrap, source, sink, tmp_path, kill=kill_leader,
                               restart=restart_leader, replication_factor=3, slow_s=10.0)
    assert len(killed) == 1


# -- the demo -----------------------------------------------------------------------------------------------


def run_demo(kafka, listener: str, *args: str, timeout: float = 600) -> str:
    """The demo, shortened, against the `kafka` fixture's `listener`: an exactly-once verdict, on topics of
    its own (unique to the run, deleted after the verdict), without a broker of its own."""
    from confluent_kafka.admin import AdminClient

    require_spark()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=str(REPO / "src"))
    bootstrap = kafka.bootstrap_for(listener)
    proc = subprocess.run([sys.executable, "-m", "oncelog.spark.demo", "--seconds", "6", "--rate", "500",
                           "--bootstrap", bootstrap, *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{out[-3000:]}\n{proc.stderr[-3000:]}"
    assert "EXACTLY ONCE: yes" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert lines["duplicates"].split()[-1] == "0" and lines["losses"].split()[-1] == "0"
    assert "broker listening" not in out  # it used the given cluster and started no broker of its own
    assert f"using the cluster at {bootstrap} (security.protocol {listener})" in out
    names = re.search(r"; topics (\S+), (\S+), (\S+)\n", out)
    assert names and all(name.startswith("oncelog-demo-") for name in names.groups()), out[:500]
    listed = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=30).topics
    assert not set(names.groups()) & set(listed), "the run's topics were not deleted after the verdict"
    return out


@KAFKA_SLOW
def test_demo_against_kafka_plaintext(kafka):
    run_demo(kafka, "PLAINTEXT")


@KAFKA_SLOW
def test_demo_against_kafka_sasl_ssl(kafka, tmp_path):
    """Security settings as the CLI takes them: a client.properties file, and a -X that overrides it."""
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=alice\n"
                     f"sasl.password=wrong\nssl.ca.location={kafka.tls.ca_pem}\n")
    run_demo(kafka, "SASL_SSL", "--command-config", str(props), "-X", "sasl.password=alice-secret")
