"""StandardAuthorizer semantics over AclSnapshot: every matching rule, authorize_any, filter and the audit log."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.security import authorizer as authorizer_module
from oncelog.security.acls import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    acl,
)
from oncelog.security.authorizer import (
    AUDIT_LOGGER_NAME,
    TRACE,
    AclSnapshot,
    Authorizer,
    parse_super_users,
)

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
Op = AclOperation
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def authz(*bindings: AclBinding, super_users=(), allow_everyone: bool = False) -> Authorizer:
    a = Authorizer(set(super_users), allow_everyone)
    a.update(bindings)
    return a


def allowed(a: Authorizer, op: AclOperation, name: str, principal: str = ALICE, host: str = HOST,
            resource_type: ResourceType = TOPIC) -> bool:
    return a.authorize(principal, host, op, resource_type, name)


def topic_acl(name, pattern=LITERAL, principal=ALICE, host="*", op=Op.READ, perm=ALLOW) -> AclBinding:
    return acl(TOPIC, name, pattern, principal, host, op, perm)


# --- matching ---------------------------------------------------------------------------------------------------


def test_literal_matches_its_name_only():
    a = authz(topic_acl("orders"))
    assert allowed(a, Op.READ, "orders")
    assert not allowed(a, Op.READ, "orders2")
    assert not allowed(a, Op.READ, "order")
    assert not allowed(a, Op.READ, "orders", resource_type=GROUP)


def test_prefixed_matches_names_it_starts():
    a = authz(topic_acl("orders.", PREFIXED))
    assert allowed(a, Op.READ, "orders.eu")
    assert allowed(a, Op.READ, "orders.")
    assert not allowed(a, Op.READ, "orders")
    assert not allowed(a, Op.READ, "xorders.eu")


def test_several_prefixes_of_one_name_all_apply():
    a = authz(topic_acl("a", PREFIXED), topic_acl("abc", PREFIXED, op=Op.WRITE),
              topic_acl("ab", PREFIXED, principal=BOB), topic_acl("abd", PREFIXED, op=Op.DELETE))
    assert allowed(a, Op.READ, "abcd") and allowed(a, Op.WRITE, "abcd")
    assert not allowed(a, Op.DELETE, "abcd")
    assert allowed(a, Op.READ, "abcd", principal=BOB)


def test_wildcard_resource_matches_every_name_of_its_type():
    a = authz(topic_acl("*"))
    assert allowed(a, Op.READ, "anything") and allowed(a, Op.READ, "*")
    assert not allowed(a, Op.READ, "anything", resource_type=GROUP)
    # "*" is special only as a LITERAL name: PREFIXED "*" is the prefix "*"
    b = authz(topic_acl("*", PREFIXED))
    assert allowed(b, Op.READ, "*star") and not allowed(b, Op.READ, "anything")


def test_wildcard_principal_is_user_star_only():
    a = authz(topic_acl("t", principal="User:*"))
    assert allowed(a, Op.READ, "t", principal=ALICE)
    assert allowed(a, Op.READ, "t", principal="Group:ops")  # User:* matches any principal, of any type
    b = authz(topic_acl("t", principal="Group:*"))
    assert not allowed(b, Op.READ, "t", principal="Group:ops")
    c = authz(topic_acl("t", principal=ALICE))
    assert not allowed(c, Op.READ, "t", principal="Group:alice")


def test_host_matches_exactly_or_star():
    a = authz(topic_acl("t", host=HOST))
    assert allowed(a, Op.READ, "t", host=HOST)
    assert not allowed(a, Op.READ, "t", host="10.0.0.2")
    assert allowed(authz(topic_acl("t", host="*")), Op.READ, "t", host="::1")


def test_deny_wins_over_allow_wherever_it_comes_from():
    allow_literal = topic_acl("orders")
    assert not allowed(authz(allow_literal, topic_acl("ord", PREFIXED, perm=DENY)), Op.READ, "orders")
    assert not allowed(authz(allow_literal, topic_acl("*", principal="User:*", perm=DENY)), Op.READ, "orders")
    assert not allowed(authz(topic_acl("*"), topic_acl("orders", host=HOST, perm=DENY)), Op.READ, "orders")
    # a DENY for another host, principal or operation does not apply
    a = authz(allow_literal, topic_acl("orders", host="10.9.9.9", perm=DENY),
              topic_acl("orders", principal=BOB, perm=DENY), topic_acl("orders", op=Op.WRITE, perm=DENY))
    assert allowed(a, Op.READ, "orders")


@pytest.mark.parametrize(
    "acl_op, perm, requested, expected",
    [
        (Op.READ, ALLOW, Op.DESCRIBE, True),
        (Op.WRITE, ALLOW, Op.DESCRIBE, True),
        (Op.DELETE, ALLOW, Op.DESCRIBE, True),
        (Op.ALTER, ALLOW, Op.DESCRIBE, True),
        (Op.CREATE, ALLOW, Op.DESCRIBE, False),
        (Op.ALTER_CONFIGS, ALLOW, Op.DESCRIBE, False),
        (Op.ALTER_CONFIGS, ALLOW, Op.DESCRIBE_CONFIGS, True),
        (Op.READ, ALLOW, Op.DESCRIBE_CONFIGS, False),
        (Op.DESCRIBE, ALLOW, Op.READ, False),
        (Op.DESCRIBE_CONFIGS, ALLOW, Op.ALTER_CONFIGS, False),
        (Op.WRITE, ALLOW, Op.READ, False),
        (Op.ALL, ALLOW, Op.IDEMPOTENT_WRITE, True),
        (Op.ALL, ALLOW, Op.DESCRIBE, True),
    ],
)
def test_implied_operations(acl_op, perm, requested, expected):
    assert allowed(authz(topic_acl("t", op=acl_op, perm=perm)), requested, "t") is expected


def test_deny_implies_nothing_but_deny_all_denies_everything():
    # ALLOW ALL with DENY READ: READ denied, DESCRIBE (implied by READ for an allow) still allowed
    a = authz(topic_acl("t", op=Op.ALL), topic_acl("t", op=Op.READ, perm=DENY))
    assert not allowed(a, Op.READ, "t") and allowed(a, Op.DESCRIBE, "t") and allowed(a, Op.WRITE, "t")
    # DENY DESCRIBE does not deny READ
    b = authz(topic_acl("t", op=Op.READ), topic_acl("t", op=Op.DESCRIBE, perm=DENY))
    assert allowed(b, Op.READ, "t") and not allowed(b, Op.DESCRIBE, "t")
    # DENY ALTER_CONFIGS does not deny DESCRIBE_CONFIGS
    c = authz(topic_acl("t", op=Op.ALL), topic_acl("t", op=Op.ALTER_CONFIGS, perm=DENY))
    assert allowed(c, Op.DESCRIBE_CONFIGS, "t")
    d = authz(topic_acl("t", op=Op.ALL), topic_acl("t", op=Op.ALL, perm=DENY))
    assert not any(allowed(d, op, "t") for op in (Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.CLUSTER_ACTION))


def test_super_users_may_do_anything():
    a = authz(topic_acl("*", principal="User:*", op=Op.ALL, perm=DENY), super_users={"User:admin"})
    assert allowed(a, Op.ALL, "t", principal="User:admin")
    assert allowed(a, Op.CLUSTER_ACTION, "kafka-cluster", principal="User:admin", resource_type=CLUSTER)
    assert not allowed(a, Op.READ, "t", principal=ALICE)
    assert not allowed(a, Op.READ, "t", principal="User:Admin")  # compared as the exact string
    assert a.decide("User:admin", HOST, Op.READ, TOPIC, "t").rule == "SuperUser"


def test_super_users_config():
    assert parse_super_users("User:admin; User:broker;;") == {"User:admin", "User:broker"}
    assert parse_super_users("") == frozenset() == parse_super_users(None)
    with pytest.raises(ValueError):
        parse_super_users("User:admin;broker")


@pytest.mark.parametrize("allow_everyone", [False, True])
def test_no_acl_on_the_resource_takes_the_default(allow_everyone):
    a = authz(topic_acl("other"), allow_everyone=allow_everyone)
    assert allowed(a, Op.READ, "t") is allow_everyone
    assert allowed(a, Op.READ, "t", resource_type=GROUP) is allow_everyone
    assert allowed(authz(allow_everyone=allow_everyone), Op.WRITE, "t") is allow_everyone
    expected_rule = "DefaultAllow" if allow_everyone else "DefaultDeny"
    assert a.decide(ALICE, HOST, Op.READ, TOPIC, "t").rule == expected_rule


def test_any_acl_on_the_resource_turns_the_default_into_deny():
    # an ACL naming someone else, another operation or another host still "exists" for the resource
    for other in (topic_acl("t", principal=BOB), topic_acl("t", op=Op.WRITE), topic_acl("t", host="10.9.9.9"),
                  topic_acl("t", PREFIXED, principal=BOB), topic_acl("*", principal=BOB)):
        a = authz(other, allow_everyone=True)
        assert not allowed(a, Op.READ, "t"), other
        assert a.decide(ALICE, HOST, Op.READ, TOPIC, "t").rule == "DefaultDeny"


def test_decision_names_the_matching_acl():
    deny = topic_acl("t", op=Op.WRITE, perm=DENY)
    a = authz(topic_acl("t", op=Op.ALL), deny)
    decision = a.decide(ALICE, HOST, Op.WRITE, TOPIC, "t")
    assert decision.rule == "MatchingAcl" and decision.acl == deny and not decision.allowed


# --- authorize_any (authorizeByResourceType) ---------------------------------------------------------------------


def any_topic(a: Authorizer, op: AclOperation = Op.WRITE, principal: str = ALICE, host: str = HOST) -> bool:
    return a.authorize_any(principal, host, op, TOPIC)


def test_authorize_any_prefixed_allow_survives_a_literal_deny_of_the_same_name():
    a = authz(topic_acl("foo", PREFIXED, op=Op.WRITE), topic_acl("foo", LITERAL, op=Op.WRITE, perm=DENY))
    assert any_topic(a)  # "foo-1" is writable
    assert not allowed(a, Op.WRITE, "foo") and allowed(a, Op.WRITE, "foo-1")


def test_authorize_any_rules():
    w = Op.WRITE
    assert not any_topic(authz())
    assert any_topic(authz(topic_acl("t", op=w)))
    assert not any_topic(authz(topic_acl("t", op=w), topic_acl("t", op=w, perm=DENY)))
    assert not any_topic(authz(topic_acl("tx", op=w), topic_acl("t", PREFIXED, op=w, perm=DENY)))
    assert not any_topic(authz(topic_acl("foo", PREFIXED, op=w), topic_acl("fo", PREFIXED, op=w, perm=DENY)))
    assert any_topic(authz(topic_acl("fo", PREFIXED, op=w), topic_acl("foo", PREFIXED, op=w, perm=DENY)))
    assert not any_topic(authz(topic_acl("t", op=w), topic_acl("*", op=w, perm=DENY)))
    assert not any_topic(authz(topic_acl("*", op=w), topic_acl("*", op=Op.ALL, perm=DENY, principal="User:*")))
    assert any_topic(authz(topic_acl("*", op=w), topic_acl("t", op=w, perm=DENY)))
    assert any_topic(authz(topic_acl("t", op=Op.ALL)))
    assert any_topic(authz(topic_acl("t", op=w, principal="User:*")))
    assert not any_topic(authz(topic_acl("t", op=w, principal=BOB)))
    assert not any_topic(authz(topic_acl("t", op=w, host="10.9.9.9")))
    assert not any_topic(authz(topic_acl("t", op=Op.READ)))
    assert not any_topic(authz(acl(GROUP, "g", LITERAL, ALICE, "*", w, ALLOW)))
    # the scan ignores implied operations: READ on "t" does not count for DESCRIBE ...
    assert not any_topic(authz(topic_acl("t", op=Op.READ)), Op.DESCRIBE)
    # ... but the probe of the made-up name "hardcode" uses the full rules
    assert any_topic(authz(topic_acl("h", PREFIXED, op=Op.READ)), Op.DESCRIBE)
    assert any_topic(authz(super_users={ALICE}))


def test_authorize_any_probe_takes_the_no_acl_default():
    # allow.everyone.if.no.acl.found: nothing applies to "hardcode", so allowed despite a DENY elsewhere
    assert any_topic(authz(topic_acl("t", op=Op.WRITE, perm=DENY), allow_everyone=True))
    assert not any_topic(authz(topic_acl("t", op=Op.WRITE, perm=DENY), allow_everyone=False))


def test_authorize_any_refuses_filter_values():
    a = authz()
    with pytest.raises(ValueError):
        a.authorize_any(ALICE, HOST, Op.ANY, TOPIC)
    with pytest.raises(ValueError):
        a.authorize_any(ALICE, HOST, Op.WRITE, ResourceType.ANY)


# --- filter, snapshot swap ------------------------------------------------------------------------------------------


def test_filter_keeps_the_allowed_names_in_order():
    a = authz(topic_acl("a", PREFIXED, op=Op.DESCRIBE), topic_acl("ab", perm=DENY, op=Op.DESCRIBE))
    names = ["b", "a1", "ab", "a2", "a1"]
    assert a.filter(ALICE, HOST, Op.DESCRIBE, TOPIC, names) == ["a1", "a2", "a1"]
    assert a.filter(ALICE, HOST, Op.DESCRIBE, TOPIC, []) == []


def test_update_swaps_the_whole_snapshot():
    a = authz(topic_acl("t"))
    old = a.snapshot
    a.update([topic_acl("u")])
    assert not allowed(a, Op.READ, "t") and allowed(a, Op.READ, "u")
    assert old.bindings == (topic_acl("t"),) and len(a.snapshot) == 1
    assert old.decide(ALICE, HOST, Op.READ, TOPIC, "t").allowed  # a reader holding the old one is unaffected


def test_snapshot_refuses_patterns_that_cannot_be_stored():
    with pytest.raises(ValueError):
        AclSnapshot([topic_acl("t", PatternType.MATCH)])
    with pytest.raises(ValueError):
        AclSnapshot([topic_acl("t", perm=AclPermissionType.ANY)])


def test_snapshot_deduplicates_and_describes():
    from oncelog.security.acls import ANY_BINDING
    snap = AclSnapshot([topic_acl("t"), topic_acl("t"), topic_acl("u")])
    assert snap.acls(ANY_BINDING) == [topic_acl("t"), topic_acl("u")]


# --- audit log ------------------------------------------------------------------------------------------------------


def test_denial_is_logged_at_info_in_kafkas_words(caplog):
    deny = topic_acl("t", op=Op.WRITE, perm=DENY)
    a = authz(deny)
    with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER_NAME):
        assert not a.authorize(ALICE, "127.0.0.1", Op.WRITE, TOPIC, "t", request_name="Produce", ref_count=2)
        assert a.authorize("User:admin", "127.0.0.1", Op.WRITE, TOPIC, "t") is False  # no super users here
    records = [r for r in caplog.records if r.name == AUDIT_LOGGER_NAME]
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO]
    assert records[0].getMessage() == (
        "Principal = User:alice is Denied operation = WRITE from host = 127.0.0.1 on resource = Topic:LITERAL:t "
        "for request = Produce with resourceRefCount = 2 based on rule MatchingAcl(acl=StandardAcl["
        "resourceType=TOPIC, resourceName=t, patternType=LITERAL, principal=User:alice, host=*, operation=WRITE, "
        "permissionType=DENY])")
    assert records[1].getMessage().endswith("based on rule DefaultDeny")


def test_allow_is_logged_at_debug_and_unlogged_outcomes_at_trace(caplog):
    a = Authorizer({"User:admin"}, allow_everyone_if_no_acl_found=False)
    a.update([acl(ResourceType.TRANSACTIONAL_ID, "tx", LITERAL, ALICE, "*", Op.WRITE, ALLOW)])
    with caplog.at_level(logging.INFO, logger=AUDIT_LOGGER_NAME):
        assert a.authorize(ALICE, HOST, Op.WRITE, ResourceType.TRANSACTIONAL_ID, "tx")
    assert not caplog.records
    with caplog.at_level(logging.DEBUG, logger=AUDIT_LOGGER_NAME):
        assert a.authorize("User:admin", HOST, Op.ALTER, CLUSTER, "kafka-cluster", request_name="CreateAcls")
        assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "t", log_if_denied=False)
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert caplog.records[0].getMessage() == (
        "Principal = User:admin is Allowed operation = ALTER from host = 10.0.0.1 on resource = "
        "Cluster:LITERAL:kafka-cluster for request = CreateAcls with resourceRefCount = 1 based on rule SuperUser")
    caplog.clear()
    with caplog.at_level(TRACE, logger=AUDIT_LOGGER_NAME):
        assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "t", log_if_denied=False)
        assert a.authorize(ALICE, HOST, Op.DESCRIBE, ResourceType.TRANSACTIONAL_ID, "tx", log_if_allowed=False)
    assert [r.levelno for r in caplog.records] == [TRACE, TRACE]
    assert "resource = TransactionalId:LITERAL:tx" in caplog.records[1].getMessage()


def test_no_line_is_formatted_when_the_logger_is_off(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("formatted an audit line nobody logs")

    monkeypatch.setattr(authorizer_module, "audit_line", boom)
    logger = logging.getLogger(AUDIT_LOGGER_NAME)
    saved = logger.level
    logger.setLevel(logging.WARNING)
    try:
        a = authz(topic_acl("t", perm=DENY), topic_acl("u"))
        assert not a.authorize(ALICE, HOST, Op.READ, TOPIC, "t")
        assert a.authorize(ALICE, HOST, Op.READ, TOPIC, "u")
    finally:
        logger.setLevel(saved)


# --- the snapshot against a plain reading of Kafka's rules -------------------------------------------------------


def reference(bindings, super_users, allow_everyone, principal, host, op, rtype, name) -> bool:
    """StandardAuthorizerData's rules as a scan over every binding: no index, no cleverness."""
    if principal in super_users:
        return True
    found = allow = False
    for b in set(bindings):
        p, e = b.pattern, b.entry
        if p.resource_type != rtype:
            continue
        if p.pattern_type == LITERAL:
            applies = p.name == name or p.name == "*"
        else:
            applies = name.startswith(p.name)
        if not applies:
            continue
        found = True
        if e.principal not in (principal, "User:*") or e.host not in (host, "*"):
            continue
        if e.operation == Op.ALL:
            match = True
        elif e.permission == ALLOW and op == Op.DESCRIBE:
            match = e.operation in (Op.DESCRIBE, Op.READ, Op.WRITE, Op.DELETE, Op.ALTER)
        elif e.permission == ALLOW and op == Op.DESCRIBE_CONFIGS:
            match = e.operation in (Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS)
        else:
            match = e.operation == op
        if match:
            if e.permission == DENY:
                return False
            allow = True
    return allow or (not found and allow_everyone)


