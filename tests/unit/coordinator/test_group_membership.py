"""The classic group protocol on an in-memory offsets log: joins, rebalances, fencing, timeouts."""

from __future__ import annotations

import asyncio

from tests.unit.coordinator.group_helpers import (
    FakeLog,
    coordinator,
    join_new,
    join_request,
    run,
    subscription,
)

from oncelog.coordinator.group.api import LeavingMember
from oncelog.coordinator.group.group import GroupState
from oncelog.coordinator.group.records import GroupKey, decode_group_value, decode_key
from oncelog.errors import ErrorCode as E


async def started(**kwargs):
    c = coordinator(**kwargs)
    c.startup()
    c.start()
    return c


def test_first_join_requires_a_member_id_then_leads_generation_1():
    async def body():
        c = await started()
        first = await c.join_group(join_request("g"))
        assert first.error == E.MEMBER_ID_REQUIRED and first.member_id.startswith("client-")
        assert c.groups["g"].state is GroupState.EMPTY and first.member_id in c.groups["g"].pending_members
        joined = await c.join_group(join_request("g", first.member_id))
        assert joined.error == E.NONE and joined.generation_id == 1
        assert joined.leader == joined.member_id == first.member_id
        assert joined.protocol_name == "range" and [m[0] for m in joined.members] == [first.member_id]
        sync = await c.sync_group("g", 1, joined.member_id, None, "consumer", "range", {joined.member_id: b"A"})
        assert sync.error == E.NONE and sync.assignment == b"A"
        assert c.groups["g"].state is GroupState.STABLE
        assert c.heartbeat("g", 1, joined.member_id, None) == E.NONE
        await c.stop()

    run(body)


def test_v3_join_gets_an_id_at_once():
    async def body():
        c = await started()
        joined = await c.join_group(join_request("g", v4=False))
        assert joined.error == E.NONE and joined.generation_id == 1
        await c.stop()

    run(body)


def test_second_member_triggers_rebalance_and_both_get_assignments():
    async def body():
        c = await started()
        a = await join_new(c, "g")
        assert (await c.sync_group("g", 1, a.member_id, None, None, None, {a.member_id: b"all"})).error == E.NONE
        b_task = asyncio.create_task(join_new(c, "g", client_id="other"))
        await asyncio.sleep(0.05)
        assert c.groups["g"].state is GroupState.PREPARING_REBALANCE
        assert c.heartbeat("g", 1, a.member_id, None) == E.REBALANCE_IN_PROGRESS
        a2 = await c.join_group(join_request("g", a.member_id))
        b = await b_task
        assert a2.generation_id == b.generation_id == 2
        assert a2.leader == a.member_id and len(a2.members) == 2 and b.members == []
        b_sync = asyncio.create_task(c.sync_group("g", 2, b.member_id, None, None, None, {}))
        await asyncio.sleep(0.01)
        assert not b_sync.done()  # followers wait for the leader's assignment
        a_sync = await c.sync_group("g", 2, a.member_id, None, None, None, {a.member_id: b"x", b.member_id: b"y"})
        assert a_sync.assignment == b"x" and (await b_sync).assignment == b"y"
        # the group record holds both members and their assignments
        records = [r for r in c.log.records() if isinstance(decode_key(r.key), GroupKey)]
        last = decode_group_value(records[-1].value)
        assert last.generation == 2 and {m.assignment for m in last.members} == {b"x", b"y"}
        assert c.heartbeat("g", 1, a.member_id, None) == E.ILLEGAL_GENERATION
        assert c.heartbeat("g", 2, "nobody", None) == E.UNKNOWN_MEMBER_ID
        assert c.heartbeat("nogroup", 2, "nobody", None) == E.UNKNOWN_MEMBER_ID
        await c.stop()

    run(body)


def test_validation_errors():
    async def body():
        c = await started(min_session_timeout_ms=100, max_session_timeout_ms=1000)
        assert (await c.join_group(join_request("g", session_ms=50))).error == E.INVALID_SESSION_TIMEOUT
        assert (await c.join_group(join_request("g", session_ms=5000))).error == E.INVALID_SESSION_TIMEOUT
        assert (await c.join_group(join_request("", session_ms=500))).error == E.INVALID_GROUP_ID
        assert (await c.join_group(join_request("g", "ghost", session_ms=500))).error == E.UNKNOWN_MEMBER_ID
        assert (await c.join_group(join_request("g", protocols=[], session_ms=500))).error \
            == E.INCONSISTENT_GROUP_PROTOCOL
        assert "g" not in c.groups  # failed first joins leave nothing behind
        a = await join_new(c, "g", session_ms=500)
        wrong = await c.join_group(join_request("g", session_ms=500, protocols=[("roundrobin", b"")]))
        assert wrong.error == E.INCONSISTENT_GROUP_PROTOCOL
        other_type = await c.join_group(join_request("g", session_ms=500, protocol_type="connect"))
        assert other_type.error == E.INCONSISTENT_GROUP_PROTOCOL
        assert (await c.sync_group("g", 1, a.member_id, None, "connect", None, {})).error \
            == E.INCONSISTENT_GROUP_PROTOCOL
        assert (await c.sync_group("g", 9, a.member_id, None, None, None, {})).error == E.ILLEGAL_GENERATION
        assert (await c.sync_group("nogroup", 1, a.member_id, None, None, None, {})).error == E.UNKNOWN_MEMBER_ID
        await c.stop()

    run(body)


