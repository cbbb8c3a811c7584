"""Admin: consumer groups (list, describe, delete), committed offsets (list, alter as admin, reset plans), with
librdkafka consumers as the group's members and as the independent check of what was committed."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as TopicPartitionCK
from tests.integration.helpers import Out, ck_produce, wait_until

from oncelog.client.admin import Admin
from oncelog.client.admin_types import OffsetReset
from oncelog.client.errors import KafkaError
from oncelog.client.types import TopicPartition


@pytest.fixture(scope="module")
def admin(module_broker):
    client = Admin({"bootstrap.servers": module_broker.bootstrap}, api_timeout=20)
    yield client
    client.close()


def code_of(call, *args, **kwargs) -> int:
    with pytest.raises(KafkaError) as info:
        call(*args, **kwargs)
    return info.value.code


def member(bootstrap: str, group: str, topic: str, client_id: str = "member-1") -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    consumer.subscribe([topic])
    return consumer


def consume_n(consumer: Consumer, n: int, timeout: float = 30.0) -> list[bytes]:
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"got {len(out)} of {n}"
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            out.append(msg.value())
    return out


def test_group_lifecycle(admin, module_broker, topic_name):
    bootstrap, group = module_broker.bootstrap, topic_name + "-g"
    admin.create_topic(topic_name, 2)
    ck_produce(bootstrap, topic_name, [Out(p, None, b"%d-%d" % (p, i)) for p in (0, 1) for i in range(4)])
    consumer = member(bootstrap, group, topic_name)
    try:
        assert len(consume_n(consumer, 8)) == 8
        consumer.commit(offsets=[TopicPartitionCK(topic_name, 0, 3), TopicPartitionCK(topic_name, 1, 4)],
                        asynchronous=False)
        listed = {g.group_id: g for g in admin.list_groups()}
        assert (listed[group].state, listed[group].protocol_type) == ("Stable", "consumer")
        assert group in {g.group_id for g in admin.list_groups(["Stable"])}
        assert group not in {g.group_id for g in admin.list_groups(["Empty"])}

        described = admin.describe_group(group)
        assert (described.state, described.protocol_type, described.coordinator) == ("Stable", "consumer", 0)
        assert described.protocol in ("range", "roundrobin")
        (m,) = described.members
        assert m.client_id == "member-1" and m.host == "/127.0.0.1"
        assert m.assignment == ((topic_name, 0), (topic_name, 1))

        offsets = admin.list_group_offsets(group)
        assert {tp: c.offset for tp, c in offsets.items()} == {TopicPartition(topic_name, 0): 3,
                                                               TopicPartition(topic_name, 1): 4}
        # an active group's offsets belong to its members
        assert code_of(admin.alter_group_offsets, group, {(topic_name, 0): 0}) == 25  # UNKNOWN_MEMBER_ID
        assert code_of(admin.plan_group_offset_reset, group, [(topic_name, 0)], to="earliest") == 68
        assert code_of(admin.delete_group, group) == 68  # NON_EMPTY_GROUP
    finally:
        consumer.close()

    wait_until(lambda: admin.describe_group(group).state == "Empty", what="group empty after close")
    admin.alter_group_offsets(group, {(topic_name, 0): 1, (topic_name, 1): 2})
    assert {tp.partition: c.offset for tp, c in admin.list_group_offsets(group).items()} == {0: 1, 1: 2}
    # a new member starts where the admin put the offsets
    consumer = member(bootstrap, group, topic_name, "member-2")
    try:
        assert sorted(consume_n(consumer, 5)) == [b"0-1", b"0-2", b"0-3", b"1-2", b"1-3"]
    finally:
        consumer.close()

    wait_until(lambda: admin.describe_group(group).state == "Empty", what="group empty after close")
    admin.delete_group(group)
    assert admin.describe_group(group).state == "Dead"
    assert admin.list_group_offsets(group) == {}
    assert code_of(admin.delete_group, group) == 69  # GROUP_ID_NOT_FOUND


def test_list_group_offsets_of_chosen_partitions(admin, topic_name):
    group = topic_name + "-g"
    admin.create_topic(topic_name, 3)
    admin.alter_group_offsets(group, {(topic_name, 1): 0})
    chosen = admin.list_group_offsets(group, [(topic_name, 0), (topic_name, 1)])
    assert {tp.partition: c.offset for tp, c in chosen.items()} == {0: -1, 1: 0}
    assert admin.describe_group(group).state == "Empty"


def test_reset_plans(admin, module_broker, topic_name):
    group = topic_name + "-g"
    admin.create_topic(topic_name, 2)
    ck_produce(module_broker.bootstrap, topic_name, [Out(p, None, b"x") for p in (0, 1) for _ in range(10)])
    admin.delete_records({(topic_name, 0): 2})
    admin.alter_group_offsets(group, {(topic_name, 0): 5})
    tps = [(topic_name, 0), (topic_name, 1)]
    assert admin.plan_group_offset_reset(group, tps, to="earliest") == [
        OffsetReset(topic_name, 0, 5, 2), OffsetReset(topic_name, 1, None, 0)]
    assert [r.target for r in admin.plan_group_offset_reset(group, tps, to="latest")] == [10, 10]
    assert [r.target for r in admin.plan_group_offset_reset(group, tps, to="offset", value=1)] == [2, 1]  # clamped
    assert [r.target for r in admin.plan_group_offset_reset(group, tps, to="offset", value=99)] == [10, 10]
    assert [r.target for r in admin.plan_group_offset_reset(group, [tps[0]], to="shift", value=-2)] == [3]
    assert [r.target for r in admin.plan_group_offset_reset(group, [tps[0]], to="shift", value=-9)] == [2]
    with pytest.raises(KafkaError) as info:  # nothing committed to shift from
        admin.plan_group_offset_reset(group, [tps[1]], to="shift", value=1)
    assert info.value.code == 78
    # planning changes nothing
    assert {tp.partition: c.offset for tp, c in admin.list_group_offsets(group).items()} == {0: 5}
