"""The group and offset APIs on the wire: exact error codes for unknown groups, wrong generations and
unknown members, version-specific shapes (FindCoordinator v4 batches, MEMBER_ID_REQUIRED from JoinGroup v4,
LeaveGroup v3 batches, OffsetFetch v8 groups, ListGroups v4 state filter), and bad input (oversized or
malformed metadata) after which the broker still serves everyone else."""

from __future__ import annotations

import socket
import struct
import threading

import pytest
from kafka.protocol.admin import DeleteGroupsRequest, DescribeGroupsRequest, ListGroupsRequest
from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest
from tests.integration.helpers import Wire, api_versions_ok, create_topic, frame

from oncelog.embedded import BrokerProcess
from oncelog.errors import ErrorCode as E

SETTINGS = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 500,
            "group.max.session.timeout.ms": 60000, "offsets.topic.num.partitions": 3}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = BrokerProcess(tmp_path_factory.mktemp("groups-wire") / "data", SETTINGS).start()
    yield proc
    if proc.alive():
        proc.stop()


@pytest.fixture(scope="module")
def topic(broker):
    create_topic(broker.bootstrap, "wire-groups", 4)
    return "wire-groups"


def subscription(topic: str) -> bytes:
    raw = topic.encode()
    return struct.pack(">hih", 0, 1, len(raw)) + raw + struct.pack(">i", -1)


def join(w: Wire, group: str, member_id: str = "", *, version: int = 5, session: int = 5000,
         metadata: bytes = b"\x00\x00\x00\x00\x00\x00", instance: str | None = None,
         protocol_type: str = "consumer") -> object:
    req = JoinGroupRequest(
        group_id=group, session_timeout_ms=session, rebalance_timeout_ms=5000, member_id=member_id,
        group_instance_id=instance, protocol_type=protocol_type, reason=None,
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=metadata)])
    return w.request(req, version)


def joined_member(w: Wire, group: str, **kwargs) -> object:
    first = join(w, group, **kwargs)
    assert first.error_code == E.MEMBER_ID_REQUIRED, first
    second = join(w, group, first.member_id, **kwargs)
    assert second.error_code == 0 and second.member_id == first.member_id
    return second


def sync(w: Wire, group: str, generation: int, member_id: str, assignments: dict[str, bytes] | None = None,
         version: int = 3) -> object:
    items = [SyncGroupRequest.SyncGroupRequestAssignment(member_id=m, assignment=a)
             for m, a in (assignments or {}).items()]
    return w.request(SyncGroupRequest(group_id=group, generation_id=generation, member_id=member_id,
                                      group_instance_id=None, protocol_type=None, protocol_name=None,
                                      assignments=items), version)


def heartbeat(w: Wire, group: str, generation: int, member_id: str, version: int = 3) -> int:
    return w.request(HeartbeatRequest(group_id=group, generation_id=generation, member_id=member_id,
                                      group_instance_id=None), version).error_code


def commit(w: Wire, group: str, generation: int, member_id: str, topic: str, offsets: dict[int, int],
           version: int = 7) -> dict[int, int]:
    T = OffsetCommitRequest.OffsetCommitRequestTopic
    req = OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=generation, member_id=member_id, group_instance_id=None,
        retention_time_ms=-1, topics=[T(name=topic, partitions=[
            T.OffsetCommitRequestPartition(partition_index=p, committed_offset=o, committed_leader_epoch=-1,
                                           committed_metadata="") for p, o in offsets.items()])])
    resp = w.request(req, version)
    return {p.partition_index: p.error_code for t in resp.topics for p in t.partitions}


def fetch(w: Wire, group: str, topic: str, partitions: list[int], version: int = 7,
          require_stable: bool = False) -> dict[int, tuple[int, int]]:
    T = OffsetFetchRequest.OffsetFetchRequestTopic
    req = OffsetFetchRequest(group_id=group, topics=[T(name=topic, partition_indexes=partitions)],
                             require_stable=require_stable)
    resp = w.request(req, version)
    assert resp.error_code == 0
    return {p.partition_index: (p.committed_offset, p.error_code) for t in resp.topics for p in t.partitions}


# -- FindCoordinator -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_find_coordinator_single_key(broker, version):
    host, port = broker.bootstrap.rsplit(":", 1)
    with Wire(broker.bootstrap) as w:
        resp = w.request(FindCoordinatorRequest(key="any-group", key_type=0), version)
    assert (resp.error_code, resp.node_id, resp.host, resp.port) == (0, 0, host, int(port))


def test_find_coordinator_batched_and_key_types(broker):
    with Wire(broker.bootstrap) as w:
        resp = w.request(FindCoordinatorRequest(key_type=0, coordinator_keys=["a", "b"]), 4)
        assert [(c.key, c.error_code, c.node_id) for c in resp.coordinators] == [("a", 0, 0), ("b", 0, 0)]
        txn = w.request(FindCoordinatorRequest(key_type=1, coordinator_keys=["tx"]), 4)
        assert txn.coordinators[0].error_code == 0  # this broker runs a transaction coordinator
        bad = w.request(FindCoordinatorRequest(key="x", key_type=7), 3)
        assert bad.error_code == E.INVALID_REQUEST and bad.node_id == -1


