"""Our consumer across a broker SIGKILL and restart: fetches and group membership recover by
themselves (reconnect, metadata refresh, coordinator rediscovery, rejoin), and what is read
afterwards continues exactly: no offset skipped, none read twice.
"""

from __future__ import annotations

import time

from tests.integration.helpers import Out, ck_produce, create_topic

from oncelog.client.consumer.consumer import Consumer
from oncelog.client.types import Message, TopicPartition

FAST = {"reconnect.backoff.max.ms": 200, "retry.backoff.ms": 50, "retry.backoff.max.ms": 200,
        "fetch.wait.max.ms": 100, "request.timeout.ms": 5000}


def poll_n(c: Consumer, n: int, timeout: float = 40.0) -> list[Message]:
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"got {len(out)} of {n}"
        m = c.poll(0.2)
        if m is not None:
            assert m.error() is None, m.error()
            out.append(m)
    return out


def test_assigned_consumer_continues_exactly_after_a_broker_kill(broker_factory, topic_name):
    broker = broker_factory()
    create_topic(broker.bootstrap, topic_name, 2)
    ck_produce(broker.bootstrap, topic_name, [Out(i % 2, None, b"%d" % i) for i in range(200)])
    c = Consumer({"bootstrap.servers": broker.bootstrap, **FAST})
    try:
        c.assign([TopicPartition(topic_name, p, 0) for p in range(2)])
        first = poll_n(c, 60)
        broker.restart()  # SIGKILL, then start on the same port and data
        ck_produce(broker.bootstrap, topic_name, [Out(i % 2, None, b"%d" % i) for i in range(200, 240)])
        rest = poll_n(c, 180)
        assert c.poll(1.0) is None
    finally:
        c.close()
    got = sorted((m.partition(), m.offset()) for m in first + rest)
    assert got == sorted((p, o) for p in range(2) for o in range(120))


def test_group_member_rejoins_after_a_broker_kill_and_resumes_from_its_commit(broker_factory, topic_name):
    broker = broker_factory()
    create_topic(broker.bootstrap, topic_name, 2)
    ck_produce(broker.bootstrap, topic_name, [Out(i % 2, None, b"%d" % i) for i in range(100)])
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic_name}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "heartbeat.interval.ms": 200, "session.timeout.ms": 6000, **FAST})
    try:
        c.subscribe([topic_name])
        before = poll_n(c, 100)
        c.commit()
        broker.restart()
        ck_produce(broker.bootstrap, topic_name, [Out(i % 2, None, b"%d" % i) for i in range(100, 140)])
        after = poll_n(c, 40)
        assert c.poll(1.0) is None
        assert sorted(m.value() for m in before + after) == sorted(b"%d" % i for i in range(140))
        assert {(m.partition(), m.offset()) for m in after} == {(p, o) for p in range(2) for o in range(50, 70)}
        assert c.consumer_group_metadata().generation_id >= 1
    finally:
        c.close()
