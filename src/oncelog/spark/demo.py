"""`make demo`: an exactly-once PySpark pipeline on one machine, from an empty directory to a verdict.

    events ──(stage 1: parse JSON, keep purchases, re-key by user)──▶ by-user ──(stage 2: format)──▶ purchases

1. An embedded oncelog broker starts on a free loopback port, with data in a temporary directory; or, with
   `--bootstrap HOST:PORT`, the demo uses a Kafka cluster that is already running (Apache Kafka or oncelog),
   with the security settings of `--command-config` / `-X` (KEY=VALUE or a client.properties file, as the
   `oncelog` CLI takes them), given to its own clients and, `kafka.`-prefixed, to Spark's. There it creates its
   three topics under names unique to the run, with the cluster's default replication factor, deletes them
   when the verdict is exactly once (unless `--keep`), and never stops or restarts a broker.
2. A generator thread writes shop events (JSON, keyed by session) to `events` for a fixed time.
3. Two Structured Streaming queries run in one SparkSession (`local[2]`), both reading with the `oncelog`
   source (read_committed) and writing with the exactly-once `oncelog` sink. `by-user` is a repartition
   topic, as Kafka Streams makes one: after each stage-2 batch the demo deletes what stage 2 has consumed
   (DeleteRecords), so stage 1's producers keep writing to partitions whose earlier records, and with them
   the records of their producer ids, are gone: the case KIP-360 was written for.
4. When the generator has stopped and both stages have caught up, the queries stop and a verifier reads
   `purchases` with read_committed and compares it with what the events imply: counts, duplicates, losses.

With `--cluster` (`make demo CLUSTER=1`) the demo starts a coordination service and three brokers of its own
instead of one (replication factor 3, min.insync.replicas 2, the transaction and offsets logs too), and halfway
through the generator's run SIGKILLs the broker that leads the repartition topic's first partition (the one
both stages and DeleteRecords work on), then restarts it `--restart-after` seconds later: the sink's
transactions, the source's reads and the purges go on through the failover, and the verdict is still exactly
once. `--kill-at -1` runs the cluster without the kill.

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
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from oncelog.client.admin import Admin
from oncelog.client.config import ROLES, ClientConfig
from oncelog.embedded import BrokerProcess, ClusterProcess
from oncelog.spark.demo_data import Generator, expected_output, judge, read_committed

EVENTS, BY_USER, PURCHASES = "events", "by-user", "purchases"
# The demo's own cluster (--cluster): every log replicated three ways, acks=all durable on two.
CLUSTER_SETTINGS = {
    "default.replication.factor": 3, "min.insync.replicas": 2, "num.partitions": 2,
    "offsets.topic.replication.factor": 3, "offsets.topic.num.partitions": 3,
    "transaction.state.log.replication.factor": 3, "transaction.state.log.min.isr": 2,
    "transaction.state.log.num.partitions": 3, "group.initial.rebalance.delay.ms": 0,
}
CLUSTER_START_S = 180.0
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


class Topics(NamedTuple):
    events: str
    by_user: str
    purchases: str

    @classmethod
    def for_run(cls, unique: bool) -> Topics:
        """The fixed names on the demo's own broker; names of this run only on a cluster others use too."""
        if not unique:
            return cls(EVENTS, BY_USER, PURCHASES)
        run = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        return cls(*(f"oncelog-demo-{run}-{name}" for name in (EVENTS, BY_USER, PURCHASES)))


def for_role(settings: Mapping[str, str], role: str) -> dict[str, str]:
    """The settings a `role` client takes: one that only another role takes (linger.ms for the consumer) is left
    out; security settings go to every client; a setting no client knows is kept, so the client names it."""

    def takes(some_role: str, key: str, value: str) -> bool:
        try:
            ClientConfig({"bootstrap.servers": "localhost:9092", key: value}, some_role)
        except ValueError:
            return False
        return True

    return {k: v for k, v in settings.items()
            if takes(role, k, v) or not any(takes(other, k, v) for other in ROLES if other != role)}


def spark_options(settings: Mapping[str, str], role: str) -> dict[str, str]:
    """Client settings as Spark options: `kafka.`-prefixed, as Spark's own Kafka source and sink take them."""
    return {f"kafka.{k}": v for k, v in for_role(settings, role).items()}


def start_stages(spark: Any, bootstrap: str, work: Path, topics: Topics | None = None,
                 settings: Mapping[str, str] | None = None) -> tuple[Any, Any]:
    topics = topics or Topics.for_run(unique=False)
    source_options = spark_options(settings or {}, "consumer")
    sink_options = spark_options(settings or {}, "producer")

    def read(topic: str) -> Any:
        reader = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", topic).option("startingOffsets", "earliest"))
        return reader.options(**source_options).load()

    def write(df: Any, topic: str, name: str) -> Any:
        return (df.writeStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
                .option("topic", topic).option("checkpointLocation", str(work / "checkpoints" / name))
                .options(**sink_options).trigger(processingTime="1 second").queryName(name).start())

    events = read(topics.events).selectExpr(
        f"from_json(CAST(value AS STRING), '{EVENT_SCHEMA}') AS e").select("e.*")
    purchases = events.where("action = 'purchase'").selectExpr(
        "user AS key", "to_json(named_struct('id', id, 'user', user, 'cents', cents)) AS value")
    stage1 = write(purchases, topics.by_user, "stage1-rekey")
    by_user = read(topics.by_user).selectExpr(
        f"from_json(CAST(value AS STRING), '{EVENT_SCHEMA}') AS e").select("e.*")
    formatted = by_user.selectExpr("user AS key", "concat_ws(':', user, CAST(id AS STRING), CAST(cents AS STRING))"
                                   " AS value")
    stage2 = write(formatted, topics.purchases, "stage2-format")
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


