"""Offsets of the oncelog source: how positions are written down, resolved and cut into per-partition ranges.

A source offset is one JSON object `{"topic": {"partition": next offset}}`, the shape Spark's Kafka source
writes to its checkpoint. Everything here is a pure function of offsets the driver already has, because Spark
replays a micro-batch from the offsets in its write-ahead log: the ranges of a replayed batch must be exactly
those of the first run, or a sink keyed on (batch, partition) would see different data. That is also why a
partition that appears while a query runs starts at offset 0, not at "whatever is earliest now": if retention
has already removed its head, the reader meets that as data loss (`failOnDataLoss`), as Spark's Kafka source
reports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from oncelog.spark.options import EARLIEST, LATEST, OffsetSpec, OptionError

TP = tuple[str, int]
Offsets = dict[TP, int]


class DataLoss(RuntimeError):
    """Offsets the query needs are gone (deleted by retention or DeleteRecords, or the partition vanished).

    Raised only with failOnDataLoss=true; the message says what was lost and how to go on without it.
    """


class OffsetRange(NamedTuple):
    """Records [start, end) of one partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int


def to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """The checkpoint form: topics and partitions sorted, partitions as strings (JSON object keys)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def from_json(data: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {(topic, int(partition)): int(offset) for topic, parts in data.items() for partition, offset in parts.items()}


def resolve(spec: OffsetSpec, partitions: Iterable[TP], earliest: Mapping[TP, int], latest: Mapping[TP, int],
            name: str) -> Offsets:
    """Concrete offsets for every partition from "earliest", "latest" or per-partition JSON.

    Per-partition JSON must name every partition read, as Spark's Kafka source requires, so a partition is
    never silently read from a default the user did not choose.
    """
    partitions = sorted(partitions)
    if spec == "earliest":
        return {tp: earliest[tp] for tp in partitions}
    if spec == "latest":
        return {tp: latest[tp] for tp in partitions}
    assert isinstance(spec, dict)
    given = {(topic, partition): offset for topic, parts in spec.items() for partition, offset in parts.items()}
    missing = [tp for tp in partitions if tp not in given]
    unknown = sorted(set(given) - set(partitions))
    if missing or unknown:
        detail = []
        if missing:
            detail.append("missing " + ", ".join(f"{t}-{p}" for t, p in missing))
        if unknown:
            detail.append("not read by this query " + ", ".join(f"{t}-{p}" for t, p in unknown))
        raise OptionError(f"option '{name}' must give an offset for exactly the partitions read: "
                          + "; ".join(detail))
    out = {}
    for tp in partitions:
        offset = given[tp]
        out[tp] = earliest[tp] if offset == EARLIEST else latest[tp] if offset == LATEST else offset
    return out


def limit(start: Mapping[TP, int], latest: Mapping[TP, int], max_offsets: int | None) -> Offsets:
    """The end of the next micro-batch: `latest`, or at most `max_offsets` offsets past `start` in all.

    The budget is shared in proportion to each partition's backlog (Spark's Kafka source does the same), and
    a partition with a backlog always advances by at least one offset, so a query never stalls. Partitions
    not in `start` are new and start at 0. Offsets count control records and aborted data too, so a batch can
    hold fewer rows than the limit.
    """
    if max_offsets is None:
        return dict(latest)
    backlog = {tp: max(0, end - start.get(tp, 0)) for tp, end in latest.items()}
    total = sum(backlog.values())
    if total <= max_offsets:
        return dict(latest)
    out = {}
    for tp, end in latest.items():
        size = backlog[tp]
        if size == 0:
            out[tp] = end
            continue
        share = max(1, max_offsets * size // total)
        out[tp] = min(end, start.get(tp, 0) + share)
    return out


def plan(start: Mapping[TP, int], end: Mapping[TP, int], *, fail_on_data_loss: bool) -> list[OffsetRange]:
    """The ranges to read between two source offsets, sorted by (topic, partition); empty ones left out.

    An end below its start means the partition was truncated or recreated under the query: data loss.
    """
    lost = [(tp, start[tp], offset) for tp, offset in end.items() if tp in start and offset < start[tp]]
    if lost and fail_on_data_loss:
        detail = ", ".join(f"{t}-{p} (was at {s}, now ends at {e})" for (t, p), s, e in lost)
        raise DataLoss(f"partitions went back in offsets, their data is gone: {detail}. Set failOnDataLoss=false "
                       "to continue from their current end.")
    ranges = []
    for (topic, partition), stop in sorted(end.items()):
        begin = start.get((topic, partition), 0)
        if begin < stop:
            ranges.append(OffsetRange(topic, partition, begin, stop))
    return ranges


def vanished(start: Mapping[TP, int], current: Iterable[TP]) -> list[TP]:
    """Partitions the query was reading that no longer exist (their topic was deleted)."""
    now = set(current)
    return sorted(tp for tp in start if tp not in now)
