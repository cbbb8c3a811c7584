"""Records waiting to be sent, as open batches per partition.

`produce()` runs on the caller's thread and the sender on the loop thread, so the queues sit behind one lock
that each side holds for a few dictionary operations. Records are encoded into their batch as they arrive
(`BatchBuilder.append`, the only per-record work); everything after that — header, compression, CRC, the
wire — handles whole batches. A batch keeps the caller's (key, value, headers, timestamp, callback) tuples
only when someone will ask for them: a delivery callback, or an awaiting caller.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from oncelog.records.batch import COMPRESSION_NONE
from oncelog.records.builder import BatchBuilder, Header

# One record as the delivery report needs it: key, value, headers, timestamp (ms), on_delivery callback.
RecordInfo = tuple[Any, Any, Any, int, Any]

_RECORD_OVERHEAD = 24  # rough encoded size of a record beyond key and value (varints, attributes)


class ProducerBatch:
    """One partition's records sent together; its (producer id, epoch, base sequence) is set once, at first send.

    `possibly_written` records that some attempt ended without a definite answer (a broken connection, a
    request timeout): the broker may have appended it, so it must never go out again under a new identity.
    """

    __slots__ = ("topic", "partition", "builder", "records", "count", "size", "created", "deadline", "buf",
                 "producer_id", "producer_epoch", "base_sequence", "attempts", "possibly_written", "in_request",
                 "done", "transactional", "retry_at", "closed", "completed")

    def __init__(self, topic: str, partition: int, compression: int, transactional: bool, keep_records: bool,
                 deadline: float) -> None:
        self.topic = topic
        self.partition = partition
        self.builder: BatchBuilder | None = BatchBuilder(compression, transactional=transactional)
        self.records: list[RecordInfo] | None = [] if keep_records else None
        self.count = 0
        self.size = 61
        self.created = time.monotonic()
        self.deadline = deadline
        self.buf: bytes | bytearray | None = None
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1
        self.attempts = 0
        self.possibly_written = False
        self.in_request = False
        self.done = False
        self.transactional = transactional
        self.retry_at = 0.0
        self.closed = False  # takes no more records (the partitioner was told)
        self.completed = 0.0  # monotonic time of its delivery report

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @property
    def sequenced(self) -> bool:
        return self.base_sequence >= 0

    @property
    def last_sequence(self) -> int:
        return self.base_sequence + self.count - 1

    def append(self, key: Any, value: Any, headers: Any, timestamp: int, callback: Any) -> int:
        assert self.builder is not None, "a sealed batch takes no more records"
        index = self.builder.append(key, value, headers or (), timestamp)
        self.count = index + 1
        self.size += _RECORD_OVERHEAD + (len(key) if key is not None else 0) + \
            (len(value) if value is not None else 0)
        if self.records is not None:
            self.records.append((key, value, headers, timestamp, callback))
        return index

    def append_many(self, keys: list[Any] | None, values: list[Any], timestamp: int, callback: Any,
                    size: int) -> None:
        """Records (key, value) without headers, one timestamp; `size` is their estimated size (see append)."""
        assert self.builder is not None, "a sealed batch takes no more records"
        self.builder.append_many(keys, values, timestamp)
        self.count += len(values)
        self.size += size
        if self.records is not None:
            self.records.extend((k, v, None, timestamp, callback)
                                for k, v in zip(keys if keys is not None else [None] * len(values), values,
                                                strict=True))

    def seal(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        """Fix the identity and build the bytes; a retry sends these same bytes."""
        assert self.builder is not None and self.buf is None
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.buf = self.builder.build(producer_id=producer_id, producer_epoch=producer_epoch,
                                      base_sequence=base_sequence)
        self.builder = None

    def __repr__(self) -> str:
        return (f"ProducerBatch({self.topic}-{self.partition}, {self.count} records, pid={self.producer_id}, "
                f"epoch={self.producer_epoch}, seq={self.base_sequence}, attempts={self.attempts})")


class RecordAccumulator:
    """Open and closed batches per partition, in the order their records were produced."""

    def __init__(self, *, batch_size: int, batch_records: int, linger_ms: float, compression: int = COMPRESSION_NONE,
                 transactional: bool = False, delivery_timeout_ms: float, on_batch_closed: Callable[[str, int],
                                                                                                   None] | None = None
                 ) -> None:
        self.lock = threading.Lock()
        self._queues: dict[tuple[str, int], deque[ProducerBatch]] = {}
        self._batch_size = batch_size
        self._batch_records = batch_records
        self._linger = linger_ms / 1000.0
        self._compression = compression
        self.transactional = transactional
        self._delivery_timeout = delivery_timeout_ms / 1000.0
        self._on_batch_closed = on_batch_closed
        self.flushing = 0  # > 0 while someone waits for everything to go out: linger is ignored
        self.queued_records = 0

    def _queue(self, topic: str, partition: int) -> deque:
        queue = self._queues.get((topic, partition))
        if queue is None:
            queue = self._queues[(topic, partition)] = deque()
        return queue

    def _replace(self, queue: deque, batch: ProducerBatch | None, topic: str, partition: int,
                 keep_records: bool) -> ProducerBatch:
        """Close the open batch (if any) and start the partition's next one."""
        if batch is not None:
            self._close(batch)
        batch = ProducerBatch(topic, partition, self._compression, self.transactional, keep_records,
                              time.monotonic() + self._delivery_timeout)
        queue.append(batch)
        return batch

    def append(self, topic: str, partition: int, key: Any, value: Any, headers: list[Header] | None,
               timestamp: int, callback: Any, keep_records: bool) -> tuple[ProducerBatch, int, bool]:
        """Add one record; returns (its batch, its index there, whether the sender should be woken).

        The caller holds `lock`. The sender only needs waking when a batch becomes sendable without waiting
        for linger (a full batch) or when a new batch starts a linger clock it does not know about yet.
        """
        queue = self._queue(topic, partition)
        wake = False
        batch = queue[-1] if queue else None
        if batch is None or batch.closed or \
                batch.size + (len(value) if value is not None else 0) + (len(key) if key is not None else 0) + \
                _RECORD_OVERHEAD > self._batch_size:
            batch = self._replace(queue, batch, topic, partition, keep_records)
            wake = True
        index = batch.append(key, value, headers, timestamp, callback)
        self.queued_records += 1
        if batch.count >= self._batch_records or batch.size >= self._batch_size:
            self._close(batch)  # full now: keyless records move on before the next one arrives
            wake = True
        return batch, index, wake

    def append_many(self, topic: str, partition: int, keys: list[Any] | None, values: list[Any], start: int,
                    stop: int, sizes: list[int], timestamp: int, callback: Any, keep_records: bool,
                    sticky: bool = False) -> tuple[int, bool]:
        """Add records [start, stop) of `keys`/`values` (no headers) to the partition: as many as its open
        batch takes, in a new batch when it takes none, exactly where `append` of each would put them.

        `sizes[i]` is the estimated size of records [0, i) (`_RECORD_OVERHEAD` + key and value lengths each).
        `sticky`: the partition is the partitioner's sticky choice. Closing an open batch that cannot take the
        first record moves that choice on, so then only the first record goes here, as with `append`.
        Returns (the index after the last record added, whether the sender should be woken); caller holds `lock`.
        """
        queue = self._queue(topic, partition)
        wake = False
        batch = queue[-1] if queue else None
        limit = self._batch_size
        first = sizes[start]
        if batch is not None and not batch.closed and batch.size + sizes[start + 1] - first <= limit:
            end = bisect.bisect_right(sizes, limit - batch.size + first, start + 1, stop + 1) - 1
            end = min(end, start + self._batch_records - batch.count)
        else:  # as in append: the open batch cannot take the first record, a new one takes at least it
            replaced = batch is not None and not batch.closed
            batch = self._replace(queue, batch, topic, partition, keep_records)
            wake = True
            if sticky and replaced:
                end = start + 1
            else:
                end = bisect.bisect_right(sizes, limit - batch.size + first, start + 1, stop + 1) - 1
                end = max(start + 1, min(end, start + self._batch_records))
        if start == 0 and end == len(values):
            batch.append_many(keys, values, timestamp, callback, sizes[end] - first)
        else:
            batch.append_many(keys[start:end] if keys is not None else None, values[start:end], timestamp,
                              callback, sizes[end] - first)
        self.queued_records += end - start
        if batch.count >= self._batch_records or batch.size >= limit:
            self._close(batch)
            wake = True
        return end, wake

    def partitions(self) -> list[tuple[str, int]]:
        """Partitions with queued batches (caller holds `lock`)."""
        return [tp for tp, q in self._queues.items() if q]

    def head_ready(self, tp: tuple[str, int], now: float) -> tuple[ProducerBatch | None, float]:
        """The partition's first batch if it may go now, and else when it will (linger); caller holds `lock`."""
        queue = self._queues.get(tp)
        if not queue:
            return None, float("inf")
        batch = queue[0]
        if len(queue) > 1 or self.flushing or batch.count >= self._batch_records or \
                batch.size >= self._batch_size:
            return batch, now
        due = batch.created + self._linger
        return (batch, now) if due <= now else (None, due)

    def pop(self, tp: tuple[str, int]) -> ProducerBatch:
        """Take the partition's first batch off the queue to send it (caller holds `lock`)."""
        queue = self._queues[tp]
        batch = queue.popleft()
        self._close(batch)
        self.queued_records -= batch.count
        return batch

    def _close(self, batch: ProducerBatch) -> None:
        if not batch.closed:
            batch.closed = True
            if self._on_batch_closed is not None:
                self._on_batch_closed(batch.topic, batch.partition)

    def expired(self, now: float) -> list[ProducerBatch]:
        """Batches whose delivery.timeout.ms passed before they were ever sent (caller holds `lock`)."""
        out: list[ProducerBatch] = []
        for queue in self._queues.values():
            while queue and queue[0].deadline <= now:
                batch = queue.popleft()
                self.queued_records -= batch.count
                out.append(batch)
        return out

    def drain_all(self) -> list[ProducerBatch]:
        """Every queued batch, e.g. to fail them when a transaction aborts or the producer closes."""
        out: list[ProducerBatch] = []
        for queue in self._queues.values():
            out.extend(queue)
            queue.clear()
        self.queued_records = 0
        return out

    def empty(self) -> bool:
        return not any(self._queues.values())
