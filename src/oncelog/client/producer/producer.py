"""`Producer` (synchronous, confluent-kafka's API) and `AsyncProducer` (awaitable sends) over one async core.

The core lives on an event loop: the process's client loop thread for `Producer`, the caller's own loop for
`AsyncProducer`. `produce()` encodes the record into its partition's open batch on the caller's thread and
returns; the sender (sender.py) does the rest on the loop. Delivery callbacks run where confluent-kafka runs
them — on the caller's thread, inside `poll()` and `flush()` — never on the loop thread, so a slow or raising
callback cannot stall delivery.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from oncelog.errors import ErrorCode
from oncelog.records.batch import COMPRESSION_NAMES

from ..cluster import Cluster
from ..config import ClientConfig
from ..errors import KafkaError, KafkaTimeoutError, RecordError
from ..partitioner import Partitioner
from ..runtime import get_runtime
from ..types import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, TopicPartition
from .accumulator import _RECORD_OVERHEAD, ProducerBatch, RecordAccumulator
from .idempotence import Idempotence
from .sender import Sender
from .transactions import TransactionManager

__all__ = ["Producer", "AsyncProducer", "DeliveryReport"]

log = logging.getLogger("oncelog.client.producer")

_CODECS = {name: code for code, name in COMPRESSION_NAMES.items()}
_FACADE_KEYS = ("on_delivery", "delivery.report.only.error")  # confluent-kafka keys the facade handles itself
_METADATA_WAIT = 60.0  # seconds produce() waits for a new topic's partitions (Java's max.block.ms)


class DeliveryReport:
    """What `on_delivery(err, msg)` gets as `msg`: confluent-kafka's Message accessors for a produced record."""

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_headers", "_timestamp", "_error",
                 "_latency")

    def __init__(self, topic: str, partition: int, offset: int, key: Any, value: Any, headers: Any,
                 timestamp: tuple[int, int], error: KafkaError | None, latency: float | None = None) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = headers
        self._timestamp = timestamp
        self._error = error
        self._latency = latency

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        """The record's offset; -1 when unknown (a failure, or a duplicate the broker answered without one)."""
        return self._offset

    def key(self) -> Any:
        return self._key

    def value(self) -> Any:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return list(self._headers) if self._headers else None

    def timestamp(self) -> tuple[int, int]:
        return self._timestamp

    def error(self) -> KafkaError | None:
        return self._error

    def latency(self) -> float | None:
        """Seconds from the start of the record's batch (its first record's produce()) to its delivery report."""
        return self._latency

    def __len__(self) -> int:
        return 0 if self._value is None else len(self._value)

    def __repr__(self) -> str:
        return (f"DeliveryReport({self._topic}-{self._partition}@{self._offset}"
                + (f", error={self._error!r})" if self._error is not None else ")"))


def _as_bytes(data: Any, what: str) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes, str or None, not {type(data).__name__}")


def _headers(headers: Any) -> list[tuple[str, bytes | None]] | None:
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(str(k), _as_bytes(v, "a header value")) for k, v in items]


def _all_bytes(items: list[Any]) -> bool:
    """Every item is bytes or None (one pass in C)."""
    return set(map(type, items)) <= _BYTES_OR_NONE


_BYTES_OR_NONE = {bytes, type(None)}


