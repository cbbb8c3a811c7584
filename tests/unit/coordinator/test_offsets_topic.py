"""`__consumer_offsets` on real partition storage: the topic, transactional batches, replay with markers."""

from __future__ import annotations

import asyncio

import pytest

from oncelog.config import load_broker_config
from oncelog.coordinator.group.store import (
    OFFSETS_TOPIC,
    OffsetsTopic,
    StoredMarker,
    StoredRecord,
    TxnProducer,
)
from oncelog.errors import ErrorCode
from oncelog.storage.flusher import GroupCommitFlusher
from oncelog.storage.log_manager import LogManager


@pytest.fixture
def logs(tmp_path):
    config = load_broker_config(overrides=["oncelog.fsync.enable=false"])
    mgr = LogManager(tmp_path / "data", config)
    mgr.startup()
    verified = []

    def verify(txn_id, producer_id, epoch, topic, partition):
        verified.append((txn_id, producer_id, epoch, topic, partition))
        return ErrorCode.NONE, None

    mgr.set_verify_transaction(verify)
    mgr.verified = verified
    yield mgr
    mgr.shutdown()


def test_topic_is_created_compacted_and_internal(logs):
    topic = OffsetsTopic(logs, GroupCommitFlusher(fsync_enabled=False), 5)
    topic.ensure()
    meta = logs.topics[OFFSETS_TOPIC]
    assert meta.partitions == 5 and meta.internal and meta.config["cleanup.policy"] == ["compact"]
    again = OffsetsTopic(logs, GroupCommitFlusher(fsync_enabled=False), 9)
    again.ensure()  # an existing topic keeps its partition count
    assert again.partitions == 5 and again.partition_for("g") == topic.partition_for("g")


def test_transactional_batches_continue_the_producers_sequence_and_replay_with_markers(logs):
    topic = OffsetsTopic(logs, GroupCommitFlusher(fsync_enabled=False), 2, transactional_id_of=lambda pid: "tx")
    topic.ensure()
    plain = topic.append(0, [(b"k1", b"v1")], 1000)
    assert plain.error == ErrorCode.NONE and plain.base_offset == 0
    first = topic.append(0, [(b"k2", b"v2"), (b"k3", None)], 1000, TxnProducer(42, 3, None))
    second = topic.append(0, [(b"k4", b"v4")], 1000, TxnProducer(42, 3, None))
    assert first.error == second.error == ErrorCode.NONE, (first, second)
    assert logs.verified == [("tx", 42, 3, OFFSETS_TOPIC, 0)]  # verified once: the transaction's first batch
    part = logs.get_partition(OFFSETS_TOPIC, 0)
    assert part.producers.entries[42].last_seq == 2
    assert part.append_marker(42, 3, True, 0, 1000).error == ErrorCode.NONE
    fenced = topic.append(0, [(b"k5", b"v5")], 1000, TxnProducer(42, 2, "tx"))
    assert fenced.error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert asyncio.run(topic.durable(second)) == ErrorCode.NONE
    assert list(topic.replay(0)) == [
        StoredRecord(b"k1", b"v1", 0, -1),
        StoredRecord(b"k2", b"v2", 1, 42), StoredRecord(b"k3", None, 1, 42),
        StoredRecord(b"k4", b"v4", 3, 42),
        StoredMarker(42, True),
    ]
    assert list(topic.replay(1)) == []
