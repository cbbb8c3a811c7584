"""Our consumer and the Java client (kafka-clients, tests/interop/java) in one consumer group, one after the
other: we resume exactly from the offsets (and metadata) the Java consumer committed, and the Java consumer
resumes exactly from ours. Skipped with the reason where no JDK/Maven is available.
"""

from __future__ import annotations

import time

from tests.interop.test_java_client import java_jar, run_java  # noqa: F401 - java_jar is a fixture

from oncelog.client.consumer.consumer import Consumer
from oncelog.client.types import Message, TopicPartition


def poll_n(c: Consumer, n: int, timeout: float = 30.0) -> list[Message]:
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"got {len(out)} of {n}"
        m = c.poll(0.2)
        if m is not None:
            assert m.error() is None, m.error()
            out.append(m)
    return out


def test_java_and_ours_take_turns_in_one_group(java_jar, broker_factory, topic_name):  # noqa: F811
    broker = broker_factory({"group.initial.rebalance.delay.ms": 0})
    group = f"{topic_name}-group"  # the Java program's group for this topic
    first = run_java(java_jar, "groups", broker.bootstrap, topic=topic_name, phase="first")
    assert first.value("group_offsets") == {f"{topic_name}-0": 4, f"{topic_name}-1": 6}

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_uncommitted", "fetch.wait.max.ms": 100})
    try:
        tps = [TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)]
        assert [(tp.offset, tp.metadata) for tp in c.committed(tps, 10)] == [(4, "interop-first"),
                                                                           (6, "interop-first")]
        c.subscribe([topic_name])
        got = sorted((m.partition(), m.offset(), m.value()) for m in poll_n(c, 10))
        assert got == [(0, o, b"g-p0-%d" % o) for o in range(4, 10)] + [(1, o, b"g-p1-%d" % o) for o in range(6, 10)]
        assert c.poll(1.0) is None
        c.commit(offsets=[TopicPartition(topic_name, 0, 7, "ours"), TopicPartition(topic_name, 1, 8, "ours")])
    finally:
        c.close()

    second = run_java(java_jar, "groups", broker.bootstrap, topic=topic_name, phase="second")
    seen = sorted(map(tuple, second.value("second_consumer")["seen"]))
    assert seen == [(0, 7, "g-p0-7"), (0, 8, "g-p0-8"), (0, 9, "g-p0-9"), (1, 8, "g-p1-8"), (1, 9, "g-p1-9")]
    assert second.value("group_offsets_final") == {f"{topic_name}-0": 10, f"{topic_name}-1": 10}
