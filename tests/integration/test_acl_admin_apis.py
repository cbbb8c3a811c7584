"""ACLs on the admin APIs (docs/security.md §5): what each one checks, in Kafka's order and with Kafka's codes
(KafkaApis, ControllerApis, ConfigHelper, AclApis), on one broker with the StandardAuthorizer's semantics.

For every API: without the ACL the caller gets Kafka's error and nothing changes (checked as the super user
afterwards); with it the call succeeds. Topic checks never tell a refused caller whether the topic exists, so the
same request is made for a topic that exists and one that does not. Raw requests (SASL PLAIN through
tests/support/wire.py) where the exact code matters; confluent-kafka and kafka-python where they surface it; Kafka's
own kafka-acls against the broker at the end.

librdkafka (confluent-kafka) drops DescribeAcls' top-level error code (rd_kafka_DescribeAclsResponse_parse reads it
and returns success with no bindings), so a refused describe_acls looks like "no ACLs" there; the broker answers
CLUSTER_AUTHORIZATION_FAILED, which the raw request, kafka-python and kafka-acls show.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclOperation as CkAclOperation,
)
from confluent_kafka.admin import (
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from kafka.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError
from kafka.protocol.admin import (
    AlterPartitionReassignmentsRequest,
    AlterReplicaLogDirsRequest,
    AlterUserScramCredentialsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeAclsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    DescribeLogDirsRequest,
    DescribeUserScramCredentialsRequest,
    ElectLeadersRequest,
    IncrementalAlterConfigsRequest,
    ListPartitionReassignmentsRequest,
)
from kafka.protocol.consumer import ListOffsetsRequest, OffsetForLeaderEpochRequest
from kafka.protocol.metadata import MetadataRequest
from tests.support.acl_broker import AclBroker
from tests.support.kafka_tools import KafkaUnavailable, kafka_tool, tools_runtime
from tests.support.wire import Wire, sasl_plain_wire

from oncelog.protocol.inter_broker import (
    ControlledShutdownRequest,
    ControlledShutdownResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
)

NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_CONTROLLER, INVALID_REQUEST = 0, 3, 41, 42
TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED = 29, 31
ELECTION_NOT_NEEDED, RESOURCE_NOT_FOUND = 84, 91
TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8  # config resource types
SET, DELETE = 0, 1
ACL_CLASS = "org.apache.kafka.tools.AclCommand"
# Kafka's AclOperation codes
CREATE, DELETE_OP, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = (
    5, 6, 7, 8, 9, 10, 11, 12)


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    broker = AclBroker(tmp_path_factory.mktemp("acl-admin")).start()
    admin = broker.admin()
    for future in admin.create_topics([NewTopic("kept", 1, 1), NewTopic("dt-a", 1, 1), NewTopic("dt-b", 1, 1),
                                       NewTopic("dt-keep", 1, 1), NewTopic("cp-topic", 1, 1),
                                       NewTopic("dr-topic", 1, 1), NewTopic("cfg-topic", 1, 1)]).values():
        future.result(30)
    from confluent_kafka import Producer

    producer = Producer(broker.client("admin"))
    for i in range(10):
        producer.produce("dr-topic", b"v%d" % i)
    assert producer.flush(30) == 0
    yield broker
    broker.stop()


@pytest.fixture
def broker(acl_broker):
    acl_broker.revoke_all()
    yield acl_broker
    acl_broker.revoke_all()


def grant_cluster(broker: AclBroker, user: str, *operations: str) -> None:
    """An ACL on the cluster: confluent-kafka (librdkafka) names that resource type BROKER (code 4, Kafka's
    CLUSTER), so AclBroker.grant(..., "CLUSTER", ...) has no such attribute to look up."""
    broker.grant(user, "BROKER", "kafka-cluster", *operations)


def call(broker: AclBroker, user: str, request: Any, version: int) -> Any:
    with sasl_plain_wire(broker.bootstrap, user, f"{user}-secret") as w:
        return w.request(request, version)


def call_inter_broker(broker: AclBroker, user: str, request: Any, version: int, response_cls: Any) -> Any:
    """A request kafka-python has no schema for (oncelog's own codecs); both are flexible at these versions."""
    with sasl_plain_wire(broker.bootstrap, user, f"{user}-secret") as w:
        w.correlation += 1
        request.with_header(correlation_id=w.correlation, client_id=w.client_id)
        w.send_raw(bytes(request.encode(version=version, header=True, framed=True)))
        frame = w.recv_frame()
    return response_cls.decode(frame[5:], version=version)  # correlation id, empty tag buffer


def topics_seen_by_admin(broker: AclBroker) -> dict[str, int]:
    answer = call(broker, "admin", MetadataRequest[9](topics=None, allow_auto_topic_creation=False,
                                                     include_topic_authorized_operations=False), 9)
    return {t.name: len(t.partitions) for t in answer.topics if t.error_code == 0}


def topic_ids(broker: AclBroker) -> dict[str, uuid.UUID]:
    answer = call(broker, "admin", MetadataRequest[12](topics=None, allow_auto_topic_creation=False,
                                                      include_topic_authorized_operations=False), 12)
    return {t.name: t.topic_id for t in answer.topics}


# -- CreateTopics ---------------------------------------------------------------------------------------------------
def create_topics(broker: AclBroker, user: str, *names: str, configs: dict[str, str] | None = None) -> dict:
    req = CreateTopicsRequest[7]
    topics = [req.CreatableTopic(name=n, num_partitions=1, replication_factor=1, assignments=[],
                                 configs=[req.CreatableTopic.CreatableTopicConfig(name=k, value=v)
                                          for k, v in (configs or {}).items()]) for n in names]
    answer = call(broker, user, req(topics=topics, timeout_ms=10000, validate_only=False), 7)
    return {t.name: t for t in answer.topics}


def test_create_topics_needs_create_on_the_cluster_or_the_topic(broker):
    got = create_topics(broker, "alice", "ct-new", "kept")
    # an existing topic and a new one: the same refusal, before anything is validated
    assert {n: (t.error_code, t.error_message) for n, t in got.items()} == {
        "ct-new": (TOPIC_AUTHORIZATION_FAILED, "Authorization failed."),
        "kept": (TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")}
    assert "ct-new" not in topics_seen_by_admin(broker)
    # the real client surfaces it
    admin = broker.admin("alice")
    (future,) = admin.create_topics([NewTopic("ct-client", 1, 1)]).values()
    with pytest.raises(KafkaException) as refused:
        future.result(30)
    assert refused.value.args[0].code() == TOPIC_AUTHORIZATION_FAILED
    assert "ct-client" not in topics_seen_by_admin(broker)

    # CREATE on a PREFIXED pattern; a DENY on one name wins over it
    broker.grant("alice", "TOPIC", "ct-", "CREATE", pattern="PREFIXED")
    broker.grant("alice", "TOPIC", "ct-denied", "CREATE", permission="DENY")
    got = create_topics(broker, "alice", "ct-new", "ct-denied", configs={"retention.ms": "60000"})
    assert got["ct-denied"].error_code == TOPIC_AUTHORIZATION_FAILED
    created = got["ct-new"]
    # created, but without DESCRIBE_CONFIGS its configs (and partition count, replication factor) are not shown
    assert (created.error_code, created.topic_config_error_code, created.num_partitions,
            created.replication_factor, created.configs) == (NONE, TOPIC_AUTHORIZATION_FAILED, -1, -1, [])
    assert created.topic_id == topic_ids(broker)["ct-new"]
    seen = topics_seen_by_admin(broker)
    assert "ct-new" in seen and "ct-denied" not in seen
    broker.grant("alice", "TOPIC", "ct-", "DESCRIBE_CONFIGS", pattern="PREFIXED")
    shown = create_topics(broker, "alice", "ct-shown", configs={"retention.ms": "60000"})["ct-shown"]
    assert (shown.error_code, shown.topic_config_error_code, shown.num_partitions) == (NONE, NONE, 1)
    assert {c.name: c.value for c in shown.configs}["retention.ms"] == "60000"
    # an existing topic, now that alice may create it, is TOPIC_ALREADY_EXISTS
    assert create_topics(broker, "alice", "ct-new")["ct-new"].error_code == 36

    # CREATE on the cluster covers every topic
    assert create_topics(broker, "bob", "bob-topic")["bob-topic"].error_code == TOPIC_AUTHORIZATION_FAILED
    grant_cluster(broker, "bob", "CREATE")
    assert create_topics(broker, "bob", "bob-topic")["bob-topic"].error_code == NONE
    assert "bob-topic" in topics_seen_by_admin(broker)


# -- DeleteTopics ---------------------------------------------------------------------------------------------------
def delete_topics(broker: AclBroker, user: str, names: list[str] = (), ids: list[uuid.UUID] = ()) -> list:
    req = DeleteTopicsRequest[6]
    topics = [req.DeleteTopicState(name=n, topic_id=uuid.UUID(int=0)) for n in names]
    topics += [req.DeleteTopicState(name=None, topic_id=i) for i in ids]
    answer = call(broker, user, req(topics=topics, timeout_ms=10000), 6)
    return [(r.name, r.topic_id, r.error_code) for r in answer.responses]


def test_delete_topics_needs_describe_then_delete(broker):
    ids = topic_ids(broker)
    zero = None  # the zero id, as kafka-python decodes it
    # by name (existing or not) and by id: refused alike; a topic named by id is answered without its name
    assert delete_topics(broker, "alice", ["dt-a", "dt-missing"], [ids["dt-b"]]) == [
        ("dt-a", zero, TOPIC_AUTHORIZATION_FAILED), ("dt-missing", zero, TOPIC_AUTHORIZATION_FAILED),
        (None, ids["dt-b"], TOPIC_AUTHORIZATION_FAILED)]
    assert {"dt-a", "dt-b"} <= set(topics_seen_by_admin(broker))
    # DESCRIBE alone: the name by id is told, a missing topic is UNKNOWN_TOPIC_OR_PARTITION, no deletion
    broker.grant("alice", "TOPIC", "dt-", "DESCRIBE", pattern="PREFIXED")
    assert delete_topics(broker, "alice", ["dt-a", "dt-missing"], [ids["dt-b"]]) == [
        ("dt-a", zero, TOPIC_AUTHORIZATION_FAILED), ("dt-missing", zero, UNKNOWN_TOPIC_OR_PARTITION),
        ("dt-b", ids["dt-b"], TOPIC_AUTHORIZATION_FAILED)]
    assert {"dt-a", "dt-b"} <= set(topics_seen_by_admin(broker))
    # kafka-python's admin raises Kafka's error
    from kafka.admin import KafkaAdminClient

    client = KafkaAdminClient(**broker.kafka_python("alice"))
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            client.delete_topics(["dt-a"], timeout_ms=10000)
    finally:
        client.close()
    assert "dt-a" in topics_seen_by_admin(broker)
    # DELETE on the prefix (DENY on one topic wins), by name and by id
    broker.grant("alice", "TOPIC", "dt-", "DELETE", pattern="PREFIXED")
    broker.grant("alice", "TOPIC", "dt-keep", "DELETE", permission="DENY")
    assert delete_topics(broker, "alice", ["dt-a", "dt-keep"], [ids["dt-b"]]) == [
        ("dt-a", ids["dt-a"], NONE), ("dt-keep", zero, TOPIC_AUTHORIZATION_FAILED), ("dt-b", ids["dt-b"], NONE)]
    seen = topics_seen_by_admin(broker)
    assert "dt-a" not in seen and "dt-b" not in seen and "dt-keep" in seen


# -- CreatePartitions -----------------------------------------------------------------------------------------------
def test_create_partitions_needs_alter(broker):
    req = CreatePartitionsRequest[3]

    def grow(user: str, *names: str) -> dict[str, tuple[int, str | None]]:
        answer = call(broker, user, req(topics=[req.CreatePartitionsTopic(name=n, count=2, assignments=None)
                                                for n in names], timeout_ms=10000, validate_only=False), 3)
        return {r.name: (r.error_code, r.error_message) for r in answer.results}

    assert grow("alice", "cp-topic", "cp-missing") == {"cp-topic": (TOPIC_AUTHORIZATION_FAILED, None),
                                                       "cp-missing": (TOPIC_AUTHORIZATION_FAILED, None)}
    admin = broker.admin("alice")
    (future,) = admin.create_partitions([NewPartitions("cp-topic", 3)]).values()
    with pytest.raises(KafkaException) as refused:
        future.result(30)
    assert refused.value.args[0].code() == TOPIC_AUTHORIZATION_FAILED
    assert topics_seen_by_admin(broker)["cp-topic"] == 1
    broker.grant("alice", "TOPIC", "cp-", "ALTER", pattern="PREFIXED")
    assert {n: code for n, (code, _) in grow("alice", "cp-topic", "cp-missing").items()} == {
        "cp-topic": NONE, "cp-missing": UNKNOWN_TOPIC_OR_PARTITION}
    assert topics_seen_by_admin(broker)["cp-topic"] == 2


# -- DeleteRecords, ListOffsets, OffsetForLeaderEpoch ---------------------------------------------------------------
def earliest(broker: AclBroker, user: str, *topics: str) -> dict[str, tuple[int, int]]:
    req = ListOffsetsRequest[7]
    lt = req.ListOffsetsTopic
    answer = call(broker, user, req(replica_id=-1, isolation_level=0, topics=[
        lt(name=t, partitions=[lt.ListOffsetsPartition(partition_index=0, timestamp=-2, current_leader_epoch=-1)])
        for t in topics]), 7)
    return {t.name: (t.partitions[0].error_code, t.partitions[0].offset) for t in answer.topics}


def test_delete_records_needs_delete(broker):
    req = DeleteRecordsRequest[2]
    rt = req.DeleteRecordsTopic

    def delete_before(user: str, offset: int) -> dict[str, tuple[int, int]]:
        answer = call(broker, user, req(topics=[
            rt(name=n, partitions=[rt.DeleteRecordsPartition(partition_index=0, offset=offset)])
            for n in ("dr-topic", "dr-missing")], timeout_ms=10000), 2)
        return {t.name: (t.partitions[0].error_code, t.partitions[0].low_watermark) for t in answer.topics}

    assert delete_before("alice", 4) == {"dr-topic": (TOPIC_AUTHORIZATION_FAILED, -1),
                                         "dr-missing": (TOPIC_AUTHORIZATION_FAILED, -1)}
    assert earliest(broker, "admin", "dr-topic") == {"dr-topic": (NONE, 0)}
    broker.grant("alice", "TOPIC", "dr-", "DELETE", pattern="PREFIXED")
    broker.grant("alice", "TOPIC", "dr-missing", "DELETE", permission="DENY")
    assert delete_before("alice", 4) == {"dr-topic": (NONE, 4), "dr-missing": (TOPIC_AUTHORIZATION_FAILED, -1)}
    assert earliest(broker, "admin", "dr-topic") == {"dr-topic": (NONE, 4)}


def test_list_offsets_needs_describe(broker):
    assert earliest(broker, "alice", "kept", "lo-missing") == {"kept": (TOPIC_AUTHORIZATION_FAILED, -1),
                                                              "lo-missing": (TOPIC_AUTHORIZATION_FAILED, -1)}
    broker.grant("alice", "TOPIC", "kept", "DESCRIBE")
    assert earliest(broker, "alice", "kept", "lo-missing") == {"kept": (NONE, 0),
                                                              "lo-missing": (TOPIC_AUTHORIZATION_FAILED, -1)}


def test_offset_for_leader_epoch_needs_cluster_action_or_describe(broker):
    req = OffsetForLeaderEpochRequest[4]
    t = req.OffsetForLeaderTopic

    def ask(user: str, replica_id: int) -> dict[str, int]:
        answer = call(broker, user, req(replica_id=replica_id, topics=[
            t(topic=n, partitions=[t.OffsetForLeaderPartition(partition=0, current_leader_epoch=-1, leader_epoch=0)])
            for n in ("kept", "ofle-missing")]), 4)
        return {r.topic: r.partitions[0].error_code for r in answer.topics}

    # Kafka does not look at replica_id: a follower's request is refused per topic like a consumer's
    for replica_id in (-1, 1):
        assert ask("alice", replica_id) == {"kept": TOPIC_AUTHORIZATION_FAILED,
                                            "ofle-missing": TOPIC_AUTHORIZATION_FAILED}
    broker.grant("alice", "TOPIC", "kept", "DESCRIBE")
    assert ask("alice", -1) == {"kept": NONE, "ofle-missing": TOPIC_AUTHORIZATION_FAILED}
    # CLUSTER_ACTION covers every topic, so a missing one is told as such
    grant_cluster(broker, "bob", "CLUSTER_ACTION")
    assert ask("bob", 1) == {"kept": NONE, "ofle-missing": UNKNOWN_TOPIC_OR_PARTITION}


# -- DescribeConfigs, IncrementalAlterConfigs -----------------------------------------------------------------------
def describe_configs(broker: AclBroker, user: str, *resources: tuple[int, str]) -> dict:
    req = DescribeConfigsRequest[4]
    answer = call(broker, user, req(resources=[
        req.DescribeConfigsResource(resource_type=rt, resource_name=n, configuration_keys=None)
        for rt, n in resources], include_synonyms=False, include_documentation=False), 4)
    return {(r.resource_type, r.resource_name): (r.error_code, {c.name: c.value for c in r.configs})
            for r in answer.results}


def test_describe_configs_per_resource(broker):
    everything = [(TOPIC, "cfg-topic"), (TOPIC, "cfg-missing"), (BROKER, "0"), (BROKER_LOGGER, "0")]
    got = describe_configs(broker, "alice", *everything)
    assert {k: code for k, (code, _) in got.items()} == {
        (TOPIC, "cfg-topic"): TOPIC_AUTHORIZATION_FAILED, (TOPIC, "cfg-missing"): TOPIC_AUTHORIZATION_FAILED,
        (BROKER, "0"): CLUSTER_AUTHORIZATION_FAILED, (BROKER_LOGGER, "0"): CLUSTER_AUTHORIZATION_FAILED}
    assert all(not configs for _, configs in got.values())
    admin = broker.admin("alice")
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "cfg-topic")]).values()
    with pytest.raises(KafkaException) as refused:
        future.result(30)
    assert refused.value.args[0].code() == TOPIC_AUTHORIZATION_FAILED
    broker.grant("alice", "TOPIC", "cfg-", "DESCRIBE_CONFIGS", pattern="PREFIXED")
    grant_cluster(broker, "alice", "DESCRIBE_CONFIGS")
    got = describe_configs(broker, "alice", *everything)
    assert got[(TOPIC, "cfg-topic")][0] == NONE and "retention.ms" in got[(TOPIC, "cfg-topic")][1]
    assert got[(TOPIC, "cfg-missing")][0] == UNKNOWN_TOPIC_OR_PARTITION
    assert got[(BROKER, "0")][0] == NONE and "num.partitions" in got[(BROKER, "0")][1]
    assert got[(BROKER_LOGGER, "0")][0] == INVALID_REQUEST  # authorized, then answered as not supported