NAMES = st.text(alphabet="abc*", min_size=1, max_size=5)
OPS = st.sampled_from([Op.ALL, Op.READ, Op.WRITE, Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS])
PRINCIPALS = st.sampled_from([ALICE, BOB, "User:*"])
BINDINGS = st.builds(
    acl, st.sampled_from([TOPIC, GROUP]), NAMES, st.sampled_from([LITERAL, PREFIXED]), PRINCIPALS,
    st.sampled_from(["*", HOST, "10.0.0.2"]), OPS, st.sampled_from([ALLOW, DENY]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(BINDINGS, max_size=16), st.booleans(), PRINCIPALS, st.sampled_from([HOST, "10.0.0.2"]), OPS,
       st.sampled_from([TOPIC, GROUP]), NAMES)
def test_snapshot_agrees_with_a_scan_of_every_acl(bindings, allow_everyone, principal, host, op, rtype, name):
    a = authz(*bindings, allow_everyone=allow_everyone)
    assert a.authorize(principal, host, op, rtype, name) == reference(
        bindings, set(), allow_everyone, principal, host, op, rtype, name)


def test_ten_thousand_acls():
    rng = random.Random(20240601)
    words = ["orders", "payments", "audit", "clicks", "users", "events", "logs", "metrics"]
    principals = [f"User:app{i}" for i in range(50)] + ["User:*"]
    bindings = []
    for i in range(10_000):
        name = f"{rng.choice(words)}.{rng.choice(words)}-{rng.randrange(400)}"
        pattern = PREFIXED if i % 4 == 0 else LITERAL
        if pattern == PREFIXED:
            name = name[: rng.randrange(1, len(name) + 1)]
        bindings.append(acl(TOPIC, name, pattern, rng.choice(principals), rng.choice(["*", HOST]),
                            rng.choice([Op.READ, Op.WRITE, Op.DESCRIBE, Op.ALL]), DENY if i % 10 == 0 else ALLOW))
    a = authz(*bindings, super_users={"User:admin"})
    assert len(a.snapshot) == len(set(bindings))
    queries = [
        (rng.choice(principals[:-1]), rng.choice([HOST, "10.0.0.9"]), rng.choice([Op.READ, Op.WRITE, Op.DESCRIBE]),
         f"{rng.choice(words)}.{rng.choice(words)}-{rng.randrange(400)}")
        for _ in range(300)
    ]
    results = [a.authorize(p, h, op, TOPIC, n) for p, h, op, n in queries]
    assert results == [reference(bindings, set(), False, p, h, op, TOPIC, n) for p, h, op, n in queries]
    assert any(results) and not all(results)
    assert a.authorize("User:admin", HOST, Op.ALTER, TOPIC, "x")
