"""The ZooKeeper stores of ACLs, SCRAM credentials and client quotas (cluster/store/acls.py, credentials.py,
quotas.py) against a real ZooKeeper, several MetadataStores in one loop standing for several brokers: writes that
race on one znode both land (compare-and-set, retried), Kafka's layout and values on disk, znodes written the way
Kafka's tools wrote them read by a running broker, old notifications purged, a broker cut off while changes (and
purges) happen catches up when it is back, and the offline credential tool."""

from __future__ import annotations

import asyncio
import json
import time

from oncelog.cluster.metadata_image import MetadataImage
from oncelog.cluster.metadata_store import MetadataStore
from oncelog.cluster.store import znodes
from oncelog.security.acls import (
    ANY_BINDING,
    AccessControlEntryFilter,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePatternFilter,
    ResourceType,
    acl,
)
from oncelog.security.credentials import from_password
from oncelog.security.quotas import QuotaEntity
from tests.cluster.metadata_nodes import START_TIMEOUT_S, run, until
from tests.cluster.tcp_proxy import TcpProxy

SESSION_MS = 6000
TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
READ, WRITE = AclOperation.READ, AclOperation.WRITE


async def _broker(connect: str) -> MetadataStore:
    store = MetadataStore(connect, SESSION_MS, asyncio.get_running_loop(), MetadataImage())
    await store.start(START_TIMEOUT_S)
    await store.start_security(acls=True)
    return store


def _binding(name: str, user: str, operation: AclOperation = READ, pattern: PatternType = LITERAL,
             permission: AclPermissionType = ALLOW, resource: ResourceType = TOPIC):
    return acl(resource, name, pattern, f"User:{user}", "*", operation, permission)


def _chroot(connect: str) -> str:
    return "/" + connect.split("/", 1)[1]


def test_racing_writers_both_land_in_kafkas_layout(coordination_connect, kazoo_client):
    zk = kazoo_client(coordination_connect.split("/")[0])
    root = _chroot(coordination_connect)

    async def body():
        a, b = await _broker(coordination_connect), await _broker(coordination_connect)
        seen: list[list] = []
        assert a.security is not None and b.security is not None and a.security.acls and b.security.acls
        a.security.acls.set_listener(seen.append)
        try:
            ours = [_binding("orders", f"user{i}") for i in range(10)]
            theirs = [_binding("orders", f"other{i}", WRITE) for i in range(10)]
            # twenty writes to the one znode from two brokers at once: each loses races and reads again
            results = await asyncio.gather(*(a.security.acls.create([x]) for x in ours),
                                           *(b.security.acls.create([x]) for x in theirs))
            assert all(r[0].error_code == 0 for r in results)
            everything = set(ours) | set(theirs)
            await until(lambda: set(a.security.acls.load()) == everything == set(b.security.acls.load()),
                        "both brokers to hold all twenty")
            assert set(seen[-1]) == everything

            prefixed = _binding("app-", "alice", pattern=PREFIXED, resource=GROUP, permission=DENY)
            assert (await b.security.acls.create([prefixed, _binding("", "x")]))[1].error_code == 42
            assert (await b.security.acls.create([_binding("a/b", "x", resource=GROUP)]))[0].error_code == 42
            await until(lambda: prefixed in a.security.acls.load(), "the prefixed ACL on a")

            # a DeleteAcls through b: every filter sees what was there before the call
            by_user0 = AclBindingFilter(ResourcePatternFilter(TOPIC, "orders", LITERAL),
                                        AccessControlEntryFilter("User:user0", None, AclOperation.ANY,
                                                                 AclPermissionType.ANY))
            writes = AclBindingFilter(ResourcePatternFilter(ResourceType.ANY, None, PatternType.ANY),
                                      AccessControlEntryFilter(None, None, WRITE, AclPermissionType.ANY))
            deleted = await b.security.acls.delete([by_user0, writes])
            assert [len(r.deleted) for r in deleted] == [1, 10]
            left = (set(ours) - {ours[0]}) | {prefixed}
            await until(lambda: set(a.security.acls.load()) == left, "the deletions on a")
            assert a.security.acls.describe(ANY_BINDING) == b.security.acls.describe(ANY_BINDING)
        finally:
            await a.close()
            await b.close()

    run(body())
    # on disk: Kafka's ZooKeeper-era znodes and notifications
    value = json.loads(zk.get(f"{root}/kafka-acl/Topic/orders")[0])
    assert value["version"] == 1 and len(value["acls"]) == 9
    assert {"principal": "User:user1", "permissionType": "Allow", "operation": "Read", "host": "*"} in value["acls"]
    value = json.loads(zk.get(f"{root}/kafka-acl-extended/prefixed/Group/app-")[0])
    assert value["acls"] == [{"principal": "User:alice", "permissionType": "Deny", "operation": "Read", "host": "*"}]
    changes = sorted(zk.get_children(f"{root}/kafka-acl-changes"))
    assert changes and all(c.startswith("acl_changes_") for c in changes)
    assert zk.get(f"{root}/kafka-acl-changes/{changes[-1]}")[0] == b"TOPIC:orders"
    (extended,) = zk.get_children(f"{root}/kafka-acl-extended-changes")
    assert json.loads(zk.get(f"{root}/kafka-acl-extended-changes/{extended}")[0]) == {
        "version": 1, "resourceType": "GROUP", "name": "app-", "patternType": "PREFIXED"}