def test_oversized_metadata_is_refused():
    async def body():
        c = await started(max_member_metadata_bytes=1000)
        result = await c.join_group(join_request("g", protocols=[("range", b"x" * 1001)]))
        assert result.error == E.INVALID_REQUEST
        await c.stop()

    run(body)


def test_member_that_stops_heartbeating_is_removed():
    async def body():
        c = await started()
        a = await join_new(c, "g", session_ms=150)
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        for _ in range(4):
            await asyncio.sleep(0.08)
            assert c.heartbeat("g", 1, a.member_id, None) == E.NONE  # heartbeats keep it alive
        await asyncio.sleep(0.3)
        group = c.groups["g"]
        assert not group.members and group.state is GroupState.EMPTY and group.generation == 2
        assert c.heartbeat("g", 1, a.member_id, None) == E.UNKNOWN_MEMBER_ID
        await c.stop()

    run(body)


def test_rebalance_timeout_drops_members_that_do_not_rejoin():
    async def body():
        c = await started()
        a = await join_new(c, "g", session_ms=5000, rebalance_ms=200)
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        b = await join_new(c, "g", session_ms=5000, rebalance_ms=200, client_id="b")  # a never rejoins
        assert b.generation_id == 2 and b.leader == b.member_id and [m[0] for m in b.members] == [b.member_id]
        assert a.member_id not in c.groups["g"].members
        await c.stop()

    run(body)


def test_members_without_sync_are_removed_after_the_rebalance_timeout():
    async def body():
        c = await started()
        a = await join_new(c, "g", rebalance_ms=150)
        assert c.groups["g"].state is GroupState.COMPLETING_REBALANCE
        await asyncio.sleep(0.3)  # no SyncGroup
        group = c.groups["g"]
        assert not group.members and group.state is GroupState.EMPTY
        assert (await c.sync_group("g", 1, a.member_id, None, None, None, {})).error == E.UNKNOWN_MEMBER_ID
        await c.stop()

    run(body)


def test_leave_group_rebalances_and_empties():
    async def body():
        c = await started()
        a = await join_new(c, "g")
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        error, errors = c.leave_group("g", [LeavingMember(a.member_id), LeavingMember("ghost")])
        assert error == E.NONE and errors == [E.NONE, E.UNKNOWN_MEMBER_ID]
        assert c.groups["g"].state is GroupState.EMPTY and c.groups["g"].generation == 2
        assert c.leave_group("nogroup", [LeavingMember("x")]) == (E.NONE, [E.UNKNOWN_MEMBER_ID])
        await c.stop()

    run(body)


def test_delayed_initial_rebalance_collects_members():
    async def body():
        c = await started(initial_rebalance_delay_ms=200)
        tasks = [asyncio.create_task(join_new(c, "g", client_id=f"c{i}")) for i in range(3)]
        results = await asyncio.gather(*tasks)
        assert {r.generation_id for r in results} == {1}
        assert sum(1 for r in results if r.members) == 1 and len(c.groups["g"].members) == 3
        await c.stop()

    run(body)


def test_static_member_replacement_keeps_assignment_without_rebalance():
    async def body():
        c = await started()
        a = await c.join_group(join_request("g", instance="i-1"))  # static members skip MEMBER_ID_REQUIRED
        assert a.error == E.NONE and a.member_id.startswith("i-1-")
        await c.sync_group("g", 1, a.member_id, "i-1", None, None, {a.member_id: b"mine"})
        generation = c.groups["g"].generation
        again = await c.join_group(join_request("g", instance="i-1"))  # restarted without its member id
        assert again.error == E.NONE and again.member_id != a.member_id
        assert again.generation_id == generation and c.groups["g"].state is GroupState.STABLE
        assert again.leader == a.member_id  # pre-v9: the old leader id, so it does not assign again
        sync = await c.sync_group("g", generation, again.member_id, "i-1", None, None, {})
        assert sync.assignment == b"mine"
        assert c.heartbeat("g", generation, a.member_id, "i-1") == E.FENCED_INSTANCE_ID
        assert c.heartbeat("g", generation, again.member_id, "i-1") == E.NONE
        error, errors = c.leave_group("g", [LeavingMember(a.member_id, "i-1")])
        assert errors == [E.FENCED_INSTANCE_ID]
        await c.stop()

    run(body)


