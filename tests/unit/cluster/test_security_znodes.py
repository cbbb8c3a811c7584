"""The znodes of ACLs, SCRAM credentials and client quotas (cluster/store/znodes.py), without ZooKeeper: Kafka's
ZooKeeper-era paths and values, written and read back, values as Kafka wrote them read, and what no znode can hold
refused."""

from __future__ import annotations

import json

import pytest

from oncelog.cluster.store import znodes
from oncelog.security.acls import (
    AccessControlEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from oncelog.security.credentials import ScramCredential, from_password
from oncelog.security.quotas import QuotaEntity

ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY


def entry(principal: str = "User:alice", operation: AclOperation = AclOperation.READ,
          permission: AclPermissionType = ALLOW, host: str = "*") -> AccessControlEntry:
    return AccessControlEntry(principal, host, operation, permission)


# -- ACLs -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern, path", [
    (ResourcePattern(ResourceType.TOPIC, "orders", PatternType.LITERAL), "/kafka-acl/Topic/orders"),
    (ResourcePattern(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL), "/kafka-acl/Cluster/kafka-cluster"),
    (ResourcePattern(ResourceType.TOPIC, "*", PatternType.LITERAL), "/kafka-acl/Topic/*"),
    (ResourcePattern(ResourceType.GROUP, "app-", PatternType.PREFIXED), "/kafka-acl-extended/prefixed/Group/app-"),
    (ResourcePattern(ResourceType.TRANSACTIONAL_ID, "tx", PatternType.PREFIXED),
     "/kafka-acl-extended/prefixed/TransactionalId/tx"),
    (ResourcePattern(ResourceType.DELEGATION_TOKEN, "t", PatternType.LITERAL), "/kafka-acl/DelegationToken/t"),
])
def test_acl_paths_are_kafkas(pattern, path):
    assert znodes.acl_path(pattern) == path
    type_dir = path.split("/")[-2]
    assert znodes.acl_type_dir(type_dir) == pattern.resource_type


def test_every_resource_type_directory_is_in_the_layout():
    for root in ("/kafka-acl", "/kafka-acl-extended/prefixed"):
        for name in ("Topic", "Group", "Cluster", "TransactionalId", "DelegationToken", "User"):
            assert f"{root}/{name}" in znodes.SECURITY_LAYOUT
    assert {"/kafka-acl-changes", "/kafka-acl-extended-changes", "/config/users", "/config/clients",
            "/config/changes"} <= set(znodes.SECURITY_LAYOUT)
    assert znodes.acl_type_dir("Topics") is None and znodes.acl_type_dir("Any") is None


def test_acl_values_round_trip_in_kafkas_spelling():
    entries = (entry(), entry("User:bob", AclOperation.CLUSTER_ACTION, DENY, "10.0.0.1"),
               entry("User:*", AclOperation.IDEMPOTENT_WRITE), entry("Group:ops", AclOperation.DESCRIBE_CONFIGS))
    data = znodes.acls_json(entries)
    value = json.loads(data)
    assert value["version"] == 1
    assert value["acls"][1] == {"principal": "User:bob", "permissionType": "Deny", "operation": "ClusterAction",
                                "host": "10.0.0.1"}
    assert [a["operation"] for a in value["acls"]] == ["Read", "ClusterAction", "IdempotentWrite", "DescribeConfigs"]
    assert znodes.acls_from(data) == entries


def test_acls_as_kafka_wrote_them():
    # AclEntry.fromBytes' example, and the enum-name spelling some tools wrote
    data = (b'{"version": 1, "acls": [{"host":"host1","permissionType":"Deny","operation":"Read",'
            b'"principal":"User:alice"}, {"host":"*","permissionType":"ALLOW","operation":"ALTER_CONFIGS",'
            b'"principal":"User:bob"}]}')
    assert znodes.acls_from(data) == (entry(host="host1", permission=DENY),
                                      entry("User:bob", AclOperation.ALTER_CONFIGS))
    assert znodes.acls_from(b"") == () and znodes.acls_from(None) == ()


@pytest.mark.parametrize("data", [
    b'{"version": 2, "acls": []}',
    b'{"version": 1}',
    b'{"version": 1, "acls": [{"host": "*", "permissionType": "Allow", "operation": "Read"}]}',
    b'{"version": 1, "acls": [{"host": "*", "permissionType": "Allow", "operation": "Any", "principal": "User:a"}]}',
    b'{"version": 1, "acls": [{"host": "*", "permissionType": "Maybe", "operation": "Read", "principal": "User:a"}]}',
    b'{"version": 1, "acls": [{"host": "*", "permissionType": "Allow", "operation": "Read", "principal": "alice"}]}',
    b'[1]',
    b'not json',
])
def test_an_acl_value_kafka_would_refuse_is_refused(data):
    with pytest.raises(ValueError):
        znodes.acls_from(data)


def test_change_notifications_of_literal_and_prefixed_patterns():
    literal = ResourcePattern(ResourceType.TOPIC, "a:b", PatternType.LITERAL)
    assert znodes.acl_change_json(literal) == b"TOPIC:a:b"
    assert znodes.acl_change_from(PatternType.LITERAL, b"TOPIC:a:b") == literal
    assert znodes.acl_change_from(PatternType.LITERAL, b"Topic:a:b") == literal
    prefixed = ResourcePattern(ResourceType.TRANSACTIONAL_ID, "tx-", PatternType.PREFIXED)
    assert json.loads(znodes.acl_change_json(prefixed)) == {"version": 1, "resourceType": "TRANSACTIONAL_ID",
                                                            "name": "tx-", "patternType": "PREFIXED"}
    assert znodes.acl_change_from(PatternType.PREFIXED, znodes.acl_change_json(prefixed)) == prefixed
    with pytest.raises(ValueError):
        znodes.acl_change_from(PatternType.LITERAL, b"no separator")
    with pytest.raises(ValueError):
        znodes.acl_change_from(PatternType.PREFIXED, b'{"version":1,"resourceType":"TOPIC","name":"x",'
                                                     b'"patternType":"LITERAL"}')


