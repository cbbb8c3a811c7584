"""Rows to records: the sink's input columns, checked on the driver, and turned into produce() calls in a task.

The columns are Spark's Kafka sink's: `value` (string or binary, required), `key` (string or binary),
`topic` (string; the `topic` option overrides it), `partition` (int; else the key's murmur2 partition, or a
sticky one for keyless records) and `headers` (array<struct<key: string, value: binary>>). Other columns are
ignored. A task gets Arrow record batches; each column is converted to Python objects by Arrow's C code in one
call, and the rows of one partition go to the producer as one run (`Producer.produce_batch`: a lock and a batch
lookup per producer batch, records encoded in one tight loop), so no per-row Python work is left here.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from oncelog.client import Producer
from oncelog.spark.key_partitions import key_partition_array
from oncelog.spark.options import OptionError

_BINARY_LIKE = ("string", "binary")
_INT_LIKE = ("int", "bigint", "smallint", "tinyint")
_BACKPRESSURE_WAIT = 0.02  # seconds produce() waits for deliveries when the producer's queue is full


def check_schema(schema: Any, topic_option: str | None) -> None:
    """Fail the query early, on the driver, when the rows cannot be written: names the offending column."""
    fields = {f.name.lower(): f.dataType.simpleString() for f in schema.fields}
    if "value" not in fields:
        raise OptionError("the rows to write need a 'value' column (string or binary); got columns "
                          + ", ".join(f.name for f in schema.fields))
    for name, allowed in (("value", _BINARY_LIKE), ("key", _BINARY_LIKE), ("topic", ("string",)),
                          ("partition", _INT_LIKE)):
        kind = fields.get(name)
        if kind is not None and kind not in allowed:
            raise OptionError(f"column '{name}' must be {' or '.join(allowed)}; got {kind}")
    headers = fields.get("headers")
    if headers is not None and headers != "array<struct<key:string,value:binary>>":
        raise OptionError(f"column 'headers' must be array<struct<key:string,value:binary>>; got {headers}")
    if topic_option is None and "topic" not in fields:
        raise OptionError("set the option 'topic' or give the rows a 'topic' column")


def _binary(batch: pa.RecordBatch, name: str) -> list[bytes | None] | None:
    index = batch.schema.get_field_index(name)
    if index < 0:
        return None
    column = batch.column(index)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    return column.to_pylist()


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index).to_pylist()


def _headers(batch: pa.RecordBatch) -> Iterable[Any]:
    raw = _column(batch, "headers")
    if raw is None:
        return itertools.repeat(None)
    return [None if h is None else [(e["key"], e["value"]) for e in h] for h in raw]


def _partitions(batch: pa.RecordBatch, topic_partitions: int | None) -> Iterable[int | None]:
    """The `partition` column; else, for keyed rows of one known topic, the key's partition computed for the
    whole column at once (the producer's own rule); else None per row (the producer decides)."""
    listed = _column(batch, "partition")
    if listed is not None:
        return listed
    key_index = batch.schema.get_field_index("key")
    if topic_partitions and key_index >= 0:
        computed = key_partition_array(batch.column(key_index), topic_partitions)
        if computed is not None:
            return computed.tolist()
    return itertools.repeat(None)


def _partition_array(batch: pa.RecordBatch, topic_partitions: int | None) -> np.ndarray | None | bool:
    """Every row's partition as an array; None when the producer decides for every row (no `partition` column,
    and keys that are not hashed here); False when only some rows have one (they go row by row)."""
    index = batch.schema.get_field_index("partition")
    if index >= 0:
        column = batch.column(index)
        if column.null_count == len(column):
            return None
        if column.null_count:
            return False
        listed = column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        return listed if listed.min() >= 0 else False  # a negative partition: the producer decides for that row
    key_index = batch.schema.get_field_index("key")
    if topic_partitions and key_index >= 0:
        return key_partition_array(batch.column(key_index), topic_partitions)
    return None


def produce_batches(producer: Producer, batches: Iterable[pa.RecordBatch], topic_option: str | None,
                    topic_partitions: int | None = None) -> int:
    """Produce every row of `batches` (inside the caller's open transaction); returns the row count.

    `topic_partitions` is the partition count of `topic_option` when known: keys are then hashed per column.
    Rows without headers for the `topic` option go to the producer a partition's run at a time
    (`Producer.produce_batch`); other rows one by one. Either way a partition's rows keep their order.
    """
    rows = 0
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        timestamp = time.time_ns() // 1_000_000  # one create time per Arrow batch, not a clock read per row
        headers = batch.schema.get_field_index("headers")
        partitions = None
        columnar = topic_option is not None and (headers < 0 or batch.column(headers).null_count == n)
        if columnar:
            partitions = _partition_array(batch, topic_partitions)
            columnar = partitions is not False
        if columnar:
            assert topic_option is not None and partitions is not False
            _produce_columns(producer, batch, topic_option, partitions, timestamp)
        else:
            _produce_rows(producer, batch, topic_option, topic_partitions, timestamp)
        rows += n
    return rows


def _produce_columns(producer: Producer, batch: pa.RecordBatch, topic: str, partitions: np.ndarray | None,
                     timestamp: int) -> None:
    """The batch's rows, grouped by partition (stable, so each partition's rows keep their order)."""
    if partitions is None or partitions.min() == partitions.max():
        values = _binary(batch, "value")
        assert values is not None
        partition = None if partitions is None else int(partitions[0])
        _produce_run(producer, topic, values, _binary(batch, "key"), partition, timestamp)
        return
    order = np.argsort(partitions, kind="stable")
    ordered = partitions[order]
    cuts = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), len(ordered)]
    taken = batch.take(pa.array(order))
    values = _binary(taken, "value")
    assert values is not None
    keys = _binary(taken, "key")
    for start, stop in itertools.pairwise(cuts):
        _produce_run(producer, topic, values[start:stop], keys[start:stop] if keys is not None else None,
                     int(ordered[start]), timestamp)


