"""ACLs on the group, offset, transaction and producer APIs, as Kafka's KafkaApis checks them.

One broker with ACLs on (tests/support/acl_broker.py: admin is a super user, alice and bob hold only what a test
grants). For each API: without the ACL, Kafka's exact error and nothing changed (checked as admin afterwards: no
group joined, no offset stored or deleted, no transaction touched, no marker written); with it, success. Raw
requests where the exact code matters (a SASL PLAIN handshake, then kafka-python's codecs through `Wire`), real
clients (confluent-kafka, kafka-python) where they surface the error, and a transactional consume-transform-produce
pipeline run by a principal holding only the ACLs a Kafka user needs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import (
    CreateTopicsRequest,
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    ListGroupsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
    TxnOffsetCommitRequest,
    WriteTxnMarkersRequest,
)
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest
from kafka.record import MemoryRecords
from tests.support.acl_broker import AclBroker
from tests.support.wire import Wire

from oncelog.records.builder import build_batch

# Error codes, written out (not taken from the broker's own enum).
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
INCONSISTENT_GROUP_PROTOCOL = 23
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
OPERATION_NOT_ATTEMPTED = 55
MEMBER_ID_REQUIRED = 79
# Group operations as DescribeGroups' authorized_operations bits
READ, DELETE, DESCRIBE = 3, 6, 8

# Kafka's Cluster resource (code 4) is BROKER in confluent-kafka's ResourceType, which AclBroker.grant looks up.
CLUSTER = "BROKER"
SETTINGS = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 500,
            "offsets.topic.num.partitions": 3, "transaction.state.log.num.partitions": 3}
T1, T2, GHOST = "t1", "t2", "no-such-topic"
MARKERS, PIPE_IN, PIPE_OUT = "t-markers", "pipe-in", "pipe-out"


# -- the broker and raw connections -----------------------------------------------------------------------------


class SaslWire(Wire):
    """`Wire` on the SASL_PLAINTEXT listener, authenticated as `user` (SaslHandshake v1, SaslAuthenticate v2)."""

    def __init__(self, broker: AclBroker, user: str) -> None:
        super().__init__(broker.bootstrap)
        assert self.request(SaslHandshakeRequest[1](mechanism="PLAIN"), 1).error_code == NONE
        answer = self.request(SaslAuthenticateRequest[2](auth_bytes=b"\0%s\0%s-secret" % (user.encode(),
                                                                                           user.encode())), 2)
        assert answer.error_code == NONE, answer


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = AclBroker(tmp_path_factory.mktemp("acl-groups-txns"), SETTINGS).start()
    with SaslWire(b, "admin") as w:
        for name in (T1, T2, MARKERS, PIPE_IN, PIPE_OUT):
            ct = CreateTopicsRequest
            resp = w.request(ct(topics=[ct.CreatableTopic(name=name, num_partitions=1, replication_factor=1,
                                                          assignments=[], configs=[])],
                                timeout_ms=10000, validate_only=False), 5)
            assert resp.topics[0].error_code == NONE, resp
    yield b
    b.stop()


@pytest.fixture(autouse=True)
def no_acls(broker):
    broker.revoke_all()
    yield
    broker.revoke_all()


@pytest.fixture
def wires(broker):
    opened: list[Wire] = []

    def open_(user: str) -> SaslWire:
        w = SaslWire(broker, user)
        opened.append(w)
        return w

    yield open_
    for w in opened:
        w.close()


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- group requests -------------------------------------------------------------------------------------------


def join(w: Wire, group: str, member_id: str = "", version: int = 5) -> Any:
    req = JoinGroupRequest(group_id=group, session_timeout_ms=6000, rebalance_timeout_ms=5000, member_id=member_id,
                           group_instance_id=None, protocol_type="consumer", reason=None,
                           protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")])
    return w.request(req, version)


def sync(w: Wire, group: str, generation: int, member_id: str, version: int = 3, protocol_type: str | None = None,
         protocol_name: str | None = None) -> Any:
    return w.request(SyncGroupRequest(group_id=group, generation_id=generation, member_id=member_id,
                                      group_instance_id=None, protocol_type=protocol_type,
                                      protocol_name=protocol_name, assignments=[]), version)


def heartbeat(w: Wire, group: str, generation: int, member_id: str) -> int:
    return w.request(HeartbeatRequest(group_id=group, generation_id=generation, member_id=member_id,
                                      group_instance_id=None), 3).error_code


def leave(w: Wire, group: str, member_id: str) -> Any:
    member = LeaveGroupRequest.MemberIdentity(member_id=member_id, group_instance_id=None, reason=None)
    return w.request(LeaveGroupRequest(group_id=group, members=[member]), 4)


def describe_groups(w: Wire, groups: list[str], ops: bool = False) -> dict[str, Any]:
    resp = w.request(DescribeGroupsRequest(groups=groups, include_authorized_operations=ops), 5)
    return {g.group_id: g for g in resp.groups}


def list_groups(w: Wire) -> set[str]:
    resp = w.request(ListGroupsRequest(states_filter=[]), 4)
    assert resp.error_code == NONE
    return {g.group_id for g in resp.groups}


def commit(w: Wire, group: str, offsets: dict[tuple[str, int], int], generation: int = -1,
           member_id: str = "") -> dict[tuple[str, int], int]:
    T = OffsetCommitRequest.OffsetCommitRequestTopic
    by_topic: dict[str, list[Any]] = {}
    for (topic, p), o in offsets.items():
        by_topic.setdefault(topic, []).append(T.OffsetCommitRequestPartition(
            partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=""))
    resp = w.request(OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=generation,
                                         member_id=member_id, group_instance_id=None, retention_time_ms=-1,
                                         topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()]), 8)
    return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


def fetch_offsets(w: Wire, group: str, topics: dict[str, list[int]] | None = None,
                  version: int = 7) -> tuple[int, dict[tuple[str, int], tuple[int, int]]]:
    """OffsetFetch (one group); `topics` None: all partitions. (group error, {(topic, p): (offset, error)})."""
    T = OffsetFetchRequest.OffsetFetchRequestTopic
    wanted = None if topics is None else [T(name=t, partition_indexes=ps) for t, ps in topics.items()]
    resp = w.request(OffsetFetchRequest(group_id=group, topics=wanted, require_stable=False), version)
    return resp.error_code, {(t.name, p.partition_index): (p.committed_offset, p.error_code)
                             for t in resp.topics for p in t.partitions}


def committed(admin: Wire, group: str) -> dict[tuple[str, int], int]:
    error, offsets = fetch_offsets(admin, group)
    assert error == NONE
    return {tp: o for tp, (o, e) in offsets.items()}


# -- transaction requests -------------------------------------------------------------------------------------


def init_pid(w: Wire, txn_id: str | None, pid: int = -1, epoch: int = -1) -> tuple[int, int, int]:
    resp = w.request(InitProducerIdRequest(transactional_id=txn_id, transaction_timeout_ms=60000, producer_id=pid,
                                           producer_epoch=epoch), 4)
    return resp.error_code, resp.producer_id, resp.producer_epoch


def add_partitions(w: Wire, txn_id: str, pid: int, epoch: int,
                   partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    req = AddPartitionsToTxnRequest
    by_topic: dict[str, list[int]] = {}
    for t, p in partitions:
        by_topic.setdefault(t, []).append(p)
    resp = w.request(req(v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=pid,
                         v3_and_below_producer_epoch=epoch,
                         v3_and_below_topics=[req.AddPartitionsToTxnTopic(name=t, partitions=ps)
                                              for t, ps in by_topic.items()]), 3)
    return {(t.name, p.partition_index): p.partition_error_code
            for t in resp.results_by_topic_v3_and_below for p in t.results_by_partition}


def add_offsets(w: Wire, txn_id: str, pid: int, epoch: int, group: str) -> int:
    return w.request(AddOffsetsToTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                                            group_id=group), 3).error_code


def txn_offset_commit(w: Wire, txn_id: str, pid: int, epoch: int, group: str,
                      offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    req = TxnOffsetCommitRequest
    T = req.TxnOffsetCommitRequestTopic
    by_topic: dict[str, list[Any]] = {}
    for (topic, p), o in offsets.items():
        by_topic.setdefault(topic, []).append(T.TxnOffsetCommitRequestPartition(
            partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=""))
    resp = w.request(req(transactional_id=txn_id, group_id=group, producer_id=pid, producer_epoch=epoch,
                         generation_id=-1, member_id="", group_instance_id=None,
                         topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()]), 3)
    return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


def end_txn(w: Wire, txn_id: str, pid: int, epoch: int, commit_: bool) -> int:
    return w.request(EndTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                                   committed=commit_), 3).error_code


def describe_txns(w: Wire, txn_ids: list[str]) -> dict[str, Any]:
    resp = w.request(DescribeTransactionsRequest(transactional_ids=txn_ids), 0)
    return {s.transactional_id: s for s in resp.transaction_states}


def txn_state(admin: Wire, txn_id: str) -> tuple[str, dict[str, list[int]]]:
    s = describe_txns(admin, [txn_id])[txn_id]
    assert s.error_code == NONE, s
    return s.transaction_state, {t.topic: sorted(t.partitions) for t in s.topics}


def write_marker(w: Wire, pid: int, epoch: int, commit_: bool, topic: str, partitions: list[int]) -> dict[int, int]:
    m = WriteTxnMarkersRequest.WritableTxnMarker
    resp = w.request(WriteTxnMarkersRequest(markers=[m(
        producer_id=pid, producer_epoch=epoch, transaction_result=commit_, coordinator_epoch=0,
        topics=[m.WritableTxnMarkerTopic(name=topic, partition_indexes=partitions)])]), 1)
    (marker,) = resp.markers
    return {p.partition_index: p.error_code for t in marker.topics for p in t.partitions}


def produce_txn(w: Wire, txn_id: str, topic: str, pid: int, epoch: int, seq: int, values: list[bytes]) -> int:
    batch = build_batch([(b"k", v) for v in values], producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                        transactional=True)
    td = ProduceRequest.TopicProduceData
    resp = w.request(ProduceRequest(transactional_id=txn_id, acks=-1, timeout_ms=10000, topic_data=[
        td(name=topic, partition_data=[td.PartitionProduceData(index=0, records=bytes(batch))])]), 9)
    p = resp.responses[0].partition_responses[0]
    assert p.error_code == NONE, p
    return p.base_offset


def end_offsets(w: Wire, topic: str) -> tuple[int, int]:
    """(high watermark, last stable offset) of partition 0."""
    out = []
    for isolation in (0, 1):
        lt = ListOffsetsRequest.ListOffsetsTopic
        resp = w.request(ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=[lt(name=topic, partitions=[
            lt.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1)])]), 4)
        p = resp.topics[0].partitions[0]
        assert p.error_code == NONE, p
        out.append(p.offset)
    return out[0], out[1]


def control_batches(w: Wire, topic: str) -> list[int]:
    """The offsets of the control (marker) batches in partition 0."""
    ft = FetchRequest.FetchTopic
    resp = w.request(FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                                  session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=[], topics=[
                                      ft(topic=topic, partitions=[ft.FetchPartition(
                                          partition=0, current_leader_epoch=-1, fetch_offset=0,
                                          last_fetched_epoch=-1, log_start_offset=-1,
                                          partition_max_bytes=1 << 20)])]), 12)
    p = resp.responses[0].partitions[0]
    assert p.error_code == NONE, p
    batches, out = MemoryRecords(bytes(p.records or b"")), []
    while batches.has_next():
        batch = batches.next_batch()
        if batch is None:
            break
        if batch.is_control_batch:
            out.append(batch.base_offset)
    return out


# -- FindCoordinator ------------------------------------------------------------------------------------------


def test_find_coordinator_needs_describe_on_each_key(broker, wires):
    alice = wires("alice")
    old = alice.request(FindCoordinatorRequest(key="fc-group", key_type=0), 3)
    assert (old.error_code, old.node_id, old.host, old.port) == (GROUP_AUTHORIZATION_FAILED, -1, "", -1)
    assert old.error_message == "Group authorization failed."
    assert alice.request(FindCoordinatorRequest(key="fc-tx", key_type=1), 3).error_code == \
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    broker.grant("alice", "GROUP", "fc-ok", "DESCRIBE")
    broker.grant("alice", "TRANSACTIONAL_ID", "fc-tx-", "DESCRIBE", pattern="PREFIXED")
    groups = alice.request(FindCoordinatorRequest(key_type=0, coordinator_keys=["fc-ok", "fc-no"]), 4)
    assert [(c.key, c.error_code, c.node_id >= 0) for c in groups.coordinators] == [
        ("fc-ok", NONE, True), ("fc-no", GROUP_AUTHORIZATION_FAILED, False)]
    txns = alice.request(FindCoordinatorRequest(key_type=1, coordinator_keys=["fc-tx-1", "fc-other"]), 4)
    assert [(c.key, c.error_code) for c in txns.coordinators] == [
        ("fc-tx-1", NONE), ("fc-other", TRANSACTIONAL_ID_AUTHORIZATION_FAILED)]


# -- JoinGroup / SyncGroup / Heartbeat / LeaveGroup -----------------------------------------------------------


def test_group_membership_needs_group_read(broker, wires):
    alice, bob, admin = wires("alice"), wires("bob"), wires("admin")
    denied = join(alice, "jg")
    assert (denied.error_code, denied.member_id, denied.generation_id, denied.leader) == (
        GROUP_AUTHORIZATION_FAILED, "", -1, "")
    assert "jg" not in list_groups(admin)                   # nothing joined, no group created
    assert describe_groups(admin, ["jg"])["jg"].group_state == "Dead"

    broker.grant("alice", "GROUP", "jg", "READ")
    first = join(alice, "jg")
    assert first.error_code == MEMBER_ID_REQUIRED
    joined = join(alice, "jg", first.member_id)
    assert joined.error_code == NONE
    gen, member = joined.generation_id, joined.member_id
    assert sync(alice, "jg", gen, member).error_code == NONE
    assert heartbeat(alice, "jg", gen, member) == NONE

    # bob, without READ, cannot sync, heartbeat or leave in alice's place
    assert sync(bob, "jg", gen, member).error_code == GROUP_AUTHORIZATION_FAILED
    assert heartbeat(bob, "jg", gen, member) == GROUP_AUTHORIZATION_FAILED
    refused = leave(bob, "jg", member)
    assert (refused.error_code, list(refused.members)) == (GROUP_AUTHORIZATION_FAILED, [])
    group = describe_groups(admin, ["jg"])["jg"]
    assert (group.group_state, [m.member_id for m in group.members]) == ("Stable", [member])
    # SyncGroup v5's mandatory protocol type and name are checked before the ACL, as Kafka
    assert sync(bob, "jg", gen, member, version=5).error_code == INCONSISTENT_GROUP_PROTOCOL

    left = leave(alice, "jg", member)
    assert (left.error_code, [m.error_code for m in left.members]) == (NONE, [NONE])
    assert describe_groups(admin, ["jg"])["jg"].members == []


def test_consumer_without_group_read_is_refused_at_join(broker):
    """librdkafka finds the coordinator (DESCRIBE on the group) and is refused at JoinGroup (READ)."""
    broker.grant("alice", "TOPIC", T1, "READ")
    broker.grant("alice", "GROUP", "ck-join", "DESCRIBE")
    consumer = Consumer(broker.client("alice", **{"group.id": "ck-join", "session.timeout.ms": 6000}))
    try:
        consumer.subscribe([T1])
        deadline, error = time.monotonic() + 20, None
        while error is None and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is not None:
                error = msg.error()
        assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error
    finally:
        consumer.close()
    with SaslWire(broker, "admin") as admin:
        assert describe_groups(admin, ["ck-join"])["ck-join"].members == []


# -- DescribeGroups / ListGroups / DeleteGroups ---------------------------------------------------------------


def test_describe_list_and_delete_groups_per_group(broker, wires):
    alice, admin = wires("alice"), wires("admin")
    for group in ("grp-a", "grp-b"):
        assert commit(admin, group, {(T1, 0): 3}) == {(T1, 0): NONE}

    broker.grant("alice", "GROUP", "grp-a", "DESCRIBE")
    described = describe_groups(alice, ["grp-a", "grp-b"], ops=True)
    assert (described["grp-a"].error_code, described["grp-a"].group_state) == (NONE, "Empty")
    assert described["grp-a"].authorized_operations == {DESCRIBE}     # what alice may do on it, no more
    assert described["grp-b"].error_code == GROUP_AUTHORIZATION_FAILED
    assert described["grp-b"].authorized_operations is None           # left out for a refused group
    assert describe_groups(admin, ["grp-a"], ops=True)["grp-a"].authorized_operations == {READ, DELETE, DESCRIBE}

    # ListGroups: only the groups alice may DESCRIBE; Cluster DESCRIBE shows all of them
    assert {"grp-a", "grp-b"} & list_groups(alice) == {"grp-a"}
    kp_admin = KafkaAdminClient(**broker.kafka_python("alice"))
    try:
        assert {"grp-a", "grp-b"} & {g["group_id"] for g in kp_admin.list_groups()} == {"grp-a"}
    finally:
        kp_admin.close()
    broker.grant("alice", CLUSTER, "kafka-cluster", "DESCRIBE")
    assert {"grp-a", "grp-b"} <= list_groups(alice)

    # DeleteGroups: DELETE per group; the refused group keeps its offsets
    broker.grant("alice", "GROUP", "grp-b", "DELETE")
    resp = alice.request(DeleteGroupsRequest(groups_names=["grp-a", "grp-b"]), 2)
    assert {r.group_id: r.error_code for r in resp.results} == {"grp-a": GROUP_AUTHORIZATION_FAILED,
                                                               "grp-b": NONE}
    assert committed(admin, "grp-a") == {(T1, 0): 3}
    assert committed(admin, "grp-b") == {}


# -- OffsetCommit / OffsetFetch / OffsetDelete ----------------------------------------------------------------


def test_offset_commit_needs_group_read_then_topic_read(broker, wires):
    alice, admin = wires("alice"), wires("admin")
    wanted = {(T1, 0): 5, (T2, 0): 6, (GHOST, 0): 7}
    assert commit(alice, "oc", wanted) == dict.fromkeys(wanted, GROUP_AUTHORIZATION_FAILED)
    assert committed(admin, "oc") == {}

    broker.grant("alice", "GROUP", "oc", "READ")
    broker.grant("alice", "TOPIC", T1, "READ")
    # a topic alice may not READ answers the same whether it exists or not, and is not committed
    assert commit(alice, "oc", wanted) == {(T1, 0): NONE, (T2, 0): TOPIC_AUTHORIZATION_FAILED,
                                           (GHOST, 0): TOPIC_AUTHORIZATION_FAILED}
    assert committed(admin, "oc") == {(T1, 0): 5}


def test_offset_fetch_needs_group_describe_and_hides_topics(broker, wires):
    alice, admin = wires("alice"), wires("admin")
    assert commit(admin, "of", {(T1, 0): 5, (T2, 0): 7}) == {(T1, 0): NONE, (T2, 0): NONE}
    assert fetch_offsets(alice, "of", {T1: [0]}) == (GROUP_AUTHORIZATION_FAILED, {})

    broker.grant("alice", "GROUP", "of", "DESCRIBE")
    broker.grant("alice", "TOPIC", T1, "DESCRIBE")
    error, named = fetch_offsets(alice, "of", {T1: [0], T2: [0], GHOST: [0]})
    assert error == NONE
    assert named == {(T1, 0): (5, NONE), (T2, 0): (-1, TOPIC_AUTHORIZATION_FAILED),
                     (GHOST, 0): (-1, TOPIC_AUTHORIZATION_FAILED)}
    assert fetch_offsets(alice, "of") == (NONE, {(T1, 0): (5, NONE)})     # all partitions: T2 left out

    # v8: each group is checked on its own
    G = OffsetFetchRequest.OffsetFetchRequestGroup
    resp = alice.request(OffsetFetchRequest(groups=[G(group_id="of", member_id=None, member_epoch=-1, topics=None),
                                                    G(group_id="of-other", member_id=None, member_epoch=-1,
                                                      topics=None)], require_stable=False), 8)
    answers = {g.group_id: (g.error_code, {(t.name, p.partition_index): p.committed_offset
                                           for t in g.topics for p in t.partitions}) for g in resp.groups}
    assert answers == {"of": (NONE, {(T1, 0): 5}), "of-other": (GROUP_AUTHORIZATION_FAILED, {})}


def test_offset_delete_needs_group_delete_then_topic_read(broker, wires):
    alice, admin = wires("alice"), wires("admin")
    assert commit(admin, "od", {(T1, 0): 5, (T2, 0): 7}) == {(T1, 0): NONE, (T2, 0): NONE}
    T = OffsetDeleteRequest.OffsetDeleteRequestTopic
    request = OffsetDeleteRequest(group_id="od", topics=[
        T(name=t, partitions=[T.OffsetDeleteRequestPartition(partition_index=0)]) for t in (T1, T2, GHOST)])

    refused = alice.request(request, 0)
    assert (refused.error_code, list(refused.topics)) == (GROUP_AUTHORIZATION_FAILED, [])
    assert committed(admin, "od") == {(T1, 0): 5, (T2, 0): 7}

    broker.grant("alice", "GROUP", "od", "DELETE")
    broker.grant("alice", "TOPIC", T1, "READ")
    resp = alice.request(request, 0)
    assert resp.error_code == NONE
    assert {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions} == {
        (T1, 0): NONE, (T2, 0): TOPIC_AUTHORIZATION_FAILED, (GHOST, 0): TOPIC_AUTHORIZATION_FAILED}
    assert committed(admin, "od") == {(T2, 0): 7}


# -- InitProducerId / DescribeProducers -----------------------------------------------------------------------


def test_init_producer_id_transactional_and_idempotent(broker, wires):
    alice, bob, admin = wires("alice"), wires("bob"), wires("admin")
    assert init_pid(alice, "ip-tx") == (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)
    # the ACL is checked before the request's own validation (a producer id without its epoch)
    assert init_pid(alice, "ip-tx", pid=5, epoch=-1)[0] == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert describe_txns(admin, ["ip-tx"])["ip-tx"].error_code != NONE          # no transactional id created
    assert init_pid(alice, None) == (CLUSTER_AUTHORIZATION_FAILED, -1, -1)

    broker.grant("alice", "TRANSACTIONAL_ID", "ip-tx", "WRITE")
    error, pid, epoch = init_pid(alice, "ip-tx")
    assert (error, epoch) == (NONE, 0) and pid >= 0
    assert txn_state(admin, "ip-tx") == ("Empty", {})

    broker.grant("alice", "TOPIC", "any-", "WRITE", pattern="PREFIXED")         # KIP-679: WRITE on any topic
    assert init_pid(alice, None)[0] == NONE
    broker.grant("bob", CLUSTER, "kafka-cluster", "IDEMPOTENT_WRITE")
    assert init_pid(bob, None)[0] == NONE


def test_transactional_producer_refused_at_init(broker, wires):
    """librdkafka finds the coordinator (DESCRIBE on the id) and is refused at InitProducerId (WRITE)."""
    broker.grant("alice", "TRANSACTIONAL_ID", "ck-tx", "DESCRIBE")
    producer = Producer(broker.client("alice", **{"transactional.id": "ck-tx"}))
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(20)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert describe_txns(wires("admin"), ["ck-tx"])["ck-tx"].error_code != NONE


def test_describe_producers_needs_topic_read(broker, wires):
    alice, admin = wires("alice"), wires("admin")
    error, pid, epoch = init_pid(admin, None)
    assert error == NONE
    batch = build_batch([(b"k", b"v")], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    td = ProduceRequest.TopicProduceData
    produced = admin.request(ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
        td(name=T2, partition_data=[td.PartitionProduceData(index=0, records=bytes(batch))])]), 9)
    assert produced.responses[0].partition_responses[0].error_code == NONE

    TR = DescribeProducersRequest.TopicRequest
    request = DescribeProducersRequest(topics=[TR(name=T2, partition_indexes=[0]),
                                               TR(name=GHOST, partition_indexes=[0])])
    resp = alice.request(request, 0)
    answers = {t.name: [(p.error_code, p.error_message, list(p.active_producers)) for p in t.partitions]
               for t in resp.topics}
    assert answers == {T2: [(TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed.", [])],
                       GHOST: [(TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed.", [])]}

    broker.grant("alice", "TOPIC", T2, "READ")
    resp = alice.request(request, 0)
    (t2,) = [t for t in resp.topics if t.name == T2]
    assert t2.partitions[0].error_code == NONE
    assert pid in {p.producer_id for p in t2.partitions[0].active_producers}


# -- AddPartitionsToTxn / AddOffsetsToTxn / TxnOffsetCommit / EndTxn ------------------------------------------


def test_add_partitions_to_txn(broker, wires):
    alice, bob, admin = wires("alice"), wires("bob"), wires("admin")
    broker.grant("alice", "TRANSACTIONAL_ID", "ap-tx", "WRITE")
    error, pid, epoch = init_pid(alice, "ap-tx")
    assert error == NONE

    # bob may not WRITE the id: every partition answers it
    assert add_partitions(bob, "ap-tx", pid, epoch, [(T1, 0), (T2, 0)]) == {
        (T1, 0): TRANSACTIONAL_ID_AUTHORIZATION_FAILED, (T2, 0): TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    # alice may WRITE T1 only: the refused topics fail the request, whether they exist or not; T1 is not added
    broker.grant("alice", "TOPIC", T1, "WRITE")
    assert add_partitions(alice, "ap-tx", pid, epoch, [(T1, 0), (T2, 0), (GHOST, 0)]) == {
        (T1, 0): OPERATION_NOT_ATTEMPTED, (T2, 0): TOPIC_AUTHORIZATION_FAILED,
        (GHOST, 0): TOPIC_AUTHORIZATION_FAILED}
    assert txn_state(admin, "ap-tx") == ("Empty", {})
    # an internal topic is never one a client may add, super users included (Kafka leaves it out of the check)
    assert add_partitions(admin, "ap-tx", pid, epoch, [("__consumer_offsets", 0)]) == {
        ("__consumer_offsets", 0): TOPIC_AUTHORIZATION_FAILED}

    assert add_partitions(alice, "ap-tx", pid, epoch, [(T1, 0)]) == {(T1, 0): NONE}
    assert txn_state(admin, "ap-tx") == ("Ongoing", {T1: [0]})
    broker.grant("alice", "TOPIC", "no-such-", "WRITE", pattern="PREFIXED")
    # once alice may WRITE it, a missing topic shows as missing
    assert add_partitions(alice, "ap-tx", pid, epoch, [(T1, 0), (GHOST, 0)]) == {
        (T1, 0): OPERATION_NOT_ATTEMPTED, (GHOST, 0): UNKNOWN_TOPIC_OR_PARTITION}
    assert end_txn(alice, "ap-tx", pid, epoch, False) == NONE


def test_add_partitions_v4_needs_cluster_action(broker, wires):
    alice, admin = wires("alice"), wires("admin")
    error, pid, epoch = init_pid(admin, "ap4-tx")
    assert error == NONE
    assert add_partitions(admin, "ap4-tx", pid, epoch, [(T1, 0)]) == {(T1, 0): NONE}
    req = AddPartitionsToTxnRequest
    tx = req.AddPartitionsToTxnTransaction
    request = req(transactions=[tx(transactional_id="ap4-tx", producer_id=pid, producer_epoch=epoch,
                                   verify_only=True, topics=[tx.AddPartitionsToTxnTopic(name=T1, partitions=[0])])])
    # a broker's verification batch from a client: refused whole, even with every client ACL
    broker.grant("alice", "TRANSACTIONAL_ID", "ap4-tx", "WRITE")
    broker.grant("alice", "TOPIC", T1, "WRITE")
    refused = alice.request(request, 4)
    assert (refused.error_code, list(refused.results_by_transaction)) == (CLUSTER_AUTHORIZATION_FAILED, [])

    broker.grant("alice", CLUSTER, "kafka-cluster", "CLUSTER_ACTION")
    resp = alice.request(request, 4)
    assert resp.error_code == NONE
    assert [(r.transactional_id, [(p.partition_index, p.partition_error_code) for t in r.topic_results
                                  for p in t.results_by_partition]) for r in resp.results_by_transaction] == [
        ("ap4-tx", [(0, NONE)])]
    assert end_txn(admin, "ap4-tx", pid, epoch, False) == NONE


def test_offsets_in_a_transaction_and_end_txn(broker, wires):
    alice, bob, admin = wires("alice"), wires("bob"), wires("admin")
    broker.grant("alice", "TRANSACTIONAL_ID", "ao-tx", "WRITE")
    error, pid, epoch = init_pid(alice, "ao-tx")
    assert error == NONE

    # AddOffsetsToTxn: WRITE on the id, then READ on the group
    assert add_offsets(bob, "ao-tx", pid, epoch, "ao-g") == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert add_offsets(alice, "ao-tx", pid, epoch, "ao-g") == GROUP_AUTHORIZATION_FAILED
    assert txn_state(admin, "ao-tx") == ("Empty", {})
    broker.grant("alice", "GROUP", "ao-g", "READ")
    assert add_offsets(alice, "ao-tx", pid, epoch, "ao-g") == NONE
    state, partitions = txn_state(admin, "ao-tx")
    assert state == "Ongoing" and list(partitions) == ["__consumer_offsets"]

    # TxnOffsetCommit: WRITE on the id, READ on the group, READ on each topic
    wanted = {(T1, 0): 11, (T2, 0): 12, (GHOST, 0): 13}
    assert txn_offset_commit(bob, "ao-tx", pid, epoch, "ao-g", wanted) == dict.fromkeys(
        wanted, TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    assert txn_offset_commit(alice, "ao-tx", pid, epoch, "other-g", wanted) == dict.fromkeys(
        wanted, GROUP_AUTHORIZATION_FAILED)
    broker.grant("alice", "TOPIC", T1, "READ")
    assert txn_offset_commit(alice, "ao-tx", pid, epoch, "ao-g", wanted) == {
        (T1, 0): NONE, (T2, 0): TOPIC_AUTHORIZATION_FAILED, (GHOST, 0): TOPIC_AUTHORIZATION_FAILED}

    # EndTxn: WRITE on the id; bob's commit leaves the transaction open
    assert end_txn(bob, "ao-tx", pid, epoch, True) == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert txn_state(admin, "ao-tx")[0] == "Ongoing"
    assert committed(admin, "ao-g") == {}
    assert end_txn(alice, "ao-tx", pid, epoch, True) == NONE
    wait_for(lambda: txn_state(admin, "ao-tx")[0] == "CompleteCommit", what="the commit")
    assert wait_for(lambda: committed(admin, "ao-g"), what="the offsets") == {(T1, 0): 11}


# -- WriteTxnMarkers ------------------------------------------------------------------------------------------


def test_write_txn_markers_from_a_client_need_cluster_action(broker, wires):
    alice, admin = wires("alice"), wires("admin")
    error, pid, epoch = init_pid(admin, "wm-tx")
    assert error == NONE
    assert add_partitions(admin, "wm-tx", pid, epoch, [(MARKERS, 0)]) == {(MARKERS, 0): NONE}
    first = produce_txn(admin, "wm-tx", MARKERS, pid, epoch, 0, [b"a", b"b"])
    before = end_offsets(admin, MARKERS)
    assert before == (first + 2, first)
    controls = control_batches(admin, MARKERS)

    # alice, posing as a transaction coordinator (every client ACL on the topic and the id does not help)
    broker.grant("alice", "TOPIC", MARKERS, "ALL")
    broker.grant("alice", "TRANSACTIONAL_ID", "wm-tx", "ALL")
    assert write_marker(alice, pid, epoch, True, MARKERS, [0]) == {0: CLUSTER_AUTHORIZATION_FAILED}
    assert end_offsets(admin, MARKERS) == before                     # no marker, the LSO stays
    assert control_batches(admin, MARKERS) == controls
    assert txn_state(admin, "wm-tx") == ("Ongoing", {MARKERS: [0]})

    broker.grant("alice", CLUSTER, "kafka-cluster", "CLUSTER_ACTION")
    assert write_marker(alice, pid, epoch, False, MARKERS, [0]) == {0: NONE}
    assert end_offsets(admin, MARKERS) == (first + 3, first + 3)
    assert control_batches(admin, MARKERS) == [*controls, first + 2]
    assert end_txn(admin, "wm-tx", pid, epoch, False) == NONE


# -- DescribeTransactions / ListTransactions ------------------------------------------------------------------


def test_describe_and_list_transactions_show_only_what_may_be_described(broker, wires):
    alice, admin = wires("alice"), wires("admin")
    pids = {}
    for txn_id in ("dt-1", "dt-2"):
        error, pid, epoch = init_pid(admin, txn_id)
        assert error == NONE
        assert add_partitions(admin, txn_id, pid, epoch, [(T1, 0), (T2, 0)]) == {(T1, 0): NONE, (T2, 0): NONE}
        pids[txn_id] = (pid, epoch)

    broker.grant("alice", "TRANSACTIONAL_ID", "dt-1", "DESCRIBE")
    broker.grant("alice", "TOPIC", T1, "DESCRIBE")
    states = describe_txns(alice, ["dt-1", "dt-2", "dt-none"])
    assert (states["dt-1"].error_code, states["dt-1"].transaction_state) == (NONE, "Ongoing")
    assert {t.topic: list(t.partitions) for t in states["dt-1"].topics} == {T1: [0]}     # T2 left out
    # refused whether or not the id exists
    for txn_id in ("dt-2", "dt-none"):
        s = states[txn_id]
        assert (s.error_code, s.transaction_state, s.producer_id, list(s.topics)) == (
            TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "", 0, [])

    resp = alice.request(ListTransactionsRequest(state_filters=[], producer_id_filters=[], duration_filter=-1), 1)
    assert resp.error_code == NONE
    assert {s.transactional_id for s in resp.transaction_states} == {"dt-1"}
    kp_admin = KafkaAdminClient(**broker.kafka_python("alice"))
    try:
        listed = {t.transactional_id for listings in kp_admin.list_transactions().values() for t in listings}
    finally:
        kp_admin.close()
    assert listed == {"dt-1"}
    for txn_id, (pid, epoch) in pids.items():
        assert end_txn(admin, txn_id, pid, epoch, False) == NONE


# -- a transactional pipeline with a Kafka user's ACLs --------------------------------------------------------


def test_transactional_pipeline_with_only_the_needed_acls(broker, wires):
    admin = wires("admin")
    inputs = [b"in-%d" % i for i in range(10)]
    feeder = Producer(broker.client("admin"))
    for value in inputs:
        feeder.produce(PIPE_IN, value=value, partition=0)
    assert feeder.flush(20) == 0

    broker.grant("bob", "TRANSACTIONAL_ID", "pipe-tx", "WRITE", "DESCRIBE")
    broker.grant("bob", "TOPIC", PIPE_OUT, "WRITE")
    broker.grant("bob", "TOPIC", PIPE_IN, "READ")
    broker.grant("bob", "GROUP", "pipe-g", "READ")
    consumer = Consumer(broker.client("bob", **{
        "group.id": "pipe-g", "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "isolation.level": "read_committed", "session.timeout.ms": 6000}))
    producer = Producer(broker.client("bob", **{"transactional.id": "pipe-tx"}))
    try:
        producer.init_transactions(20)
        consumer.subscribe([PIPE_IN])
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(seen) < len(inputs):
            assert time.monotonic() < deadline, f"read {len(seen)} of {len(inputs)}"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            seen.append(msg.value())
        producer.begin_transaction()
        for value in seen:
            producer.produce(PIPE_OUT, value=value.replace(b"in", b"out"), partition=0)
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 20)
        producer.commit_transaction(20)
    finally:
        consumer.close()

    assert committed(admin, "pipe-g") == {(PIPE_IN, 0): len(inputs)}
    reader = Consumer(broker.client("admin", **{"group.id": "pipe-check", "isolation.level": "read_committed",
                                                "enable.partition.eof": True}))
    out: list[bytes] = []
    try:
        reader.assign([TopicPartition(PIPE_OUT, 0, 0)])
        while True:
            msg = reader.poll(10)
            assert msg is not None, "pipe-out not read to its end"
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                break
            out.append(msg.value())
    finally:
        reader.close()
    assert out == [v.replace(b"in", b"out") for v in inputs]
    assert txn_state(admin, "pipe-tx") == ("CompleteCommit", {})
