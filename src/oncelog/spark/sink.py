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
- otherwise it begins a transaction, produces its rows, commits the marker N into the same transaction
  (`send_offsets_to_transaction`) and commits: rows and marker become visible together or not at all;
- the driver's `commit(messages, N)` has no side effect on data (it may run twice); `abort(messages, N)`
  undoes nothing (a partition whose message arrived is durable) and fences the partitions without a message,
  so their open transactions are aborted now instead of pinning the last stable offset of read_committed
  consumers until `transaction.timeout.ms`.

Requirements on the user's query (the guarantee rests on them):
- **Determinism per partition.** A replayed batch must give every Spark partition index the same rows as the
  first run: no `rand()`, `uuid()`, `current_timestamp()` or other non-deterministic expression between the
  source and the sink that decides which rows exist or where they go; hash partitioning or a sorted
  round-robin `repartition(n)` only; the same number of partitions at the sink on a replay. A source must
  plan a batch purely from its offsets (the oncelog and Kafka sources do). Values may differ (a timestamp
  column), rows may not move between partitions.
- **Visibility is atomic per Spark partition, not per micro-batch.** A read_committed consumer can see
  partition 0 of batch N before partition 1. Use `coalesce(1)` before the sink for one transaction per batch.
- **Stable sink id.** Keep the checkpoint (the default sink id is the query id stored there) or set
  `sink.id`; a new checkpoint with the same `sink.id` starts afresh (markers carry the query id).
- **Transaction timeout.** A task's transaction lives from its first row to its commit; if upstream work
  inside the task is slower than `transaction.timeout.ms`, the coordinator aborts it, the task fails and
  Spark retries it (set `spark.task.maxFailures`, or restart the query): nothing is written twice.
- **Markers are group offsets**, kept for `offsets.retention.minutes` after the last batch that wrote them.

Batch writes (`df.write`) use the same machinery with a sink id made once per write job on the driver and
batch id 0: a retried task whose first attempt had already committed writes nothing again.
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
from oncelog.client.runtime import cache_pop, cached
from oncelog.spark import markers, txn_ids
from oncelog.spark.options import OptionError
from oncelog.spark.sink_rows import check_schema, first_rows, produce_batches
from oncelog.spark.write_options import WriteOptions, parse_write_options

log = logging.getLogger("oncelog.spark.sink")

_CLOSE_TIMEOUT = 5.0
_FENCE_TIMEOUT = 60.0


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task reports to the driver: which partition wrote which batch, and whether it was a replay."""

    sink_id: str
    partition: int
    batch_id: int
    rows: int
    skipped: bool = False


class _ProducerSlot:
    """A worker's producer for one transactional id, reused by the tasks the worker runs next.

    `clean` is False after a task failed half-way: the producer may be in an abortable or fatal state, so
    the next task starts a new one rather than reasoning about what the old one was in the middle of.
    """

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.clean = True


def _slot(options: WriteOptions, transactional_id: str) -> _ProducerSlot:
    conf = options.producer_config(transactional_id)
    key = ("oncelog.spark.sink-producer", tuple(sorted(conf.items())))
    slot = cached(key, lambda: _ProducerSlot(Producer(conf)))
    if slot.clean:
        return slot
    if cache_pop(key) is slot:
        _close_quietly(slot.producer)
    return cached(key, lambda: _ProducerSlot(Producer(conf)))


def _close_quietly(producer: Producer) -> None:
    try:
        producer.close(_CLOSE_TIMEOUT)
    except Exception as exc:  # the producer was already broken: that is why it is being replaced
        log.debug("closing a failed sink producer: %s", exc)


def write_partition(options: WriteOptions, sink_id: str, query_id: str, batch_id: int, partition: int,
                    batches: Iterator[pa.RecordBatch]) -> SinkCommit:
    """Write one Spark partition of one batch exactly once (runs in an executor's Python worker)."""
    rows_from = first_rows(batches)
    if rows_from is None:
        return SinkCommit(sink_id, partition, batch_id, 0)
    markers.ensure_marker_topic(options)
    txid = txn_ids.transactional_id(sink_id, partition)
    group = txn_ids.marker_group(sink_id, partition)
    slot = _slot(options, txid)
    producer = slot.producer
    slot.clean = False
    try:
        producer.init_transactions()
        marker = markers.read_marker(options, group)
        if marker.batch_id >= batch_id and marker.query_id == query_id:
            log.info("%s: batch %d already committed (marker %d): nothing to write", txid, batch_id, marker.batch_id)
            slot.clean = True
            return SinkCommit(sink_id, partition, batch_id, 0, skipped=True)
        if marker.batch_id >= 0 and marker.query_id != query_id:
            log.warning("%s: the marker (batch %d) was left by query %s, not this one (%s): starting afresh",
                        txid, marker.batch_id, marker.query_id, query_id)
        producer.begin_transaction()
        rows = produce_batches(producer, rows_from, options.topic)
        producer.send_offsets_to_transaction([markers.marker_position(options, batch_id, query_id, rows)], group)
        producer.commit_transaction()
    except BaseException:
        try:
            producer.abort_transaction(_CLOSE_TIMEOUT)
        except Exception as exc:
            log.debug("%s: abort after a failed write: %s", txid, exc)
        raise
    slot.clean = True
    return SinkCommit(sink_id, partition, batch_id, rows)


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
        """No data side effects: every partition's data and marker were committed by its task."""
        done = [m for m in messages if isinstance(m, SinkCommit)]
        log.info("batch %d: %d rows written, %d of %d partitions skipped as already committed", batchId,
                 sum(m.rows for m in done), sum(m.skipped for m in done), len(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Fence the partitions that reported nothing; never undo the ones that did (they are durable)."""
        sink_id = self.options.sink_id or next((m.sink_id for m in messages if isinstance(m, SinkCommit)), None) \
            or txn_ids.query_id_from_checkpoint(self.options.checkpoint_location)
        failed = [i for i, m in enumerate(messages) if m is None]
        if sink_id is None:
            log.warning("batch %d aborted; the sink id is unknown here, so partitions %s are not fenced (their "
                        "transactions end by timeout)", batchId, failed)
            return
        fence(self.options, sink_id, failed)


class OncelogBatchWriter(DataSourceArrowWriter):
    """`df.write.format("oncelog")`: one transaction per Spark partition, exactly once across task retries."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        # Made once on the driver and pickled into every task, so every attempt of a partition shares it;
        # unique per write job, so two jobs with the same sink.id never take each other's markers.
        self.job_id = f"{options.sink_id or 'batch'}-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        ctx = _task()
        return write_partition(self.options, self.job_id, self.job_id, 0, ctx.partitionId(), iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: each partition committed its own transaction."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        fence(self.options, self.job_id, [i for i, m in enumerate(messages) if m is None])


def stream_writer(options: dict[str, str], schema: object) -> OncelogStreamWriter:
    parsed = parse_write_options(options)
    check_schema(schema, parsed.topic)
    return OncelogStreamWriter(parsed)


def batch_writer(options: dict[str, str], schema: object, overwrite: bool) -> OncelogBatchWriter:
    if overwrite:
        raise OptionError("the oncelog sink appends to topics; mode 'overwrite' is not supported")
    parsed = parse_write_options(options)
    check_schema(schema, parsed.topic)
    return OncelogBatchWriter(parsed)
