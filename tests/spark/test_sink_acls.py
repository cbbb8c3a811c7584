"""The exactly-once sink as a principal that holds only the ACLs the README's "What the cluster must allow" table
lists, on an oncelog broker with ACLs on (the oncelog counterpart of tests/kafka/test_sink_requirements.py).

One broker for the module: SASL_PLAINTEXT with PLAIN users `admin` (a super user: it creates topics, writes the
input, grants, and reads the output) and `app` (only what a test grants), the StandardAuthorizer and
`allow.everyone.if.no.acl.found=false`. A streaming query (the oncelog source -> the oncelog sink, availableNow)
runs as `app` with Spark's option spelling. With the table's ACLs it writes each input row exactly once, also
when its last batch is replayed; with one ACL of the table taken away it fails at its first micro-batch with the
broker's error named, and nothing becomes visible under read_committed (nor is a transaction left open).
"""

from __future__ import annotations

import pytest
from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import ConfigResource, NewTopic, OffsetSpec

from oncelog.spark import register
from tests.integration.helpers import Out, ck_consume, ck_produce
from tests.spark.eos_check import verdict
from tests.support.acl_broker import AclBroker, acl_settings

DEFAULT_MARKERS = "oncelog-sink-markers"  # the sink's default marker topic (`sink.markerTopic`)
SETTINGS = {
    **acl_settings(("admin", "app")),
    "allow.everyone.if.no.acl.found": "false",
    "offsets.topic.num.partitions": 2,
    "transaction.state.log.num.partitions": 2,
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = AclBroker(tmp_path_factory.mktemp("sink-acls"), SETTINGS).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def sink_spark(spark):
    register(spark)
    return spark


@pytest.fixture(autouse=True)
def no_acls(broker):
    broker.revoke_all()
    yield
    broker.revoke_all()


# -- the broker, as admin ---------------------------------------------------------------------------------------


def as_admin(broker: AclBroker) -> dict[str, str]:
    conf = broker.client("admin")
    conf.pop("bootstrap.servers")
    return conf


def create_topic(broker: AclBroker, name: str, partitions: int) -> None:
    admin = broker.admin()
    admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)[name].result(15)


def write_input(broker: AclBroker, topic: str, count: int, partitions: int = 2) -> list[bytes]:
    create_topic(broker, topic, partitions)
    outs = [Out(i % partitions, f"k{i}".encode(), f"v{i}|".encode()) for i in range(count)]
    ck_produce(broker.bootstrap, topic, outs, **as_admin(broker))
    return [o.value for o in outs]


def committed_values(broker: AclBroker, topic: str, partitions: int) -> list[bytes]:
    recs = ck_consume(broker.bootstrap, topic, dict.fromkeys(range(partitions), 0),
                      **as_admin(broker), **{"isolation.level": "read_committed"})
    return [r.value for r in recs]


def end_offsets(broker: AclBroker, topic: str, partitions: int) -> list[tuple[int, int]]:
    """(last stable offset, high watermark) of each partition: equal when no transaction is open."""
    admin = broker.admin()
    out = []
    for p in range(partitions):
        tp = TopicPartition(topic, p)
        pair = []
        for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
            futures = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level, request_timeout=10)
            pair.append(futures[tp].result(15).offset)
        out.append((pair[0], pair[1]))
    return out


def topic_config(broker: AclBroker, topic: str, key: str) -> str:
    admin = broker.admin()
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result(15)[key].value


# -- the README's table, as ACLs of User:app --------------------------------------------------------------------


def readme_acls(source: str, sink: str, markers: str) -> dict[str, tuple[str, str, str, str]]:
    """The "What the cluster must allow" table, one (resource, name, pattern, operation) per ACL, by a short name
    for the negative controls."""
    return {
        "txid-write": ("TRANSACTIONAL_ID", "oncelog-sink.", "PREFIXED", "WRITE"),
        "txid-describe": ("TRANSACTIONAL_ID", "oncelog-sink.", "PREFIXED", "DESCRIBE"),
        "group-read": ("GROUP", "oncelog-sink.", "PREFIXED", "READ"),
        "markers-read": ("TOPIC", markers, "LITERAL", "READ"),
        "markers-describe": ("TOPIC", markers, "LITERAL", "DESCRIBE"),
        "markers-create": ("TOPIC", markers, "LITERAL", "CREATE"),
        "output-write": ("TOPIC", sink, "LITERAL", "WRITE"),
        "output-describe": ("TOPIC", sink, "LITERAL", "DESCRIBE"),
        "input-read": ("TOPIC", source, "LITERAL", "READ"),
        "input-describe": ("TOPIC", source, "LITERAL", "DESCRIBE"),
    }


def grant(broker: AclBroker, acls: dict[str, tuple[str, str, str, str]], *, without: str | None = None) -> None:
    for name, (resource, resource_name, pattern, operation) in acls.items():
        if name != without:
            broker.grant("app", resource, resource_name, operation, pattern=pattern)


# -- the query, as app ------------------------------------------------------------------------------------------


def as_app(broker: AclBroker) -> dict[str, str]:
    """app over SASL_PLAINTEXT in Spark's Kafka connector spelling (`kafka.` + the Java client's keys)."""
    return {
        "kafka.bootstrap.servers": broker.bootstrap,
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                  'username="app" password="app-secret";',
    }


