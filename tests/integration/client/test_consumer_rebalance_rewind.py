"""oncelog's consumer returned, from one consume() call, records of the assignment a rebalance just revoked and
then records of the new one, serving on_revoke/on_assign in the middle of the call.

Found by the cluster fault run (`python -m tests.faults.runner --cluster --runs 6 --seed 1`, run 4: consumer
workload, oncelog client, seed 4; member-2's history, partition grp-2): the member committed 2949, the group
rebalanced (revoke [2] at 210.433, assign [2] at 210.486), and the next consume() returned offsets 2949..2968
followed by 2949, 2950, ... again. consume() had taken the buffered 2949..2968 of the old assignment into its
batch, then (batch not full) served the rebalance events inside the same call (on_revoke, on_assign: new positions
from the committed offset 2949) and went on filling the batch from the new assignment. The application processed
records of a partition after on_revoke said it gave it up, and saw them twice within what it believed was one
assignment. The rule now (librdkafka's): a batch never spans a rebalance; a call that has records returns them when
a rebalance is pending, and the next call serves the callbacks before it collects anything.

The first two tests force the race with a real second member: the first member's fetch buffer holds the rest of
what was written, a consume() call asking for more than that has taken it into its batch (its position says so)
and waits; only then does the second member join. The third is the fault run's shape: three members keep their
partitions while a fourth joins and leaves, and between two on_assign calls a member's offsets of a partition must
strictly increase.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from confluent_kafka import Producer as CKProducer
from tests.integration.helpers import Out, ck_produce, create_topic

from oncelog.client import AsyncConsumer, Consumer, TopicPartition

PARTITIONS = 3

GROUP_CONF = {"enable.auto.commit": False, "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
              "heartbeat.interval.ms": 200, "fetch.wait.max.ms": 100}
PER_PARTITION = 50  # records in each of two partitions, all written before the first member reads
# Bound for the consume() call the rebalance falls into: the second member's join reaches the first at its next
# heartbeat and the rejoin takes a few round trips; several session timeouts cover that on loaded cores.
CALL_TIMEOUT = 5 * GROUP_CONF["session.timeout.ms"] / 1000
# That call can have at most the rest of the first partition and all of the second before the rebalance; it asks
# for more, so only the pending rebalance (or, before the fix, records read again after it) ends it early.
BATCH = 2 * PER_PARTITION


class Trace:
    """What the application saw, in order: rebalance callbacks and records, each with its consume() call number."""

    def __init__(self) -> None:
        self.call = 0
        self.events: list[tuple[int, str, Any]] = []  # (call, "assign" | "revoke" | "record", partitions | (p, o))

    def on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.events.append((self.call, "assign", sorted(tp.partition for tp in partitions)))

    def on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.events.append((self.call, "revoke", sorted(tp.partition for tp in partitions)))

    def begin(self) -> int:
        self.call += 1
        return self.call

    def got(self, call: int, messages: list[Any]) -> list[tuple[int, int]]:
        out = []
        for m in messages:
            assert m.error() is None, m.error()
            out.append((m.partition(), m.offset()))
            self.events.append((call, "record", out[-1]))
        return out

    def after(self, call: int) -> list[tuple[str, Any]]:
        return [(kind, what) for c, kind, what in self.events if c > call]

    def reassigned_and_read(self, call: int) -> bool:
        """After `call`: on_assign ran and the kept partition was read to its end."""
        later = self.after(call)
        kinds = [kind for kind, _ in later]
        return "assign" in kinds and later[-1] == ("record", (later[kinds.index("assign")][1][0], PER_PARTITION - 1))


def _two_partitions_written(broker_factory: Any, topic: str) -> tuple[str, str]:
    broker = broker_factory({"group.initial.rebalance.delay.ms": 0})
    create_topic(broker.bootstrap, topic, 2)
    ck_produce(broker.bootstrap, topic, [Out(i % 2, None, b"v%d" % i) for i in range(2 * PER_PARTITION)])
    return broker.bootstrap, f"g-{uuid.uuid4().hex[:8]}"


def _check_batch(trace: Trace, first: tuple[int, int], call: int, batch: list[tuple[int, int]], took: float) -> None:
    """The call the rebalance fell into ran no callback and returned old-assignment records only, in order."""
    inside = [(kind, what) for c, kind, what in trace.events if c == call and kind != "record"]
    assert inside == [], f"rebalance callbacks ran inside the consume() call that returned {len(batch)} " \
                         f"records: {inside}; the batch: {batch}"
    assert took < CALL_TIMEOUT and len(batch) < BATCH, (took, len(batch))  # ended by the pending rebalance
    x, committed = first[0], first[1] + 1
    assert [o for p, o in batch if p == x] == list(range(committed, PER_PARTITION))
    other = [o for p, o in batch if p != x]
    assert other == list(range(len(other)))


def _check_after(trace: Trace, first: tuple[int, int], call: int) -> None:
    """The next call starts with on_revoke (buffered records of the old assignment are dropped), then on_assign; the
    kept partition is read forward from its committed offset (the first partition's, or 0 for the other)."""
    later = trace.after(call)
    assert later[0] == ("revoke", [0, 1]), later[:3]
    assert later[1][0] == "assign" and len(later[1][1]) == 1, later[:3]
    kept = later[1][1][0]
    rest = later[2:]
    assert {kind for kind, _ in rest} == {"record"} and {p for _, (p, _) in rest} == {kept}, rest[:5]
    start = first[1] + 1 if kept == first[0] else 0
    assert [o for _, (_, o) in rest] == list(range(start, PER_PARTITION))


@pytest.mark.timeout(180)
def test_a_batch_never_spans_a_rebalance(broker_factory, topic_name):
    bootstrap, group = _two_partitions_written(broker_factory, topic_name)
    conf = {"bootstrap.servers": bootstrap, "group.id": group, **GROUP_CONF}
    trace = Trace()
    a, b = Consumer(conf), Consumer(conf)
    try:
        a.subscribe([topic_name], on_assign=trace.on_assign, on_revoke=trace.on_revoke)
        deadline = time.monotonic() + CALL_TIMEOUT
        first: list[tuple[int, int]] = []
        while not first:
            assert time.monotonic() < deadline, "the first member never got a record"
            first = trace.got(trace.begin(), a.consume(1, 0.5))
        a.commit(offsets=[TopicPartition(topic_name, first[0][0], first[0][1] + 1)], asynchronous=False)
        x = TopicPartition(topic_name, first[0][0])
        with ThreadPoolExecutor(1) as pool:
            call = trace.begin()
            started = time.monotonic()
            pending = pool.submit(a.consume, BATCH, CALL_TIMEOUT)
            while a.position([x])[0].offset != PER_PARTITION:  # the call has taken the rest of x into its batch
                assert time.monotonic() < deadline and not pending.done(), a.position([x])
                time.sleep(0.01)
            b.subscribe([topic_name])
            batch = trace.got(call, pending.result(CALL_TIMEOUT + 30))
            took = time.monotonic() - started
        _check_batch(trace, first[0], call, batch, took)
        deadline = time.monotonic() + CALL_TIMEOUT
        while not trace.reassigned_and_read(call):
            assert time.monotonic() < deadline, trace.after(call)[-5:]
            trace.got(trace.begin(), a.consume(BATCH, 0.2))
        _check_after(trace, first[0], call)
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(180)
def test_an_async_batch_never_spans_a_rebalance(broker_factory, topic_name):
    bootstrap, group = _two_partitions_written(broker_factory, topic_name)
    conf = {"bootstrap.servers": bootstrap, "group.id": group, **GROUP_CONF}
    trace = Trace()

    async def main() -> None:
        a, b = AsyncConsumer(conf), AsyncConsumer(conf)
        try:
            await a.subscribe([topic_name], on_assign=trace.on_assign, on_revoke=trace.on_revoke)
            deadline = time.monotonic() + CALL_TIMEOUT
            first: list[tuple[int, int]] = []
            while not first:
                assert time.monotonic() < deadline, "the first member never got a record"
                first = trace.got(trace.begin(), await a.consume(1, 0.5))
            await a.commit(offsets=[TopicPartition(topic_name, first[0][0], first[0][1] + 1)], asynchronous=False)
            x = TopicPartition(topic_name, first[0][0])
            call = trace.begin()
            started = time.monotonic()
            pending = asyncio.ensure_future(a.consume(BATCH, CALL_TIMEOUT))
            while a.position([x])[0].offset != PER_PARTITION:  # the call has taken the rest of x into its batch
                assert time.monotonic() < deadline and not pending.done(), a.position([x])
                await asyncio.sleep(0.01)
            await b.subscribe([topic_name])
            batch = trace.got(call, await asyncio.wait_for(pending, CALL_TIMEOUT + 30))
            took = time.monotonic() - started
            _check_batch(trace, first[0], call, batch, took)
            deadline = time.monotonic() + CALL_TIMEOUT
            while not trace.reassigned_and_read(call):
                assert time.monotonic() < deadline, trace.after(call)[-5:]
                trace.got(trace.begin(), await a.consume(BATCH, 0.2))
            _check_after(trace, first[0], call)
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())


