"""Consumer groups with real clients: confluent-kafka, kafka-python, aiokafka and kcat against a real broker.

Groups of 1-3 members on a 4-partition topic: every partition is assigned exactly once, the group
rebalances when members join and leave, a member that stops heartbeating is removed after its session
timeout, and committed offsets survive a SIGKILL of the broker so a restarted consumer resumes exactly
where its group left off.
"""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTP
from confluent_kafka import Consumer, ConsumerGroupState, Producer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTP
from kafka.protocol.admin import DescribeGroupsRequest
from kafka.protocol.consumer import JoinGroupRequest, OffsetFetchRequest, SyncGroupRequest
from tests.integration.helpers import (
    Out,
    Wire,
    admin,
    ck_produce,
    create_topic,
    kcat,
    metric,
    scrape,
    wait_until,
)

from oncelog.embedded import BrokerProcess

PARTITIONS = 4
SETTINGS = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 500,
            "offsets.topic.num.partitions": 5}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = BrokerProcess(tmp_path_factory.mktemp("groups") / "data", SETTINGS, metrics=True).start()
    yield proc
    if proc.alive():
        proc.stop()


def produce(bootstrap: str, topic: str, count: int, start: int = 0) -> list[tuple[int, int]]:
    outs = [Out(i % PARTITIONS, b"k%d" % i, b"v%d" % i) for i in range(start, start + count)]
    return ck_produce(bootstrap, topic, outs)


def topic_with_records(bootstrap: str, name: str, count: int = 40) -> set[tuple[int, int]]:
    create_topic(bootstrap, name, PARTITIONS)
    return set(produce(bootstrap, name, count))


# -- confluent-kafka ----------------------------------------------------------------------------------------
def ck_consumer(bootstrap: str, group: str, topic: str, **conf: Any) -> Consumer:
    base = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 200,
            "topic.metadata.refresh.interval.ms": 1000, "log_level": 3}
    base.update(conf)
    consumer = Consumer(base)
    consumer.subscribe([topic])
    return consumer


def pump(consumers: Sequence[Any], until: Callable[[], bool], timeout: float = 30.0,
         sink: dict[Any, list[Any]] | None = None, what: str = "") -> None:
    """Poll every confluent consumer in turn (that drives their rebalances) until `until()` holds."""
    deadline = time.monotonic() + timeout
    while True:
        for c in consumers:
            msg = c.poll(0.02)
            if msg is not None and msg.error() is None and sink is not None:
                sink.setdefault(c, []).append(msg)
        if until():
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what or until}"


def partitions_of(consumer: Any) -> list[int]:
    return sorted(tp.partition for tp in consumer.assignment())


def split_exactly(assignments: Sequence[list[int]]) -> bool:
    """Every member has partitions and together they hold each partition exactly once."""
    return all(assignments) and sorted(p for a in assignments for p in a) == list(range(PARTITIONS))


def describe(bootstrap: str, group: str) -> Any:
    client = admin(bootstrap)
    return client.describe_consumer_groups([group])[group].result(timeout=15)


def test_confluent_group_rebalances_on_join_and_leave(broker, topic_name):
    topic_with_records(broker.bootstrap, topic_name)
    group = f"{topic_name}-ck"
    consumers: list[Consumer] = []
    try:
        for size in (1, 2, 3):
            consumers.append(ck_consumer(broker.bootstrap, group, topic_name, **{"client.id": f"ck-{size}"}))
            pump(consumers, lambda: split_exactly([partitions_of(c) for c in consumers]),
                 what=f"{size} members to share the partitions")
        desc = describe(broker.bootstrap, group)
        assert desc.state == ConsumerGroupState.STABLE and len(desc.members) == 3
        assert sorted(len(partitions_of(c)) for c in consumers) == [1, 1, 2]
        consumers.pop().close()  # LeaveGroup: the others take over its partitions
        pump(consumers, lambda: split_exactly([partitions_of(c) for c in consumers]), what="rebalance on leave")
        assert len(describe(broker.bootstrap, group).members) == 2
    finally:
        for c in consumers:
            c.close()
    assert describe(broker.bootstrap, group).state == ConsumerGroupState.EMPTY