# -- membership errors ------------------------------------------------------------------------------------------
def test_unknown_group_answers(broker, topic):
    g = "wire-nobody"
    with Wire(broker.bootstrap) as w:
        assert heartbeat(w, g, 1, "m") == E.UNKNOWN_MEMBER_ID
        assert sync(w, g, 1, "m").error_code == E.UNKNOWN_MEMBER_ID
        assert join(w, g, "m").error_code == E.UNKNOWN_MEMBER_ID  # a member id for a group that does not exist
        leave = w.request(LeaveGroupRequest(group_id=g, members=[
            LeaveGroupRequest.MemberIdentity(member_id="m", group_instance_id=None, reason=None)]), 5)
        assert leave.error_code == 0 and [m.error_code for m in leave.members] == [E.UNKNOWN_MEMBER_ID]
        assert w.request(LeaveGroupRequest(group_id=g, member_id="m"), 1).error_code == E.UNKNOWN_MEMBER_ID
        assert commit(w, g, 5, "m", topic, {0: 1}) == {0: E.ILLEGAL_GENERATION}
        assert fetch(w, g, topic, [0, 1]) == {0: (-1, 0), 1: (-1, 0)}
        described = w.request(DescribeGroupsRequest(groups=[g], include_authorized_operations=False), 5)
        assert (described.groups[0].error_code, described.groups[0].group_state) == (0, "Dead")
        deleted = w.request(DeleteGroupsRequest(groups_names=[g]), 2)
        assert deleted.results[0].error_code == E.GROUP_ID_NOT_FOUND
        T = OffsetDeleteRequest.OffsetDeleteRequestTopic
        odel = w.request(OffsetDeleteRequest(group_id=g, topics=[T(name=topic, partitions=[
            T.OffsetDeleteRequestPartition(partition_index=0)])]), 0)
        assert odel.error_code == E.GROUP_ID_NOT_FOUND


def test_join_validation(broker):
    with Wire(broker.bootstrap) as w:
        assert join(w, "wire-v", session=100).error_code == E.INVALID_SESSION_TIMEOUT
        assert join(w, "wire-v", session=120_000).error_code == E.INVALID_SESSION_TIMEOUT
        assert join(w, "").error_code == E.INVALID_GROUP_ID
        assert join(w, "wire-v", protocol_type="").error_code == E.INCONSISTENT_GROUP_PROTOCOL
        # before v4 a member id is handed out with the first answer
        v3 = join(w, "wire-v3", version=3)
        assert v3.error_code == 0 and v3.member_id and v3.generation_id == 1


def test_generation_and_member_fencing(broker, topic):
    g = "wire-fence"
    with Wire(broker.bootstrap) as w:
        a = joined_member(w, g)
        assert a.generation_id == 1 and a.leader == a.member_id
        assert sync(w, g, 1, a.member_id, {a.member_id: b"asg"}).assignment == b"asg"
        assert heartbeat(w, g, 1, a.member_id) == 0
        assert heartbeat(w, g, 2, a.member_id) == E.ILLEGAL_GENERATION
        assert heartbeat(w, g, 1, "intruder") == E.UNKNOWN_MEMBER_ID
        assert sync(w, g, 7, a.member_id).error_code == E.ILLEGAL_GENERATION
        assert commit(w, g, 2, a.member_id, topic, {0: 5}) == {0: E.ILLEGAL_GENERATION}
        assert commit(w, g, 1, "intruder", topic, {0: 5}) == {0: E.UNKNOWN_MEMBER_ID}
        assert commit(w, g, -1, "", topic, {0: 5}) == {0: E.UNKNOWN_MEMBER_ID}  # the group is not empty
        assert commit(w, g, 1, a.member_id, topic, {0: 5, 9: 1}) == {0: 0, 9: E.UNKNOWN_TOPIC_OR_PARTITION}
        assert fetch(w, g, topic, [0]) == {0: (5, 0)}
        deleted = w.request(DeleteGroupsRequest(groups_names=[g]), 2)
        assert deleted.results[0].error_code == E.NON_EMPTY_GROUP
        T = OffsetDeleteRequest.OffsetDeleteRequestTopic
        odel = w.request(OffsetDeleteRequest(group_id=g, topics=[T(name=topic, partitions=[
            T.OffsetDeleteRequestPartition(partition_index=0)])]), 0)
        assert odel.error_code == 0 and odel.topics[0].partitions[0].error_code == 0  # no real subscription
        leave = w.request(LeaveGroupRequest(group_id=g, members=[
            LeaveGroupRequest.MemberIdentity(member_id=a.member_id, group_instance_id=None, reason="done")]), 5)
        assert [m.error_code for m in leave.members] == [0]
        assert heartbeat(w, g, 1, a.member_id) == E.UNKNOWN_MEMBER_ID
        assert w.request(DeleteGroupsRequest(groups_names=[g]), 2).results[0].error_code == 0


