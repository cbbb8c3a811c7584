"""Exactly-once through the oncelog sink under faults: each test breaks a running streaming query and then
checks the output topic under read_committed against the input: every record once, none lost.

- a task fails half-way through its partition, after its transaction already holds records (`local[2,3]`:
  Spark retries the task);
- a task's transaction outlives `transaction.timeout.ms` because the task is slow; the coordinator aborts it,
  the task fails and is retried; the batch's other transaction times out waiting for the driver's commit, the
  query stops and is restarted from its checkpoint;
- the broker is SIGKILLed in the middle of a batch and restarted; the query is restarted from its checkpoint
  if it gave up;
- the driver is SIGKILLed in the middle of a batch (the query runs in a subprocess); a new driver restarts the
  query from the checkpoint.

Each fault is shown to have happened (a flag file written at the moment of the fault, and aborted records in
the log that read_committed hides), so a test cannot pass because its fault never struck.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oncelog.spark import register
from tests.integration.helpers import create_topic
from tests.spark.eos_check import assert_exactly_once, nothing_pending, read_values, verdict, write_input
from tests.spark.session import start_session, stop_session

# Rows reach the sink in Arrow batches of this size, so a task that fails half-way has already produced some.
ARROW_BATCH = 25
PAD = 2000  # bytes per value: the rows before a fault fill Spark's 64 KiB JVM <-> Python buffers
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def retry_spark(tmp_path_factory):
    """`local[2,3]`: a failed task is retried up to twice, as on a cluster (local mode retries nothing)."""
    session = start_session(tmp_path_factory.mktemp("spark"), master="local[2,3]",
                            conf={"spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_BATCH)})
    register(session)
    yield session
    stop_session(session)


@pytest.fixture(scope="module")
def reaper_broker(tmp_path_factory):
    """A broker whose transaction-timeout reaper runs every 200 ms (Kafka's default is 10 s)."""
    from tests.support.broker import BrokerProcess

    proc = BrokerProcess(tmp_path_factory.mktemp("broker") / "data",
                         {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 200}).start()
    yield proc
    if proc.alive():
        proc.stop()


def fault_udf(flag_dir: Path, trigger: bytes, action: str, seconds: float):
    """A UDF passing values through; on the first attempt of the task that meets `trigger` it waits
    `seconds` (so the rows before it are produced and sent) and then raises (`fail`) or goes on (`slow`)."""
    from pyspark.sql.functions import udf

    flag = str(flag_dir)

    def passthrough(value: bytes) -> bytes:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if value.startswith(trigger + b"|") and ctx.attemptNumber() == 0:
            time.sleep(seconds)
            with open(os.path.join(flag, f"{action}-p{ctx.partitionId()}-a{ctx.attemptNumber()}"), "w"):
                pass
            if action == "fail":
                raise RuntimeError(f"injected failure at {value!r}")
        return value

    return udf(passthrough, "binary")


def run_query(spark, bootstrap: str, source: str, sink: str, checkpoint: Path, transform=None,
              per_trigger: int = 200, wait: bool = True, **sink_options: str):
    src = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", source).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", str(per_trigger)).load())
    rows = src.select("key", (transform(src.value) if transform else src.value).alias("value"))
    writer = (rows.writeStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
              .option("topic", sink).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True))
    for key, value in sink_options.items():
        writer = writer.option(key, value)
    query = writer.start()
    if wait:
        assert query.awaitTermination(300), "the query did not finish in 300 s"
        assert query.exception() is None, query.exception()
    return query


def finished(query, timeout: float = 300) -> None:
    """Wait for the query to end, successfully or not (`query.exception()` tells which)."""
    from pyspark.errors import StreamingQueryException

    try:
        assert query.awaitTermination(timeout), f"the query did not finish in {timeout} s"
    except StreamingQueryException:
        pass


def aborted_records_exist(bootstrap: str, topic: str, partitions: int) -> bool:
    from tests.integration.helpers import ck_consume

    everything = ck_consume(bootstrap, topic, dict.fromkeys(range(partitions), 0),
                            **{"isolation.level": "read_uncommitted"})
    return len(everything) > len(read_values(bootstrap, topic, partitions))


def test_task_failure_half_way_is_retried_without_duplicates(retry_spark, module_broker, topic_name, tmp_path):
    bootstrap = module_broker.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    data = write_input(bootstrap, source, 800, pad=PAD)
    create_topic(bootstrap, sink, partitions=2)
    flags = tmp_path / "flags"
    flags.mkdir()
    run_query(retry_spark, bootstrap, source, sink, tmp_path / "ckpt",
              fault_udf(flags, b"v301", "fail", 1.5), per_trigger=400)
    assert [f.name for f in flags.iterdir()] == ["fail-p1-a0"], "the injected failure did not happen"
    assert aborted_records_exist(bootstrap, sink, 2), "the failed attempt had written nothing: no fault tested"
    assert_exactly_once(bootstrap, sink, 2, [v for _, v in data])
    assert nothing_pending(bootstrap, sink, 2)


