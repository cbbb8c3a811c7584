"""Admin APIs with confluent-kafka's AdminClient, kafka-python's KafkaAdminClient and raw requests:
CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, IncrementalAlterConfigs, DescribeCluster,
DescribeLogDirs, ListOffsets; exact error codes for bad input; topics and configs across restarts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import CreateTopicsRequest
from tests.integration.helpers import (
    Out,
    Wire,
    admin,
    ck_consume,
    ck_produce,
    create_topic,
    in_log_order,
    list_offset_raw,
)

# Kafka error codes
UNKNOWN_TOPIC_OR_PARTITION = 3
UNKNOWN_TOPIC_ID = 100
MESSAGE_TOO_LARGE = 10
INVALID_TOPIC_EXCEPTION = 17
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_CONFIG = 40
INVALID_REQUEST = 42

DEFAULTS = {
    "cleanup.policy": "delete", "compression.type": "producer", "compression.gzip.level": "-1",
    "compression.lz4.level": "9", "compression.zstd.level": "3", "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime", "message.timestamp.before.max.ms": "9223372036854775807",
    "message.timestamp.after.max.ms": "9223372036854775807", "retention.ms": "604800000",
    "retention.bytes": "-1", "segment.bytes": "1073741824", "segment.ms": "604800000",
    "segment.index.bytes": "10485760", "index.interval.bytes": "4096", "min.insync.replicas": "1",
    "file.delete.delay.ms": "60000", "unclean.leader.election.enable": "false",
    "delete.retention.ms": "86400000", "min.cleanable.dirty.ratio": "0.5", "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": "9223372036854775807",
}


def error_code(future) -> int:
    """The Kafka error code a confluent-kafka admin future failed with (0: it succeeded)."""
    try:
        future.result(timeout=15)
    except KafkaException as exc:
        return exc.args[0].code()
    return 0


def create_codes(bs: str, *topics: NewTopic, validate_only: bool = False) -> dict[str, int]:
    client = admin(bs)
    futures = client.create_topics(list(topics), operation_timeout=10, validate_only=validate_only)
    return {name: error_code(f) for name, f in futures.items()}


def topic_configs(bs: str, topic: str) -> dict[str, tuple[str | None, int]]:
    """{name: (value, source)} of every config of a topic."""
    client = admin(bs)
    (future,) = client.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return {name: (entry.value, entry.source) for name, entry in future.result(timeout=15).items()}


def topic_partitions(bs: str) -> dict[str, int]:
    md = admin(bs).list_topics(timeout=10)
    return {name: len(t.partitions) for name, t in md.topics.items()}


def alter(bs: str, topic: str, *entries: tuple[str, str | None, AlterConfigOpType],
          validate_only: bool = False) -> int:
    client = admin(bs)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=op) for name, value, op in entries])
    (future,) = client.incremental_alter_configs([resource], validate_only=validate_only).values()
    return error_code(future)


def topic_id(bs: str, topic: str) -> str:
    client = admin(bs)
    (future,) = client.describe_topics(TopicCollection([topic])).values()
    return str(future.result(timeout=15).topic_id)


def cluster_id_of(bs: str) -> str:
    client = admin(bs)
    return client.describe_cluster().result(timeout=15).cluster_id


DYNAMIC = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
DEFAULT = ConfigSource.DEFAULT_CONFIG.value
STATIC = ConfigSource.STATIC_BROKER_CONFIG.value


# -- CreateTopics -----------------------------------------------------------------------------------------


def test_create_topic_with_configs(module_broker, topic_name):
    bs = module_broker.bootstrap
    overrides = {"retention.ms": "3600000", "cleanup.policy": "compact,delete", "max.message.bytes": "2000000"}
    assert create_codes(bs, NewTopic(topic_name, 3, 1, config=overrides)) == {topic_name: 0}
    want = {name: (value, DEFAULT) for name, value in DEFAULTS.items()}
    want.update({name: (value, DYNAMIC) for name, value in overrides.items()})
    assert topic_configs(bs, topic_name) == want
    md = admin(bs).list_topics(topic_name, timeout=10).topics[topic_name]
    assert md.error is None
    assert sorted(md.partitions) == [0, 1, 2]
    assert {(p.leader, tuple(p.replicas), tuple(p.isrs)) for p in md.partitions.values()} == {(0, (0,), (0,))}


def test_create_topic_defaults_come_from_broker_settings(broker_factory, topic_name):
    broker = broker_factory({"num.partitions": 3, "log.retention.ms": 7200000, "log.segment.bytes": 5000000})
    bs = broker.bootstrap
    create_topic(bs, topic_name, 2, {"segment.bytes": "100000"})
    configs = topic_configs(bs, topic_name)
    assert configs["retention.ms"] == ("7200000", STATIC)
    assert configs["segment.bytes"] == ("100000", DYNAMIC)
    assert configs["retention.bytes"] == ("-1", DEFAULT)
    # num.partitions applies to a topic created without a partition count (-1) ...
    with Wire(bs) as w:
        req = CreateTopicsRequest[7]
        resp = w.request(req(topics=[req.CreatableTopic(name=f"{topic_name}-d", num_partitions=-1,
                                                         replication_factor=-1, assignments=[], configs=[])],
                             timeout_ms=5000, validate_only=False), 7)
    (result,) = resp.topics
    assert (result.error_code, result.num_partitions, result.replication_factor) == (0, 3, 1)
    # ... and to an auto-created one.
    ck_produce(bs, f"{topic_name}-auto", [Out(2, b"k", b"v")])
    assert topic_partitions(bs)[f"{topic_name}-d"] == 3
    assert topic_partitions(bs)[f"{topic_name}-auto"] == 3
    # The broker resource shows the explicit settings as static broker configs.
    client = admin(bs)
    (future,) = client.describe_configs([ConfigResource(ResourceType.BROKER, "0")]).values()
    entries = future.result(timeout=15)
    assert (entries["num.partitions"].value, entries["num.partitions"].source) == ("3", STATIC)
    assert (entries["log.retention.ms"].value, entries["log.retention.ms"].source) == ("7200000", STATIC)
    assert (entries["message.max.bytes"].value, entries["message.max.bytes"].source) == ("1048588", DEFAULT)
    assert entries["num.partitions"].is_read_only


BAD_NAMES = ["bad name", "sl/ash", "a" * 250, ".", "..", "ümlaut", "__reserved"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_create_topic_bad_name(module_broker, name):
    assert create_codes(module_broker.bootstrap, NewTopic(name, 1, 1)) == {name: INVALID_TOPIC_EXCEPTION}
    assert name not in topic_partitions(module_broker.bootstrap)


def test_create_topic_errors(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2, {"retention.ms": "1000"})
    t = topic_name
    assert create_codes(bs, NewTopic(t, 4, 1)) == {t: TOPIC_ALREADY_EXISTS}
    assert create_codes(bs, NewTopic(f"{t}-rf", 1, 3)) == {f"{t}-rf": INVALID_REPLICATION_FACTOR}
    assert create_codes(bs, NewTopic(f"{t}-np", 0, 1)) == {f"{t}-np": INVALID_PARTITIONS}
    assert create_codes(bs, NewTopic(f"{t}-cv", 1, 1, config={"retention.ms": "soon"})) == {f"{t}-cv": INVALID_CONFIG}
    assert create_codes(bs, NewTopic(f"{t}-ck", 1, 1, config={"no.such.key": "1"})) == {f"{t}-ck": INVALID_CONFIG}
    assert create_codes(bs, NewTopic(f"{t}-cp", 1, 1, config={"cleanup.policy": "shred"})) == {f"{t}-cp": INVALID_CONFIG}
    assert create_codes(bs, NewTopic(f"{t}-ct", 1, 1, config={"message.timestamp.type": "Now"})) == {
        f"{t}-ct": INVALID_CONFIG}
    # '.' and '_' collide (Kafka's metric names)
    assert create_codes(bs, NewTopic(t.replace("-", "."), 1, 1)) == {t.replace("-", "."): 0}
    assert create_codes(bs, NewTopic(t.replace("-", "_"), 1, 1)) == {t.replace("-", "_"): INVALID_TOPIC_EXCEPTION}
    # One good and one bad topic in a request: each gets its own answer.
    assert create_codes(bs, NewTopic(f"{t}-ok", 2, 1), NewTopic(t, 1, 1)) == {f"{t}-ok": 0, t: TOPIC_ALREADY_EXISTS}
    # None of the failures changed the existing topic or left anything behind.
    topics = topic_partitions(bs)
    assert topics[t] == 2 and topics[f"{t}-ok"] == 2
    assert not {f"{t}-rf", f"{t}-np", f"{t}-cv", f"{t}-ck", f"{t}-cp", f"{t}-ct"} & set(topics)
    assert topic_configs(bs, t)["retention.ms"] == ("1000", DYNAMIC)


def test_create_topic_validate_only(module_broker, topic_name):
    bs = module_broker.bootstrap
    assert create_codes(bs, NewTopic(topic_name, 2, 1, config={"retention.ms": "5"}), validate_only=True) == {
        topic_name: 0}
    assert topic_name not in topic_partitions(bs)
    assert create_codes(bs, NewTopic(topic_name, 2, 1, config={"retention.ms": "x"}), validate_only=True) == {
        topic_name: INVALID_CONFIG}
    create_topic(bs, topic_name, 1)
    assert create_codes(bs, NewTopic(topic_name, 2, 1), validate_only=True) == {topic_name: TOPIC_ALREADY_EXISTS}


# -- DeleteTopics -----------------------------------------------------------------------------------------


def test_delete_topic(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2)
    ck_produce(bs, topic_name, [Out(p, b"k", b"v%d" % i) for i in range(3) for p in (0, 1)])
    client = admin(bs)
    futures = client.delete_topics([topic_name, f"{topic_name}-missing"], operation_timeout=10)
    assert {n: error_code(f) for n, f in futures.items()} == {topic_name: 0,
                                                               f"{topic_name}-missing": UNKNOWN_TOPIC_OR_PARTITION}
    assert topic_name not in topic_partitions(bs)
    assert not list(Path(module_broker.data_dir).glob(f"{topic_name}-*"))
    # A topic created again under the same name starts empty.
    create_topic(bs, topic_name, 1)
    assert ck_consume(bs, topic_name, {0: 0}) == []
    assert ck_produce(bs, topic_name, [Out(0, b"again", b"1")]) == [(0, 0)]


# -- CreatePartitions -------------------------------------------------------------------------------------


def test_create_partitions(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2)
    before = [Out(p, b"k", b"before-%d" % p, (), 1000 + p) for p in (0, 1)]
    ck_produce(bs, topic_name, before)
    client = admin(bs)

    def grow(count: int, validate_only: bool = False, topic: str = topic_name) -> int:
        (future,) = client.create_partitions([NewPartitions(topic, count)], validate_only=validate_only).values()
        return error_code(future)

    assert grow(5, validate_only=True) == 0
    assert topic_partitions(bs)[topic_name] == 2
    assert grow(5) == 0
    assert topic_partitions(bs)[topic_name] == 5
    assert grow(3) == INVALID_PARTITIONS
    assert grow(5) == INVALID_PARTITIONS
    assert grow(7, topic=f"{topic_name}-missing") == UNKNOWN_TOPIC_OR_PARTITION
    assert topic_partitions(bs)[topic_name] == 5
    after = [Out(4, b"k", b"new partition", (), 2000), Out(2, b"k", b"also new", (), 2001),
             Out(0, b"k", b"old partition", (), 2002)]
    assert ck_produce(bs, topic_name, after) == [(4, 0), (2, 0), (0, 1)]
    assert ck_consume(bs, topic_name, {p: 0 for p in range(5)}) == in_log_order(before + after)


# -- DescribeConfigs / IncrementalAlterConfigs ------------------------------------------------------------


def test_incremental_alter_configs(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1, {"retention.ms": "100000"})
    S, D, A, R = (AlterConfigOpType.SET, AlterConfigOpType.DELETE, AlterConfigOpType.APPEND,
                  AlterConfigOpType.SUBTRACT)
    assert alter(bs, topic_name, ("retention.ms", "200000", S), ("segment.bytes", "1048576", S)) == 0
    c = topic_configs(bs, topic_name)
    assert (c["retention.ms"], c["segment.bytes"]) == (("200000", DYNAMIC), ("1048576", DYNAMIC))
    assert alter(bs, topic_name, ("cleanup.policy", "compact", A)) == 0
    assert topic_configs(bs, topic_name)["cleanup.policy"] == ("delete,compact", DYNAMIC)
    assert alter(bs, topic_name, ("cleanup.policy", "delete", R)) == 0
    assert topic_configs(bs, topic_name)["cleanup.policy"] == ("compact", DYNAMIC)
    assert alter(bs, topic_name, ("retention.ms", None, D), ("cleanup.policy", None, D)) == 0
    c = topic_configs(bs, topic_name)
    assert (c["retention.ms"], c["cleanup.policy"], c["segment.bytes"]) == (
        ("604800000", DEFAULT), ("delete", DEFAULT), ("1048576", DYNAMIC))

    snapshot = topic_configs(bs, topic_name)
    # validate_only changes nothing; bad values and unknown keys are INVALID_CONFIG and change nothing either,
    # not even the good entries of the same resource.
    assert alter(bs, topic_name, ("retention.ms", "1", S), validate_only=True) == 0
    assert alter(bs, topic_name, ("retention.ms", "-7", S)) == INVALID_CONFIG
    assert alter(bs, topic_name, ("retention.ms", "1", S), ("segment.bytes", "big", S)) == INVALID_CONFIG
    assert alter(bs, topic_name, ("no.such.config", "1", S)) == INVALID_CONFIG
    assert alter(bs, topic_name, ("retention.ms", "1", A)) == INVALID_CONFIG  # APPEND needs a list config
    assert topic_configs(bs, topic_name) == snapshot
    assert alter(bs, f"{topic_name}-missing", ("retention.ms", "1", S)) == UNKNOWN_TOPIC_OR_PARTITION

    # Broker settings are static here.
    client = admin(bs)
    (future,) = client.incremental_alter_configs([ConfigResource(ResourceType.BROKER, "0", incremental_configs=[
        ConfigEntry("log.retention.ms", "1", incremental_operation=S)])]).values()
    assert error_code(future) == INVALID_REQUEST


def test_replication_throttles_can_be_deleted_but_not_set(module_broker, topic_name):
    # Kafka's reassignment tool clears throttles (DELETE on every broker and on the topics) after each --verify,
    # whether it set any or not; oncelog has none, so deleting succeeds and changes nothing, and setting one is
    # refused rather than silently ignored.
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    S, D = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    snapshot = topic_configs(bs, topic_name)
    assert alter(bs, topic_name, ("leader.replication.throttled.replicas", None, D),
                 ("follower.replication.throttled.replicas", None, D)) == 0
    assert topic_configs(bs, topic_name) == snapshot
    assert alter(bs, topic_name, ("leader.replication.throttled.replicas", "*", S)) == INVALID_CONFIG
    assert alter(bs, topic_name, ("follower.replication.throttled.replicas", "0:0", S),
                 ("retention.ms", "1000", S)) == INVALID_CONFIG
    assert topic_configs(bs, topic_name) == snapshot

    client = admin(bs)  # kept referenced: a destroyed handle fails its futures

    def broker_alter(name: str, *entries: tuple[str, str | None, AlterConfigOpType]) -> int:
        (future,) = client.incremental_alter_configs([ConfigResource(ResourceType.BROKER, name, incremental_configs=[
            ConfigEntry(key, value, incremental_operation=op) for key, value, op in entries])]).values()
        return error_code(future)

    throttles = ("leader.replication.throttled.rate", "follower.replication.throttled.rate",
                 "replica.alter.log.dirs.io.max.bytes.per.second")
    assert broker_alter("0", *[(key, None, D) for key in throttles]) == 0
    assert broker_alter("0", ("log.retention.ms", None, D)) == 0  # no dynamic override exists to delete
    assert broker_alter("0", ("leader.replication.throttled.rate", "1000000", S)) == INVALID_CONFIG
    assert broker_alter("0", ("log.retention.ms", "1", S)) == INVALID_REQUEST


def test_altered_config_takes_effect(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    assert ck_produce(bs, topic_name, [Out(0, b"k", b"x" * 3000)]) == [(0, 0)]
    assert alter(bs, topic_name, ("max.message.bytes", "1000", AlterConfigOpType.SET)) == 0
    errors = []
    producer_conf = {"bootstrap.servers": bs, "enable.idempotence": False, "acks": "all", "retries": 0}
    producer = Producer(producer_conf)
    producer.produce(topic_name, key=b"k", value=b"x" * 3000, partition=0,
                     on_delivery=lambda err, msg: errors.append(err))
    producer.flush(15)
    assert len(errors) == 1 and errors[0] is not None and errors[0].code() == MESSAGE_TOO_LARGE
    assert ck_produce(bs, topic_name, [Out(0, b"k", b"small")]) == [(0, 1)]


def test_describe_configs_errors_and_key_filter(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    client = admin(bs)
    (future,) = client.describe_configs([ConfigResource(ResourceType.TOPIC, f"{topic_name}-missing")]).values()
    assert error_code(future) == UNKNOWN_TOPIC_OR_PARTITION
    # kafka-python: keys filter and documentation
    kp = KafkaAdminClient(bootstrap_servers=bs)
    try:
        got = kp.describe_configs([KPConfigResource("TOPIC", topic_name, {"retention.ms": None,
                                                                           "cleanup.policy": None})],
                                  config_filter="all")
    finally:
        kp.close()
    entries = got["topic"][topic_name]
    assert sorted(entries) == ["cleanup.policy", "retention.ms"]
    assert (entries["retention.ms"]["value"], entries["retention.ms"]["config_source"],
            entries["retention.ms"]["config_type"]) == ("604800000", "DEFAULT_CONFIG", "LONG")
    assert (entries["cleanup.policy"]["value"], entries["cleanup.policy"]["config_type"]) == ("delete", "LIST")


def test_metadata_by_topic_id_whatever_name_comes_with_it(module_broker, topic_name):
    # Metadata v12 by topic id: Kafka's Java admin (kafka-topics --describe --topic-id) sends an empty name beside
    # the id, others a null one; both are by id. An unknown id is UNKNOWN_TOPIC_ID naming that id.
    import uuid

    from kafka.protocol.metadata import MetadataRequest

    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2)
    req = MetadataRequest[12]

    def by_id(name, tid):
        with Wire(bs) as w:
            resp = w.request(req(topics=[req.MetadataRequestTopic(name=name, topic_id=tid)],
                                 allow_auto_topic_creation=False, include_topic_authorized_operations=False), 12)
        (entry,) = resp.topics
        return entry

    with Wire(bs) as w:
        by_name = w.request(req(topics=[req.MetadataRequestTopic(name=topic_name, topic_id=None)],
                                allow_auto_topic_creation=False, include_topic_authorized_operations=False), 12)
    tid = by_name.topics[0].topic_id
    assert tid.int != 0
    for name in (None, ""):
        entry = by_id(name, tid)
        assert (entry.error_code, entry.name, entry.topic_id, len(entry.partitions)) == (0, topic_name, tid, 2)
    unknown = uuid.uuid4()
    entry = by_id("", unknown)
    assert (entry.error_code, entry.name, entry.topic_id, entry.partitions) == (UNKNOWN_TOPIC_ID, None, unknown, [])


# -- DescribeCluster / DescribeLogDirs --------------------------------------------------------------------


def test_describe_cluster(module_broker):
    bs = module_broker.bootstrap
    client = admin(bs)
    result = client.describe_cluster(request_timeout=10).result(timeout=15)
    assert result.controller.id == 0
    assert [(n.id, n.host, n.port) for n in result.nodes] == [(0, "127.0.0.1", module_broker.port)]
    assert result.cluster_id and len(result.cluster_id) == 22  # a base64url UUID, as Kafka's
    assert admin(bs).list_topics(timeout=10).cluster_id == result.cluster_id
    kp = KafkaAdminClient(bootstrap_servers=bs)
    try:
        described = kp.describe_cluster()
    finally:
        kp.close()
    assert described["cluster_id"] == result.cluster_id
    assert described["controller_id"] == 0
    assert described["brokers"] == [{"broker_id": 0, "host": "127.0.0.1", "port": module_broker.port, "rack": None}]


def _disk_size(data_dir: Path, topic: str, partition: int) -> int:
    return sum(f.stat().st_size for f in (data_dir / f"{topic}-{partition}").glob("*.log"))


def test_describe_log_dirs(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 3)
    ck_produce(bs, topic_name, [Out(p, b"k", b"v" * (100 * (p + 1))) for p in (0, 1) for _ in range(5)])
    data_dir = Path(module_broker.data_dir)
    kp = KafkaAdminClient(bootstrap_servers=bs)
    try:
        (broker_dirs,) = kp.describe_log_dirs()
    finally:
        kp.close()
    assert broker_dirs["broker"] == 0
    (log_dir,) = broker_dirs["log_dirs"]
    assert log_dir["error_code"] == 0
    assert Path(log_dir["log_dir"]) == data_dir.resolve()
    assert log_dir["total_bytes"] > log_dir["usable_bytes"] > 0
    (topic,) = [t for t in log_dir["topics"] if t["name"] == topic_name]
    sizes = {p["partition_index"]: p["partition_size"] for p in topic["partitions"]}
    assert sizes == {p: _disk_size(data_dir, topic_name, p) for p in range(3)}
    assert sizes[2] == 0 and 0 < sizes[0] < sizes[1]


# -- ListOffsets ------------------------------------------------------------------------------------------

TIMESTAMPS = [1000, 5000, 3000, 9000, 2000, 9000, 4000]


def _list_offsets(bs: str, topic: str, specs: dict[str, OffsetSpec]) -> dict[str, tuple[int, int]]:
    client = admin(bs)
    out = {}
    for label, spec in specs.items():
        (future,) = client.list_offsets({TopicPartition(topic, 0): spec}, request_timeout=10).values()
        info = future.result(timeout=15)
        out[label] = (info.offset, info.timestamp)
    return out


SPECS = {
    "earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest(), "max": OffsetSpec.max_timestamp(),
    "t0": OffsetSpec.for_timestamp(0), "t1000": OffsetSpec.for_timestamp(1000),
    "t2500": OffsetSpec.for_timestamp(2500), "t5000": OffsetSpec.for_timestamp(5000),
    "t6000": OffsetSpec.for_timestamp(6000), "t9001": OffsetSpec.for_timestamp(9001),
}
# Kafka's answers: the first record with a timestamp >= the target; the first record with the largest timestamp.
WANT = {"earliest": (0, -1), "latest": (7, -1), "max": (3, 9000), "t0": (0, 1000), "t1000": (0, 1000),
        "t2500": (1, 5000), "t5000": (1, 5000), "t6000": (3, 9000), "t9001": (-1, -1)}


def test_list_offsets_one_record_per_batch(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    for ts in TIMESTAMPS:  # one produce call (and batch) per record
        ck_produce(bs, topic_name, [Out(0, b"k", b"ts%d" % ts, (), ts)], **{"linger.ms": 0})
    got = _list_offsets(bs, topic_name, SPECS)
    assert got == WANT
    # The same through raw ListOffsets v7 (MAX_TIMESTAMP is -3) ...
    with Wire(bs) as w:
        assert list_offset_raw(w, topic_name, 0, -3) == (0, 3, 9000)
        assert list_offset_raw(w, topic_name, 0, -2) == (0, 0, -1)
        assert list_offset_raw(w, topic_name, 0, -1) == (0, 7, -1)
        assert list_offset_raw(w, topic_name, 0, 2500) == (0, 1, 5000)
        assert list_offset_raw(w, topic_name, 0, 2500, version=1) == (0, 1, 5000)
        assert list_offset_raw(w, f"{topic_name}-missing", 0, -1)[0] == UNKNOWN_TOPIC_OR_PARTITION
        assert list_offset_raw(w, topic_name, 1, -1)[0] == UNKNOWN_TOPIC_OR_PARTITION
    # ... and through kafka-python's consumer.
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bs, group_id=None, enable_auto_commit=False)
    try:
        tp = KTP(topic_name, 0)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 7}
        found = consumer.offsets_for_times({tp: 2500})[tp]
        assert (found.offset, found.timestamp) == (1, 5000)
        assert consumer.offsets_for_times({tp: 9001})[tp] is None
    finally:
        consumer.close()


def test_list_offsets_within_one_batch(module_broker, topic_name):
    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 1)
    # All seven records in one batch (one flush, long linger).
    ck_produce(bs, topic_name, [Out(0, b"k", b"ts%d" % ts, (), ts) for ts in TIMESTAMPS], **{"linger.ms": 100})
    with Wire(bs) as w:
        assert list_offset_raw(w, topic_name, 0, -1) == (0, 7, -1)
    assert _list_offsets(bs, topic_name, SPECS) == WANT


def test_list_offsets_kafka_python_admin(module_broker, topic_name):
    from kafka import TopicPartition as KTP
    from kafka.admin import OffsetSpec as KPOffsetSpec

    bs = module_broker.bootstrap
    create_topic(bs, topic_name, 2)
    for ts in TIMESTAMPS:
        ck_produce(bs, topic_name, [Out(1, b"k", b"v", (), ts)], **{"linger.ms": 0})
    kp = KafkaAdminClient(bootstrap_servers=bs)
    try:
        tp0, tp1 = KTP(topic_name, 0), KTP(topic_name, 1)
        got = kp.list_partition_offsets({tp1: KPOffsetSpec.MAX_TIMESTAMP})
        assert (got[tp1].offset, got[tp1].timestamp) == (3, 9000)
        got = kp.list_partition_offsets({tp0: KPOffsetSpec.LATEST, tp1: KPOffsetSpec.LATEST})
        assert (got[tp0].offset, got[tp1].offset) == (0, 7)
        got = kp.list_partition_offsets({tp1: KPOffsetSpec.EARLIEST})
        assert got[tp1].offset == 0
        got = kp.list_partition_offsets({tp1: 3500})
        assert (got[tp1].offset, got[tp1].timestamp) == (1, 5000)
    finally:
        kp.close()


# -- kafka-python's admin client: the same errors ---------------------------------------------------------


def test_kafka_python_admin_errors(module_broker, topic_name):
    bs = module_broker.bootstrap
    kp = KafkaAdminClient(bootstrap_servers=bs)
    t = topic_name
    try:
        def codes(topics: dict) -> dict[str, int]:
            result = kp.create_topics(topics, raise_errors=False)
            return {r["name"]: r["error_code"] for r in result["topics"]}

        assert codes({t: {"num_partitions": 2, "replication_factor": 1, "configs": {"retention.ms": "5000"}}}) == {t: 0}
        assert codes({t: {"num_partitions": 2}}) == {t: TOPIC_ALREADY_EXISTS}
        assert codes({f"{t}-rf": {"num_partitions": 1, "replication_factor": 3}}) == {f"{t}-rf": INVALID_REPLICATION_FACTOR}
        assert codes({f"{t}-cv": {"num_partitions": 1, "configs": {"segment.bytes": "1"}}}) == {f"{t}-cv": INVALID_CONFIG}
        assert codes({"bad name": {"num_partitions": 1}}) == {"bad name": INVALID_TOPIC_EXCEPTION}
        assert codes({f"{t}-np": {"num_partitions": 0}}) == {f"{t}-np": INVALID_PARTITIONS}
        assert codes({f"{t}-neg": {"num_partitions": -5}}) == {f"{t}-neg": INVALID_PARTITIONS}
        grown = kp.create_partitions({t: 1}, raise_errors=False)
        assert [(r.name, r.error_code) for r in grown.results] == [(t, INVALID_PARTITIONS)]
        grown = kp.create_partitions({t: 4}, raise_errors=False)
        assert [(r.name, r.error_code) for r in grown.results] == [(t, 0)]
        assert kp.alter_configs([KPConfigResource("TOPIC", t, {"retention.ms": "60000"})]) == {"topic": {t: "OK"}}
        got = kp.describe_configs([KPConfigResource("TOPIC", t)])
        assert {k: v["value"] for k, v in got["topic"][t].items()} == {"retention.ms": "60000"}
        result = kp.alter_configs([KPConfigResource("TOPIC", t, {"retention.ms": "forever"})])
        assert result["topic"][t].startswith("[Error 40] InvalidConfigurationError")
        deleted = kp.delete_topics([t, f"{t}-missing"], raise_errors=False)
        assert {r["name"]: r["error_code"] for r in deleted["topics"]} == {
            t: 0, f"{t}-missing": UNKNOWN_TOPIC_OR_PARTITION}
    finally:
        kp.close()
    assert t not in topic_partitions(bs)


# -- restarts ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("clean", [True, False], ids=["sigterm", "sigkill"])
def test_topics_and_configs_survive_restart(broker_factory, topic_name, clean):
    broker = broker_factory()
    bs = broker.bootstrap
    create_topic(bs, topic_name, 3, {"retention.ms": "123456", "cleanup.policy": "compact"})
    create_topic(bs, f"{topic_name}-b", 1)
    client = admin(bs)
    (future,) = client.create_partitions([NewPartitions(topic_name, 4)]).values()
    assert error_code(future) == 0
    assert alter(bs, topic_name, ("max.message.bytes", "500000", AlterConfigOpType.SET),
                 ("retention.ms", None, AlterConfigOpType.DELETE)) == 0
    assert alter(bs, f"{topic_name}-b", ("segment.bytes", "123456", AlterConfigOpType.SET)) == 0
    outs = [Out(p, b"k%d" % i, b"v%d" % i, (), 1000 + i) for i in range(4) for p in range(4)]
    ck_produce(bs, topic_name, outs)
    configs = {t: topic_configs(bs, t) for t in (topic_name, f"{topic_name}-b")}
    cluster_id = cluster_id_of(bs)
    topic_ids = {t: topic_id(bs, t) for t in (topic_name, f"{topic_name}-b")}
    before_topics = topic_partitions(bs)

    broker.restart(clean=clean)
    assert broker.bootstrap == bs
    assert topic_partitions(bs) == before_topics
    assert {t: topic_configs(bs, t) for t in configs} == configs
    assert configs[topic_name]["max.message.bytes"] == ("500000", DYNAMIC)
    assert configs[topic_name]["retention.ms"] == ("604800000", DEFAULT)
    assert configs[topic_name]["cleanup.policy"] == ("compact", DYNAMIC)
    assert configs[f"{topic_name}-b"]["segment.bytes"] == ("123456", DYNAMIC)
    assert cluster_id_of(bs) == cluster_id
    assert {t: topic_id(bs, t) for t in topic_ids} == topic_ids
    assert ck_consume(bs, topic_name, {p: 0 for p in range(4)}) == in_log_order(outs)
    # and a deleted topic stays deleted
    client = admin(bs)
    (future,) = client.delete_topics([f"{topic_name}-b"]).values()
    assert error_code(future) == 0
    broker.restart(clean=clean)
    assert f"{topic_name}-b" not in topic_partitions(bs)
    assert topic_partitions(bs)[topic_name] == 4


def test_auto_create_disabled(broker_factory, topic_name):
    from kafka.protocol.metadata import MetadataRequest

    broker = broker_factory({"auto.create.topics.enable": "false"})
    bs = broker.bootstrap
    with Wire(bs) as w:
        req = MetadataRequest[9]
        resp = w.request(req(topics=[req.MetadataRequestTopic(name=topic_name)], allow_auto_topic_creation=True,
                             include_topic_authorized_operations=False,
                             include_cluster_authorized_operations=False), 9)
    assert [(t.name, t.error_code) for t in resp.topics] == [(topic_name, UNKNOWN_TOPIC_OR_PARTITION)]
    assert topic_name not in topic_partitions(bs)
    errors = []
    producer = Producer({"bootstrap.servers": bs, "enable.idempotence": False, "message.timeout.ms": 2000})
    producer.produce(topic_name, value=b"v", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(10)
    assert len(errors) == 1 and errors[0] is not None
    assert topic_name not in topic_partitions(bs)


def test_auto_create_enabled(module_broker, topic_name):
    from kafka.protocol.metadata import MetadataRequest

    bs = module_broker.bootstrap
    with Wire(bs) as w:
        req = MetadataRequest[9]

        def ask(allow: bool, name: str):
            resp = w.request(req(topics=[req.MetadataRequestTopic(name=name)], allow_auto_topic_creation=allow,
                                 include_topic_authorized_operations=False,
                                 include_cluster_authorized_operations=False), 9)
            (t,) = resp.topics
            return t.error_code, len(t.partitions)

        assert ask(False, topic_name) == (UNKNOWN_TOPIC_OR_PARTITION, 0)
        assert topic_name not in topic_partitions(bs)
        assert ask(True, topic_name) == (0, 1)
        assert ask(False, topic_name) == (0, 1)
        assert ask(True, "bad name") == (INVALID_TOPIC_EXCEPTION, 0)
    assert topic_partitions(bs)[topic_name] == 1
