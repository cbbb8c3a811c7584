"""What the exactly-once fault tests share, against oncelog's broker (tests/spark/test_eos_faults.py) and against
Apache Kafka (tests/kafka/test_spark_on_kafka.py): a SparkSession that retries tasks, a UDF that fails or
stalls one task at a chosen row, the streaming query source topic -> oncelog sink, and a driver in a process of
its own (tests/spark/eos_driver.py) that a test can SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.integration.helpers import create_topic
from tests.spark.eos_check import assert_exactly_once, nothing_pending, read_values, verdict, write_input

# Rows reach the sink in Arrow batches of this size, so a task that fails half-way has already produced some.
ARROW_BATCH = 25
PAD = 2000  # bytes per value: the rows before a fault fill Spark's 64 KiB JVM <-> Python buffers
REPO = Path(__file__).resolve().parents[2]
QUERY_TIMEOUT_S = 300.0
SINK_WAIT_S = 60.0  # fault_udf: how long a fault waits for the rows before it to reach the sink


def retry_session(tmp: Path) -> Any:
    """`local[2,3]`: a failed task is retried up to twice, as on a cluster (local mode retries nothing); rows
    reach Python writers in Arrow batches of ARROW_BATCH."""
    from oncelog.spark import register
    from tests.spark.session import start_session

    session = start_session(tmp, master="local[2,3]",
                            conf={"spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_BATCH)})
    register(session)
    return session


def fault_udf(flag_dir: Path, trigger: bytes, action: str, seconds: float, announce: bool = False,
              written: tuple[str, str, int] | None = None):
    """A UDF passing values through; on the first attempt of the task that meets `trigger` it waits
    `seconds` (so the rows before it are produced and sent) and then raises (`fail`) or goes on (`slow`).

    With `written` = (bootstrap, sink topic, partitions), the wait starts only once the sink's log holds
    records (its high watermark moved), at most SINK_WAIT_S: on a busy machine the rows before the trigger may
    not have reached the broker within `seconds`, and a fault that strikes a transaction holding nothing tests
    nothing. The flag `<action>-p<partition>-a<attempt>` is written when the wait is over; with `announce`, a flag
    `<action>-p<partition>-a<attempt>-waiting` also marks its start (a test times its fault by it)."""
    from pyspark.sql.functions import udf

    flag = str(flag_dir)
    sink_wait_s = SINK_WAIT_S

    def sink_holds_records() -> bool:
        from confluent_kafka import Consumer, TopicPartition

        assert written is not None
        bootstrap, topic, partitions = written
        # read_uncommitted: the watermark is then the high watermark; read_committed (librdkafka's default)
        # would give the last stable offset, which the open transaction holding these rows keeps at 0.
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fault-udf-probe",
                             "isolation.level": "read_uncommitted"})
        try:
            return any(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] > 0
                       for p in range(partitions))
        except Exception:  # noqa: BLE001 - a probe that fails is asked again
            return False
        finally:
            consumer.close()

    def passthrough(value):  # no type hints: PySpark would try (and fail) to infer a UDF kind from them
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if value.startswith(trigger + b"|") and ctx.attemptNumber() == 0:
            name = f"{action}-p{ctx.partitionId()}-a{ctx.attemptNumber()}"
            if announce:
                with open(os.path.join(flag, f"{name}-waiting"), "w"):
                    pass
            if written is not None:
                deadline = time.monotonic() + sink_wait_s
                while not sink_holds_records() and time.monotonic() < deadline:
                    time.sleep(0.2)
            time.sleep(seconds)
            with open(os.path.join(flag, name), "w"):
                pass
            if action == "fail":
                raise RuntimeError(f"injected failure at {value!r}")
        return value

    return udf(passthrough, "binary")


def run_query(spark, bootstrap: str, source: str, sink: str, checkpoint: Path, transform=None,
              per_trigger: int = 200, wait: bool = True, client: Mapping[str, str] | None = None,
              **sink_options: str):
    """source -> (transform) -> oncelog sink, Trigger.AvailableNow from `checkpoint`. `client`: options for
    both the source and the sink (`kafka.security.protocol`, ...); `sink_options`: the sink's alone."""
    reader = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", source).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(per_trigger)))
    for key, value in (client or {}).items():
        reader = reader.option(key, value)
    src = reader.load()
    rows = src.select("key", (transform(src.value) if transform else src.value).alias("value"))
    writer = (rows.writeStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
              .option("topic", sink).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True))
    for key, value in {**(client or {}), **sink_options}.items():
        writer = writer.option(key, value)
    query = writer.start()
    if wait:
        assert query.awaitTermination(QUERY_TIMEOUT_S), f"the query did not finish in {QUERY_TIMEOUT_S:.0f} s"
        assert query.exception() is None, query.exception()
    return query


