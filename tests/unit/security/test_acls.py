"""The ACL model: Kafka's wire codes, principals, filter matching and CreateAcls validation."""

from __future__ import annotations

import pytest

from oncelog.errors import ErrorCode
from oncelog.security.acls import (
    ANY_BINDING,
    ANY_ENTRY,
    NO_AUTHORIZER_ALTER,
    NO_AUTHORIZER_DESCRIBE,
    AccessControlEntryFilter,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    KafkaPrincipal,
    PatternType,
    ResourcePatternFilter,
    ResourceType,
    acl,
    check_supported_operation,
    parse_principal,
    user,
    validate_filter,
    validate_new_binding,
)

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED, MATCH, ANY = PatternType.LITERAL, PatternType.PREFIXED, PatternType.MATCH, PatternType.ANY
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
READ, WRITE = AclOperation.READ, AclOperation.WRITE


def test_wire_codes_are_kafkas():
    assert {m.name: m.value for m in ResourceType} == {
        "UNKNOWN": 0, "ANY": 1, "TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5,
        "DELEGATION_TOKEN": 6, "USER": 7,
    }
    assert {m.name: m.value for m in PatternType} == {"UNKNOWN": 0, "ANY": 1, "MATCH": 2, "LITERAL": 3, "PREFIXED": 4}
    assert {m.name: m.value for m in AclOperation} == {
        "UNKNOWN": 0, "ANY": 1, "ALL": 2, "READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7,
        "DESCRIBE": 8, "CLUSTER_ACTION": 9, "DESCRIBE_CONFIGS": 10, "ALTER_CONFIGS": 11, "IDEMPOTENT_WRITE": 12,
        "CREATE_TOKENS": 13, "DESCRIBE_TOKENS": 14,
    }
    assert {m.name: m.value for m in AclPermissionType} == {"UNKNOWN": 0, "ANY": 1, "DENY": 2, "ALLOW": 3}


def test_unknown_codes_decode_to_unknown():
    assert ResourceType.from_code(99) is ResourceType.UNKNOWN
    assert PatternType.from_code(-1) is PatternType.UNKNOWN
    assert AclOperation.from_code(15) is AclOperation.UNKNOWN
    assert AclPermissionType.from_code(4) is AclPermissionType.UNKNOWN
    assert AclOperation.from_code(12) is AclOperation.IDEMPOTENT_WRITE


def test_pascal_names_as_kafka_logs_them():
    assert ResourceType.TRANSACTIONAL_ID.pascal_name == "TransactionalId"
    assert ResourceType.TOPIC.pascal_name == "Topic"
    assert AclOperation.DESCRIBE_CONFIGS.pascal_name == "DescribeConfigs"
    assert AclPermissionType.ALLOW.pascal_name == "Allow"


def test_principal_parsing():
    assert parse_principal("User:alice") == KafkaPrincipal("User", "alice")
    # split at the first colon only: an mTLS distinguished name may hold more
    assert parse_principal("User:CN=a,O=b:c") == KafkaPrincipal("User", "CN=a,O=b:c")
    assert str(parse_principal("Group:ops")) == "Group:ops"
    assert parse_principal("User:*").is_wildcard
    assert not parse_principal("Group:*").is_wildcard
    assert user("bob") == "User:bob"
    for bad in ("alice", ""):
        with pytest.raises(ValueError, match="principalType:principalName"):
            parse_principal(bad)


# --- filters (DescribeAcls, DeleteAcls) ---------------------------------------------------------------------------

LIT_FOO = acl(TOPIC, "foo", LITERAL, "User:alice", "*", READ, ALLOW)
LIT_FOOBAR = acl(TOPIC, "foobar", LITERAL, "User:alice", "*", READ, ALLOW)
PRE_FOO = acl(TOPIC, "foo", PREFIXED, "User:alice", "*", READ, ALLOW)
PRE_FO = acl(TOPIC, "fo", PREFIXED, "User:bob", "10.0.0.1", WRITE, DENY)
WILD = acl(TOPIC, "*", LITERAL, "User:*", "*", READ, ALLOW)
GROUP_FOO = acl(GROUP, "foo", LITERAL, "User:alice", "*", READ, ALLOW)
ALL_BINDINGS = [LIT_FOO, LIT_FOOBAR, PRE_FOO, PRE_FO, WILD, GROUP_FOO]


def selected(pattern_filter: ResourcePatternFilter, entry_filter: AccessControlEntryFilter = ANY_ENTRY):
    f = AclBindingFilter(pattern_filter, entry_filter)
    return [b for b in ALL_BINDINGS if f.matches(b)]


