"""Consume-transform-produce with our consumer and our transactional producer: the consumer's
positions and consumer_group_metadata() go into the transaction, an aborted transaction moves
neither the output nor the group's offsets, a committed one moves both, and a restarted consumer
resumes exactly after what the committed transaction consumed.
"""

from __future__ import annotations

import time
from typing import Any

from tests.integration.helpers import Out, ck_produce, create_topic

from oncelog.client import Producer
from oncelog.client.consumer.consumer import Consumer
from oncelog.client.errors import KafkaError
from oncelog.client.types import OFFSET_INVALID, Message, TopicPartition


def consumer(bootstrap: str, group: str, **conf: Any) -> Consumer:
    base = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100, "heartbeat.interval.ms": 300}
    base.update(conf)
    return Consumer(base)


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


def read_all(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[bytes | None]:
    c = Consumer({"bootstrap.servers": bootstrap, "isolation.level": isolation, "enable.partition.eof": True,
                  "fetch.wait.max.ms": 100})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values: list[bytes | None] = []
        ended: set[int] = set()
        deadline = time.monotonic() + 20
        while len(ended) < partitions:
            assert time.monotonic() < deadline
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                ended.add(m.partition())
                continue
            values.append(m.value())
        return sorted(values)
    finally:
        c.close()


def test_offsets_move_only_with_the_committed_transaction(module_broker, topic_name):
    bootstrap = module_broker.bootstrap
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 1)
    ck_produce(bootstrap, source, [Out(i % 2, None, b"%d" % i) for i in range(20)])
    group = f"g-{topic_name}"
    c = consumer(bootstrap, group)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic_name}-tx", "linger.ms": 5})
    try:
        c.subscribe([source])
        p.init_transactions(15)

        def transform_all() -> None:
            for m in poll_n(c, 20):
                p.produce(sink, b"out-" + m.value(), partition=0)
            meta = c.consumer_group_metadata()
            assert meta.group_id == group and meta.generation_id >= 1 and meta.member_id
            p.send_offsets_to_transaction(c.position(c.assignment()), meta, 15)

        p.begin_transaction()
        transform_all()
        assert p.flush(15) == 0  # the aborted output reaches the log, so read_committed has something to drop
        p.abort_transaction(15)
        tps = [TopicPartition(source, 0), TopicPartition(source, 1)]
        assert [tp.offset for tp in c.committed(tps, 10)] == [OFFSET_INVALID, OFFSET_INVALID]
        assert read_all(bootstrap, sink, 1, "read_committed") == []
        for tp in tps:  # after an abort the application rewinds to the committed offsets
            c.seek(TopicPartition(source, tp.partition, 0))
        p.begin_transaction()
        transform_all()
        p.commit_transaction(15)
        assert [tp.offset for tp in c.committed(tps, 10)] == [10, 10]
    finally:
        p.close()
        c.close()
    want = sorted(b"out-%d" % i for i in range(20))
    assert read_all(bootstrap, sink, 1, "read_committed") == want
    assert len(read_all(bootstrap, sink, 1, "read_uncommitted")) == 40  # the aborted copy is still in the log
    again = consumer(bootstrap, group)
    try:
        again.subscribe([source])
        assert again.poll(3) is None
        ck_produce(bootstrap, source, [Out(1, None, b"late")])
        m = poll_n(again, 1)[0]
        assert (m.partition(), m.offset(), m.value()) == (1, 10, b"late")
    finally:
        again.close()


def test_group_metadata_without_membership_is_refused_for_a_subscribed_group(module_broker, topic_name):
    """An offset commit carrying a stale generation is refused: the metadata must be the live one."""
    bootstrap = module_broker.bootstrap
    create_topic(bootstrap, topic_name, 1)
    ck_produce(bootstrap, topic_name, [Out(0, None, b"x")])
    c = consumer(bootstrap, f"g-{topic_name}")
    try:
        c.subscribe([topic_name])
        poll_n(c, 1)
        meta = c.consumer_group_metadata()
        c.commit(offsets=[TopicPartition(topic_name, 0, 1)])  # the live generation: accepted
        stale = meta._replace(generation_id=meta.generation_id + 5)
        assert stale.generation_id != meta.generation_id
        with Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic_name}"}) as other:
            assert other.consumer_group_metadata().generation_id == -1  # not a member: no generation
        with_bad = c._core.offsets.commit  # the commit path the facade uses, with forged metadata
        try:
            c._rt.run(with_bad(stale, {(topic_name, 0): (0, None, None)}, timeout=5))
            raise AssertionError("a commit with a forged generation was accepted")
        except KafkaError as exc:
            assert exc.code == 22  # ILLEGAL_GENERATION
        assert c.committed([TopicPartition(topic_name, 0)])[0].offset == 1
    finally:
        c.close()
