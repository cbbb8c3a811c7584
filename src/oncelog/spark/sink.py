"""The `oncelog` sink: batch writes and an exactly-once streaming write (research/spark.md §7).

What Spark does (measured, research/spark.md §4): a micro-batch N is replayed after a failure with the same
offsets and the same batch id, every partition is written again, a failed task is retried on the same
partition index, `commit(N)` on the driver may run twice and `abort(N)` may follow a successful `commit(N)`.
So the only place that can make a write happen once is the broker, atomically with the data:

- each task of batch N writing Spark partition p uses transactional id `oncelog-sink.<sink id>.p<p>`
  (`txn_ids.py`). `init_transactions()` (InitProducerId) bumps the epoch: it fences every older attempt and
  zombie of that partition and aborts a transaction one of them left open;
- it then reads the partition's batch marker (`markers.py`, a group offset read with require_stable). If the
  marker is already >= N (same query), the batch was committed before a crash: the task writes nothing;
- otherwise it begins a transaction, produces its rows, waits until every one is acknowledged, and adds the
  marker N to the same transaction (`send_offsets_to_transaction`): rows and marker become visible together
  or not at all. The task returns (transactional id, producer id, epoch) **without committing**;
- the driver's `commit(messages, N)` runs only when every task succeeded and sends EndTxn(COMMIT) for each
  prepared transaction (`txn_commit.py`); repeating it is harmless. `abort(messages, N)` ends the prepared
  transactions with EndTxn(ABORT) and fences (InitProducerId) the partitions that reported nothing, so no
  open transaction pins the last stable offset of read_committed consumers until `transaction.timeout.ms`.

Why the commit is on the driver (a deviation from research §7's task-side commit, forced by a measurement):
when the plan upstream of the sink fails half-way through a partition (a UDF raising, say), PySpark 4.2 ends
the Python writer's input as if the partition were complete: `write()` sees a normal end, and only the JVM
knows the task failed. A task that committed at the end of its input would commit half a partition together
with its marker, and the retry would skip the partition: data loss (`tests/spark/test_eos_faults.py`
reproduces the situation). Only the driver learns which tasks really succeeded. Its commit writes no data of
its own: it decides the fate of transactions whose rows and markers are already in the broker, by exact
(producer id, epoch), and every step can be repeated.

Requirements on the user's query (the guarantee rests on them):
- **Determinism per partition.** A replayed batch must give every Spark partition index the same rows as the
  first run: no `rand()`, `uuid()`, `current_timestamp()` or other non-deterministic expression between the
  source and the sink that decides which rows exist or where they go; hash partitioning or a sorted
  round-robin `repartition(n)` only; the same number of partitions at the sink on a replay. A source must
  plan a batch purely from its offsets (the oncelog and Kafka sources do). Values may differ (a timestamp
  column), rows may not move between partitions.
- **Visibility is atomic per Spark partition, not per micro-batch.** The driver commits the partitions'
  transactions concurrently; a read_committed consumer can see partition 0 of batch N a moment before
  partition 1, and after a driver crash between the two the replay completes the batch.
- **Stable sink id.** Keep the checkpoint (the default sink id is the query id stored there) or set
  `sink.id`; a new checkpoint with the same `sink.id` starts afresh (markers carry the query id).
- **Transaction timeout.** A partition's transaction lives from its task's first row until the driver's
  commit, i.e. until the slowest task of the batch is done. `transaction.timeout.ms` (default 60 s) must be
  longer. If it is not, the coordinator aborts the transaction: a task still writing fails and is retried;
  a commit that comes too late fails the query, and its restart from the checkpoint replays the batch.
  Either way nothing is written twice and nothing is lost.
- **Markers are group offsets**, kept for `offsets.retention.minutes` after the last batch that wrote them.
- **No speculative execution** (`spark.speculation`, off by default): a speculative copy of a task fences the
  copy whose transaction the driver is about to commit, so the commit fails and the query must be restarted.
  Nothing is duplicated or lost, but the query stops.

Batch writes (`df.write`) use the same machinery with a sink id made once per write job on the driver and
batch id 0. They need `.mode("append")`: Spark gives Python data sources only Append and Overwrite, and refuses
its default mode (ErrorIfExists) itself, before this code runs; Overwrite is refused here, as Spark's Kafka sink
refuses it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from oncelog.client import Producer
from oncelog.client.errors import KafkaError, KafkaTimeoutError
from oncelog.client.runtime import get_runtime
from oncelog.spark import markers, txn_ids
from oncelog.spark.options import OptionError
from oncelog.spark.sink_rows import check_schema, first_rows, produce_batches
from oncelog.spark.txn_commit import end_transactions
from oncelog.spark.write_options import WriteOptions, parse_write_options

log = logging.getLogger("oncelog.spark.sink")

_CLOSE_TIMEOUT = 5.0
_FENCE_TIMEOUT = 60.0


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task reports to the driver: the partition's prepared transaction, or that it had nothing to do
    (no rows, or a replay of a batch whose marker shows it committed)."""

    sink_id: str
    partition: int
    batch_id: int
    rows: int
    skipped: bool = False
    transactional_id: str | None = None
    producer_id: int = -1
    epoch: int = -1

    @property
    def prepared(self) -> bool:
        return self.transactional_id is not None and self.producer_id >= 0