def finished(query, timeout: float = QUERY_TIMEOUT_S) -> None:
    """Wait for the query to end, successfully or not (`query.exception()` tells which)."""
    from pyspark.errors import StreamingQueryException

    try:
        assert query.awaitTermination(timeout), f"the query did not finish in {timeout} s"
    except StreamingQueryException:
        pass


def aborted_records_exist(bootstrap: str, topic: str, partitions: int) -> bool:
    """Whether the topic holds records read_committed does not show (of aborted or still open transactions)."""
    from tests.integration.helpers import ck_consume

    everything = ck_consume(bootstrap, topic, dict.fromkeys(range(partitions), 0),
                            **{"isolation.level": "read_uncommitted"})
    return len(everything) > len(read_values(bootstrap, topic, partitions))


def wait_for(predicate, timeout: float, what: str, query=None, interval: float = 0.2) -> None:
    """Until `predicate()` holds; fails after `timeout` s, or as soon as `query` has failed."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if query is not None:
            assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(interval)


def start_driver(bootstrap: str, source: str, sink: str, checkpoint: Path, flags: Path, slow: str,
                 log: Path) -> subprocess.Popen:
    """tests/spark/eos_driver.py in a process group of its own (so its JVM and workers can be cleaned up)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.eos_driver", "--bootstrap", bootstrap, "--source", source,
             "--sink", sink, "--checkpoint", str(checkpoint), "--flags", str(flags), "--slow", slow,
             "--per-trigger", "300"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    """The driver's JVM and Python workers exit when it does; whatever is left of its session goes too."""
    time.sleep(1.0)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if proc.poll() is None:
        proc.wait(10)


# -- the faults, each a scenario a test runs against one kind of broker ---------------------------------------


def task_failure_half_way(spark, bootstrap: str, source: str, sink: str, tmp: Path) -> None:
    """A task fails half-way through its partition, after its transaction already holds records; Spark retries
    it (`spark` must retry: retry_session)."""
    data = write_input(bootstrap, source, 800, pad=PAD)
    create_topic(bootstrap, sink, partitions=2)
    flags = tmp / "flags"
    flags.mkdir()
    run_query(spark, bootstrap, source, sink, tmp / "ckpt", fault_udf(flags, b"v301", "fail", 1.5, written=(bootstrap, sink, 2)), per_trigger=400)
    assert [f.name for f in flags.iterdir()] == ["fail-p1-a0"], "the injected failure did not happen"
    assert aborted_records_exist(bootstrap, sink, 2), "the failed attempt had written nothing: no fault tested"
    assert_exactly_once(bootstrap, sink, 2, [v for _, v in data])
    assert nothing_pending(bootstrap, sink, 2)


def transaction_timeout_in_a_slow_task(spark, bootstrap: str, source: str, sink: str, tmp: Path,
                                       timeout_ms: int, slow_s: float) -> None:
    """One task sleeps `slow_s`, longer than transaction.timeout.ms (`timeout_ms`), with its transaction open.
    The coordinator aborts it (and bumps the epoch): the task's next send fails, and Spark retries the task.
    The other partition's transaction, prepared early, also outlives the timeout while the batch waits for the
    slow task, so the driver's commit fails and the query stops; restarted from its checkpoint it replays the
    batch. The broker's timeout reaper must run well within `slow_s - timeout_ms`."""
    data = write_input(bootstrap, source, 600, pad=PAD)
    create_topic(bootstrap, sink, partitions=2)
    flags = tmp / "flags"
    flags.mkdir()
    checkpoint = tmp / "ckpt"
    query = run_query(spark, bootstrap, source, sink, checkpoint, fault_udf(flags, b"v201", "slow", slow_s,
                                                                                 written=(bootstrap, sink, 2)),
                      per_trigger=300, wait=False, **{"transaction.timeout.ms": str(timeout_ms)})
    finished(query)
    assert [f.name for f in flags.iterdir()] == ["slow-p1-a0"]
    assert aborted_records_exist(bootstrap, sink, 2), "no transaction was aborted: the timeout did not strike"
    if query.exception() is not None:
        assert "could not commit" in str(query.exception()), query.exception()
        # Partitions whose commit went through before the failure stay visible (visibility is per partition);
        # the restart completes the batch and must not write them again.
        partial = verdict(read_values(bootstrap, sink, 2), [v for _, v in data])
        assert not partial.duplicates and not partial.unexpected, partial
        # Restarted with the default timeout, which covers a batch (a short one may not, on a busy machine).
        run_query(spark, bootstrap, source, sink, checkpoint, per_trigger=300)
    assert_exactly_once(bootstrap, sink, 2, [v for _, v in data])
    assert nothing_pending(bootstrap, sink, 2)