def run(spark, broker: AclBroker, source: str, sink: str, checkpoint, markers: str | None = None):
    """source -> sink (availableNow, 40 rows a batch) as app; (the query, its error or None)."""
    from pyspark.errors import StreamingQueryException

    security = as_app(broker)
    reader = spark.readStream.format("oncelog").options(**security).option("subscribe", source) \
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "40")
    writer = reader.load().select("key", "value").writeStream.format("oncelog").options(**security) \
        .option("topic", sink).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    if markers is not None:
        writer = writer.option("sink.markerTopic", markers)
    query = writer.start()
    try:
        assert query.awaitTermination(120), "the query did not end in 120 s"
    except StreamingQueryException as exc:
        return query, exc
    return query, query.exception()


def batches_with_rows(query) -> list[int]:
    return [p["batchId"] for p in query.recentProgress if p["numInputRows"]]


# -- the tests --------------------------------------------------------------------------------------------------


def test_the_tables_acls_are_enough_for_exactly_once(sink_spark, broker, topic_name, tmp_path):
    """Every ACL of the table and nothing else; the marker topic is left for the sink to create (CREATE). Two
    batches, then the last one replayed (its commit-log entry lost, as when the driver dies after the sink
    committed): each input row is in the output once."""
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    expected = write_input(broker, source, 80)
    create_topic(broker, sink, 2)
    grant(broker, readme_acls(source, sink, DEFAULT_MARKERS))
    checkpoint = tmp_path / "ckpt"

    first, error = run(sink_spark, broker, source, sink, checkpoint)
    assert error is None, str(error)[-3000:]
    assert batches_with_rows(first) == [0, 1]
    got = committed_values(broker, sink, 2)
    assert sorted(got) == sorted(expected), verdict(got, expected)
    ends = end_offsets(broker, sink, 2)
    assert all(lso == hw for lso, hw in ends), ends
    # created by the sink as app (CREATE on the topic), as the table says an operator would create it
    assert topic_config(broker, DEFAULT_MARKERS, "cleanup.policy") == "compact"

    (checkpoint / "commits" / "1").unlink()
    (checkpoint / "commits" / ".1.crc").unlink(missing_ok=True)
    second, error = run(sink_spark, broker, source, sink, checkpoint)
    assert error is None, str(error)[-3000:]
    assert batches_with_rows(second) == [1], "batch 1 was not replayed"
    got = committed_values(broker, sink, 2)
    assert len(got) == len(expected) and sorted(got) == sorted(expected), verdict(got, expected)
    ends = end_offsets(broker, sink, 2)
    assert all(lso == hw for lso, hw in ends), ends


#: an ACL of the table taken away -> the error the query must fail with, and where it comes from
NEGATIVE = {
    # InitProducerId needs WRITE on the transactional id (DESCRIBE, kept, only finds the coordinator)
    "txid-write": "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    # AddPartitionsToTxn needs WRITE on the output topic (DESCRIBE, kept, only shows it)
    "output-write": "TOPIC_AUTHORIZATION_FAILED",
    # the batch marker's FindCoordinator / OffsetFetch need DESCRIBE on the group, which READ implies
    "group-read": "GROUP_AUTHORIZATION_FAILED",
    # TxnOffsetCommit (the marker) needs READ on the marker topic: the batch's rows are in the log, then aborted
    "markers-read": "TOPIC_AUTHORIZATION_FAILED",
    # the marker topic does not exist yet and may not be created (the sink's message names the remedy)
    "markers-create": "TOPIC_AUTHORIZATION_FAILED",
    # the oncelog source's Fetch needs READ on the input topic
    "input-read": "TOPIC_AUTHORIZATION_FAILED",
}


@pytest.mark.parametrize("missing", list(NEGATIVE))
def test_one_acl_less_fails_the_first_batch_and_writes_nothing(sink_spark, broker, topic_name, tmp_path, missing):
    source, sink, markers = f"{topic_name}-in", f"{topic_name}-out", f"{topic_name}-markers"
    write_input(broker, source, 20, partitions=1)  # one Spark task: no sibling task cancelled half-way
    create_topic(broker, sink, 2)
    grant(broker, readme_acls(source, sink, markers), without=missing)

    query, error = run(sink_spark, broker, source, sink, tmp_path / "ckpt", markers=markers)
    assert error is not None, f"the query succeeded without {missing}"
    assert NEGATIVE[missing] in str(error), str(error)[-3000:]
    if missing == "markers-create":
        assert f"the sink's marker topic {markers!r} does not exist and this principal may not create it" \
            in str(error), str(error)[-3000:]
    assert batches_with_rows(query) == []  # its first micro-batch did not complete
    assert committed_values(broker, sink, 2) == []
    ends = end_offsets(broker, sink, 2)
    assert all(lso == hw for lso, hw in ends), f"a transaction left open: {ends}"
    if missing == "markers-read":
        # the 20 rows were acknowledged before the marker was refused, then aborted (an abort marker each partition)
        assert sum(hw for _, hw in ends) > 20, f"the rows never reached the log: {ends}"
