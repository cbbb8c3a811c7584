"""Spark pipelines over oncelog, end to end: records/s of PySpark Structured Streaming jobs (local[2]).

One broker on this machine, an input topic filled with `--records` records of 100-byte values, then each
pipeline runs as a streaming query with Trigger.AvailableNow (micro-batches of `--batch-offsets` offsets) from
the input topic to its sink, timed from `start()` to termination (query start-up included) and, separately,
the sum of the micro-batches' `triggerExecution` (time inside Spark's batches):

- `oncelog -> noop`, `kafka -> noop`: the sources alone (format "oncelog" vs Spark's spark-sql-kafka-0-10);
- `oncelog -> oncelog (exactly-once)`: the oncelog sink, transactional, where this checkout has it;
- `kafka -> kafka (at-least-once)`: Spark's own Kafka source and sink;
- `rate -> oncelog`, `rate -> kafka`: the two sinks fed by Spark's JVM `rate-micro-batch` source (the same
  100-byte values, `--batch-offsets` rows per micro-batch, processingTime 0 s until `--records` rows are in),
  so the sinks are compared without a Python source in front of them.

`--broker kafka` runs the same pipelines against Apache Kafka 4.4.0 (one KRaft node on loopback, started by
tests/support/kafka.py) instead of oncelog's broker: the exactly-once sink into the Kafka clusters people run.

Every sink's output is read back under read_committed and checked: records, distinct values (duplicates) and
missing values. Spark's Kafka connector is loaded where Maven can resolve it (see
tests/spark/kafka_connector/pom.xml); without it those rows say why they were not run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from oncelog.embedded import BrokerProcess  # noqa: E402

VALUE_BYTES = 100
POM = ROOT / "tests" / "spark" / "kafka_connector" / "pom.xml"


def connector_jars(work: Path) -> tuple[list[str], str | None]:
    """spark-sql-kafka-0-10's jars from the local Maven repository, or ([], why not)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        return [], "no mvn on PATH"
    out = work / "classpath.txt"
    proc = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "dependency:build-classpath",
                           f"-Dmdep.outputFile={out}"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return [], "mvn could not resolve spark-sql-kafka-0-10: " + (proc.stdout + proc.stderr)[-300:]
    return [j for j in out.read_text().strip().split(":") if j], None


def start_broker(kind: str, tmp: Path) -> Any:
    """oncelog's broker or one Apache Kafka node, as a context manager with `.bootstrap`."""
    if kind == "oncelog":
        return BrokerProcess(tmp / "data")
    sys.path.insert(0, str(ROOT))
    from tests.support.kafka import KafkaCluster

    return KafkaCluster(tmp / "kafka")


def fill(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    """`records` records with unique 100-byte values (the index, zero-padded), committed in transactions."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-fill-{topic}",
                         "linger.ms": 20, "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000})
    producer.init_transactions(30)
    per_txn = 100_000
    for first in range(0, records, per_txn):
        producer.begin_transaction()
        for i in range(first, min(records, first + per_txn)):
            value = b"%0*d" % (VALUE_BYTES, i)
            while True:
                try:
                    producer.produce(topic, value=value, key=b"%d" % i, partition=i % partitions)
                    break
                except BufferError:
                    producer.poll(0.005)
        producer.commit_transaction(120)


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive its futures
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def has_oncelog_sink() -> bool:
    from pyspark.sql.datasource import DataSource

    from oncelog.spark import OncelogDataSource
    return OncelogDataSource.streamWriter is not DataSource.streamWriter


class PipelineFailed(RuntimeError):
    pass


def generated(spark: Any, rows_per_batch: int, partitions: int) -> Any:
    """Spark's JVM rate source, shaped like the input topic: key = the index, value = the index in 100 bytes."""
    return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
            .option("numPartitions", partitions).load()
            .selectExpr("CAST(CAST(value AS STRING) AS BINARY) AS key",
                        f"CAST(lpad(CAST(value AS STRING), {VALUE_BYTES}, '0') AS BINARY) AS value"))


