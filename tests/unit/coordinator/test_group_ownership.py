"""The group coordinator's partition-scoped ownership on an in-memory offsets log: groups of a partition that is
not loaded answer NOT_COORDINATOR, a loading one COORDINATOR_LOAD_IN_PROGRESS (Heartbeat NONE, SyncGroup
REBALANCE_IN_PROGRESS, as Kafka), an unloaded partition's waiting members are told NOT_COORDINATOR and its
groups come back from the log on the next load; appends name the load's leader epoch; work in flight across an
unload changes nothing that a reload brought back; markers appended while a partition loads are replayed."""

from __future__ import annotations

import asyncio

from tests.unit.coordinator.group_helpers import (
    FakeLog,
    commit_items,
    coordinator,
    join_new,
    join_request,
    run,
)

from oncelog.coordinator.group.api import OffsetCommitItem
from oncelog.coordinator.group.group import GroupState
from oncelog.coordinator.group.store import OFFSETS_TOPIC
from oncelog.errors import ErrorCode as E

GROUP = "g"


async def started(log: FakeLog | None = None):
    c = coordinator(log)
    c.startup()
    c.start()
    return c


def fetched(c, group: str = GROUP):
    error, offsets = c.fetch_offsets(group, None)
    return error, {(f.topic, f.partition): f.offset for f in offsets}


def test_an_unloaded_partition_answers_not_coordinator_and_reloads_from_the_log():
    async def body():
        log = FakeLog()
        c = await started(log)
        p = c.partition_for(GROUP)
        other = next(g for g in ("h", "i", "j", "k") if c.partition_for(g) != p)
        assert await c.commit_offsets(GROUP, -1, "", None, commit_items(("t", 0, 7))) == [E.NONE]
        c.on_resignation(OFFSETS_TOPIC, p)
        c.on_resignation("other-topic", (p + 1) % 3)  # not ours: nothing happens
        assert GROUP not in c.groups
        assert fetched(c) == (E.NOT_COORDINATOR, {})
        assert c.fetch_offsets(GROUP, [("t", 0)])[1][0].error == E.NOT_COORDINATOR
        assert await c.commit_offsets(GROUP, -1, "", None, commit_items(("t", 0, 8))) == [E.NOT_COORDINATOR]
        assert (await c.join_group(join_request(GROUP))).error == E.NOT_COORDINATOR
        assert c.heartbeat(GROUP, 1, "m", None) == E.NOT_COORDINATOR
        assert c.describe_group(GROUP)["error_code"] == E.NOT_COORDINATOR
        assert (await c.delete_groups([GROUP])) == {GROUP: E.NOT_COORDINATOR}
        assert await c.commit_offsets(other, -1, "", None, commit_items(("t", 0, 1))) == [E.NONE]  # still served
        await c.load_partition(p, 3)
        assert fetched(c) == (E.NONE, {("t", 0): 7})
        assert await c.commit_offsets(GROUP, -1, "", None, commit_items(("t", 0, 9))) == [E.NONE]
        assert log.epochs[p] == 3  # the write named the load's leader epoch
        await c.stop()

    run(body)


def test_a_loading_partition_answers_load_in_progress():
    async def body():
        log = FakeLog()
        c = await started(log)
        p = c.partition_for(GROUP)
        a = await join_new(c, GROUP)
        await c.sync_group(GROUP, a.generation_id, a.member_id, None, None, None, {a.member_id: b"x"})
        gate = asyncio.Event()

        async def held():
            await gate.wait()

        c._load_pause = held
        c.on_resignation(OFFSETS_TOPIC, p)
        c.on_leadership(OFFSETS_TOPIC, p, 1)
        assert c.loading
        assert (await c.join_group(join_request(GROUP, a.member_id))).error == E.COORDINATOR_LOAD_IN_PROGRESS
        assert c.heartbeat(GROUP, a.generation_id, a.member_id, None) == E.NONE
        sync = await c.sync_group(GROUP, a.generation_id, a.member_id, None, None, None, {})
        assert sync.error == E.REBALANCE_IN_PROGRESS
        assert fetched(c)[0] == E.COORDINATOR_LOAD_IN_PROGRESS
        assert await c.commit_offsets(GROUP, 1, a.member_id, None, commit_items(("t", 0, 1))) == [
            E.COORDINATOR_LOAD_IN_PROGRESS]
        c.on_leadership(OFFSETS_TOPIC, p, 1)  # the same epoch again: the load in progress goes on
        gate.set()
        task = c.owned.get(p).task
        await task
        assert not c.loading
        group = c.groups[GROUP]
        assert (group.state, group.generation, list(group.members)) == (GroupState.STABLE, 1, [a.member_id])
        # The loaded member gets a full session from the load and heartbeats on.
        assert c.heartbeat(GROUP, a.generation_id, a.member_id, None) == E.NONE
        await c.stop()

    run(body)


