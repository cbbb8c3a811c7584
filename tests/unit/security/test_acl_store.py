"""LocalAclStore: persistence, atomic replacement, Kafka's per-binding / per-filter results, the listener."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from oncelog.errors import ErrorCode
from oncelog.security import acl_store as acl_store_module
from oncelog.security.acl_store import (
    CREATED,
    AclStore,
    AclStoreError,
    LocalAclStore,
    decode_bindings,
    encode_bindings,
)
from oncelog.security.acls import (
    ANY_BINDING,
    ANY_ENTRY,
    AccessControlEntryFilter,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePatternFilter,
    ResourceType,
    acl,
)

TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
READ, WRITE = AclOperation.READ, AclOperation.WRITE

A = acl(TOPIC, "orders", LITERAL, "User:alice", "*", READ, ALLOW)
B = acl(TOPIC, "ord", PREFIXED, "User:bob", "10.0.0.1", WRITE, DENY)
C = acl(GROUP, "g", LITERAL, "User:*", "*", READ, ALLOW)
D = acl(TOPIC, "*", LITERAL, "User:carol", "*", AclOperation.DESCRIBE, ALLOW)


def pattern_filter(rtype, name, ptype) -> AclBindingFilter:
    return AclBindingFilter(ResourcePatternFilter(rtype, name, ptype), ANY_ENTRY)


@pytest.fixture
def path(tmp_path):
    return tmp_path / "__oncelog_meta" / "acls.json"


def test_satisfies_the_protocol(path):
    assert isinstance(LocalAclStore(path), AclStore)


def test_no_file_is_no_acls(path):
    assert LocalAclStore(path).load() == []
    assert LocalAclStore(path).describe(ANY_BINDING) == []


def test_created_acls_survive_a_new_store(path):
    store = LocalAclStore(path)
    assert store.create([A, B, C]) == [CREATED] * 3
    assert LocalAclStore(path).load() == [A, B, C]
    assert os.listdir(path.parent) == ["acls.json"]  # no temp file left behind
    doc = json.loads(path.read_text())
    assert doc["version"] == 1
    assert doc["acls"][1] == {"resourceType": "TOPIC", "resourceName": "ord", "patternType": "PREFIXED",
                              "principal": "User:bob", "host": "10.0.0.1", "operation": "WRITE",
                              "permissionType": "DENY"}


def test_every_write_is_fsynced_and_renamed(path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    store = LocalAclStore(path)
    store.create([A])
    assert calls == ["fsync"] * 2 + ["replace", "fsync"]  # the new __oncelog_meta's parent, then as below
    calls.clear()
    store.create([B])
    assert calls == ["fsync", "replace", "fsync"]  # the temp file, the rename, the directory


def test_creating_an_existing_acl_succeeds_and_changes_nothing(path):
    seen = []
    store = LocalAclStore(path, seen.append)
    store.create([A])
    mtime = path.stat().st_mtime_ns
    assert store.create([A, A]) == [CREATED, CREATED]
    assert store.load() == [A]
    assert path.stat().st_mtime_ns == mtime
    assert seen == [[A]]  # one change, one call


def test_invalid_bindings_are_refused_one_by_one(path):
    store = LocalAclStore(path)
    bad_cluster = acl(ResourceType.CLUSTER, "c", LITERAL, "User:a", "*", AclOperation.ALTER, ALLOW)
    odd_op = acl(TOPIC, "t", LITERAL, "User:a", "*", AclOperation.CLUSTER_ACTION, ALLOW)
    results = store.create([bad_cluster, A, acl(TOPIC, "t", LITERAL, "alice", "*", READ, ALLOW), odd_op])
    assert [r.error_code for r in results] == [ErrorCode.INVALID_REQUEST, ErrorCode.NONE,
                                               ErrorCode.INVALID_REQUEST, ErrorCode.NONE]
    assert results[0].error_message == "The only valid name for the CLUSTER resource is kafka-cluster"
    assert store.load() == [A, odd_op]  # a broker stores an operation the resource type never asks for


def test_check_operations_adds_the_tool_check(path):
    store = LocalAclStore(path, check_operations=True)
    odd_op = acl(TOPIC, "t", LITERAL, "User:a", "*", AclOperation.CLUSTER_ACTION, ALLOW)
    (result,) = store.create([odd_op])
    assert result.error_code == ErrorCode.INVALID_REQUEST
    assert result.error_message.startswith("ResourceType TOPIC only supports operations ALL, READ")
    assert store.load() == []


def test_describe_filters(path):
    store = LocalAclStore(path)
    store.create([A, B, C, D])
    assert store.describe(ANY_BINDING) == [A, B, C, D]
    assert store.describe(pattern_filter(TOPIC, "orders", PatternType.MATCH)) == [A, B, D]
    assert store.describe(pattern_filter(TOPIC, "orders", LITERAL)) == [A]
    assert store.describe(pattern_filter(TOPIC, None, PREFIXED)) == [B]
    assert store.describe(pattern_filter(ResourceType.ANY, None, PatternType.ANY)) == [A, B, C, D]
    by_principal = AclBindingFilter(ResourcePatternFilter(ResourceType.ANY, None, PatternType.ANY),
                                    AccessControlEntryFilter("User:*", None, AclOperation.ANY, AclPermissionType.ANY))
    assert store.describe(by_principal) == [C]


def test_delete_reports_what_each_filter_matched(path):
    seen = []
    store = LocalAclStore(path)
    store.create([A, B, C, D])
    store.set_listener(seen.append)
    bad = AclBindingFilter(ResourcePatternFilter(ResourceType.UNKNOWN, None, PatternType.ANY), ANY_ENTRY)
    results = store.delete([
        pattern_filter(TOPIC, "orders", PatternType.MATCH),
        bad,
        pattern_filter(TOPIC, "ord", PREFIXED),  # B again: every filter sees the ACLs as they were
        pattern_filter(GROUP, "nope", LITERAL),
    ])
    assert [r.deleted for r in results] == [(A, B, D), (), (B,), ()]
    assert (results[1].error_code, results[1].error_message) == (ErrorCode.INVALID_REQUEST, "Unknown patternFilter.")
    assert all(r.error_code == ErrorCode.NONE for i, r in enumerate(results) if i != 1)
    assert store.load() == [C] == LocalAclStore(path).load()
    assert seen == [[C]]
    assert store.delete([pattern_filter(TOPIC, None, PatternType.ANY)]) == [acl_store_module.AclDeleteResult()]
    assert seen == [[C]]  # nothing deleted, nothing to tell


def test_listener_gets_the_full_list_after_every_change(path):
    seen = []
    store = LocalAclStore(path, seen.append)
    store.create([A])
    store.create([B, C])
    store.delete([B.to_filter()])
    assert seen == [[A], [A, B, C], [A, C]]


def test_a_leftover_temp_file_is_ignored(path):
    store = LocalAclStore(path)
    store.create([A])
    tmp = path.parent / "acls.json.tmp"
    tmp.write_bytes(b'{"version": 1, "acls": [')  # a write cut short by a crash
    assert LocalAclStore(path).load() == [A]
    tmp.write_bytes(encode_bindings([A, B]))  # written whole, never renamed: not the ACLs either
    assert LocalAclStore(path).load() == [A]
    store2 = LocalAclStore(path)
    store2.create([C])
    assert LocalAclStore(path).load() == [A, C]


def test_a_failed_write_changes_nothing(path, monkeypatch):
    seen = []
    store = LocalAclStore(path, seen.append)
    store.create([A])

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    (ok, failed) = store.create([A, B])
    assert ok == CREATED  # already stored
    assert failed.error_code == ErrorCode.UNKNOWN_SERVER_ERROR and "No space left" in failed.error_message
    (result,) = store.delete([A.to_filter()])
    assert result.error_code == ErrorCode.UNKNOWN_SERVER_ERROR and result.deleted == ()
    assert store.describe(ANY_BINDING) == [A]
    monkeypatch.undo()
    assert LocalAclStore(path).load() == [A]
    assert seen == [[A]]


def test_an_unreadable_file_is_an_error_not_an_empty_list(path):
    path.parent.mkdir(parents=True)
    for content, why in [
        (b"{", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b'{"version": 2, "acls": []}', "not a version 1"),
        (b'{"version": 1, "acls": [{"resourceType": "TOPIC"}]}', "entry 0: malformed"),
        (b'{"version": 1, "acls": [{"resourceType": "TOPIK", "resourceName": "t", "patternType": "LITERAL", '
         b'"principal": "User:a", "host": "*", "operation": "READ", "permissionType": "ALLOW"}]}', "malformed"),
        (b'{"version": 1, "acls": [{"resourceType": "TOPIC", "resourceName": "t", "patternType": "MATCH", '
         b'"principal": "User:a", "host": "*", "operation": "READ", "permissionType": "ALLOW"}]}',
         "Invalid patternType MATCH"),
    ]:
        path.write_bytes(content)
        with pytest.raises(AclStoreError, match=why):
            LocalAclStore(path).load()
        with pytest.raises(AclStoreError):
            LocalAclStore(path).create([A])


def test_encoding_round_trips():
    bindings = [A, B, C, D, acl(ResourceType.TRANSACTIONAL_ID, "tx-é", PREFIXED, "User:CN=x:y", "::1",
                                AclOperation.ALL, DENY)]
    assert decode_bindings(encode_bindings(bindings), "test") == bindings


CHILD = textwrap.dedent("""
    import sys
    from oncelog.security.acl_store import LocalAclStore
    from oncelog.security.acls import acl, AclOperation, AclPermissionType, PatternType, ResourceType
    store = LocalAclStore(sys.argv[1])
    i = 0
    while True:
        store.create([acl(ResourceType.TOPIC, f"t{i}", PatternType.LITERAL, "User:a", "*",
                          AclOperation.READ, AclPermissionType.ALLOW)])
        print(i, flush=True)
        i += 1
""")


def test_acls_survive_sigkill_mid_stream(path):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        last = -1
        while last < 30:
            line = proc.stdout.readline()
            assert line, "the writer died"
            last = int(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    names = [b.pattern.name for b in LocalAclStore(path).load()]
    # whole, in order, and at least everything acknowledged before the kill
    assert names == [f"t{i}" for i in range(len(names))]
    assert len(names) >= last + 1
