"""Consumer groups with our consumer (classic protocol, eager rebalancing): two of ours split the
partitions, ours and a librdkafka member share a group (each assignor, either one leading), every
record is consumed exactly once, and the survivor takes over when a member leaves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer as CKConsumer
from tests.integration.helpers import Out, ck_produce, create_topic

from oncelog.client.consumer.consumer import Consumer
from oncelog.client.types import TopicPartition

PARTITIONS = 4
Seen = list[tuple[int, int]]  # (partition, offset)


def ours(bootstrap: str, group: str, **conf: Any) -> Consumer:
    base = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100, "heartbeat.interval.ms": 200, "session.timeout.ms": 6000,
            "auto.commit.interval.ms": 200}
    base.update(conf)
    return Consumer(base)


def theirs(bootstrap: str, group: str, **conf: Any) -> CKConsumer:
    base = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100, "heartbeat.interval.ms": 200, "session.timeout.ms": 6000,
            "auto.commit.interval.ms": 200}
    base.update(conf)
    return CKConsumer(base)


def produce(bootstrap: str, topic: str, start: int, n: int) -> None:
    ck_produce(bootstrap, topic, [Out(i % PARTITIONS, None, b"v%d" % i) for i in range(start, start + n)])


def drain(members: dict[str, Any], seen: dict[str, Seen], until: Callable[[], bool], timeout: float = 40.0) -> None:
    """Poll every member in turn (short polls, one thread) until `until()`."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"timed out; seen so far {({k: len(v) for k, v in seen.items()})}"
        for name, c in members.items():
            m = c.poll(0.05)
            if m is None:
                continue
            assert m.error() is None, f"{name}: {m.error()}"
            seen[name].append((m.partition(), m.offset()))


def wait_assigned(members: dict[str, Any], want: Callable[[dict[str, set[int]]], bool],
                  seen: dict[str, Seen], timeout: float = 40.0) -> dict[str, set[int]]:
    deadline = time.monotonic() + timeout
    while True:
        for name, c in members.items():
            m = c.poll(0.05)
            if m is not None and m.error() is None:
                seen[name].append((m.partition(), m.offset()))
        got = {name: {tp.partition for tp in c.assignment()} for name, c in members.items()}
        if want(got):
            return got
        assert time.monotonic() < deadline, f"assignment never settled: {got}"


