"""The rows the oncelog source produces: Spark's Kafka source schema, built as Arrow columns per fetched chunk.

The schema is exactly `format("kafka")`'s (key, value, topic, partition, offset, timestamp, timestampType, and
headers when includeHeaders=true), so a query can switch formats without touching its transformations.
Rows reach Spark as `pyarrow.RecordBatch`es: research/spark.md measured Arrow 1.5-2.5x faster than Python
tuples through the data source API. The client's decoder already hands out one plain tuple per record
(offset, timestamp, key, value[, headers]); here they are transposed into columns by C code (`map` with
`itemgetter`; `zip(*rows)` is ten times slower on large chunks), and
everything that is the same for a whole chunk (topic, partition, usually the timestamp type) is one repeated
value, not a per-record Python object.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter, itemgetter
from typing import Any

import pyarrow as pa

DDL = ("key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
       "timestampType int")
HEADERS_DDL = "headers array<struct<key: string, value: binary>>"

# Spark's timestampType column uses Kafka's numbering (0 CreateTime, 1 LogAppendTime); the client's Message
# uses confluent-kafka's (1, 2).
_TIMESTAMP_TYPE_OFFSET = 1
_timestamp_type = attrgetter("_timestamp_type")
_OFFSET, _TIMESTAMP, _KEY, _VALUE, _HEADERS = (itemgetter(i) for i in range(5))

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
_BASE_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]


def spark_ddl(include_headers: bool) -> str:
    return f"{DDL}, {HEADERS_DDL}" if include_headers else DDL


def arrow_schema(include_headers: bool) -> pa.Schema:
    return pa.schema(_BASE_FIELDS + ([pa.field("headers", HEADER_TYPE)] if include_headers else []))


def to_record_batch(topic: str, partition: int, records: Sequence[tuple], kinds: Sequence[tuple[int, Any]],
                    include_headers: bool) -> pa.RecordBatch:
    """One Arrow batch from one partition's decoded records.

    `records` and `kinds` are the client decoder's: (offset, timestamp, key, value[, headers]) tuples, and
    (first index, Message class) runs over them, the class carrying what a whole run shares (timestamp type,
    whether its tuples end with headers).
    """
    n = len(records)
    schema = arrow_schema(include_headers)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=schema)
    bounds = [start for start, _ in kinds[1:]] + [n]
    runs = [(start, end, cls) for (start, cls), end in zip(kinds, bounds, strict=True)]
    if len(runs) == 1:
        timestamp_types = _repeat(_timestamp_type(runs[0][2]) - _TIMESTAMP_TYPE_OFFSET, n)
    else:  # the topic's timestamp type (or the presence of headers) changed inside this chunk
        timestamp_types = pa.concat_arrays([_repeat(_timestamp_type(cls) - _TIMESTAMP_TYPE_OFFSET, end - start)
                                            for start, end, cls in runs])
    columns = [
        pa.array(list(map(_KEY, records)), pa.binary()),
        pa.array(list(map(_VALUE, records)), pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(list(map(_OFFSET, records)), pa.int64()),
        pa.array(list(map(_TIMESTAMP, records)), pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(
            pa.timestamp("us", tz="UTC")),
        timestamp_types,
    ]
    if include_headers:
        # Spark's Kafka source gives null, not an empty array, for a record without headers.
        headers: list = []
        for start, end, cls in runs:
            if cls._has_headers:
                headers += [h or None for h in map(_HEADERS, records[start:end])]
            else:
                headers += [None] * (end - start)
        columns.append(pa.array(headers, HEADER_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _repeat(value: int, count: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.int32()), count)