def _close_quietly(producer: Producer) -> None:
    try:
        producer.close(_CLOSE_TIMEOUT)
    except Exception as exc:  # a broken producer is being dropped anyway
        log.debug("closing a sink producer: %s", exc)


def write_partition(options: WriteOptions, sink_id: str, query_id: str, batch_id: int, partition: int,
                    batches: Iterator[pa.RecordBatch]) -> SinkCommit:
    """Prepare one Spark partition of one batch (runs in an executor's Python worker): rows and marker in an
    open, fully acknowledged transaction, which the driver commits."""
    rows_from = first_rows(batches)
    if rows_from is None:
        return SinkCommit(sink_id, partition, batch_id, 0)
    markers.ensure_marker_topic(options)
    txid = txn_ids.transactional_id(sink_id, partition)
    group = txn_ids.marker_group(sink_id, partition)
    # A producer per task: its transaction is finished by the driver, so it could not begin the next one.
    # Marker reads go through the worker's cached cluster connections.
    producer = Producer(options.producer_config(txid))
    try:
        producer.init_transactions()
        marker = markers.read_marker(options, group)
        if marker.batch_id >= batch_id and marker.query_id == query_id:
            log.info("%s: batch %d already committed (marker %d): nothing to write", txid, batch_id, marker.batch_id)
            return SinkCommit(sink_id, partition, batch_id, 0, skipped=True)
        if marker.batch_id >= 0 and marker.query_id != query_id:
            log.warning("%s: the marker (batch %d) was left by query %s, not this one (%s): starting afresh",
                        txid, marker.batch_id, marker.query_id, query_id)
        producer.begin_transaction()
        rows = produce_batches(producer, rows_from, options.topic, _partition_count(options))
        timeout = options.transaction_timeout_ms / 1000
        left = producer.flush(timeout)
        if left:
            raise KafkaTimeoutError(f"{txid}: {left} records not acknowledged within {timeout:.0f} s")
        # Raises if any record of the transaction failed: such a transaction must never be committed.
        producer.send_offsets_to_transaction([markers.marker_position(options, batch_id, query_id, rows)], group)
        identity = producer.transaction_identity()
        assert identity is not None
    except BaseException:
        try:
            producer.abort_transaction(_CLOSE_TIMEOUT)
        except Exception as exc:
            log.debug("%s: abort after a failed write: %s", txid, exc)
        raise
    finally:
        _close_quietly(producer)
    return SinkCommit(sink_id, partition, batch_id, rows, False, txid, identity[0], identity[1])


def _partition_count(options: WriteOptions) -> int | None:
    """Partitions of the `topic` option's topic now (None: no such option, or the topic does not exist yet)."""
    if options.topic is None:
        return None
    cluster, _ = markers.sink_cluster(options)
    get_runtime().run(cluster.refresh_metadata([options.topic], force=True), timeout=60)
    parts = cluster.partitions_for(options.topic)
    return len(parts) if parts else None


def finish(options: WriteOptions, messages: list[WriterCommitMessage | None], what: str) -> None:
    """The driver's commit: EndTxn(COMMIT) for every prepared partition; raises if any could not commit."""
    prepared = [m for m in messages if isinstance(m, SinkCommit) and m.prepared]
    outcomes = end_transactions(options, prepared, commit=True)
    failed = [(m.transactional_id, o) for m, o in zip(prepared, outcomes, strict=True) if o is not None]
    done = [m for m in messages if isinstance(m, SinkCommit)]
    log.info("%s: %d rows in %d transactions, %d partitions skipped as already committed", what,
             sum(m.rows for m in prepared), len(prepared) - len(failed), sum(m.skipped for m in done))
    if failed:
        raise KafkaError(f"{what}: {len(failed)} of {len(prepared)} transactions could not commit (restarting "
                         f"the query replays the batch): " + "; ".join(f"{t}: {e}" for t, e in failed))


