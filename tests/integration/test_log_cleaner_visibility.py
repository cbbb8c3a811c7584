"""What a user sees of the log cleaner on a real broker (issue 22): the Prometheus metrics under Kafka's names,
DescribeLogDirs sizes that follow a clean, a corrupt segment that makes one partition uncleanable (a log line, a
metric) while the broker and the other partitions' cleaning go on, and `log.cleaner.io.max.bytes.per.second`."""

from __future__ import annotations

from pathlib import Path

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from tests.integration.helpers import create_topic, metric, scrape, wait_until
from tests.integration.test_log_compaction import KEYS, UPDATES, cleaned_to, latest_of, produce_updates

CLEANER = {"log.cleaner.backoff.ms": 100}
SMALL_SEGMENTS = {"segment.bytes": "8192", "min.cleanable.dirty.ratio": "0.01"}
P = "oncelog_log_cleaner_"


def _disk_size(data_dir: Path, topic: str) -> int:
    return sum(f.stat().st_size for f in (data_dir / f"{topic}-0").glob("*.log"))


def _log_dir_sizes(bootstrap: str) -> dict[str, int]:
    """{topic: size of its partition 0} as DescribeLogDirs reports it."""
    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        (broker_dirs,) = kp.describe_log_dirs()
    finally:
        kp.close()
    (log_dir,) = broker_dirs["log_dirs"]
    return {t["name"]: p["partition_size"] for t in log_dir["topics"] for p in t["partitions"]
            if p["partition_index"] == 0}


def _set_compact(bootstrap: str, topic: str) -> None:
    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        kp.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs={"cleanup.policy": "compact",
                                                                                 **SMALL_SEGMENTS})])
    finally:
        kp.close()


def _corrupt_first_segment(data_dir: Path, topic: str) -> None:
    """Flip a byte inside the first batch's records: its CRC no longer holds."""
    path = data_dir / f"{topic}-0" / f"{0:020d}.log"
    data = bytearray(path.read_bytes())
    data[70] ^= 0xFF  # past the 61-byte batch header, inside the first record
    path.write_bytes(bytes(data))


def test_metrics_uncleanable_partition_and_log_dir_sizes(broker_factory, topic_name):
    broker = broker_factory(CLEANER, metrics=True)
    bad, good = f"{topic_name}-bad", f"{topic_name}-good"
    # Both start as cleanup.policy=delete, so nothing is cleaned before the bad one is damaged and the sizes
    # before the clean are read.
    create_topic(broker.bootstrap, bad, config={"segment.bytes": "8192"})
    create_topic(broker.bootstrap, good, config={"segment.bytes": "8192"})
    produce_updates(broker.bootstrap, bad)
    latest = produce_updates(broker.bootstrap, good)
    data_dir = Path(broker.data_dir)
    before = _log_dir_sizes(broker.bootstrap)
    assert before[good] == _disk_size(data_dir, good) > 0
    _corrupt_first_segment(data_dir, bad)

    _set_compact(broker.bootstrap, bad)
    _set_compact(broker.bootstrap, good)
    recs = cleaned_to(broker, good, KEYS * UPDATES // 3)
    assert latest_of(recs) == latest

    def uncleanable():
        samples = scrape(broker.metrics_port)
        n = metric(samples, P + "uncleanable_partitions_count", log_dir=str(data_dir))
        return samples if n == 1 else None
    samples = wait_until(uncleanable, timeout=30, interval=0.3, what="the bad partition marked uncleanable")
    assert broker.alive()
    log_text = broker.log_path.read_text()
    assert f"{bad}-0: marked uncleanable" in log_text and "fails its CRC" in log_text
    assert "Traceback" not in log_text  # an uncleanable partition is a line, not a crash
    assert metric(samples, P + "uncleanable_bytes", log_dir=str(data_dir)) > 0

    # The good partition's clean, under Kafka's names.
    assert metric(samples, P + "rounds_total") >= 1
    read, written = metric(samples, P + "read_bytes_total"), metric(samples, P + "written_bytes_total")
    assert read > written > 0
    assert 0 < metric(samples, P + "cleaner_recopy_percent") < 100
    assert metric(samples, P + "max_clean_time_secs") > 0
    assert 0 < metric(samples, P + "max_buffer_utilization_percent") <= 100
    # Present (metric() reads 0.0 for a sample that is missing, so a bounds check alone could not fail), and
    # the last pass was recent: passes run every log.cleaner.backoff.ms (100 ms here).
    assert (P + "max_dirty_percent", ()) in samples and 0 <= samples[(P + "max_dirty_percent", ())] <= 100
    assert (P + "time_since_last_run_ms", ()) in samples
    assert 0 < samples[(P + "time_since_last_run_ms", ())] < 10_000
    assert metric(samples, P + "max_compaction_delay_secs") == 0  # max.compaction.lag.ms is not set

    # DescribeLogDirs follows the clean: the cleaned partition is smaller and matches its files; the damaged
    # one is untouched.
    after = _log_dir_sizes(broker.bootstrap)
    assert after[good] == _disk_size(data_dir, good) < before[good]
    assert after[bad] == before[bad]


def test_io_max_bytes_per_second_slows_a_round(broker_factory, topic_name):
    broker = broker_factory({**CLEANER, "log.cleaner.io.max.bytes.per.second": 100_000})
    create_topic(broker.bootstrap, topic_name, config={"cleanup.policy": "compact", **SMALL_SEGMENTS})
    latest = produce_updates(broker.bootstrap, topic_name, updates=30)
    recs = cleaned_to(broker, topic_name, KEYS * 30 // 3, timeout=120)
    assert latest_of(recs) == latest
    lines = [line for line in broker.log_path.read_text().splitlines() if f"{topic_name}-0: cleaned offsets" in line]
    assert lines and any("s throttled" in line for line in lines), lines


def test_internal_topic_sizes_follow_the_clean(broker_factory):
    """__consumer_offsets is listed by DescribeLogDirs with the size of its files, which the cleaner shrinks."""
    from confluent_kafka import Consumer, TopicPartition

    broker = broker_factory({**CLEANER, "offsets.topic.segment.bytes": 16384, "offsets.topic.num.partitions": 1})
    create_topic(broker.bootstrap, "commits-of-one-group")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-sizes",
                         "enable.auto.commit": False})
    try:
        for offset in range(1, 601):
            consumer.commit(offsets=[TopicPartition("commits-of-one-group", 0, offset)], asynchronous=False)
    finally:
        consumer.close()
    data_dir = Path(broker.data_dir)
    written = 600 * 80  # at least this many bytes of commit records were appended

    def cleaned():
        sizes = _log_dir_sizes(broker.bootstrap)
        size = sizes.get("__consumer_offsets")
        return sizes if size is not None and size < written // 2 else None
    sizes = wait_until(cleaned, timeout=60, interval=0.5, what="__consumer_offsets cleaned")
    assert sizes["__consumer_offsets"] == _disk_size(data_dir, "__consumer_offsets")
