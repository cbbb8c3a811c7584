"""ElectLeaders, AlterPartitionReassignments and ListPartitionReassignments on the single node: advertised, and
answered as a one-broker Kafka answers them (kafka-python's admin and raw requests), so admin tools behave the
same against a single node and a cluster; ControlledShutdown (inter-broker only) is never advertised."""

from __future__ import annotations

from kafka.admin import KafkaAdminClient, NewTopic
from kafka.protocol.admin import AlterPartitionReassignmentsRequest, ElectLeadersRequest
from kafka.structs import TopicPartition
from tests.support.wire import Wire

NONE, UNKNOWN_TOPIC, ELECTION_NOT_NEEDED, NO_REASSIGNMENT, INVALID_ASSIGNMENT = 0, 3, 84, 85, 39


def test_advertised_and_answered_as_one_broker_kafka(module_broker, topic_name):
    admin = KafkaAdminClient(bootstrap_servers=module_broker.bootstrap)
    admin.create_topics([NewTopic(topic_name, 3, 1)])
    with Wire(module_broker.bootstrap) as w:
        from kafka.protocol.metadata import ApiVersionsRequest

        keys = {k.api_key: (k.min_version, k.max_version) for k in w.request(ApiVersionsRequest[3](
            client_software_name="t", client_software_version="1"), 3).api_keys}
        assert keys[43] == (0, 2) and keys[45] == (0, 1) and keys[46] == (0, 0) and 7 not in keys

        elect = ElectLeadersRequest[2]
        resp = w.request(elect(election_type=0, topic_partitions=[
            elect.TopicPartitions(topic=topic_name, partitions=[0, 1, 7])], timeout_ms=10000), 2)
        codes = {p.partition_id: p.error_code for t in resp.replica_election_results for p in t.partition_result}
        assert resp.error_code == NONE and codes == {0: ELECTION_NOT_NEEDED, 1: ELECTION_NOT_NEEDED, 7: UNKNOWN_TOPIC}
        everything = w.request(elect(election_type=0, topic_partitions=None, timeout_ms=10000), 2)
        assert everything.replica_election_results == []  # nothing needed an election

        alter = AlterPartitionReassignmentsRequest[1]
        part = alter.ReassignableTopic.ReassignablePartition
        resp = w.request(alter(timeout_ms=10000, allow_replication_factor_change=True, topics=[
            alter.ReassignableTopic(name=topic_name, partitions=[
                part(partition_index=0, replicas=[0]), part(partition_index=1, replicas=[5]),
                part(partition_index=2, replicas=None)])]), 1)
        got = {p.partition_index: (p.error_code, p.error_message) for t in resp.responses for p in t.partitions}
        assert got[0] == (NONE, None) and got[2][0] == NO_REASSIGNMENT
        assert got[1][0] == INVALID_ASSIGNMENT and "broker 5" in got[1][1]
    # kafka-python's admin sees the same: onto the broker itself completes, onto an unknown one is refused.
    result = admin.list_partition_reassignments()
    assert not result or not result.get(topic_name)
    assert admin.alter_partition_reassignments({TopicPartition(topic_name, 1): [0]}) is not None
