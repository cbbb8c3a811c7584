"""The `oncelog` PySpark data source: batch and streaming reads of oncelog (Kafka-protocol) topics.

`spark.read.format("oncelog")` and `spark.readStream.format("oncelog")` take Spark's Kafka source options
(see `options.py`) and give its schema (see `schema.py`). Streaming offsets are per-partition next offsets;
each micro-batch ends at the last stable offset (read_committed) seen when it was planned, optionally cut by
`maxOffsetsPerTrigger`; Trigger.AvailableNow reads up to the offsets seen when the query started and stops.

Where each method runs (research/spark.md §3): `partitions` / offset methods in Python processes on the driver,
`read` in executor Python workers; the reader object travels between them pickled, so it holds only options.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from oncelog.spark import offsets as offs
from oncelog.spark import topics
from oncelog.spark.fetch import read_range
from oncelog.spark.options import ByTimestamp, OffsetSpec, OptionError, ReadOptions, parse_read_options
from oncelog.spark.schema import spark_ddl
from oncelog.spark.sink import batch_writer, stream_writer


class RangePartition(InputPartition):
    """One Spark input partition: records [start, end) of one topic partition."""

    def __init__(self, rng: offs.OffsetRange) -> None:
        super().__init__(tuple(rng))
        self.range = rng

    def __repr__(self) -> str:
        r = self.range
        return f"RangePartition({r.topic}-{r.partition} [{r.start}, {r.end}))"


def _option_name(spec: OffsetSpec, offsets_option: str) -> str:
    """The option a position came from, for errors: a position by time names its timestamp option."""
    return spec.option if isinstance(spec, ByTimestamp) else offsets_option


def _read(partition: InputPartition, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """One input partition's rows. When planning finds nothing to read (an empty topic, every start at its
    end), PySpark still runs one task with a placeholder `InputPartition(None)`: it has no rows."""
    if isinstance(partition, RangePartition):
        yield from read_range(partition.range, options)


def _input_partitions(ranges: Sequence[offs.OffsetRange]) -> list[InputPartition]:
    return [RangePartition(r) for r in ranges]


class OncelogDataSource(DataSource):
    """Format "oncelog"; register with `spark.dataSource.register(OncelogDataSource)` or `oncelog.spark.register`.

    Batch writes take `.mode("append")` only: Spark refuses its default mode (ErrorIfExists) and Ignore for every
    Python data source before `writer` is called, and `writer` refuses Overwrite as Spark's Kafka sink does."""

    @classmethod
    def name(cls) -> str:
        return "oncelog"

    def schema(self) -> str:
        include = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return spark_ddl(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return OncelogBatchReader(parse_read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return OncelogStreamReader(parse_read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return stream_writer(self.options, schema)


class OncelogBatchReader(DataSourceReader):
    """A batch read: startingOffsets (default earliest) to endingOffsets (default latest), planned once."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        tps = topics.partitions(o, require_topics=True)
        earliest = topics.offsets(o, tps, "earliest")
        latest = topics.offsets(o, tps, "latest")
        start = offs.resolve(topics.at_times(o, o.starting, tps, starting=True), tps, earliest, latest,
                             _option_name(o.starting, "startingOffsets"))
        end = offs.resolve(topics.at_times(o, o.ending, tps, starting=False), tps, earliest, latest,
                           _option_name(o.ending, "endingOffsets"))
        behind = {tp: s for tp, s in start.items() if s < earliest[tp]}
        if behind and o.fail_on_data_loss:
            detail = ", ".join(f"{t}-{p} starts at {earliest[(t, p)]}, not {s}" for (t, p), s in behind.items())
            raise offs.DataLoss(f"startingOffsets are below the log start: {detail}. Set failOnDataLoss=false "
                                "to start from the log start.")
        start.update({tp: earliest[tp] for tp in behind})
        ahead = {tp: e for tp, e in end.items() if e > latest[tp]}
        if ahead:
            detail = ", ".join(f"{t}-{p} ends at {latest[(t, p)]}, not {e}" for (t, p), e in ahead.items())
            raise OptionError(f"endingOffsets are beyond the last {'stable ' if o.read_committed else ''}offset: "
                              f"{detail}")
        inverted = {tp for tp in start if start[tp] > end[tp]}
        if inverted:
            detail = ", ".join(f"{t}-{p} [{start[(t, p)]}, {end[(t, p)]})" for t, p in sorted(inverted))
            raise OptionError(f"startingOffsets are after endingOffsets: {detail}")
        return _input_partitions(offs.plan(start, end, fail_on_data_loss=o.fail_on_data_loss))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read(partition, self.options)


class OncelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read. Offsets: {"topic": {"partition": next offset}}, as Spark's Kafka source writes them."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._available_now: offs.Offsets | None = None
        self._latest: offs.Offsets | None = None

    def initialOffset(self) -> dict:
        o = self.options
        tps = topics.partitions(o, require_topics=False)
        earliest = topics.offsets(o, tps, "earliest")
        latest = topics.offsets(o, tps, "latest")
        return offs.to_json(offs.resolve(topics.at_times(o, o.starting, tps, starting=True), tps, earliest, latest,
                                         _option_name(o.starting, "startingOffsets")))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._current_latest()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = offs.from_json(start)
        latest = self._current_latest()
        self._latest = latest
        gone = offs.vanished(begin, latest)
        if gone and self.options.fail_on_data_loss:
            raise offs.DataLoss("partitions the query reads no longer exist: "
                                + ", ".join(f"{t}-{p}" for t, p in gone)
                                + ". Set failOnDataLoss=false to go on without them.")
        target = latest if self._available_now is None else self._available_now_target(begin, latest)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return offs.to_json(offs.limit(begin, target, max_rows))

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else offs.to_json(self._latest)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return _input_partitions(offs.plan(offs.from_json(start), offs.from_json(end),
                                           fail_on_data_loss=self.options.fail_on_data_loss))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read(partition, self.options)

    def commit(self, end: dict) -> None:
        """Nothing to do: progress lives in Spark's checkpoint, not in consumer-group offsets."""

    def _available_now_target(self, begin: offs.Offsets, latest: offs.Offsets) -> offs.Offsets:
        """Trigger.AvailableNow: nothing later than what existed when the query started; partitions created
        since then wait for the next run."""
        snapshot = self._available_now
        assert snapshot is not None
        target = {}
        for tp, offset in latest.items():
            if tp in snapshot:
                target[tp] = min(offset, max(snapshot[tp], begin.get(tp, 0)))
            elif tp in begin:
                target[tp] = begin[tp]
        return target

    def _current_latest(self) -> offs.Offsets:
        o = self.options
        return topics.offsets(o, topics.partitions(o, require_topics=False), "latest")