def test_rebalance_in_progress_and_follower_sync(broker, topic):
    g = "wire-rebalance"
    with Wire(broker.bootstrap) as wa, Wire(broker.bootstrap) as wb:
        a = joined_member(wa, g, metadata=subscription(topic))
        sync(wa, g, 1, a.member_id, {a.member_id: b"all"})
        first_b = join(wb, g, metadata=subscription(topic))
        result: dict[str, object] = {}
        thread = threading.Thread(target=lambda: result.update(b=join(wb, g, first_b.member_id,
                                                                        metadata=subscription(topic))))
        thread.start()
        try:
            for _ in range(100):
                if heartbeat(wa, g, 1, a.member_id) == E.REBALANCE_IN_PROGRESS:
                    break
            else:
                raise AssertionError("no REBALANCE_IN_PROGRESS while a new member waits")
            a2 = join(wa, g, a.member_id, metadata=subscription(topic))
        finally:
            thread.join(10)
        b = result["b"]
        assert a2.generation_id == b.generation_id == 2 and len(a2.members) == 2 and len(b.members) == 0
        assert commit(wa, g, 2, a.member_id, topic, {0: 1}) == {0: E.REBALANCE_IN_PROGRESS}  # no assignment yet
        assert sync(wa, g, 2, a.member_id, {a.member_id: b"A", b.member_id: b"B"}).assignment == b"A"
        assert sync(wb, g, 2, b.member_id).assignment == b"B"
        assert commit(wb, g, 2, b.member_id, topic, {1: 3}) == {1: 0}
        listed = wa.request(ListGroupsRequest(states_filter=["Stable"]), 4)
        assert g in {x.group_id for x in listed.groups}
        assert g not in {x.group_id for x in wa.request(ListGroupsRequest(states_filter=["Empty"]), 4).groups}
        described = wa.request(DescribeGroupsRequest(groups=[g], include_authorized_operations=True), 5).groups[0]
        assert described.group_state == "Stable" and described.protocol_data == "range"
        assert sorted(m.member_assignment for m in described.members) == [b"A", b"B"]
        assert described.authorized_operations == {3, 6, 8}  # READ, DELETE, DESCRIBE


def test_offset_fetch_v8_many_groups_and_all_partitions(broker, topic):
    with Wire(broker.bootstrap) as w:
        assert commit(w, "wire-f1", -1, "", topic, {0: 11, 2: 12}) == {0: 0, 2: 0}
        assert commit(w, "wire-f2", -1, "", topic, {1: 21}, version=2) == {1: 0}
        G = OffsetFetchRequest.OffsetFetchRequestGroup
        req = OffsetFetchRequest(groups=[
            G(group_id="wire-f1", member_id=None, member_epoch=-1, topics=None),
            G(group_id="wire-f2", member_id=None, member_epoch=-1, topics=[
                G.OffsetFetchRequestTopics(name=topic, partition_indexes=[1, 3])]),
        ], require_stable=True)
        resp = w.request(req, 8)
        got = {g.group_id: {(p.partition_index, p.committed_offset) for t in g.topics for p in t.partitions}
               for g in resp.groups}
        assert got == {"wire-f1": {(0, 11), (2, 12)}, "wire-f2": {(1, 21), (3, -1)}}
        assert fetch(w, "wire-f1", topic, [0], version=1) == {0: (11, 0)}


# -- bad input ----------------------------------------------------------------------------------------------------
def test_oversized_protocol_metadata_is_refused(broker):
    with Wire(broker.bootstrap) as w:
        resp = join(w, "wire-big", version=3, metadata=b"x" * (2 << 20))
        assert resp.error_code == E.INVALID_REQUEST
        assert heartbeat(w, "wire-big", 0, "") == E.UNKNOWN_MEMBER_ID  # nothing was created
    assert broker.alive() and api_versions_ok(broker.bootstrap)


def test_malformed_join_closes_the_connection_and_broker_lives(broker):
    good = JoinGroupRequest(group_id="wire-bad", session_timeout_ms=5000, rebalance_timeout_ms=5000, member_id="",
                            group_instance_id=None, protocol_type="consumer", reason=None,
                            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")])
    good.with_header(correlation_id=1, client_id="bad")
    payload = bytes(good.encode(version=5, header=True, framed=False))
    tail = struct.pack(">ih", 1, 5) + b"range" + struct.pack(">i", 1) + b"m"
    assert payload.endswith(tail)
    lying = payload[: -len(tail)] + struct.pack(">i", 1000)  # 1000 protocols announced, none sent
    host, port = broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(frame(lying))
        assert sock.recv(1024) == b""
    assert broker.alive() and api_versions_ok(broker.bootstrap)