def undo(options: WriteOptions, sink_id: str | None, messages: list[WriterCommitMessage | None],
         what: str) -> None:
    """The driver's abort: end the prepared transactions, fence the partitions that reported nothing."""
    prepared = [m for m in messages if isinstance(m, SinkCommit) and m.prepared]
    for m, outcome in zip(prepared, end_transactions(options, prepared, commit=False), strict=True):
        if outcome is not None:  # e.g. a commit(N) that got this far before failing: it stays committed
            log.info("%s: %s not aborted: %s", what, m.transactional_id, outcome)
    failed = [i for i, m in enumerate(messages) if m is None]
    if not failed:
        return
    if sink_id is None:
        log.warning("%s aborted; the sink id is unknown here, so partitions %s are not fenced (their open "
                    "transactions end by timeout)", what, failed)
        return
    fence(options, sink_id, failed)


def fence(options: WriteOptions, sink_id: str, partitions: list[int]) -> None:
    """InitProducerId for these partitions' transactional ids: aborts what their failed tasks left open."""
    for partition in partitions:
        txid = txn_ids.transactional_id(sink_id, partition)
        started = time.monotonic()
        try:
            producer = Producer(options.producer_config(txid))
            try:
                producer.init_transactions(_FENCE_TIMEOUT)
            finally:
                _close_quietly(producer)
            log.info("fenced %s in %.2f s", txid, time.monotonic() - started)
        except Exception as exc:
            # The broker's timeout reaper aborts the transaction within transaction.timeout.ms anyway.
            log.warning("could not fence %s (its open transaction ends by timeout): %s", txid, exc)


def _task() -> TaskContext:
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the oncelog sink's write() must run inside a Spark task")
    return ctx


class OncelogStreamWriter(DataSourceStreamArrowWriter):
    """Exactly-once streaming writes; a new instance per micro-batch, built on the driver and pickled to tasks."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        ctx = _task()
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        if batch is None or query_id is None:
            raise RuntimeError("no streaming batch id or query id in the task's properties")
        sink_id = self.options.sink_id or query_id
        return write_partition(self.options, sink_id, query_id, int(batch), ctx.partitionId(), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        finish(self.options, messages, f"batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        sink_id = self.options.sink_id or next((m.sink_id for m in messages if isinstance(m, SinkCommit)), None) \
            or txn_ids.query_id_from_checkpoint(self.options.checkpoint_location)
        undo(self.options, sink_id, messages, f"batch {batchId}")


class OncelogBatchWriter(DataSourceArrowWriter):
    """`df.write.format("oncelog")`: one transaction per Spark partition, committed by the driver when the
    whole job succeeded; a failed job leaves nothing visible."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        # Made once on the driver and pickled into every task, so every attempt of a partition shares it;
        # unique per write job, so two jobs with the same sink.id never take each other's markers.
        self.job_id = f"{options.sink_id or 'batch'}-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        ctx = _task()
        return write_partition(self.options, self.job_id, self.job_id, 0, ctx.partitionId(), iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        finish(self.options, messages, f"write job {self.job_id}")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        undo(self.options, self.job_id, messages, f"write job {self.job_id}")


def stream_writer(options: dict[str, str], schema: object) -> OncelogStreamWriter:
    parsed = parse_write_options(options)
    check_schema(schema, parsed.topic)
    return OncelogStreamWriter(parsed)


# Spark's Kafka sink (KafkaSourceProvider.createRelation) rejects Overwrite and Ignore with "Save mode <mode> not
# allowed for Kafka. Allowed save modes are Append and ErrorIfExists (default)." and appends in the other two.
# A Python data source cannot take ErrorIfExists or Ignore at all: Spark's DataFrameWriter.save refuses every mode
# but Append and Overwrite for a batch-writable TableProvider (UNSUPPORTED_DATA_SOURCE_SAVE_MODE) before any
# Python runs, so `writer()` is only ever asked for Append or Overwrite (overwrite=True).
OVERWRITE_REFUSED = (
    'Save mode Overwrite not allowed for oncelog: the sink only appends to topics. Write with '
    '.mode("append"): df.write.format("oncelog").mode("append").option(...).save(). (Spark\'s Kafka sink also '
    'takes the default mode, ErrorIfExists, as an append; a PySpark Python data source is only given Append '
    'and Overwrite.)')


def batch_writer(options: dict[str, str], schema: object, overwrite: bool) -> OncelogBatchWriter:
    if overwrite:
        raise OptionError(OVERWRITE_REFUSED)
    parsed = parse_write_options(options)
    check_schema(schema, parsed.topic)
    return OncelogBatchWriter(parsed)