def test_what_kafkas_tools_wrote_reaches_a_running_broker(coordination_connect, kazoo_client):
    zk = kazoo_client(coordination_connect.split("/")[0])
    root = _chroot(coordination_connect)
    credential = from_password("SCRAM-SHA-256", "secret")

    async def body():
        a = await _broker(coordination_connect)
        assert a.security is not None and a.security.acls is not None
        quotas_seen: list = []
        a.security.quotas.set_listener(quotas_seen.append)
        try:
            # as AclAuthorizer and kafka-configs --zookeeper wrote them: the znode, then its notification
            zk.create(f"{root}/kafka-acl/TransactionalId/tx-1", b'{"version":1,"acls":[{"principal":"User:bob",'
                      b'"permissionType":"Allow","operation":"Write","host":"*"}]}')
            zk.create(f"{root}/kafka-acl-changes/acl_changes_", b"TransactionalId:tx-1", sequence=True)
            expected = acl(ResourceType.TRANSACTIONAL_ID, "tx-1", LITERAL, "User:bob", "*", WRITE, ALLOW)
            await until(lambda: expected in a.security.acls.load(), "the ACL Kafka's authorizer wrote")

            zk.create(f"{root}/config/users/app%20user",
                      json.dumps({"version": 1, "config": {"SCRAM-SHA-256": znodes.scram_text(credential),
                                                           "producer_byte_rate": "2048"}}).encode())
            zk.create(f"{root}/config/users/<default>/clients/<default>",
                      b'{"version":1,"config":{"consumer_byte_rate":"4096"}}', makepath=True)
            for path in ("users/app%20user", "users/<default>/clients/<default>"):
                zk.create(f"{root}/config/changes/config_change_", json.dumps(
                    {"version": 2, "entity_path": path}).encode(), sequence=True)
            await until(lambda: a.security.credentials.get("app user", "SCRAM-SHA-256") == credential,
                        "the credential kafka-configs wrote")
            both_default = QuotaEntity.of({"user": None, "client-id": None})
            await until(lambda: a.security.quotas.load() == {QuotaEntity.of({"user": "app user"}):
                                                             {"producer_byte_rate": 2048.0},
                                                             both_default: {"consumer_byte_rate": 4096.0}},
                        "the quotas kafka-configs wrote")
            assert quotas_seen and quotas_seen[-1] == a.security.quotas.load()

            # and what this broker writes reads as Kafka's: a user's config keeps the keys it does not own
            await a.security.quotas.alter([(QuotaEntity.of({"user": "app user"}), "producer_byte_rate", None)])
            value = json.loads(zk.get(f"{root}/config/users/app%20user")[0])
            assert value == {"version": 1, "config": {"SCRAM-SHA-256": znodes.scram_text(credential)}}
            await a.security.credentials.alter([], [("app user", "SCRAM-SHA-256")])
            assert json.loads(zk.get(f"{root}/config/users/app%20user")[0]) == {"version": 1, "config": {}}
            assert a.security.credentials.get("app user", "SCRAM-SHA-256") is None
        finally:
            await a.close()

    run(body())


def test_old_notifications_are_purged_and_a_broker_cut_off_catches_up(coordination, coordination_connect,
                                                                       kazoo_client):
    chroot = _chroot(coordination_connect)
    zk = kazoo_client(coordination.servers)

    async def body():
        proxy = await TcpProxy("127.0.0.1", coordination.port).start()
        behind = await _broker(proxy.address + chroot)
        direct = await _broker(coordination_connect)
        assert behind.security and direct.security and behind.security.acls and direct.security.acls
        try:
            await direct.security.acls.create([_binding("t", "first")])
            await until(lambda: len(behind.security.acls.load()) == 1, "behind sees the first ACL")

            session = behind.client_id()
            proxy.cut()
            await until(lambda: behind.state == "SUSPENDED", "behind notices the lost connection")
            for changes in direct.security.acls._changes:    # every notification counts as expired now
                changes.expiration_ms = 0
            await direct.security.acls.create([_binding("t", "second"), _binding("u", "third")])
            await direct.security.acls.delete([_binding("t", "first").to_filter()])
            await direct.security.credentials.alter([("carol", from_password("SCRAM-SHA-512", "c"))], [])
            await until(lambda: len(zk.get_children(f"{chroot}/kafka-acl-changes")) <= 2,
                        "old notifications purged")
            kazoo_client(coordination.servers, client_id=session).stop()   # and its session expired

            proxy.mend()
            await until(lambda: behind.state == "CONNECTED", "behind back, with a new session")
            await until(lambda: set(behind.security.acls.load()) == set(direct.security.acls.load()) ==
                        {_binding("t", "second"), _binding("u", "third")}, "behind caught up by a full read")
            assert behind.security.credentials.get("carol", "SCRAM-SHA-512") is not None
            # and it follows notifications again
            await direct.security.acls.create([_binding("v", "fourth")])
            await until(lambda: _binding("v", "fourth") in behind.security.acls.load(), "a notice after the resync")
        finally:
            await behind.close()
            await direct.close()
            await proxy.close()

    run(body())


def test_the_offline_credential_reaches_running_and_later_brokers(coordination_connect):
    from oncelog.cluster.store.credentials import put_credential

    credential = from_password("SCRAM-SHA-512", "broker-secret", 8192)

    async def body():
        running = await _broker(coordination_connect)
        try:
            started = time.monotonic()
            await asyncio.to_thread(put_credential, coordination_connect, "broker", credential)
            await until(lambda: running.security.credentials.get("broker", "SCRAM-SHA-512") == credential,
                        "the running broker to take it")
            assert time.monotonic() - started < 10
            later = await _broker(coordination_connect)
            try:
                assert later.security.credentials.describe() == {"broker": [credential]}
            finally:
                await later.close()
        finally:
            await running.close()

    run(body())