class _Core:
    """The producer's state and machinery; methods named `*_async` run on the core's loop."""

    def __init__(self, conf: Mapping[str, Any], loop_owner: str) -> None:
        conf = dict(conf)
        self.default_callback: Callable | None = conf.pop("on_delivery", None)
        self.only_errors = str(conf.pop("delivery.report.only.error", "false")).lower() == "true"
        self.config = ClientConfig(conf, "producer")
        self.loop_owner = loop_owner  # "thread": the runtime's loop; "caller": an AsyncProducer's loop
        cfg = self.config
        self.cluster = Cluster(cfg)
        self.partitioner = Partitioner(cfg["partitioner"])
        self.idem = Idempotence(cfg["oncelog.test.initial.sequence"]) if cfg["enable.idempotence"] else None
        self.transactional = cfg["transactional.id"] is not None
        self.acc = RecordAccumulator(
            batch_size=cfg["batch.size"], batch_records=cfg["batch.num.messages"], linger_ms=cfg["linger.ms"],
            compression=_CODECS[cfg["compression.type"]], transactional=self.transactional,
            delivery_timeout_ms=cfg["delivery.timeout.ms"], on_batch_closed=self._batch_closed)
        self.txn = TransactionManager(config=cfg, cluster=self.cluster, idempotence=self.idem,
                                      wake=self._wake_on_loop) if self.transactional and self.idem else None
        self.sender = Sender(config=cfg, cluster=self.cluster, accumulator=self.acc, idempotence=self.idem,
                             transactions=self.txn, complete=self._complete)
        self.max_queued = cfg["queue.buffering.max.messages"]
        self.outstanding = 0  # records produced and not yet reported (under acc.lock)
        self.reports: deque[tuple[ProducerBatch, int, int, KafkaError | None, dict | None]] = deque()
        self.report_event = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._partitions: dict[str, list[int]] = {}
        self.cluster.metadata_listeners.append(self._metadata_applied)
        self.closed = False

    # -- lifecycle (on the loop) ---------------------------------------------------------------------------
    async def start_async(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.cluster.bootstrap()
        self._task = self.loop.create_task(self.sender.run())

    async def close_async(self, timeout: float | None) -> None:
        if self._task is not None:
            self.sender.closing = True
            self.sender.wake()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except TimeoutError:
                self._task.cancel()
            closed = KafkaError("the producer was closed before the record was delivered")
            self.sender.fail_queued(closed)
            self.sender.fail_unresolved(closed)
            await self.sender.close()
        await self.cluster.close()

    def _wake_on_loop(self) -> None:
        self.sender.wake()

    def wake_from_any_thread(self) -> None:
        loop = self.loop
        if loop is None:
            return
        if self.loop_owner == "caller":
            self.sender.wake()
        else:  # once per new batch, not per record
            loop.call_soon_threadsafe(self.sender.wake)

    # -- partitions -----------------------------------------------------------------------------------------
    def _metadata_applied(self) -> None:
        """Partitions added to a topic (CreatePartitions) are used once metadata shows them, as in Kafka's
        clients: the periodic refresh (metadata.max.age.ms) or any forced one brings them in. A topic that
        disappeared keeps its list, so produce() goes on and the broker's answer reports the error."""
        for topic, known in list(self._partitions.items()):
            parts = self.cluster.partitions_for(topic)
            if parts and parts != known:
                self._partitions[topic] = parts

    def _batch_closed(self, topic: str, partition: int) -> None:
        parts = self._partitions.get(topic)
        if parts:
            self.partitioner.batch_closed(topic, partition, parts)

    async def partitions_async(self, topic: str) -> list[int]:
        """The topic's partitions, waiting (like Java's max.block.ms) while a new topic is being created."""
        deadline = time.monotonic() + min(_METADATA_WAIT, self.config["delivery.timeout.ms"] / 1000)
        delay = 0.05
        while True:
            await self.cluster.refresh_metadata([topic], force=True)
            parts = self.cluster.partitions_for(topic)
            if parts:
                self._partitions[topic] = parts
                return parts
            code = self.cluster.topic_error(topic)
            if code and not ErrorCode(code).retriable:
                raise KafkaError(f"cannot produce to {topic!r}", code)
            if time.monotonic() + delay > deadline:
                raise KafkaTimeoutError(f"no partitions for topic {topic!r} (error code {code})")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    # -- produce (caller's thread) ----------------------------------------------------------------------------
    def check_produce(self) -> None:
        if self.closed:
            raise KafkaError("the producer is closed")
        if self.txn is not None:
            self.txn.check_produce()
        if self.sender.fatal is not None:
            raise self.sender.fatal

    def append(self, topic: str, parts: list[int], value: Any, key: Any, partition: int | None, headers: Any,
               timestamp: int | None, callback: Any) -> None:
        """Put one record into its batch; the one piece of per-record work on the producing side."""
        if value.__class__ is not bytes:
            value = _as_bytes(value, "value")
        if key is not None and key.__class__ is not bytes:
            key = _as_bytes(key, "key")
        hdrs = _headers(headers) if headers else None
        if not timestamp:
            timestamp = time.time_ns() // 1_000_000
        if callback is None:
            callback = self.default_callback
        with self.acc.lock:
            if self.outstanding >= self.max_queued:
                raise BufferError(f"local queue full: {self.outstanding} records waiting for delivery")
            if partition is None or partition < 0:
                partition = self.partitioner.partition(topic, key, parts)
            elif not 0 <= partition < len(parts):  # Kafka's partition ids are 0..n-1
                raise KafkaError(f"{topic!r} has no partition {partition}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            _, _, wake = self.acc.append(topic, partition, key, value, hdrs, timestamp, callback,
                                         callback is not None)
            self.outstanding += 1
        if wake:
            self.wake_from_any_thread()

    def append_many(self, topic: str, parts: list[int], values: list[Any], keys: list[Any] | None,
                    partition: int | None, timestamp: int | None, callback: Any) -> int:
        """Put records without headers into their batches, a batch at a time; returns how many were queued
        (fewer than given when the local queue filled up). The records and their batches are exactly those
        `append` of each in turn would make."""
        n = len(values)
        if keys is not None and len(keys) != n:
            raise ValueError(f"{len(keys)} keys for {n} values")
        if n == 0:
            return 0
        if not _all_bytes(values):
            values = [None if v is None else _as_bytes(v, "value") for v in values]
        if keys is not None:
            if not _all_bytes(keys):
                keys = [None if k is None else _as_bytes(k, "key") for k in keys]
            nulls = keys.count(None)
            if nulls == n:
                keys = None
            elif (partition is None or partition < 0) and self.partitioner.hashes_keys:
                return self._append_each(topic, parts, values, keys, timestamp, callback)  # a partition per key
        if partition is not None and partition >= 0 and not partition < len(parts):
            raise KafkaError(f"{topic!r} has no partition {partition}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if not timestamp:
            timestamp = time.time_ns() // 1_000_000
        if callback is None:
            callback = self.default_callback
        sizes = [0]
        sizes += itertools.accumulate(map(_RECORD_OVERHEAD.__add__, map(len, (v or b"" for v in values)
                                                                       if None in values else values)))
        if keys is not None:
            key_sizes = itertools.accumulate(map(len, (k or b"" for k in keys) if None in keys else keys))
            sizes[1:] = map(int.__add__, sizes[1:], key_sizes)
        sticky = partition is None or partition < 0
        target = -1 if sticky else partition
        done = 0
        wake = False
        acc = self.acc
        while done < n:
            with acc.lock:
                room = self.max_queued - self.outstanding
                if room <= 0:
                    break
                if sticky:
                    target = self.partitioner.partition(topic, None, parts)  # one partition per batch
                end, woke = acc.append_many(topic, target, keys, values, done, min(n, done + room), sizes,
                                            timestamp, callback, callback is not None, sticky)
                self.outstanding += end - done
            wake = wake or woke
            done = end
        if wake:
            self.wake_from_any_thread()
        return done

    def _append_each(self, topic: str, parts: list[int], values: list[Any], keys: list[Any], timestamp: int | None,
                     callback: Any) -> int:
        for i, (value, key) in enumerate(zip(values, keys, strict=True)):
            try:
                self.append(topic, parts, value, key, None, None, timestamp, callback)
            except BufferError:
                return i
        return len(values)

    # -- completions (on the loop) ------------------------------------------------------------------------
    def _complete(self, batch: ProducerBatch, base_offset: int, log_append_time: int, error: KafkaError | None,
                  record_errors: dict[int, RecordError] | None) -> None:
        batch.completed = time.monotonic()
        if error is not None and batch.records is None:
            log.warning("%d records for %s-%s not delivered: %s", batch.count, batch.topic, batch.partition, error)
        elif record_errors and batch.records is None:
            for index, rec_error in record_errors.items():
                log.warning("record %d of a batch for %s-%s rejected: %s", index, batch.topic, batch.partition,
                            rec_error)
        if batch.records is None:
            with self.acc.lock:
                self.outstanding -= len(record_errors) if record_errors is not None else batch.count
            self.report_event.set()
            return
        if self.loop_owner == "caller":
            self.serve_one(batch, base_offset, log_append_time, error, record_errors)
        else:
            self.reports.append((batch, base_offset, log_append_time, error, record_errors))
        self.report_event.set()

    def serve_reports(self, limit: int | None = None) -> int:
        """Run queued delivery callbacks on this (the caller's) thread; returns how many records were reported."""
        served = 0
        while self.reports and (limit is None or served < limit):
            try:
                item = self.reports.popleft()
            except IndexError:
                break
            served += self.serve_one(*item)
        return served

    def serve_one(self, batch: ProducerBatch, base_offset: int, log_append_time: int, error: KafkaError | None,
                  record_errors: dict[int, RecordError] | None) -> int:
        records = batch.records
        assert records is not None
        if record_errors is not None:
            indexes: Iterable[int] = sorted(record_errors)
        else:
            indexes = range(len(records))
        count = 0
        ts_type = TIMESTAMP_LOG_APPEND_TIME if log_append_time >= 0 else TIMESTAMP_CREATE_TIME
        latency = batch.completed - batch.created
        try:
            for i in indexes:
                count += 1
                info = records[i]
                if info is None:
                    continue
                key, value, headers, timestamp, callback = info
                err = record_errors[i] if record_errors is not None else error
                if callback is None or (self.only_errors and err is None):
                    continue
                offset = base_offset + i if base_offset >= 0 and err is None else -1
                report = DeliveryReport(batch.topic, batch.partition, offset, key, value, headers,
                                        (ts_type, log_append_time if log_append_time >= 0 else timestamp), err,
                                        latency)
                if isinstance(callback, asyncio.Future):
                    if not callback.done():
                        if err is None:
                            callback.set_result(report)
                        else:
                            callback.set_exception(err)
                else:
                    try:
                        callback(err, report)
                    except Exception:
                        log.exception("on_delivery callback raised")
        finally:
            with self.acc.lock:
                self.outstanding -= count if record_errors is not None else batch.count
        return count

    # -- flushing (on the loop) -----------------------------------------------------------------------------
    async def drain_async(self, deadline: float) -> bool:
        """Send everything queued now (linger ignored) and wait until nothing is queued or in flight."""
        with self.acc.lock:
            self.acc.flushing += 1
        try:
            self.sender.wake()
            while self.sender.busy():
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(0.002)
            return True
        finally:
            with self.acc.lock:
                self.acc.flushing -= 1

    async def abort_drain_async(self, deadline: float) -> bool:
        self.sender.fail_queued(KafkaError("the transaction was aborted; the record was not sent",
                                           ErrorCode.TRANSACTION_ABORTABLE))
        return await self.drain_async(deadline)


class Producer:
    """A Kafka producer with confluent-kafka's API, implementing the seeds' client rules (DESIGN §4).

    `Producer({"bootstrap.servers": "127.0.0.1:9092"})` is idempotent with acks=all by default. Delivery
    callbacks `on_delivery(err, msg)` run inside `poll()` and `flush()` on the calling thread.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        conf = dict(config or {})
        conf.update(kwargs)
        self._core = _Core(conf, "thread")
        self._runtime = get_runtime()
        self._runtime.run(self._core.start_async())

    # -- producing ------------------------------------------------------------------------------------------
    def _ready(self, topic: str, partition: int | None) -> tuple[_Core, list[int]]:
        """The checks before queueing (state, transaction) and the topic's partitions, refreshed when unknown."""
        core = self._core
        if core.txn is not None or core.closed or core.sender.fatal is not None:
            core.check_produce()
        parts = core._partitions.get(topic)
        if parts is None or (partition is not None and partition >= len(parts)):  # unknown, or maybe added since
            parts = self._runtime.run(core.partitions_async(topic))
        return core, parts

    def produce(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
                on_delivery: Callable | None = None, timestamp: int | None = None, headers: Any = None,
                callback: Callable | None = None) -> None:
        """Queue one record; raises BufferError when queue.buffering.max.messages records are waiting."""
        core, parts = self._ready(topic, partition)
        core.append(topic, parts, value, key, partition, headers, timestamp, on_delivery or callback)

    def produce_batch(self, topic: str, values: list[Any], keys: list[Any] | None = None,
                      partition: int | None = None, timestamp: int | None = None,
                      on_delivery: Callable | None = None) -> int:
        """Queue many records without headers, in order; returns how many were queued.

        The records and batches are exactly those `produce(topic, value, key, partition, on_delivery,
        timestamp)` for each in turn would make, for a fraction of the per-record cost: one lock and one
        batch lookup per batch filled, not per record. With `partition` None, keyless records stick to a
        partition per batch (as produce() does) and keyed ones are hashed one by one. When
        queue.buffering.max.messages records are waiting, it queues what fits and returns that count (where
        produce() raises BufferError): call `poll()` and give the rest again. `on_delivery` (or the default
        callback) is called per record. `timestamp` None: the time of this call, for every record.
        """
        core, parts = self._ready(topic, partition)
        return core.append_many(topic, parts, values, keys, partition, timestamp, on_delivery)

    def poll(self, timeout: float | None = None) -> int:
        """Serve delivery callbacks; waits up to `timeout` seconds (None: forever) for at least one."""
        core = self._core
        served = core.serve_reports()
        if served or timeout == 0:
            return served
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            core.report_event.clear()
            served = core.serve_reports()
            if served:
                return served
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return 0
            core.report_event.wait(remaining if remaining is not None else 0.1)

    def flush(self, timeout: float | None = None) -> int:
        """Send everything and serve its callbacks; returns how many records are still undelivered."""
        core = self._core
        deadline = float("inf") if timeout is None or timeout < 0 else time.monotonic() + timeout
        with core.acc.lock:
            core.acc.flushing += 1
        try:
            core.wake_from_any_thread()
            while True:
                core.report_event.clear()
                core.serve_reports()
                if core.outstanding <= 0:
                    return 0
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return core.outstanding
                core.report_event.wait(min(remaining, 0.05))
        finally:
            with core.acc.lock:
                core.acc.flushing -= 1

    def __len__(self) -> int:
        """Records produced and not yet delivered or reported (confluent-kafka's len())."""
        return self._core.outstanding

    def purge(self, in_queue: bool = True, *args: Any, **kwargs: Any) -> None:
        """Fail the records not sent yet (their callbacks get an error at the next poll)."""
        if in_queue:
            self._runtime.run(self._async_fail_queued())

    async def _async_fail_queued(self) -> None:
        self._core.sender.fail_queued(KafkaError("purged before it was sent"))

    # -- transactions ---------------------------------------------------------------------------------------
    def _txn(self) -> TransactionManager:
        if self._core.txn is None:
            raise KafkaError("this producer has no transactional.id")
        return self._core.txn

    def _timeout(self, timeout: float | None) -> float:
        if timeout is None or timeout < 0:
            return self._core.config["transaction.timeout.ms"] / 1000 + self._core.config["request.timeout.ms"] / 1000
        return timeout

    def init_transactions(self, timeout: float | None = None) -> None:
        t = self._timeout(timeout)
        self._runtime.run(self._txn().init_transactions(t))

    def begin_transaction(self) -> None:
        self._runtime.run(self._txn().begin_transaction(self._timeout(None)))

    def send_offsets_to_transaction(self, positions: Iterable[TopicPartition], group_metadata: Any,
                                    timeout: float | None = None) -> None:
        self._runtime.run(self._txn().send_offsets(list(positions), group_metadata, self._timeout(timeout)))

    def commit_transaction(self, timeout: float | None = None) -> None:
        txn = self._txn()
        t = self._timeout(timeout)
        deadline = time.monotonic() + t
        self.flush(t)
        try:
            self._runtime.run(txn.commit(self._core.drain_async, max(0.0, deadline - time.monotonic())))
        finally:
            self.poll(0)

    def abort_transaction(self, timeout: float | None = None) -> None:
        txn = self._txn()
        try:
            self._runtime.run(txn.abort(self._core.abort_drain_async, self._timeout(timeout)))
        finally:
            self.poll(0)

    def transaction_identity(self) -> tuple[int, int] | None:
        """(producer id, epoch) the producer writes with now; None before it has one.

        Lets another process finish a transaction this producer prepared (EndTxn names the transaction by
        transactional id, producer id and epoch): the Spark sink commits its tasks' transactions on the driver.
        """
        idem = self._core.idem
        ident = idem.identity if idem is not None else None
        return None if ident is None else (ident.producer_id, ident.epoch)

    # -- end ----------------------------------------------------------------------------------------------------
    def close(self, timeout: float | None = None) -> int:
        """Flush (up to `timeout`), then stop; returns how many records were left undelivered."""
        core = self._core
        if core.closed:
            return 0
        left = self.flush(timeout)
        core.closed = True
        self._runtime.run(core.close_async(5.0))
        self.poll(0)
        return left

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncProducer:
    """The producer for asyncio code: `await producer.send(...)` waits for the record's delivery.

    Runs on the loop of the code that starts it (`await AsyncProducer.create(config)` or `async with`).
    `on_delivery` callbacks, when given, run on that loop as deliveries complete.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        conf = dict(config or {})
        conf.update(kwargs)
        self._core = _Core(conf, "caller")
        self._started = False

    @classmethod
    async def create(cls, config: Mapping[str, Any] | None = None, **kwargs: Any) -> AsyncProducer:
        producer = cls(config, **kwargs)
        await producer.start()
        return producer

    async def start(self) -> None:
        if not self._started:
            await self._core.start_async()
            self._started = True

    async def produce(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
                      on_delivery: Callable | None = None, timestamp: int | None = None,
                      headers: Any = None) -> asyncio.Future:
        """Queue one record; returns a future of its DeliveryReport (it raises the delivery error)."""
        await self.start()
        core = self._core
        if core.txn is not None or core.closed or core.sender.fatal is not None:
            core.check_produce()
        parts = core._partitions.get(topic)
        if parts is None or (partition is not None and partition >= len(parts)):  # unknown, or maybe added since
            parts = await core.partitions_async(topic)
        future = asyncio.get_running_loop().create_future()
        if on_delivery is not None:
            future.add_done_callback(lambda f: on_delivery(f.exception(), None if f.exception() else f.result()))
        while True:
            try:
                core.append(topic, parts, value, key, partition, headers, timestamp, future)
                return future
            except BufferError:
                core.report_event.clear()
                await asyncio.sleep(0.005)

    async def send(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
                   timestamp: int | None = None, headers: Any = None) -> DeliveryReport:
        """Produce one record and wait for its delivery; raises its error."""
        return await (await self.produce(topic, value, key, partition, None, timestamp, headers))

    async def flush(self, timeout: float | None = None) -> int:
        deadline = float("inf") if timeout is None else time.monotonic() + timeout
        await self._core.drain_async(deadline)
        return self._core.outstanding

    def __len__(self) -> int:
        return self._core.outstanding

    def _txn(self) -> TransactionManager:
        if self._core.txn is None:
            raise KafkaError("this producer has no transactional.id")
        return self._core.txn

    def _timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return self._core.config["transaction.timeout.ms"] / 1000 + self._core.config["request.timeout.ms"] / 1000
        return timeout

    async def init_transactions(self, timeout: float | None = None) -> None:
        await self.start()
        await self._txn().init_transactions(self._timeout(timeout))

    async def begin_transaction(self) -> None:
        await self._txn().begin_transaction(self._timeout(None))

    async def send_offsets_to_transaction(self, positions: Iterable[TopicPartition], group_metadata: Any,
                                          timeout: float | None = None) -> None:
        await self._txn().send_offsets(list(positions), group_metadata, self._timeout(timeout))

    async def commit_transaction(self, timeout: float | None = None) -> None:
        await self._txn().commit(self._core.drain_async, self._timeout(timeout))

    async def abort_transaction(self, timeout: float | None = None) -> None:
        await self._txn().abort(self._core.abort_drain_async, self._timeout(timeout))

    async def close(self, timeout: float | None = None) -> None:
        core = self._core
        if core.closed or not self._started:
            core.closed = True
            return
        await self.flush(timeout)
        core.closed = True
        await core.close_async(5.0)

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
