"""LogManager: topics on disk, restarts (clean and not), checkpoints, retention."""

from __future__ import annotations

import json
import os

import pytest
from tests.unit.storage.storage_helpers import abandon, build_batch

from oncelog.config import load_broker_config
from oncelog.errors import ErrorCode, KafkaError
from oncelog.records.batch import read_header
from oncelog.storage.checkpoints import read_checkpoint
from oncelog.storage.log_manager import CLEAN_SHUTDOWN_FILE, LogDirError, LogManager


@pytest.fixture
def manager(tmp_path, clock):
    """manager(*settings) -> started LogManager on tmp_path/data; all shut down at the end."""
    started: list[LogManager] = []

    def make(*settings: str, start: bool = True) -> LogManager:
        config = load_broker_config(overrides=["oncelog.fsync.enable=false", *settings])
        mgr = LogManager(tmp_path / "data", config, now_ms=clock)
        if start:
            mgr.startup()
        started.append(mgr)
        return mgr

    yield make
    for mgr in started:
        if mgr._logs:
            mgr.shutdown()


def put(plog, count=1, timestamp=1000):
    buf = build_batch(count, timestamp)
    return plog.append(buf, read_header(buf))


def test_first_start_creates_identity(manager, tmp_path):
    mgr = manager()
    assert len(mgr.cluster_id) == 22 and not mgr.cluster_id.startswith("-")
    text = (tmp_path / "data" / "meta.properties").read_text()
    assert f"cluster.id={mgr.cluster_id}" in text and "node.id=0" in text
    mgr.shutdown()
    assert manager().cluster_id == mgr.cluster_id
    with pytest.raises(LogDirError, match="belongs to node 0"):
        manager("node.id=3")