def test_any_filter_matches_everything():
    assert [b for b in ALL_BINDINGS if ANY_BINDING.matches(b)] == ALL_BINDINGS
    assert selected(ResourcePatternFilter(ResourceType.ANY, None, ANY)) == ALL_BINDINGS


def test_resource_type_filter():
    assert selected(ResourcePatternFilter(GROUP, None, ANY)) == [GROUP_FOO]
    assert selected(ResourcePatternFilter(TOPIC, None, ANY)) == [LIT_FOO, LIT_FOOBAR, PRE_FOO, PRE_FO, WILD]


def test_pattern_type_any_compares_the_name_exactly():
    assert selected(ResourcePatternFilter(TOPIC, "foo", ANY)) == [LIT_FOO, PRE_FOO]
    assert selected(ResourcePatternFilter(ResourceType.ANY, "foo", ANY)) == [LIT_FOO, PRE_FOO, GROUP_FOO]


def test_literal_and_prefixed_filters_select_their_pattern_type():
    assert selected(ResourcePatternFilter(TOPIC, "foo", LITERAL)) == [LIT_FOO]
    assert selected(ResourcePatternFilter(TOPIC, "foo", PREFIXED)) == [PRE_FOO]
    assert selected(ResourcePatternFilter(TOPIC, None, PREFIXED)) == [PRE_FOO, PRE_FO]
    # "*" in a LITERAL filter finds the wildcard ACL only, not every literal one
    assert selected(ResourcePatternFilter(TOPIC, "*", LITERAL)) == [WILD]


def test_match_filter_selects_every_pattern_that_applies_to_the_name():
    assert selected(ResourcePatternFilter(TOPIC, "foobar", MATCH)) == [LIT_FOOBAR, PRE_FOO, PRE_FO, WILD]
    assert selected(ResourcePatternFilter(TOPIC, "foo", MATCH)) == [LIT_FOO, PRE_FOO, PRE_FO, WILD]
    assert selected(ResourcePatternFilter(TOPIC, "f", MATCH)) == [WILD]
    assert selected(ResourcePatternFilter(TOPIC, None, MATCH)) == [LIT_FOO, LIT_FOOBAR, PRE_FOO, PRE_FO, WILD]
    assert selected(ResourcePatternFilter(ResourceType.ANY, "foo", MATCH)) == [
        LIT_FOO, PRE_FOO, PRE_FO, WILD, GROUP_FOO]


def test_entry_filter_fields():
    any_topic = ResourcePatternFilter(TOPIC, None, ANY)
    assert selected(any_topic, AccessControlEntryFilter("User:bob", None, AclOperation.ANY,
                                                        AclPermissionType.ANY)) == [PRE_FO]
    assert selected(any_topic, AccessControlEntryFilter(None, "10.0.0.1", AclOperation.ANY,
                                                        AclPermissionType.ANY)) == [PRE_FO]
    assert selected(any_topic, AccessControlEntryFilter(None, None, WRITE, AclPermissionType.ANY)) == [PRE_FO]
    assert selected(any_topic, AccessControlEntryFilter(None, None, AclOperation.ANY, DENY)) == [PRE_FO]
    # the principal is compared exactly: "User:*" finds wildcard ACLs, "User:alice" does not find them
    assert selected(any_topic, AccessControlEntryFilter("User:*", None, AclOperation.ANY,
                                                        AclPermissionType.ANY)) == [WILD]
    assert WILD not in selected(any_topic, AccessControlEntryFilter("User:alice", None, AclOperation.ANY,
                                                                    AclPermissionType.ANY))
    # ALL in a filter is the operation ALL, not "any operation"
    assert selected(any_topic, AccessControlEntryFilter(None, None, AclOperation.ALL, AclPermissionType.ANY)) == []


def test_a_bindings_own_filter_matches_only_it():
    for binding in ALL_BINDINGS:
        assert [b for b in ALL_BINDINGS if binding.to_filter().matches(b)] == [binding]
        assert binding.to_filter().matches_at_most_one()


def test_indefinite_fields():
    assert ANY_BINDING.find_indefinite_field() == "Resource type is ANY."
    assert ResourcePatternFilter(TOPIC, None, LITERAL).find_indefinite_field() == "Resource name is NULL."
    assert ResourcePatternFilter(TOPIC, "t", MATCH).find_indefinite_field() == "Resource pattern type is MATCH."
    f = AclBindingFilter(ResourcePatternFilter(TOPIC, "t", LITERAL), ANY_ENTRY)
    assert f.find_indefinite_field() == "Principal is NULL"
    assert not f.matches_at_most_one()


# --- validation ---------------------------------------------------------------------------------------------------


def invalid(binding) -> str:
    error = validate_new_binding(binding)
    assert error is not None and error.code == ErrorCode.INVALID_REQUEST == 42
    return error.message