@pytest.mark.parametrize("name, ok", [
    ("orders", True), ("*", True), ("a.b", True), ("ünïcode", True),
    ("a/b", False), (".", False), ("..", False), ("", False), ("a\x00b", False), ("tab\there", False),
    ("\x7f", False), ("\ue000", False), ("\ufff5", False),
])
def test_names_no_znode_can_have(name, ok):
    assert (znodes.znode_name_error(name) is None) is ok


# -- config entities -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, sanitized", [
    ("alice", "alice"), ("User One", "User%20One"), ("a*b", "a%2Ab"), ("x/y", "x%2Fy"), ("a~b", "a%7Eb"),
    ("<default>", "%3Cdefault%3E"), ("é", "%C3%A9"), (".", "%2E"), ("a.b-c_d", "a.b-c_d"),
])
def test_entity_names_are_sanitized_as_kafkas_sanitizer(name, sanitized):
    assert znodes.sanitize(name) == sanitized
    assert znodes.desanitize(sanitized) == name


@pytest.mark.parametrize("names, path", [
    ({"user": "alice"}, "users/alice"),
    ({"user": None}, "users/<default>"),
    ({"client-id": "app"}, "clients/app"),
    ({"client-id": None}, "clients/<default>"),
    ({"user": "alice", "client-id": "app"}, "users/alice/clients/app"),
    ({"user": None, "client-id": None}, "users/<default>/clients/<default>"),
    ({"user": "<default>", "client-id": "a b"}, "users/%3Cdefault%3E/clients/a%20b"),
])
def test_quota_entity_paths(names, path):
    entity = QuotaEntity.of(names)
    assert znodes.quota_entity_path(entity) == path
    assert znodes.quota_entity_of(path) == entity
    assert znodes.entity_znode(path) == f"/config/{path}"


def test_the_user_of_an_entity_path():
    assert znodes.entity_user("users/alice") == "alice"
    assert znodes.entity_user("users/a%2Fb") == "a/b"
    for path in ("users/<default>", "users/alice/clients/app", "clients/alice", "topics/t", "users"):
        assert znodes.entity_user(path) is None
    with pytest.raises(ValueError):
        znodes.quota_entity_of("users/alice/clients")


def test_config_values_and_notifications():
    config = {"producer_byte_rate": "1024", "SCRAM-SHA-256": "salt=..."}
    data = znodes.config_json(config)
    assert json.loads(data) == {"version": 1, "config": config}
    assert znodes.config_from(data) == config
    assert znodes.config_from(b"") == {} and znodes.config_from(None) == {}   # a parent Kafka created, no data
    assert znodes.config_from(b'{"version":1,"config":{"consumer_byte_rate":2048}}') == {"consumer_byte_rate": "2048"}
    assert json.loads(znodes.config_change_json("users/alice")) == {"version": 2, "entity_path": "users/alice"}
    assert znodes.config_change_from(znodes.config_change_json("users/a/clients/b")) == "users/a/clients/b"
    assert znodes.config_change_from(b'{"version":1,"entity_type":"clients","entity_name":"app"}') == "clients/app"
    with pytest.raises(ValueError):
        znodes.config_change_from(b'{"version":3}')


def test_scram_credentials_as_kafkas_credential_to_string():
    credential = from_password("SCRAM-SHA-512", "secret", 8192)
    text = znodes.scram_text(credential)
    assert text.startswith("salt=") and text.endswith(",iterations=8192")
    assert [kv.split("=", 1)[0] for kv in text.split(",")] == ["salt", "stored_key", "server_key", "iterations"]
    assert znodes.scram_from("SCRAM-SHA-512", text) == credential
    # one in the form Kafka writes (standard base64, padded)
    kafka = ("salt=MWx2NHBkbnc0ZXdvdWNhbmdlMmZmeXFmZw==,stored_key=zHFmq8tk0DOhbyrMGb5h/jmMb8Y=,"
             "server_key=ovWsLiCGNOdl+RZ2gVj1eN3bXSE=,iterations=4096")
    parsed = znodes.scram_from("SCRAM-SHA-256", kafka)
    assert isinstance(parsed, ScramCredential) and parsed.iterations == 4096 and len(parsed.stored_key) == 20


@pytest.mark.parametrize("text", [
    "salt=AA==,stored_key=AA==,server_key=AA==",
    "salt=AA==,stored_key=AA==,server_key=AA==,iterations=4096,extra=1",
    "salt=AA==,stored_key=AA==,server_key=AA==,iterations=many",
    "salt=!!,stored_key=AA==,server_key=AA==,iterations=4096",
    "garbage",
])
def test_an_unreadable_credential_is_refused(text):
    with pytest.raises(ValueError):
        znodes.scram_from("SCRAM-SHA-256", text)


def test_quota_values_as_kafka_stores_them():
    assert znodes.quota_text("producer_byte_rate", 1048576.0) == "1048576"
    assert znodes.quota_text("consumer_byte_rate", 2048) == "2048"
    assert znodes.quota_text("request_percentage", 12.5) == "12.5"
