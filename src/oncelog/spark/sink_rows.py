"""Rows to records: the sink's input columns, checked on the driver, and turned into produce() calls in a task.

The columns are Spark's Kafka sink's: `value` (string or binary, required), `key` (string or binary),
`topic` (string; the `topic` option overrides it), `partition` (int; else the key's murmur2 partition, or a
sticky one for keyless records) and `headers` (array<struct<key: string, value: binary>>). Other columns are
ignored. A task gets Arrow record batches; each column is converted to Python objects by Arrow's C code in one
call, so the only per-row Python work left is the producer's own `produce()`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from oncelog.client import Producer
from oncelog.spark.key_partitions import partitions_for_keys
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
        computed = partitions_for_keys(batch.column(key_index), topic_partitions)
        if computed is not None:
            return computed
    return itertools.repeat(None)


def produce_batches(producer: Producer, batches: Iterable[pa.RecordBatch], topic_option: str | None,
                    topic_partitions: int | None = None) -> int:
    """Produce every row of `batches` (inside the caller's open transaction); returns the row count.

    `topic_partitions` is the partition count of `topic_option` when known: keys are then hashed per column.
    """
    rows = 0
    produce = producer.produce
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
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
        timestamp = time.time_ns() // 1_000_000  # one create time per Arrow batch, not a clock read per row
        for topic, value, key, partition, hdrs in zip(topics, values, keys, partitions, headers, strict=False):
            try:
                produce(topic, value, key, partition, None, timestamp, hdrs)
            except BufferError:
                _produce_when_room(producer, topic, value, key, partition, hdrs)
        rows += n
    return rows


def _produce_when_room(producer: Producer, topic: str, value: Any, key: Any, partition: Any, headers: Any) -> None:
    while True:
        producer.poll(_BACKPRESSURE_WAIT)
        try:
            producer.produce(topic, value, key, partition, headers=headers)
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