def split_evenly(got: dict[str, set[int]]) -> bool:
    parts = list(got.values())
    return all(len(p) == PARTITIONS // len(parts) for p in parts) and \
        set().union(*parts) == set(range(PARTITIONS))


@pytest.fixture
def topic(module_broker, topic_name):
    create_topic(module_broker.bootstrap, topic_name, PARTITIONS)
    return topic_name


def test_two_of_ours_split_the_partitions_and_the_survivor_takes_over(module_broker, topic, topic_name):
    group = f"g-{topic_name}"
    produce(module_broker.bootstrap, topic, 0, 400)
    assigned_log: list[tuple[str, str, list[int]]] = []

    def callbacks(name: str) -> dict[str, Any]:
        def on_assign(consumer: Consumer, parts: list[TopicPartition]) -> None:
            assigned_log.append((name, "assign", sorted(tp.partition for tp in parts)))

        def on_revoke(consumer: Consumer, parts: list[TopicPartition]) -> None:
            assigned_log.append((name, "revoke", sorted(tp.partition for tp in parts)))
        return {"on_assign": on_assign, "on_revoke": on_revoke}

    a = ours(module_broker.bootstrap, group)
    b = ours(module_broker.bootstrap, group)
    seen: dict[str, Seen] = {"a": [], "b": []}
    try:
        a.subscribe([topic], **callbacks("a"))
        b.subscribe([topic], **callbacks("b"))
        members = {"a": a, "b": b}
        got = wait_assigned(members, split_evenly, seen)
        assert got["a"].isdisjoint(got["b"])
        meta = a.consumer_group_metadata()
        assert meta.group_id == group and meta.generation_id >= 1 and meta.member_id
        drain(members, seen, lambda: len(seen["a"]) + len(seen["b"]) >= 400)
        b.close()
        del members["b"]
        wait_assigned(members, lambda g: g["a"] == set(range(PARTITIONS)), seen)
        produce(module_broker.bootstrap, topic, 400, 100)
        drain(members, seen, lambda: len(seen["a"]) + len(seen["b"]) >= 500)
        assert a.poll(0.5) is None
    finally:
        a.close()
        b.close()
    everything = seen["a"] + seen["b"]
    assert sorted(everything) == sorted({(p, o) for p in range(PARTITIONS) for o in range(125)})
    assert ("a", "assign", [0, 1, 2, 3]) in assigned_log
    assert any(name == "b" and kind == "assign" and len(parts) == 2 for name, kind, parts in assigned_log)


@pytest.mark.parametrize("strategy", ["range", "roundrobin"])
@pytest.mark.parametrize("first", ["ours", "librdkafka"])
def test_mixed_group_with_librdkafka_consumes_each_record_once(module_broker, topic, topic_name, strategy, first):
    """Whoever joins first leads the first generation; the later rebalances are led by either."""
    group = f"g-{topic_name}"
    produce(module_broker.bootstrap, topic, 0, 400)
    o = ours(module_broker.bootstrap, group, **{"partition.assignment.strategy": strategy})
    t = theirs(module_broker.bootstrap, group, **{"partition.assignment.strategy": strategy})
    seen: dict[str, Seen] = {"ours": [], "librdkafka": []}
    try:
        order = [("ours", o), ("librdkafka", t)] if first == "ours" else [("librdkafka", t), ("ours", o)]
        for _, c in order:
            c.subscribe([topic])
            assert c.poll(1.0) is None  # its JoinGroup is sent (and waits out the group's initial delay)
        members = dict(order)
        got = wait_assigned(members, split_evenly, seen)
        assert got["ours"].isdisjoint(got["librdkafka"])
        member = o._core.group
        assert (member.leader_id == member.member_id) == (first == "ours"), "the first to join did not lead"
        drain(members, seen, lambda: len(seen["ours"]) + len(seen["librdkafka"]) >= 400)
        # librdkafka leaves: ours takes everything and reads what comes next, from the committed offsets
        t.close()
        del members["librdkafka"]
        wait_assigned(members, lambda g: g["ours"] == set(range(PARTITIONS)), seen)
        produce(module_broker.bootstrap, topic, 400, 40)
        drain(members, seen, lambda: len(seen["ours"]) + len(seen["librdkafka"]) >= 440)
        assert o.poll(0.5) is None
    finally:
        o.close()
        t.close()
    everything = seen["ours"] + seen["librdkafka"]
    assert len(everything) == len(set(everything)), "a record was consumed twice"
    assert set(everything) == {(p, off) for p in range(PARTITIONS) for off in range(110)}
    assert {p for p, _ in seen["ours"]} and {p for p, _ in seen["librdkafka"]}


def test_ours_leaves_and_librdkafka_takes_over(module_broker, topic, topic_name):
    group = f"g-{topic_name}"
    produce(module_broker.bootstrap, topic, 0, 200)
    o = ours(module_broker.bootstrap, group)
    t = theirs(module_broker.bootstrap, group)
    seen: dict[str, Seen] = {"ours": [], "librdkafka": []}
    try:
        o.subscribe([topic])
        t.subscribe([topic])
        members: dict[str, Any] = {"ours": o, "librdkafka": t}
        wait_assigned(members, split_evenly, seen)
        drain(members, seen, lambda: len(seen["ours"]) + len(seen["librdkafka"]) >= 200)
        o.close()  # commits what it consumed, then LeaveGroup: no wait for the session timeout
        del members["ours"]
        started = time.monotonic()
        wait_assigned(members, lambda g: g["librdkafka"] == set(range(PARTITIONS)), seen, timeout=20)
        assert time.monotonic() - started < 5.5, "the rebalance waited for the session timeout"
        produce(module_broker.bootstrap, topic, 200, 40)
        drain(members, seen, lambda: len(seen["ours"]) + len(seen["librdkafka"]) >= 240)
    finally:
        o.close()
        t.close()
    everything = seen["ours"] + seen["librdkafka"]
    assert len(everything) == len(set(everything)), "a record was consumed twice"
    assert set(everything) == {(p, off) for p in range(PARTITIONS) for off in range(60)}


def test_static_member_restart_keeps_its_partitions_without_a_rebalance(module_broker, topic, topic_name):
    """KIP-345: a static member closes without LeaveGroup; its replacement (same group.instance.id) gets the
    same partitions back and the other member is never asked to give its partitions up."""
    group = f"g-{topic_name}"
    produce(module_broker.bootstrap, topic, 0, 80)
    revoked: list[list[int]] = []

    def on_revoke(consumer: Consumer, parts: list[TopicPartition]) -> None:
        revoked.append(sorted(tp.partition for tp in parts))

    a = ours(module_broker.bootstrap, group, **{"group.instance.id": "instance-a"})
    b = ours(module_broker.bootstrap, group, **{"group.instance.id": "instance-b"})
    seen: dict[str, Seen] = {"a": [], "b": []}
    a2 = None
    try:
        a.subscribe([topic])
        b.subscribe([topic], on_revoke=on_revoke)
        members: dict[str, Any] = {"a": a, "b": b}
        got = wait_assigned(members, split_evenly, seen)
        drain(members, seen, lambda: len(seen["a"]) + len(seen["b"]) >= 80)
        a.close()  # commits, but does not leave: it is static
        revoked.clear()
        generation = b.consumer_group_metadata().generation_id
        a2 = ours(module_broker.bootstrap, group, **{"group.instance.id": "instance-a"})
        a2.subscribe([topic])
        members = {"a": a2, "b": b}
        wait_assigned(members, lambda g: g["a"] == got["a"], seen, timeout=20)
        produce(module_broker.bootstrap, topic, 80, 40)
        drain(members, seen, lambda: len(seen["a"]) + len(seen["b"]) >= 120)
        assert revoked == [], "the other member had to give its partitions up"
        assert b.consumer_group_metadata().generation_id == generation
        assert {tp.partition for tp in b.assignment()} == got["b"]
    finally:
        a.close()
        b.close()
        if a2 is not None:
            a2.close()
    everything = seen["a"] + seen["b"]
    assert len(everything) == len(set(everything)), "a record was consumed twice"
    assert set(everything) == {(p, off) for p in range(PARTITIONS) for off in range(30)}


def test_pattern_subscription_picks_up_new_matching_topics(module_broker, topic_name):
    prefix = f"{topic_name}-p"
    create_topic(module_broker.bootstrap, f"{prefix}-a", 1)
    create_topic(module_broker.bootstrap, f"other-{topic_name}", 1)
    ck_produce(module_broker.bootstrap, f"{prefix}-a", [Out(0, None, b"a")])
    ck_produce(module_broker.bootstrap, f"other-{topic_name}", [Out(0, None, b"other")])
    c = ours(module_broker.bootstrap, f"g-{topic_name}", **{"metadata.max.age.ms": 300})
    seen: list[tuple[str, bytes | None]] = []
    try:
        c.subscribe([f"^{prefix}-.*"])
        deadline = time.monotonic() + 30
        while not seen:
            assert time.monotonic() < deadline
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                seen.append((m.topic(), m.value()))
        create_topic(module_broker.bootstrap, f"{prefix}-b", 2)
        ck_produce(module_broker.bootstrap, f"{prefix}-b", [Out(1, None, b"b")])
        while len(seen) < 2:
            assert time.monotonic() < deadline, f"the new topic was not picked up: {seen}"
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                seen.append((m.topic(), m.value()))
        assert c.poll(1.0) is None
        assert sorted((tp.topic, tp.partition) for tp in c.assignment()) == \
            [(f"{prefix}-a", 0), (f"{prefix}-b", 0), (f"{prefix}-b", 1)]
    finally:
        c.close()
    assert seen == [(f"{prefix}-a", b"a"), (f"{prefix}-b", b"b")]


def test_async_consumers_split_a_group_with_coroutine_callbacks(module_broker, topic, topic_name):
    import asyncio

    from oncelog.client.consumer.consumer import AsyncConsumer

    group = f"g-{topic_name}"
    produce(module_broker.bootstrap, topic, 0, 200)
    events: list[tuple[str, str, list[int]]] = []

    async def main() -> dict[str, Seen]:
        conf = {"bootstrap.servers": module_broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100, "heartbeat.interval.ms": 200, "session.timeout.ms": 6000}
        a, b = AsyncConsumer(conf), AsyncConsumer(conf)
        seen: dict[str, Seen] = {"a": [], "b": []}

        def recorder(name: str, kind: str):
            async def cb(consumer: AsyncConsumer, parts: list[TopicPartition]) -> None:
                await asyncio.sleep(0)
                events.append((name, kind, sorted(tp.partition for tp in parts)))
            return cb

        try:
            await a.subscribe([topic], on_assign=recorder("a", "assign"), on_revoke=recorder("a", "revoke"))
            await b.subscribe([topic], on_assign=recorder("b", "assign"), on_revoke=recorder("b", "revoke"))
            deadline = time.monotonic() + 40
            while len(seen["a"]) + len(seen["b"]) < 200 or not (a.assignment() and b.assignment()):
                assert time.monotonic() < deadline, f"{len(seen['a'])}+{len(seen['b'])} read"
                for name, c in (("a", a), ("b", b)):
                    m = await c.poll(0.05)
                    if m is not None and m.error() is None:
                        seen[name].append((m.partition(), m.offset()))
            assert {tp.partition for tp in a.assignment()}.isdisjoint({tp.partition for tp in b.assignment()})
        finally:
            await a.close()
            await b.close()
        return seen

    seen = asyncio.run(main())
    everything = seen["a"] + seen["b"]
    assert len(everything) == len(set(everything)) == 200
    assert any(name == "b" and kind == "assign" and len(parts) == 2 for name, kind, parts in events)
    a_parts = next(parts for name, kind, parts in events if name == "a" and kind == "assign")
    assert ("a", "revoke", a_parts) in events  # close() revokes through the callback, as confluent-kafka does


def test_unsubscribe_revokes_commits_and_a_later_subscribe_resumes(module_broker, topic, topic_name):
    produce(module_broker.bootstrap, topic, 0, 100)
    revoked: list[list[int]] = []
    c = ours(module_broker.bootstrap, f"g-{topic_name}")
    try:
        c.subscribe([topic], on_revoke=lambda consumer, parts: revoked.append(sorted(tp.partition for tp in parts)))
        seen: dict[str, Seen] = {"c": []}
        drain({"c": c}, seen, lambda: len(seen["c"]) >= 100)
        c.unsubscribe()
        assert revoked == [[0, 1, 2, 3]] and c.assignment() == []
        assert c.poll(0.5) is None
        produce(module_broker.bootstrap, topic, 100, 20)
        c.subscribe([topic])
        drain({"c": c}, seen, lambda: len(seen["c"]) >= 120)
        assert c.poll(0.5) is None
    finally:
        c.close()
    assert sorted(seen["c"]) == sorted((p, o) for p in range(PARTITIONS) for o in range(30))


def test_a_member_that_stops_polling_leaves_and_rejoins_when_it_polls_again(module_broker, topic, topic_name):
    """max.poll.interval.ms: the stalled member's partitions go to the other member; its next poll reports
    the error (after its lost-partitions callback) and it rejoins."""
    group = f"g-{topic_name}"
    produce(module_broker.bootstrap, topic, 0, 80)
    lost: list[list[int]] = []
    conf = {"max.poll.interval.ms": 4000}
    a = ours(module_broker.bootstrap, group, **conf)
    b = ours(module_broker.bootstrap, group, **conf)
    seen: dict[str, Seen] = {"a": [], "b": []}
    try:
        a.subscribe([topic], on_lost=lambda consumer, parts: lost.append(sorted(tp.partition for tp in parts)))
        b.subscribe([topic])
        got = wait_assigned({"a": a, "b": b}, split_evenly, seen)
        drain({"a": a, "b": b}, seen, lambda: len(seen["a"]) + len(seen["b"]) >= 80)
        a.commit()
        # a stalls; b keeps polling and takes a's partitions after about max.poll.interval.ms
        wait_assigned({"b": b}, lambda g: g["b"] == set(range(PARTITIONS)), seen, timeout=30)
        produce(module_broker.bootstrap, topic, 80, 40)
        drain({"b": b}, seen, lambda: len(seen["a"]) + len(seen["b"]) >= 120)
        first = a.poll(5)
        assert first is not None and first.error() is not None and "max.poll.interval.ms" in str(first.error())
        assert lost == [sorted(got["a"])]
        assert a.assignment() == []
        wait_assigned({"a": a, "b": b}, split_evenly, seen, timeout=40)
        produce(module_broker.bootstrap, topic, 120, 40)
        drain({"a": a, "b": b}, seen, lambda: len(seen["a"]) + len(seen["b"]) >= 160)
    finally:
        a.close()
        b.close()
    everything = seen["a"] + seen["b"]
    assert len(everything) == len(set(everything)), "a record was consumed twice"
    assert set(everything) == {(p, off) for p in range(PARTITIONS) for off in range(40)}


def test_mixed_group_with_kafka_python_leader(module_broker, topic, topic_name):
    """kafka-python joins first and leads: it must parse our subscription bytes; we parse its assignment."""
    from kafka import KafkaConsumer

    group = f"g-{topic_name}"
    produce(module_broker.bootstrap, topic, 0, 200)
    kp = KafkaConsumer(topic, bootstrap_servers=module_broker.bootstrap, group_id=group,
                       auto_offset_reset="earliest", heartbeat_interval_ms=200, session_timeout_ms=6000,
                       auto_commit_interval_ms=200, fetch_max_wait_ms=100)
    o = ours(module_broker.bootstrap, group)
    seen: dict[str, Seen] = {"kafka-python": [], "ours": []}

    class KpAdapter:
        """poll()/assignment() in confluent-kafka's shape, over kafka-python's batch poll."""

        def __init__(self) -> None:
            self.pending: list[Any] = []

        def poll(self, timeout: float) -> Any:
            if not self.pending:
                for records in kp.poll(timeout_ms=int(timeout * 1000)).values():
                    self.pending.extend(records)
            if not self.pending:
                return None
            r = self.pending.pop(0)
            return _KpMsg(r.partition, r.offset)

        def assignment(self) -> list[TopicPartition]:
            return [TopicPartition(tp.topic, tp.partition) for tp in kp.assignment()]

    try:
        adapter = KpAdapter()
        adapter.poll(0.5)  # kafka-python joins (and leads) first
        o.subscribe([topic])
        members: dict[str, Any] = {"kafka-python": adapter, "ours": o}
        got = wait_assigned(members, split_evenly, seen)
        assert got["ours"].isdisjoint(got["kafka-python"])
        member = o._core.group
        assert member.leader_id and member.leader_id != member.member_id, "kafka-python did not lead"
        drain(members, seen, lambda: len(seen["ours"]) + len(seen["kafka-python"]) >= 200)
    finally:
        o.close()
        kp.close()
    everything = seen["ours"] + seen["kafka-python"]
    assert len(everything) == len(set(everything)) == 200
    assert {p for p, _ in seen["ours"]} == got["ours"]


class _KpMsg:
    def __init__(self, partition: int, offset: int) -> None:
        self._p, self._o = partition, offset

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


def test_on_assign_can_choose_the_starting_offsets(module_broker, topic, topic_name):
    """confluent-kafka's idiom: on_assign sets offsets and calls assign() itself; that assignment is used."""
    from oncelog.client.types import OFFSET_BEGINNING

    group = f"g-{topic_name}"
    produce(module_broker.bootstrap, topic, 0, 40)
    setup = ours(module_broker.bootstrap, group)
    try:
        setup.commit(offsets=[TopicPartition(topic, p, 8) for p in range(PARTITIONS)])
    finally:
        setup.close()

    def rewind(consumer: Consumer, parts: list[TopicPartition]) -> None:
        for tp in parts:
            tp.offset = OFFSET_BEGINNING if tp.partition == 0 else 9
        consumer.assign(parts)

    c = ours(module_broker.bootstrap, group, **{"enable.auto.commit": False})
    seen: dict[str, Seen] = {"c": []}
    try:
        c.subscribe([topic], on_assign=rewind)
        drain({"c": c}, seen, lambda: len(seen["c"]) >= 10 + 3 * 1)
        assert c.poll(0.5) is None
    finally:
        c.close()
    assert sorted(seen["c"]) == [(0, o) for o in range(10)] + [(p, 9) for p in (1, 2, 3)]


def test_a_fenced_static_member_gets_a_fatal_error_and_gives_its_partitions_up(module_broker, topic, topic_name):
    group = f"g-{topic_name}"
    produce(module_broker.bootstrap, topic, 0, 20)
    lost: list[list[int]] = []
    a = ours(module_broker.bootstrap, group, **{"group.instance.id": "same"})
    b = ours(module_broker.bootstrap, group, **{"group.instance.id": "same"})
    seen: dict[str, Seen] = {"a": [], "b": []}
    try:
        a.subscribe([topic], on_lost=lambda consumer, parts: lost.append(sorted(tp.partition for tp in parts)))
        wait_assigned({"a": a}, lambda g: g["a"] == set(range(PARTITIONS)), seen)
        b.subscribe([topic])  # same instance id: the coordinator gives a's place to b
        wait_assigned({"b": b}, lambda g: g["b"] == set(range(PARTITIONS)), seen)
        deadline = time.monotonic() + 20
        while True:
            assert time.monotonic() < deadline, "a was never told it was fenced"
            m = a.poll(0.2)
            if m is not None and m.error() is not None:
                break
        assert m.error().code == 82 and m.error().fatal  # FENCED_INSTANCE_ID
        assert lost == [list(range(PARTITIONS))] and a.assignment() == []
    finally:
        a.close()
        b.close()
