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

import pytest

from tests.spark.eos_faults import (
    broker_down_during_a_batch,
    driver_sigkill_in_the_middle_of_a_batch,
    retry_session,
    task_failure_half_way,
    transaction_timeout_in_a_slow_task,
)
from tests.spark.session import stop_session


@pytest.fixture(scope="module")
def retry_spark(tmp_path_factory):
    """`local[2,3]`: a failed task is retried up to twice, as on a cluster (local mode retries nothing)."""
    session = retry_session(tmp_path_factory.mktemp("spark"))
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


def test_task_failure_half_way_is_retried_without_duplicates(retry_spark, module_broker, topic_name, tmp_path):
    task_failure_half_way(retry_spark, module_broker.bootstrap, f"{topic_name}-in", f"{topic_name}-out", tmp_path)


def test_transaction_timeout_in_a_slow_task(retry_spark, reaper_broker, topic_name, tmp_path):
    """One task sleeps longer than transaction.timeout.ms with its transaction open: the coordinator aborts it,
    the task is retried; the driver's late commit of the other partition fails and the query is restarted."""
    transaction_timeout_in_a_slow_task(retry_spark, reaper_broker.bootstrap, f"{topic_name}-in",
                                       f"{topic_name}-out", tmp_path, timeout_ms=1500, slow_s=4.0)


def test_broker_sigkill_during_a_batch(retry_spark, broker_factory, topic_name, tmp_path):
    broker = broker_factory()
    broker_down_during_a_batch(retry_spark, broker.bootstrap, f"{topic_name}-in", f"{topic_name}-out", tmp_path,
                               kill=broker.kill, restart=broker.restart)


@pytest.mark.slow  # about 54 s; the broker SIGKILL, task failure and timeout cases stay in make test
def test_driver_sigkill_in_the_middle_of_a_batch(module_broker, topic_name, tmp_path):
    driver_sigkill_in_the_middle_of_a_batch(module_broker.bootstrap, f"{topic_name}-in", f"{topic_name}-out",
                                            tmp_path)