def test_static_replacement_fences_the_old_ids_waiting_sync():
    async def body():
        c = await started()
        b = await join_new(c, "g", client_id="b")
        await c.sync_group("g", 1, b.member_id, None, None, None, {})
        a_join = asyncio.create_task(c.join_group(join_request("g", instance="i-1")))
        await asyncio.sleep(0.01)
        b2 = await c.join_group(join_request("g", b.member_id, client_id="b"))
        a = await a_join
        assert a.generation_id == b2.generation_id == 2 and b2.leader == b.member_id
        a_sync = asyncio.create_task(c.sync_group("g", 2, a.member_id, "i-1", None, None, {}))
        await asyncio.sleep(0.01)
        replacement = asyncio.create_task(c.join_group(join_request("g", instance="i-1")))
        assert (await a_sync).error == E.FENCED_INSTANCE_ID
        assert c.groups["g"].state is GroupState.PREPARING_REBALANCE  # the leader may have assigned the old id
        b3 = await c.join_group(join_request("g", b.member_id, client_id="b"))
        assert (await replacement).error == E.NONE and b3.generation_id == 3
        await c.stop()

    run(body)


def test_static_member_leaves_by_instance_id():
    async def body():
        c = await started()
        a = await c.join_group(join_request("g", instance="i-1"))
        await c.sync_group("g", 1, a.member_id, "i-1", None, None, {})
        assert c.leave_group("g", [LeavingMember("", "i-1")]) == (E.NONE, [E.NONE])
        assert not c.groups["g"].members
        await c.stop()

    run(body)


def test_pending_member_expires_and_unblocks_the_rebalance():
    async def body():
        c = await started()
        a = await join_new(c, "g", session_ms=150)
        await c.sync_group("g", 1, a.member_id, None, None, None, {})
        pending = await c.join_group(join_request("g", session_ms=150))  # never comes back
        assert pending.error == E.MEMBER_ID_REQUIRED
        await asyncio.sleep(0.3)
        assert pending.member_id not in c.groups["g"].pending_members
        await c.stop()

    run(body)


def test_stop_answers_waiting_requests():
    async def body():
        c = await started(initial_rebalance_delay_ms=10_000)
        task = asyncio.create_task(join_new(c, "g"))
        await asyncio.sleep(0.05)
        await c.stop()
        assert (await task).error == E.NOT_COORDINATOR

    run(body)


def test_groups_and_members_survive_a_restart():
    async def body():
        log = FakeLog()
        c = coordinator(log)
        c.startup()
        c.start()
        a = await c.join_group(join_request("g", instance="i-1",
                                            protocols=[("range", subscription("t1", "t2"))]))
        await c.sync_group("g", 1, a.member_id, "i-1", None, None, {a.member_id: b"asg"})
        await c.stop()
        c2 = coordinator(log)
        c2.startup()
        c2.start()
        group = c2.groups["g"]
        assert group.state is GroupState.STABLE and group.generation == 1 and group.leader_id == a.member_id
        assert group.members[a.member_id].assignment == b"asg" and group.static_members == {"i-1": a.member_id}
        assert group.subscribed_topics == {"t1", "t2"}
        assert c2.heartbeat("g", 1, a.member_id, "i-1") == E.NONE
        sync = await c2.sync_group("g", 1, a.member_id, "i-1", None, None, {})
        assert sync.assignment == b"asg"
        await c2.stop()

    run(body)


def test_failed_group_write_fails_the_sync_and_rebalances():
    async def body():
        log = FakeLog()
        c = await started(log=log)
        first = await c.join_group(join_request("g"))
        a = await c.join_group(join_request("g", first.member_id))
        log.fail_durable = E.KAFKA_STORAGE_ERROR
        sync = await c.sync_group("g", 1, a.member_id, None, None, None, {})
        assert sync.error == E.NOT_COORDINATOR
        assert c.groups["g"].state is GroupState.PREPARING_REBALANCE
        await c.stop()

    run(body)


def test_describe_and_list_groups():
    async def body():
        c = await started()
        a = await join_new(c, "g", protocols=[("range", subscription("t"))])
        await c.sync_group("g", 1, a.member_id, None, None, None, {a.member_id: b"A"})
        described = c.describe_group("g")
        assert described["group_state"] == "Stable" and described["protocol_data"] == "range"
        assert described["members"][0]["member_assignment"] == b"A"
        assert c.describe_group("nope")["group_state"] == "Dead"
        assert [g["group_id"] for g in c.list_groups()] == ["g"]
        assert c.list_groups(["empty"]) == [] and len(c.list_groups(["STABLE"])) == 1
        await c.stop()

    run(body)