@pytest.mark.timeout(180)
def test_a_partition_kept_across_rebalances_is_read_forward_within_each_assignment(broker_factory, topic_name):
    broker = broker_factory({"group.initial.rebalance.delay.ms": 0})
    create_topic(broker.bootstrap, topic_name, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    stop_producing, stop_members = threading.Event(), threading.Event()
    rewinds: list[tuple[str, int, int, int, int]] = []
    errors: list[BaseException] = []

    def produce() -> None:
        p = CKProducer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        i = 0
        while not stop_producing.is_set():
            p.produce(topic_name, str(i).encode(), partition=i % PARTITIONS)
            i += 1
            if i % 50 == 0:
                p.poll(0)
                time.sleep(0.05)
        p.flush(30)

    def member(name: str, lifetime: float) -> None:
        try:
            session = {"n": 0}

            def on_assign(consumer, partitions):
                session["n"] += 1

            c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False,
                          "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                          "heartbeat.interval.ms": 500})
            c.subscribe([topic_name], on_assign=on_assign)
            last: dict[tuple[int, int], int] = {}
            end = time.monotonic() + lifetime
            while not stop_members.is_set() and time.monotonic() < end:
                ends = {}
                for m in c.consume(50, 0.2):
                    if m.error():
                        continue
                    key = (session["n"], m.partition())
                    if key in last and m.offset() <= last[key]:
                        rewinds.append((name, session["n"], m.partition(), last[key], m.offset()))
                    last[key] = m.offset()
                    ends[m.partition()] = m.offset() + 1
                if ends:
                    try:
                        c.commit(offsets=[TopicPartition(topic_name, p, o) for p, o in ends.items()],
                                 asynchronous=False)
                    except Exception:  # noqa: BLE001 - a commit racing a rebalance may fail: not the point
                        pass
            c.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    members = [threading.Thread(target=member, args=(name, 120)) for name in "ABC"]
    try:
        for t in members:
            t.start()
        time.sleep(3)
        for k in range(3):  # each join and each leave is a rebalance in which A, B, C may keep their partitions
            joiner = threading.Thread(target=member, args=(f"D{k}", 1.5))
            joiner.start()
            joiner.join()
            time.sleep(1.0)
    finally:
        stop_members.set()
        for t in members:
            t.join(60)
        stop_producing.set()
        producer.join(60)
    assert not errors, errors
    assert not rewinds, f"{len(rewinds)} records handed out again within one assignment, e.g. {rewinds[:3]}"