def broker_down_during_a_batch(spark, bootstrap: str, source: str, sink: str, tmp: Path, kill, restart,
                               replication_factor: int = 1, slow_s: float = 6.0) -> None:
    """`kill()` strikes while batch 1 holds open transactions with records in them (one task stalls `slow_s`
    half-way through its partition, the other's transaction waits prepared for the driver's commit); then
    `restart()`. The query is restarted from its checkpoint if it gave up meanwhile."""
    data = write_input(bootstrap, source, 900, pad=PAD, replication_factor=replication_factor)
    create_topic(bootstrap, sink, partitions=2, replication_factor=replication_factor)
    flags = tmp / "flags"
    flags.mkdir()
    checkpoint = tmp / "ckpt"
    # Batch 1 (offsets 150-299 of each partition) stalls half-way: the broker dies meanwhile.
    query = run_query(spark, bootstrap, source, sink, checkpoint,
                      fault_udf(flags, b"v401", "slow", slow_s, announce=True), per_trigger=300, wait=False)
    wait_for(lambda: (flags / "slow-p1-a0-waiting").exists(), QUERY_TIMEOUT_S, "batch 1 reaching the slow row",
             query)
    wait_for(lambda: not nothing_pending(bootstrap, sink, 2), 60, "batch 1's records reaching the sink", query)
    assert (checkpoint / "commits" / "0").exists() and not (checkpoint / "commits" / "1").exists(), \
        "the fault must strike in the middle of batch 1"
    assert not (flags / "slow-p1-a0").exists(), "the slow task finished before the fault: no fault tested"
    kill()
    restart()
    finished(query)
    if query.exception() is not None:  # the query gave up while the broker was away: restart it
        run_query(spark, bootstrap, source, sink, checkpoint, per_trigger=300)
    assert (flags / "slow-p1-a0").exists()
    assert_exactly_once(bootstrap, sink, 2, [v for _, v in data])
    assert nothing_pending(bootstrap, sink, 2)


def driver_sigkill_in_the_middle_of_a_batch(bootstrap: str, source: str, sink: str, tmp: Path) -> None:
    """kill -9 of the Python driver while batch 1's tasks hold open transactions; a new driver restarts the
    query from the checkpoint: batch 1 is replayed, the open transactions are fenced, nothing is doubled."""
    data = write_input(bootstrap, source, 900, pad=PAD)
    create_topic(bootstrap, sink, partitions=2)
    flags = tmp / "flags"
    flags.mkdir()
    checkpoint = tmp / "ckpt"
    log = tmp / "driver.log"
    driver = start_driver(bootstrap, source, sink, checkpoint, flags, "v401", log)
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while not (flags / "sleeping").exists() or nothing_pending(bootstrap, sink, 2):
            assert driver.poll() is None, f"the driver exited early:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, \
                f"batch 1 never reached the slow row with records in the sink:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        driver.send_signal(signal.SIGKILL)
        assert driver.wait(30) == -signal.SIGKILL, "the driver was not killed by the SIGKILL"
    finally:
        kill_group(driver)
    assert (checkpoint / "commits" / "0").exists() and not (checkpoint / "commits" / "1").exists()
    assert aborted_records_exist(bootstrap, sink, 2) or not nothing_pending(bootstrap, sink, 2), \
        "batch 1 had written nothing when the driver died: no fault tested"

    again = start_driver(bootstrap, source, sink, checkpoint, flags, "", log)
    try:
        assert again.wait(QUERY_TIMEOUT_S) == 0, f"the restarted driver failed:\n{log.read_text()[-3000:]}"
    finally:
        kill_group(again)
    assert_exactly_once(bootstrap, sink, 2, [v for _, v in data])
    assert nothing_pending(bootstrap, sink, 2)