def test_confluent_single_member_reads_everything_and_commits(broker, topic_name):
    produced = topic_with_records(broker.bootstrap, topic_name)
    group = f"{topic_name}-one"
    consumer = ck_consumer(broker.bootstrap, group, topic_name)
    got: dict[Any, list[Any]] = {}
    try:
        pump([consumer], lambda: len(got.get(consumer, [])) >= len(produced), sink=got, what="all records")
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic_name, p) for p in range(PARTITIONS)], timeout=10)
    finally:
        consumer.close()
    assert {(m.partition(), m.offset()) for m in got[consumer]} == produced
    assert {tp.partition: tp.offset for tp in committed} == {p: 10 for p in range(PARTITIONS)}


# -- kafka-python ---------------------------------------------------------------------------------------------
def kp_consumer(bootstrap: str, group: str, topic: str, **conf: Any) -> KafkaConsumer:
    base = {"bootstrap_servers": bootstrap, "group_id": group, "auto_offset_reset": "earliest",
            "enable_auto_commit": False, "session_timeout_ms": 6000, "heartbeat_interval_ms": 200,
            "metadata_max_age_ms": 1000}
    base.update(conf)
    return KafkaConsumer(topic, **base)


def kp_pump(consumers: Sequence[KafkaConsumer], until: Callable[[], bool], timeout: float = 30.0,
            sink: list[Any] | None = None, what: str = "") -> None:
    """Like `pump`, with polls long enough for a whole rebalance: kafka-python 3.0.12 loses a leader's
    SyncGroup answer when a poll times out while a metadata-triggered rejoin is in flight (the member then
    never heartbeats again), so short polls make this test flaky against any broker."""
    deadline = time.monotonic() + timeout
    while True:
        for c in consumers:
            for records in c.poll(timeout_ms=1000).values():
                if sink is not None:
                    sink.extend(records)
        if until():
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what or until}"


def test_kafka_python_group_of_two(broker, topic_name):
    produced = topic_with_records(broker.bootstrap, topic_name)
    group = f"{topic_name}-kp"
    first = kp_consumer(broker.bootstrap, group, topic_name, client_id="kp-1")
    second = None
    got: list[Any] = []
    try:
        kp_pump([first], lambda: len(first.assignment()) == PARTITIONS, sink=got, what="first member's assignment")
        second = kp_consumer(broker.bootstrap, group, topic_name, client_id="kp-2")
        pair = [first, second]

        def split() -> bool:
            return split_exactly([sorted(tp.partition for tp in c.assignment()) for c in pair])

        def at_end() -> bool:
            return split() and all(c.position(tp) == 10 for c in pair for tp in c.assignment())

        kp_pump(pair, split, sink=got, what="two members to share the partitions")
        kp_pump(pair, at_end, sink=got, what="both members at the end of their partitions")
        for c in pair:
            c.commit()
        second.close()
        second = None
        kp_pump([first], lambda: len(first.assignment()) == PARTITIONS, what="rebalance after the leave")
        committed = {p: first.committed(KpTP(topic_name, p)) for p in range(PARTITIONS)}
    finally:
        first.close()
        if second is not None:
            second.close()
    assert {(r.partition, r.offset) for r in got} == produced
    assert committed == {p: 10 for p in range(PARTITIONS)}


# -- aiokafka -------------------------------------------------------------------------------------------------
def test_aiokafka_group_consumption(broker, topic_name):
    produced = topic_with_records(broker.bootstrap, topic_name)
    group = f"{topic_name}-aio"

    async def consume() -> tuple[set[tuple[int, int]], dict[int, int | None]]:
        consumer = AIOKafkaConsumer(topic_name, bootstrap_servers=broker.bootstrap, group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    session_timeout_ms=6000, heartbeat_interval_ms=200)
        await consumer.start()
        got: set[tuple[int, int]] = set()
        try:
            deadline = time.monotonic() + 30
            while len(got) < len(produced) and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    got.update((r.partition, r.offset) for r in records)
            await consumer.commit()
            committed = {p: await consumer.committed(AioTP(topic_name, p)) for p in range(PARTITIONS)}
        finally:
            await consumer.stop()
        return got, committed

    got, committed = asyncio.run(consume())
    assert got == produced
    assert committed == {p: 10 for p in range(PARTITIONS)}


