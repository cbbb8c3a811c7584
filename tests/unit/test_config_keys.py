"""Pure parsing of broker keys (issue 21's audit, docs/config-keys.md): a broker key that only supplies a topic
key's default, or a setting another module reads, reaches it; what that topic key or setting then does is tested
where it acts (named in docs/config-keys.md)."""

from __future__ import annotations

import pytest

from oncelog.config import BROKER_KEYS, REFUSED_BROKER_KEYS, TOPIC_KEYS, ConfigError, load_broker_config
from oncelog.coordinator.group.settings import GroupSettings


@pytest.mark.parametrize(("broker_key", "value", "topic_key", "expected"), [
    ("log.cleanup.policy", "compact", "cleanup.policy", ["compact"]),
    ("compression.type", "zstd", "compression.type", "zstd"),
    ("compression.gzip.level", "1", "compression.gzip.level", 1),
    ("compression.lz4.level", "12", "compression.lz4.level", 12),
    ("compression.zstd.level", "-5", "compression.zstd.level", -5),
    ("message.max.bytes", "2000", "max.message.bytes", 2000),
    ("log.message.timestamp.type", "LogAppendTime", "message.timestamp.type", "LogAppendTime"),
    ("log.message.timestamp.before.max.ms", "1000", "message.timestamp.before.max.ms", 1000),
    ("log.message.timestamp.after.max.ms", "2000", "message.timestamp.after.max.ms", 2000),
    ("log.retention.bytes", "4096", "retention.bytes", 4096),
    ("log.segment.bytes", "8192", "segment.bytes", 8192),
    ("log.index.size.max.bytes", "4096", "segment.index.bytes", 4096),
    ("log.index.interval.bytes", "100", "index.interval.bytes", 100),
    ("log.segment.delete.delay.ms", "0", "file.delete.delay.ms", 0),
    ("min.insync.replicas", "2", "min.insync.replicas", 2),
    ("unclean.leader.election.enable", "true", "unclean.leader.election.enable", True),
    ("log.retention.ms", "1234", "retention.ms", 1234),
    ("log.retention.minutes", "3", "retention.ms", 180_000),
    ("log.retention.hours", "2", "retention.ms", 7_200_000),
    ("log.roll.ms", "5000", "segment.ms", 5000),
    ("log.roll.hours", "3", "segment.ms", 10_800_000),
    ("log.cleaner.min.cleanable.ratio", "0.25", "min.cleanable.dirty.ratio", 0.25),
    ("log.cleaner.delete.retention.ms", "5000", "delete.retention.ms", 5000),
    ("log.cleaner.min.compaction.lag.ms", "6000", "min.compaction.lag.ms", 6000),
    ("log.cleaner.max.compaction.lag.ms", "7000", "max.compaction.lag.ms", 7000),
])
def test_broker_key_is_the_topic_default(broker_key, value, topic_key, expected):
    config = load_broker_config(overrides=[f"{broker_key}={value}"])
    assert config.topic_config()[topic_key] == expected
    assert config.topic_config({topic_key: TOPIC_KEYS[topic_key].default})[topic_key] == TOPIC_KEYS[topic_key].default


def test_retention_and_roll_precedence():
    """Kafka's precedence: log.retention.ms over .minutes over .hours; log.roll.ms over log.roll.hours; -1 stays
    'never' in every unit."""
    both = load_broker_config(overrides=["log.retention.ms=10", "log.retention.minutes=1", "log.retention.hours=1"])
    assert both.retention_ms == 10
    assert load_broker_config(overrides=["log.retention.minutes=1", "log.retention.hours=5"]).retention_ms == 60_000
    assert load_broker_config(overrides=["log.retention.hours=-1"]).retention_ms == -1
    assert load_broker_config(overrides=["log.retention.minutes=-1"]).retention_ms == -1
    assert load_broker_config(overrides=["log.roll.ms=7", "log.roll.hours=1"]).roll_ms == 7
    assert load_broker_config().retention_ms == load_broker_config().roll_ms == 168 * 3_600_000


def test_group_keys_reach_the_group_coordinator_settings():
    settings = GroupSettings.from_config(load_broker_config(overrides=[
        "offsets.retention.minutes=2", "offsets.retention.check.interval.ms=1500", "offset.metadata.max.bytes=10",
        "group.max.size=3", "group.min.session.timeout.ms=100", "group.max.session.timeout.ms=900",
        "group.initial.rebalance.delay.ms=7", "offsets.topic.num.partitions=5", "message.max.bytes=5000"]))
    assert (settings.offsets_retention_ms, settings.retention_check_interval_ms, settings.offset_metadata_max_bytes,
            settings.group_max_size, settings.min_session_timeout_ms, settings.max_session_timeout_ms,
            settings.initial_rebalance_delay_ms, settings.offsets_partitions, settings.max_member_metadata_bytes) == (
        120_000, 1500, 10, 3, 100, 900, 7, 5, 5000)


@pytest.mark.parametrize("key", sorted(REFUSED_BROKER_KEYS))
def test_refused_key_is_named_at_startup(key):
    assert key not in BROKER_KEYS
    with pytest.raises(ConfigError, match=f"^Configuration {key} is not supported: "):
        load_broker_config(overrides=[f"{key}=1000"])
    with pytest.raises(ConfigError, match=f"^Configuration {key} is not supported: "):
        load_broker_config(f"{key}=1000\n", strict=False)


@pytest.mark.parametrize(("key", "bad"), [
    ("compression.gzip.level", "0"), ("compression.gzip.level", "10"), ("compression.lz4.level", "18"),
    ("compression.zstd.level", "23"), ("compression.zstd.level", "-131073"),
])
def test_compression_levels_outside_kafkas_ranges_are_refused(key, bad):
    with pytest.raises(ConfigError, match=f"configuration {key}: must be between"):
        load_broker_config(overrides=[f"{key}={bad}"])


def test_zookeeper_set_acl_without_a_cluster_is_refused_not_ignored():
    with pytest.raises(ConfigError, match="zookeeper.set.acl=true needs a cluster's ZooKeeper"):
        load_broker_config(overrides=["zookeeper.set.acl=true"])
    assert load_broker_config(overrides=["zookeeper.set.acl=true", "oncelog.coordination.connect=127.0.0.1:2181"])
