"""Exactly-once checks for the sink tests: input written with confluent-kafka, output read back with it under
read_committed, and the verdict as data (duplicates, losses, strangers) so a failing test says what went wrong.

The reader is librdkafka, not our own client, so the sink is judged by an independent implementation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.integration.helpers import Out, ck_consume, ck_produce, create_topic


class Verdict(NamedTuple):
    count: int
    duplicates: dict[bytes, int]
    missing: list[bytes]
    unexpected: list[bytes]

    @property
    def exact(self) -> bool:
        return not self.duplicates and not self.missing and not self.unexpected


def write_input(bootstrap: str, topic: str, count: int, partitions: int = 2, pad: int = 0,
                replication_factor: int = 1) -> list[tuple[bytes, bytes]]:
    """`count` records (key k<i>, value v<i>|, then `pad` bytes) spread over the topic's partitions (created
    here), record i in partition i % partitions; returns the (key, value) pairs.

    Padding matters to fault tests: Spark moves rows between the JVM and Python workers through 64 KiB
    buffers, so a fault after a few small rows strikes before the sink has seen any of them.
    """
    create_topic(bootstrap, topic, partitions=partitions, replication_factor=replication_factor)
    filler = b"x" * pad
    outs = [Out(i % partitions, f"k{i}".encode(), f"v{i}|".encode() + filler) for i in range(count)]
    ck_produce(bootstrap, topic, outs)
    return [(o.key, o.value) for o in outs]


def read_values(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    recs = ck_consume(bootstrap, topic, dict.fromkeys(range(partitions), 0), **{"isolation.level": "read_committed"})
    return [r.value for r in recs]


def verdict(got: Iterable[bytes], expected: Sequence[bytes]) -> Verdict:
    counts = Counter(got)
    want = set(expected)
    assert len(want) == len(expected), "the expected values must be unique"
    return Verdict(
        count=sum(counts.values()),
        duplicates={v: c for v, c in counts.items() if c > 1},
        missing=sorted(want - set(counts)),
        unexpected=sorted(set(counts) - want),
    )


def assert_exactly_once(bootstrap: str, topic: str, partitions: int, expected: Sequence[bytes]) -> Verdict:
    v = verdict(read_values(bootstrap, topic, partitions), expected)
    assert v.exact, (f"{v.count} records: {len(v.duplicates)} duplicated (e.g. {list(v.duplicates.items())[:3]}), "
                     f"{len(v.missing)} missing (e.g. {v.missing[:3]}), {len(v.unexpected)} unexpected "
                     f"(e.g. {v.unexpected[:3]})")
    return v


def nothing_pending(bootstrap: str, topic: str, partitions: int) -> bool:
    """Whether every partition's last stable offset equals its high watermark (no transaction left open)."""
    return not pending_partitions(bootstrap, topic, partitions)


def pending_partitions(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """The partitions whose last stable offset is below the high watermark (an open transaction holds records)."""
    return [p for p in range(partitions)
            if _latest(bootstrap, topic, p, committed=True) != _latest(bootstrap, topic, p, committed=False)]


def _latest(bootstrap: str, topic: str, partition: int, *, committed: bool) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(topic, partition)
    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    futures = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level, request_timeout=10)
    return futures[tp].result(timeout=15).offset