def _produce_run(producer: Producer, topic: str, values: list[Any], keys: list[Any] | None,
                 partition: int | None, timestamp: int) -> None:
    done = producer.produce_batch(topic, values, keys, partition, timestamp)
    while done < len(values):  # the producer's queue is full: wait for deliveries, then the rest
        producer.poll(_BACKPRESSURE_WAIT)
        done += producer.produce_batch(topic, values[done:], keys[done:] if keys is not None else None, partition,
                                       timestamp)


def _produce_rows(producer: Producer, batch: pa.RecordBatch, topic_option: str | None,
                  topic_partitions: int | None, timestamp: int) -> None:
    produce = producer.produce
    values = _binary(batch, "value")
    assert values is not None
    keys = _binary(batch, "key") or itertools.repeat(None)
    partitions = _partitions(batch, topic_partitions if topic_option is not None else None)
    headers = _headers(batch)
    if topic_option is not None:
        topics: Iterable[str] = itertools.repeat(topic_option)
    else:
        listed = _column(batch, "topic")
        assert listed is not None
        if None in listed:
            raise ValueError("a row has a null 'topic' and no 'topic' option is set")
        topics = listed
    for topic, value, key, partition, hdrs in zip(topics, values, keys, partitions, headers, strict=False):
        try:
            produce(topic, value, key, partition, None, timestamp, hdrs)
        except BufferError:
            _produce_when_room(producer, topic, value, key, partition, hdrs, timestamp)


def _produce_when_room(producer: Producer, topic: str, value: Any, key: Any, partition: Any, headers: Any,
                       timestamp: int) -> None:
    while True:
        producer.poll(_BACKPRESSURE_WAIT)
        try:
            producer.produce(topic, value, key, partition, None, timestamp, headers)
            return
        except BufferError:
            continue


def first_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch] | None:
    """`batches` from its first non-empty batch on, or None when there is no row at all.

    A task with no rows never touches the broker: no transaction, no marker (an empty write is idempotent).
    """
    for batch in batches:
        if batch.num_rows:
            return itertools.chain((batch,), batches)
    return None