def run_pipeline(spark: Any, bootstrap: str, source: str, sink: str, in_topic: str, out_topic: str | None,
                 batch_offsets: int, checkpoint: Path, records: int = 0, partitions: int = 2) -> dict:
    if source == "rate":
        rows = generated(spark, batch_offsets, partitions)
        writer = rows.writeStream.option("checkpointLocation", str(checkpoint)).trigger(processingTime="0 seconds")
        if sink == "noop":
            writer = writer.format("noop")
        else:
            writer = writer.format(sink).option("kafka.bootstrap.servers", bootstrap).option("topic", out_topic)
        return _run_until(writer, records)
    reader = (spark.readStream.format(source).option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", in_topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(batch_offsets)))
    if source == "kafka":
        reader = reader.option("kafka.isolation.level", "read_committed")
    rows = reader.load().select("key", "value")
    writer = rows.writeStream.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    if sink == "noop":
        writer = writer.format("noop")
    else:
        writer = writer.format(sink).option("kafka.bootstrap.servers", bootstrap).option("topic", out_topic)
    started = time.perf_counter()
    query = writer.start()
    try:
        query.awaitTermination()
    except Exception as exc:  # the query failed: its first line says why
        raise PipelineFailed(str(exc).strip().splitlines()[0][:300]) from None
    finally:
        query.stop()
    wall = time.perf_counter() - started
    progress = query.recentProgress
    rows_in = sum(p.numInputRows for p in progress)
    in_spark = sum(p.durationMs.get("triggerExecution", 0) for p in progress) / 1000
    return {"rows": rows_in, "wall_s": wall, "records_per_s": rows_in / wall, "batches": len(progress),
            "in_batches_s": in_spark, "in_batches_records_per_s": rows_in / in_spark if in_spark else None}


def _run_until(writer: Any, records: int) -> dict:
    """Run a never-ending query until its completed micro-batches hold `records` rows, then stop it.

    Only completed (committed) batches count: the batch running when the query stops is aborted.
    """
    started = time.perf_counter()
    query = writer.start()
    try:
        while sum(p["numInputRows"] for p in query.recentProgress) < records:
            if query.exception() is not None:
                raise PipelineFailed(str(query.exception()).strip().splitlines()[0][:300])
            time.sleep(0.05)
        wall = time.perf_counter() - started
    finally:
        query.stop()
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows_in = sum(p["numInputRows"] for p in progress)
    in_spark = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    return {"rows": rows_in, "wall_s": wall, "records_per_s": rows_in / wall, "batches": len(progress),
            "in_batches_s": in_spark, "in_batches_records_per_s": rows_in / in_spark if in_spark else None}


def verify(spark: Any, bootstrap: str, topic: str, expected: int) -> dict:
    """Output read back under read_committed: records, duplicates and missing values."""
    from pyspark.sql import functions as F

    df = (spark.read.format("oncelog").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
          .load())
    counts = df.agg(F.count("*").alias("n"), F.countDistinct("value").alias("distinct")).collect()[0]
    # `unexpected`: distinct values beyond the expected ones, e.g. rows of a micro-batch that was aborted when
    # the query stopped but whose writes an at-least-once sink had already made visible.
    return {"records": counts.n, "duplicates": counts.n - counts.distinct,
            "missing": max(0, expected - counts.distinct), "unexpected": max(0, counts.distinct - expected)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--batch-offsets", type=int, default=250_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--runs", type=int, default=2, help="runs per pipeline (median reported)")
    parser.add_argument("--broker", choices=("oncelog", "kafka"), default="oncelog",
                        help="the broker under the pipelines: oncelog's, or Apache Kafka 4.4.0 (KRaft, one node)")
    parser.add_argument("--only", default="", help="comma-separated pipelines to run, e.g. 'rate->oncelog,rate->kafka'")
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    results: dict[str, Any] = {"broker": args.broker, "records": args.records, "partitions": args.partitions,
                               "batch_offsets": args.batch_offsets, "value_bytes": VALUE_BYTES, "pipelines": {}}
    with tempfile.TemporaryDirectory(prefix="oncelog-spark-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        jars, no_kafka = connector_jars(tmp)
        with start_broker(args.broker, tmp) as broker:
            bootstrap = broker.bootstrap
            create_topic(bootstrap, "bench-in", args.partitions)
            t0 = time.perf_counter()
            fill(bootstrap, "bench-in", args.records, args.partitions)
            print(f"input: {args.records:,} records in {time.perf_counter() - t0:.1f} s", flush=True)

            from pyspark.sql import SparkSession

            builder = (SparkSession.builder.master("local[2]").appName("oncelog-bench")
                       .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                       .config("spark.sql.shuffle.partitions", "2")
                       .config("spark.local.dir", str(tmp / "spark")))
            if jars:
                builder = builder.config("spark.jars", ",".join(jars))
            spark = builder.getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            from oncelog.spark import register
            register(spark)
            pipelines = [("oncelog", "noop"), ("kafka", "noop"), ("oncelog", "oncelog"), ("kafka", "kafka"),
                         ("rate", "oncelog"), ("rate", "kafka")]
            if args.only:
                wanted = {name.replace(" ", "") for name in args.only.split(",")}
                pipelines = [(a, b) for a, b in pipelines if f"{a}->{b}" in wanted]
            # Start Spark's Python workers (planning and executors) before anything is timed.
            if any(source == "oncelog" for source, _ in pipelines):
                spark.read.format("oncelog").option("kafka.bootstrap.servers", bootstrap).option(
                    "subscribe", "bench-in").load().limit(10).collect()
            if any(sink == "oncelog" for _, sink in pipelines):
                create_topic(bootstrap, "bench-warm-up", args.partitions)
                spark.range(100).selectExpr("CAST(id AS STRING) AS value").repartition(args.partitions).write \
                    .format("oncelog").option("kafka.bootstrap.servers", bootstrap) \
                    .option("topic", "bench-warm-up").mode("append").save()
            sink_missing = None if has_oncelog_sink() else "this checkout has no oncelog sink"
            for source, sink in pipelines:
                name = f"{source} -> {sink}"
                why_not = no_kafka if "kafka" in (source, sink) else None
                why_not = why_not or (sink_missing if sink == "oncelog" else None)
                if why_not:
                    results["pipelines"][name] = {"skipped": why_not}
                    print(f"{name}: skipped ({why_not})", flush=True)
                    continue
                runs = []
                failure = ""
                for run in range(args.runs):
                    out_topic = None
                    if sink != "noop":
                        out_topic = f"bench-out-{source}-{sink}-{run}"
                        create_topic(bootstrap, out_topic, args.partitions)
                    try:
                        r = run_pipeline(spark, bootstrap, source, sink, "bench-in", out_topic, args.batch_offsets,
                                         tmp / f"ckpt-{source}-{sink}-{run}", args.records, args.partitions)
                    except PipelineFailed as exc:
                        failure = f"failed: {exc}"
                        print(f"{name} run {run}: {failure}", flush=True)
                        break
                    if out_topic is not None:
                        r["verify"] = verify(spark, bootstrap, out_topic, r["rows"] if source == "rate"
                                             else args.records)
                    runs.append(r)
                    print(f"{name} run {run}: {r['rows']:,} rows, {r['wall_s']:.2f} s wall, "
                          f"{r['records_per_s']:,.0f} records/s ({r['batches']} batches, "
                          f"{r['in_batches_s']:.2f} s in batches)" + (f", output {r['verify']}" if "verify" in r
                                                                       else ""), flush=True)
                if not runs:
                    results["pipelines"][name] = {"skipped": failure}
                    continue
                results["pipelines"][name] = {
                    "records_per_s": statistics.median(r["records_per_s"] for r in runs),
                    "in_batches_records_per_s": statistics.median(r["in_batches_records_per_s"] or 0 for r in runs),
                    "runs": runs,
                }
            spark.stop()

    print(f"\nSpark pipelines on {args.broker}, {args.records:,} records x {VALUE_BYTES} B, {args.partitions} partitions, local[2], "
          f"AvailableNow with maxOffsetsPerTrigger={args.batch_offsets:,}, median of {args.runs} runs")
    print(f"{'pipeline':<24}{'records/s':>12}{'in batches/s':>14}  output (read_committed)")
    for name, r in results["pipelines"].items():
        if "skipped" in r:
            print(f"{name:<24}{'-':>12}{'-':>14}  skipped: {r['skipped']}")
            continue
        checks = [run["verify"] for run in r["runs"] if "verify" in run]
        check = (f"{sum(c['duplicates'] for c in checks)} duplicates, {sum(c['missing'] for c in checks)} missing, "
                 f"{sum(c.get('unexpected', 0) for c in checks)} unexpected" if checks else "-")
        print(f"{name:<24}{r['records_per_s']:>12,.0f}{r['in_batches_records_per_s']:>14,.0f}  {check}")
    out = ROOT / "bench" / "results" / f"spark_pipeline-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
