"""What the exactly-once sink needs from a Kafka cluster, as the README lists it, checked on a Kafka node with
ACLs (StandardAuthorizer) and a `transaction.max.timeout.ms` below the sink's default: without the listed ACLs
or with too long a transaction timeout the query fails at once, naming the cause, and writes nothing; with the
listed ACLs (prefixed on `oncelog-sink.`) it writes exactly once over SASL_SSL with Spark's option spelling.
"""

from __future__ import annotations

import pytest

from oncelog.spark import register
from tests.integration.helpers import create_topic
from tests.spark.eos_check import assert_exactly_once, nothing_pending, read_values, write_input
from tests.spark.session import start_session, stop_session

MAX_TIMEOUT_MS = 30000
pytestmark = pytest.mark.kafka_slow


@pytest.fixture(scope="module")
def acl_kafka(kafka_runtime, kafka_tls, tmp_path_factory):
    """One node with ACLs on: the PLAINTEXT listeners (tests, brokers, controller) are ANONYMOUS, a super
    user; alice on SASL_SSL has only the ACLs a test gives her."""
    from tests.kafka.conftest import _cluster

    cluster = _cluster(kafka_runtime, kafka_tls, tmp_path_factory.mktemp("kafka-acl"), settings={
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
        "transaction.max.timeout.ms": MAX_TIMEOUT_MS,
    })
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = start_session(tmp_path_factory.mktemp("spark"))
    register(session)
    yield session
    stop_session(session)


def _spark_security(cluster) -> dict[str, str]:
    """alice over SASL_SSL, in Spark's Kafka connector spelling (`kafka.` + the Java client's keys)."""
    ca = cluster.client_security("SSL")["ssl.ca.location"]
    return {
        "kafka.bootstrap.servers": cluster.bootstrap_for("SASL_SSL"),
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="alice" password="alice-secret";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": ca,
    }


def _grant(cluster, *bindings: tuple[str, str, str, str]) -> None:
    """(resource type, name, pattern LITERAL|PREFIXED, operation) for User:alice, created as the super user."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    acls = [AclBinding(ResourceType[rtype], name, ResourcePatternType[pattern], "User:alice", "*",
                       AclOperation[op], AclPermissionType.ALLOW) for rtype, name, pattern, op in bindings]
    for future in admin.create_acls(acls, request_timeout=30).values():
        future.result(timeout=30)


def _run(spark, cluster, source: str, sink: str, checkpoint, **options: str):
    security = _spark_security(cluster)
    reader = spark.readStream.format("oncelog").option("subscribe", source).option("startingOffsets", "earliest")
    for key, value in security.items():
        reader = reader.option(key, value)
    writer = reader.load().select("key", "value").writeStream.format("oncelog").option("topic", sink) \
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    for key, value in {**security, **options}.items():
        writer = writer.option(key, value)
    from pyspark.errors import StreamingQueryException

    query = writer.start()
    try:
        assert query.awaitTermination(240), "the query did not end"
    except StreamingQueryException as exc:
        return exc
    return query.exception()


def _source_acls(source: str) -> list[tuple[str, str, str, str]]:
    return [("TOPIC", source, "LITERAL", "READ"), ("TOPIC", source, "LITERAL", "DESCRIBE")]


#: what the README tells users to grant the sink's principal
SINK_ACLS = [
    ("TRANSACTIONAL_ID", "oncelog-sink.", "PREFIXED", "WRITE"),
    ("TRANSACTIONAL_ID", "oncelog-sink.", "PREFIXED", "DESCRIBE"),
    ("GROUP", "oncelog-sink.", "PREFIXED", "READ"),
    ("TOPIC", "oncelog-sink-markers", "LITERAL", "READ"),
    ("TOPIC", "oncelog-sink-markers", "LITERAL", "DESCRIBE"),
]


def test_sink_without_acls_fails_at_once_and_writes_nothing(spark, acl_kafka, topic_name, tmp_path):
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    write_input(acl_kafka.bootstrap, source, 50)
    create_topic(acl_kafka.bootstrap, sink, partitions=2)
    _grant(acl_kafka, *_source_acls(source), ("TOPIC", sink, "LITERAL", "WRITE"),
           ("TOPIC", sink, "LITERAL", "DESCRIBE"))
    error = _run(spark, acl_kafka, source, sink, tmp_path / "ckpt", **{"transaction.timeout.ms": "20000"})
    assert error is not None
    assert "AUTHORIZATION_FAILED" in str(error), str(error)[-2000:]
    assert read_values(acl_kafka.bootstrap, sink, 2) == []


def test_sink_with_the_documented_acls_is_exactly_once(spark, acl_kafka, topic_name, tmp_path):
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    data = write_input(acl_kafka.bootstrap, source, 300)
    create_topic(acl_kafka.bootstrap, sink, partitions=2)
    create_topic(acl_kafka.bootstrap, "oncelog-sink-markers")
    _grant(acl_kafka, *_source_acls(source), ("TOPIC", sink, "LITERAL", "WRITE"),
           ("TOPIC", sink, "LITERAL", "DESCRIBE"), *SINK_ACLS)
    error = _run(spark, acl_kafka, source, sink, tmp_path / "ckpt", **{"transaction.timeout.ms": "20000"})
    assert error is None, str(error)[-3000:]
    assert_exactly_once(acl_kafka.bootstrap, sink, 2, [v for _, v in data])
    assert nothing_pending(acl_kafka.bootstrap, sink, 2)


def test_transaction_timeout_above_the_brokers_maximum_is_named(spark, acl_kafka, topic_name, tmp_path):
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    write_input(acl_kafka.bootstrap, source, 20)
    create_topic(acl_kafka.bootstrap, sink, partitions=2)
    _grant(acl_kafka, *_source_acls(source), ("TOPIC", sink, "LITERAL", "WRITE"),
           ("TOPIC", sink, "LITERAL", "DESCRIBE"), *SINK_ACLS)
    error = _run(spark, acl_kafka, source, sink, tmp_path / "ckpt")  # the sink's default: 60000 ms
    assert error is not None
    assert "INVALID_TRANSACTION_TIMEOUT" in str(error), str(error)[-2000:]
    assert read_values(acl_kafka.bootstrap, sink, 2) == []
