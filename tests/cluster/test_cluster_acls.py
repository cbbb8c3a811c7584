"""ACLs, SCRAM credentials and client quotas kept in ZooKeeper and shared by every broker of a 3-broker cluster
(docs/security.md §6 and §8 step 6).

Each broker has three listeners: HARNESS (PLAINTEXT, the test harness's Metadata calls: no topic of its own is
described there), CLIENT (SASL_PLAINTEXT with PLAIN for admin, alice and bob, and SCRAM-SHA-256 for users created
over the wire) and BROKER (SASL_PLAINTEXT SCRAM-SHA-512: inter.broker.listener.name, the brokers' own user
`broker`, whose credential is written into ZooKeeper with `oncelog coordination scram-credential` before any broker
starts, as Kafka's brokers need theirs created with kafka-configs --zookeeper first). ACLs are on
(StandardAuthorizer semantics); admin and broker are super users.

Checked: an ACL created through broker 1 is enforced by brokers 2 and 3 within a watch round trip, and its
deletion too; a SCRAM user created through broker 2 logs in on broker 3; a quota set through broker 3 throttles
on broker 1; all of it holds on the first request after every broker restarted; a client posing as a follower
(Fetch with replica_id >= 0) or as a transaction coordinator (WriteTxnMarkers) on CLIENT gets no records /
CLUSTER_AUTHORIZATION_FAILED and changes nothing; an admin request a broker forwards to the controller is decided
as its sender's, not as the forwarding broker's. Changes are polled for with a timeout, never slept on.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterUserScramCredentialsRequest,
    CreateAclsRequest,
    CreateTopicsRequest,
    DeleteAclsRequest,
    DeleteTopicsRequest,
    DescribeAclsRequest,
    DescribeClientQuotasRequest,
    DescribeProducersRequest,
    DescribeUserScramCredentialsRequest,
)
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest, WriteTxnMarkersRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest
from scramp import ScramClient

from oncelog.records.builder import build_batch
from tests.cluster.cluster_processes import wait_for
from tests.integration.helpers import fetch_raw
from tests.support.wire import Wire, sasl_plain_wire

# Out of make test's time budget (make cluster-test runs it); its short sibling stays in make test.
pytestmark = pytest.mark.cluster_slow

NONE, UNKNOWN_TOPIC_OR_PARTITION = 0, 3
TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED, SASL_AUTHENTICATION_FAILED = 29, 31, 58
# Kafka's wire codes: resource TOPIC 2, CLUSTER 4; pattern LITERAL 3; operation READ 3, DESCRIBE 8; ALLOW 3
TOPIC, LITERAL, ALLOW = 2, 3, 3
READ, DESCRIBE = 3, 8
PROPAGATE_S = 15.0          # a watch round trip, with room for a loaded machine

PLAIN_USERS = " ".join(f'user_{u}="{u}-secret"' for u in ("admin", "alice", "bob"))
SETTINGS = {
    "listeners": "HARNESS://127.0.0.1:0,CLIENT://127.0.0.1:0,BROKER://127.0.0.1:0",
    "listener.security.protocol.map": "HARNESS:PLAINTEXT,CLIENT:SASL_PLAINTEXT,BROKER:SASL_PLAINTEXT",
    "inter.broker.listener.name": "BROKER",
    "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
    "listener.name.client.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
    "listener.name.client.plain.sasl.jaas.config":
        f"org.apache.kafka.common.security.plain.PlainLoginModule required {PLAIN_USERS};",
    "listener.name.broker.sasl.enabled.mechanisms": "SCRAM-SHA-512",
    "listener.name.broker.scram-sha-512.sasl.jaas.config":
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" '
        'password="broker-secret";',
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:admin;User:broker",
}


@pytest.fixture
def cluster(cluster_factory, coordination_connect, tmp_path):
    """A started cluster of 3 secured brokers, the broker user's credential in ZooKeeper before they start."""
    password_file = tmp_path / "broker-password"
    password_file.write_text("broker-secret\n")
    done = subprocess.run([sys.executable, "-m", "oncelog", "coordination", "scram-credential", "--connect",
                           coordination_connect, "--user", "broker", "--mechanism", "SCRAM-SHA-512",
                           "--password-file", str(password_file)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr
    assert "SCRAM-SHA-512 credential of broker stored" in done.stdout
    return cluster_factory(3, **SETTINGS)


def client_address(c: Any, node: int) -> str:
    return c.brokers[node].listener("CLIENT")


def wire(c: Any, node: int, user: str, client_id: str = "wire-test") -> Wire:
    w = sasl_plain_wire(client_address(c, node), user, f"{user}-secret")
    w.client_id = client_id
    return w


def admin_client(c: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": ",".join(client_address(c, n) for n in c.brokers),
                        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                        "sasl.username": "admin", "sasl.password": "admin-secret"})


def create_topic(c: Any, name: str, assignment: list[list[int]]) -> None:
    admin = admin_client(c)
    admin.create_topics([NewTopic(name, num_partitions=len(assignment), replica_assignment=assignment)], operation_timeout=30)[name].result(60)
    wait_for(lambda: all(leader_of(c, name, p, via=n) == replicas[0] for n in c.brokers
                         for p, replicas in enumerate(assignment)), f"{name} led everywhere", 60)


def topic_metadata(c: Any, node: int, user: str, topic: str) -> tuple[int, dict[int, Any]]:
    """(error code, {partition: entry}) of `topic` as broker `node` answers `user` over CLIENT."""
    with wire(c, node, user) as w:
        answer = w.request(MetadataRequest[9](topics=[(topic, [])], allow_auto_topic_creation=False,
                                              include_topic_authorized_operations=False), 9)
    (entry,) = answer.topics
    return entry.error_code, {p.partition_index: p for p in entry.partitions}


def leader_of(c: Any, topic: str, partition: int, via: int = 1) -> int:
    code, parts = topic_metadata(c, via, "admin", topic)
    return parts[partition].leader_id if code == NONE and partition in parts else -1


def fetch_code(c: Any, node: int, user: str, topic: str, partition: int) -> int:
    with wire(c, node, user) as w:
        return fetch_raw(w, topic, partition, 0).error_code


def create_acl(c: Any, node: int, user: str, topic: str, operation: int) -> None:
    """CreateAcls through broker `node` as admin: ALLOW `operation` on the LITERAL topic for User:`user`."""
    creation = CreateAclsRequest[1].AclCreation
    with wire(c, node, "admin") as w:
        answer = w.request(CreateAclsRequest[1](creations=[creation(
            resource_type=TOPIC, resource_name=topic, resource_pattern_type=LITERAL, principal=f"User:{user}",
            host="*", operation=operation, permission_type=ALLOW)]), 1)
    assert [r.error_code for r in answer.results] == [NONE], answer


def delete_acl(c: Any, node: int, user: str, topic: str, operation: int) -> int:
    """DeleteAcls of exactly that binding through broker `node`: how many bindings it deleted."""
    f = DeleteAclsRequest[1].DeleteAclsFilter
    with wire(c, node, "admin") as w:
        answer = w.request(DeleteAclsRequest[1](filters=[f(
            resource_type_filter=TOPIC, resource_name_filter=topic, pattern_type_filter=LITERAL,
            principal_filter=f"User:{user}", host_filter="*", operation=operation, permission_type=ALLOW)]), 1)
    (result,) = answer.filter_results
    assert result.error_code == NONE, answer
    return len(result.matching_acls)


def described_acls(c: Any, node: int, topic: str) -> list[tuple[str, int]]:
    """DescribeAcls of the LITERAL topic through broker `node`: (principal, operation) pairs."""
    with wire(c, node, "admin") as w:
        answer = w.request(DescribeAclsRequest[1](resource_type_filter=TOPIC, resource_name_filter=topic,
                                                  pattern_type_filter=LITERAL, principal_filter=None,
                                                  host_filter=None, operation=1, permission_type=1), 1)
    assert answer.error_code == NONE, answer
    return sorted((acl.principal, acl.operation) for resource in answer.resources for acl in resource.acls)


def scram_login(c: Any, node: int, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> int:
    """A SCRAM exchange with broker `node`'s CLIENT listener: the error code of its last SaslAuthenticate."""
    with Wire(client_address(c, node)) as w:
        assert w.request(SaslHandshakeRequest[1](mechanism=mechanism), 1).error_code == NONE
        scram = ScramClient([mechanism], user, password)
        first = w.request(SaslAuthenticateRequest[2](auth_bytes=scram.get_client_first().encode()), 2)
        if first.error_code:
            return first.error_code
        scram.set_server_first(bytes(first.auth_bytes).decode())
        final = w.request(SaslAuthenticateRequest[2](auth_bytes=scram.get_client_final().encode()), 2)
        if final.error_code:
            return final.error_code
        scram.set_server_final(bytes(final.auth_bytes).decode())   # the broker proved it holds the credential
        return NONE


def upsert_scram(c: Any, node: int, user: str, password: str, iterations: int = 4096) -> None:
    """AlterUserScramCredentials through broker `node` as admin (the client salts, as KIP-554 has it)."""
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    alter = AlterUserScramCredentialsRequest[0]
    with wire(c, node, "admin") as w:
        answer = w.request(alter(deletions=[], upsertions=[alter.ScramCredentialUpsertion(
            name=user, mechanism=1, iterations=iterations, salt=salt, salted_password=salted)]), 0)
    assert [(r.user, r.error_code) for r in answer.results] == [(user, NONE)], answer


def scram_users(c: Any, node: int) -> list[str]:
    describe = DescribeUserScramCredentialsRequest[0]
    with wire(c, node, "admin") as w:
        answer = w.request(describe(users=None), 0)
    return sorted(r.user for r in answer.results if r.error_code == NONE)


def set_quota(c: Any, node: int, client_id: str, rate: float | None) -> None:
    cls = AlterClientQuotasRequest[1]
    entry = cls.EntryData
    with wire(c, node, "admin") as w:
        answer = w.request(cls(entries=[entry(
            entity=[entry.EntityData(entity_type="client-id", entity_name=client_id)],
            ops=[entry.OpData(key="producer_byte_rate", value=rate or 0.0, remove=rate is None)])],
            validate_only=False), 1)
    assert [e.error_code for e in answer.entries] == [NONE], answer


def quotas_of(c: Any, node: int, client_id: str) -> dict[str, float]:
    cls = DescribeClientQuotasRequest[1]
    with wire(c, node, "admin") as w:
        answer = w.request(cls(components=[cls.ComponentData(entity_type="client-id", match_type=0, match=client_id)],
                               strict=False), 1)
    assert answer.error_code == NONE, answer
    return {v.key: v.value for entry in answer.entries for v in entry.values}


def produce_throttle_ms(c: Any, node: int, client_id: str, topic: str, size: int = 200_000) -> int:
    """One Produce of `size` bytes to partition 0 (led by `node`) as admin with `client_id`: its throttle time."""
    batch = build_batch([(None, b"q" * size, (), int(time.time() * 1000))])
    td = ProduceRequest.TopicProduceData
    with wire(c, node, "admin", client_id=client_id) as w:
        answer = w.request(ProduceRequest(transactional_id=None, acks=1, timeout_ms=10000, topic_data=[
            td(name=topic, partition_data=[td.PartitionProduceData(index=0, records=bytes(batch))])]), 9)
    part = answer.responses[0].partition_responses[0]
    assert part.error_code == NONE, part
    return answer.throttle_time_ms


# -- the tests -----------------------------------------------------------------------------------------------------


def test_an_acl_created_through_one_broker_is_enforced_by_the_others(cluster):
    c = cluster
    create_topic(c, "orders", [[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    for node in c.brokers:    # no ACL yet: alice may not even learn that the topic exists
        assert topic_metadata(c, node, "alice", "orders")[0] == TOPIC_AUTHORIZATION_FAILED

    create_acl(c, 1, "alice", "orders", DESCRIBE)
    started = time.monotonic()
    for node in (2, 3):
        wait_for(lambda node=node: topic_metadata(c, node, "alice", "orders")[0] == NONE,
                 f"broker {node} to let alice describe orders", PROPAGATE_S)
    took = time.monotonic() - started
    assert described_acls(c, 3, "orders") == [("User:alice", DESCRIBE)]

    # READ granted through broker 2, on every partition's leader
    create_acl(c, 2, "alice", "orders", READ)
    for node in (1, 3):
        wait_for(lambda node=node: fetch_code(c, node, "alice", "orders", node - 1) == NONE,
                 f"broker {node} to let alice read", PROPAGATE_S)

    # and READ taken away through broker 1: brokers 2 and 3 refuse her reads again (DESCRIBE stays)
    assert delete_acl(c, 1, "alice", "orders", READ) == 1
    for node in (2, 3):
        wait_for(lambda node=node: fetch_code(c, node, "alice", "orders", node - 1) == TOPIC_AUTHORIZATION_FAILED,
                 f"broker {node} to refuse alice's reads again", PROPAGATE_S)
        assert topic_metadata(c, node, "alice", "orders")[0] == NONE
    assert described_acls(c, 2, "orders") == [("User:alice", DESCRIBE)]
    assert took < PROPAGATE_S


def test_a_scram_user_created_through_broker_2_logs_in_on_broker_3(cluster):
    c = cluster
    assert scram_login(c, 3, "carol", "carol-secret") == SASL_AUTHENTICATION_FAILED
    upsert_scram(c, 2, "carol", "carol-secret")
    assert scram_login(c, 2, "carol", "carol-secret") == NONE          # at once where it was created
    wait_for(lambda: scram_login(c, 3, "carol", "carol-secret") == NONE, "carol to log in on broker 3",
             PROPAGATE_S)
    assert scram_login(c, 3, "carol", "wrong") == SASL_AUTHENTICATION_FAILED
    assert "carol" in scram_users(c, 1) and "broker" in scram_users(c, 1)
    # the brokers' own credential (SCRAM-SHA-512, written before they started) is the one they replicate with
    create_topic(c, "replicated", [[1, 2, 3]])
    producer = Producer({"bootstrap.servers": client_address(c, 1), "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "carol",
                         "sasl.password": "carol-secret", "acks": "all"})
    # carol holds no ACL: a super user grants her WRITE (and DESCRIBE) through broker 3
    create_acl(c, 3, "carol", "replicated", 4)
    create_acl(c, 3, "carol", "replicated", DESCRIBE)
    errors: list[Any] = []
    wait_for(lambda: topic_metadata(c, 1, "admin", "replicated")[0] == NONE, "the topic", PROPAGATE_S)

    def delivered(err: Any, msg: Any) -> None:
        errors.append(err)

    wait_for(lambda: _produced(producer, errors, delivered), "carol's acks=all produce", PROPAGATE_S * 2)


def _produced(producer: Producer, errors: list[Any], delivered: Any) -> bool:
    errors.clear()
    producer.produce("replicated", b"by carol", partition=0, on_delivery=delivered)
    producer.flush(10)
    return errors == [None]


def test_a_quota_set_through_broker_3_throttles_on_broker_1(cluster):
    c = cluster
    create_topic(c, "metered", [[1, 2, 3]])
    assert produce_throttle_ms(c, 1, "slow-app", "metered") == 0
    set_quota(c, 3, "slow-app", 10_000)
    assert quotas_of(c, 3, "slow-app") == {"producer_byte_rate": 10_000}
    wait_for(lambda: quotas_of(c, 1, "slow-app") == {"producer_byte_rate": 10_000}, "broker 1 to know the quota",
             PROPAGATE_S)
    assert produce_throttle_ms(c, 1, "slow-app", "metered") > 0
    assert produce_throttle_ms(c, 1, "another-app", "metered") == 0


def test_acls_credentials_and_quotas_survive_a_restart_of_every_broker(cluster):
    c = cluster
    create_topic(c, "kept", [[1, 2, 3]])
    create_acl(c, 1, "bob", "kept", DESCRIBE)
    upsert_scram(c, 2, "dave", "dave-secret")
    set_quota(c, 3, "kept-app", 10_000)
    wait_for(lambda: all(quotas_of(c, n, "kept-app") and topic_metadata(c, n, "bob", "kept")[0] == NONE
                         for n in c.brokers), "every broker to hold the changes", PROPAGATE_S)

    c.stop()                  # one at a time, the controller last; ZooKeeper (the test's) keeps running
    c.start()
    for node in c.brokers:    # the first requests after the start: everything was read before serving
        assert topic_metadata(c, node, "bob", "kept")[0] == NONE
        assert topic_metadata(c, node, "alice", "kept")[0] == TOPIC_AUTHORIZATION_FAILED
        assert scram_login(c, node, "dave", "dave-secret") == NONE
        assert quotas_of(c, node, "kept-app") == {"producer_byte_rate": 10_000}
    leader = leader_of(c, "kept", 0)
    assert produce_throttle_ms(c, leader, "kept-app", "kept") > 0


def test_a_client_posing_as_a_follower_or_a_coordinator_changes_nothing(cluster):
    c = cluster
    create_topic(c, "guarded", [[1, 2, 3]])
    create_acl(c, 1, "alice", "guarded", 2)   # ALL on the topic: every right a client can hold there
    admin = Producer({"bootstrap.servers": client_address(c, 1), "security.protocol": "SASL_PLAINTEXT",
                      "sasl.mechanism": "PLAIN", "sasl.username": "admin", "sasl.password": "admin-secret",
                      "transactional.id": "guarded-tx"})
    admin.init_transactions(60)
    admin.begin_transaction()
    for i in range(3):
        admin.produce("guarded", f"v{i}".encode(), partition=0)
    admin.flush(30)
    leader = leader_of(c, "guarded", 0)
    with wire(c, leader, "admin") as w:
        answer = w.request(DescribeProducersRequest(topics=[DescribeProducersRequest.TopicRequest(
            name="guarded", partition_indexes=[0])]), 0)
        (state,) = answer.topics[0].partitions[0].active_producers
        before = end_offsets(w, "guarded")
    wait_for(lambda: described_acls(c, leader, "guarded"), "alice's ACL on the leader", PROPAGATE_S)

    with wire(c, leader, "alice") as w:
        # a follower fetch: no records, and no follower state moves
        part = fetch_raw(w, "guarded", 0, 0, replica_id=2)
        assert part.error_code == TOPIC_AUTHORIZATION_FAILED and not part.records
        ordinary = fetch_raw(w, "guarded", 0, 0)
        assert ordinary.error_code == NONE
        # markers: refused for every partition, none written
        m = WriteTxnMarkersRequest.WritableTxnMarker
        answer = w.request(WriteTxnMarkersRequest(markers=[m(
            producer_id=state.producer_id, producer_epoch=state.producer_epoch, transaction_result=True,
            coordinator_epoch=0, topics=[m.WritableTxnMarkerTopic(name="guarded", partition_indexes=[0])])]), 1)
        assert [p.error_code for t in answer.markers[0].topics for p in t.partitions] == [CLUSTER_AUTHORIZATION_FAILED]
    with wire(c, leader, "admin") as w:
        assert end_offsets(w, "guarded") == before        # no marker: the transaction is still open
    admin.abort_transaction(60)
    with wire(c, leader, "admin") as w:
        wait_for(lambda: end_offsets(w, "guarded")[1] == end_offsets(w, "guarded")[0], "the abort's marker", 30)


def end_offsets(w: Wire, topic: str) -> tuple[int, int]:
    """(high watermark, last stable offset) of partition 0 as its leader answers."""
    out = []
    for isolation in (0, 1):
        lt = ListOffsetsRequest.ListOffsetsTopic
        answer = w.request(ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=[lt(
            name=topic, partitions=[lt.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                                            timestamp=-1)])]), 4)
        p = answer.topics[0].partitions[0]
        assert p.error_code == NONE, p
        out.append(p.offset)
    return out[0], out[1]


def create_topics_code(c: Any, node: int, user: str, topic: str, client_id: str = "wire-test") -> int:
    ct = CreateTopicsRequest[5]
    with wire(c, node, user, client_id=client_id) as w:
        answer = w.request(ct(topics=[ct.CreatableTopic(name=topic, num_partitions=1, replication_factor=3,
                                                        assignments=[], configs=[])],
                              timeout_ms=30000, validate_only=False), 5)
    return answer.topics[0].error_code


def delete_topics_code(c: Any, node: int, user: str, topic: str) -> int:
    with wire(c, node, user) as w:
        answer = w.request(DeleteTopicsRequest[4](topic_names=[topic], timeout_ms=30000), 4)
    return answer.responses[0].error_code


def test_an_admin_request_forwarded_to_the_controller_is_authorized_as_its_sender(cluster):
    c = cluster
    controller = c.controller()
    other = next(n for n in c.brokers if n != controller)
    create_topic(c, "precious", [[1, 2, 3]])
    create_acl(c, controller, "alice", "precious", DESCRIBE)
    wait_for(lambda: topic_metadata(c, other, "alice", "precious")[0] == NONE, "alice's DESCRIBE", PROPAGATE_S)

    # alice may not create or delete topics: a broker that is not the controller forwards her requests to it,
    # which decides them as alice's, not as the forwarding broker's (a super user)
    assert create_topics_code(c, other, "alice", "alices-own") == TOPIC_AUTHORIZATION_FAILED
    assert delete_topics_code(c, other, "alice", "precious") == TOPIC_AUTHORIZATION_FAILED
    assert topic_metadata(c, controller, "admin", "alices-own")[0] == UNKNOWN_TOPIC_OR_PARTITION
    assert topic_metadata(c, controller, "admin", "precious")[0] == NONE
    # a client id claiming to forward for someone is believed only from a broker (CLUSTER_ACTION)
    posing = "oncelog-forwarded-by-9;principal=User%3Aadmin;host=127.0.0.1"
    assert create_topics_code(c, controller, "alice", "alices-own", client_id=posing) == TOPIC_AUTHORIZATION_FAILED

    create_acl(c, other, "alice", "alices-own", 5)     # CREATE
    wait_for(lambda: described_acls(c, controller, "alices-own"), "alice's CREATE on the controller", PROPAGATE_S)
    assert create_topics_code(c, other, "alice", "alices-own") == NONE