# -- kcat -------------------------------------------------------------------------------------------------------
def test_kcat_balanced_consumer(broker, topic_name):
    produced = topic_with_records(broker.bootstrap, topic_name)
    group = f"{topic_name}-kcat"
    args = [kcat(), "-b", broker.bootstrap, "-G", group, topic_name, "-o", "beginning", "-c", str(len(produced)),
            "-J", "-q", "-X", "auto.offset.reset=earliest", "-X", "auto.commit.interval.ms=100",
            "-X", "session.timeout.ms=6000"]
    proc = subprocess.run(args, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    docs = [json.loads(line) for line in proc.stdout.decode().splitlines() if line.strip()]
    assert {(d["partition"], d["offset"]) for d in docs} == produced
    # kcat committed what it read on its way out: a second run finds nothing left
    consumer = ck_consumer(broker.bootstrap, group, topic_name)
    try:
        committed = consumer.committed([TopicPartition(topic_name, p) for p in range(PARTITIONS)], timeout=10)
    finally:
        consumer.close()
    assert sum(tp.offset for tp in committed) == len(produced)


# -- failure: a member that goes silent, a broker that is killed ---------------------------------------------
def subscription(topic: str) -> bytes:
    raw = topic.encode()
    return struct.pack(">hih", 0, 1, len(raw)) + raw + struct.pack(">i", -1)


def test_silent_member_is_removed_after_its_session_timeout(broker, topic_name):
    """A raw-protocol member joins a confluent consumer's group, takes its share, then never heartbeats."""
    topic_with_records(broker.bootstrap, topic_name, 4)
    group = f"{topic_name}-silent"
    live = ck_consumer(broker.bootstrap, group, topic_name)
    result: dict[str, Any] = {}

    def silent_member() -> None:
        with Wire(broker.bootstrap, client_id="silent") as w:
            def join(member_id: str) -> Any:
                req = JoinGroupRequest(
                    group_id=group, session_timeout_ms=1000, rebalance_timeout_ms=10000, member_id=member_id,
                    group_instance_id=None, protocol_type="consumer", reason=None,
                    protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=subscription(topic_name))])
                return w.request(req, 5)

            first = join("")
            joined = join(first.member_id)
            sync = w.request(SyncGroupRequest(group_id=group, generation_id=joined.generation_id,
                                              member_id=joined.member_id, group_instance_id=None,
                                              protocol_type=None, protocol_name=None, assignments=[]), 3)
            result.update(join=joined, sync=sync)

    try:
        pump([live], lambda: len(partitions_of(live)) == PARTITIONS, what="the live member's assignment")
        thread = threading.Thread(target=silent_member)
        thread.start()
        pump([live], lambda: "sync" in result and len(partitions_of(live)) == PARTITIONS // 2, timeout=20,
             what="the silent member to take half of the partitions")
        thread.join(5)
        assert result["sync"].error_code == 0 and result["sync"].assignment
        silent_since = time.monotonic()
        pump([live], lambda: len(partitions_of(live)) == PARTITIONS, timeout=15,
             what="the silent member's partitions to come back")
        assert time.monotonic() - silent_since >= 0.8  # not before its session timeout (1000 ms)
        desc = describe(broker.bootstrap, group)
        assert [m.member_id for m in desc.members] != [result["join"].member_id] and len(desc.members) == 1
    finally:
        live.close()


