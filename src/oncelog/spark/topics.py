"""Which partitions a query reads and where they begin and end: what the driver asks the broker while planning.

Planning runs in Python processes on the driver (a planning worker for batch reads, one long-lived source runner
for a streaming query), each asking again every micro-batch, so the admin client is kept in the client's
per-process cache and its connections outlive a batch. "latest" under read_committed is the last stable offset:
a micro-batch never ends inside an open transaction, so a replay re-reads exactly the records the first run did.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from oncelog.client.admin import Admin
from oncelog.client.config import ClientConfig
from oncelog.client.runtime import cached
from oncelog.spark.offsets import TP, Offsets
from oncelog.spark.options import LATEST, ByTimestamp, OffsetSpec, OptionError, ReadOptions, admin_settings


def admin_for(options: ReadOptions) -> Admin:
    """The process's admin client for these options' cluster and client settings."""
    conf = admin_settings(options.client, options.bootstrap_servers, "consumer")
    key = ("oncelog.spark.admin", tuple(sorted(conf.items())))
    return cached(key, lambda: Admin(ClientConfig(conf, "admin")))


def partitions(options: ReadOptions, *, require_topics: bool) -> list[TP]:
    """The partitions the query reads now, sorted.

    With `subscribe`, a topic that does not exist yet has no partitions: a streaming query waits for it, a
    batch query (`require_topics`) fails with a message naming it. With `subscribePattern`, the topics in whose
    name the expression is found (internal topics left out), exactly as Spark's Kafka source selects them
    (`Regex.findFirstIn`, not the Java consumer's whole-name match: anchor it for that): a topic created later
    joins at the next micro-batch and is read from its start. With `assign`, every named partition must exist.
    """
    admin = admin_for(options)
    existing = {t.name: t.partitions for t in admin.list_topics()}
    if options.pattern is not None:
        found_in = re.compile(options.pattern).search
        return sorted((t, p) for t, count in existing.items() if found_in(t) for p in range(count))
    if options.topics is not None:
        missing = [t for t in options.topics if t not in existing]
        if missing and require_topics:
            raise OptionError(f"option 'subscribe': no such topic: {', '.join(missing)}")
        return sorted((t, p) for t in options.topics if t in existing for p in range(existing[t]))
    assert options.assigned is not None
    absent = [f"{t}-{p}" for t, ps in options.assigned.items() for p in ps if p >= existing.get(t, 0)]
    if absent:
        raise OptionError(f"option 'assign': no such partition: {', '.join(absent)}")
    return sorted((t, p) for t, ps in options.assigned.items() for p in ps)


def offsets(options: ReadOptions, tps: Iterable[TP], which: str) -> Offsets:
    """'earliest' (log start offsets) or 'latest' (last stable offsets under read_committed, else high
    watermarks) of `tps`."""
    tps = list(tps)
    if not tps:
        return {}
    listed = admin_for(options).list_offsets({tp: which for tp in tps}, isolation=options.isolation_level)
    return {(tp.topic, tp.partition): answer.offset for tp, answer in listed.items()}


def at_times(options: ReadOptions, spec: OffsetSpec, tps: Iterable[TP], *, starting: bool) -> OffsetSpec:
    """A position by record time made concrete for the partitions `tps`; any other spec is returned as it is.

    Each partition gets the first offset whose record timestamp is at or after its timestamp, looked up under
    the query's isolation level (the broker answers "none" past the last stable offset). Where there is none,
    an ending position is the partition's end (Spark's rule); a starting one fails the query, or with
    startingOffsetsByTimestampStrategy=latest starts at the end. Per-partition timestamps must name exactly the
    partitions read: names of others are passed on for `offsets.resolve` to refuse, as with offsets JSON.
    """
    if not isinstance(spec, ByTimestamp):
        return spec
    tps = list(tps)
    if spec.everywhere is not None:
        times = {tp: spec.everywhere for tp in tps}
        concrete: dict[str, dict[int, int]] = {}
    else:
        assert spec.per_partition is not None
        given = {(t, p): ts for t, parts in spec.per_partition.items() for p, ts in parts.items()}
        read = set(tps)
        times = {tp: ts for tp, ts in given.items() if tp in read}
        concrete = {t: {p: LATEST for p in parts} for t, parts in spec.per_partition.items()}
    listed = admin_for(options).list_offsets(times, isolation=options.isolation_level) if times else {}
    none_found = []
    for tp, answer in listed.items():
        offset = answer.offset
        if offset < 0:
            if starting and options.missing_timestamp == "error":
                none_found.append(f"{tp.topic}-{tp.partition} (timestamp {times[(tp.topic, tp.partition)]})")
            offset = LATEST
        concrete.setdefault(tp.topic, {})[tp.partition] = offset
    if none_found:
        raise OptionError(f"option '{spec.option}': no record at or after the timestamp in "
                          f"{', '.join(sorted(none_found))}; set startingOffsetsByTimestampStrategy=latest to start "
                          "such partitions at their end")
    return concrete
