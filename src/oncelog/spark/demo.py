"""`make demo`: an exactly-once PySpark pipeline on one machine, from an empty directory to a verdict.

    events ──(stage 1: parse JSON, keep purchases, re-key by user)──▶ by-user ──(stage 2: format)──▶ purchases

1. An embedded oncelog broker starts on a free loopback port, with data in a temporary directory.
2. A generator thread writes shop events (JSON, keyed by session) to `events` for a fixed time.
3. Two Structured Streaming queries run in one SparkSession (`local[2]`), both reading with the `oncelog`
   source (read_committed) and writing with the exactly-once `oncelog` sink. `by-user` is a repartition
   topic, as Kafka Streams makes one: after each stage-2 batch the demo deletes what stage 2 has consumed
   (DeleteRecords), so stage 1's producers keep writing to partitions whose earlier records, and with them
   the records of their producer ids, are gone: the case KIP-360 was written for.
4. When the generator has stopped and both stages have caught up, the queries stop and a verifier reads
   `purchases` with read_committed and compares it with what the events imply: counts, duplicates, losses.

Progress is printed every two seconds. The exit status is 0 only for an exactly-once verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from oncelog.client.admin import Admin
from oncelog.embedded import BrokerProcess
from oncelog.spark.demo_data import Generator, expected_output, judge, read_committed

EVENTS, BY_USER, PURCHASES = "events", "by-user", "purchases"
EVENT_SCHEMA = "id bigint, user string, action string, cents bigint"
LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def spark_session(work: Path) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from oncelog.spark import register

    log_conf = work / "log4j2.properties"
    log_conf.write_text(LOG4J2)
    (work / "java-tmp").mkdir()
    java_opts = f"-Dlog4j2.configurationFile=file:{log_conf} -Djava.io.tmpdir={work / 'java-tmp'}"
    spark = (SparkSession.builder.master("local[2]").appName("oncelog-demo")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.extraJavaOptions", java_opts).config("spark.local.dir", str(work / "local"))
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def start_stages(spark: Any, bootstrap: str, work: Path) -> tuple[Any, Any]:
    def read(topic: str) -> Any:
        return (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic).option("startingOffsets", "earliest").load())

    def write(df: Any, topic: str, name: str) -> Any:
        return (df.writeStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
                .option("topic", topic).option("checkpointLocation", str(work / "checkpoints" / name))
                .trigger(processingTime="1 second").queryName(name).start())

    events = read(EVENTS).selectExpr(f"from_json(CAST(value AS STRING), '{EVENT_SCHEMA}') AS e").select("e.*")
    purchases = events.where("action = 'purchase'").selectExpr(
        "user AS key", "to_json(named_struct('id', id, 'user', user, 'cents', cents)) AS value")
    stage1 = write(purchases, BY_USER, "stage1-rekey")
    by_user = read(BY_USER).selectExpr(f"from_json(CAST(value AS STRING), '{EVENT_SCHEMA}') AS e").select("e.*")
    formatted = by_user.selectExpr("user AS key", "concat_ws(':', user, CAST(id AS STRING), CAST(cents AS STRING))"
                                   " AS value")
    stage2 = write(formatted, PURCHASES, "stage2-format")
    return stage1, stage2


def consumed(query: Any) -> dict[tuple[str, int], int]:
    """The source offsets of the query's last completed batch (its progress comes after the commit)."""
    progress = query.lastProgress
    if not progress or not progress.get("sources"):
        return {}
    end = progress["sources"][0].get("endOffset")
    if isinstance(end, str):
        end = json.loads(end)
    return {(t, int(p)): int(o) for t, parts in (end or {}).items() for p, o in parts.items()}


def rows_in(query: Any) -> int:
    return sum(p.get("numInputRows", 0) for p in query.recentProgress)


