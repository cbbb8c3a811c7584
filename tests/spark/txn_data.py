"""Transactional test data written with confluent-kafka (librdkafka), the way a real producer writes it.

Spark readers of oncelog topics are judged against what a transactional producer committed: each helper returns
the committed records with the offsets the broker acknowledged, so a test can compare a reader's output exactly
(contents, partitions, offsets, headers; nothing aborted, nothing missing).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Producer

from tests.integration.helpers import Out, Rec, norm_headers


def transactional_producer(bootstrap: str, **conf: Any) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"spark-test-{uuid.uuid4().hex[:12]}",
                         "linger.ms": 5, **conf})
    producer.init_transactions(30)
    return producer


def produce_in_transaction(producer: Producer, topic: str, outs: Sequence[Out]) -> list[Rec]:
    """Begin a transaction, produce `outs` and wait for every acknowledgement; the transaction stays open."""
    acked: list[Any] = [None] * len(outs)

    def report(i: int):
        def cb(err: Any, msg: Any) -> None:
            acked[i] = err if err is not None else (msg.partition(), msg.offset())
        return cb

    producer.begin_transaction()
    for i, out in enumerate(outs):
        producer.produce(topic, key=out.key, value=out.value, partition=out.partition,
                         headers=list(out.headers) or None, timestamp=out.timestamp or 0, on_delivery=report(i))
    assert producer.flush(30) == 0, "records still in flight after 30 s"
    failed = [a for a in acked if not isinstance(a, tuple)]
    assert not failed, f"delivery failed: {failed[:3]}"
    return [Rec(p, o, out.key, out.value, norm_headers(out.headers or None)) for (p, o), out in zip(acked, outs,
                                                                                                      strict=True)]


def write_transactions(bootstrap: str, topic: str, plan: Sequence[tuple[str, Sequence[Out]]],
                       **conf: Any) -> list[Rec]:
    """Run each (`"commit"` | `"abort"`, records) step as one transaction; return the committed records in
    (partition, offset) order. `conf`: more producer settings (e.g. compression.type)."""
    producer = transactional_producer(bootstrap, **conf)
    committed: list[Rec] = []
    for outcome, outs in plan:
        recs = produce_in_transaction(producer, topic, outs)
        if outcome == "commit":
            producer.commit_transaction(30)
            committed += recs
        elif outcome == "abort":
            producer.abort_transaction(30)
        else:
            raise ValueError(f"unknown outcome {outcome!r}")
    return sorted(committed, key=lambda r: (r.partition, r.offset))


def records(tag: str, count: int, partitions: int, with_headers: bool = False) -> list[Out]:
    """`count` keyed records spread round-robin over `partitions`; values name the tag so aborted data is visible."""
    outs = []
    for i in range(count):
        headers = (("tag", tag.encode()), ("i", str(i).encode())) if with_headers else ()
        outs.append(Out(key=f"{tag}-k{i}".encode(), value=f"{tag}-v{i}".encode() * 3, partition=i % partitions,
                        headers=headers))
    return outs


def timed_records(topic_times: dict[int, Sequence[int]]) -> list[Out]:
    """One record per (partition, timestamp in ms), values naming both, for reads by time."""
    return [Out(partition=p, key=None, value=f"p{p}-t{ts}".encode(), timestamp=ts)
            for p, times in topic_times.items() for ts in times]