def test_incremental_alter_configs_per_resource_and_nothing_changes_when_denied(broker):
    req = IncrementalAlterConfigsRequest[1]
    res = req.AlterConfigsResource

    def alter(user: str, *resources: tuple[int, str, str, int, str | None]) -> dict:
        answer = call(broker, user, req(resources=[
            res(resource_type=rt, resource_name=n, configs=[res.AlterableConfig(name=k, config_operation=op,
                                                                                 value=v)])
            for rt, n, k, op, v in resources], validate_only=False), 1)
        return {(r.resource_type, r.resource_name): (r.error_code, r.error_message) for r in answer.responses}

    def retention() -> str:
        return describe_configs(broker, "admin", (TOPIC, "cfg-topic"))[(TOPIC, "cfg-topic")][1]["retention.ms"]

    before = retention()
    got = alter("alice", (TOPIC, "cfg-topic", "retention.ms", SET, "12345"),
                (TOPIC, "cfg-missing", "retention.ms", SET, "12345"),
                (BROKER, "0", "leader.replication.throttled.rate", DELETE, None),
                (BROKER_LOGGER, "0", "kafka", SET, "DEBUG"),
                (BROKER, "77", "leader.replication.throttled.rate", DELETE, None))
    assert got == {
        (TOPIC, "cfg-topic"): (TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed."),
        (TOPIC, "cfg-missing"): (TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed."),
        (BROKER, "0"): (CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed."),
        (BROKER_LOGGER, "0"): (CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed."),
        # a broker resource is validated by the broker before the controller authorizes it (Kafka's order)
        (BROKER, "77"): (INVALID_REQUEST, "Unknown broker 77")}
    assert retention() == before
    admin = broker.admin("alice")
    (future,) = admin.incremental_alter_configs([ConfigResource(
        ResourceType.TOPIC, "cfg-topic", incremental_configs=[_set_config("retention.ms", "23456")])]).values()
    with pytest.raises(KafkaException) as refused:
        future.result(30)
    assert refused.value.args[0].code() == TOPIC_AUTHORIZATION_FAILED
    assert retention() == before
    # ALTER_CONFIGS on the prefix, DENY on the topic wins
    broker.grant("alice", "TOPIC", "cfg-", "ALTER_CONFIGS", pattern="PREFIXED")
    broker.grant("alice", "TOPIC", "cfg-topic", "ALTER_CONFIGS", permission="DENY")
    assert alter("alice", (TOPIC, "cfg-topic", "retention.ms", SET, "12345"))[(TOPIC, "cfg-topic")][0] == \
        TOPIC_AUTHORIZATION_FAILED
    assert retention() == before
    broker.revoke_all()
    broker.grant("alice", "TOPIC", "cfg-", "ALTER_CONFIGS", pattern="PREFIXED")
    grant_cluster(broker, "alice", "ALTER_CONFIGS")
    got = alter("alice", (TOPIC, "cfg-topic", "retention.ms", SET, "12345"),
                (TOPIC, "cfg-missing", "retention.ms", SET, "12345"),
                (BROKER, "0", "leader.replication.throttled.rate", DELETE, None))
    assert {k: code for k, (code, _) in got.items()} == {
        (TOPIC, "cfg-topic"): NONE, (TOPIC, "cfg-missing"): UNKNOWN_TOPIC_OR_PARTITION, (BROKER, "0"): NONE}
    assert retention() == "12345"


def _set_config(name: str, value: str) -> Any:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    return ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)


# -- DescribeCluster, DescribeLogDirs, AlterReplicaLogDirs ----------------------------------------------------------
def test_describe_cluster_needs_nothing_and_reports_the_allowed_cluster_operations(broker):
    def ops(user: str, include: bool = True) -> Any:
        answer = call(broker, user, DescribeClusterRequest[1](include_cluster_authorized_operations=include,
                                                               endpoint_type=1), 1)
        assert answer.error_code == NONE and [b.broker_id for b in answer.brokers] == [0]
        return answer.authorized_operations

    assert ops("alice") == set()  # no DESCRIBE on the cluster: none reported, but the cluster is described
    assert ops("alice", include=False) is None
    assert ops("admin") == {CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS,
                            IDEMPOTENT_WRITE}
    grant_cluster(broker, "alice", "ALTER")  # ALTER implies DESCRIBE
    assert ops("alice") == {ALTER, DESCRIBE}
    admin = broker.admin("alice")
    described = admin.describe_cluster(include_authorized_operations=True).result(30)
    assert set(described.authorized_operations) == {CkAclOperation.ALTER, CkAclOperation.DESCRIBE}


def test_describe_log_dirs_needs_describe_on_the_cluster(broker):
    answer = call(broker, "alice", DescribeLogDirsRequest[4](topics=None), 4)
    assert (answer.error_code, answer.results) == (CLUSTER_AUTHORIZATION_FAILED, [])
    # before v3 the answer has no error field: just no directories
    assert call(broker, "alice", DescribeLogDirsRequest[2](topics=None), 2).results == []
    grant_cluster(broker, "alice", "DESCRIBE")
    answer = call(broker, "alice", DescribeLogDirsRequest[4](topics=None), 4)
    assert answer.error_code == NONE and len(answer.results) == 1


def test_alter_replica_log_dirs_needs_alter_on_the_cluster(broker):
    log_dir = call(broker, "admin", DescribeLogDirsRequest[4](topics=None), 4).results[0].log_dir
    req = AlterReplicaLogDirsRequest[2]
    d = req.AlterReplicaLogDir

    def move(user: str) -> dict[tuple[str, int], int]:
        answer = call(broker, user, req(dirs=[d(path=log_dir, topics=[
            d.AlterReplicaLogDirTopic(name="kept", partitions=[0]),
            d.AlterReplicaLogDirTopic(name="ard-missing", partitions=[0])])]), 2)
        return {(r.topic_name, p.partition_index): p.error_code for r in answer.results for p in r.partitions}

    assert move("alice") == {("kept", 0): CLUSTER_AUTHORIZATION_FAILED,
                             ("ard-missing", 0): CLUSTER_AUTHORIZATION_FAILED}
    grant_cluster(broker, "alice", "ALTER")
    assert move("alice") == {("kept", 0): NONE, ("ard-missing", 0): UNKNOWN_TOPIC_OR_PARTITION}


# -- ElectLeaders, partition reassignments, ControlledShutdown, FetchSnapshot ---------------------------------------
def test_leadership_apis_need_alter_or_describe_on_the_cluster(broker):
    elect = ElectLeadersRequest[2]
    election = elect(election_type=0, timeout_ms=10000,
                     topic_partitions=[elect.TopicPartitions(topic="kept", partitions=[0])])
    alter = AlterPartitionReassignmentsRequest[1]
    reassignment = alter(timeout_ms=10000, allow_replication_factor_change=True, topics=[
        alter.ReassignableTopic(name="kept", partitions=[
            alter.ReassignableTopic.ReassignablePartition(partition_index=0, replicas=[0])])])
    listing = ListPartitionReassignmentsRequest[0](timeout_ms=10000, topics=None)

    answer = call(broker, "alice", election, 2)
    assert answer.error_code == CLUSTER_AUTHORIZATION_FAILED
    assert [(p.partition_id, p.error_code) for p in answer.replica_election_results[0].partition_result] == [
        (0, CLUSTER_AUTHORIZATION_FAILED)]
    answer = call(broker, "alice", reassignment, 1)
    assert answer.error_code == CLUSTER_AUTHORIZATION_FAILED
    assert [p.error_code for p in answer.responses[0].partitions] == [CLUSTER_AUTHORIZATION_FAILED]
    assert call(broker, "alice", listing, 0).error_code == CLUSTER_AUTHORIZATION_FAILED
    # kafka-python's admin raises Kafka's error
    from kafka.admin import KafkaAdminClient

    client = KafkaAdminClient(**broker.kafka_python("alice"))
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            client.list_partition_reassignments()
    finally:
        client.close()

    grant_cluster(broker, "alice", "DESCRIBE")
    assert call(broker, "alice", listing, 0).error_code == NONE
    assert call(broker, "alice", election, 2).error_code == CLUSTER_AUTHORIZATION_FAILED  # DESCRIBE is not ALTER
    grant_cluster(broker, "alice", "ALTER")
    answer = call(broker, "alice", election, 2)
    assert (answer.error_code, answer.replica_election_results[0].partition_result[0].error_code) == (
        NONE, ELECTION_NOT_NEEDED)
    answer = call(broker, "alice", reassignment, 1)
    assert (answer.error_code, answer.responses[0].partitions[0].error_code) == (NONE, NONE)


def test_controlled_shutdown_and_fetch_snapshot_need_cluster_action(broker):
    def shutdown(user: str) -> int:
        request = ControlledShutdownRequest[3](broker_id=1, broker_epoch=-1)
        return call_inter_broker(broker, user, request, 3, ControlledShutdownResponse[3]).error_code

    def snapshot(user: str) -> Any:
        req = FetchSnapshotRequest[0]
        ts = req.TopicSnapshot
        ps = ts.PartitionSnapshot
        request = req(replica_id=1, max_bytes=1 << 20, topics=[ts(name="kept", partitions=[
            ps(partition=0, current_leader_epoch=-1, snapshot_id=ps.SnapshotId(end_offset=5, epoch=0),
               position=0)])])
        return call_inter_broker(broker, user, request, 0, FetchSnapshotResponse[0])

    assert shutdown("alice") == CLUSTER_AUTHORIZATION_FAILED
    refused = snapshot("alice")
    assert (refused.error_code, refused.topics) == (CLUSTER_AUTHORIZATION_FAILED, [])
    grant_cluster(broker, "alice", "CLUSTER_ACTION")
    assert shutdown("alice") == NOT_CONTROLLER  # the single node has no controller to ask
    answered = snapshot("alice")
    assert answered.error_code == NONE and answered.topics[0].partitions[0].error_code != CLUSTER_AUTHORIZATION_FAILED


# -- SCRAM credentials ----------------------------------------------------------------------------------------------
def test_scram_credentials_need_describe_and_alter_on_the_cluster(broker):
    describe = DescribeUserScramCredentialsRequest[0]
    alter = AlterUserScramCredentialsRequest[0]
    upsert = alter.ScramCredentialUpsertion(name="carol", mechanism=1, iterations=4096, salt=b"s" * 16,
                                            salted_password=b"p" * 32)
    remove = alter.ScramCredentialDeletion(name="dave", mechanism=1)

    def described(user: str) -> Any:
        return call(broker, user, describe(users=[describe.UserName(name="carol")]), 0)

    answer = described("alice")
    assert answer.error_code == CLUSTER_AUTHORIZATION_FAILED
    assert [(r.user, r.error_code) for r in answer.results] == [("", CLUSTER_AUTHORIZATION_FAILED)]
    answer = call(broker, "alice", alter(deletions=[remove], upsertions=[upsert]), 0)
    assert [(r.user, r.error_code) for r in answer.results] == [("carol", CLUSTER_AUTHORIZATION_FAILED),
                                                                ("dave", CLUSTER_AUTHORIZATION_FAILED)]
    assert described("admin").results[0].error_code == RESOURCE_NOT_FOUND  # nothing was stored
    grant_cluster(broker, "alice", "ALTER")
    answer = call(broker, "alice", alter(deletions=[], upsertions=[upsert]), 0)
    assert [(r.user, r.error_code) for r in answer.results] == [("carol", NONE)]
    assert described("alice").error_code == NONE  # ALTER implies DESCRIBE
    assert [(c.mechanism, c.iterations) for c in described("alice").results[0].credential_infos] == [(1, 4096)]


# -- ACLs: DescribeAcls refused, and Kafka's kafka-acls ---------------------------------------------------------------
def test_describe_acls_refused_is_an_error_not_an_empty_list(broker):
    broker.grant("bob", "TOPIC", "anything", "READ")
    request = DescribeAclsRequest[3](resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                                     principal_filter=None, host_filter=None, operation=1, permission_type=1)
    answer = call(broker, "alice", request, 3)
    assert (answer.error_code, answer.resources) == (CLUSTER_AUTHORIZATION_FAILED, [])
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KpResourceType

    everything = ACLFilter(principal=None, host="*", operation=ACLOperation.ANY,
                           permission_type=ACLPermissionType.ANY,
                           resource_pattern=ResourcePatternFilter(KpResourceType.ANY, None,
                                                                  ACLResourcePatternType.ANY))
    client = KafkaAdminClient(**broker.kafka_python("alice"))
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            client.describe_acls(everything)
    finally:
        client.close()
    grant_cluster(broker, "alice", "DESCRIBE")
    answer = call(broker, "alice", request, 3)
    assert answer.error_code == NONE and {r.resource_name for r in answer.resources} == {"anything",
                                                                                         "kafka-cluster"}


@pytest.fixture(scope="module")
def acl_tool(tmp_path_factory) -> Path:
    """A --command-config for kafka-acls: SASL_PLAINTEXT PLAIN (users' passwords are "<name>-secret")."""
    try:
        tools_runtime()
    except KafkaUnavailable as exc:
        pytest.skip(str(exc))
    directory = tmp_path_factory.mktemp("acl-tool")
    for user in ("admin", "alice"):
        (directory / f"{user}.properties").write_text(
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{user}" password="{user}-secret";\n')
    return directory


def test_kafka_acls_tool_adds_lists_and_removes(broker, acl_tool):
    def acls(user: str, *args: str) -> Any:
        return kafka_tool(ACL_CLASS, "--bootstrap-server", broker.bootstrap,
                          "--command-config", str(acl_tool / f"{user}.properties"), *args)

    prefixed = ("--topic", "tool-", "--resource-pattern-type", "prefixed")
    acls("admin", "--add", "--allow-principal", "User:alice", "--operation", "Read", *prefixed).check()
    listed = acls("admin", "--list", *prefixed).check().stdout
    assert "name=tool-, patternType=PREFIXED" in listed and "principal=User:alice" in listed \
        and "operation=READ" in listed and "permissionType=ALLOW" in listed
    # the ACL works: READ on the prefix implies DESCRIBE, so ListOffsets on a topic under it is answered
    assert earliest(broker, "alice", "tool-x")["tool-x"][0] == UNKNOWN_TOPIC_OR_PARTITION
    # alice may not list ACLs: the Java admin client raises what the broker answers
    refused = acls("alice", "--list")
    assert not refused.ok and "ClusterAuthorizationException" in refused.stdout + refused.stderr
    acls("admin", "--remove", "--force", "--allow-principal", "User:alice", "--operation", "Read",
         *prefixed).check()
    assert "principal=User:alice" not in acls("admin", "--list", *prefixed).check().stdout
    assert earliest(broker, "alice", "tool-x")["tool-x"][0] == TOPIC_AUTHORIZATION_FAILED


def test_no_authorizer_keeps_the_single_node_answers(broker_factory):
    """Without authorizer.class.name every check passes at once: what the tests above refuse is answered, and the
    cluster operations asked for are all of them (Kafka's AuthHelper without an authorizer)."""
    plain = broker_factory()
    with Wire(plain.bootstrap) as w:
        answer = w.request(DescribeClusterRequest[1](include_cluster_authorized_operations=True, endpoint_type=1), 1)
        assert answer.authorized_operations == {CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS,
                                                ALTER_CONFIGS, IDEMPOTENT_WRITE}
        assert w.request(DescribeLogDirsRequest[4](topics=None), 4).error_code == NONE
        assert w.request(ListPartitionReassignmentsRequest[0](timeout_ms=1000, topics=None), 0).error_code == NONE
        answer = w.request(DescribeAclsRequest[3](resource_type_filter=1, resource_name_filter=None,
                                                  pattern_type_filter=1, principal_filter=None, host_filter=None,
                                                  operation=1, permission_type=1), 3)
        assert answer.error_code == 54  # SECURITY_DISABLED