def test_valid_bindings_pass():
    for binding in ALL_BINDINGS:
        assert validate_new_binding(binding) is None
    assert validate_new_binding(acl(CLUSTER, "kafka-cluster", LITERAL, "User:a", "*", AclOperation.ALTER, ALLOW)) is None
    # the host is not checked, as in Kafka; an empty principal name is a principal
    assert validate_new_binding(acl(TOPIC, "t", LITERAL, "User:", "not a host", READ, ALLOW)) is None


def test_validation_errors_in_kafkas_words():
    assert invalid(acl(CLUSTER, "my-cluster", LITERAL, "User:a", "*", READ, ALLOW)) == (
        "The only valid name for the CLUSTER resource is kafka-cluster")
    assert invalid(acl(CLUSTER, "", LITERAL, "User:a", "*", READ, ALLOW)) == (
        "The only valid name for the CLUSTER resource is kafka-cluster")
    assert invalid(acl(TOPIC, "", LITERAL, "User:a", "*", READ, ALLOW)) == "Invalid empty resource name"
    assert invalid(acl(ResourceType.ANY, "t", LITERAL, "User:a", "*", READ, ALLOW)) == "Invalid resourceType ANY"
    assert invalid(acl(ResourceType.UNKNOWN, "t", LITERAL, "User:a", "*", READ, ALLOW)) == (
        "Invalid resourceType UNKNOWN")
    for ptype in (MATCH, ANY, PatternType.UNKNOWN):
        assert invalid(acl(TOPIC, "t", ptype, "User:a", "*", READ, ALLOW)) == f"Invalid patternType {ptype.name}"
    for op in (AclOperation.ANY, AclOperation.UNKNOWN):
        assert invalid(acl(TOPIC, "t", LITERAL, "User:a", "*", op, ALLOW)) == f"Invalid operation {op.name}"
    for perm in (AclPermissionType.ANY, AclPermissionType.UNKNOWN):
        assert invalid(acl(TOPIC, "t", LITERAL, "User:a", "*", READ, perm)) == f"Invalid permissionType {perm.name}"
    assert invalid(acl(TOPIC, "t", LITERAL, "alice", "*", READ, ALLOW)) == (
        "Could not parse principal from `alice` (no colon is present separating the principal type from the "
        "principal name)")


def test_operation_per_resource_type_is_the_kafka_acls_tool_check():
    # a broker stores these; the tool (and check_supported_operation) refuses them
    bad = acl(TOPIC, "t", LITERAL, "User:a", "*", AclOperation.CLUSTER_ACTION, ALLOW)
    assert validate_new_binding(bad) is None
    error = check_supported_operation(bad)
    assert error is not None and error.code == ErrorCode.INVALID_REQUEST
    assert error.message == ("ResourceType TOPIC only supports operations ALL, READ, WRITE, CREATE, DELETE, ALTER, "
                             "DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS")
    assert check_supported_operation(acl(GROUP, "g", LITERAL, "User:a", "*", WRITE, ALLOW)) is not None
    assert check_supported_operation(acl(GROUP, "g", LITERAL, "User:a", "*", AclOperation.ALL, DENY)) is None
    assert check_supported_operation(
        acl(CLUSTER, "kafka-cluster", LITERAL, "User:a", "*", AclOperation.IDEMPOTENT_WRITE, ALLOW)) is None
    assert check_supported_operation(
        acl(ResourceType.TRANSACTIONAL_ID, "tx", PREFIXED, "User:a", "*", READ, ALLOW)) is not None
    assert check_supported_operation(
        acl(ResourceType.USER, "bob", LITERAL, "User:a", "*", AclOperation.CREATE_TOKENS, ALLOW)) is None


def test_filter_validation_for_delete():
    assert validate_filter(ANY_BINDING) is None
    bad_pattern = AclBindingFilter(ResourcePatternFilter(ResourceType.UNKNOWN, None, ANY), ANY_ENTRY)
    assert validate_filter(bad_pattern) == (ErrorCode.INVALID_REQUEST, "Unknown patternFilter.")
    bad_entry = AclBindingFilter(ResourcePatternFilter(TOPIC, None, ANY),
                                 AccessControlEntryFilter(None, None, AclOperation.UNKNOWN, AclPermissionType.ANY))
    assert validate_filter(bad_entry) == (ErrorCode.INVALID_REQUEST, "Unknown entryFilter.")


def test_no_authorizer_answers():
    assert NO_AUTHORIZER_DESCRIBE.code == NO_AUTHORIZER_ALTER.code == ErrorCode.SECURITY_DISABLED == 54
    assert NO_AUTHORIZER_DESCRIBE.message == "No Authorizer is configured on the broker"
    assert NO_AUTHORIZER_ALTER.message == "No Authorizer is configured."