def test_transaction_timeout_in_a_slow_task(retry_spark, reaper_broker, topic_name, tmp_path):
    """One task sleeps longer than transaction.timeout.ms with its transaction open. The coordinator aborts it
    (and bumps the epoch): the task's next send fails, and Spark retries the task. The other partition's
    transaction, prepared early, also outlives the timeout while the batch waits for the slow task, so the
    driver's commit fails and the query stops; restarted from its checkpoint it replays the batch."""
    bootstrap = reaper_broker.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    data = write_input(bootstrap, source, 600, pad=PAD)
    create_topic(bootstrap, sink, partitions=2)
    flags = tmp_path / "flags"
    flags.mkdir()
    checkpoint = tmp_path / "ckpt"
    query = run_query(retry_spark, bootstrap, source, sink, checkpoint, fault_udf(flags, b"v201", "slow", 4.0),
                      per_trigger=300, wait=False, **{"transaction.timeout.ms": "1500"})
    finished(query)
    assert [f.name for f in flags.iterdir()] == ["slow-p1-a0"]
    assert aborted_records_exist(bootstrap, sink, 2), "no transaction was aborted: the timeout did not strike"
    if query.exception() is not None:
        assert "could not commit" in str(query.exception()), query.exception()
        # Partitions whose commit went through before the failure stay visible (visibility is per partition);
        # the restart completes the batch and must not write them again.
        partial = verdict(read_values(bootstrap, sink, 2), [v for _, v in data])
        assert not partial.duplicates and not partial.unexpected, partial
        # Restarted with a timeout that covers a batch (1.5 s does not, on a busy machine).
        run_query(retry_spark, bootstrap, source, sink, checkpoint, per_trigger=300)
    assert_exactly_once(bootstrap, sink, 2, [v for _, v in data])
    assert nothing_pending(bootstrap, sink, 2)


def test_broker_sigkill_during_a_batch(retry_spark, broker_factory, topic_name, tmp_path):
    broker = broker_factory()
    bootstrap = broker.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    data = write_input(bootstrap, source, 900, pad=PAD)
    create_topic(bootstrap, sink, partitions=2)
    flags = tmp_path / "flags"
    flags.mkdir()
    checkpoint = tmp_path / "ckpt"
    # Batch 1 (offsets 150-299 of each partition) stalls for 6 s half-way: the broker dies meanwhile.
    query = run_query(retry_spark, bootstrap, source, sink, checkpoint, fault_udf(flags, b"v401", "slow", 6.0),
                      per_trigger=300, wait=False)
    deadline = time.monotonic() + 120
    while not (checkpoint / "commits" / "0").exists():
        assert time.monotonic() < deadline, "batch 0 never committed"
        assert query.exception() is None, query.exception()
        time.sleep(0.2)
    time.sleep(2.0)
    broker.kill()
    time.sleep(1.0)
    broker.restart()
    finished(query)
    if query.exception() is not None:  # the query gave up while the broker was away: restart it
        run_query(retry_spark, bootstrap, source, sink, checkpoint, per_trigger=300)
    assert (flags / "slow-p1-a0").exists()
    assert_exactly_once(bootstrap, sink, 2, [v for _, v in data])
    assert nothing_pending(bootstrap, sink, 2)


def start_driver(bootstrap: str, source: str, sink: str, checkpoint: Path, flags: Path, slow: str,
                 log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.eos_driver", "--bootstrap", bootstrap, "--source", source,
             "--sink", sink, "--checkpoint", str(checkpoint), "--flags", str(flags), "--slow", slow,
             "--per-trigger", "300"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def test_driver_sigkill_in_the_middle_of_a_batch(module_broker, topic_name, tmp_path):
    """kill -9 of the Python driver while batch 1's tasks hold open transactions; a new driver restarts the
    query from the checkpoint: batch 1 is replayed, the open transactions are fenced, nothing is doubled."""
    bootstrap = module_broker.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    data = write_input(bootstrap, source, 900, pad=PAD)
    create_topic(bootstrap, sink, partitions=2)
    flags = tmp_path / "flags"
    flags.mkdir()
    checkpoint = tmp_path / "ckpt"
    log = tmp_path / "driver.log"
    driver = start_driver(bootstrap, source, sink, checkpoint, flags, "v401", log)
    try:
        deadline = time.monotonic() + 180
        while not (flags / "sleeping").exists():
            assert driver.poll() is None, f"the driver exited early:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"batch 1 never reached the slow row:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        time.sleep(5.0)  # the rows before the slow one (and partition 0 of the batch) reach the sink
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        _kill_group(driver)
    assert (checkpoint / "commits" / "0").exists() and not (checkpoint / "commits" / "1").exists()
    assert aborted_records_exist(bootstrap, sink, 2) or not nothing_pending(bootstrap, sink, 2), \
        "batch 1 had written nothing when the driver died: no fault tested"

    again = start_driver(bootstrap, source, sink, checkpoint, flags, "", log)
    try:
        assert again.wait(300) == 0, f"the restarted driver failed:\n{log.read_text()[-3000:]}"
    finally:
        _kill_group(again)
    assert_exactly_once(bootstrap, sink, 2, [v for _, v in data])
    assert nothing_pending(bootstrap, sink, 2)


def _kill_group(proc: subprocess.Popen) -> None:
    """The driver's JVM and Python workers exit when it does; whatever is left of its session goes too."""
    time.sleep(1.0)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if proc.poll() is None:
        proc.wait(10)