def test_commits_survive_sigkill_and_a_restarted_consumer_resumes(broker_factory, topic_name):
    proc = broker_factory(SETTINGS)
    produced = topic_with_records(proc.bootstrap, topic_name, 40)
    group = f"{topic_name}-resume"
    conf = {"metadata.recovery.strategy": "none"}
    first = ck_consumer(proc.bootstrap, group, topic_name, **conf)
    got: dict[Any, list[Any]] = {}
    try:
        pump([first], lambda: len(got.get(first, [])) >= 20, sink=got, what="half of the records")
        read = got[first]
        ends: dict[int, int] = {}
        for m in read:
            ends[m.partition()] = max(ends.get(m.partition(), -1), m.offset() + 1)
        first.commit(offsets=[TopicPartition(topic_name, p, o) for p, o in ends.items()], asynchronous=False)
    finally:
        first.close()
    proc.kill()  # the commit was answered: it must be on disk
    proc.start()
    consumed = {(m.partition(), m.offset()) for m in read if m.offset() < ends[m.partition()]}
    remaining = produced - consumed
    second = ck_consumer(proc.bootstrap, group, topic_name, **conf)
    after: dict[Any, list[Any]] = {}
    try:
        pump([second], lambda: len(after.get(second, [])) >= len(remaining), sink=after, what="the rest")
        pump([second], lambda: True, sink=after)  # one more round: nothing extra may come
        committed = second.committed([TopicPartition(topic_name, p) for p in range(PARTITIONS)], timeout=10)
    finally:
        second.close()
    assert {(m.partition(), m.offset()) for m in after[second]} == remaining  # resumes: no loss, no repeat
    assert {tp.partition: tp.offset for tp in committed} == {p: ends.get(p, -1001) for p in range(PARTITIONS)}


def test_stable_group_survives_a_broker_restart(broker_factory, topic_name):
    """Members keep their ids and generation across a restart: no rebalance, consumption goes on."""
    proc = broker_factory(SETTINGS)
    topic_with_records(proc.bootstrap, topic_name, 8)
    group = f"{topic_name}-live"
    consumer = ck_consumer(proc.bootstrap, group, topic_name, **{"metadata.recovery.strategy": "none"})
    got: dict[Any, list[Any]] = {}
    try:
        pump([consumer], lambda: len(got.get(consumer, [])) >= 8, sink=got, what="the first records")
        consumer.commit(asynchronous=False)
        before = describe(proc.bootstrap, group)
        proc.kill()
        proc.start()
        produce(proc.bootstrap, topic_name, 8, start=8)
        pump([consumer], lambda: len(got[consumer]) >= 16, sink=got, timeout=40, what="records after the restart")
        after = describe(proc.bootstrap, group)
        assert [m.member_id for m in after.members] == [m.member_id for m in before.members]
        assert len({(m.partition(), m.offset()) for m in got[consumer]}) == 16
    finally:
        consumer.close()


# -- transactional offsets ------------------------------------------------------------------------------------
UNSTABLE_OFFSET_COMMIT = 88


def fetch_offset(bootstrap: str, group: str, topic: str, require_stable: bool) -> tuple[int, int]:
    topics = [OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])]
    with Wire(bootstrap) as w:
        resp = w.request(OffsetFetchRequest(group_id=group, topics=topics, require_stable=require_stable), 7)
    part = resp.topics[0].partitions[0]
    return part.committed_offset, part.error_code