def run(seconds: float, rate: int, keep: bool) -> int:
    work = Path(tempfile.mkdtemp(prefix="oncelog-demo-"))
    broker = BrokerProcess(work / "broker-data", {"num.partitions": 2})
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:5.1f}s] {text}", flush=True)

    try:
        broker.start()
        say(f"broker listening on {broker.bootstrap} (data in {work})")
        admin = Admin({"bootstrap.servers": broker.bootstrap})
        for topic in (EVENTS, BY_USER, PURCHASES):
            admin.create_topic(topic, 2)
        say("starting Spark (local[2])")
        spark = spark_session(work)
        stage1, stage2 = start_stages(spark, broker.bootstrap, work)
        say("stage 1 (parse, keep purchases, re-key by user -> by-user) and stage 2 (format -> purchases) started")
        waiting = time.monotonic()
        while stage1.lastProgress is None or stage2.lastProgress is None:  # first (empty) batches: workers up
            for query in (stage1, stage2):
                if query.exception() is not None:
                    raise RuntimeError(f"{query.name} failed: {query.exception()}")
            if time.monotonic() - waiting >= 5.0:
                waiting = time.monotonic()
                say("waiting for the first (empty) micro-batches: Spark starts its Python workers")
            time.sleep(0.2)
        generator = Generator(broker.bootstrap, EVENTS, rate, seconds)
        generator.start()
        say(f"both stages ready; generating events for {seconds:.0f} s at ~{rate}/s")
        purged: dict[tuple[str, int], int] = {}
        last_report = 0.0
        caught_up_since: float | None = None
        deadline = time.monotonic() + seconds + 120
        while True:
            for query in (stage1, stage2):
                if query.exception() is not None:
                    raise RuntimeError(f"{query.name} failed: {query.exception()}")
            if generator.error is not None:
                raise RuntimeError(f"the generator failed: {generator.error}")
            done2 = consumed(stage2)
            wanted = {tp: o for tp, o in done2.items() if o > purged.get(tp, 0)}
            if wanted:  # the repartition topic's consumed prefix is no longer needed: purge it
                admin.delete_records(wanted)
                purged.update(wanted)
            now = time.monotonic()
            if now - last_report >= 2.0:
                last_report = now
                say(f"events {generator.produced:>7,} | stage 1: {rows_in(stage1):>7,} read -> {BY_USER} | "
                    f"stage 2: {rows_in(stage2):>6,} read -> {PURCHASES} | {BY_USER} purged below "
                    f"{sum(purged.values()):,}")
            if not generator.is_alive():
                ends = {(tp.topic, tp.partition): o.offset for tp, o in admin.list_offsets(
                    {(t, p): "latest" for t in (EVENTS, BY_USER) for p in range(2)},
                    isolation="read_committed").items()}
                done1 = consumed(stage1)
                caught_up = all(done1.get((EVENTS, p), 0) >= ends[(EVENTS, p)] for p in range(2)) and all(
                    done2.get((BY_USER, p), 0) >= ends[(BY_USER, p)] for p in range(2))
                if caught_up:
                    caught_up_since = caught_up_since or now
                    if now - caught_up_since > 3.0:  # and stayed so: nothing more is on its way
                        break
                else:
                    caught_up_since = None
            if now > deadline:
                raise RuntimeError("the pipeline did not catch up with the generator in time")
            time.sleep(0.25)
        stage1.stop()
        stage2.stop()
        spark.stop()
        admin.close()
        say("both stages caught up and stopped; verifying the output with read_committed")
        expected = expected_output(generator.produced)
        verdict = judge(read_committed(broker.bootstrap, PURCHASES), expected)
        print()
        print(f"  events generated      {generator.produced:>9,}")
        print(f"  purchases expected    {verdict.expected:>9,}")
        print(f"  purchases read        {verdict.read:>9,}   (topic {PURCHASES!r}, read_committed)")
        print(f"  duplicates            {verdict.duplicates:>9,}")
        print(f"  losses                {verdict.losses:>9,}")
        print(f"  unexpected records    {verdict.unexpected:>9,}")
        print(f"  {BY_USER} offsets deleted by DeleteRecords (records and transaction markers): "
              f"{sum(purged.values()):,}")
        print()
        print("EXACTLY ONCE: yes" if verdict.exactly_once else "EXACTLY ONCE: NO")
        return 0 if verdict.exactly_once else 1
    finally:
        if broker.alive():
            broker.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the generator writes (default 30)")
    parser.add_argument("--rate", type=int, default=2000, help="events per second (default 2000)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (broker data, logs)")
    args = parser.parse_args(argv)
    return run(args.seconds, args.rate, args.keep)


if __name__ == "__main__":
    sys.exit(main())