def test_waiting_members_are_told_not_coordinator_and_the_dropped_group_writes_nothing():
    async def body():
        log = FakeLog()
        c = await started(log)
        p = c.partition_for(GROUP)
        a = await join_new(c, GROUP, session_ms=60_000, rebalance_ms=60_000)
        await c.sync_group(GROUP, a.generation_id, a.member_id, None, None, None, {a.member_id: b"x"})
        first = await c.join_group(join_request(GROUP, session_ms=60_000, rebalance_ms=60_000))
        pending = asyncio.ensure_future(c.join_group(join_request(GROUP, first.member_id, session_ms=60_000,
                                                                 rebalance_ms=60_000)))
        await asyncio.sleep(0)
        dropped = c.groups[GROUP]
        assert dropped.is_(GroupState.PREPARING_REBALANCE) and not pending.done()
        written = len(log.entries[p])
        c.on_resignation(OFFSETS_TOPIC, p)
        assert (await asyncio.wait_for(pending, 5)).error == E.NOT_COORDINATOR
        assert dropped.is_(GroupState.DEAD)
        assert dropped.join_timer is None and all(m.session_timer is None for m in dropped.members.values())
        assert len(log.entries[p]) == written  # nothing was written for the dropped group
        await c.stop()

    run(body)


def test_a_newer_epoch_reloads_and_the_same_epoch_does_not():
    async def body():
        log = FakeLog()
        c = await started(log)
        p = c.partition_for(GROUP)
        assert await c.commit_offsets(GROUP, -1, "", None, commit_items(("t", 0, 1))) == [E.NONE]
        before = c.groups[GROUP]
        assert c.load_partition(p, 0) is None  # loaded at 0 by startup: nothing to do
        assert c.groups[GROUP] is before
        # Another coordinator led the partition meanwhile and wrote to it (the image may skip that step here).
        other = coordinator(log)
        other.owned.begin(p, 1)
        other.owned.finish(other.owned.get(p))
        assert await other.commit_offsets(GROUP, -1, "", None, commit_items(("t", 0, 2))) == [E.NONE]
        await c.load_partition(p, 2)
        assert c.groups[GROUP] is not before and before.is_(GroupState.DEAD)
        assert fetched(c) == (E.NONE, {("t", 0): 2})
        await c.stop()

    run(body)


def test_a_txn_commit_failing_across_a_reload_leaves_the_reloaded_pending_offsets():
    async def body():
        log = FakeLog()
        c = await started(log)
        p = c.partition_for(GROUP)
        gate = log.gate = asyncio.Event()
        log.fail_durable = E.NOT_LEADER_OR_FOLLOWER  # the leadership moves before the write is acknowledged
        in_flight = asyncio.ensure_future(c.txn_offset_commit(GROUP, 42, 0, [("t", 1, 6, "", -1)]))
        await asyncio.sleep(0)
        assert not in_flight.done()
        c.on_resignation(OFFSETS_TOPIC, p)
        log.gate = None
        # The partition comes back (here with the record: the new leader's log has it) before the old request ends.
        await c.load_partition(p, 1)
        assert c.offsets.producer_groups == {42: {GROUP}}
        gate.set()
        assert await in_flight == [E.NOT_COORDINATOR]
        log.fail_durable = None
        # The old request's failure did not drop the reloaded group from its producer: the marker still finds it.
        assert c.offsets.producer_groups == {42: {GROUP}}
        log.marker(p, 42, True)
        assert c.complete_txn(42, True, p) == 1
        assert fetched(c) == (E.NONE, {("t", 1): 6})
        await c.stop()

    run(body)


def test_a_marker_appended_while_the_partition_loads_is_replayed():
    async def body():
        log = FakeLog()
        c = await started(log)
        p = c.partition_for(GROUP)
        assert await c.txn_offset_commit(GROUP, 42, 0, [("t", 0, 5, "", -1)]) == [E.NONE]
        c.on_resignation(OFFSETS_TOPIC, p)
        steps = asyncio.Event()

        async def pause():
            steps.set()
            await asyncio.sleep(0)

        c._load_pause = pause
        task = c.load_partition(p, 1)
        await steps.wait()
        # The transaction coordinator writes the COMMIT marker while the load runs; its complete_txn call finds no
        # group (the partition is loading) and the load must see the marker instead.
        log.marker(p, 42, True)
        assert c.complete_txn(42, True, p) == 0
        await task
        assert fetched(c) == (E.NONE, {("t", 0): 5})
        assert c.offsets.producer_groups == {}
        await c.stop()

    run(body)


def test_stop_cancels_a_load_in_progress():
    async def body():
        c = await started()
        p = c.partition_for(GROUP)
        c.on_resignation(OFFSETS_TOPIC, p)

        async def never():
            await asyncio.Event().wait()

        c._load_pause = never
        task = c.load_partition(p, 1)
        await asyncio.sleep(0)
        await c.stop()
        assert task.cancelled()

    run(body)


def test_offset_commit_items_keep_their_leader_epoch_after_a_reload():
    async def body():
        log = FakeLog()
        c = await started(log)
        p = c.partition_for(GROUP)
        items = [OffsetCommitItem("t", 0, 11, 4, "meta")]
        assert await c.commit_offsets(GROUP, -1, "", None, items) == [E.NONE]
        c.on_resignation(OFFSETS_TOPIC, p)
        await c.load_partition(p, 1)
        (f,) = c.fetch_offsets(GROUP, [("t", 0)])[1]
        assert (f.offset, f.leader_epoch, f.metadata, f.error) == (11, 4, "meta", E.NONE)
        await c.stop()

    run(body)