def test_create_topic_errors(manager):
    mgr = manager()
    mgr.create_topic("orders", 2)
    cases = [
        (("bad name!", 1), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (("orders", 1), ErrorCode.TOPIC_ALREADY_EXISTS),
        (("or.ders", 1), None),
        (("or_ders", 1), ErrorCode.INVALID_TOPIC_EXCEPTION),  # collides with or.ders
        (("zero", 0), ErrorCode.INVALID_PARTITIONS),
    ]
    for args, code in cases:
        if code is None:
            mgr.create_topic(*args)
            continue
        with pytest.raises(KafkaError) as info:
            mgr.create_topic(*args)
        assert info.value.code == code, args
    with pytest.raises(KafkaError) as info:
        mgr.create_topic("cfg", 1, {"retention.ms": "soon"})
    assert info.value.code == ErrorCode.INVALID_CONFIG
    with pytest.raises(KafkaError) as info:
        mgr.create_topic("cfg", 1, {"no.such.key": "1"})
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert "cfg" not in mgr.topics and mgr.get_log("cfg", 0) is None


def test_topics_survive_a_clean_restart(manager, tmp_path):
    mgr = manager()
    meta = mgr.create_topic("orders", 3, {"retention.ms": "1000", "cleanup.policy": "delete"})
    assert len(meta.topic_id) == 16 and meta.config["retention.ms"] == 1000
    for _ in range(5):
        put(mgr.get_log("orders", 1), count=2)
    mgr.shutdown()
    assert (tmp_path / "data" / CLEAN_SHUTDOWN_FILE).exists()

    again = manager()
    assert again.clean_startup
    assert not (tmp_path / "data" / CLEAN_SHUTDOWN_FILE).exists()
    loaded = again.topics["orders"]
    assert (loaded.topic_id, loaded.partitions) == (meta.topic_id, 3)
    assert loaded.config["retention.ms"] == 1000 and loaded.config.overrides["cleanup.policy"] == ["delete"]
    plog = again.get_log("orders", 1)
    assert plog.log_end_offset == plog.high_watermark == 10
    assert put(plog) == 10
    assert read_checkpoint(tmp_path / "data" / "recovery-point-offset-checkpoint")[("orders", 1)] == 10
    doc = json.loads((tmp_path / "data" / "__oncelog_meta" / "topics" / "orders.json").read_text())
    assert doc["topic_id"] == meta.topic_id.hex() and doc["config"]["retention.ms"] == "1000"


def test_unclean_restart_recovers(manager, tmp_path):
    mgr = manager()
    mgr.create_topic("t", 1)
    plog = mgr.get_log("t", 0)
    for _ in range(4):
        put(plog)
    path = plog.segments[-1].log_path
    abandon(plog)  # kill -9
    mgr._logs.clear()
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x01\x00torn")
    again = manager()
    assert not again.clean_startup
    plog = again.get_log("t", 0)
    assert plog.log_end_offset == 4 and put(plog) == 4


def test_delete_topic(manager, tmp_path):
    mgr = manager()
    mgr.create_topic("gone", 2)
    put(mgr.get_log("gone", 0))
    mgr.delete_topic("gone")
    assert "gone" not in mgr.topics and mgr.get_log("gone", 0) is None
    assert not (tmp_path / "data" / "gone-0").exists()
    assert ("gone", 0) not in read_checkpoint(tmp_path / "data" / "log-start-offset-checkpoint")
    with pytest.raises(KafkaError) as info:
        mgr.delete_topic("gone")
    assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # Recreated under the same name: a new topic, empty.
    meta = mgr.create_topic("gone", 1)
    assert mgr.get_log("gone", 0).log_end_offset == 0
    mgr.shutdown()
    assert manager().topics["gone"].topic_id == meta.topic_id


def test_create_partitions(manager):
    mgr = manager()
    mgr.create_topic("grow", 1)
    mgr.create_partitions("grow", 3)
    assert mgr.topics["grow"].partitions == 3 and mgr.get_log("grow", 2) is not None
    for total in (3, 2):
        with pytest.raises(KafkaError) as info:
            mgr.create_partitions("grow", total)
        assert info.value.code == ErrorCode.INVALID_PARTITIONS
    with pytest.raises(KafkaError) as info:
        mgr.create_partitions("nope", 3)
    assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    mgr.shutdown()
    assert manager().topics["grow"].partitions == 3


def test_alter_topic_config(manager):
    mgr = manager()
    mgr.create_topic("cfg", 2, {"retention.ms": "1000"})
    mgr.alter_topic_config("cfg", {"retention.bytes": "5000"}, incremental=True)
    assert mgr.get_log("cfg", 1).config["retention.bytes"] == 5000
    assert mgr.topics["cfg"].config.overrides == {"retention.ms": 1000, "retention.bytes": 5000}
    mgr.alter_topic_config("cfg", {"segment.bytes": "100000"})  # replaces all overrides
    assert mgr.topics["cfg"].config.overrides == {"segment.bytes": 100000}
    assert mgr.get_log("cfg", 0).config["retention.ms"] == mgr.config.retention_ms
    with pytest.raises(KafkaError) as info:
        mgr.alter_topic_config("cfg", {"segment.bytes": "1"})
    assert info.value.code == ErrorCode.INVALID_CONFIG
    mgr.shutdown()
    assert manager().topics["cfg"].config.overrides == {"segment.bytes": 100000}


def test_stray_partition_directories_are_removed(manager, tmp_path):
    mgr = manager()
    mgr.create_topic("t", 1)
    mgr.shutdown()
    for name in ("ghost-0", "t-1"):
        (tmp_path / "data" / name).mkdir()
    (tmp_path / "data" / "not-a-partition").mkdir()
    manager()
    names = set(os.listdir(tmp_path / "data"))
    assert "ghost-0" not in names and "t-1" not in names and {"t-0", "not-a-partition"} <= names


def test_retention_and_delete_records_are_checkpointed(manager, tmp_path, clock):
    mgr = manager()
    size = len(build_batch())
    mgr.create_topic("r", 1, {"segment.bytes": str(2 * size), "retention.ms": "1000"})
    plog = mgr.get_log("r", 0)
    for ts in (0, 0, 0, 0, 5000):
        put(plog, timestamp=ts)
    assert mgr.run_retention(now_ms=3000) == 2
    starts = tmp_path / "data" / "log-start-offset-checkpoint"
    assert read_checkpoint(starts)[("r", 0)] == 4
    assert mgr.delete_records("r", 0, 5) == 5
    assert read_checkpoint(starts)[("r", 0)] == 5
    abandon(plog)
    mgr._logs.clear()
    assert manager().get_log("r", 0).log_start_offset == 5


def test_an_older_checkpoint_snapshot_never_overwrites_a_newer_one(manager, tmp_path):
    """The periodic checkpoint takes its offsets on the loop and writes them on a thread; a checkpoint written
    meanwhile (DeleteRecords writes one at once) is newer and must stay."""
    mgr = manager()
    mgr.create_topic("c", 1, {})
    plog = mgr.get_log("c", 0)
    for _ in range(6):
        put(plog)
    older = mgr.checkpoint_offsets()  # taken before the records go
    assert mgr.delete_records("c", 0, 4) == 4  # writes its own checkpoint, newer
    starts = tmp_path / "data" / "log-start-offset-checkpoint"
    assert read_checkpoint(starts)[("c", 0)] == 4
    mgr.write_checkpoints(older)  # the thread's write comes late: skipped
    assert read_checkpoint(starts)[("c", 0)] == 4
    newer = mgr.checkpoint_offsets()
    mgr.write_checkpoints(newer)
    assert read_checkpoint(starts)[("c", 0)] == 4 and newer.starts[("c", 0)] == 4


def test_corrupt_checkpoint_does_not_stop_startup(manager, tmp_path):
    mgr = manager()
    mgr.create_topic("t", 1)
    put(mgr.get_log("t", 0))
    mgr.shutdown()
    (tmp_path / "data" / "recovery-point-offset-checkpoint").write_text("garbage")
    again = manager()
    assert again.get_log("t", 0).log_end_offset == 1


# -- cluster mode: only the replicas assigned to this broker ---------------------------------------------------

def test_cluster_id_from_the_coordination_service(tmp_path, clock):
    config = load_broker_config(overrides=["oncelog.fsync.enable=false", "node.id=2"])
    mgr = LogManager(tmp_path / "data", config, now_ms=clock)
    mgr.startup(cluster_id="ClusterFromZooKeeper01")
    assert mgr.cluster_id == "ClusterFromZooKeeper01"
    mgr.shutdown()
    again = LogManager(tmp_path / "data", config, now_ms=clock)
    with pytest.raises(LogDirError, match="belongs to cluster ClusterFromZooKeeper01"):
        again.startup(cluster_id="AnotherClusterAltogeth")


def test_replicas_of_some_partitions_survive_a_restart(manager, tmp_path):
    mgr = manager()
    topic_id = bytes(range(16))
    part = mgr.open_replica("spread", topic_id, 2, 4, {"retention.ms": "1000"})
    put(part.log, 3)
    assert mgr.open_replica("spread", topic_id, 2, 4) is part  # opened once
    mgr.open_replica("spread", topic_id, 0, 4)
    assert sorted(p.index for p in mgr.all_partitions()) == [0, 2]
    assert mgr.topics["spread"].partitions == 4 and mgr.topics["spread"].config["retention.ms"] == 1000
    with pytest.raises(KafkaError) as err:
        mgr.open_replica("spread", bytes(16), 1, 4)
    assert err.value.code == ErrorCode.INCONSISTENT_TOPIC_ID
    mgr.set_partition_count("spread", 6)
    mgr.shutdown()
    (tmp_path / "data" / "spread-5").mkdir()  # a directory no replica claims: removed at startup
    mgr = manager()
    meta = mgr.topics["spread"]
    assert (meta.topic_id, meta.partitions, meta.local) == (topic_id, 6, {0, 2})
    assert mgr.get_log("spread", 2).log_end_offset == 3 and mgr.get_log("spread", 1) is None
    assert not (tmp_path / "data" / "spread-5").exists()
    mgr.delete_replica("spread", 2)
    assert mgr.get_log("spread", 2) is None and not (tmp_path / "data" / "spread-2").exists()
    mgr.delete_replica("spread", 0)  # the last one: the topic goes
    assert "spread" not in mgr.topics and not (tmp_path / "data" / "spread-0").exists()