class BrokerKill:
    """--cluster: SIGKILL the leader of the repartition topic's first partition at `at` seconds into the
    generator's run, restart it `restart_after` seconds later."""

    def __init__(self, cluster: ClusterProcess, topic: str, at: float, restart_after: float) -> None:
        self.cluster, self.topic, self.at, self.restart_after = cluster, topic, at, restart_after
        self.killed: int | None = None
        self.killed_at: float | None = None
        self.restarted = False

    def tick(self, since_start: float, say: Any) -> None:
        if self.killed is None and since_start >= self.at:
            md = self.cluster.metadata(topics=[self.topic])
            leader = next(p.leader_id for p in md.topics[0].partitions if p.partition_index == 0)
            self.cluster.kill(leader)
            self.killed, self.killed_at = leader, time.monotonic()
            say(f"SIGKILL broker {leader} (leader of {self.topic}-0); restarting it in {self.restart_after:.0f} s")
        elif self.killed is not None and not self.restarted and self.killed_at is not None \
                and time.monotonic() - self.killed_at >= self.restart_after:
            self.cluster.restart(self.killed)
            self.restarted = True
            say(f"broker {self.killed} restarted")


def run(seconds: float, rate: int, keep: bool, bootstrap: str | None = None,
        settings: Mapping[str, str] | None = None, cluster: bool = False, kill_at: float | None = None,
        restart_after: float = 10.0) -> int:
    """The demo on its own broker, on its own 3-broker cluster (`cluster`, with a broker SIGKILLed at `kill_at`
    seconds into the generation, default halfway; negative: none), or (`bootstrap`) on a running cluster with
    client `settings`."""
    work = Path(tempfile.mkdtemp(prefix="oncelog-demo-"))
    settings = dict(settings or {})
    own: BrokerProcess | ClusterProcess | None = None
    if bootstrap is None:
        own = (ClusterProcess(work / "cluster", 3, CLUSTER_SETTINGS) if cluster
               else BrokerProcess(work / "broker-data", {"num.partitions": 2}))
    topics = Topics.for_run(unique=own is None)
    kill: BrokerKill | None = None
    admin_settings, consumer_settings = for_role(settings, "admin"), for_role(settings, "consumer")
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:5.1f}s] {text}", flush=True)

    admin = None
    verdict = None
    try:
        if isinstance(own, ClusterProcess):
            say("starting a coordination service and 3 brokers")
            own.start(CLUSTER_START_S)
            bootstrap = own.bootstrap
            say(f"cluster ready: bootstrap {bootstrap} (data and logs in {work / 'cluster'})")
            at = seconds / 2 if kill_at is None else kill_at
            if at >= 0:
                kill = BrokerKill(own, topics.by_user, at, restart_after)
        elif own is not None:
            own.start()
            bootstrap = own.bootstrap
            say(f"broker listening on {bootstrap} (data in {work})")
        else:
            say(f"using the cluster at {bootstrap} (security.protocol "
                f"{settings.get('security.protocol', 'PLAINTEXT')}); topics {', '.join(topics)}")
        assert bootstrap is not None
        admin = Admin({**admin_settings, "bootstrap.servers": bootstrap})
        for topic in topics:
            admin.create_topic(topic, 2)  # replication factor -1: the cluster's default
        say("starting Spark (local[2])")
        spark = spark_session(work)
        stage1, stage2 = start_stages(spark, bootstrap, work, topics, settings)
        say(f"stage 1 (parse, keep purchases, re-key by user -> {topics.by_user}) and stage 2 (format -> "
            f"{topics.purchases}) started")
        waiting = time.monotonic()
        while stage1.lastProgress is None or stage2.lastProgress is None:  # first (empty) batches: workers up
            for query in (stage1, stage2):
                if query.exception() is not None:
                    raise RuntimeError(f"{query.name} failed: {query.exception()}")
            if time.monotonic() - waiting >= 5.0:
                waiting = time.monotonic()
                say("waiting for the first (empty) micro-batches: Spark starts its Python workers")
            time.sleep(0.2)
        generator = Generator(bootstrap, topics.events, rate, seconds, for_role(settings, "producer"))
        generator.start()
        generating = time.monotonic()
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
            if kill is not None:
                kill.tick(time.monotonic() - generating, say)
            done2 = consumed(stage2)
            wanted = {tp: o for tp, o in done2.items() if o > purged.get(tp, 0)}
            if wanted:  # the repartition topic's consumed prefix is no longer needed: purge it
                try:
                    admin.delete_records(wanted)
                    purged.update(wanted)
                except Exception as exc:  # noqa: BLE001 - a leader lost meanwhile: purged on a later round
                    if kill is None:
                        raise
                    say(f"DeleteRecords postponed: {exc}")
            now = time.monotonic()
            if now - last_report >= 2.0:
                last_report = now
                say(f"events {generator.produced:>7,} | stage 1: {rows_in(stage1):>7,} read -> {BY_USER} | "
                    f"stage 2: {rows_in(stage2):>6,} read -> {PURCHASES} | {BY_USER} purged below "
                    f"{sum(purged.values()):,}")
            if not generator.is_alive() and (kill is None or kill.restarted):
                ends = {(tp.topic, tp.partition): o.offset for tp, o in admin.list_offsets(
                    {(t, p): "latest" for t in (topics.events, topics.by_user) for p in range(2)},
                    isolation="read_committed").items()}
                done1 = consumed(stage1)
                caught_up = all(done1.get((topics.events, p), 0) >= ends[(topics.events, p)] for p in range(2)) \
                    and all(done2.get((topics.by_user, p), 0) >= ends[(topics.by_user, p)] for p in range(2))
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
        say("both stages caught up and stopped; verifying the output with read_committed")
        expected = expected_output(generator.produced)
        verdict = judge(read_committed(bootstrap, topics.purchases, settings=admin_settings,
                                       consumer_settings=consumer_settings), expected)
        print()
        print(f"  events generated      {generator.produced:>9,}")
        print(f"  purchases expected    {verdict.expected:>9,}")
        print(f"  purchases read        {verdict.read:>9,}   (topic {topics.purchases!r}, read_committed)")
        print(f"  duplicates            {verdict.duplicates:>9,}")
        print(f"  losses                {verdict.losses:>9,}")
        print(f"  unexpected records    {verdict.unexpected:>9,}")
        print(f"  {BY_USER} offsets deleted by DeleteRecords (records and transaction markers): "
              f"{sum(purged.values()):,}")
        if kill is not None and kill.killed is not None:
            print(f"  broker SIGKILLed mid-run  broker {kill.killed}, restarted {restart_after:.0f} s later")
        print()
        print("EXACTLY ONCE: yes" if verdict.exactly_once else "EXACTLY ONCE: NO")
        return 0 if verdict.exactly_once else 1
    finally:
        if admin is not None:
            if own is None and not keep and verdict is not None and verdict.exactly_once:
                try:  # the run's topics on a shared cluster; kept for a look when the verdict is not yes
                    admin.delete_topics(list(topics))
                except Exception as exc:  # the verdict stands; say what is left behind
                    print(f"could not delete the topics {', '.join(topics)}: {exc}", flush=True)
            admin.close()
        if isinstance(own, ClusterProcess):    # only ever the cluster the demo started itself
            own.stop()
            own.kill_all()
        elif own is not None and own.alive():  # only ever the broker the demo started itself
            own.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the generator writes (default 30)")
    parser.add_argument("--rate", type=int, default=2000, help="events per second (default 2000)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (broker data, logs) and, with --bootstrap, the topics")
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="use this running cluster (Apache Kafka or oncelog) instead of starting a broker")
    parser.add_argument("--command-config", "-X", action="append", default=[], metavar="KEY=VALUE|FILE",
                        help="a client setting (Kafka's names: security.protocol, sasl.*, ssl.* ...) or a "
                             "client.properties file, as the oncelog CLI takes it; repeatable; for the demo's "
                             "clients and, kafka.-prefixed, for Spark's source and sink")
    parser.add_argument("--cluster", action="store_true",
                        help="start a coordination service and 3 brokers instead of one, and kill one mid-run")
    parser.add_argument("--kill-at", type=float, default=None, metavar="SECONDS",
                        help="with --cluster: SIGKILL a broker this long into the generation (default: halfway; "
                             "negative: no kill)")
    parser.add_argument("--restart-after", type=float, default=10.0, metavar="SECONDS",
                        help="with --cluster: restart the killed broker this long after the kill (default 10)")
    args = parser.parse_args(argv)
    if args.cluster and args.bootstrap:
        parser.error("--cluster starts a cluster of its own; --bootstrap uses a running one")
    if not args.cluster and (args.kill_at is not None or "--restart-after" in (argv or sys.argv[1:])):
        parser.error("--kill-at and --restart-after go with --cluster (the demo kills only brokers it started)")
    if args.command_config and not args.bootstrap:
        parser.error("--command-config goes with --bootstrap (the demo's own broker is plaintext)")
    from oncelog.cli_commands.common import CommandError, command_config

    try:
        settings = command_config(args.command_config)
    except CommandError as exc:
        parser.error(str(exc))
    return run(args.seconds, args.rate, args.keep, args.bootstrap, settings, args.cluster, args.kill_at,
               args.restart_after)


if __name__ == "__main__":
    sys.exit(main())