def test_require_stable_while_a_transactional_commit_is_pending(broker_factory, topic_name):
    """sendOffsetsToTransaction: invisible (and UNSTABLE_OFFSET_COMMIT under require_stable) until the commit;
    dropped on abort; still pending after a SIGKILL, then dropped when the coordinator aborts it on timeout."""
    proc = broker_factory({**SETTINGS, "transaction.abort.timed.out.transaction.cleanup.interval.ms": 200})
    create_topic(proc.bootstrap, topic_name, 1)
    group = f"{topic_name}-txn"
    member = Consumer({"bootstrap.servers": proc.bootstrap, "group.id": group})
    metadata = member.consumer_group_metadata()
    member.close()
    producer = Producer({"bootstrap.servers": proc.bootstrap, "transactional.id": f"{topic_name}-tx",
                         "transaction.timeout.ms": 3000, "metadata.recovery.strategy": "none", "log_level": 0})
    producer.init_transactions(15)

    def send_offset(offset: int) -> None:
        producer.begin_transaction()
        producer.send_offsets_to_transaction([TopicPartition(topic_name, 0, offset)], metadata, 15)

    send_offset(42)
    assert fetch_offset(proc.bootstrap, group, topic_name, True) == (-1, UNSTABLE_OFFSET_COMMIT)
    assert fetch_offset(proc.bootstrap, group, topic_name, False) == (-1, 0)
    producer.commit_transaction(15)
    assert fetch_offset(proc.bootstrap, group, topic_name, True) == (42, 0)
    send_offset(50)
    producer.abort_transaction(15)
    assert fetch_offset(proc.bootstrap, group, topic_name, True) == (42, 0)
    send_offset(60)
    proc.kill()
    proc.start()
    assert fetch_offset(proc.bootstrap, group, topic_name, True) == (-1, UNSTABLE_OFFSET_COMMIT)
    assert fetch_offset(proc.bootstrap, group, topic_name, False) == (42, 0)
    wait_until(lambda: fetch_offset(proc.bootstrap, group, topic_name, True) == (42, 0), timeout=20,
               what="the timed-out transaction's offsets to be dropped")


# -- administration and metrics -----------------------------------------------------------------------------------
def test_admin_lists_describes_and_deletes_groups(broker, topic_name):
    topic_with_records(broker.bootstrap, topic_name, 4)
    group = f"{topic_name}-admin"
    client = admin(broker.bootstrap)
    consumer = ck_consumer(broker.bootstrap, group, topic_name)
    try:
        pump([consumer], lambda: len(partitions_of(consumer)) == PARTITIONS, what="assignment")
        consumer.commit(offsets=[TopicPartition(topic_name, 0, 3)], asynchronous=False)
        listed = client.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(timeout=15)
        assert group in {g.group_id for g in listed.valid}
        listed = client.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(timeout=15)
        assert group not in {g.group_id for g in listed.valid}
        desc = describe(broker.bootstrap, group)
        assert desc.partition_assignor == "range" and len(desc.members[0].assignment.topic_partitions) == PARTITIONS
        with pytest.raises(Exception, match="NON_EMPTY_GROUP|not empty"):
            client.delete_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    finally:
        consumer.close()
    from confluent_kafka import ConsumerGroupTopicPartitions

    offsets = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=15)
    assert [(tp.partition, tp.offset) for tp in offsets.topic_partitions] == [(0, 3)]
    client.delete_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    with pytest.raises(Exception, match="GROUP_ID_NOT_FOUND|does not exist"):
        client.delete_consumer_groups([group], request_timeout=10)[group].result(timeout=15)


def test_group_metrics(broker, topic_name):
    topic_with_records(broker.bootstrap, topic_name, 4)
    group = f"{topic_name}-metrics"
    before = scrape(broker.metrics_port)
    consumer = ck_consumer(broker.bootstrap, group, topic_name)
    try:
        pump([consumer], lambda: len(partitions_of(consumer)) == PARTITIONS, what="assignment")
        consumer.commit(offsets=[TopicPartition(topic_name, p, 1) for p in range(PARTITIONS)], asynchronous=False)
        samples = wait_until(lambda: (s := scrape(broker.metrics_port))
                             and metric(s, "oncelog_groups", state="Stable") >= 1 and s, what="metrics")
    finally:
        consumer.close()
    assert metric(samples, "oncelog_group_rebalances_total") > metric(before, "oncelog_group_rebalances_total")
    assert metric(samples, "oncelog_offset_commits_total", kind="consumer") \
        >= metric(before, "oncelog_offset_commits_total", kind="consumer") + PARTITIONS
    with Wire(broker.bootstrap) as w:
        described = w.request(DescribeGroupsRequest(groups=[group], include_authorized_operations=False), 0)
    assert described.groups[0].group_state == "Empty"
