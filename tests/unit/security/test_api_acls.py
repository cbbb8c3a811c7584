"""The authorization table covers every API the broker serves (fail closed), and names only real checks."""

from __future__ import annotations

from oncelog.broker.handlers import HANDLERS, INTERNAL_HANDLERS
from oncelog.protocol.apis import ApiKey
from oncelog.security.acls import ResourceType
from oncelog.security.api_acls import RULES, check_for, request_name


def test_every_served_api_has_a_row_and_every_row_a_served_api():
    served = set(HANDLERS) | set(INTERNAL_HANDLERS)
    assert sorted(ApiKey(k).name for k in served - set(RULES)) == []
    assert sorted(ApiKey(k).name for k in set(RULES) - served) == []


def test_rows_are_unambiguous_per_resource_and_operation():
    for key, checks in RULES.items():
        pairs = [(c.resource, c.operation) for c in checks]
        assert len(pairs) == len(set(pairs)), ApiKey(key).name
        for check in checks:
            assert check_for(key, check.resource, check.operation) is check


def test_kafka_request_names():
    assert request_name(ApiKey.PRODUCE) == "Produce"
    assert request_name(ApiKey.OFFSET_FOR_LEADER_EPOCH) == "OffsetForLeaderEpoch"
    assert request_name(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS) == "DescribeUserScramCredentials"


def test_broker_only_apis_need_cluster_action():
    for key in (ApiKey.CONTROLLED_SHUTDOWN, ApiKey.FETCH_SNAPSHOT):
        (check,) = RULES[key]
        assert (check.resource, check.operation.name) == (ResourceType.CLUSTER, "CLUSTER_ACTION")
    # WriteTxnMarkers: Cluster ALTER first (an operator's kafka-transactions abort), else CLUSTER_ACTION
    assert [(c.resource, c.operation.name) for c in RULES[ApiKey.WRITE_TXN_MARKERS]] == [
        (ResourceType.CLUSTER, "ALTER"), (ResourceType.CLUSTER, "CLUSTER_ACTION")]
