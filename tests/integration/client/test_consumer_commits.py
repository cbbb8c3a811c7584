"""Committed offsets with our consumer: explicit, per message, given offsets, automatic, and on close;
a new consumer of the group resumes exactly where the last commit says, and librdkafka reads the
same committed offsets.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition
from tests.integration.helpers import Out, ck_produce, create_topic

from oncelog.client.consumer.consumer import Consumer
from oncelog.client.errors import KafkaError
from oncelog.client.types import OFFSET_INVALID, Message, TopicPartition


def consumer(bootstrap: str, group: str | None, **conf: Any) -> Consumer:
    base: dict[str, Any] = {"bootstrap.servers": bootstrap, "fetch.wait.max.ms": 100,
                            "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    if group is not None:
        base["group.id"] = group
    base.update(conf)
    return Consumer(base)


def poll_n(c: Consumer, n: int, timeout: float = 20.0) -> list[Message]:
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"got {len(out)} of {n} messages"
        m = c.poll(0.5)
        if m is not None:
            assert m.error() is None, m.error()
            out.append(m)
    return out


@pytest.fixture
def topic(module_broker, topic_name):
    create_topic(module_broker.bootstrap, topic_name, 2)
    ck_produce(module_broker.bootstrap, topic_name, [Out(i % 2, None, b"v%d" % i) for i in range(200)])
    return topic_name


def test_commit_positions_and_resume_after_restart(module_broker, topic, topic_name):
    group = f"g-{topic_name}"
    c = consumer(module_broker.bootstrap, group)
    c.assign([TopicPartition(topic, 0)])  # no committed offset: auto.offset.reset=earliest
    got = poll_n(c, 30)
    assert [m.offset() for m in got] == list(range(30))
    committed = c.commit()
    assert [(tp.partition, tp.offset) for tp in committed] == [(0, 30)]
    c.close()
    again = consumer(module_broker.bootstrap, group)
    try:
        assert [(tp.partition, tp.offset) for tp in again.committed([TopicPartition(topic, 0),
                                                                      TopicPartition(topic, 1)])] == \
            [(0, 30), (1, OFFSET_INVALID)]
        again.assign([TopicPartition(topic, 0)])
        assert [m.offset() for m in poll_n(again, 5)] == [30, 31, 32, 33, 34]
    finally:
        again.close()


def test_commit_message_and_given_offsets(module_broker, topic, topic_name):
    group = f"g-{topic_name}"
    c = consumer(module_broker.bootstrap, group)
    try:
        c.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
        msgs = poll_n(c, 120)  # one partition holds 100
        last = max((m for m in msgs if m.partition() == 1), key=Message.offset)
        c.commit(message=last)
        c.commit(offsets=[TopicPartition(topic, 0, 7, "meta")])
        found = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
        assert [(tp.partition, tp.offset) for tp in found] == [(0, 7), (1, last.offset() + 1)]
        assert found[0].metadata == "meta"
        c.commit(offsets=[TopicPartition(topic, 0, 9)], asynchronous=True)
        deadline = time.monotonic() + 10
        while c.committed([TopicPartition(topic, 0)])[0].offset != 9:
            assert time.monotonic() < deadline, "asynchronous commit never landed"
            time.sleep(0.05)
        with pytest.raises(KafkaError):
            c.commit(offsets=[TopicPartition(topic, 0, -2)])
    finally:
        c.close()


def test_librdkafka_reads_our_commits_and_we_read_its(module_broker, topic, topic_name):
    group = f"g-{topic_name}"
    ours = consumer(module_broker.bootstrap, group)
    try:
        ours.commit(offsets=[TopicPartition(topic, 0, 11), TopicPartition(topic, 1, 22)])
    finally:
        ours.close()
    theirs = CKConsumer({"bootstrap.servers": module_broker.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        found = theirs.committed([CKTopicPartition(topic, 0), CKTopicPartition(topic, 1)], timeout=10)
        assert [(tp.partition, tp.offset) for tp in found] == [(0, 11), (1, 22)]
        theirs.commit(offsets=[CKTopicPartition(topic, 0, 13)], asynchronous=False)
    finally:
        theirs.close()
    again = consumer(module_broker.bootstrap, group)
    try:
        again.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        first = {}
        for m in poll_n(again, 165):  # 87 + 78 remaining
            first.setdefault(m.partition(), m.offset())
        assert first == {0: 13, 1: 22}
    finally:
        again.close()


def test_auto_commit_and_commit_on_close_resume_exactly(module_broker, topic, topic_name):
    group = f"g-{topic_name}"
    c = consumer(module_broker.bootstrap, group, **{"enable.auto.commit": True, "auto.commit.interval.ms": 100})
    c.subscribe([topic])
    got = poll_n(c, 120)
    # auto-commit runs inside poll(); wait for one to land while nothing more is consumed
    c.pause([TopicPartition(t.topic, t.partition) for t in c.assignment()])
    deadline = time.monotonic() + 10
    positions = {tp.partition: tp.offset for tp in c.position(c.assignment())}
    while True:
        c.poll(0.1)
        committed = {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in (0, 1)])}
        if all(committed.get(p) == o for p, o in positions.items()):
            break
        assert time.monotonic() < deadline, f"auto-commit did not commit {positions}: {committed}"
    c.resume(c.assignment())
    got += poll_n(c, 10)
    c.close()  # commits the 10 as well
    seen = {(m.partition(), m.offset()) for m in got}
    after = consumer(module_broker.bootstrap, group)
    try:
        after.subscribe([topic])
        rest = poll_n(after, 200 - len(got))
        assert not seen & {(m.partition(), m.offset()) for m in rest}, "records read twice"
        assert len(seen) + len(rest) == 200
        assert after.poll(1.0) is None
    finally:
        after.close()


def test_commit_without_group_is_refused(module_broker, topic):
    c = consumer(module_broker.bootstrap, None)
    try:
        with pytest.raises(KafkaError, match="group.id"):
            c.commit(offsets=[TopicPartition(topic, 0, 1)])
    finally:
        c.close()
